//! btrfs subvolume ioctls, called directly (no btrfs-progs at run time):
//! create a subvolume, snapshot one (read-only or not), delete one, and
//! tell whether a directory is a subvolume root.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use rustix::ioctl::{Getter, Setter, ioctl, opcode};

use crate::dir::Dir;
use crate::error::{Error, Result};
use crate::fsinfo::{FsInfo, FsKind};

/// The inode number of every subvolume's root directory.
const FIRST_FREE_OBJECTID: u64 = 256;
const VOL_NAME_MAX: usize = 4087;
const SUBVOL_NAME_MAX: usize = 4039;
const SUBVOL_RDONLY: u64 = 1 << 1;

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; VOL_NAME_MAX + 1],
}

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

const IOC_SUBVOL_CREATE: rustix::ioctl::Opcode = opcode::write::<VolArgs>(0x94, 14);
const IOC_SNAP_DESTROY: rustix::ioctl::Opcode = opcode::write::<VolArgs>(0x94, 15);
const IOC_SNAP_CREATE_V2: rustix::ioctl::Opcode = opcode::write::<VolArgsV2>(0x94, 23);
const IOC_SUBVOL_GETFLAGS: rustix::ioctl::Opcode = opcode::read::<u64>(0x94, 25);
const IOC_SUBVOL_SETFLAGS: rustix::ioctl::Opcode = opcode::write::<u64>(0x94, 26);

fn name_bytes<const N: usize>(
    name: &OsStr,
    op: &'static str,
    path: &std::path::Path,
) -> Result<[u8; N]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= N || b.contains(&b'/') || b.contains(&0) {
        return Err(Error::new(
            op,
            path.join(name),
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    }
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

/// Is `dir` the root of a btrfs subvolume?
pub fn is_subvolume(dir: &Dir) -> Result<bool> {
    let fs = FsInfo::of(dir)?;
    Ok(fs.kind == FsKind::Btrfs && dir.meta()?.ino == FIRST_FREE_OBJECTID)
}

/// The flags of the subvolume whose root is `dir` (`SUBVOL_RDONLY`).
fn subvolume_flags(dir: &Dir) -> Result<u64> {
    // SAFETY: BTRFS_IOC_SUBVOL_GETFLAGS writes one u64.
    unsafe { ioctl(dir.as_fd(), Getter::<{ IOC_SUBVOL_GETFLAGS }, u64>::new()) }
        .map_err(|e| Error::new("get subvolume flags", dir.path(), e))
}

/// Is the subvolume whose root is `dir` read-only? A checkpoint's
/// snapshot is trusted as a source of content only while it is: someone
/// who flipped it writable could have changed it.
pub fn is_readonly_subvolume(dir: &Dir) -> Result<bool> {
    Ok(subvolume_flags(dir)? & SUBVOL_RDONLY != 0)
}

/// Make the subvolume whose root is `dir` read-only or writable (its
/// owner may): what `btrfs property set DIR ro true|false` does.
pub fn set_subvolume_readonly(dir: &Dir, readonly: bool) -> Result<()> {
    let flags = subvolume_flags(dir)?;
    let flags = if readonly {
        flags | SUBVOL_RDONLY
    } else {
        flags & !SUBVOL_RDONLY
    };
    // SAFETY: BTRFS_IOC_SUBVOL_SETFLAGS reads one u64.
    unsafe {
        ioctl(
            dir.as_fd(),
            Setter::<{ IOC_SUBVOL_SETFLAGS }, u64>::new(flags),
        )
    }
    .map_err(|e| Error::new("set subvolume flags", dir.path(), e))
}

/// Create an empty subvolume `name` in `parent`.
pub fn create_subvolume(parent: &Dir, name: &OsStr) -> Result<()> {
    let args = VolArgs {
        fd: 0,
        name: name_bytes(name, "create subvolume", parent.path())?,
    };
    // SAFETY: `VolArgs` is the kernel's `struct btrfs_ioctl_vol_args`.
    unsafe {
        ioctl(
            parent.as_fd(),
            Setter::<{ IOC_SUBVOL_CREATE }, VolArgs>::new(args),
        )
    }
    .map_err(|e| Error::new("create subvolume", parent.path().join(name), e))
}

/// Snapshot the subvolume `src` as `name` in `parent` (read-only when
/// `readonly`): O(1), whatever the tree's size.
pub fn snapshot(src: &Dir, parent: &Dir, name: &OsStr, readonly: bool) -> Result<()> {
    let args = VolArgsV2 {
        fd: src.as_fd().as_raw_fd_i64(),
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: name_bytes(name, "snapshot", parent.path())?,
    };
    // SAFETY: `VolArgsV2` is the kernel's `struct btrfs_ioctl_vol_args_v2`.
    unsafe {
        ioctl(
            parent.as_fd(),
            Setter::<{ IOC_SNAP_CREATE_V2 }, VolArgsV2>::new(args),
        )
    }
    .map_err(|e| Error::new("snapshot", parent.path().join(name), e))
}

/// Delete the subvolume `name` in `parent` (non-root users need the
/// `user_subvol_rm_allowed` mount option).
pub fn delete_subvolume(parent: &Dir, name: &OsStr) -> Result<()> {
    let args = VolArgs {
        fd: 0,
        name: name_bytes(name, "delete subvolume", parent.path())?,
    };
    // SAFETY: `VolArgs` is the kernel's `struct btrfs_ioctl_vol_args`.
    unsafe {
        ioctl(
            parent.as_fd(),
            Setter::<{ IOC_SNAP_DESTROY }, VolArgs>::new(args),
        )
    }
    .map_err(|e| Error::new("delete subvolume", parent.path().join(name), e))
}

trait RawFdI64 {
    fn as_raw_fd_i64(&self) -> i64;
}

impl RawFdI64 for std::os::fd::BorrowedFd<'_> {
    fn as_raw_fd_i64(&self) -> i64 {
        use std::os::fd::AsRawFd;
        i64::from(self.as_raw_fd())
    }
}

/// Whether this process may delete snapshots under `path`: root may; other
/// users only where the filesystem is mounted with `user_subvol_rm_allowed`
/// (read from /proc/self/mountinfo: the mount whose point is the longest
/// prefix of `path`).
pub fn can_delete_snapshots(path: &std::path::Path) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let mut best: Option<(usize, bool)> = None;
    for line in info.lines() {
        // id parent major:minor root mount-point options ... - type source super-options
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(sep)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let point = point.replace("\\040", " ");
        if !path.starts_with(&point) {
            continue;
        }
        let allowed = fields
            .get(sep + 3)
            .is_some_and(|o| o.split(',').any(|x| x == "user_subvol_rm_allowed"));
        if best.is_none_or(|(len, _)| point.len() >= len) {
            best = Some((point.len(), allowed));
        }
    }
    best.is_some_and(|(_, allowed)| allowed)
}

