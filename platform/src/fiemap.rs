//! Where a file's bytes are on disk (FS_IOC_FIEMAP), so disk accounting can
//! count each physical extent once: reflink clones share extents, and `du`
//! that adds up file sizes would count them again for every clone.

use std::os::fd::AsFd;

use rustix::ioctl::{Updater, ioctl, opcode};

use crate::error::{Error, Result};

/// One physical extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub physical: u64,
    pub length: u64,
    /// The filesystem says another file (or snapshot) maps it too.
    pub shared: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Header {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

const BATCH: usize = 128;

#[repr(C)]
struct Request {
    header: Header,
    extents: [RawExtent; BATCH],
}

const FS_IOC_FIEMAP: rustix::ioctl::Opcode = opcode::read_write::<Header>(b'f', 11);
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const EXTENT_LAST: u32 = 0x1;
const EXTENT_UNKNOWN: u32 = 0x2;
const EXTENT_DELALLOC: u32 = 0x4;
const EXTENT_ENCODED: u32 = 0x8;
const EXTENT_DATA_ENCRYPTED: u32 = 0x80;
const EXTENT_NOT_ALIGNED: u32 = 0x100;
const EXTENT_DATA_INLINE: u32 = 0x200;
const EXTENT_DATA_TAIL: u32 = 0x400;
const EXTENT_UNWRITTEN: u32 = 0x800;
const EXTENT_SHARED: u32 = 0x2000;

/// Every extent of `file` (flushed first, so delayed allocations have an
/// address). Extents whose address is unknown or inline in metadata are
/// left out: they have no blocks of their own to count.
pub fn extents(file: impl AsFd, path: &std::path::Path) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    each_extent(file.as_fd(), path, u64::MAX, &mut |e| {
        if e.flags & (EXTENT_UNKNOWN | EXTENT_DELALLOC | EXTENT_DATA_INLINE) == 0 {
            out.push(Extent {
                physical: e.physical,
                length: e.length,
                shared: e.flags & EXTENT_SHARED != 0,
            });
        }
    })?;
    Ok(out)
}

/// One extent as FS_IOC_FIEMAP maps it: where in the file, where on the
/// device, and its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

/// The extents of `file` that start before `upto` (flushed first).
pub fn mapping(file: impl AsFd, upto: u64, path: &std::path::Path) -> Result<Vec<Mapped>> {
    let mut out = Vec::new();
    each_extent(file.as_fd(), path, upto, &mut |e| {
        out.push(Mapped {
            logical: e.logical,
            physical: e.physical,
            length: e.length,
            flags: e.flags,
        })
    })?;
    Ok(out)
}

/// How many bytes from the start two files hold in the very same blocks:
/// the same device address at every offset, in extents whose bytes are on
/// disk as they read (none delayed, inline, encoded, encrypted, unaligned
/// or of unknown place; unwritten in both or in neither). The same block
/// holds the same bytes, so that prefix is equal without reading it: a
/// reflink clone and the file it was cloned from share every block
/// neither has written since (D314). A hole in one only ends the prefix.
pub fn same_blocks_prefix(a: &[Mapped], b: &[Mapped]) -> u64 {
    const NOT_COMPARABLE: u32 = EXTENT_UNKNOWN
        | EXTENT_DELALLOC
        | EXTENT_ENCODED
        | EXTENT_DATA_ENCRYPTED
        | EXTENT_NOT_ALIGNED
        | EXTENT_DATA_INLINE
        | EXTENT_DATA_TAIL;
    let at = |m: &[Mapped], pos: u64| {
        m.iter()
            .find(|e| e.logical <= pos && pos < e.logical.saturating_add(e.length))
            .copied()
    };
    // The first extent of `m` that starts after `pos`.
    let next = |m: &[Mapped], pos: u64| m.iter().map(|e| e.logical).filter(|&l| l > pos).min();
    let mut pos = 0u64;
    loop {
        let (x, y) = match (at(a, pos), at(b, pos)) {
            (Some(x), Some(y)) => (x, y),
            // A hole in both reads as zeros in both, to where either has
            // data again (or to their ends: the caller compares no
            // further than both files' sizes).
            (None, None) => match (next(a, pos), next(b, pos)) {
                (None, None) => return u64::MAX,
                (p, q) => {
                    pos = p.unwrap_or(u64::MAX).min(q.unwrap_or(u64::MAX));
                    continue;
                }
            },
            _ => return pos,
        };
        let comparable = (x.flags | y.flags) & NOT_COMPARABLE == 0
            && x.flags & EXTENT_UNWRITTEN == y.flags & EXTENT_UNWRITTEN;
        if !comparable || x.physical + (pos - x.logical) != y.physical + (pos - y.logical) {
            return pos;
        }
        pos = (x.logical + x.length).min(y.logical + y.length);
    }
}

