//! Telling the mount's watchers what a rewind changed (D339).
//!
//! A rewind changes the backing tree, not the mount, and the kernel raises
//! inotify and fanotify events only for changes made through the VFS: a
//! dev server's reloader or an editor watching the mount saw nothing and
//! kept serving what the rewind had replaced (D333). After each thaw a
//! thread of the daemon sets the modification time of every changed path,
//! and of its directory, through the mount. The kernel raises `IN_MODIFY`
//! for each such `setattr` once the daemon answers it; the daemon knows
//! the requests by their thread and answers them with the inode's
//! attributes as they are, changing nothing and marking nothing dirty, so
//! no checkpoint reads those files again (D275).
//!
//! A deleted path has nothing left to touch: its directory's event is
//! what tells a watcher to look again. Past [`MAX_PATHS`] paths, only
//! directories are announced, then only the root. Nothing is touched
//! outside the mount: directories are opened beneath its root with no
//! symlink followed and no mount crossed, a name another filesystem is
//! mounted on is left, and an unmount first pauses the thread.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};

use rustix::fs::{
    AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT,
};

use crate::fs::split;

/// Paths (or directories) announced one by one after a rewind; past this,
/// fewer and coarser announcements. A touch costs ~30 µs (2,000 in 60 ms
/// here), and a watcher told only of directories misses what changed in
/// the files: chokidar and vite heard nothing of 1,500 rewritten files
/// with the limit at 1,000 (helper-87).
const MAX_PATHS: usize = 100_000;

/// What a thaw hands the announcing thread: the changed paths, or `None`
/// for "anywhere".
type Changed = Option<Vec<Vec<u8>>>;

pub struct Announcer {
    tx: Mutex<mpsc::Sender<Changed>>,
    /// The announcing thread's id (0 until it runs): its `setattr`
    /// requests are announcements, not changes.
    tid: Arc<AtomicU32>,
    /// Held by the thread while it holds the mount's root open; taken by
    /// [`Announcer::pause`].
    busy: Arc<Mutex<()>>,
    /// Set while paused: the thread closes the root and waits.
    paused: Arc<AtomicBool>,
}

/// The announcer stopped, holding nothing open in the mount, until
/// dropped; then it goes on where it stopped, if the mount still serves.
pub struct Paused<'a> {
    _busy: MutexGuard<'a, ()>,
    paused: &'a AtomicBool,
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.paused.store(false, Ordering::Release);
    }
}

impl Announcer {
    /// Start the thread that announces through the mount at `mountpoint`.
    /// It first learns the mount's device (its `stat` waits until the
    /// session serves): the root it opens for each rewind must be on it,
    /// not another filesystem mounted over the mountpoint since (another
    /// daemon's, which would change its files for real, helper-88).
    pub fn start(mountpoint: PathBuf) -> std::io::Result<Announcer> {
        let (tx, rx) = mpsc::channel::<Changed>();
        let tid = Arc::new(AtomicU32::new(0));
        let busy = Arc::new(Mutex::new(()));
        let paused = Arc::new(AtomicBool::new(false));
        let (mine, busy_t, paused_t) = (Arc::clone(&tid), Arc::clone(&busy), Arc::clone(&paused));
        std::thread::Builder::new()
            .name("rewind-announce".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let me = unsafe { libc::gettid() };
                mine.store(me as u32, Ordering::Release);
                let Ok(own) = rustix::fs::stat(&mountpoint) else {
                    return;
                };
                while let Ok(changed) = rx.recv() {
                    let targets = targets(changed.as_deref());
                    let mut next = 0;
                    while next < targets.len() {
                        // An unmount holds `busy` while it runs.
                        while paused_t.load(Ordering::Acquire) {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                        }
                        let _busy = busy_t.lock().unwrap_or_else(|p| p.into_inner());
                        // Opened for each run and closed after: an fd held
                        // into the mount keeps `unmount` from it (busy).
                        // Gone (unmounted): the rest is dropped.
                        let Some(root) = open_mount_root(&mountpoint, own.st_dev) else {
                            break;
                        };
                        while next < targets.len() && !paused_t.load(Ordering::Acquire) {
                            touch(&root, &targets[next]);
                            next += 1;
                        }
                    }
                }
            })?;
        Ok(Announcer {
            tx: Mutex::new(tx),
            tid,
            busy,
            paused,
        })
    }

    /// Announce the paths a rewind changed (`None`: anywhere). Never
    /// blocks the thaw: the thread works after it.
    pub fn send(&self, changed: Option<&[Vec<u8>]>) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(changed.map(<[Vec<u8>]>::to_vec));
    }

    /// Stop announcing and close the mount's root, until the guard is
    /// dropped: an unmount right after a big rewind found the mount busy
    /// with the daemon's own descriptor (helper-87: 20 of 20 after 990
    /// files). What is left to announce waits: an unmount refused as busy
    /// (a dev server working inside) leaves the mount serving, and its
    /// watchers must still hear of the rewind (helper-88: vite heard 30 of
    /// 999 changes and served the old page).
    pub fn pause(&self) -> Paused<'_> {
        self.paused.store(true, Ordering::Release);
        Paused {
            _busy: self.busy.lock().unwrap_or_else(|p| p.into_inner()),
            paused: &self.paused,
        }
    }

    /// Whether a request from `pid` (the kernel gives the thread's id) is
    /// an announcement.
    pub fn is_announcing(&self, pid: u32) -> bool {
        pid != 0 && self.tid.load(Ordering::Acquire) == pid
    }
}