// ------------------------------------------------ what changed since a transaction

const IOC_TREE_SEARCH_V2: rustix::ioctl::Opcode =
    opcode::read_write::<SearchArgsV2Header>(0x94, 17);
const IOC_INO_LOOKUP: rustix::ioctl::Opcode = opcode::read_write::<InoLookupArgs>(0x94, 18);
const IOC_GET_SUBVOL_INFO: rustix::ioctl::Opcode = opcode::read::<SubvolInfoArgs>(0x94, 60);

const INODE_ITEM_KEY: u32 = 1;
const INODE_REF_KEY: u32 = 12;
const INODE_EXTREF_KEY: u32 = 13;
/// Inode numbers above this are the filesystem's own objects.
const LAST_FREE_OBJECTID: u64 = u64::MAX - 255;
const INO_LOOKUP_PATH_MAX: usize = 4080;
/// Results per search call: 64 KiB holds a few hundred items.
const SEARCH_BUF: usize = 64 * 1024;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: [u64; 4],
}

/// `struct btrfs_ioctl_search_args_v2` without its flexible buffer: the
/// size the opcode encodes.
#[repr(C)]
struct SearchArgsV2Header {
    key: SearchKey,
    buf_size: u64,
}

#[repr(C)]
struct SearchArgsV2 {
    key: SearchKey,
    buf_size: u64,
    buf: [u8; SEARCH_BUF],
}

#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; INO_LOOKUP_PATH_MAX],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct IoctlTimespec {
    sec: u64,
    nsec: u32,
}

#[repr(C)]
struct SubvolInfoArgs {
    treeid: u64,
    name: [u8; 256],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; 16],
    parent_uuid: [u8; 16],
    received_uuid: [u8; 16],
    ctransid: u64,
    otransid: u64,
    stransid: u64,
    rtransid: u64,
    times: [IoctlTimespec; 4],
    reserved: [u64; 8],
}

