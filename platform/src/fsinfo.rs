use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::dir::Dir;
use crate::error::{Error, Result};

/// The filesystems rewind treats differently. Anything else is `Other` and
/// gets the portable copy path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
    Tmpfs,
    Fuse,
    Overlay,
    Apfs,
    Other(i64),
}

impl FsKind {
    pub fn from_magic(magic: i64) -> FsKind {
        match magic {
            0xEF53 => FsKind::Ext4,
            0x5846_5342 => FsKind::Xfs,
            0x9123_683E => FsKind::Btrfs,
            0x0102_1994 => FsKind::Tmpfs,
            0x6573_5546 => FsKind::Fuse,
            0x794C_7630 => FsKind::Overlay,
            m => FsKind::Other(m),
        }
    }

    /// Filesystems whose on-disk format can share extents between files.
    /// Whether clones actually work is still probed: XFS made without
    /// `reflink=1` cannot clone.
    pub fn may_clone(self) -> bool {
        matches!(self, FsKind::Xfs | FsKind::Btrfs | FsKind::Apfs)
    }
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsKind::Ext4 => f.write_str("ext4"),
            FsKind::Xfs => f.write_str("xfs"),
            FsKind::Btrfs => f.write_str("btrfs"),
            FsKind::Tmpfs => f.write_str("tmpfs"),
            FsKind::Fuse => f.write_str("fuse"),
            FsKind::Overlay => f.write_str("overlay"),
            FsKind::Apfs => f.write_str("apfs"),
            FsKind::Other(m) => write!(f, "unknown(0x{m:x})"),
        }
    }
}

/// The statfs filesystem id (`f_fsid`) of the filesystem holding `path`,
/// when it gives one. Unlike `st_dev` it outlives a remount where the
/// filesystem derives it from its UUID: btrfs (with the subvolume's id
/// mixed in, where `st_dev` is an anonymous number handed out again at
/// each mount) and ext4. `None` where it is zero or statfs fails.
pub fn filesystem_id(path: &std::path::Path) -> Option<u64> {
    let st = rustix::fs::statfs(path).ok()?;
    // SAFETY: `fsid_t` is two `c_int`s with no invalid bit patterns.
    let [a, b]: [i32; 2] = unsafe { std::mem::transmute(st.f_fsid) };
    let id = (u64::from(a as u32) << 32) | u64::from(b as u32);
    (id != 0).then_some(id)
}

/// What statfs says about the filesystem holding a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    pub kind: FsKind,
    pub dev: u64,
    pub block_size: u64,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    /// Inodes this process may still make ([`available_inodes`]); `None`
    /// where the filesystem makes them as needed.
    pub inodes_writable: Option<u64>,
    /// Mounted read-only (ST_RDONLY).
    pub read_only: bool,
}

impl FsInfo {
    pub fn of(dir: &Dir) -> Result<FsInfo> {
        let st = rustix::fs::fstatfs(dir.fd()).map_err(|e| Error::new("statfs", dir.path(), e))?;
        let meta = dir.meta()?;
        let vfs =
            rustix::fs::fstatvfs(dir.fd()).map_err(|e| Error::new("statvfs", dir.path(), e))?;
        Ok(FsInfo {
            read_only: vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
            kind: FsKind::from_magic(st.f_type as i64),
            dev: meta.dev,
            block_size: st.f_bsize as u64,
            blocks_total: st.f_blocks as u64,
            blocks_free: st.f_bfree as u64,
            blocks_available: st.f_bavail as u64,
            inodes_writable: inodes_left(&vfs),
        })
    }

    /// Bytes this process may write: root may use the blocks a filesystem
    /// keeps for it (ext4's 5 %, `f_bfree`), anyone else what statvfs
    /// calls available (`f_bavail`). Counted as available only, root was
    /// refused a rewind its writes had room for.
    pub fn writable_bytes(&self) -> u64 {
        let blocks = match crate::is_root() {
            true => self.blocks_free,
            false => self.blocks_available,
        };
        blocks.saturating_mul(self.block_size)
    }

    /// Bytes in use on the whole filesystem (total - free), for honest
    /// before/after space accounting.
    pub fn used_bytes(&self) -> u64 {
        self.blocks_total.saturating_sub(self.blocks_free) * self.block_size
    }
}

static CLONE_CACHE: Mutex<Option<HashMap<u64, bool>>> = Mutex::new(None);

