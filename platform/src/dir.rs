use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags, Timespec, Timestamps,
};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::xattr::{self, Xattr};

/// The kind of a directory entry. Only the first three are ever captured:
/// FIFOs, sockets and devices are skipped (opening a FIFO would hang).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl EntryKind {
    pub(crate) fn from_file_type(t: FileType) -> EntryKind {
        match t {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            FileType::Fifo => EntryKind::Fifo,
            FileType::Socket => EntryKind::Socket,
            FileType::CharacterDevice => EntryKind::CharDevice,
            FileType::BlockDevice => EntryKind::BlockDevice,
            FileType::Unknown => EntryKind::File,
        }
    }

    pub fn is_special(self) -> bool {
        !matches!(self, EntryKind::File | EntryKind::Dir | EntryKind::Symlink)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Fifo => "fifo",
            EntryKind::Socket => "socket",
            EntryKind::CharDevice => "char device",
            EntryKind::BlockDevice => "block device",
        }
    }
}

/// A tree's device and, where the kernel says, its mount: what tells an
/// entry of the tree from a mount point or nested btrfs subvolume in it.
/// The device alone does not: a directory bind-mounted from the same
/// filesystem has the same one (D245).
#[derive(Debug, Clone, Copy)]
pub struct Within {
    dev: u64,
    mount: Option<u64>,
}

impl Within {
    /// Whether an entry stat'ed as `meta`, on `mount` (see
    /// [`Dir::stat_mount_at`]), is in this tree's own device and mount
    /// (a mount id the kernel did not give matches any).
    pub fn holds(&self, meta: &Meta, mount: Option<u64>) -> bool {
        let other_mount = matches!((mount, self.mount), (Some(m), Some(t)) if m != t);
        meta.dev == self.dev && !other_mount
    }
}

/// The stat fields rewind cares about, from one `fstatat(AT_SYMLINK_NOFOLLOW)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub kind: EntryKind,
    /// Permission bits including setuid/setgid/sticky (st_mode & 0o7777).
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    /// Allocated bytes (st_blocks * 512).
    pub allocated: u64,
    pub uid: u32,
    pub gid: u32,
}

