use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};

use crate::error::{Error, Result};

/// An exclusive advisory lock on a file (flock), released on drop or when
/// the process dies, so a SIGKILLed holder never leaves a stale lock.
#[derive(Debug)]
pub struct LockFile {
    _file: File,
    path: PathBuf,
}

impl LockFile {
    /// Take the lock on the file `name` in `dir` (made if missing, never
    /// through a symlink: D160), waiting up to `timeout`. On timeout the
    /// error names the pid recorded by the current holder (written by the
    /// holder itself).
    pub fn acquire_in(
        dir: &crate::Dir,
        name: &str,
        timeout: Duration,
    ) -> Result<Result<LockFile, Option<u32>>> {
        let path = dir.path().join(name);
        let mut file = dir.open_or_create(std::ffi::OsStr::new(name), 0o644, false)?;
        // Made by root in a user's history: theirs, or their next command
        // cannot open it (D148).
        if let Some(h) = crate::Heir::of(dir)? {
            h.give_fd(&file, &path)?;
        }
        let taken = flock_polling(
            &file,
            FlockOperation::NonBlockingLockExclusive,
            timeout,
            Duration::from_millis(5),
        )
        .map_err(|e| Error::new("lock", &path, e))?;
        if !taken {
            let mut s = String::new();
            let _ = file.read_to_string(&mut s);
            return Ok(Err(s.trim().parse().ok()));
        }
        // Record the holder for the "who holds it" message; best effort.
        // A long-lived holder (the command server, `rewind mcp`) finds its
        // own pid there already: a read instead of a truncate and a write,
        // each a metadata change on the filesystem.
        let me = std::process::id().to_string();
        let mut held = String::new();
        if file.read_to_string(&mut held).is_err() || held != me {
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = file.write_all(me.as_bytes());
        }
        Ok(Ok(LockFile { _file: file, path }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the lock's file was unlinked: its directory was deleted
    /// (`rewind deinit`) while this process waited for the lock, and what
    /// it opened before is gone with it.
    pub fn is_deleted(&self) -> bool {
        rustix::fs::fstat(&self._file).is_ok_and(|st| st.st_nlink == 0)
    }
}

/// Take the non-blocking `flock` operation `op` on `file`, trying again
/// every `every` while another holds it, for up to `timeout`: whether it
/// was taken. Errors other than "held" are returned.
pub(crate) fn flock_polling(
    file: &File,
    op: FlockOperation,
    timeout: Duration,
    every: Duration,
) -> rustix::io::Result<bool> {
    let start = Instant::now();
    loop {
        match flock(file, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                if start.elapsed() >= timeout {
                    return Ok(false);
                }
                std::thread::sleep(every);
            }
            Err(e) => return Err(e),
        }
    }
}
