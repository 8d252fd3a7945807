//! The passthrough filesystem: every request is served by an fd-relative
//! syscall on the backing tree, after passing the gate and before marking
//! what it changed. Opened files use kernel passthrough where the kernel
//! allows it (reads and writes never reach this process), except small
//! files opened read-only, which the kernel's page cache serves (D73); a
//! read-only open never copies anything.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};

use crate::dirty::{DirtySet, Mutation, Tracker};
use crate::gate::Gate;
use crate::inodes::{self, Backing, Inode, Inodes, IoMode, Passthrough, ROOT};

/// An inode for the length of one request: the table's entry and its
/// `O_PATH` fd (reopened if it was evicted; kept open while in use).
#[derive(Clone)]
struct Live {
    inode: Arc<Inode>,
    fd: Arc<OwnedFd>,
}

impl std::ops::Deref for Live {
    type Target = Inode;
    fn deref(&self) -> &Inode {
        &self.inode
    }
}

/// Files up to this size opened read-only (with nothing open for writing)
/// are read through the kernel's page cache instead of passthrough: a
/// passthrough read makes the kernel ask for the file's attributes again
/// (it drops its atime), a cached page does not, so `grep -r` over a
/// warm tree costs one request per file instead of two. Bigger files keep
/// passthrough's native throughput on their first read (D73).
const CACHED_OPEN_MAX: u64 = 1 << 20;

/// How long the kernel may trust an entry or attributes without asking,
/// for a view mounted elsewhere (`--at VIEW`). Every change goes through
/// the mount (the kernel updates its caches) or is a rewind (invalidated
/// explicitly), so this only bounds staleness from outside: changes made
/// to the workspace directory beside the view, and mtimes moved by a
/// shared mmap. Long enough to span an agent's pause between two commands
/// (with 5 s, a `find` over T1 after 6 s idle took 537 ms instead of 40:
/// a lookup per entry); finite (D67).
pub const TTL_VIEW: Duration = Duration::from_secs(60);

/// The same for a mount over the workspace itself, where nothing writes
/// beside the mount but processes whose working directory was inside
/// before it (which `mount` names): five minutes, so an agent's tools pay
/// a lookup per entry every five minutes instead of every minute (the
/// kernel counts the TTL from the lookup, not from the last use; D77).
pub const TTL_OVER_ITSELF: Duration = Duration::from_secs(300);

/// rewind's state directory, hidden from the mount view so that nothing
/// working through the mount can delete its own history.
const HIDDEN: &[u8] = b".rewind";

/// State shared by the request threads and the control socket.
pub struct Shared {
    pub inodes: Inodes,
    /// `/proc/self/fd`, to reopen `O_PATH` fds with real access.
    proc_fd: OwnedFd,
    pub tracker: Tracker,
    pub gate: Gate,
    pub notifier: OnceLock<fuser::Notifier>,
    /// Odd while a rewind is in progress: a reader that saw the same even
    /// value before and after reading saw one tree.
    pub generation: AtomicU64,
    pub passthrough: AtomicBool,
    /// [`Shared::still_mapped`] as the freeze found it just before its
    /// gate closed, for the takes while frozen: reading a process's maps
    /// takes its mmap lock, which a thread faulting on this mount's pages
    /// may hold (or queue behind) until the frozen mount answers.
    mapped_at_freeze: std::sync::Mutex<Option<Mapped>>,
    pub passthrough_opens: AtomicU64,
    pub cached_opens: AtomicU64,
    pub plain_opens: AtomicU64,
    /// The root directory folds case (ext4/f2fs `chattr +F`): `.REWIND`
    /// names `.rewind` there, and must be hidden as well.
    root_casefold: bool,
    /// Who makes new entries, and what the daemon's own umask takes off
    /// their modes: see [`OverlayFs::settle_new`].
    maker: Maker,
    /// Over the workspace itself: whether processes still work in the
    /// directory under the mount (D319).
    pub beneath: OnceLock<Beneath>,
    /// Raises, through the mount, the events a rewind's changes to the
    /// backing tree did not (D339).
    pub announcer: OnceLock<crate::announce::Announcer>,
}

/// Processes that entered the workspace before it was mounted over keep
/// the directory under the mount, and so do the children they start: a
/// shell, a watcher, a dev server. What they change never reaches the
/// dirty set, and a checkpoint scoped by it said "no changes" while a
/// file grew under it (helper-70). While any such process is seen, every
/// capture walks the whole tree; once none is, none can come back (a
/// process reaches that directory only from one that had it).
pub struct Beneath {
    dir: std::path::PathBuf,
    /// The daemon's own bind mount of `dir`, from which the other paths
    /// that reach it are found.
    bind: std::path::PathBuf,
    /// The device of the directory under the mount.
    dev: u64,
    /// Some process may still work there: look again.
    suspect: AtomicBool,
    /// Says when the mount table changed, so that the paths found in it
    /// are looked for again only then, not at every capture.
    mounts: rewind_platform::MountWatch,
    /// The other paths that reach `dir`, as the mount table last said.
    elsewhere: Mutex<Vec<std::path::PathBuf>>,
}

impl Beneath {
    /// Looks once, now that the mount covers `dir` (on device `dev`
    /// below it).
    pub fn new(dir: std::path::PathBuf, bind: std::path::PathBuf, dev: u64) -> Beneath {
        // The watch first: a mount made between it and the read below is
        // then read again at the next capture, not missed.
        let mounts = rewind_platform::MountWatch::new();
        let elsewhere = rewind_platform::reached_elsewhere(&bind, crate::FUSE_KINDS);
        let b = Beneath {
            dir,
            bind,
            dev,
            suspect: AtomicBool::new(true),
            mounts,
            elsewhere: Mutex::new(elsewhere),
        };
        b.worked_in();
        b
    }

    /// Whether a process works under the mount now, or could: another
    /// path reaches what the mount covers (a bind mount made before it,
    /// helper-82), which a process may write through at any time. Costs
    /// a poll of the mount table (read again only when it changed), and a
    /// look through `/proc` only while a process worked there at the
    /// last look.
    pub fn worked_in(&self) -> bool {
        if self.reached_elsewhere() {
            return true;
        }
        if !self.suspect.load(Ordering::Acquire) {
            return false;
        }
        let me = std::process::id();
        let seen = rewind_platform::works_beneath(&self.dir, self.dev, |pid, parent| {
            pid == me || parent == Some(me)
        });
        if !seen {
            self.suspect.store(false, Ordering::Release);
        }
        seen
    }