/// A file time as nanoseconds since the epoch, the way every stat is
/// kept. Past i64's range (after 2262-04-11 23:47:16 UTC, before 1677)
/// it saturates: a file dated 2300 came back dated 1901 (the product
/// wrapped, and the filesystem clamped what it was given, helper-81),
/// and a debug build panicked. Such a time is restored as the bound.
pub fn ns_since_epoch(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

impl Meta {
    /// The stat of an open file (`fstat`).
    pub fn of_file(file: &File) -> std::io::Result<Meta> {
        Ok(Meta::from_stat(&rustix::fs::fstat(file)?))
    }

    fn from_stat(st: &rustix::fs::Stat) -> Meta {
        Meta {
            kind: EntryKind::from_file_type(FileType::from_raw_mode(st.st_mode as _)),
            mode: st.st_mode & 0o7777,
            size: st.st_size as u64,
            mtime_ns: ns_since_epoch(st.st_mtime, st.st_mtime_nsec as i64),
            ctime_ns: ns_since_epoch(st.st_ctime, st.st_ctime_nsec as i64),
            dev: st.st_dev,
            ino: st.st_ino,
            nlink: st.st_nlink,
            allocated: (st.st_blocks as u64) * 512,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }

    fn from_statx(x: &rustix::fs::Statx) -> Meta {
        let ns = |t: &rustix::fs::StatxTimestamp| ns_since_epoch(t.tv_sec, i64::from(t.tv_nsec));
        Meta {
            kind: EntryKind::from_file_type(FileType::from_raw_mode(u32::from(x.stx_mode) as _)),
            mode: u32::from(x.stx_mode) & 0o7777,
            size: x.stx_size,
            mtime_ns: ns(&x.stx_mtime),
            ctime_ns: ns(&x.stx_ctime),
            dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
            ino: x.stx_ino,
            nlink: u64::from(x.stx_nlink),
            allocated: x.stx_blocks * 512,
            uid: x.stx_uid,
            gid: x.stx_gid,
        }
    }
}

/// How `rename` treats an existing destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    Replace,
    NoReplace,
    Exchange,
}

/// An open directory. Every operation is relative to its fd and never
/// follows a symlink, so nothing done through a `Dir` can escape it even if
/// the tree is changed concurrently. `path` is only for messages.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

impl Dir {
    /// Open a directory by path (following symlinks: this is the root the
    /// user named, and everything below it is then fd-relative).
    pub fn open(path: &Path) -> Result<Dir> {
        let fd = rustix::fs::open(path, DIR_FLAGS, Mode::empty())
            .map_err(|e| Error::new("open directory", path, e))?;
        Ok(Dir {
            fd,
            path: path.to_owned(),
        })
    }

    /// The directory open at `fd`, which `path` names (for messages).
    pub fn from_fd(fd: OwnedFd, path: &Path) -> Dir {
        Dir {
            fd,
            path: path.to_owned(),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn child(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    pub fn try_clone(&self) -> Result<Dir> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| Error::new("dup", &self.path, e))?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
        })
    }

    pub fn meta(&self) -> Result<Meta> {
        let st = rustix::fs::fstat(&self.fd).map_err(|e| Error::new("stat", &self.path, e))?;
        Ok(Meta::from_stat(&st))
    }

    /// The id of the mount this directory is on, where the kernel says
    /// (`statx` `STATX_MNT_ID`, Linux 5.8).
    pub fn mount_id(&self) -> Option<u64> {
        let flags = AtFlags::EMPTY_PATH;
        let x = rustix::fs::statx(&self.fd, c"", flags, rustix::fs::StatxFlags::MNT_ID).ok()?;
        (x.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0).then_some(x.stx_mnt_id)
    }

    /// Where this directory is: its device and, where the kernel says,
    /// its mount ([`Within`]).
    pub fn within(&self) -> Result<Within> {
        Ok(Within {
            dev: self.meta()?.dev,
            mount: self.mount_id(),
        })
    }

    /// [`Dir::stat_at`], with the id of the mount the entry is on where
    /// the kernel says (one `statx`, as cheap as the `fstatat`). The
    /// device alone does not tell a mount point: a directory bind-mounted
    /// from the same filesystem has its parent's, and an overlayfs whose
    /// layers sit on different filesystems (`xino=off`) gives each
    /// non-directory its layer's inside one mount.
    pub fn stat_mount_at(&self, name: &OsStr) -> Result<(Meta, Option<u64>)> {
        let want = rustix::fs::StatxFlags::BASIC_STATS | rustix::fs::StatxFlags::MNT_ID;
        match rustix::fs::statx(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW, want) {
            Ok(x) => {
                let basic = rustix::fs::StatxFlags::BASIC_STATS.bits();
                if x.stx_mask & basic != basic {
                    return Ok((self.stat_at(name)?, None));
                }
                let mount = (x.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0)
                    .then_some(x.stx_mnt_id);
                Ok((Meta::from_statx(&x), mount))
            }
            // A seccomp filter that predates statx.
            Err(Errno::NOSYS) | Err(Errno::PERM) => Ok((self.stat_at(name)?, None)),
            Err(e) => Err(Error::new("stat", self.child(name), e)),
        }
    }

    /// Open the subdirectory `name`, refusing a symlink.
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir> {
        let fd = rustix::fs::openat(&self.fd, name, DIR_FLAGS | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| Error::new("open directory", self.child(name), e))?;
        Ok(Dir {
            fd,
            path: self.child(name),
        })
    }

    /// Open the directory at a relative path below this one, with no symlink
    /// anywhere on the way and no mount crossed: `openat2(RESOLVE_BENEATH |
    /// RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, or a component-by-component
    /// walk with O_NOFOLLOW where openat2 is missing. An empty path is `self`.
    pub fn open_beneath(&self, rel: &Path) -> Result<Dir> {
        check_relative(rel).map_err(|e| Error::new("open directory", self.path.join(rel), e))?;
        if rel.as_os_str().is_empty() {
            return self.try_clone();
        }
        if !OPENAT2_MISSING.load(Ordering::Relaxed) {
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV;
            match rustix::fs::openat2(
                &self.fd,
                rel,
                DIR_FLAGS | OFlags::NOFOLLOW,
                Mode::empty(),
                resolve,
            ) {
                Ok(fd) => {
                    return Ok(Dir {
                        fd,
                        path: self.path.join(rel),
                    });
                }
                Err(Errno::NOSYS) | Err(Errno::PERM) => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed)
                }
                // Retry by the walk below; a path past PATH_MAX (4096
                // bytes) can only be opened a component at a time.
                Err(Errno::AGAIN) | Err(Errno::INTR) | Err(Errno::NAMETOOLONG) => {}
                Err(e) => return Err(Error::new("open directory", self.path.join(rel), e)),
            }
        }
        let mut dir = self.try_clone()?;
        let dev = self.meta()?.dev;
        for comp in rel.components() {
            if let Component::Normal(name) = comp {
                dir = dir.open_dir(name)?;
                if dir.meta()?.dev != dev {
                    return Err(Error::new("open directory", dir.path.clone(), Errno::XDEV));
                }
            }
        }
        Ok(dir)
    }

    /// Does the kernel offer openat2 with RESOLVE_BENEATH (Linux 5.6+)? If
    /// not, `open_beneath` walks component by component with O_NOFOLLOW.
    pub fn openat2_available(&self) -> bool {
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
        rustix::fs::openat2(&self.fd, ".", DIR_FLAGS, Mode::empty(), resolve).is_ok()
    }

    /// Whether this process may create and remove entries here, as the
    /// kernel judges it (mode, ACLs, capabilities; not a sticky bit's
    /// per-entry rule).
    pub fn writable_by_me(&self) -> bool {
        rustix::fs::accessat(
            &self.fd,
            ".",
            rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
            rustix::fs::AtFlags::EACCESS,
        )
        .is_ok()
    }

    /// Entry names (never "." or ".."), in directory order.
    pub fn entries(&self) -> Result<Vec<OsString>> {
        Ok(self
            .entries_with_ino()?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    }

    /// Names with the inode number each names (`d_ino`), as listed: no
    /// stat. On an overlay or a filesystem that reports placeholder inode
    /// numbers the caller must not trust them further than a stat's.
    pub fn entries_with_ino(&self) -> Result<Vec<(OsString, u64)>> {
        let mut it = rustix::fs::Dir::read_from(&self.fd)
            .map_err(|e| Error::new("read directory", &self.path, e))?;
        let mut out = Vec::new();
        while let Some(ent) = it.read() {
            let ent = ent.map_err(|e| Error::new("read directory", &self.path, e))?;
            let name = ent.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push((OsStr::from_bytes(name).to_owned(), ent.ino()));
            }
        }
        Ok(out)
    }

    /// `fstatat(name, AT_SYMLINK_NOFOLLOW)`.
    pub fn stat_at(&self, name: &OsStr) -> Result<Meta> {
        let st = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| Error::new("stat", self.child(name), e))?;
        Ok(Meta::from_stat(&st))
    }

    /// Open a regular file for reading. Never blocks on a FIFO and never
    /// follows a symlink; anything but a regular file is refused (the entry
    /// may have been swapped since it was stat'ed).
    ///
    /// Reading leaves the file's access time alone where the kernel lets
    /// it (`O_NOATIME`: its owner or root), as backup tools do: under the
    /// default `relatime`, the first read of a file written since its
    /// last access set its atime, so a checkpoint told mail readers that
    /// new mail had been read and `find -atime` that every edited file had
    /// been used, and paid a journal transaction per file (D346).
    pub fn open_read(&self, name: &OsStr) -> Result<(File, Meta)> {
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags | OFlags::NOATIME, Mode::empty()) {
            // Someone else's file, without CAP_FOWNER.
            Err(Errno::PERM) => rustix::fs::openat(&self.fd, name, flags, Mode::empty()),
            r => r,
        }
        .map_err(|e| Error::new("open", self.child(name), e))?;
        let meta = Meta::from_stat(
            &rustix::fs::fstat(&fd).map_err(|e| Error::new("stat", self.child(name), e))?,
        );
        if meta.kind != EntryKind::File {
            return Err(Error::new(
                "open",
                self.child(name),
                std::io::Error::other(format!("is a {}, not a regular file", meta.kind.as_str())),
            ));
        }
        Ok((File::from(fd), meta))
    }

    /// [`Dir::open_read`] of the file at `rel`, a relative path beneath
    /// this directory (its directories opened as [`Dir::open_beneath`]
    /// does: no symlink, no other filesystem, nothing outside).
    pub fn open_read_beneath(&self, rel: &Path) -> Result<(File, Meta)> {
        self.open_beneath(rel.parent().unwrap_or(Path::new("")))?
            .open_read(rel.file_name().unwrap_or_default())
    }

    /// Whether another process has the regular file `name` open for
    /// writing, when the kernel can say: a read lease is refused while
    /// any writer holds it. `None`: it cannot say (not the file's owner
    /// without CAP_LEASE, a filesystem without leases, not a file). The
    /// lease is dropped at once; a writer opening it meanwhile waits
    /// that long, and the break signal (SIGIO) is ignored.
    pub fn open_for_writing_elsewhere(&self, name: &OsStr) -> Option<bool> {
        use std::os::fd::AsRawFd;
        static IGNORE_SIGIO: std::sync::Once = std::sync::Once::new();
        // Rewind uses SIGIO for nothing else, and its default would end
        // the process on a lease break.
        IGNORE_SIGIO.call_once(|| {
            crate::process::install_handler(libc::SIGIO, libc::SIG_IGN, 0);
        });
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::empty()).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        if Meta::from_stat(&st).kind != EntryKind::File {
            return None;
        }
        // SAFETY: plain fcntl(2) on a descriptor this function owns.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        if r == 0 {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
            return Some(false);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) => Some(true),
            _ => None,
        }
    }

    /// Open the file `name` for reading and writing (appending, with
    /// `append`), made with `mode` if missing; never through a symlink.
    /// For files root gives away (D148): followed by path, a symlink
    /// planted there made root chown any file to the user (helper-20,
    /// D160).
    pub fn open_or_create(&self, name: &OsStr, mode: u32, append: bool) -> Result<File> {
        let mut flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if append {
            flags |= OFlags::APPEND;
        }
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode as _))
            .map_err(|e| Error::new("open", self.child(name), e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::new("stat", self.child(name), e))?;
        if FileType::from_raw_mode(st.st_mode as _) != FileType::RegularFile || st.st_nlink != 1 {
            return Err(Error::new(
                "open",
                self.child(name),
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "is not a plain file (a hard link, a device or a directory): refusing to use it",
                ),
            ));
        }
        Ok(File::from(fd))
    }

    /// Create a new file (O_EXCL) open for reading and writing.
    pub fn create_new(&self, name: &OsStr, mode: u32) -> Result<File> {
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode as _))
            .map_err(|e| Error::new("create", self.child(name), e))?;
        Ok(File::from(fd))
    }

    pub fn mkdir(&self, name: &OsStr, mode: u32) -> Result<()> {
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode as _))
            .map_err(|e| Error::new("mkdir", self.child(name), e))
    }

    /// The directory `name`, made first if it is not there.
    pub fn open_or_make_dir(&self, name: &OsStr, mode: u32) -> Result<Dir> {
        match self.mkdir(name, mode) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.open_dir(name)
    }

    pub fn symlink(&self, target: &[u8], name: &OsStr) -> Result<()> {
        rustix::fs::symlinkat(OsStr::from_bytes(target), &self.fd, name)
            .map_err(|e| Error::new("symlink", self.child(name), e))
    }

    pub fn readlink(&self, name: &OsStr) -> Result<Vec<u8>> {
        let target = rustix::fs::readlinkat(&self.fd, name, Vec::new())
            .map_err(|e| Error::new("readlink", self.child(name), e))?;
        Ok(target.into_bytes())
    }

    /// A hard link `to_dir/to` to the entry `name` (never following symlinks).
    pub fn link(&self, name: &OsStr, to_dir: &Dir, to: &OsStr) -> Result<()> {
        rustix::fs::linkat(&self.fd, name, &to_dir.fd, to, rustix::fs::AtFlags::empty())
            .map_err(|e| Error::new("link", to_dir.path.join(to), e))
    }

    pub fn unlink(&self, name: &OsStr) -> Result<()> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())
            .map_err(|e| Error::new("unlink", self.child(name), e))
    }

    pub fn rmdir(&self, name: &OsStr) -> Result<()> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| Error::new("rmdir", self.child(name), e))
    }

    /// Remove `name` and everything below it, fd-relative, never following a
    /// symlink (a symlink to a directory is unlinked, not descended). A
    /// missing entry is not an error. Never crosses into another mount or
    /// a nested btrfs subvolume below `name`: a directory bind-mounted
    /// from the same filesystem has the same device, and emptying it
    /// removed files outside the tree (helper-37, D245). Such a directory
    /// is an error, naming it, with what lies beside it already removed.
    pub fn remove_all(&self, name: &OsStr) -> Result<()> {
        let meta = match self.stat_at(name) {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        if meta.kind != EntryKind::Dir {
            return match self.unlink(name) {
                Err(e) if !e.is_not_found() => Err(e),
                _ => Ok(()),
            };
        }
        let sub = self.open_to_empty(name)?;
        let top = sub.within()?;
        sub.remove_children(top)?;
        match self.rmdir(name) {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// Remove every entry of this directory but those named in `keep`,
    /// as [`Dir::remove_all`] does, never crossing into another mount
    /// or a nested btrfs subvolume: one mounted right here is an error
    /// naming it, with nothing below it touched (helper-73: a bind mount
    /// in `.rewind/` was emptied, each entry being removed on its own).
    pub fn remove_all_but(&self, keep: &[&OsStr]) -> Result<()> {
        let top = self.within()?;
        for child in self.entries()? {
            if keep.contains(&child.as_os_str()) {
                continue;
            }
            let (meta, mount) = match self.stat_mount_at(&child) {
                Ok(m) => m,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if meta.kind == EntryKind::Dir && !top.holds(&meta, mount) {
                return Err(Error::new(
                    "remove a tree holding a mount point or nested subvolume (not crossed)",
                    self.child(&child),
                    Errno::BUSY,
                ));
            }
            self.remove_all(&child)?;
        }
        Ok(())
    }

    /// Open the directory `name` to empty it, making it readable and
    /// writable by its owner first where it is not (mode 0 directories).
    fn open_to_empty(&self, name: &OsStr) -> Result<Dir> {
        let sub = match self.open_dir(name) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                self.set_mode(name, EntryKind::Dir, 0o700)?;
                self.open_dir(name)?
            }
            Err(e) => return Err(e),
        };
        if sub.meta()?.mode & 0o300 != 0o300 {
            rustix::fs::fchmod(&sub.fd, Mode::from_raw_mode(0o700))
                .map_err(|e| Error::new("chmod", &sub.path, e))?;
        }
        Ok(sub)
    }

    /// Remove everything in this directory, which is [`Within`] `top`.
    fn remove_children(&self, top: Within) -> Result<()> {
        for child in self.entries()? {
            let (meta, mount) = match self.stat_mount_at(&child) {
                Ok(m) => m,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            if meta.kind != EntryKind::Dir {
                match self.unlink(&child) {
                    Err(e) if !e.is_not_found() => return Err(e),
                    _ => continue,
                }
            }
            if !top.holds(&meta, mount) {
                return Err(Error::new(
                    "remove a tree holding a mount point or nested subvolume (not crossed)",
                    self.child(&child),
                    Errno::BUSY,
                ));
            }
            self.open_to_empty(&child)?.remove_children(top)?;
            match self.rmdir(&child) {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// `renameat2` from this directory to `to_dir`.
    pub fn rename(&self, from: &OsStr, to_dir: &Dir, to: &OsStr, mode: RenameMode) -> Result<()> {
        let flags = match mode {
            RenameMode::Replace => RenameFlags::empty(),
            RenameMode::NoReplace => RenameFlags::NOREPLACE,
            RenameMode::Exchange => RenameFlags::EXCHANGE,
        };
        match rustix::fs::renameat_with(&self.fd, from, &to_dir.fd, to, flags) {
            // FUSE filesystems written before RENAME_NOREPLACE (exfat-fuse,
            // bindfs 1.14) refuse the flag itself. Look, then rename: racy
            // against a process creating the same name meanwhile, which
            // only such a filesystem allows. Failing here left a rewind
            // half done, its rollback failing the same way.
            Err(Errno::INVAL) if mode == RenameMode::NoReplace => {
                match rustix::fs::statat(&to_dir.fd, to, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(_) => Err(Error::new("rename", to_dir.child(to), Errno::EXIST)),
                    Err(Errno::NOENT) => rustix::fs::renameat(&self.fd, from, &to_dir.fd, to)
                        .map_err(|e| Error::new("rename", to_dir.child(to), e)),
                    Err(e) => Err(Error::new("rename", to_dir.child(to), e)),
                }
            }
            r => r.map_err(|e| Error::new("rename", to_dir.child(to), e)),
        }
    }

    /// Open an existing file or directory for metadata changes, refusing
    /// symlinks. Works on unreadable entries through O_PATH.
    fn open_for_meta(&self, name: &OsStr, kind: EntryKind) -> Result<OwnedFd> {
        let mut flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        if kind == EntryKind::Dir {
            flags |= OFlags::DIRECTORY;
        }
        match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => Ok(fd),
            Err(Errno::ACCESS) => rustix::fs::openat(
                &self.fd,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::new("open", self.child(name), e)),
            Err(e) => Err(Error::new("open", self.child(name), e)),
        }
    }

    /// chmod this directory itself.
    pub fn set_own_mode(&self, mode: u32) -> Result<()> {
        set_mode_fd(self.fd(), mode).map_err(|e| Error::new("chmod", &self.path, e))
    }

    /// chmod an entry (not a symlink) without following symlinks.
    pub fn set_mode(&self, name: &OsStr, kind: EntryKind, mode: u32) -> Result<()> {
        let fd = self.open_for_meta(name, kind)?;
        set_mode_fd(fd.as_fd(), mode).map_err(|e| Error::new("chmod", self.child(name), e))
    }

    /// Set the mtime of an entry without following symlinks (a symlink's
    /// own time is set, not its target's).
    pub fn set_mtime(&self, name: &OsStr, kind: EntryKind, mtime_ns: i64) -> Result<()> {
        if kind == EntryKind::Symlink {
            return rustix::fs::utimensat(
                &self.fd,
                name,
                &mtime_only(mtime_ns),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| Error::new("set mtime", self.child(name), e));
        }
        let fd = self.open_for_meta(name, kind)?;
        set_mtime_fd(fd.as_fd(), mtime_ns).map_err(|e| Error::new("set mtime", self.child(name), e))
    }

    /// Set an entry's owner and group without following symlinks. Before
    /// any chmod: the kernel clears setuid and setgid on a chown.
    pub fn set_owner(&self, name: &OsStr, uid: u32, gid: u32) -> Result<()> {
        let (u, g) = (
            rustix::fs::Uid::from_raw(uid),
            rustix::fs::Gid::from_raw(gid),
        );
        rustix::fs::chownat(&self.fd, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| Error::new("chown", self.child(name), e))
    }

    /// Whether an entry is immutable or append-only (`chattr +i`/`+a`):
    /// then not even root can replace or remove it.
    pub fn is_locked_at(&self, name: &OsStr) -> Result<bool> {
        let x = rustix::fs::statx(
            &self.fd,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            rustix::fs::StatxFlags::BASIC_STATS,
        )
        .map_err(|e| Error::new("stat", self.child(name), e))?;
        let locked = rustix::fs::StatxAttributes::IMMUTABLE | rustix::fs::StatxAttributes::APPEND;
        Ok((x.stx_attributes & x.stx_attributes_mask).intersects(locked))
    }

    /// Set the `user.*` xattrs of an entry (not a symlink) to exactly `want`.
    pub fn set_user_xattrs(&self, name: &OsStr, kind: EntryKind, want: &[Xattr]) -> Result<()> {
        let fd = self.open_for_meta(name, kind)?;
        xattr::set_user(fd.as_fd(), want).map_err(|e| Error::new("set xattrs", self.child(name), e))
    }

    /// The `user.*` xattrs of this directory itself.
    pub fn user_xattrs(&self) -> Result<Vec<Xattr>> {
        xattr::list_user(self.fd.as_fd()).map_err(|e| Error::new("list xattrs", &self.path, e))
    }

    /// The `user.*` xattrs of an entry (file or directory). Opens the entry;
    /// callers skip this when the stat cache says nothing changed.
    pub fn user_xattrs_at(&self, name: &OsStr, kind: EntryKind) -> Result<Vec<Xattr>> {
        let fd = self.open_for_meta(name, kind)?;
        match xattr::list_user(fd.as_fd()) {
            Ok(x) => Ok(x),
            // An O_PATH fd cannot list xattrs; an unreadable entry has none we can read.
            Err(e) if e.raw_os_error() == Some(9) => Ok(Vec::new()),
            Err(e) => Err(Error::new("list xattrs", self.child(name), e)),
        }
    }

    /// fsync the regular file `name`, opened as [`Dir::open_read`] opens
    /// it; its stat from just before the fsync is returned (what the fsync
    /// made durable, at least).
    pub fn fsync_file(&self, name: &OsStr) -> Result<Meta> {
        let (file, meta) = self.open_read(name)?;
        file.sync_all()
            .map_err(|e| Error::new("fsync", self.child(name), e))?;
        Ok(meta)
    }

    pub fn fsync(&self) -> Result<()> {
        rustix::fs::fsync(&self.fd).map_err(|e| Error::new("fsync", &self.path, e))
    }

    /// Flush the whole filesystem holding this directory: one call instead of
    /// an fsync per file when many files were written.
    pub fn syncfs(&self) -> Result<()> {
        rustix::fs::syncfs(&self.fd).map_err(|e| Error::new("syncfs", &self.path, e))
    }
}

/// chmod through an fd; O_PATH fds go through /proc/self/fd, which acts on
/// the inode itself (no symlink can be in the way).
pub(crate) fn set_mode_fd(fd: BorrowedFd<'_>, mode: u32) -> std::io::Result<()> {
    match rustix::fs::fchmod(fd, Mode::from_raw_mode(mode as _)) {
        Err(Errno::BADF) => {
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            rustix::fs::chmod(proc.as_str(), Mode::from_raw_mode(mode as _))?;
            Ok(())
        }
        r => Ok(r?),
    }
}

/// Timestamps that set the mtime and leave the atime alone.
fn mtime_only(mtime_ns: i64) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000),
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
        },
    }
}

