use std::path::PathBuf;

/// Everything that can go wrong in the overlay, with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is already mounted by rewind (daemon pid {pid}): a workspace has one mount, and a mount one workspace; `rewind unmount {path}` first"
    )]
    AlreadyMounted { path: PathBuf, pid: u32 },
    #[error("the rewind daemon for {path} is gone (its process exited)")]
    DaemonGone { path: PathBuf },
    #[error("{}", unresponsive(path, *pid, *secs))]
    Unresponsive { path: PathBuf, pid: u32, secs: u64 },
    #[error("the rewind daemon for {path} answered: {message}")]
    Daemon { path: PathBuf, message: String },
    #[error("the mount daemon for {path} did not start: {why}")]
    NotStarted { path: PathBuf, why: String },
    #[error(
        "{path} was a view of a workspace elsewhere, whose mount daemon had died; its dead mount is detached and nothing is there: mount it again from the workspace (`rewind mount WORKSPACE --at {path}`), or run rewind in the workspace"
    )]
    DeadView { path: PathBuf },
    #[error(
        "{path} is not this user's own private directory ({why}): another user may have made it to take rewind's sockets; remove it (as its owner, or root), or set XDG_RUNTIME_DIR to a directory only you can enter"
    )]
    UnsafeRuntimeDir { path: PathBuf, why: String },
    #[error(
        "{path} is served by uid {uid}, neither this user nor root: refusing to talk to it (another user may be standing in for rewind's daemon); remove it and the directory holding it, or set XDG_RUNTIME_DIR to a directory only you can enter"
    )]
    ForeignSocket { path: PathBuf, uid: u32 },
    #[error("cannot unmount {path}: it is busy ({holders}); close them{} and retry", if holders.contains("working directory") { " (a shell inside: `cd` out of it first)" } else { "" })]
    Busy { path: PathBuf, holders: String },
}

/// One line: who does not answer, and the two ways out (a stopped daemon
/// takes SIGCONT; SIGTERM would wait for it, so the kill is -9).
fn unresponsive(path: &std::path::Path, pid: u32, secs: u64) -> String {
    let p = path.display();
    if pid == 0 {
        return format!(
            "the rewind daemon for {p} does not accept connections (no answer within {secs} s): `umount -l {p}` detaches its mount, then kill its `rewind mount` process"
        );
    }
    format!(
        "the rewind daemon for {p} (pid {pid}) did not answer within {secs} s (stopped or hung): `kill -CONT {pid}` if it was stopped, else `kill -9 {pid}` then `rewind unmount {p}` (or `umount -l {p}`)"
    )
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
