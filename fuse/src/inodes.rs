//! The inode table: FUSE inode numbers for backing inodes, keyed by
//! (dev, ino) so that hard links share one FUSE inode, each holding an
//! `O_PATH` fd. The fd pins the backing inode, so its number cannot be
//! reused by a new file while the kernel still knows the old one.
//!
//! The table also remembers under which (parent, name) the kernel learned
//! each inode. That serves two purposes: the paths to mark dirty when an
//! inode changes, and the dentries to invalidate after a rewind. It is a
//! superset of what the kernel caches: a name leaves it only when the
//! kernel is told (unlink, rename) or forgets the inode.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use fuser::{BackingId, FileType};

pub const ROOT: u64 = 1;

pub struct Inode {
    /// `O_PATH | O_NOFOLLOW`: never opened for I/O, only as an anchor.
    pub fd: OwnedFd,
    pub kind: FileType,
    lookups: AtomicU64,
    /// The passthrough backing file shared by every open of this inode
    /// (the kernel wants one per inode).
    pub backing: Mutex<Backing>,
}

/// An inode's passthrough backing file. Kept open while the kernel knows
/// the inode (up to a budget of open files), so that opening a file again
/// costs no new backing file: `grep -r` opens every file once per run.
#[derive(Default)]
pub struct Backing {
    pub shared: Weak<Passthrough>,
    pub kept: Option<Arc<Passthrough>>,
}

/// A backing file registered with the kernel for passthrough, and the
/// file itself (the daemon's fsync, fallocate and lseek use it).
pub struct Passthrough {
    pub id: BackingId,
    pub file: std::fs::File,
}

/// Backing files kept open by inodes, against [`KEEP_BUDGET`].
pub static KEPT: AtomicU64 = AtomicU64::new(0);

/// How many backing files inodes may keep open (each is one fd).
pub static KEEP_BUDGET: AtomicU64 = AtomicU64::new(4096);