pub(crate) fn set_mtime_fd(fd: BorrowedFd<'_>, mtime_ns: i64) -> std::io::Result<()> {
    let times = mtime_only(mtime_ns);
    match rustix::fs::futimens(fd, &times) {
        Err(Errno::BADF) => {
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            rustix::fs::utimensat(rustix::fs::CWD, proc.as_str(), &times, AtFlags::empty())?;
            Ok(())
        }
        r => Ok(r?),
    }
}

/// File-level helpers for files opened through a `Dir`.
impl Xattr {
    pub fn list_user(file: &File) -> std::io::Result<Vec<Xattr>> {
        xattr::list_user(file.as_fd())
    }

    /// The xattrs of an open file or directory whose names (with their
    /// namespace prefix) `keep` accepts.
    pub fn list_where(
        fd: BorrowedFd<'_>,
        keep: impl Fn(&[u8]) -> bool,
    ) -> std::io::Result<Vec<Xattr>> {
        xattr::list_where(fd, keep)
    }

    /// Set each of `xs` (removing none): for an entry just made.
    pub fn add(fd: BorrowedFd<'_>, xs: &[Xattr]) -> std::io::Result<()> {
        xattr::add(fd, xs)
    }

    pub fn set_user(file: &File, want: &[Xattr]) -> std::io::Result<()> {
        xattr::set_user(file.as_fd(), want)
    }
}