    /// Whether another path reaches the directory under the mount, in
    /// this mount namespace.
    fn reached_elsewhere(&self) -> bool {
        let mut known = self
            .elsewhere
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.mounts.changed() {
            *known = rewind_platform::reached_elsewhere(&self.bind, crate::FUSE_KINDS);
        }
        !known.is_empty()
    }
}

/// The daemon's identity as it bears on the entries it creates.
#[derive(Clone, Copy, Debug)]
struct Maker {
    /// Running as root: an entry a user creates through the mount must be
    /// given to them, or it is root's.
    root: bool,
    /// The daemon's process umask (read once at start). The kernel has
    /// already applied the caller's; this one would take bits off again.
    umask: u32,
}

impl Maker {
    fn of_this_process() -> Maker {
        Maker {
            root: rustix::process::geteuid().is_root(),
            umask: current_umask(),
        }
    }
}

/// The process's umask, read where the kernel shows it (`Umask:` in
/// `/proc/self/status`, Linux 4.7) rather than by setting it to 0 and
/// back, which would let a thread started meanwhile create files with
/// no umask at all. Without /proc, the set-and-restore is the only way.
fn current_umask() -> u32 {
    let shown = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        });
    shown.unwrap_or_else(|| {
        let old = rustix::process::umask(Mode::empty());
        rustix::process::umask(old);
        old.bits()
    })
}

/// `FS_CASEFOLD_FL`, which rustix does not name.
const CASEFOLD_FL: u32 = 0x4000_0000;

impl Shared {
    pub fn new(root: OwnedFd) -> std::io::Result<Shared> {
        let id = inodes::identity(&root)?;
        let root_casefold =
            rustix::fs::ioctl_getflags(&root).is_ok_and(|f| f.bits() & CASEFOLD_FL != 0);
        let proc_fd = rustix::fs::open(
            "/proc/self/fd",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Shared {
            maker: Maker::of_this_process(),
            inodes: Inodes::new(root, id),
            proc_fd,
            tracker: Tracker::new(),
            gate: Gate::default(),
            notifier: OnceLock::new(),
            generation: AtomicU64::new(0),
            passthrough: AtomicBool::new(false),
            mapped_at_freeze: std::sync::Mutex::new(None),
            passthrough_opens: AtomicU64::new(0),
            cached_opens: AtomicU64::new(0),
            plain_opens: AtomicU64::new(0),
            root_casefold,
            beneath: OnceLock::new(),
            announcer: OnceLock::new(),
        })
    }

    /// `.rewind` at the root, which the mount never shows (nor, in a
    /// directory that folds case, `.REWIND` and the like).
    fn hidden(&self, parent: INodeNo, name: &OsStr) -> bool {
        parent.0 == ROOT
            && if self.root_casefold {
                name.as_bytes().eq_ignore_ascii_case(HIDDEN)
            } else {
                name.as_bytes() == HIDDEN
            }
    }