/// The mount's root, if `mountpoint` still leads to it (device `own`).
fn open_mount_root(mountpoint: &Path, own: u64) -> Option<OwnedFd> {
    let root = rustix::fs::open(
        mountpoint,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&root).ok()?;
    (st.st_dev == own).then_some(root)
}

/// What to touch for `changed`: each path, then each directory holding
/// one; past [`MAX_PATHS`] paths, the directories alone; past as many
/// directories, the root.
fn targets(changed: Option<&[Vec<u8>]>) -> Vec<Vec<u8>> {
    let Some(changed) = changed else {
        return vec![Vec::new()];
    };
    let dirs: BTreeSet<&[u8]> = changed.iter().map(|p| split(p).0).collect();
    let mut out: Vec<Vec<u8>> = Vec::new();
    if changed.len() <= MAX_PATHS {
        out.extend(changed.iter().cloned());
    }
    if dirs.len() <= MAX_PATHS {
        out.extend(dirs.into_iter().map(<[u8]>::to_vec));
    } else {
        out.push(Vec::new());
    }
    out
}

/// Set `path`'s modification time through the mount: the kernel raises
/// `IN_MODIFY` once the daemon answers. A path the rewind deleted, or one
/// this user may not touch, raises nothing, and is left. Its directory is
/// reached beneath the root with no symlink followed: a directory swapped
/// for a link since the rewind would otherwise have the daemon (root, as a
/// rule) set the time of a file outside the mount.
fn touch(root: &OwnedFd, path: &[u8]) {
    let (dir, name) = split(path);
    let opened;
    let dir_fd = if dir.is_empty() {
        root
    } else {
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV;
        match rustix::fs::openat2(
            root,
            std::ffi::OsStr::from_bytes(dir),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        ) {
            Ok(fd) => {
                opened = fd;
                &opened
            }
            Err(_) => return,
        }
    };
    let name = if name.is_empty() {
        std::ffi::OsStr::new(".")
    } else {
        std::ffi::OsStr::from_bytes(name)
    };
    // A filesystem mounted on the name itself is not the mount's to touch.
    let same_fs = match (
        rustix::fs::fstat(dir_fd),
        rustix::fs::statat(dir_fd, name, AtFlags::SYMLINK_NOFOLLOW),
    ) {
        (Ok(d), Ok(n)) => d.st_dev == n.st_dev,
        _ => false,
    };
    if !same_fs {
        return;
    }
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
    };
    let _ = rustix::fs::utimensat(dir_fd, name, &times, AtFlags::SYMLINK_NOFOLLOW);
}

#[cfg(test)]
mod tests {
    use super::{MAX_PATHS, targets, touch};

    /// A directory swapped for a symlink after the rewind: the file the
    /// link leads to, outside the tree, keeps its time; a file reached
    /// through real directories gets a new one.
    #[test]
    fn an_announcement_never_follows_a_symlink_out_of_the_tree() {
        use std::time::{Duration, UNIX_EPOCH};
        let t = tempfile::tempdir().expect("tempdir");
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        for d in [root.join("real"), outside.clone()] {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        std::os::unix::fs::symlink(&outside, root.join("link")).expect("symlink");
        let old = UNIX_EPOCH + Duration::from_secs(1 << 30);
        let mtime = |p: &std::path::Path| {
            std::fs::symlink_metadata(p)
                .and_then(|m| m.modified())
                .expect("mtime")
        };
        for f in [outside.join("x"), root.join("real/x")] {
            let file = std::fs::File::create(&f).expect("create");
            file.set_modified(old).expect("set mtime");
        }
        let fd = rustix::fs::open(
            &root,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("open root");
        touch(&fd, b"link/x");
        touch(&fd, b"real/x");
        assert_eq!(mtime(&outside.join("x")), old, "followed the link");
        assert_ne!(
            mtime(&root.join("real/x")),
            old,
            "the control was not touched"
        );
    }

    #[test]
    fn a_rewind_announces_each_path_and_each_directory_then_only_directories_then_the_root() {
        let few: Vec<Vec<u8>> = vec![b"a/b/c".to_vec(), b"a/d".to_vec(), b"top".to_vec()];
        assert_eq!(
            targets(Some(&few)),
            vec![
                b"a/b/c".to_vec(),
                b"a/d".to_vec(),
                b"top".to_vec(),
                b"".to_vec(),
                b"a".to_vec(),
                b"a/b".to_vec()
            ]
        );
        let many: Vec<Vec<u8>> = (0..=MAX_PATHS)
            .map(|i| format!("d{}/f{i}", i % 3).into_bytes())
            .collect();
        assert_eq!(
            targets(Some(&many)),
            vec![b"d0".to_vec(), b"d1".to_vec(), b"d2".to_vec()]
        );
        let spread: Vec<Vec<u8>> = (0..=MAX_PATHS)
            .map(|i| format!("d{i}/f").into_bytes())
            .collect();
        assert_eq!(targets(Some(&spread)), vec![b"".to_vec()]);
        assert_eq!(targets(None), vec![b"".to_vec()]);
    }
}