/// chmod / mtime / fsync on an open file.
pub fn file_set_mode(file: &File, mode: u32) -> std::io::Result<()> {
    set_mode_fd(file.as_fd(), mode)
}

pub fn file_set_mtime(file: &File, mtime_ns: i64) -> std::io::Result<()> {
    set_mtime_fd(file.as_fd(), mtime_ns)
}

/// `p` with `.` and `..` resolved by name, as a shell's `cd` does (no
/// symlink is followed, nothing is looked up).
pub fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `p` (absolute and lexical) as the filesystem means it: its longest
/// part that exists with symbolic links followed, the rest as written.
/// A path named through a link to the workspace is then the workspace's.
pub fn resolve_existing(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut existing = p;
    loop {
        if let Ok(mut real) = std::fs::canonicalize(existing) {
            real.extend(rest.iter().rev());
            return real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// A manifest path must be relative, free of `..`, `.` and NUL: anything else
/// could name a place outside the workspace.
pub fn check_relative(rel: &Path) -> std::io::Result<()> {
    let bytes = rel.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path contains a NUL byte",
        ));
    }
    for comp in rel.components() {
        match comp {
            Component::Normal(_) => {}
            Component::CurDir if bytes.is_empty() => {}
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "path must be relative to the workspace, without '..' or '.'",
                ));
            }
        }
    }
    Ok(())
}

