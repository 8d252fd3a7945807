use std::io;
use std::path::PathBuf;

/// An OS call failed on a path. Carries the operation and the path so that a
/// user-facing message can say exactly what went wrong where.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}{}", path.display(), limit_hint(source))]
pub struct Error {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: impl Into<io::Error>) -> Self {
        Error {
            op,
            path: path.into(),
            source: source.into(),
        }
    }

    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }

    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// True when the path does not exist (ENOENT).
    pub fn is_not_found(&self) -> bool {
        self.kind() == io::ErrorKind::NotFound
    }

    /// True when the caller lacks the privilege or permission (EPERM, EACCES).
    pub fn is_permission_denied(&self) -> bool {
        self.kind() == io::ErrorKind::PermissionDenied
    }

    /// True when the filesystem is out of space or quota (ENOSPC, EDQUOT).
    pub fn is_no_space(&self) -> bool {
        matches!(
            self.raw_os_error(),
            Some(libc_errno::ENOSPC) | Some(libc_errno::EDQUOT)
        )
    }

    /// True for ETXTBSY: on btrfs, a snapshot of a subvolume holding an
    /// active swap file.
    pub fn is_text_file_busy(&self) -> bool {
        self.raw_os_error() == Some(libc_errno::ETXTBSY)
    }

    /// True for EROFS: a read-only filesystem, or on btrfs a read-only
    /// subvolume (its snapshots).
    pub fn is_read_only(&self) -> bool {
        self.raw_os_error() == Some(libc_errno::EROFS)
    }

    /// True when a path component was a symlink or not a directory where a
    /// directory was required: the tree changed under us, or someone tried
    /// to redirect a write outside the workspace.
    pub fn is_redirected(&self) -> bool {
        matches!(
            self.raw_os_error(),
            Some(libc_errno::ELOOP) | Some(libc_errno::ENOTDIR) | Some(libc_errno::EXDEV)
        )
    }
}

/// What to do when a resource limit stopped the call: EMFILE (the walk
/// holds a descriptor per directory level, so a deep tree meets the limit
/// where a shallow one never does, D268), EFBIG (`ulimit -f`: a write
/// past it fails with EFBIG once SIGXFSZ is ignored, see
/// [`crate::fail_writes_past_the_size_limit`]).
fn limit_hint(e: &io::Error) -> String {
    use rustix::process::{Resource, getrlimit};
    match e.raw_os_error() {
        Some(libc_errno::EMFILE) => {
            let limit = getrlimit(Resource::Nofile)
                .current
                .map(|n| format!(" of {n}"))
                .unwrap_or_default();
            format!(
                " (the open-file limit{limit} is too low for this: rewind holds a descriptor per level of a deep directory tree, and a few for its own work; raise the hard limit, `ulimit -Hn` or /etc/security/limits.conf, and run the command again; for a mount, mount again from there)"
            )
        }
        Some(libc_errno::EFBIG) => match getrlimit(Resource::Fsize).current {
            Some(n) => format!(
                " (the file size limit of {n} bytes was reached, `ulimit -f`: raise it, `ulimit -f unlimited`, and run the command again)"
            ),
            None => " (the file is larger than this filesystem allows)".into(),
        },
        _ => String::new(),
    }
}

/// The few errno values we classify. Spelled out rather than pulling in libc.
pub(crate) mod libc_errno {
    pub const ENOSPC: i32 = 28;
    pub const EDQUOT: i32 = 122;
    pub const ELOOP: i32 = 40;
    pub const ENOTDIR: i32 = 20;
    pub const EXDEV: i32 = 18;
    pub const ETXTBSY: i32 = 26;
    pub const EROFS: i32 = 30;
    pub const EMFILE: i32 = 24;
    pub const EFBIG: i32 = 27;
}
