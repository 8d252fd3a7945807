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
const EXTENT_DATA_INLINE: u32 = 0x200;
const EXTENT_SHARED: u32 = 0x2000;

/// Every extent of `file` (flushed first, so delayed allocations have an
/// address). Extents whose address is unknown or inline in metadata are
/// left out: they have no blocks of their own to count.
pub fn extents(file: impl AsFd, path: &std::path::Path) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
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
                file.as_fd(),
                Updater::<'_, { FS_IOC_FIEMAP }, Request>::new(&mut req),
            )
        }
        .map_err(|e| Error::new("fiemap", path, e))?;
        let n = (req.header.mapped_extents as usize).min(BATCH);
        if n == 0 {
            return Ok(out);
        }
        for e in &req.extents[..n] {
            if e.flags & (EXTENT_UNKNOWN | EXTENT_DELALLOC | EXTENT_DATA_INLINE) == 0 {
                out.push(Extent {
                    physical: e.physical,
                    length: e.length,
                    shared: e.flags & EXTENT_SHARED != 0,
                });
            }
            if e.flags & EXTENT_LAST != 0 {
                return Ok(out);
            }
        }
        let last = req.extents[n - 1];
        start = last.logical + last.length;
    }
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
