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

/// Is the subvolume whose root is `dir` read-only? A checkpoint's
/// snapshot is trusted as a source of content only while it is: someone
/// who flipped it writable could have changed it.
pub fn is_readonly_subvolume(dir: &Dir) -> Result<bool> {
    // SAFETY: BTRFS_IOC_SUBVOL_GETFLAGS writes one u64.
    let flags = unsafe { ioctl(dir.as_fd(), Getter::<{ IOC_SUBVOL_GETFLAGS }, u64>::new()) }
        .map_err(|e| Error::new("get subvolume flags", dir.path(), e))?;
    Ok(flags & SUBVOL_RDONLY != 0)
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
