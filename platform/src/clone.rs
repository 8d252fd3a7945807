use std::os::fd::{AsFd, BorrowedFd};

use rustix::io::Errno;

/// How a file's bytes got to their destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneOutcome {
    /// Extents shared copy-on-write: O(1) in time and space.
    Cloned,
    /// The bytes were copied: O(size).
    Copied,
}

/// Clone `src` into `dst` (FICLONE), falling back to a copy when the
/// filesystem cannot share extents. `dst` must be empty and open for
/// writing. The outcome tells the caller which happened, so `checkpoint
/// --json` can report it truthfully.
pub fn clone_or_copy(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> std::io::Result<CloneOutcome> {
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => Ok(CloneOutcome::Cloned),
        Err(e) if clone_unsupported(e) => {
            copy_with(src, dst, |_| {})?;
            Ok(CloneOutcome::Copied)
        }
        Err(e) => Err(e.into()),
    }
}

/// Errors that mean "this pair of files cannot share extents here", as
/// opposed to a real I/O failure.
fn clone_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::NOSYS | Errno::PERM
    )
}

/// Copy all of `src` (from its current offset) to `dst`, handing every chunk
/// to `on_chunk` (to hash while copying). Returns the bytes copied.
pub fn copy_with(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    mut on_chunk: impl FnMut(&[u8]),
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match rustix::io::read(src.as_fd(), &mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        on_chunk(&buf[..n]);
        let mut off = 0;
        while off < n {
            match rustix::io::write(dst.as_fd(), &buf[off..n]) {
                Ok(w) => off += w,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        total += n as u64;
    }
}

/// Tell the kernel a file will be read front to back (bigger readahead).
/// Advisory: failures are ignored.
pub fn advise_sequential(file: &impl AsFd) {
    let _ = rustix::fs::fadvise(file.as_fd(), 0, None, rustix::fs::Advice::Sequential);
}

/// Start writing a file's dirty pages to disk, without waiting: its
/// fsync, later, then finds them written or in flight. A rewind writes
/// its restored files one after another, then fsyncs them on a few
/// threads; started at write time, their writeback overlaps the rest of
/// the apply instead of queueing behind each fsync (D200). Advisory:
/// failures are ignored (the fsync still writes everything).
pub fn start_writeback(file: &impl AsFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range(2) on a valid fd; nbytes 0 means to the end.
    unsafe {
        libc::sync_file_range(file.as_fd().as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Switch O_DIRECT on or off for an open file. Returns whether the flag is
/// now as asked (some filesystems refuse it).
///
/// Why: a fresh clone shares its source's extents but not its page cache,
/// and buffered reads of it go through small readahead; direct reads of the
/// same blocks in 1 MiB requests are several times faster on XFS.
pub fn set_direct_io(file: &impl AsFd, on: bool) -> bool {
    let Ok(flags) = rustix::fs::fcntl_getfl(file.as_fd()) else {
        return false;
    };
    let want = if on {
        flags | rustix::fs::OFlags::DIRECT
    } else {
        flags - rustix::fs::OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(file.as_fd(), want).is_ok()
}