    /// A mutating request begins; its marks go through the guard, held
    /// until its syscalls are done ([`Mutation`]).
    fn mutation(&self) -> Mutation<'_> {
        self.tracker.mutation()
    }

    fn mark_entry(&self, m: &mut Mutation<'_>, parent: u64, name: &OsStr) {
        m.mark(self.inodes.path(parent).as_deref(), name.as_bytes());
    }

    /// Every entry of directory `name` in `parent` may have changed.
    fn mark_dir(&self, m: &mut Mutation<'_>, parent: u64, name: &OsStr) {
        m.mark_dir(self.child_path(parent, name).as_deref());
    }

    /// Anything below directory `name` in `parent` may have changed (D192).
    fn mark_deep(&self, m: &mut Mutation<'_>, parent: u64, name: &OsStr) {
        m.mark_deep(self.child_path(parent, name).as_deref());
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Option<Vec<u8>> {
        self.inodes.path(parent).map(|mut path| {
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name.as_bytes());
            path
        })
    }

    /// Inode `ino` changed (content, mode, times, xattrs): its entries in
    /// every directory that names it are dirty. A file with names the
    /// daemon never saw makes everything dirty.
    fn mark_inode(&self, m: &mut Mutation<'_>, ino: u64, nlink: u64) {
        if ino == ROOT {
            // The root's own metadata is not captured.
            return;
        }
        let links = self.inodes.links(ino);
        let is_dir = self
            .inodes
            .get(ino)
            .is_some_and(|i| i.kind == FileType::Directory);
        if links.is_empty() || (!is_dir && nlink > links.len() as u64) {
            m.mark_all();
            return;
        }
        for (p, n) in links {
            self.mark_entry(m, p, &n);
        }
    }

    /// The dirty set for a capture; with `take`, files still open for
    /// writing stay dirty for the next one. With it: the files opened for
    /// writing since the last capture (`reread`) and those open for
    /// writing now (`open`), by their current names (D247).
    pub fn take(&self, take: bool) -> DirtySet {
        let frozen = self
            .gate
            .is_frozen()
            .then(|| {
                self.mapped_at_freeze
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            })
            .flatten();
        let Mapped {
            mapped,
            unmapped,
            gone,
        } = frozen.unwrap_or_else(|| self.still_mapped());
        if take {
            for (ino, pids, releases) in &gone {
                self.tracker.unmapped_by(*ino, pids, *releases);
            }
        }
        // Into the set before it is taken, so that an aborted capture
        // gives them back with the rest. A file unmapped since the last
        // take may have been written through its mapping until then.
        let reread = self
            .tracker
            .reread_inodes(take)
            .into_iter()
            .chain(unmapped)
            .flat_map(|ino| self.paths_of(ino))
            .collect::<Vec<_>>();
        let mut set = if take {
            self.tracker.reread(reread);
            self.tracker.take(true)
        } else {
            let mut set = self.tracker.take(false);
            set.reread.extend(reread);
            set
        };
        set.open = self
            .open_for_writing()
            .into_iter()
            .chain(mapped.iter().flat_map(|&ino| self.paths_of(ino)))
            .collect();
        // Changes made under the mount are in no set (D319).
        set.all |= self.beneath.get().is_some_and(Beneath::worked_in);
        if take {
            let mut m = self.mutation();
            for ino in self.tracker.writers().into_iter().chain(mapped) {
                let nlink = self.statx(ino).map_or(u64::MAX, |x| u64::from(x.stx_nlink));
                self.mark_inode(&mut m, ino, nlink);
            }
        }
        set
    }

    /// The backing file of inode `ino`, stat'ed; `None` once forgotten.
    fn statx(&self, ino: u64) -> Option<rustix::fs::Statx> {
        let i = self.inodes.get(ino)?;
        let fd = self.inodes.fd(ino, &i).ok()?;
        inodes::statx_fd(&*fd).ok()
    }

    /// Of the files whose passthrough handle for writing was released
    /// ([`Tracker::released_mappable`]), those a process that opened them
    /// still maps shared and writable, and those none does any more. A
    /// program that closes its descriptor right after `mmap` writes the
    /// backing file's pages with no request the daemon sees: such a file
    /// counts as open for writing while it is mapped (D256). Costs one
    /// read of `/proc/PID/maps` per process, and a stat per file only
    /// when that process maps some file shared and writable. Never called
    /// while frozen (see [`Shared::mapped_at_freeze`]).
    fn still_mapped(&self) -> Mapped {
        let candidates = self.tracker.mappable();
        let mut out = Mapped::default();
        if candidates.is_empty() {
            return out;
        }
        // `None`: unreadable (another user's process), so maybe mapped.
        let mut maps: HashMap<u32, Option<HashSet<u64>>> = HashMap::new();
        for (_, pids, _) in &candidates {
            for &pid in pids {
                maps.entry(pid)
                    .or_insert_with(|| rewind_platform::shared_writable_mappings(pid).ok());
            }
        }
        for (ino, pids, releases) in candidates {
            // The maps name the mount's inode (what the kernel shows for a
            // passthrough file since 6.8), or the backing file's on older
            // kernels: stat it only if a process maps anything else. An
            // unrelated mapping with the same number only costs a reread.
            let mut backing = None;
            let mut maps_it = |pid: &u32| match maps.get(pid) {
                Some(Some(set)) if set.contains(&ino) => true,
                Some(Some(set)) if set.is_empty() => false,
                Some(Some(set)) => backing
                    .get_or_insert_with(|| self.statx(ino).map(|x| x.stx_ino))
                    .is_some_and(|b| set.contains(&b)),
                _ => true,
            };
            let (still, gone): (Vec<u32>, Vec<u32>) = pids.into_iter().partition(&mut maps_it);
            if still.is_empty() {
                out.unmapped.push(ino);
            } else {
                out.mapped.push(ino);
            }
            if !gone.is_empty() {
                out.gone.push((ino, gone, releases));
            }
        }
        out
    }

    /// What a freeze answers: the files open for writing
    /// ([`Shared::open_for_writing`]) and those a process still maps
    /// shared and writable after closing its descriptor, as the freeze
    /// found them (D256). A rewind replacing one leaves that process
    /// writing into the old file, and warned of none (helper-41).
    pub fn held_at_freeze(&self) -> Vec<Vec<u8>> {
        let mapped = self
            .mapped_at_freeze
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|m| m.mapped.clone())
            .unwrap_or_default();
        let mut held = self.open_for_writing();
        for ino in mapped {
            for p in self.paths_of(ino) {
                if !held.contains(&p) {
                    held.push(p);
                }
            }
        }
        held
    }

    /// The workspace-relative paths (every link the kernel knows) of the
    /// files open for writing through the mount: after a freeze's drain,
    /// those a rewind would replace under a writer that goes on writing
    /// into the replaced file (D220, D244).
    pub fn open_for_writing(&self) -> Vec<Vec<u8>> {
        self.tracker
            .writers()
            .into_iter()
            .flat_map(|ino| self.paths_of(ino))
            .collect()
    }

    /// The workspace-relative paths of every link the kernel knows for
    /// `ino` (those whose directory's path is known).
    fn paths_of(&self, ino: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (parent, name) in self.inodes.links(ino) {
            let Some(mut path) = self.inodes.path(parent) else {
                continue;
            };
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name.as_bytes());
            out.push(path);
        }
        out
    }

    /// Close the gate for a rewind: to opens first, until the files open
    /// for writing are closed or `drain` has passed, then to everything.
    /// A tool that opened a file just before the rewind wrote into it
    /// after the safety capture, and the rewind then replaced the file:
    /// its write was in no file and no checkpoint (helper-34, D241).
    pub fn freeze(&self, drain: std::time::Duration) -> bool {
        if !self.gate.close_to_opens() {
            return false;
        }
        let started = std::time::Instant::now();
        loop {
            while !self.tracker.writers().is_empty() && started.elapsed() < drain {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // Closed to opens only: a fault on this mount is still served.
            let mapped = self.still_mapped();
            *self
                .mapped_at_freeze
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(mapped);
            if !self.gate.freeze() {
                self.gate.thaw();
                return false;
            }
            // An open inside the gate when it closed to opens counts its
            // writer only as it finishes, which the freeze waited for.
            if self.tracker.writers().is_empty() || started.elapsed() >= drain {
                break;
            }
            self.gate.unfreeze_to_opens_closed();
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Reopen the gate after the backing tree changed at `paths` (`None`:
    /// anywhere), then drop what the kernel cached for them. Invalidation
    /// comes after reopening: the kernel takes directory locks that a
    /// request waiting at the gate may hold. Until the generation turns
    /// even again, the rewind is still in progress.
    pub fn thaw(&self, paths: Option<&[Vec<u8>]>) {
        self.gate.thaw();
        *self
            .mapped_at_freeze
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        match paths {
            Some(paths) => {
                for p in paths {
                    let (parent, name) = split(p);
                    self.tracker.mark(Some(parent), name);
                }
                self.invalidate(paths);
            }
            None => {
                self.tracker.mark_all();
                self.invalidate_all();
            }
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(a) = self.announcer.get() {
            a.send(paths);
        }
    }

    fn invalidate(&self, paths: &[Vec<u8>]) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        let mut dirs = std::collections::HashSet::new();
        for p in paths {
            let (parent, name) = split(p);
            if let Some(pino) = self.inodes.resolve(parent) {
                let _ = n.inval_entry(INodeNo(pino), OsStr::from_bytes(name));
                dirs.insert(pino);
            }
            if let Some(ino) = self.inodes.resolve(p) {
                let _ = n.inval_inode(INodeNo(ino), 0, 0);
            }
        }
        for d in dirs {
            let _ = n.inval_inode(INodeNo(d), 0, 0);
        }
    }

    fn invalidate_all(&self) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        let (entries, inodes) = self.inodes.everything();
        for (p, name) in entries {
            let _ = n.inval_entry(INodeNo(p), &name);
        }
        for ino in inodes {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }
}

/// The kernel's view of an inode, from one `statx`.
fn attr(ino: u64, x: &rustix::fs::Statx) -> FileAttr {
    let t = |ts: &rustix::fs::StatxTimestamp| time(ts.tv_sec, i64::from(ts.tv_nsec));
    FileAttr {
        ino: INodeNo(ino),
        size: x.stx_size,
        blocks: x.stx_blocks,
        atime: t(&x.stx_atime),
        mtime: t(&x.stx_mtime),
        ctime: t(&x.stx_ctime),
        crtime: UNIX_EPOCH,
        kind: kind_of(u32::from(x.stx_mode)),
        perm: x.stx_mode & 0o7777,
        nlink: x.stx_nlink,
        uid: x.stx_uid,
        gid: x.stx_gid,
        rdev: rustix::fs::makedev(x.stx_rdev_major, x.stx_rdev_minor) as u32,
        flags: 0,
        blksize: x.stx_blksize,
    }
}

/// Answer a request that returns nothing but success or an error.
fn answer(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// (directory, name) of a workspace-relative path; the root's directory
/// is empty.
pub(crate) fn split(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().rposition(|&c| c == b'/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"", p),
    }
}

/// The file behind an open handle: its own, one opened at the first
/// request that needs it, or the inode's passthrough backing file.
enum HandleFile {
    Own(File),
    Lazy(LazyFile),
    Shared(Arc<Passthrough>),
}

/// A read-only handle in page-cache mode opens its backing file only when
/// the kernel first asks it to read: `grep -r` over a warm tree opens
/// every file and reads none (the pages are cached). Holding the inode's
/// `O_PATH` fd keeps the file reachable if its name goes meanwhile.
struct LazyFile {
    inode: Live,
    flags: i32,
    file: OnceLock<File>,
}

/// What [`Shared::still_mapped`] found.
#[derive(Clone, Default)]
struct Mapped {
    /// Files still mapped by a process that opened them for writing.
    mapped: Vec<u64>,
    /// Files none of those processes maps any more.
    unmapped: Vec<u64>,
    /// Per file, the processes checked that map it no more, and its
    /// release count then (forgotten at a take).
    gone: Vec<(u64, Vec<u32>, u64)>,
}

struct Handle {
    file: HandleFile,
    inode: Arc<Inode>,
    ino: u64,
    mode: IoMode,
    writer: bool,
    /// The process (thread) that opened it, as the kernel said.
    opener: u32,
}

pub struct OverlayFs {
    sh: Arc<Shared>,
    files: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    want_passthrough: bool,
    /// The kernel opens directories without asking (`opendir` answered
    /// ENOSYS once): no round trip per `opendir` and `closedir`.
    no_opendir: bool,
    /// How long the kernel trusts entries and attributes.
    ttl: Duration,
    /// Test points (see [`crate::ServeOptions::failpoint`]).
    failpoint: fn(&str),
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

/// `/proc/self/fd/N`: reaches the inode behind an `O_PATH` fd for the
/// calls that have no fd form (reopen, chmod, xattrs).
fn proc_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn kind_of(mode: u32) -> FileType {
    fuse_kind(rustix::fs::FileType::from_raw_mode(mode as _))
}

fn fuse_kind(t: rustix::fs::FileType) -> FileType {
    match t {
        rustix::fs::FileType::Directory => FileType::Directory,
        rustix::fs::FileType::Symlink => FileType::Symlink,
        rustix::fs::FileType::Fifo => FileType::NamedPipe,
        rustix::fs::FileType::Socket => FileType::Socket,
        rustix::fs::FileType::CharacterDevice => FileType::CharDevice,
        rustix::fs::FileType::BlockDevice => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

fn timespec(t: Option<TimeOrNow>) -> Timespec {
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as _,
            },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut n) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if n < 0 {
                    s -= 1;
                    n += 1_000_000_000;
                }
                Timespec {
                    tv_sec: s,
                    tv_nsec: n as _,
                }
            }
        },
    }
}

impl OverlayFs {
    /// `ttl`: [`TTL_OVER_ITSELF`] or [`TTL_VIEW`].
    pub fn new(
        sh: Arc<Shared>,
        want_passthrough: bool,
        ttl: Duration,
        failpoint: fn(&str),
    ) -> OverlayFs {
        OverlayFs {
            sh,
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            want_passthrough,
            no_opendir: false,
            ttl,
            failpoint,
        }
    }

    fn inode(&self, ino: INodeNo) -> Result<Live, Errno> {
        let inode = self.sh.inodes.get(ino.0).ok_or(Errno::ENOENT)?;
        let fd = self
            .with_fds(|| self.sh.inodes.fd(ino.0, &inode))
            .map_err(errno)?;
        Ok(Live { inode, fd })
    }

    fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Run a call that opens an fd. Out of fds (EMFILE, ENFILE), give back
    /// the backing files inodes keep for later opens, which are only a
    /// speed-up, and try once more: a tool walking a big tree must not
    /// see "Too many open files" because of our cache. Retrying is safe:
    /// the kernel allocates the fd before it creates anything.
    fn with_fds<T>(
        &self,
        mut open: impl FnMut() -> rustix::io::Result<T>,
    ) -> rustix::io::Result<T> {
        match open() {
            Err(e)
                if inodes::out_of_fds(e)
                    && self.sh.inodes.release_kept() + self.sh.inodes.shed() as u64 > 0 =>
            {
                open()
            }
            r => r,
        }
    }

    /// Look `name` up in `parent` and remember it (one kernel reference).
    fn entry(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        if self.sh.hidden(parent, name) {
            return Err(Errno::ENOENT);
        }
        let p = self.inode(parent)?;
        let fd = self
            .with_fds(|| {
                rustix::fs::openat(
                    &p.fd,
                    name,
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            })
            .map_err(errno)?;
        let x = inodes::statx_fd(&fd).map_err(errno)?;
        let kind = kind_of(u32::from(x.stx_mode));
        let ino = self.sh.inodes.learn(
            parent.0,
            name,
            fd,
            inodes::identity_of(&x),
            kind,
            self.sh.generation.load(Ordering::SeqCst),
        );
        Ok(attr(ino, &x))
    }

    fn getattr_of(&self, ino: u64, i: &Live) -> Result<FileAttr, Errno> {
        Ok(attr(ino, &inodes::statx_fd(&i.fd).map_err(errno)?))
    }

    /// Reopen the inode behind an `O_PATH` fd with real access, through
    /// `/proc/self/fd` (one path component, not a walk).
    fn reopen(&self, i: &Live, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        let name = i.fd.as_raw_fd().to_string();
        self.with_fds(|| {
            rustix::fs::openat(
                &self.sh.proc_fd,
                name.as_str(),
                flags | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })
    }

    /// An own backing file for a handle the daemon serves, with the
    /// caller's access mode.
    fn own_file(&self, i: &Live, flags: i32) -> Result<File, Errno> {
        let f = OFlags::from_bits_retain(flags as _)
            & !(OFlags::CREATE | OFlags::EXCL | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::DIRECT);
        Ok(File::from(self.reopen(i, f).map_err(errno)?))
    }

    /// The inode's passthrough: the one its other opens share, or a new
    /// one from `open` (read-write, so every later open can share it)
    /// registered with the kernel. `Err` gives back the file it could not
    /// register, if any. The caller holds the slot locked throughout: two
    /// backing files for one inode would make the kernel refuse the second.
    fn passthrough(
        &self,
        slot: &mut Backing,
        open: impl FnOnce() -> Option<File>,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> Result<Arc<Passthrough>, Option<File>> {
        if let Some(p) = slot.shared.upgrade() {
            return Ok(p);
        }
        let file = open().ok_or(None)?;
        let id = match register(&file) {
            Ok(id) => id,
            Err(_) => return Err(Some(file)),
        };
        let p = Arc::new(Passthrough { id, file });
        slot.shared = Arc::downgrade(&p);
        if slot.kept.is_none() {
            slot.kept = self.sh.inodes.try_keep(&p);
        }
        Ok(p)
    }

    /// Whether a read-only open of `i` may use the page cache (D73).
    fn small_file(&self, i: &Live) -> bool {
        inodes::statx_fd(&*i.fd).is_ok_and(|x| x.stx_size <= CACHED_OPEN_MAX)
    }

    /// Record an open handle. Its mode is already counted in its inode's
    /// [`inodes::OpenModes`]; [`Filesystem::release`] uncounts it.
    fn keep(
        &self,
        file: HandleFile,
        inode: Arc<Inode>,
        ino: u64,
        mode: IoMode,
        writer: bool,
        opener: u32,
    ) -> u64 {
        let fh = self.fh();
        if writer {
            self.sh.tracker.opened_for_write(ino);
        }
        let counter = match mode {
            IoMode::Passthrough => &self.sh.passthrough_opens,
            IoMode::Cached => &self.sh.cached_opens,
            IoMode::Direct => &self.sh.plain_opens,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let h = Handle {
            file,
            inode,
            ino,
            mode,
            writer,
            opener,
        };
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(h));
        fh
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    /// Run `f` on a handle's file without holding the handle table's lock
    /// (a slow read must not stall every other handle).
    fn with_file<T>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let h = self.handle(fh)?;
        match &h.file {
            HandleFile::Own(file) => f(file),
            HandleFile::Shared(p) => f(&p.file),
            HandleFile::Lazy(l) => {
                if l.file.get().is_none() {
                    // Two first reads at once: one file wins, the other
                    // is closed.
                    let _ = l.file.set(self.own_file(&l.inode, l.flags)?);
                }
                f(l.file.get().ok_or(Errno::EIO)?)
            }
        }
    }

    /// `fstat` of an open handle: the file itself answers, even when no
    /// name leads to it any more.
    fn stat_handle(&self, fh: FileHandle) -> Result<rustix::fs::Statx, Errno> {
        let h = self.handle(fh)?;
        let r = match &h.file {
            HandleFile::Own(file) => inodes::statx_fd(file),
            HandleFile::Shared(p) => inodes::statx_fd(&p.file),
            HandleFile::Lazy(l) => inodes::statx_fd(&*l.inode.fd),
        };
        r.map_err(errno)
    }

    /// A directory inode opened for reading its entries (or fsync).
    fn open_dir(&self, i: &Live) -> Result<OwnedFd, Errno> {
        self.with_fds(|| {
            rustix::fs::openat(
                &i.fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })
        .map_err(errno)
    }

    fn nlink(&self, i: &Live) -> u64 {
        inodes::statx_fd(&i.fd).map_or(u64::MAX, |x| u64::from(x.stx_nlink))
    }
}

fn is_write(flags: i32) -> bool {
    let f = OFlags::from_bits_retain(flags as _);
    (f & OFlags::ACCMODE) != OFlags::RDONLY || f.contains(OFlags::TRUNC)
}

impl Filesystem for OverlayFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // Cached pages of a file whose mtime changed when its attributes
        // are next fetched are dropped: the bound on staleness for a file
        // changed beside the mount (`--at VIEW`) is the attribute TTL.
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        self.no_opendir = config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        // Passthrough needs CAP_SYS_ADMIN for every backing file; without
        // it every open would fail over to the slow path, so do not ask.
        if self.want_passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(2).is_ok()
        {
            self.sh.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _g = self.sh.gate.enter();
        match self.entry(parent, name) {
            Ok(a) => reply.entry(&self.ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.sh.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _g = self.sh.gate.enter();
        // `fstat` on an open file: its own file answers, even when no
        // name leads to the inode any more (unlinked, or replaced by a
        // rewind) and its `O_PATH` fd was given back (D65).
        let open = fh.and_then(|fh| self.stat_handle(fh).ok());
        if let Some(st) = open {
            return reply.attr(&self.ttl, &attr(ino.0, &st));
        }
        match self.inode(ino).and_then(|i| self.getattr_of(ino.0, &i)) {
            Ok(a) => reply.attr(&self.ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _g = self.sh.gate.enter();
        if self
            .sh
            .announcer
            .get()
            .is_some_and(|a| a.is_announcing(req.pid()))
        {
            // Only for the kernel's event (D339): nothing changes.
            return match self.inode(ino).and_then(|i| self.getattr_of(ino.0, &i)) {
                Ok(a) => reply.attr(&self.ttl, &a),
                Err(e) => reply.error(e),
            };
        }
        let run = || -> Result<FileAttr, Errno> {
            let i = self.inode(ino)?;
            let path = proc_path(&i.fd);
            let is_link = i.kind == FileType::Symlink;
            // Mark first: a change the capture misses is worse than a
            // change it looks at for nothing.
            let mut m = self.sh.mutation();
            self.sh.mark_inode(&mut m, ino.0, self.nlink(&i));
            if let Some(m) = mode {
                if is_link {
                    return Err(Errno::EOPNOTSUPP);
                }
                rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(m & 0o7777)).map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                rustix::fs::chownat(
                    &i.fd,
                    "",
                    uid.map(rustix::fs::Uid::from_raw),
                    gid.map(rustix::fs::Gid::from_raw),
                    AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(errno)?;
            }
            if let Some(len) = size {
                let done = fh.map(|fh| self.with_file(fh, |f| f.set_len(len).map_err(Errno::from)));
                match done {
                    Some(Ok(())) => {}
                    _ => {
                        let fd = self.reopen(&i, OFlags::WRONLY).map_err(errno)?;
                        rustix::fs::ftruncate(&fd, len).map_err(errno)?;
                    }
                }
            }
            if atime.is_some() || mtime.is_some() {
                let times = Timestamps {
                    last_access: timespec(atime),
                    last_modification: timespec(mtime),
                };
                if is_link {
                    let (p, n) = self
                        .sh
                        .inodes
                        .links(ino.0)
                        .into_iter()
                        .next()
                        .ok_or(Errno::EOPNOTSUPP)?;
                    let pi = self.inode(INodeNo(p))?;
                    rustix::fs::utimensat(&pi.fd, n.as_os_str(), &times, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(errno)?;
                } else {
                    rustix::fs::utimensat(rustix::fs::CWD, path.as_str(), &times, AtFlags::empty())
                        .map_err(errno)?;
                }
            }
            self.getattr_of(ino.0, &i)
        };
        match run() {
            Ok(a) => reply.attr(&self.ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _g = self.sh.gate.enter();
        match self
            .inode(ino)
            .and_then(|i| rustix::fs::readlinkat(&i.fd, "", Vec::new()).map_err(errno))
        {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let new = Some((req, mode & !umask));
        self.make_entry(new, parent, name, reply, |p, _| {
            rustix::fs::mknodat(
                &p.fd,
                name,
                rustix::fs::FileType::from_raw_mode(mode as _),
                Mode::from_raw_mode(mode & !umask & 0o7777),
                rdev as _,
            )
            .map_err(errno)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.make_entry(Some((req, mode & !umask)), parent, name, reply, |p, m| {
            // The stat cache may hold rows at this path from a directory
            // moved away or deleted, and the inode number may even be
            // that one's: the new directory is listed, never taken from
            // them (D86).
            self.sh.mark_dir(m, parent.0, name);
            rustix::fs::mkdirat(&p.fd, name, Mode::from_raw_mode(mode & !umask & 0o7777))
                .map_err(errno)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, AtFlags::empty(), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, AtFlags::REMOVEDIR, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.make_entry(Some((req, 0o777)), parent, link_name, reply, |p, _| {
            rustix::fs::symlinkat(target, &p.fd, link_name).map_err(errno)
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _g = self.sh.gate.enter();
        let run = || -> Result<(), Errno> {
            if self.sh.hidden(parent, name) {
                return Err(Errno::ENOENT);
            }
            if self.sh.hidden(newparent, newname) {
                return Err(Errno::EACCES);
            }
            let p = self.inode(parent)?;
            let np = self.inode(newparent)?;
            let rf = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
            let is_dir = |dir: &rustix::fd::OwnedFd, name: &OsStr| {
                rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::Directory
                })
            };
            let mut m = self.sh.mutation();
            self.sh.mark_entry(&mut m, parent.0, name);
            self.sh.mark_entry(&mut m, newparent.0, newname);
            // A directory renamed to a path holds what it gathered
            // elsewhere, named at paths that are gone: the cached rows at
            // its new path (the same inode, if it was moved away and
            // back) do not list it (helper-27, D192).
            if is_dir(&p.fd, name) {
                self.sh.mark_deep(&mut m, newparent.0, newname);
            }
            if rf.contains(rustix::fs::RenameFlags::EXCHANGE) && is_dir(&np.fd, newname) {
                self.sh.mark_deep(&mut m, parent.0, name);
            }
            // A replaced target keeps its inode for whoever has it open.
            self.sh.inodes.hold(newparent.0, newname);
            rustix::fs::renameat_with(&p.fd, name, &np.fd, newname, rf).map_err(errno)?;
            self.sh.inodes.renamed(
                parent.0,
                name,
                newparent.0,
                newname,
                rf.contains(rustix::fs::RenameFlags::EXCHANGE),
            );
            Ok(())
        };
        answer(reply, run())
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.make_entry(None, newparent, newname, reply, |np, _| {
            let i = self.inode(ino)?;
            // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc works without.
            if rustix::fs::linkat(&i.fd, "", &np.fd, newname, AtFlags::EMPTY_PATH).is_err() {
                rustix::fs::linkat(
                    rustix::fs::CWD,
                    proc_path(&i.fd).as_str(),
                    &np.fd,
                    newname,
                    AtFlags::SYMLINK_FOLLOW,
                )
                .map_err(errno)?;
            }
            Ok(())
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _g = self.sh.gate.enter_open();
        let run = || -> Result<(u64, IoMode, Option<Arc<Passthrough>>), Errno> {
            let i = self.inode(ino)?;
            let writer = is_write(flags.0);
            // An open for writing that waited at the gate while a rewind
            // unlinked its file (`echo line >> log` during the rewind)
            // wrote into that file, which no name and no checkpoint holds
            // (helper-34, D236). ESTALE makes the kernel look the name up
            // again: the open meets the rewound tree, as if it came after.
            // A reader is let read the file it named, as natively one that
            // opened a moment earlier would: an ESTALE it cannot retry
            // (a second rewind between) failed `cat` (helper-35).
            if writer
                && i.inode.learned_in() != self.sh.generation.load(Ordering::SeqCst)
                && self.nlink(&i) == 0
            {
                return Err(Errno::ESTALE);
            }
            // Held to the end of the open: an O_TRUNC open truncates.
            let mut m = self.sh.mutation();
            if writer {
                self.sh.mark_inode(&mut m, ino.0, self.nlink(&i));
            }
            let inode = Arc::clone(&i.inode);
            // One lock from choosing the mode to counting the handle: two
            // opens at once must not pick different modes.
            let mut slot = i.backing.lock().unwrap_or_else(|p| p.into_inner());
            let mode = match slot.modes.imposed() {
                Some(m) => m,
                None if !self.sh.passthrough.load(Ordering::Relaxed) => IoMode::Cached,
                None if !writer && self.small_file(&i) => IoMode::Cached,
                None => IoMode::Passthrough,
            };
            let (file, mode, pt) = match mode {
                IoMode::Cached if !writer => (
                    HandleFile::Lazy(LazyFile {
                        inode: i.clone(),
                        flags: flags.0,
                        file: OnceLock::new(),
                    }),
                    mode,
                    None,
                ),
                IoMode::Cached | IoMode::Direct => {
                    (HandleFile::Own(self.own_file(&i, flags.0)?), mode, None)
                }
                IoMode::Passthrough => match self.passthrough(
                    &mut slot,
                    || self.reopen(&i, OFlags::RDWR).ok().map(File::from),
                    |f| reply.open_backing(f),
                ) {
                    Ok(p) => (
                        HandleFile::Shared(Arc::clone(&p)),
                        IoMode::Passthrough,
                        Some(p),
                    ),
                    Err(_) => (
                        HandleFile::Own(self.own_file(&i, flags.0)?),
                        IoMode::Direct,
                        None,
                    ),
                },
            };
            slot.modes.opened(mode);
            drop(slot);
            Ok((
                self.keep(file, inode, ino.0, mode, writer, req.pid()),
                mode,
                pt,
            ))
        };
        match run() {
            Ok((fh, _, Some(p))) => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &p.id)
            }
            // The pages the kernel has are current: every open that is not
            // answered with KEEP_CACHE (passthrough, direct) drops them,
            // and while one of those is open no page-cache open is given.
            Ok((fh, IoMode::Cached, None)) => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
            }
            // Served by this process without the page cache: an open that
            // needed passthrough and could not get it.
            Ok((fh, _, None)) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _g = self.sh.gate.enter();
        let r = self.with_file(fh, |f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Errno::from(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _g = self.sh.gate.enter();
        match self.with_file(fh, |f| f.write_all_at(data, offset).map_err(Errno::from)) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh.0);
        if let Some(h) = h {
            h.inode
                .backing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .modes
                .released(h.mode);
            if h.writer {
                self.sh.tracker.released(h.ino);
                if h.mode == IoMode::Passthrough {
                    self.sh.tracker.released_mappable(h.ino, h.opener);
                }
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _g = self.sh.gate.enter();
        let r = self.with_file(fh, |f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(Errno::from)
        });
        answer(reply, r)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Nothing to keep per open directory: `readdir` reads the backing
        // directory at the kernel's offset. Where the kernel can open
        // directories by itself, say so once and spare it the round trips
        // (its listing cache and `FOPEN_KEEP_CACHE` are then the default).
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        let _g = self.sh.gate.enter();
        match self.inode(ino) {
            // The kernel may keep the listing (until a change through the
            // mount or a rewind's invalidation drops it).
            Ok(_) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    /// The entries from `offset` on, each with the backing directory's own
    /// offset of the next one (its `d_off` cookie): resuming is what
    /// `seekdir` on the backing directory does, stable while the
    /// directory changes, as natively. `.rewind` at the root is skipped.
    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _g = self.sh.gate.enter();
        let dir = self.inode(ino).and_then(|i| {
            let mut dir = rustix::fs::Dir::new(self.open_dir(&i)?).map_err(errno)?;
            if offset > 0 {
                let at = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
                dir.seek(at).map_err(errno)?;
            }
            Ok(dir)
        });
        let mut dir = match dir {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        while let Some(ent) = dir.read() {
            let ent = match ent {
                Ok(e) => e,
                Err(e) => return reply.error(errno(e)),
            };
            let name = ent.file_name().to_bytes();
            if ino.0 == ROOT && name == HIDDEN {
                continue;
            }
            if reply.add(
                INodeNo(ent.ino()),
                ent.offset() as u64,
                fuse_kind(ent.file_type()),
                OsStr::from_bytes(name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        let _g = self.sh.gate.enter();
        let r = self
            .inode(ino)
            .and_then(|i| rustix::fs::fsync(self.open_dir(&i)?).map_err(errno));
        answer(reply, r)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self
            .inode(INodeNo(ROOT))
            .and_then(|i| rustix::fs::fstatvfs(&i.fd).map_err(errno))
        {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _g = self.sh.gate.enter();
        let r = self.inode(ino).and_then(|i| {
            let mut m = self.sh.mutation();
            self.sh.mark_inode(&mut m, ino.0, self.nlink(&i));
            rustix::fs::setxattr(
                proc_path(&i.fd).as_str(),
                name,
                value,
                rustix::fs::XattrFlags::from_bits_retain(flags as _),
            )
            .map_err(errno)
        });
        answer(reply, r)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _g = self.sh.gate.enter();
        let r = self.inode(ino).and_then(|i| {
            let path = proc_path(&i.fd);
            if size == 0 {
                return rustix::fs::getxattr_query(path.as_str(), name)
                    .map(|n| (n, Vec::new()))
                    .map_err(errno);
            }
            let mut buf = vec![0u8; size as usize];
            let n = rustix::fs::getxattr(path.as_str(), name, &mut buf[..]).map_err(errno)?;
            buf.truncate(n);
            Ok((n, buf))
        });
        match r {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, b)) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _g = self.sh.gate.enter();
        let r = self.inode(ino).and_then(|i| {
            let path = proc_path(&i.fd);
            if size == 0 {
                return rustix::fs::listxattr_query(path.as_str())
                    .map(|n| (n, Vec::new()))
                    .map_err(errno);
            }
            let mut buf = vec![0u8; size as usize];
            let n = rustix::fs::listxattr(path.as_str(), &mut buf[..]).map_err(errno)?;
            buf.truncate(n);
            Ok((n, buf))
        });
        match r {
            Ok((n, _)) if size == 0 => reply.size(n as u32),
            Ok((_, b)) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _g = self.sh.gate.enter();
        let r = self.inode(ino).and_then(|i| {
            let mut m = self.sh.mutation();
            self.sh.mark_inode(&mut m, ino.0, self.nlink(&i));
            rustix::fs::removexattr(proc_path(&i.fd).as_str(), name).map_err(errno)
        });
        answer(reply, r)
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _g = self.sh.gate.enter();
        let r = self.inode(ino).and_then(|i| {
            rustix::fs::access(
                proc_path(&i.fd).as_str(),
                rustix::fs::Access::from_bits_retain(mask.bits() as _),
            )
            .map_err(errno)
        });
        answer(reply, r)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _g = self.sh.gate.enter_open();
        let run = || -> Result<(FileAttr, u64, Option<Arc<Passthrough>>), Errno> {
            if self.sh.hidden(parent, name) {
                return Err(Errno::EACCES);
            }
            let p = self.inode(parent)?;
            let mut m = self.sh.mutation();
            self.sh.mark_entry(&mut m, parent.0, name);
            let mut of = OFlags::from_bits_retain(flags as _) & !(OFlags::NOCTTY | OFlags::DIRECT)
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC;
            let pt = self.sh.passthrough.load(Ordering::Relaxed);
            if pt {
                of = (of & !(OFlags::ACCMODE | OFlags::APPEND)) | OFlags::RDWR;
            }
            let fd = self
                .with_fds(|| {
                    rustix::fs::openat(&p.fd, name, of, Mode::from_raw_mode(mode & !umask & 0o7777))
                })
                .map_err(errno)?;
            let created = File::from(fd);
            let a = self.settle_new(req, &p, self.entry(parent, name)?, mode & !umask)?;
            let i = self.inode(a.ino)?;
            let inode = Arc::clone(&i.inode);
            let mut slot = i.backing.lock().unwrap_or_else(|p| p.into_inner());
            let shared = if pt {
                self.passthrough(&mut slot, || Some(created), |f| reply.open_backing(f))
            } else {
                Err(Some(created))
            };
            let (file, mode, shared) = match shared {
                Ok(p) => (
                    HandleFile::Shared(Arc::clone(&p)),
                    IoMode::Passthrough,
                    Some(p),
                ),
                Err(f) => {
                    let f = match f {
                        Some(f) => f,
                        None => self.own_file(&i, flags)?,
                    };
                    let mode = if pt { IoMode::Direct } else { IoMode::Cached };
                    (HandleFile::Own(f), mode, None)
                }
            };
            slot.modes.opened(mode);
            drop(slot);
            let fh = self.keep(file, inode, a.ino.0, mode, is_write(flags), req.pid());
            Ok((a, fh, shared))
        };
        match run() {
            Ok((a, fh, Some(p))) => reply.created_passthrough(
                &self.ttl,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
                &p.id,
            ),
            Ok((a, fh, None)) if self.sh.passthrough.load(Ordering::Relaxed) => reply.created(
                &self.ttl,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Ok((a, fh, None)) => reply.created(
                &self.ttl,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _g = self.sh.gate.enter();
        let r = self.with_file(fh, |f| {
            rustix::fs::fallocate(
                f,
                rustix::fs::FallocateFlags::from_bits_retain(mode as _),
                offset,
                length,
            )
            .map_err(errno)
        });
        answer(reply, r)
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _g = self.sh.gate.enter();
        let r = self.with_file(fh, |f| {
            let pos = match whence {
                0 => rustix::fs::SeekFrom::Start(offset as u64),
                2 => rustix::fs::SeekFrom::End(offset),
                3 => rustix::fs::SeekFrom::Data(offset as u64),
                4 => rustix::fs::SeekFrom::Hole(offset as u64),
                _ => return Err(Errno::EINVAL),
            };
            rustix::fs::seek(f, pos).map_err(errno)
        });
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(e),
        }
    }
}

impl OverlayFs {
    /// Create entry `name` in `parent` with `make` (mknod, mkdir, symlink,
    /// link) and answer with what it became. The entry is marked dirty
    /// before it exists: a capture may look for nothing, never miss it.
    /// `new` says who asked and with which mode, for [`Self::settle_new`]
    /// (`None` for a hard link: the inode is not new).
    fn make_entry(
        &self,
        new: Option<(&Request, u32)>,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEntry,
        make: impl FnOnce(&Live, &mut Mutation<'_>) -> Result<(), Errno>,
    ) {
        let _g = self.sh.gate.enter();
        let run = || -> Result<FileAttr, Errno> {
            if self.sh.hidden(parent, name) {
                return Err(Errno::EACCES);
            }
            let p = self.inode(parent)?;
            let mut m = self.sh.mutation();
            self.sh.mark_entry(&mut m, parent.0, name);
            make(&p, &mut m)?;
            let a = self.entry(parent, name)?;
            match new {
                Some((req, mode)) => self.settle_new(req, &p, a, mode),
                None => Ok(a),
            }
        };
        match run() {
            Ok(a) => reply.entry(&self.ttl, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// Give a new entry to the user who made it, with the mode they asked
    /// for. A daemon running as root (`sudo rewind mount .`, whose mount
    /// the workspace's users work in, D124) created every file and
    /// directory as root: the user's `mkdir -p a/b` failed at `b`, their
    /// `>>` to a file they had just made failed, and the files stayed
    /// root's after `unmount`. The daemon's own umask also took bits off
    /// a mode the kernel had already masked with the caller's umask.
    /// The group is the caller's, unless the parent directory is setgid
    /// (the kernel gave the parent's group). Done through the new inode's
    /// own fd, never by name: nothing swapped in meanwhile is touched.
    /// Returns the attributes the caller should be answered with.
    fn settle_new(
        &self,
        req: &Request,
        parent: &Live,
        a: FileAttr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let maker = self.sh.maker;
        let give = maker.root && req.uid() != 0 && a.uid != req.uid();
        let is_link = a.kind == FileType::Symlink;
        let want = mode & 0o7777;
        let cut = !is_link && want & maker.umask != 0;
        if !give && !cut {
            return Ok(a);
        }
        let i = self.inode(a.ino)?;
        let parent_setgid = inodes::statx_fd(&parent.fd).map_err(errno)?.stx_mode & 0o2000 != 0;
        if give {
            rustix::fs::chownat(
                &i.fd,
                "",
                Some(rustix::fs::Uid::from_raw(req.uid())),
                (!parent_setgid).then(|| rustix::fs::Gid::from_raw(req.gid())),
                AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(errno)?;
        }
        // A chown clears setuid and setgid on a file: the mode goes on
        // after it, as the kernel would have made it. A directory keeps
        // the setgid it inherited; a file does not get setgid for a group
        // it inherited from its parent, which the caller may not be in.
        if !is_link && (cut || (give && want & 0o6000 != 0)) {
            let keep = match a.kind {
                FileType::Directory if parent_setgid => want | 0o2000,
                FileType::Directory => want,
                _ if give && parent_setgid && a.gid != req.gid() => want & !0o2000,
                _ => want,
            };
            rustix::fs::chmod(proc_path(&i.fd).as_str(), Mode::from_raw_mode(keep))
                .map_err(errno)?;
        }
        self.getattr_of(a.ino.0, &i)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, flags: AtFlags, reply: ReplyEmpty) {
        let _g = self.sh.gate.enter();
        let run = || -> Result<(), Errno> {
            if self.sh.hidden(parent, name) {
                return Err(Errno::ENOENT);
            }
            let p = self.inode(parent)?;
            let mut m = self.sh.mutation();
            self.sh.mark_entry(&mut m, parent.0, name);
            // A checkpoint may take the set here (an unlink waiting for
            // the inode lock behind a long read): `m` marks again.
            (self.failpoint)("fuse:remove-marked");
            // Held from now on (no name will lead to it): a process that
            // has it open or as its cwd can still use it (D65).
            self.sh.inodes.hold(parent.0, name);
            rustix::fs::unlinkat(&p.fd, name, flags).map_err(errno)?;
            self.sh.inodes.unlinked(parent.0, name);
            Ok(())
        };
        answer(reply, run())
    }
}