fn subvol_info(dir: &Dir) -> Result<SubvolInfoArgs> {
    // SAFETY: BTRFS_IOC_GET_SUBVOL_INFO fills one `struct
    // btrfs_ioctl_get_subvol_info_args`, which `SubvolInfoArgs` mirrors.
    unsafe {
        ioctl(
            dir.as_fd(),
            Getter::<{ IOC_GET_SUBVOL_INFO }, SubvolInfoArgs>::new(),
        )
    }
    .map_err(|e| Error::new("get subvolume info", dir.path(), e))
}

/// The transaction that created the subvolume (or snapshot) whose root is
/// `dir`. A read-only snapshot holds exactly what its source held when
/// that transaction committed; anything changed later carries a later
/// transaction id.
pub fn subvolume_otransid(dir: &Dir) -> Result<u64> {
    Ok(subvol_info(dir)?.otransid)
}

/// Whether the tree of the subvolume whose root is `dir` was written after
/// the transaction that created it: a read-only snapshot made writable,
/// changed and made read-only again. (A balance that moves its blocks
/// may write it too: a caller checks the content then, it does not
/// conclude.)
pub fn subvolume_written_since_creation(dir: &Dir) -> Result<bool> {
    let info = subvol_info(dir)?;
    Ok(info.generation > info.otransid)
}

/// An inode of a subvolume whose item was written in a given transaction
/// or later (see [`changed_inodes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedInode {
    pub ino: u64,
    pub is_dir: bool,
    /// Every name it has: (parent directory inode, name).
    pub names: Vec<(u64, Vec<u8>)>,
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// One search result: its key and its item's bytes.
struct Item<'a> {
    objectid: u64,
    kind: u32,
    offset: u64,
    data: &'a [u8],
}

