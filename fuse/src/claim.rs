//! One mount per workspace (D98). A daemon serves a workspace only while
//! it holds an exclusive `flock` on `.rewind/mount`, taken before the
//! mount and kept for its life; the file names its pid and mount point.
//! The lock belongs to the workspace's state directory, not to a path:
//! a view and a mount over the workspace itself, or two views, claim the
//! same file, so the second daemon is refused whatever path it was given.
//! A daemon that dies drops the lock with its last descriptor.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rewind_platform::Heir;
use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// The claim, relative to the workspace root.
pub const CLAIM_FILE: &str = ".rewind/mount";

/// The daemon serving a workspace, as its claim names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub mountpoint: PathBuf,
}

/// A daemon's claim on its workspace, held until dropped.
pub(crate) struct Claim {
    _file: File,
}

impl Claim {
    /// Claim the workspace whose root is `root` (opened before the mount
    /// covers it) for a mount at `mountpoint`. `Ok(None)`: the directory
    /// shows no `.rewind/`: no workspace, or another mount covers it.
    pub(crate) fn take(
        root: BorrowedFd<'_>,
        dir: &Path,
        mountpoint: &Path,
    ) -> Result<Option<Claim>> {
        // `.rewind/` itself never through a symlink either, and the claim
        // only a plain file: one planted there made root create and chown
        // a `mount` anywhere (D160).
        let platform = |e: rewind_platform::Error| Error::io(e.op, e.path, e.source);
        let root = root
            .try_clone_to_owned()
            .map_err(|e| Error::io("dup", dir, e))?;
        let state = match rewind_platform::Dir::from_fd(root, dir).open_dir(OsStr::new(".rewind")) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(platform(e)),
        };
        let name = CLAIM_FILE.rsplit('/').next().unwrap_or(CLAIM_FILE);
        let fd = match state.open_or_create(OsStr::new(name), 0o644, false) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(platform(e)),
        };
        // Made by root (`sudo rewind mount`) in a user's history: theirs,
        // or their own mount later cannot open it (D148).
        if let Some(h) = Heir::of(&state).map_err(platform)? {
            h.give_fd(&fd, &dir.join(CLAIM_FILE)).map_err(platform)?;
        }
        let file = fd;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let h = holder_of(&file).unwrap_or(Holder {
                    pid: 0,
                    mountpoint: dir.to_path_buf(),
                });
                return Err(Error::AlreadyMounted {
                    path: h.mountpoint,
                    pid: h.pid,
                });
            }
            Err(e) => return Err(Error::io("lock", dir.join(CLAIM_FILE), e.into())),
        }
        // Emptied first: a reader sees the old holder's record, nothing,
        // or this one, never a mix.
        let mut text = format!("{}\n", std::process::id()).into_bytes();
        text.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(
            mountpoint.as_os_str(),
        ));
        text.push(b'\n');
        file.set_len(0)
            .and_then(|()| file.write_all_at(&text, 0))
            .map_err(|e| Error::io("write", dir.join(CLAIM_FILE), e))?;
        Ok(Some(Claim { _file: file }))
    }
}

/// The daemon serving the workspace whose backing root is `workspace`
/// (the workspace directory, when nothing is mounted over it), if one is
/// alive.
pub fn holder(workspace: &Path) -> Option<Holder> {
    holder_of(&File::open(workspace.join(CLAIM_FILE)).ok()?)
}

/// Who holds the claim `file`. A free claim grants a shared lock; a held
/// one is read until its holder has written it (it writes right after
/// locking; `None` if it has not within a second).
fn holder_of(file: &File) -> Option<Holder> {
    let start = Instant::now();
    loop {
        match flock(file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                let _ = flock(file, FlockOperation::Unlock);
                return None;
            }
            Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => {}
            Err(_) => return None,
        }
        let mut buf = vec![0u8; 4096 + 16];
        let n = file.read_at(&mut buf, 0).unwrap_or(0);
        buf.truncate(n);
        if let Some(h) = parse_claim(&buf) {
            return Some(h);
        }
        if start.elapsed() > Duration::from_secs(1) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The view the last daemon of the workspace `workspace` served, if its
/// claim names one and that view is a dead rewind mount: one SIGKILLed
/// leaves it there, which only a command run in the view detached
/// (helper-79). A live daemon's view is never dead, so the claim is read
/// without its lock.
pub fn dead_view(workspace: &Path) -> Option<PathBuf> {
    let buf = std::fs::read(workspace.join(CLAIM_FILE)).ok()?;
    let h = parse_claim(&buf)?;
    (h.mountpoint != workspace && crate::daemon::is_dead_rewind_mount(&h.mountpoint))
        .then_some(h.mountpoint)
}

/// A claim as [`Claim::take`] writes it, `PID\nMOUNTPOINT\n`; `None`
/// until the final newline is there. The mount point is everything
/// between the first and that last newline: it may hold newlines itself
/// (helper-29, D207).
fn parse_claim(buf: &[u8]) -> Option<Holder> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let pid = std::str::from_utf8(&buf[..nl]).ok()?.parse().ok()?;
    let mp = buf[nl + 1..].strip_suffix(b"\n")?;
    Some(Holder {
        pid,
        mountpoint: PathBuf::from(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(mp)),
    })
}

/// The workspace a live daemon serves, from the claim it holds open
/// (`/proc/PID/fd`): reachable even when the daemon does not answer.
pub fn claimed_workspace(pid: u32) -> Option<PathBuf> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .find(|l| l.ends_with(CLAIM_FILE))
        .and_then(|l| l.parent()?.parent().map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_mount_point_keeps_its_newlines_and_a_half_written_claim_is_none() {
        let h = parse_claim(b"7\n/w/a\nb\n").expect("whole claim");
        assert_eq!(h.pid, 7);
        assert_eq!(h.mountpoint, Path::new("/w/a\nb"));
        assert_eq!(parse_claim(b"7\n/w/a"), None);
        assert_eq!(parse_claim(b"7"), None);
        assert_eq!(parse_claim(b""), None);
        assert_eq!(parse_claim(b"x\n/w\n"), None);
    }
}
