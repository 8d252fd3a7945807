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

/// Copy all of `src` (from its current offset) into `dst`, a new empty
/// file, from its start, handing every chunk to `on_chunk` (to hash while
/// copying). Returns the bytes copied. Blocks of zeros are left holes
/// ([`write_sparse`]): a sparse file under the 4 MiB at which the store
/// chunks came back, and was stored, fully allocated where nothing is
/// cloned (helper-55, D287).
pub fn copy_with(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    mut on_chunk: impl FnMut(&[u8]),
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match rustix::io::read(src.as_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        on_chunk(&buf[..n]);
        write_sparse(dst, &buf[..n], total)?;
        total += n as u64;
    }
    // A hole at the end was not written: the length says where it ends.
    rustix::fs::ftruncate(dst, total)?;
    Ok(total)
}

/// The granule [`write_sparse`] leaves unwritten: a filesystem block.
const SPARSE_BLOCK: usize = 4096;

/// Write `buf` at offset `at` of `file`, a new file, leaving each
/// `SPARSE_BLOCK` of zeros (counted from `at`) unwritten: a hole there
/// reads back as zeros and takes no space. Where a filesystem cannot
/// clone, a sparse file's data islands came back as whole 1 MiB chunks,
/// zeros included (helper-30). The caller sets the file's length: a hole
/// at the end is not written either.
pub fn write_sparse(file: BorrowedFd<'_>, buf: &[u8], at: u64) -> std::io::Result<()> {
    // memcmp against zeros: a byte loop ran at a tenth of its speed.
    static ZEROS: [u8; SPARSE_BLOCK] = [0; SPARSE_BLOCK];
    let is_zero = |b: &[u8]| b == &ZEROS[..b.len()];
    let blocks: Vec<&[u8]> = buf.chunks(SPARSE_BLOCK).collect();
    let mut i = 0;
    while i < blocks.len() {
        if is_zero(blocks[i]) {
            i += 1;
            continue;
        }
        // One write for a run of blocks with data.
        let start = i * SPARSE_BLOCK;
        while i < blocks.len() && !is_zero(blocks[i]) {
            i += 1;
        }
        let end = (i * SPARSE_BLOCK).min(buf.len());
        let mut done = start;
        while done < end {
            match rustix::io::pwrite(file, &buf[done..end], at + done as u64) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(w) => done += w,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Give `dst` (empty, or a directory) `src`'s btrfs `NOCOW` flag (`chattr
/// +C`), set or cleared. A clone between a copy-on-write file and a NOCOW
/// one is refused (EINVAL), so `init --subvolume` copied every byte of a
/// database or VM image kept NOCOW, and dropped the flag (helper-37,
/// D248); and a file made in a NOCOW directory inherits the flag its
/// source may not have. Where the filesystem has no such flag nothing
/// changes, and a clone that still fails falls back to a copy.
pub fn match_nocow(src: &impl AsFd, dst: &impl AsFd) {
    let nocow = rustix::fs::IFlags::NOCOW;
    let (Ok(want), Ok(have)) = (
        rustix::fs::ioctl_getflags(src),
        rustix::fs::ioctl_getflags(dst),
    ) else {
        return;
    };
    if want.contains(nocow) != have.contains(nocow) {
        let _ = rustix::fs::ioctl_setflags(dst, (have - nocow) | (want & nocow));
    }
}

/// Start writing a file's dirty pages back, so that they are clean: the
/// kernel write-protects a page in every shared mapping when it starts
/// its writeback, and the next write through one faults and moves the
/// file's times. A file read while a mapping's write was still dirty
/// kept the page writable, and further writes through it moved nothing,
/// so the stat cache vouched for a file that had changed (helper-36,
/// D247, D254). Only writeback already in flight is waited for (a page
/// dirtied again under it is writable and skipped otherwise); the new
/// writeback is not: waiting for it cost a ten-edit checkpoint through
/// the mount 1.8 ms. Advisory.
pub fn clean_for_read(file: &impl AsFd) {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE;
    // SAFETY: sync_file_range(2) on a valid fd; nbytes 0 means to the end.
    unsafe {
        libc::sync_file_range(file.as_fd().as_raw_fd(), 0, 0, flags);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// What `write_sparse` leaves out reads back as zeros: data in the
    /// first and last block, a run across two blocks, a short tail block,
    /// all at an offset, come back exactly.
    #[test]
    fn a_sparse_write_reads_back_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let f = std::fs::File::create_new(&path).expect("create");
        let mut buf = vec![0u8; 10 * SPARSE_BLOCK + 123];
        buf[0] = 1;
        buf[3 * SPARSE_BLOCK - 1] = 2;
        buf[3 * SPARSE_BLOCK] = 3;
        let last = buf.len() - 1;
        buf[last] = 4;
        let at = 1 << 20;
        write_sparse(f.as_fd(), &buf, at).expect("write");
        f.set_len(at + buf.len() as u64).expect("set_len");
        let mut got = vec![9u8; buf.len()];
        f.read_exact_at(&mut got, at).expect("read");
        assert!(got == buf, "the bytes differ");
        let mut head = vec![9u8; at as usize];
        f.read_exact_at(&mut head, 0).expect("read");
        assert!(head.iter().all(|&b| b == 0), "before `at` is not zeros");
    }

    /// `copy_with` leaves zeros out but not the length: a file that ends
    /// in zeros, or is nothing but zeros, copies to the same bytes.
    #[test]
    fn a_copy_that_leaves_holes_keeps_every_byte_and_the_length() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, len) in [0usize, 1, 5000, 700_000].into_iter().enumerate() {
            let mut data = vec![0u8; len];
            if len > 10 {
                data[len / 3] = 7;
            }
            let src_path = dir.path().join(format!("src{i}"));
            std::fs::write(&src_path, &data).expect("write");
            let src = std::fs::File::open(&src_path).expect("open");
            let dst_path = dir.path().join(format!("dst{i}"));
            let dst = std::fs::File::create_new(&dst_path).expect("create");
            let mut seen = 0;
            let n = copy_with(src.as_fd(), dst.as_fd(), |c| seen += c.len()).expect("copy");
            assert_eq!((n, seen), (len as u64, len), "len {len}");
            assert!(std::fs::read(&dst_path).expect("read") == data, "len {len}");
        }
    }
}