/// Every item of the subvolume holding `dir` with a key in
/// `[min, max]` ((objectid, type, offset) order) in a leaf written at or
/// after transaction `min_transid`, handed to `each`.
fn search(
    dir: &Dir,
    min: (u64, u32, u64),
    max: (u64, u32, u64),
    min_transid: u64,
    mut each: impl FnMut(Item<'_>),
) -> Result<()> {
    let mut args = Box::new(SearchArgsV2 {
        key: SearchKey::default(),
        buf_size: SEARCH_BUF as u64,
        buf: [0; SEARCH_BUF],
    });
    let mut next = min;
    loop {
        args.key = SearchKey {
            tree_id: 0, // the subvolume of `dir`
            min_objectid: next.0,
            max_objectid: max.0,
            min_type: next.1,
            max_type: max.1,
            min_offset: next.2,
            max_offset: max.2,
            min_transid,
            max_transid: u64::MAX,
            nr_items: u32::MAX,
            ..SearchKey::default()
        };
        args.buf_size = SEARCH_BUF as u64;
        // SAFETY: `SearchArgsV2` is `struct btrfs_ioctl_search_args_v2`
        // with a `buf_size`-byte buffer after its header; the opcode
        // encodes the header's size, as the kernel expects.
        unsafe {
            ioctl(
                dir.as_fd(),
                rustix::ioctl::Updater::<{ IOC_TREE_SEARCH_V2 }, SearchArgsV2>::new(&mut args),
            )
        }
        .map_err(|e| Error::new("search the btrfs tree of", dir.path(), e))?;
        let found = args.key.nr_items;
        if found == 0 {
            return Ok(());
        }
        let buf = &args.buf[..];
        let mut at = 0;
        let mut last = next;
        for _ in 0..found {
            let bad = || {
                Error::new(
                    "parse a btrfs search result for",
                    dir.path(),
                    std::io::Error::from(std::io::ErrorKind::InvalidData),
                )
            };
            // struct btrfs_ioctl_search_header: transid, objectid, offset,
            // type, len.
            let objectid = le_u64(buf, at + 8).ok_or_else(bad)?;
            let offset = le_u64(buf, at + 16).ok_or_else(bad)?;
            let kind = le_u32(buf, at + 24).ok_or_else(bad)?;
            let len = le_u32(buf, at + 28).ok_or_else(bad)? as usize;
            let data = buf.get(at + 32..at + 32 + len).ok_or_else(bad)?;
            each(Item {
                objectid,
                kind,
                offset,
                data,
            });
            last = (objectid, kind, offset);
            at += 32 + len;
        }
        // Resume just after the last key returned.
        next = match last {
            (o, t, off) if off < u64::MAX => (o, t, off + 1),
            (o, t, _) if t < 255 => (o, t + 1, 0),
            (o, _, _) if o < max.0 => (o + 1, 0, 0),
            _ => return Ok(()),
        };
        if next > max {
            return Ok(());
        }
    }
}

/// Names in an INODE_REF item (key offset = the parent) or an
/// INODE_EXTREF item (parent inside each record).
fn ref_names(item: &Item<'_>, out: &mut Vec<(u64, Vec<u8>)>) {
    let d = item.data;
    let mut at = 0;
    while at < d.len() {
        let (parent, name_at) = if item.kind == INODE_REF_KEY {
            // struct btrfs_inode_ref: index u64, name_len u16, name.
            (Some(item.offset), at + 10)
        } else {
            // struct btrfs_inode_extref: parent u64, index u64, name_len u16, name.
            (le_u64(d, at), at + 18)
        };
        let Some(parent) = parent else { return };
        let Some(len) = le_u16(d, name_at - 2) else {
            return;
        };
        let Some(name) = d.get(name_at..name_at + len as usize) else {
            return;
        };
        out.push((parent, name.to_vec()));
        at = name_at + len as usize;
    }
}

/// Inodes of the subvolume holding `dir` whose inode item was written in
/// transaction `since` or later: everything created, written, chmod-ed,
/// renamed or linked since then, and every directory whose entries
/// changed (a removed entry shows as its directory). O(changed): the
/// search skips every subtree of the btree older than `since`. Needs
/// CAP_SYS_ADMIN (EPERM otherwise).
pub fn changed_inodes(dir: &Dir, since: u64) -> Result<Vec<ChangedInode>> {
    let mut inodes: Vec<ChangedInode> = Vec::new();
    // Each changed inode's link count, to know when its names are all found.
    let mut nlinks: Vec<u32> = Vec::new();
    let mut refs: std::collections::HashMap<u64, Vec<(u64, Vec<u8>)>> = Default::default();
    search(
        dir,
        (FIRST_FREE_OBJECTID, 0, 0),
        (LAST_FREE_OBJECTID, 255, u64::MAX),
        since,
        |item| match item.kind {
            INODE_ITEM_KEY => {
                // struct btrfs_inode_item: transid at 8, nlink at 40, mode at 52.
                let transid = le_u64(item.data, 8).unwrap_or(u64::MAX);
                let mode = le_u32(item.data, 52).unwrap_or(0);
                if transid >= since {
                    inodes.push(ChangedInode {
                        ino: item.objectid,
                        is_dir: mode & 0o170000 == 0o040000,
                        names: Vec::new(),
                    });
                    nlinks.push(le_u32(item.data, 40).unwrap_or(u32::MAX));
                }
            }
            INODE_REF_KEY | INODE_EXTREF_KEY => {
                ref_names(&item, refs.entry(item.objectid).or_default());
            }
            _ => {}
        },
    )?;
    for (inode, nlink) in inodes.iter_mut().zip(nlinks) {
        let found = refs.remove(&inode.ino).unwrap_or_default();
        // A name in a leaf older than `since` is not in `found`: an inode
        // with fewer names found than links has some there. Taking the
        // found ones alone, a write through one of 1,000 hard links left
        // 678 names out of the checkpoint (helper-82). A directory has
        // one name (its nlink is 1 on btrfs).
        if inode.ino == FIRST_FREE_OBJECTID || found.len() >= nlink as usize {
            inode.names = found;
        } else {
            search(
                dir,
                (inode.ino, INODE_REF_KEY, 0),
                (inode.ino, INODE_EXTREF_KEY, u64::MAX),
                0,
                |item| ref_names(&item, &mut inode.names),
            )?;
        }
    }
    Ok(inodes)
}

/// The path of directory inode `ino` below the root of `dir`'s subvolume,
/// without a trailing slash (empty for the root). Needs CAP_SYS_ADMIN.
pub fn inode_path(dir: &Dir, ino: u64) -> Result<Vec<u8>> {
    if ino == FIRST_FREE_OBJECTID {
        return Ok(Vec::new());
    }
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: ino,
        name: [0; INO_LOOKUP_PATH_MAX],
    });
    // SAFETY: `InoLookupArgs` is `struct btrfs_ioctl_ino_lookup_args`.
    unsafe {
        ioctl(
            dir.as_fd(),
            rustix::ioctl::Updater::<{ IOC_INO_LOOKUP }, InoLookupArgs>::new(&mut args),
        )
    }
    .map_err(|e| Error::new("look up a btrfs inode's path in", dir.path(), e))?;
    let len = args
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(args.name.len());
    let mut path = args.name[..len].to_vec();
    if path.last() == Some(&b'/') {
        path.pop();
    }
    Ok(path)
}
