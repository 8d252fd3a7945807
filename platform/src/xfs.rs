//! XFS bulk stat: the stat of every inode of a filesystem (or of some
//! inode number ranges of it), a thousand per ioctl. About four times
//! cheaper than a stat per path (no path lookup, no dentry), which makes
//! it a faster answer to "what changed since the last walk" for a tree
//! whose inodes are not scattered among many others.

use std::os::fd::AsFd;

use rustix::fs::FileType;
use rustix::ioctl::{Updater, ioctl, opcode};

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

const IOC_BULKSTAT: rustix::ioctl::Opcode = opcode::read::<BulkIreq>(b'X', 127);

fn meta(b: &Bulkstat, dev: u64) -> Meta {
    Meta {
        kind: EntryKind::from_file_type(FileType::from_raw_mode(u32::from(b.mode) as _)),
        mode: u32::from(b.mode) & 0o7777,
        // The size on disk: it lags a write until writeback, unlike the
        // times (callers compare times, not sizes).
        size: b.size,
        mtime_ns: crate::ns_since_epoch(b.mtime, i64::from(b.mtime_nsec)),
        ctime_ns: crate::ns_since_epoch(b.ctime, i64::from(b.ctime_nsec)),
        dev,
        ino: b.ino,
        nlink: u64::from(b.nlink),
        // Bulk stat counts filesystem blocks; nothing here needs it.
        allocated: 0,
        uid: b.uid,
        gid: b.gid,
    }
}

/// XFS allocates inodes in aligned chunks of this many: the unit a ranged
/// bulk stat reads.
const XFS_INODES_PER_CHUNK: u64 = 64;

/// The inode number ranges (inclusive) of the chunks holding `inos`
/// (sorted ascending), neighbouring chunks merged: what
/// [`xfs_bulkstat_ranges`] must read to see every one of them.
pub fn xfs_chunk_ranges(inos: &[u64]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &ino in inos {
        let first = ino & !(XFS_INODES_PER_CHUNK - 1);
        let last = first + XFS_INODES_PER_CHUNK - 1;
        match ranges.last_mut() {
            Some(r) if first <= r.1.saturating_add(1) => r.1 = r.1.max(last),
            _ => ranges.push((first, last)),
        }
    }
    ranges
}

/// The stat of every allocated inode numbered within `ranges` (inclusive,
/// ascending, disjoint) on the XFS filesystem holding `dir`, appended to
/// `out` in inode order. One ioctl per thousand inodes or per range,
/// whichever is more; a call never asks for more inodes than its range
/// holds numbers, so it reads at most that many past the range's end.
/// Needs CAP_SYS_ADMIN (EPERM otherwise).
pub fn xfs_bulkstat_ranges(
    dir: &Dir,
    ranges: &[(u64, u64)],
    dev: u64,
    out: &mut Vec<Meta>,
) -> Result<()> {
    let mut req = Box::new(BulkstatReq {
        hdr: BulkIreq::default(),
        // SAFETY: `Bulkstat` is plain integers; all zeroes is valid.
        stats: unsafe { std::mem::zeroed() },
    });
    for &(first, last) in ranges {
        let mut next = first;
        while next <= last {
            req.hdr = BulkIreq {
                ino: next,
                icount: (last - next + 1).min(BATCH as u64) as u32,
                ..BulkIreq::default()
            };
            // SAFETY: `BulkstatReq` is `struct xfs_bulkstat_req` with room
            // for `icount` records after its header; the opcode encodes the
            // header's size, as the kernel expects.
            unsafe {
                ioctl(
                    dir.as_fd(),
                    Updater::<{ IOC_BULKSTAT }, BulkstatReq>::new(&mut req),
                )
            }
            .map_err(|e| Error::new("bulk stat the XFS filesystem of", dir.path(), e))?;
            let n = (req.hdr.ocount as usize).min(BATCH);
            out.extend(
                req.stats[..n]
                    .iter()
                    .filter(|b| b.ino <= last)
                    .map(|b| meta(b, dev)),
            );
            if n == 0 || req.hdr.ino <= next {
                break;
            }
            next = req.hdr.ino;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_ranges_cover_each_inodes_aligned_chunk_and_merge_neighbours() {
        assert_eq!(xfs_chunk_ranges(&[]), Vec::<(u64, u64)>::new());
        // 130 and 131 share a chunk; 191 is the last of that chunk; 192
        // starts the next one, which touches it; 1000 is far away.
        assert_eq!(
            xfs_chunk_ranges(&[130, 131, 191, 192, 1000]),
            vec![(128, 255), (960, 1023)]
        );
        assert_eq!(xfs_chunk_ranges(&[0, 63]), vec![(0, 63)]);
        assert_eq!(xfs_chunk_ranges(&[63, 64]), vec![(0, 127)]);
        assert_eq!(xfs_chunk_ranges(&[5, 200]), vec![(0, 63), (192, 255)]);
    }
}
