//! XFS bulk stat: the stat of every inode of a filesystem, a thousand per
//! ioctl, its allocation groups read in parallel. About four times
//! cheaper than a stat per path (no path lookup, no dentry), which makes
//! it a faster answer to "what changed since the last walk" for a tree
//! that fills most of its filesystem.

use std::os::fd::AsFd;

use rustix::fs::FileType;
use rustix::ioctl::{Getter, Updater, ioctl, opcode};

use crate::dir::{Dir, EntryKind, Meta};
use crate::error::{Error, Result};

/// `struct xfs_bulk_ireq`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct BulkIreq {
    ino: u64,
    flags: u32,
    icount: u32,
    ocount: u32,
    agno: u32,
    reserved: [u64; 5],
}

/// `struct xfs_bulkstat` (version 5), the fields used here named.
#[repr(C)]
#[derive(Clone, Copy)]
struct Bulkstat {
    ino: u64,
    size: u64,
    blocks: u64,
    xflags: u64,
    atime: i64,
    mtime: i64,
    ctime: i64,
    btime: i64,
    generation: u32,
    uid: u32,
    gid: u32,
    projectid: u32,
    atime_nsec: u32,
    mtime_nsec: u32,
    ctime_nsec: u32,
    btime_nsec: u32,
    blksize: u32,
    rdev: u32,
    cowextsize_blks: u32,
    extsize_blks: u32,
    nlink: u32,
    extents: u32,
    aextents: u32,
    version: u16,
    forkoff: u16,
    sick: u16,
    checked: u16,
    mode: u16,
    pad2: u16,
    extents64: u64,
    pad: [u64; 6],
}

const BATCH: usize = 1024;

#[repr(C)]
struct BulkstatReq {
    hdr: BulkIreq,
    stats: [Bulkstat; BATCH],
}

/// The leading fields of `struct xfs_fsop_geom_v1`.
#[repr(C)]
#[derive(Clone, Copy)]
struct GeomV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    rest: [u8; 96],
}

/// Only the allocation group in `agno`.
const BULK_IREQ_AGNO: u32 = 1 << 0;
const IOC_BULKSTAT: rustix::ioctl::Opcode = opcode::read::<BulkIreq>(b'X', 127);
const IOC_FSGEOMETRY_V1: rustix::ioctl::Opcode = opcode::read::<GeomV1>(b'X', 100);

fn meta(b: &Bulkstat, dev: u64) -> Meta {
    Meta {
        kind: EntryKind::from_file_type(FileType::from_raw_mode(u32::from(b.mode) as _)),
        mode: u32::from(b.mode) & 0o7777,
        size: b.size,
        mtime_ns: b.mtime * 1_000_000_000 + i64::from(b.mtime_nsec),
        ctime_ns: b.ctime * 1_000_000_000 + i64::from(b.ctime_nsec),
        dev,
        ino: b.ino,
        nlink: u64::from(b.nlink),
        // Bulk stat counts filesystem blocks; nothing here needs it.
        allocated: 0,
    }
}

/// The stat of every inode in allocation group `agno` of the XFS
/// filesystem holding `dir` (`dev` is its device, which bulk stat does not
/// report), appended to `out` in inode order. Needs CAP_SYS_ADMIN (EPERM
/// otherwise).
pub fn xfs_bulkstat_ag(dir: &Dir, agno: u32, dev: u64, out: &mut Vec<Meta>) -> Result<()> {
    let mut req = Box::new(BulkstatReq {
        hdr: BulkIreq::default(),
        // SAFETY: `Bulkstat` is plain integers; all zeroes is valid.
        stats: unsafe { std::mem::zeroed() },
    });
    let mut next = 0;
    loop {
        req.hdr = BulkIreq {
            ino: next,
            flags: BULK_IREQ_AGNO,
            icount: BATCH as u32,
            agno,
            ..BulkIreq::default()
        };
        // SAFETY: `BulkstatReq` is `struct xfs_bulkstat_req` with room for
        // `icount` records after its header; the opcode encodes the
        // header's size, as the kernel expects.
        unsafe {
            ioctl(
                dir.as_fd(),
                Updater::<{ IOC_BULKSTAT }, BulkstatReq>::new(&mut req),
            )
        }
        .map_err(|e| Error::new("bulk stat the XFS filesystem of", dir.path(), e))?;
        let n = (req.hdr.ocount as usize).min(BATCH);
        if n == 0 {
            return Ok(());
        }
        out.extend(req.stats[..n].iter().map(|b| meta(b, dev)));
        next = req.hdr.ino;
    }
}

/// The number of allocation groups of the XFS filesystem holding `dir`:
/// [`xfs_bulkstat_ag`] reads each on its own, so callers can read them in
/// parallel.
pub fn xfs_ag_count(dir: &Dir) -> Result<u32> {
    // SAFETY: XFS_IOC_FSGEOMETRY_V1 fills one `struct xfs_fsop_geom_v1`.
    let geom = unsafe { ioctl(dir.as_fd(), Getter::<{ IOC_FSGEOMETRY_V1 }, GeomV1>::new()) }
        .map_err(|e| Error::new("read the XFS geometry of", dir.path(), e))?;
    Ok(geom.agcount)
}
