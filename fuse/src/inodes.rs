//! The inode table: FUSE inode numbers for backing inodes, keyed by
//! (dev, ino) so that hard links share one FUSE inode, each reached through
//! an `O_PATH` fd.
//!
//! The kernel remembers every inode a tool has looked up (a `find` over
//! 100,000 files: 100,000 inodes), far more than a process may hold fds
//! (20,000 here, 1,024 by default for a user). So inodes keep their fd
//! only up to a cap (5/8 of the fd limit), oldest given back first, and an
//! evicted inode is reopened through a (parent, name) link the table
//! knows (its parent first, if need be), checked against its (dev, ino)
//! and birth time. The birth time also tells a reused inode number from
//! the inode it once was: without a held fd, a deleted file's number is
//! free again. The root always keeps its fd.
//!
//! The table also remembers under which (parent, name) the kernel learned
//! each inode. That serves two purposes: the paths to mark dirty when an
//! inode changes, and the dentries to invalidate after a rewind. It is a
//! superset of what the kernel caches: a name leaves it only when the
//! kernel is told (unlink, rename) or forgets the inode.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use fuser::{BackingId, FileType};
use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};

pub const ROOT: u64 = 1;

pub struct Inode {
    /// `O_PATH | O_NOFOLLOW`: never opened for I/O, only as an anchor.
    /// `None` while evicted: [`Inodes::fd`] reopens it.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    pub kind: FileType,
    /// Birth time (seconds, nanoseconds): tells this inode from a later
    /// one that got its number. `None` where the filesystem has none, and
    /// then the fd is never evicted.
    born: Option<(i64, u32)>,
    lookups: AtomicU64,
    /// The daemon's rewind generation when the kernel last learned this
    /// inode by a name (see [`Inode::learned_in`]).
    learned_in: AtomicU64,
    /// The passthrough backing file shared by every open of this inode
    /// (the kernel wants one per inode).
    pub backing: Mutex<Backing>,
}

impl Inode {
    /// The rewind generation (`Shared::generation`) when the kernel last
    /// learned this inode by a name. An open of an inode learned before a
    /// rewind that unlinked it comes from a name the rewind took away.
    pub fn learned_in(&self) -> u64 {
        self.learned_in.load(Ordering::Relaxed)
    }
}

/// An inode's passthrough backing file, and the I/O modes of its open
/// handles. The backing file is kept open while the kernel knows the inode
/// (up to a budget of open files), so that opening a file again costs no
/// new backing file.
#[derive(Default)]
pub struct Backing {
    pub shared: Weak<Passthrough>,
    pub kept: Option<Kept>,
    pub modes: OpenModes,
}

/// How the kernel does an open handle's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// Straight to the backing file (kernel passthrough), never the daemon.
    Passthrough,
    /// Through the kernel's page cache, filled by the daemon's reads.
    Cached,
    /// Every read and write to the daemon (`FOPEN_DIRECT_IO`): an open
    /// that needed passthrough and could not get it.
    Direct,
}

/// The open handles of one inode per I/O mode, as the daemon counts them:
/// from its answer to the open until the handle's release. The kernel
/// keeps an inode in one mode at a time (an open that would mix
/// passthrough and the page cache fails with EIO) and lets go of a handle
/// before it sends the release, so these counts are never below its own:
/// a mode chosen from them is one the kernel accepts.
#[derive(Default, Debug)]
pub struct OpenModes {
    passthrough: u32,
    cached: u32,
    direct: u32,
}

impl OpenModes {
    /// The mode the handles already open impose on a new one, if any.
    pub fn imposed(&self) -> Option<IoMode> {
        if self.cached > 0 {
            Some(IoMode::Cached)
        } else if self.passthrough > 0 {
            Some(IoMode::Passthrough)
        } else if self.direct > 0 {
            Some(IoMode::Direct)
        } else {
            None
        }
    }