/// Do copy-on-write clones work in `dir`? Probed once per device per process
/// with a real FICLONE between two anonymous files: the only honest answer
/// (an XFS without reflink, or a FUSE mount, says "maybe" by type alone).
pub fn clone_support(dir: &Dir) -> Result<bool> {
    let dev = dir.meta()?.dev;
    if let Some(known) = CLONE_CACHE
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|m| m.get(&dev).copied()))
    {
        return Ok(known);
    }
    let answer = probe_clone(dir)?;
    if let Ok(mut cache) = CLONE_CACHE.lock() {
        cache.get_or_insert_with(HashMap::new).insert(dev, answer);
    }
    Ok(answer)
}

/// Uncached probe: create two unnamed files (O_TMPFILE, so a crash leaves
/// nothing behind), write a block into one and try to clone it.
pub fn probe_clone(dir: &Dir) -> Result<bool> {
    let open_tmp = || {
        rustix::fs::openat(
            dir.fd(),
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
    };
    let src = match open_tmp() {
        Ok(fd) => fd,
        // No O_TMPFILE support means an unusual filesystem: assume no clones.
        Err(Errno::OPNOTSUPP) | Err(Errno::ISDIR) | Err(Errno::INVAL) => return Ok(false),
        Err(e) => return Err(Error::new("probe clone", dir.path(), e)),
    };
    let dst = open_tmp().map_err(|e| Error::new("probe clone", dir.path(), e))?;
    let block = [0x5au8; 4096];
    rustix::io::write(&src, &block).map_err(|e| Error::new("probe clone", dir.path(), e))?;
    Ok(rustix::fs::ioctl_ficlone(&dst, &src).is_ok())
}

/// One line of /proc/self/mountinfo: the device, the directory of the
/// filesystem it shows (unescaped), the mount point (unescaped), and the
/// filesystem type and source that follow the optional fields' `-`.
struct MountLine<'a> {
    dev: &'a [u8],
    root: Vec<u8>,
    point: Vec<u8>,
    kind: Option<&'a [u8]>,
    source: Option<&'a [u8]>,
}

/// The lines of a mountinfo table.
fn mount_table(table: &[u8]) -> impl DoubleEndedIterator<Item = MountLine<'_>> {
    table.split(|&b| b == b'\n').filter_map(|line| {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        // Field 5 is the mount point, with space, tab, newline and
        // backslash escaped as octal.
        let point = unescape_octal(fields.get(4)?);
        let dash = fields.iter().position(|f| *f == b"-");
        Some(MountLine {
            dev: fields.get(2)?,
            root: unescape_octal(fields.get(3)?),
            point,
            kind: dash.and_then(|d| fields.get(d + 1).copied()),
            source: dash.and_then(|d| fields.get(d + 2).copied()),
        })
    })
}

/// Where else, in this mount namespace, the directory bound at
/// `bind_point` (a bind mount of it, as the mount daemon keeps of the
/// directory it covers) can be reached without passing a mount of a
/// type in `covered_by` (the FUSE mount over it): another bind mount of
/// it, of a directory above it or below it, or the same filesystem
/// mounted again. What is written there never passes the covering mount
/// (helper-82: a bind made before `rewind mount`, as a container's `-v`
/// is). Other mount namespaces are not looked at.
pub fn reached_elsewhere(
    bind_point: &std::path::Path,
    covered_by: &[&[u8]],
) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let Ok(table) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let want = bind_point.as_os_str().as_bytes();
    let Some(bound) = mount_table(&table).rfind(|m| m.point == want) else {
        return Vec::new();
    };
    let (dev, dir) = (bound.dev, bound.root.clone());
    let covered: Vec<Vec<u8>> = mount_table(&table)
        .filter(|m| m.kind.is_some_and(|k| covered_by.contains(&k)))
        .map(|m| m.point)
        .collect();
    // `a` is `b` or a directory above it.
    let at_or_above = |a: &[u8], b: &[u8]| {
        a == b || a == b"/" || (b.starts_with(a) && b.get(a.len()) == Some(&b'/'))
    };
    let mut out = Vec::new();
    for m in mount_table(&table).filter(|m| m.dev == dev && m.point != want) {
        let shown = if at_or_above(&m.root, &dir) {
            // The directory, where this mount shows it.
            let below = &dir[m.root.len().min(dir.len())..];
            let below = below.strip_prefix(b"/").unwrap_or(below);
            let mut p = m.point.clone();
            if !below.is_empty() {
                if p.last() != Some(&b'/') {
                    p.push(b'/');
                }
                p.extend_from_slice(below);
            }
            p
        } else if at_or_above(&dir, &m.root) {
            // A directory inside it, mounted on its own.
            m.point.clone()
        } else {
            continue;
        };
        if !covered.contains(&shown)
            && !out
                .iter()
                .any(|o: &std::path::PathBuf| o.as_os_str().as_bytes() == shown)
        {
            out.push(std::path::PathBuf::from(std::ffi::OsString::from_vec(
                shown,
            )));
        }
    }
    out
}