/// Stats entries below a root by name in their directory, opened beneath
/// the root with no symlink followed and no mount crossed: a whole path
/// past PATH_MAX cannot be stat'ed at all, and one through a directory
/// swapped for a symlink leads out of the tree. The last directory stays
/// open, so paths that come grouped by directory open each once, and
/// nothing else is held (thousands of paths need no descriptor each).
pub struct StatBeneath<'r> {
    root: &'r Dir,
    /// The last directory asked for, and what opening it gave.
    last: Option<(Vec<u8>, Option<Dir>)>,
}

impl<'r> StatBeneath<'r> {
    pub fn new(root: &'r Dir) -> StatBeneath<'r> {
        StatBeneath { root, last: None }
    }

    /// The stat of `path` (relative, `/`-separated; empty: the root), no
    /// symlink followed; `None` when it cannot be had.
    pub fn stat(&mut self, path: &[u8]) -> Option<Meta> {
        if path.is_empty() {
            return self.root.meta().ok();
        }
        let (dir, name) = match path.iter().rposition(|&c| c == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&path[..0], path),
        };
        if self.last.as_ref().is_none_or(|(p, _)| p.as_slice() != dir) {
            let opened = self
                .root
                .open_beneath(Path::new(OsStr::from_bytes(dir)))
                .ok();
            self.last = Some((dir.to_vec(), opened));
        }
        let (_, opened) = self.last.as_ref()?;
        opened.as_ref()?.stat_at(OsStr::from_bytes(name)).ok()
    }
}