    fn count(&mut self, mode: IoMode) -> &mut u32 {
        match mode {
            IoMode::Passthrough => &mut self.passthrough,
            IoMode::Cached => &mut self.cached,
            IoMode::Direct => &mut self.direct,
        }
    }

    pub fn opened(&mut self, mode: IoMode) {
        *self.count(mode) += 1;
    }

    pub fn released(&mut self, mode: IoMode) {
        let n = self.count(mode);
        *n = n.saturating_sub(1);
    }
}

/// How many backing files the inodes of one table keep open for later
/// opens (each is one fd), against how many they may.
#[derive(Debug)]
struct KeepBudget {
    kept: AtomicU64,
    budget: AtomicU64,
}

/// A backing file an inode keeps open, counted against its table's
/// budget until it is dropped (given back, or its inode forgotten).
pub struct Kept {
    _file: Arc<Passthrough>,
    budget: Arc<KeepBudget>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.budget.kept.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A backing file registered with the kernel for passthrough, and the
/// file itself (the daemon's fsync, fallocate and lseek use it).
pub struct Passthrough {
    pub id: BackingId,
    pub file: std::fs::File,
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

/// A map of the table holding at least this many slots is shrunk once
/// three quarters of them are free (D349).
const SHRINK_FROM: usize = 4096;

impl Table {
    /// Give back the slots of forgotten inodes once they are most of the
    /// table's. A hash map never shrinks by itself: after a `find` over a
    /// million files, which the kernel then forgot, the daemon held their
    /// ~500 bytes each for as long as it ran (D349). Halving at a quarter
    /// full keeps each shrink's rehash paid for by the forgets before it.
    fn shrink_if_sparse(&mut self) -> bool {
        fn shrink<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) -> bool {
            let sparse = m.capacity() >= SHRINK_FROM && m.len() <= m.capacity() / 4;
            if sparse {
                m.shrink_to(m.len() * 2);
            }
            sparse
        }
        // One map per forget, which spreads the rehashes (32 ms under the
        // lock for all five at 50,000 entries left, D349); each map is
        // judged apart, as `children` holds a row per name (hard links).
        shrink(&mut self.by_ino)
            || shrink(&mut self.by_key)
            || shrink(&mut self.key_of)
            || shrink(&mut self.children)
            || shrink(&mut self.links)
    }
}

pub struct Inodes {
    table: RwLock<Table>,
    /// Inodes holding their fd, oldest first (an inode may appear twice
    /// after an eviction and a reopen, or after it was forgotten: popping
    /// skips what no longer holds one).
    holding: Mutex<VecDeque<u64>>,
    /// How many may hold their fd at once (the root always does): set by
    /// the daemon from its fd limit.
    fd_cap: AtomicU64,
    /// Backing files kept for later opens: set by the daemon from its fd
    /// limit too.
    keep: Arc<KeepBudget>,
}

/// The identity a stat gives: device, inode number, birth time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub born: Option<(i64, u32)>,
}