/// Tells whether this mount namespace's table may have changed since the
/// last look, for a caller that keeps an answer derived from it (the
/// mount daemon asks [`reached_elsewhere`] at every capture). Reading the
/// table costs a read and a parse of every line: ~20 µs with 20 mounts,
/// more with a container runtime's hundreds. The kernel raises POLLPRI
/// on an open `/proc/self/mountinfo` once per change since the last
/// poll, so a poll with no wait answers in well under a microsecond.
pub struct MountWatch {
    table: Option<std::fs::File>,
}

impl MountWatch {
    /// Starts watching now: a change after this call is reported by the
    /// next [`MountWatch::changed`]. So open it before reading the table
    /// whose answer is kept, never after.
    pub fn new() -> MountWatch {
        MountWatch {
            table: std::fs::File::open("/proc/self/mountinfo").ok(),
        }
    }

    /// Whether the table changed since the last call (or since
    /// [`MountWatch::new`]). Without `/proc`, or when the poll fails,
    /// always yes: the caller reads again, as it would without a watch.
    pub fn changed(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let Some(table) = &self.table else {
            return true;
        };
        let mut fds = [PollFd::new(table, PollFlags::PRI)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&now)) {
            Ok(_) => fds[0].revents().intersects(PollFlags::PRI | PollFlags::ERR),
            Err(_) => true,
        }
    }
}

impl Default for MountWatch {
    fn default() -> Self {
        MountWatch::new()
    }
}

/// Whether any filesystem is mounted strictly below `path` (per
/// /proc/self/mountinfo; an unreadable table counts as yes).
pub fn mounts_below(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(table) = std::fs::read("/proc/self/mountinfo") else {
        return true;
    };
    let mut prefix = path.as_os_str().as_bytes().to_vec();
    if prefix.last() != Some(&b'/') {
        prefix.push(b'/');
    }
    mount_table(&table).any(|m| m.point.starts_with(&prefix))
}

/// The type and source of the filesystem mounted exactly at `path` (the
/// top one of a stack), per /proc/self/mountinfo.
pub fn mount_at(path: &std::path::Path) -> Option<(Vec<u8>, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let table = std::fs::read("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    mount_table(&table)
        .filter(|m| m.point == want)
        .filter_map(|m| Some((m.kind?.to_vec(), unescape_octal(m.source?))))
        .next_back()
}

/// `s` with the kernel's octal escapes in /proc tables (`\040` for a
/// space) undone.
pub(crate) fn unescape_octal(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let oct = s
            .get(i + 1..i + 4)
            .filter(|d| s[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(s[i]);
                i += 1;
            }
        }
    }
    out
}

/// The (device, inode) `path` names now, following symlinks: whether a
/// name still stands for the file a process opened or bound earlier.
pub fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Inodes a writer may still make on the filesystem holding `path`
/// (`f_favail`, root's `f_ffree`), if statvfs answers and the filesystem
/// has a fixed number of them: ext4 runs out of inodes with bytes to
/// spare, btrfs (which reports 0 in all) never does.
pub fn available_inodes(path: &std::path::Path) -> Option<u64> {
    let v = rustix::fs::statvfs(path).ok()?;
    inodes_left(&v)
}

fn inodes_left(v: &rustix::fs::StatVfs) -> Option<u64> {
    (v.f_files > 0).then_some(match crate::is_root() {
        true => v.f_ffree,
        false => v.f_favail,
    })
}

/// Bytes an unprivileged writer may still allocate on the filesystem
/// holding `path` (`f_bavail`), if statvfs answers.
pub fn available_bytes(path: &std::path::Path) -> Option<u64> {
    let v = rustix::fs::statvfs(path).ok()?;
    Some(v.f_bavail.saturating_mul(v.f_frsize))
}

#[cfg(test)]
mod mount_tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped_before_comparing() {
        assert_eq!(
            unescape_octal(br"/a\040b\011c\134d"),
            b"/a b\tc\\d".to_vec()
        );
        assert_eq!(unescape_octal(b"/plain"), b"/plain".to_vec());
    }

    #[test]
    fn proc_is_below_the_root_and_nothing_is_below_a_fresh_dir() {
        assert!(mounts_below(std::path::Path::new("/")));
        let t = tempfile::tempdir().expect("tempdir");
        assert!(!mounts_below(t.path()));
    }
}