/// Give `file` (at `path`) `len` bytes of real blocks from offset 0
/// (`fallocate`): a reserve whose removal frees that much on any
/// filesystem, copy-on-write ones included.
pub fn allocate(file: &std::fs::File, path: &Path, len: u64) -> Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len)
        .map_err(|e| Error::new("allocate", path, e))
}

/// Create `path` empty, with `mode` and (as root) owner `uid`/`gid`, flagged on
/// btrfs to be overwritten in place (`FS_NOCOW_FL`); nothing if it exists.
/// For a file written through a shared mapping (SQLite's `-shm`): on a
/// full copy-on-write filesystem a store into a mapped page has nowhere to
/// go, and the kernel answers with SIGBUS, which kills the process without
/// a word. In place, the page's blocks are already allocated. Answers
/// whether it made the file. Elsewhere the flag does not exist and the
/// file stays plain, as its writer would have made it.
pub fn create_in_place_file(path: &Path, mode: u32, uid: u32, gid: u32) -> Result<bool> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(path, flags, Mode::from_raw_mode(mode as _)) {
        Ok(fd) => fd,
        Err(Errno::EXIST) => return Ok(false),
        Err(e) => return Err(Error::new("create", path, e)),
    };
    if rustix::process::geteuid().is_root() {
        let _ = rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
    }
    let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode as _));
    #[allow(clippy::unnecessary_cast)] // f_type's width varies by architecture
    let btrfs = rustix::fs::fstatfs(&fd)
        .is_ok_and(|st| crate::FsKind::from_magic(st.f_type as i64) == crate::FsKind::Btrfs);
    if btrfs && let Ok(f) = rustix::fs::ioctl_getflags(&fd) {
        let _ = rustix::fs::ioctl_setflags(&fd, f | rustix::fs::IFlags::NOCOW);
    }
    Ok(true)
}