/// Call `f` with each extent that starts before `upto`, in order.
fn each_extent(
    file: std::os::fd::BorrowedFd<'_>,
    path: &std::path::Path,
    upto: u64,
    f: &mut dyn FnMut(&RawExtent),
) -> Result<()> {
    let mut start = 0u64;
    while start < upto {
        let mut req = Request {
            header: Header {
                start,
                length: u64::MAX - start,
                flags: FIEMAP_FLAG_SYNC,
                extent_count: BATCH as u32,
                ..Header::default()
            },
            extents: [RawExtent::default(); BATCH],
        };
        // SAFETY: `Request` begins with the kernel's `struct fiemap` and has
        // room for `extent_count` extents after it, as FS_IOC_FIEMAP needs.
        unsafe {
            ioctl(
                file,
                Updater::<'_, { FS_IOC_FIEMAP }, Request>::new(&mut req),
            )
        }
        .map_err(|e| Error::new("fiemap", path, e))?;
        let n = (req.header.mapped_extents as usize).min(BATCH);
        if n == 0 {
            return Ok(());
        }
        for e in &req.extents[..n] {
            if e.logical >= upto {
                return Ok(());
            }
            f(e);
            if e.flags & EXTENT_LAST != 0 {
                return Ok(());
            }
        }
        let last = req.extents[n - 1];
        start = last.logical + last.length;
    }
    Ok(())
}

/// The offset of the first byte at or after `from` that is not in a hole
/// (`SEEK_DATA`), or `None` when only a hole follows, up to the end. A
/// filesystem that does not track holes calls everything data. Moves the
/// fd's offset: for callers that read with `pread`.
pub fn next_data(file: &impl AsFd, from: u64) -> std::io::Result<Option<u64>> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(from)) {
        Ok(off) => Ok(Some(off)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(logical: u64, physical: u64, length: u64, flags: u32) -> Mapped {
        Mapped {
            logical,
            physical,
            length,
            flags,
        }
    }

    #[test]
    fn the_same_blocks_prefix_ends_where_the_blocks_or_their_kind_differ() {
        // One extent against the same blocks split in two: all shared,
        // to the end of both.
        let a = [m(0, 1000, 8192, EXTENT_SHARED)];
        let b = [m(0, 1000, 4096, 0), m(4096, 5096, 4096, EXTENT_LAST)];
        assert_eq!(same_blocks_prefix(&a, &b), u64::MAX);
        // The second block written again elsewhere (copy on write).
        let c = [m(0, 1000, 4096, 0), m(4096, 90000, 4096, 0)];
        assert_eq!(same_blocks_prefix(&a, &c), 4096);
        // A hole in one, a delayed allocation, an encoded extent: no
        // further.
        assert_eq!(same_blocks_prefix(&a, &[m(4096, 5096, 4096, 0)]), 0);
        // The same hole in both: on past it, and to the end after the
        // last extent of both.
        let holed = [m(0, 1000, 4096, 0), m(8192, 9192, 4096, 0)];
        assert_eq!(same_blocks_prefix(&holed, &holed), u64::MAX);
        let other = [m(0, 1000, 4096, 0), m(8192, 7777, 4096, 0)];
        assert_eq!(same_blocks_prefix(&holed, &other), 8192);
        assert_eq!(
            same_blocks_prefix(&a, &[m(0, 1000, 8192, EXTENT_DELALLOC)]),
            0
        );
        assert_eq!(
            same_blocks_prefix(&a, &[m(0, 1000, 8192, EXTENT_ENCODED)]),
            0
        );
        // Unwritten in one only: it reads as zeros there, not the bytes.
        assert_eq!(
            same_blocks_prefix(&a, &[m(0, 1000, 8192, EXTENT_UNWRITTEN)]),
            0
        );
        assert_eq!(same_blocks_prefix(&[], &a), 0);
    }
}