impl Drop for Inode {
    fn drop(&mut self) {
        let kept = self
            .backing
            .get_mut()
            .map(|b| b.kept.is_some())
            .unwrap_or(false);
        if kept {
            KEPT.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// FUSE inode numbers for inodes of other filesystems (mounts nested in
/// the workspace): allocated from here, above any real inode number.
const FOREIGN: u64 = 1 << 62;

#[derive(Default)]
struct Table {
    by_ino: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<(u64, u64), u64>,
    key_of: HashMap<u64, (u64, u64)>,
    /// (parent, name) -> child, as the kernel learned it.
    children: HashMap<(u64, OsString), u64>,
    /// child -> its (parent, name) links.
    links: HashMap<u64, Vec<(u64, OsString)>>,
    root_dev: u64,
    next_foreign: u64,
}

pub struct Inodes {
    table: RwLock<Table>,
}

impl Inodes {
    pub fn new(root: OwnedFd, key: (u64, u64)) -> Inodes {
        let mut t = Table {
            root_dev: key.0,
            next_foreign: FOREIGN,
            ..Table::default()
        };
        t.by_ino.insert(
            ROOT,
            Arc::new(Inode {
                fd: root,
                kind: FileType::Directory,
                lookups: AtomicU64::new(1),
                backing: Mutex::new(Backing::default()),
            }),
        );
        t.by_key.insert(key, ROOT);
        t.key_of.insert(ROOT, key);
        Inodes {
            table: RwLock::new(t),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.read().by_ino.get(&ino).cloned()
    }

    /// Record that the kernel looked up `name` in `parent` and got the
    /// backing inode `key` (one more lookup reference). `fd` is dropped if
    /// the inode is already known.
    pub fn learn(
        &self,
        parent: u64,
        name: &OsStr,
        fd: OwnedFd,
        key: (u64, u64),
        kind: FileType,
    ) -> u64 {
        let mut t = self.write();
        let ino = match t.by_key.get(&key).copied() {
            Some(ino) => {
                if let Some(i) = t.by_ino.get(&ino) {
                    i.lookups.fetch_add(1, Ordering::Relaxed);
                }
                ino
            }
            None => {
                // The backing inode number itself where it can be: what
                // programs see stays stable across forgets and remounts
                // (git's index records it).
                let ino = if key.0 == t.root_dev && key.1 > ROOT && key.1 < FOREIGN {
                    key.1
                } else {
                    t.next_foreign += 1;
                    t.next_foreign
                };
                t.by_ino.insert(
                    ino,
                    Arc::new(Inode {
                        fd,
                        kind,
                        lookups: AtomicU64::new(1),
                        backing: Mutex::new(Backing::default()),
                    }),
                );
                t.by_key.insert(key, ino);
                t.key_of.insert(ino, key);
                ino
            }
        };
        let name = name.to_os_string();
        if let Some(old) = t.children.insert((parent, name.clone()), ino)
            && old != ino
        {
            Self::drop_link(&mut t, old, parent, &name);
        }
        let links = t.links.entry(ino).or_default();
        if !links.iter().any(|(p, n)| *p == parent && *n == name) {
            links.push((parent, name));
        }
        ino
    }

    fn drop_link(t: &mut Table, child: u64, parent: u64, name: &OsStr) {
        if let Some(links) = t.links.get_mut(&child) {
            links.retain(|(p, n)| !(*p == parent && n == name));
        }
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let mut t = self.write();
        let gone = match t.by_ino.get(&ino) {
            Some(i) => {
                i.lookups
                    .fetch_sub(n.min(i.lookups.load(Ordering::Relaxed)), Ordering::Relaxed)
                    <= n
            }
            None => false,
        };
        if gone {
            t.by_ino.remove(&ino);
            if let Some(key) = t.key_of.remove(&ino) {
                t.by_key.remove(&key);
            }
            for (p, name) in t.links.remove(&ino).unwrap_or_default() {
                if t.children.get(&(p, name.clone())) == Some(&ino) {
                    t.children.remove(&(p, name));
                }
            }
        }
    }

    /// `name` in `parent` no longer exists.
    pub fn unlinked(&self, parent: u64, name: &OsStr) {
        let mut t = self.write();
        if let Some(child) = t.children.remove(&(parent, name.to_os_string())) {
            Self::drop_link(&mut t, child, parent, name);
        }
    }

    /// A rename (or, with `exchange`, a swap) happened.
    pub fn renamed(&self, p1: u64, n1: &OsStr, p2: u64, n2: &OsStr, exchange: bool) {
        let mut t = self.write();
        let a = t.children.remove(&(p1, n1.to_os_string()));
        let b = t.children.remove(&(p2, n2.to_os_string()));
        if let Some(a) = a {
            Self::drop_link(&mut t, a, p1, n1);
        }
        if let Some(b) = b {
            Self::drop_link(&mut t, b, p2, n2);
        }
        let place = |t: &mut Table, child: u64, p: u64, n: &OsStr| {
            t.children.insert((p, n.to_os_string()), child);
            t.links
                .entry(child)
                .or_default()
                .push((p, n.to_os_string()));
        };
        if let Some(a) = a {
            place(&mut t, a, p2, n2);
        }
        if exchange && let Some(b) = b {
            place(&mut t, b, p1, n1);
        }
    }

    /// The (parent, name) links the kernel knows for `ino`.
    pub fn links(&self, ino: u64) -> Vec<(u64, OsString)> {
        self.read().links.get(&ino).cloned().unwrap_or_default()
    }

    /// The workspace-relative path of a directory (or any inode, through
    /// its first known link); `None` if the chain to the root is unknown.
    pub fn path(&self, ino: u64) -> Option<Vec<u8>> {
        let t = self.read();
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let (p, n) = t.links.get(&cur)?.first()?;
            parts.push(n);
            cur = *p;
            if parts.len() > 4096 {
                return None;
            }
        }
        let mut out = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(p.as_bytes());
        }
        Some(out)
    }

    /// The FUSE inode of a workspace-relative path, if the kernel knows it.
    pub fn resolve(&self, path: &[u8]) -> Option<u64> {
        let t = self.read();
        let mut cur = ROOT;
        for part in path.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
            cur = *t
                .children
                .get(&(cur, OsStr::from_bytes(part).to_os_string()))?;
        }
        Some(cur)
    }

    /// Every (parent, name) the kernel may have cached, and every inode.
    pub fn everything(&self) -> (Vec<(u64, OsString)>, Vec<u64>) {
        let t = self.read();
        (
            t.children.keys().cloned().collect(),
            t.by_ino.keys().copied().collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.read().by_ino.len()
    }
}