impl Identity {
    pub fn key(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inodes {
    pub fn new(root: OwnedFd, id: Identity) -> Inodes {
        let key = id.key();
        let mut t = Table {
            root_dev: key.0,
            next_foreign: FOREIGN,
            ..Table::default()
        };
        t.by_ino.insert(
            ROOT,
            Arc::new(Inode {
                fd: Mutex::new(Some(Arc::new(root))),
                kind: FileType::Directory,
                born: id.born,
                lookups: AtomicU64::new(1),
                learned_in: AtomicU64::new(0),
                backing: Mutex::new(Backing::default()),
            }),
        );
        t.by_key.insert(key, ROOT);
        t.key_of.insert(ROOT, key);
        Inodes {
            table: RwLock::new(t),
            holding: Mutex::new(VecDeque::new()),
            fd_cap: AtomicU64::new(4096),
            keep: Arc::new(KeepBudget {
                kept: AtomicU64::new(0),
                budget: AtomicU64::new(4096),
            }),
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
    /// backing inode `id` (one more lookup reference). `fd` is dropped if
    /// the inode is already known (and then lends it its fd if evicted).
    pub fn learn(
        &self,
        parent: u64,
        name: &OsStr,
        fd: OwnedFd,
        id: Identity,
        kind: FileType,
        generation: u64,
    ) -> u64 {
        let key = id.key();
        let mut t = self.write();
        let known = t
            .by_key
            .get(&key)
            .copied()
            .filter(|ino| t.by_ino.get(ino).is_some_and(|i| i.born == id.born));
        let mut holds = false;
        let ino = match known {
            Some(ino) => {
                if let Some(i) = t.by_ino.get(&ino) {
                    i.lookups.fetch_add(1, Ordering::Relaxed);
                    i.learned_in.store(generation, Ordering::Relaxed);
                    let mut slot = lock(&i.fd);
                    if slot.is_none() {
                        *slot = Some(Arc::new(fd));
                        holds = true;
                    }
                }
                ino
            }
            None => {
                // The backing inode number itself where it can be: what
                // programs see stays stable across forgets and remounts
                // (git's index records it). Not when an older inode with
                // that number is still known (deleted, its number reused).
                let ino = if key.0 == t.root_dev
                    && key.1 > ROOT
                    && key.1 < FOREIGN
                    && !t.by_ino.contains_key(&key.1)
                {
                    key.1
                } else {
                    t.next_foreign += 1;
                    t.next_foreign
                };
                t.by_ino.insert(
                    ino,
                    Arc::new(Inode {
                        fd: Mutex::new(Some(Arc::new(fd))),
                        kind,
                        born: id.born,
                        lookups: AtomicU64::new(1),
                        learned_in: AtomicU64::new(generation),
                        backing: Mutex::new(Backing::default()),
                    }),
                );
                t.by_key.insert(key, ino);
                t.key_of.insert(ino, key);
                holds = true;
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
        drop(t);
        if holds && id.born.is_some() {
            self.holding(ino);
        }
        ino
    }

    /// The inode's `O_PATH` fd, reopened through one of its links if it
    /// was evicted. `ESTALE`: no link leads to it any more.
    pub fn fd(&self, ino: u64, i: &Inode) -> rustix::io::Result<Arc<OwnedFd>> {
        if let Some(fd) = lock(&i.fd).clone() {
            return Ok(fd);
        }
        let (links, key) = {
            let t = self.read();
            (
                t.links.get(&ino).cloned().unwrap_or_default(),
                t.key_of.get(&ino).copied(),
            )
        };
        let key = key.ok_or(rustix::io::Errno::STALE)?;
        for (parent, name) in links {
            let Some(p) = self.get(parent) else {
                continue;
            };
            // Out of fds is not "no such link": the caller sheds and retries.
            let pfd = match self.fd(parent, &p) {
                Ok(fd) => fd,
                Err(e) if out_of_fds(e) => return Err(e),
                Err(_) => continue,
            };
            let fd = match rustix::fs::openat(
                &pfd,
                &name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(e) if out_of_fds(e) => return Err(e),
                Err(_) => continue,
            };
            match identity(&fd) {
                Ok(id) if id.key() == key && id.born == i.born => {}
                _ => continue,
            }
            let fd = Arc::new(fd);
            {
                let mut slot = lock(&i.fd);
                if let Some(held) = slot.clone() {
                    return Ok(held);
                }
                *slot = Some(Arc::clone(&fd));
            }
            self.holding(ino);
            return Ok(fd);
        }
        Err(rustix::io::Errno::STALE)
    }

    /// Make the inode the kernel knows as `name` in `parent` hold its fd
    /// (reopened while the name still leads to it): it is about to lose
    /// that name, and an inode without one is never evicted.
    pub fn hold(&self, parent: u64, name: &OsStr) {
        let child = self
            .read()
            .children
            .get(&(parent, name.to_os_string()))
            .copied();
        if let Some(ino) = child
            && let Some(i) = self.get(ino)
        {
            let _ = self.fd(ino, &i);
        }
    }

    /// Inode `ino` holds its fd now; past the cap, the oldest holders give
    /// theirs back.
    fn holding(&self, ino: u64) {
        let mut q = lock(&self.holding);
        q.push_back(ino);
        let cap = self.fd_cap.load(Ordering::Relaxed).max(1) as usize;
        let excess = q.len().saturating_sub(cap);
        self.evict(&mut q, excess);
    }

    /// Make up to `n` of the oldest holders give their fd back. Not one
    /// without a link (it could not be reopened: it goes to the back, the
    /// kernel forgets it soon); an fd in use stays open until its user is
    /// done. Returns how many gave theirs back.
    fn evict(&self, q: &mut VecDeque<u64>, n: usize) -> usize {
        let mut evicted = 0;
        let mut unlinked = Vec::new();
        let t = self.read();
        for _ in 0..n {
            let Some(old) = q.pop_front() else {
                break;
            };
            let Some(i) = t.by_ino.get(&old) else {
                continue;
            };
            if t.links.get(&old).is_none_or(|l| l.is_empty()) {
                unlinked.push(old);
                continue;
            }
            if lock(&i.fd).take().is_some() {
                evicted += 1;
            }
        }
        q.extend(unlinked);
        evicted
    }

    /// Out of fds: half the inodes holding one give it back.
    pub fn shed(&self) -> usize {
        let mut q = lock(&self.holding);
        let half = q.len().div_ceil(2);
        self.evict(&mut q, half)
    }

    fn drop_link(t: &mut Table, child: u64, parent: u64, name: &OsStr) {
        if let Some(links) = t.links.get_mut(&child) {
            links.retain(|(p, n)| !(*p == parent && n == name));
        }
    }

    /// The kernel dropped `n` references to `ino`.
    ///
    /// The forgotten inode is dropped after the table's lock is released:
    /// dropping it closes its anchor and passthrough backing files, and a
    /// close can take a third of a millisecond (the filesystem flushes a
    /// file just written). A rewind's invalidation makes the kernel
    /// forget every file it replaced, one after another, and each lookup
    /// and each next invalidation waited for those closes (3 ms of a
    /// 20 ms rewind through the mount, for 13 paths).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let (forgotten, shrank) = {
            let mut t = self.write();
            let gone = match t.by_ino.get(&ino) {
                Some(i) => {
                    i.lookups
                        .fetch_sub(n.min(i.lookups.load(Ordering::Relaxed)), Ordering::Relaxed)
                        <= n
                }
                None => false,
            };
            if !gone {
                return;
            }
            if let Some(key) = t.key_of.remove(&ino)
                && t.by_key.get(&key) == Some(&ino)
            {
                t.by_key.remove(&key);
            }
            for (p, name) in t.links.remove(&ino).unwrap_or_default() {
                if t.children.get(&(p, name.clone())) == Some(&ino) {
                    t.children.remove(&(p, name));
                }
            }
            (t.by_ino.remove(&ino), t.shrink_if_sparse())
        };
        drop(forgotten);
        if shrank {
            rewind_platform::give_back_free_heap();
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

    pub fn set_fd_cap(&self, cap: u64) {
        self.fd_cap.store(cap, Ordering::Relaxed);
    }

    pub fn set_keep_budget(&self, budget: u64) {
        self.keep.budget.store(budget, Ordering::Relaxed);
    }

    /// Keep `file` open for the inode's later opens, if the budget allows.
    pub fn try_keep(&self, file: &Arc<Passthrough>) -> Option<Kept> {
        let b = &self.keep;
        b.kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < b.budget.load(Ordering::Relaxed)).then_some(n + 1)
            })
            .ok()?;
        Some(Kept {
            _file: Arc::clone(file),
            budget: Arc::clone(b),
        })
    }

    pub fn len(&self) -> usize {
        self.read().by_ino.len()
    }

    /// Give back every backing file kept for later opens (open handles
    /// keep theirs), and halve the budget so that the next ones do not run
    /// the process out of fds again at once. Returns how many were kept.
    /// An inode whose backing slot is busy is skipped: its owner may be
    /// the caller (an open that ran out of fds).
    pub fn release_kept(&self) -> u64 {
        let mut released = 0;
        for i in self.read().by_ino.values() {
            let Ok(mut b) = i.backing.try_lock() else {
                continue;
            };
            if b.kept.take().is_some() {
                released += 1;
            }
        }
        let budget = &self.keep.budget;
        budget.store(budget.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
        released
    }
}

/// EMFILE or ENFILE: the process or the system has no fd to give.
pub fn out_of_fds(e: rustix::io::Errno) -> bool {
    e == rustix::io::Errno::MFILE || e == rustix::io::Errno::NFILE
}

/// Device, inode number and birth time of what `fd` refers to.
pub fn identity(fd: &OwnedFd) -> rustix::io::Result<Identity> {
    let x = statx_fd(fd)?;
    Ok(identity_of(&x))
}

pub fn statx_fd(fd: impl AsFd) -> rustix::io::Result<rustix::fs::Statx> {
    rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )
}

pub fn identity_of(x: &rustix::fs::Statx) -> Identity {
    Identity {
        dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
        ino: x.stx_ino,
        born: (x.stx_mask & StatxFlags::BTIME.bits() != 0)
            .then_some((x.stx_btime.tv_sec, x.stx_btime.tv_nsec)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_mode_is_imposed_until_its_last_handle_is_released() {
        let mut m = OpenModes::default();
        assert_eq!(m.imposed(), None, "nothing open: the open chooses");
        for mode in [IoMode::Cached, IoMode::Passthrough, IoMode::Direct] {
            m.opened(mode);
            m.opened(mode);
            m.released(mode);
            assert_eq!(m.imposed(), Some(mode), "one {mode:?} handle left");
            m.released(mode);
            assert_eq!(m.imposed(), None, "all {mode:?} handles released");
        }
        m.released(IoMode::Cached);
        assert_eq!(
            m.imposed(),
            None,
            "a release without an open counts nothing"
        );
    }

    fn open_path(dir: &OwnedFd, name: &str) -> OwnedFd {
        rustix::fs::openat(
            dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open O_PATH")
    }

    /// A table over a temp dir holding files `names`, each learned in order.
    fn table(names: &[&str], cap: u64) -> (tempfile::TempDir, OwnedFd, Inodes, Vec<u64>) {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in names {
            std::fs::write(dir.path().join(n), n).expect("write");
        }
        let root = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open root");
        let t = Inodes::new(
            rustix::io::dup(&root).expect("dup"),
            identity(&root).expect("id"),
        );
        t.set_fd_cap(cap);
        let inos = names
            .iter()
            .map(|n| {
                let fd = open_path(&root, n);
                let id = identity(&fd).expect("id");
                t.learn(ROOT, OsStr::new(n), fd, id, FileType::RegularFile, 0)
            })
            .collect();
        (dir, root, t, inos)
    }

    fn held(t: &Inodes, ino: u64) -> bool {
        t.get(ino).is_some_and(|i| lock(&i.fd).is_some())
    }

    #[test]
    fn past_the_cap_the_oldest_inode_gives_its_fd_back_and_reopens_as_the_same_file() {
        let (_d, root, t, inos) = table(&["a", "b", "c"], 2);
        if t.get(inos[0]).is_some_and(|i| i.born.is_none()) {
            rewind_platform::stderr_line!(
                "skipped: this filesystem has no birth times, so nothing is evicted"
            );
            return;
        }
        assert!(!held(&t, inos[0]), "the oldest gave its fd back");
        assert!(held(&t, inos[1]) && held(&t, inos[2]));
        let i = t.get(inos[0]).expect("still known");
        let fd = t.fd(inos[0], &i).expect("reopened through its link");
        let a = identity(&open_path(&root, "a")).expect("id");
        assert_eq!(identity(&fd).expect("id"), a, "reopened the same file");
        assert!(
            held(&t, inos[0]) && !held(&t, inos[1]),
            "and the next oldest gave way"
        );
    }

    #[test]
    fn an_evicted_inode_whose_name_now_holds_another_file_is_stale() {
        let (d, _root, t, inos) = table(&["a", "b"], 1);
        if t.get(inos[0]).is_some_and(|i| i.born.is_none()) {
            rewind_platform::stderr_line!(
                "skipped: this filesystem has no birth times, so nothing is evicted"
            );
            return;
        }
        assert!(!held(&t, inos[0]));
        std::fs::remove_file(d.path().join("a")).expect("rm");
        std::fs::write(d.path().join("a"), "another").expect("write");
        let i = t.get(inos[0]).expect("known");
        assert_eq!(
            t.fd(inos[0], &i).err(),
            Some(rustix::io::Errno::STALE),
            "a different file under the old name is not the inode"
        );
    }

    #[test]
    fn an_unlinked_inode_keeps_its_fd() {
        let (_d, _root, t, inos) = table(&["a", "b"], 4);
        t.unlinked(ROOT, OsStr::new("a"));
        t.set_fd_cap(1);
        let mut q = lock(&t.holding);
        let n = q.len();
        t.evict(&mut q, n);
        drop(q);
        assert!(
            held(&t, inos[0]),
            "no link leads back to it: it keeps its fd"
        );
    }

    #[test]
    fn a_reused_inode_number_gets_an_inode_of_its_own() {
        let (_d, root, t, inos) = table(&["a"], 8);
        let fd = open_path(&root, "a");
        let mut id = identity(&fd).expect("id");
        // The same (dev, ino) born at another time: the number was reused.
        id.born = Some((id.born.map_or(1, |b| b.0 + 1), 0));
        let again = t.learn(ROOT, OsStr::new("b"), fd, id, FileType::RegularFile, 0);
        assert_ne!(again, inos[0], "a new FUSE inode");
        assert!(
            t.get(inos[0]).is_some(),
            "the old one stays until forgotten"
        );
        t.forget(inos[0], 1);
        assert_eq!(
            t.read().by_key.get(&id.key()),
            Some(&again),
            "forgetting the old inode keeps the new one's key"
        );
    }

    #[test]
    fn a_table_the_kernel_forgot_gives_its_slots_back() {
        let (_d, root, t, _) = table(&[], 64);
        let id = identity(&root).expect("id");
        let learn = |k: u64| {
            let fd = rustix::io::dup(&root).expect("dup");
            let id = Identity {
                dev: id.dev,
                ino: 1_000_000 + k,
                born: Some((1, 0)),
            };
            let name = format!("f{k}");
            t.learn(ROOT, OsStr::new(&name), fd, id, FileType::RegularFile, 0)
        };
        let inos: Vec<u64> = (0..40_000).map(learn).collect();
        let slots = |t: &Inodes| {
            let t = t.read();
            [
                t.by_ino.capacity(),
                t.by_key.capacity(),
                t.key_of.capacity(),
                t.children.capacity(),
                t.links.capacity(),
            ]
        };
        let peak = slots(&t);
        for ino in &inos[10..] {
            t.forget(*ino, 1);
        }
        let after = slots(&t);
        for (p, a) in peak.iter().zip(after) {
            assert!(a * 8 <= *p, "slots {peak:?} before, {after:?} after");
        }
        for ino in &inos[..10] {
            assert!(t.get(*ino).is_some(), "the inodes still looked up stay");
        }
        assert_eq!(learn(10), inos[10], "and the table takes new ones");
    }
}
