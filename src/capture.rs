//! The `walk` engine's change detection: a parallel, fd-relative walk that
//! stats every entry and hashes only what the stat cache cannot vouch for.
//!
//! The stat cache is git-index-like: per directory, the (ino, mode, size,
//! mtime, ctime) of each entry when it was last hashed, aligned with the
//! tree node that holds its hash. A row stores only the inode, ctime and
//! racy flag per entry; the rest is the node's, read from `trees` with the
//! row (D180). The device is not compared: a walk never
//! crosses into another filesystem, and a btrfs snapshot of the workspace
//! has its own device number but the same inodes and ctimes, so the cache
//! built from one snapshot vouches for the next (and for the live tree). An entry whose ctime is not older than
//! the start of the capture that cached it is "racy" (it could change again
//! within the same timestamp tick without the stat changing), so it is
//! re-hashed next time. ctime, not mtime: user space cannot set ctime, and
//! an xattr or chmod change moves it too.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;
use rewind_platform::{Dir, EntryKind, Meta, StatBeneath, Xattr};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::objects::{ObjectStore, Stored, hash_reader};
use crate::progress::Progress;
use crate::tree::{Entry, Kind, Node, Reader, SharedNode, Target, put_varint, unzigzag, zigzag};

pub const STATE_DIR: &str = ".rewind";
/// `rewind.toml` at the workspace root: hook and effect rules (`crate::hooks`).
pub const CONFIG_FILE: &str = "rewind.toml";
pub const IGNORE_FILE: &str = ".rewindignore";

/// Directories nested deeper than this below the workspace root are not
/// captured: each is skipped and reported, and a rewind keeps it (D143).
/// A runaway script makes a tree thousands of levels deep in a second; the
/// walk recurses once per level, and past ~600 levels it overflowed a
/// 2 MiB thread stack, so `status`, `checkpoint` and the rewind that would
/// undo the damage all aborted (D166). No real project nests this deep
/// (a path of 1,024 one-letter directories is already half of PATH_MAX).
pub const MAX_DEPTH: usize = 1024;

/// Stack of each thread a capture runs on: the walk at [`MAX_DEPTH`] uses
/// ~4 MiB (measured ~3.5 KiB a level). Reserved address space; only the
/// pages a deep walk touches are ever backed by memory.
const WALK_STACK: usize = 64 << 20;

/// Threads a walk keeps busy even with fewer cores (D345). A walk mostly
/// waits on the device when the cache is cold (after a reboot, a clone,
/// another job's reading): each stat and each small file's read is a
/// trip to it, and one thread per core kept two in flight on two cores.
/// Eight cut a first checkpoint of 50,000 cold small files from 2.65 s
/// to 2.05; warm, the time is the same.
const WALK_THREADS_AT_LEAST: usize = 8;

/// Descriptors each walking thread beyond one per core must leave spare:
/// a thread holds one per directory level it is in plus the file it
/// reads, and a process under a low hard limit (D268, D321) keeps the
/// one per core it always had.
const FDS_PER_EXTRA_WALK_THREAD: u64 = 128;

/// How many threads the walk runs on: one per core, and more up to
/// [`WALK_THREADS_AT_LEAST`] while the open-file limit leaves room.
fn walk_threads(cores: usize, fd_headroom: Option<u64>) -> usize {
    let room = fd_headroom.map_or(0, |h| h / FDS_PER_EXTRA_WALK_THREAD);
    let extra = WALK_THREADS_AT_LEAST.saturating_sub(cores);
    cores + extra.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// The threads every capture runs on (its calling thread's stack, 2 MiB
/// for a spawned thread, is not the walk's to assume), made at the first
/// capture of a process so a command that captures nothing starts none.
fn walk_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(walk_threads(cores, rewind_platform::fd_headroom()))
            .stack_size(WALK_STACK)
            .thread_name(|i| format!("rewind-walk-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// How many directories deep `rel` (workspace-relative, `a/b` is 2) is.
fn depth_of(rel: &[u8]) -> usize {
    if rel.is_empty() {
        0
    } else {
        rel.iter().filter(|&&c| c == b'/').count() + 1
    }
}

/// One record of the stat cache: the tree entry as last captured plus the
/// stat fields that vouch for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRec {
    pub entry: Entry,
    pub ino: u64,
    pub ctime_ns: i64,
    pub racy: bool,
}

/// A file a rewind put in place, with its stat once there (D275). The
/// stat cache has no record of it (it is a new inode), so without this
/// every `status` until the next checkpoint read it in full again (4-6 s
/// for a 5 GiB file), and so did the next checkpoint.
///
/// The apply recorded it only if its mtime was still the one the apply
/// gave it (one no other file has: nothing wrote it since), from a stat
/// taken once the filesystem clock had passed its ctime: any change
/// since moves the ctime past the one recorded, as for a stat-cache
/// record (`crate::apply::Restoring`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub hash: Hash,
}

impl Restored {
    pub fn vouches_for(&self, m: &Meta) -> bool {
        m.kind == EntryKind::File
            && m.ino == self.ino
            && m.size == self.size
            && m.mtime_ns == self.mtime_ns
            && m.ctime_ns == self.ctime_ns
    }
}

/// What the last rewind restored, by workspace-relative path.
pub type RestoredFiles = HashMap<Vec<u8>, Restored>;

/// A stat-cache row written since D180 starts with this, then holds per
/// entry of its node, in the node's order, only the fields that vouch for
/// it: the entries themselves are the node's, read from `trees` with the
/// row. Rows without it hold the entries too (D23's format) and still read.
const STATS_MAGIC: &[u8; 4] = b"RWS2";

impl CacheRec {
    fn new(entry: Entry, m: &Meta, clock_ns: i64) -> CacheRec {
        CacheRec {
            entry,
            ino: m.ino,
            ctime_ns: m.ctime_ns,
            racy: m.ctime_ns >= clock_ns,
        }
    }

    /// The cache vouches for an entry when nothing in its stat moved and it
    /// was not racy when cached. A directory's size is not compared (it
    /// changes with its entries, which are walked anyway).
    pub fn vouches_for(&self, m: &Meta) -> bool {
        self.vouches_for_times(m) && (m.kind == EntryKind::Dir || self.entry.size == m.size)
    }

    /// [`CacheRec::vouches_for`] without the size, for an XFS bulk stat: it
    /// reports the size on disk, which lags a write until writeback (so
    /// every file written in the last ~30 s would look changed), while
    /// its times are current. Nothing changes a file's size without
    /// moving its ctime.
    pub fn vouches_for_times(&self, m: &Meta) -> bool {
        let kind_matches = matches!(
            (self.entry.kind(), m.kind),
            (Kind::File, EntryKind::File)
                | (Kind::Dir, EntryKind::Dir)
                | (Kind::Symlink, EntryKind::Symlink)
        );
        !self.racy
            && kind_matches
            && self.ino == m.ino
            && self.entry.mode == m.mode
            && self.entry.mtime_ns == m.mtime_ns
            && self.ctime_ns == m.ctime_ns
    }

    /// A row's stats: [`STATS_MAGIC`], then per record its inode, its
    /// ctime as a distance from its mtime (0 for a file written and not
    /// touched since: one byte) and its racy flag. A T1 directory of 100
    /// files is ~1 KiB, where the entries repeated were ~9 KiB: three pages
    /// rewritten per changed directory per checkpoint, now one.
    fn encode_all<'r>(recs: impl ExactSizeIterator<Item = &'r CacheRec>) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + recs.len() * 12);
        out.extend_from_slice(STATS_MAGIC);
        for r in recs {
            put_varint(&mut out, r.ino);
            put_varint(&mut out, zigzag(r.ctime_ns.wrapping_sub(r.entry.mtime_ns)));
            out.push(r.racy as u8);
        }
        out
    }

    /// The records of a row: `stats` zipped with the entries of `node`
    /// (the row's node as stored in `trees`, which must hash to
    /// `node_hash`), or a D23 row's self-contained records. `None` for
    /// anything that does not decode or does not match its node.
    fn decode_all(node_hash: &Hash, node: &[u8], stats: &[u8]) -> Option<Vec<CacheRec>> {
        let Some(stats) = stats.strip_prefix(STATS_MAGIC) else {
            let recs = Self::decode_self_contained(stats)?;
            let encoded = Node::encode_entries(recs.iter().map(|r| &r.entry));
            return (Node::hash_of_encoding(&encoded) == *node_hash).then_some(recs);
        };
        let canonical = Node::canonical_from_stored(node).ok()?;
        if Node::hash_of_encoding(&canonical) != *node_hash {
            return None;
        }
        let entries = Node::decode(&canonical).ok()?.entries;
        let mut r = Reader { b: stats };
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let ino = r.varint().ok()?;
            let ctime_ns = entry.mtime_ns.wrapping_add(unzigzag(r.varint().ok()?));
            let racy = match r.u8().ok()? {
                0 => false,
                1 => true,
                _ => return None,
            };
            out.push(CacheRec {
                entry,
                ino,
                ctime_ns,
                racy,
            });
        }
        r.b.is_empty().then_some(out)
    }

    /// A row in D23's format: each record the full entry, then the device
    /// (no longer used), inode, ctime and racy flag.
    fn decode_self_contained(bytes: &[u8]) -> Option<Vec<CacheRec>> {
        let mut r = Reader { b: bytes };
        let mut out: Vec<CacheRec> = Vec::new();
        while !r.b.is_empty() {
            let entry = Entry::decode_from(&mut r).ok()?;
            if out.last().is_some_and(|p| p.entry.name >= entry.name) {
                return None;
            }
            let _dev = r.u64().ok()?;
            let ino = r.u64().ok()?;
            let ctime_ns = r.u64().ok()? as i64;
            let racy = r.u8().ok()? != 0;
            out.push(CacheRec {
                entry,
                ino,
                ctime_ns,
                racy,
            });
        }
        Some(out)
    }
}

/// The previous capture of one directory.
pub struct CachedDir {
    pub node_hash: Hash,
    pub recs: Vec<CacheRec>,
}

impl CachedDir {
    /// The node the row describes: its records' entries, which
    /// [`CacheRec::decode_all`] checked hash to it.
    fn node(&self) -> (Hash, SharedNode) {
        let entries = self.recs.iter().map(|r| r.entry.clone()).collect();
        (self.node_hash, SharedNode::new(Node { entries }))
    }

    fn lookup(&self, name: &[u8]) -> Option<&CacheRec> {
        let i = self
            .recs
            .binary_search_by(|r| r.entry.name.as_slice().cmp(name))
            .ok()?;
        self.recs.get(i)
    }
}

/// A stat-cache row, decoded on first use by whichever walker thread
/// reaches its directory: decoding is spread over the pool and skipped for
/// directories that are gone.
pub struct LazyDir {
    node_hash: Hash,
    node: Vec<u8>,
    stats: Vec<u8>,
    /// Its listing skipped an entry, which no record holds (D235).
    skips: bool,
    decoded: OnceLock<Option<CachedDir>>,
}

impl LazyDir {
    /// The decoded records, or `None` when the row does not decode or its
    /// records do not hash to its node (then the directory is walked as if
    /// uncached: the cache is an accelerator, never the source of truth).
    fn get(&self) -> Option<&CachedDir> {
        self.decoded
            .get_or_init(|| {
                let recs = CacheRec::decode_all(&self.node_hash, &self.node, &self.stats)?;
                Some(CachedDir {
                    node_hash: self.node_hash,
                    recs,
                })
            })
            .as_ref()
    }

    /// Whether the directory's last listing skipped an entry (D235).
    pub(crate) fn skips(&self) -> bool {
        self.skips
    }
}

pub type StatCache = HashMap<Vec<u8>, LazyDir>;

/// A stat-cache row as the ledger gives it, with its node.
pub struct StatCacheRow {
    pub dir: Vec<u8>,
    pub node_hash: Hash,
    /// The node as `trees` stores it.
    pub node: Vec<u8>,
    pub stats: Vec<u8>,
    /// Its listing skipped an entry (D235).
    pub skips: bool,
}

pub fn load_stat_cache(rows: Vec<StatCacheRow>) -> StatCache {
    rows.into_iter()
        .map(|row| {
            (
                row.dir,
                LazyDir {
                    node_hash: row.node_hash,
                    node: row.node,
                    stats: row.stats,
                    skips: row.skips,
                    decoded: OnceLock::new(),
                },
            )
        })
        .collect()
}

/// What a change tracker (the FUSE daemon) saw change since the stat cache
/// was written: per directory, the names of the entries that changed (or
/// all of them). A scoped capture lists only these directories and their
/// ancestors, stats only the changed names (and subdirectories it descends
/// into), and takes everything else from the stat cache without a
/// syscall, which makes a checkpoint O(changed).
#[derive(Debug, Default, Clone)]
pub struct Scope {
    /// Directories whose entries changed: `Some(names)`, or `None` when
    /// any entry may have.
    dirty: HashMap<Vec<u8>, Option<HashSet<Vec<u8>>>>,
    /// Directories walked in full: an ignore file changed there, which can
    /// change what is captured anywhere below.
    deep: HashSet<Vec<u8>>,
    /// Every ancestor of the above: listed to rebuild their nodes.
    spine: HashSet<Vec<u8>>,
    /// The three sets above by parent directory: whether an entry must be
    /// listed is one lookup of its name, not a joined path hashed three
    /// times (a 4,700-entry ancestor did that for every entry).
    listed_children: Children,
    /// Directories listed again whatever changed, their names not taken
    /// from the cache: their last listing skipped an entry, which no
    /// cached record holds, and which is reported only when seen (D235).
    relist: HashSet<Vec<u8>>,
    /// Every inode that changed, where the source names them all (btrfs
    /// knows each inode item written since a transaction). Then an entry
    /// of a changed directory is unchanged if its inode is not among them
    /// and the cache holds that same inode under that name: a directory
    /// that gained one file is listed, not stat'ed entry by entry.
    inodes: Option<HashSet<u64>>,
}

/// Files the store copies are written back before they are read up to
/// this size (D254): a bigger one's writeback would be most of a
/// checkpoint's time on ext4, where nothing is cloned.
const WRITE_BACK_MAX: u64 = 8 << 20;

/// How many times a file is copied while it keeps changing under the copy
/// before what was read last is kept ([`Capture::unsettled`]). A clone is one
/// instant and needs none of it; a copy takes as long as its bytes do,
/// and a SQLite database copied during a commit is malformed.
pub const READS_OF_A_CHANGING_FILE: u32 = 4;

/// A file bigger than this that changed while it was copied is kept as
/// read, and said, without reading it again.
const REREAD_MAX: u64 = 64 << 20;

/// A file with more holes than this (its size less what it allocates) is
/// left out, and said: its holes are hashed as the zeros they read as,
/// about a second per GiB, and `truncate -s 1E` made a checkpoint run for
/// ever while every other command waited on its lock (helper-90). A
/// sparse disk image of 16 GiB still takes ~15 s (D343).
pub const MAX_HOLE_BYTES: u64 = 16 << 30;

/// How long hashing `bytes` of zeros takes, said the way people say it.
fn roughly_at_a_gib_a_second(bytes: u64) -> String {
    match bytes >> 30 {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} minutes", s / 60),
        s if s < 2 * 86_400 => format!("{} hours", s / 3600),
        s if s < 2 * 365 * 86_400 => format!("{} days", s / 86_400),
        s => format!("{} years", s / (365 * 86_400)),
    }
}

/// A scope naming at most this many directories and entries is small
/// ([`Scope::is_small`]).
const SMALL_SCOPE: usize = 64;

/// In a small scope, a directory's work goes to the pool only when it
/// reads at least this much: hashing it takes longer than waking threads.
const POOL_WORTH_BYTES: u64 = 1 << 20;

/// Paths grouped by parent directory: `a/b/c` puts `a` under ``, `b`
/// under `a` and `c` under `a/b`.
type Children = HashMap<Vec<u8>, HashSet<Vec<u8>>>;

fn children_of<'p>(paths: impl Iterator<Item = &'p [u8]>) -> Children {
    let mut out = Children::new();
    for p in paths {
        add_steps(&mut out, p);
    }
    out
}

/// Put every step of `path` under its parent in `children`, bottom up,
/// stopping at the first step already there: every step above it was
/// added with it. Top down, each path re-hashed all its ancestors, cubic
/// in a deep chain's path length (500 levels of 255-byte names: 1.4 s of
/// a no-change `status`, D226).
fn add_steps(children: &mut Children, mut path: &[u8]) {
    while !path.is_empty() {
        let (parent, name) = split_parent(path);
        let names = match children.get_mut(parent) {
            Some(names) => names,
            None => children.entry(parent.to_vec()).or_default(),
        };
        if !names.insert(name.to_vec()) {
            break;
        }
        path = parent;
    }
}

/// Put `path` and its ancestors in `set`, bottom up, as far as the first
/// one already there (see [`add_steps`]); the root (`""`) is left out.
fn add_with_ancestors(set: &mut HashSet<Vec<u8>>, mut path: &[u8]) {
    while !path.is_empty() && set.insert(path.to_vec()) {
        path = split_parent(path).0;
    }
}

/// A [`Scope`] seen from one directory ([`Scope::at`]).
struct DirScope<'a> {
    dirty: Option<&'a Option<HashSet<Vec<u8>>>>,
    listed: Option<&'a HashSet<Vec<u8>>>,
    inodes: Option<&'a HashSet<u64>>,
}

impl DirScope<'_> {
    /// Whether entry `name` must be looked at (stat, and hashed if the
    /// stat moved): it changed, or it is a directory the capture descends
    /// into (its mtime moves with its entries). `ino` is the entry's
    /// inode as listed, `cached_ino` the one the cache holds under its
    /// name.
    fn looks_at(&self, name: &[u8], ino: u64, cached_ino: u64) -> bool {
        let changed = match self.dirty {
            Some(None) => self
                .inodes
                .is_none_or(|changed| ino != cached_ino || changed.contains(&ino)),
            Some(Some(names)) => names.contains(name),
            None => false,
        };
        changed || self.listed.is_some_and(|l| l.contains(name))
    }
}

/// A [`Scope`] built from what a change source names (btrfs's change list,
/// a bulk stat), one directory or entry at a time.
#[derive(Default)]
pub struct ScopeBuilder {
    dirty: HashMap<Vec<u8>, Option<HashSet<Vec<u8>>>>,
    deep: HashSet<Vec<u8>>,
    inodes: Option<HashSet<u64>>,
}

impl ScopeBuilder {
    /// Any entry of `dir` may have changed: it is listed in full.
    pub fn dir_changed(&mut self, dir: Vec<u8>) {
        self.dirty.insert(dir, None);
    }

    /// Entry `name` of `dir` changed. A changed `.rewindignore` changes
    /// what is captured anywhere below: its directory is walked in full.
    pub fn entry_changed(&mut self, dir: &[u8], name: &[u8]) {
        if name == IGNORE_FILE.as_bytes() {
            self.deep.insert(dir.to_vec());
        }
        if let Some(names) = self
            .dirty
            .entry(dir.to_vec())
            .or_insert_with(|| Some(HashSet::new()))
        {
            names.insert(name.to_vec());
        }
    }

    /// `inodes` is every inode that changed, with nothing left out (see
    /// `Scope::inodes`).
    pub fn all_changed_inodes(&mut self, inodes: HashSet<u64>) {
        self.inodes = Some(inodes);
    }

    pub fn build(self) -> Scope {
        let mut scope = Scope::new(self.dirty, self.deep);
        scope.inodes = self.inodes;
        scope
    }
}

impl Scope {
    /// The directories this scope names changes in that `taken` does not
    /// (or names other changes in): what changed after `taken` was taken
    /// from the same tracker, which keeps the taken set in what it shows.
    pub fn changes_beyond(&self, taken: &Scope) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = self
            .dirty
            .iter()
            .filter(|(dir, names)| taken.dirty.get(*dir) != Some(*names))
            .map(|(dir, _)| dir.clone())
            .collect();
        out.extend(self.deep.difference(&taken.deep).cloned());
        out
    }

    pub fn new(dirty: HashMap<Vec<u8>, Option<HashSet<Vec<u8>>>>, deep: HashSet<Vec<u8>>) -> Scope {
        let mut spine = HashSet::new();
        spine.insert(Vec::new());
        for d in dirty.keys().chain(deep.iter()) {
            add_with_ancestors(&mut spine, split_parent(d).0);
        }
        let listed_children = children_of(
            dirty
                .keys()
                .chain(deep.iter())
                .chain(spine.iter())
                .map(Vec::as_slice),
        );
        Scope {
            dirty,
            deep,
            spine,
            listed_children,
            relist: HashSet::new(),
            inodes: None,
        }
    }

    /// List `dirs` too, by `getdents`, each with its ancestors: what their
    /// last listing skipped is seen, and reported, again. Without them, a
    /// checkpoint whose scope left such a directory alone recorded no
    /// skip, and a rewind to it deleted what had been skipped once it was
    /// readable (D143's loss, through a scope; helper-30, D235).
    pub fn relist(&mut self, dirs: impl IntoIterator<Item = Vec<u8>>) {
        for d in dirs {
            if !self.relist.insert(d.clone()) {
                continue;
            }
            add_with_ancestors(&mut self.spine, &d);
            add_steps(&mut self.listed_children, &d);
        }
    }

    /// What the scope says about the entries of directory `rel`, looked up
    /// once for all of them.
    fn at(&self, rel: &[u8]) -> DirScope<'_> {
        DirScope {
            dirty: self.dirty.get(rel),
            listed: self.listed_children.get(rel),
            inodes: self.inodes.as_ref(),
        }
    }

    /// The directory must be listed (it or something below it changed).
    fn lists(&self, rel: &[u8]) -> bool {
        self.dirty.contains_key(rel) || self.spine.contains(rel) || self.deep.contains(rel)
    }

    /// Whether the entries of listed directory `rel` are the cached ones
    /// except those the scope names: it is listed only for some entries,
    /// or only as an ancestor of a change. Every source of a scope marks
    /// a directory whole when an entry may have been added, removed or
    /// renamed without being named (the mount names every one; a bulk
    /// stat and btrfs see the directory's own stat move), so such a
    /// directory needs no `getdents`: its cached row lists it.
    fn entries_known(&self, rel: &[u8]) -> bool {
        if self.relist.contains(rel) {
            return false;
        }
        match self.dirty.get(rel) {
            Some(names) => names.is_some(),
            None => self.spine.contains(rel),
        }
    }

    /// The entries of `rel` the scope names (none for a directory that is
    /// only an ancestor of a change).
    fn named(&self, rel: &[u8]) -> impl Iterator<Item = &[u8]> {
        self.dirty
            .get(rel)
            .into_iter()
            .flatten()
            .flatten()
            .map(Vec::as_slice)
    }

    /// Whether a capture with this scope is small enough to run on the
    /// calling thread: no directory walked in full, and few directories
    /// and entries named. Waking the pool cost a ten-edit checkpoint
    /// through the mount ~0.4 ms of its ~6.5 (D88); the work it shared was
    /// a few stats and small reads.
    fn is_small(&self) -> bool {
        let named: usize = self.dirty.values().flatten().map(HashSet::len).sum();
        self.deep.is_empty() && self.dirty.len() <= SMALL_SCOPE && named <= SMALL_SCOPE
    }

    /// How much the scope names: directories listed with every entry
    /// looked at, directories listed for some entries, entries named.
    /// Counted only when displayed (a trace note that is off costs nothing).
    pub fn summary(&self) -> impl std::fmt::Display + '_ {
        struct Summary<'a>(&'a Scope);
        impl std::fmt::Display for Summary<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let dirty = &self.0.dirty;
                let whole = dirty.values().filter(|n| n.is_none()).count();
                let named: usize = dirty.values().flatten().map(HashSet::len).sum();
                write!(
                    f,
                    "{whole} directories looked at whole, {} for {named} entries, {} walked in full",
                    dirty.len() - whole,
                    self.0.deep.len()
                )
            }
        }
        Summary(self)
    }

    /// The stat-cache rows the capture needs: the listed directories, and
    /// whole subtrees walked in full.
    pub fn rows(&self) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut dirs: Vec<Vec<u8>> = self
            .dirty
            .keys()
            .chain(self.spine.iter())
            .cloned()
            .collect();
        dirs.sort();
        dirs.dedup();
        (dirs, self.deep.iter().cloned().collect())
    }
}

/// A short key for the ignore rules kept outside the tree
/// (`.rewind/ignore`): a scope says what changed in the tree, not in the
/// rules, so it is only used under the rules the cache was written with.
pub fn rules_key(rules: Option<&str>) -> String {
    crate::hash::hex(&Hash::of(rules.unwrap_or_default().as_bytes()).0[..8])
}

/// The inode of every cached entry, sorted (rows decoded in parallel; the
/// walk reuses them).
pub fn cached_inodes(cache: &StatCache) -> Vec<u64> {
    let mut inos: Vec<u64> = cache
        .par_iter()
        .flat_map_iter(|(_, row)| {
            row.get()
                .into_iter()
                .flat_map(|d| d.recs.iter().map(|r| r.ino))
        })
        .collect();
    inos.par_sort_unstable();
    inos
}

/// The scope of a capture given the current stat of every inode the cache
/// knows (an XFS bulk stat of their chunks, D60/D76; sorted by inode;
/// sizes are not compared, [`CacheRec::vouches_for_times`]), against the
/// stat cache: a cached
/// directory whose own stat moved is listed in full (entries added,
/// removed or renamed move it); an entry whose stat moved, or a
/// subdirectory without a row, is looked at; a changed `.rewindignore`
/// makes its directory walked in full. The root's own stat is in no row,
/// so the root is always listed.
pub fn scope_from_stats(cache: &StatCache, stats: &[Meta]) -> Scope {
    let vouched = |rec: &CacheRec| {
        stats
            .binary_search_by_key(&rec.ino, |m| m.ino)
            .is_ok_and(|i| rec.vouches_for_times(&stats[i]))
    };
    // Each row judged on its own, in parallel (a million entries' lookups
    // took 135 ms on one thread); the scope built from the verdicts.
    let verdicts: Vec<RowVerdict<'_>> = cache
        .par_iter()
        .map(|(rel, row)| {
            let Some(dir) = row.get() else {
                return RowVerdict::listed(rel, Vec::new());
            };
            if !rel.is_empty() {
                let (parent, name) = split_parent(rel);
                let own = cache
                    .get(parent)
                    .and_then(LazyDir::get)
                    .and_then(|p| p.lookup(name));
                if !own.is_some_and(vouched) {
                    // Listed in full, its rule file is not looked at one
                    // by one: changed or gone, it still changes what is
                    // captured below (helper-78; one added is seen by the
                    // walk).
                    let rules = dir
                        .lookup(IGNORE_FILE.as_bytes())
                        .filter(|rec| !vouched(rec))
                        .map(|_| IGNORE_FILE.as_bytes());
                    return RowVerdict::listed(rel, rules.into_iter().collect());
                }
            }
            let entries = dir
                .recs
                .iter()
                .filter(|rec| {
                    let uncached_dir = rec.entry.kind() == Kind::Dir
                        && !cache.contains_key(&join(rel, &rec.entry.name));
                    uncached_dir || !vouched(rec)
                })
                .map(|rec| rec.entry.name.as_slice())
                .collect();
            RowVerdict {
                dir: rel,
                listed: false,
                entries,
            }
        })
        .collect();
    let mut scope = ScopeBuilder::default();
    scope.dir_changed(Vec::new());
    for v in verdicts {
        if v.listed {
            scope.dir_changed(v.dir.clone());
        }
        for name in v.entries {
            scope.entry_changed(v.dir, name);
        }
    }
    scope.build()
}

/// What one stat-cache row says against a bulk stat: whether its
/// directory is listed in full, and which of its entries are looked at.
struct RowVerdict<'c> {
    dir: &'c Vec<u8>,
    listed: bool,
    entries: Vec<&'c [u8]>,
}

impl<'c> RowVerdict<'c> {
    fn listed(dir: &'c Vec<u8>, entries: Vec<&'c [u8]>) -> RowVerdict<'c> {
        RowVerdict {
            dir,
            listed: true,
            entries,
        }
    }
}

/// What a mount saw of files opened for writing, by workspace-relative
/// path (D247). A write through a shared mapping moves a file's times
/// only when its page first becomes writable: read while such a write
/// was still dirty, the page stayed writable, later writes through it
/// moved nothing, and the stat cache vouched for a file that had changed
/// (helper-36). Where no mount says, nothing is known (the walk engine's
/// known limit).
#[derive(Default)]
pub struct Writers {
    /// Opened for writing since the last capture, by parent directory
    /// (looked up for every entry a capture classifies, without joining
    /// its path): read again whatever the stat cache says, unless the
    /// store clones them (a clone writes a file's pages back first, which
    /// write-protects them).
    since: Children,
    /// Open for writing now: their writeback is started before they are
    /// read, so that the next write through a mapping moves their times.
    open: HashSet<Vec<u8>>,
}

impl Writers {
    pub fn new(since: HashSet<Vec<u8>>, open: HashSet<Vec<u8>>) -> Writers {
        let mut by_parent = Children::new();
        for p in &since {
            let (parent, name) = split_parent(p);
            by_parent
                .entry(parent.to_vec())
                .or_default()
                .insert(name.to_vec());
        }
        Writers {
            since: by_parent,
            open,
        }
    }

    /// Whether entry `name` of `rel` was opened for writing since the
    /// last capture.
    fn since(&self, rel: &[u8], name: &[u8]) -> bool {
        self.since.get(rel).is_some_and(|n| n.contains(name))
    }

    fn is_open(&self, path: &[u8]) -> bool {
        !self.open.is_empty() && self.open.contains(path)
    }
}

/// What guides a capture besides the stat cache.
#[derive(Clone, Copy)]
pub enum Guide<'a> {
    /// Stat everything.
    None,
    /// `root` is a btrfs snapshot of this tree (see [`capture`]).
    Mirror(&'a Dir),
    /// Only these directories changed (see [`Scope`]); stats of what the
    /// scope looks at come from the mirror when it vouches for them.
    Scope(&'a Scope, Option<&'a Dir>),
}

/// Something the capture saw and deliberately left out.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub path: String,
    /// The exact name when it is not UTF-8 (`path` is then lossy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    pub reason: String,
}

impl Skipped {
    pub fn new(path: &[u8], reason: impl Into<String>) -> Skipped {
        Skipped {
            path: display_path(path),
            path_hex: hex_unless_utf8(path),
            reason: reason.into(),
        }
    }

    /// The path's exact bytes.
    pub fn path_bytes(&self) -> Cow<'_, [u8]> {
        match self.path_hex.as_deref().and_then(crate::hash::unhex) {
            Some(b) => Cow::Owned(b),
            None => Cow::Borrowed(self.path.as_bytes()),
        }
    }
}

/// A path's bytes in hex when they are not UTF-8: JSON output carries
/// them beside the lossy `path`, so that two names differing only in
/// invalid bytes stay two names to a machine (D128).
pub fn hex_unless_utf8(path: &[u8]) -> Option<String> {
    std::str::from_utf8(path)
        .is_err()
        .then(|| crate::hash::hex(path))
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CaptureStats {
    pub entries: u64,
    pub files_hashed: u64,
    pub bytes_hashed: u64,
    /// Files the last rewind restored, taken as it wrote them instead of
    /// read again (D275).
    pub files_known_restored: u64,
    pub bytes_new: u64,
    /// Files stored as reflink clones.
    pub cloned: u64,
    /// Files copied into `.rewind/objects/`.
    pub copied: u64,
    /// Small files stored in the ledger.
    pub inlined: u64,
}

/// A captured tree: the root hash plus everything needed to persist it.
#[derive(Default)]
pub struct Capture {
    pub root: Hash,
    /// Nodes that may not be in the ledger yet, with their hash.
    pub new_nodes: Vec<(Hash, SharedNode)>,
    /// The nodes the new ones replace, rebuilt from the stat-cache rows the
    /// capture read and checked against their hash: the other side of the
    /// diff against the tree the cache described (HEAD, after a
    /// checkpoint), which then reads none of them from the ledger.
    pub replaced_nodes: Vec<(Hash, SharedNode)>,
    /// Stat-cache rows to write: (dir, node, stats, whether its listing
    /// skipped an entry).
    pub cache_updates: Vec<(Vec<u8>, Hash, Vec<u8>, bool)>,
    /// Stat-cache rows of directories that are gone.
    pub cache_removals: Vec<Vec<u8>>,
    /// Directories gone with everything below them: a scoped capture does
    /// not load the rows below, so it removes them by prefix.
    pub cache_removed_trees: Vec<Vec<u8>>,
    pub skipped: Vec<Skipped>,
    pub stats: CaptureStats,
    /// Small objects to store in the same transaction as the capture.
    pub blobs: Vec<(Hash, Vec<u8>)>,
    /// Chunk lists of the chunked objects it stored (object, manifest).
    pub manifests: Vec<(Hash, Vec<u8>)>,
    /// The capture ignored the stat cache it found (written by the btrfs
    /// engine): its rows replace all of the cache.
    pub replaces_cache: bool,
    /// Captured from a btrfs snapshot with hashing only: the stat-cache
    /// rows it writes vouch for content the object store does not hold.
    pub from_snapshot: bool,
    /// Which snapshot the stat-cache rows describe once written
    /// (`snapshot::STAT_CACHE_TRANSID`); `None` for a live-tree capture.
    pub cache_mark: Option<String>,
    /// `rules_key` of the ignore rules this capture ran under.
    pub cache_rules: Option<String>,
    /// The filesystem clock when the capture started (its racy cut-off).
    pub clock_ns: i64,
    /// Entries whose ctime is at or past [`Clock::report_from_ns`]: (path,
    /// ctime). What may not be durable yet (`crate::durable`).
    pub recent: Vec<(Vec<u8>, i64)>,
    /// Only what a scope named was looked at (the mount's dirty set, an XFS
    /// bulk stat or btrfs's changed inodes): `recent` is not all of it.
    pub scoped: bool,
    /// Object files this capture stored or found stored (whole files,
    /// cloned or copied) and chunk files that may not be durable (D90),
    /// to be made durable before its commit; `None` when only a `syncfs`
    /// covers them (a chunked file with too many, or one found and no
    /// durability mark).
    pub new_objects: Option<Vec<Hash>>,
    /// The durability bookkeeping after this capture (D85), committed with
    /// it when `durable_changed`.
    pub durable: Option<crate::durable::State>,
    pub durable_changed: bool,
    /// Paths the last rewind restored (D275) for which this capture's
    /// stat-cache records now vouch: their rows go when it is persisted.
    pub restored_done: Vec<Vec<u8>>,
    /// Files whose bytes in this capture may not be from one moment with
    /// the rest: copied (no clone) while something wrote them, every one
    /// of [`READS_OF_A_CHANGING_FILE`] times, or changed after they were
    /// read in every round ([`Capture::moved_since_read`]). Said to the
    /// user: a database does not survive that.
    pub unsettled: Vec<Vec<u8>>,
    /// The files whose stat must still hold when the capture is done for
    /// its files to be from one moment, with the stat it read them at.
    settle: Vec<(Vec<u8>, Seen)>,
    /// The object of every file it read and kept (not those of reads it
    /// discarded): see [`Capture::objects_kept`].
    read_objects: Vec<Hash>,
    /// An entry it went to stat or read had gone by then (or was skipped):
    /// what it holds there is of no moment its stats can date.
    lost_sight: bool,
    /// Paths that moved after this capture read them (or, through the
    /// mount, directories that changed meanwhile beyond what it looked
    /// at; `""`: anywhere): it is not of one moment.
    pub moved: Vec<Vec<u8>>,
}

/// A file's stat as a capture saw it before reading it, or a directory's
/// before listing it (its times move when an entry comes or goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    ino: u64,
    ctime_ns: i64,
    mtime_ns: i64,
    /// `None` for a directory, whose size says nothing more.
    size: Option<u64>,
}

impl Seen {
    fn of(r: &CacheRec) -> Seen {
        Seen {
            ino: r.ino,
            ctime_ns: r.ctime_ns,
            mtime_ns: r.entry.mtime_ns,
            size: (r.entry.kind() != Kind::Dir).then_some(r.entry.size),
        }
    }

    fn of_dir(m: &Meta) -> Seen {
        Seen {
            ino: m.ino,
            ctime_ns: m.ctime_ns,
            mtime_ns: m.mtime_ns,
            size: None,
        }
    }

    fn still(&self, m: &Meta) -> bool {
        let kind = match self.size {
            Some(size) => m.kind == EntryKind::File && m.size == size,
            None => m.kind == EntryKind::Dir,
        };
        kind && m.ino == self.ino && m.ctime_ns == self.ctime_ns && m.mtime_ns == self.mtime_ns
    }
}

/// When a capture starts, by the filesystem's clock, and from which ctime
/// on it reports entries in [`Capture::recent`].
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub now_ns: i64,
    pub report_from_ns: Option<i64>,
    /// The store's files with an older ctime are durable (the
    /// workspace's mark, `crate::durable`), if known.
    pub store_durable_below_ns: Option<i64>,
}

impl Capture {
    /// The files this capture read (and, where it stat'ed every entry,
    /// the other files in their directories) whose stat moved since it
    /// read them. None: every file it holds is as it was at one moment,
    /// the end of the reading (each file's stat held from before its read
    /// to now, and every read came before every stat here). A dev
    /// server's SQLite database read before a WAL checkpoint with its WAL
    /// read after the restart that followed was malformed after a rewind,
    /// with each file read whole (helper-84).
    ///
    /// Each is stat'ed by name in its directory ([`StatBeneath`]): stat'ed
    /// by its whole path, one past PATH_MAX (4,096 bytes) failed and read
    /// as moved, and the first checkpoint of a deep tree read it again and
    /// warned of writers with nothing running (helper-90, D342).
    pub fn moved_since_read(&self, root: &Dir) -> Vec<Vec<u8>> {
        let mut stat = StatBeneath::new(root);
        self.settle
            .iter()
            .filter(|(path, seen)| !stat.stat(path).is_some_and(|m| seen.still(&m)))
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Whether the capture read a file or listed a directory: one that did
    /// neither holds what the stat cache held, every entry as it was
    /// before the capture began, which no change meanwhile can tear.
    pub fn looked_at_anything(&self) -> bool {
        self.settle.iter().any(|(path, _)| !path.is_empty())
    }

    /// Whether everything the capture read or listed had last changed
    /// before `clock_ns`, the filesystem's clock read before its scope was
    /// taken, and nothing it went to look at had gone (D345). Then, if
    /// none of it moved by the end ([`Capture::moved_since_read`]), it
    /// holds the tree as it was at that reading: what it read was already
    /// so, and what its scope vouched for was stat'ed unchanged after it.
    /// A change anywhere after the reading is the next checkpoint's, and
    /// cannot tear this one. The ctime a change is given is never older
    /// than a clock read before it; one in the same tick may equal it, so
    /// equal counts as after.
    pub fn looked_only_at_what_predates(&self, clock_ns: i64) -> bool {
        !self.lost_sight && self.settle.iter().all(|(_, seen)| seen.ctime_ns < clock_ns)
    }

    /// Take the small objects and chunk lists its store's writer gathered,
    /// those of reads it discarded left out: a chunk list committed for a
    /// discarded read named chunk files the commit then removed, and
    /// `verify --deep` called them damaged (helper-86).
    pub fn take_stored(&mut self, blobs: Vec<(Hash, Vec<u8>)>, manifests: Vec<(Hash, Vec<u8>)>) {
        let read: HashSet<&Hash> = self.read_objects.iter().collect();
        self.blobs = blobs
            .into_iter()
            .filter(|(h, _)| read.contains(h))
            .collect();
        self.manifests = manifests
            .into_iter()
            .filter(|(h, _)| read.contains(h))
            .collect();
    }

    /// The object and chunk files the files this capture read are stored
    /// in: any other object file it made came from a read it discarded
    /// ([`crate::objects::NewObjects::keep_named`]).
    pub fn objects_kept(&self) -> HashSet<Hash> {
        let mut kept: HashSet<Hash> = self.read_objects.iter().copied().collect();
        for (whole, list) in &self.manifests {
            if kept.contains(whole) {
                kept.extend(crate::blobs::decode_manifest(list));
            }
        }
        kept
    }

    /// Decoded new nodes, for reading a tree that is not persisted (status),
    /// and the replaced ones, for reading the tree before it.
    pub fn overlay(&self) -> HashMap<Hash, SharedNode> {
        self.new_nodes
            .iter()
            .chain(&self.replaced_nodes)
            .cloned()
            .collect()
    }
}

#[derive(Default)]
struct Outputs {
    new_nodes: Vec<(Hash, SharedNode)>,
    replaced_nodes: Vec<(Hash, SharedNode)>,
    cache_updates: Vec<(Vec<u8>, Hash, Vec<u8>, bool)>,
    visited: HashSet<Vec<u8>>,
    /// Directories a scoped capture kept without opening: their stat-cache
    /// rows, and those of everything below, stay.
    kept: HashSet<Vec<u8>>,
    removed_trees: Vec<Vec<u8>>,
    skipped: Vec<Skipped>,
    /// The directories holding what `skipped` names.
    skip_dirs: HashSet<Vec<u8>>,
    recent: Vec<(Vec<u8>, i64)>,
    new_objects: Vec<Hash>,
    /// Some stored object's durability is not known: only a `syncfs`
    /// covers the capture.
    objects_unknown: bool,
    restored_done: Vec<Vec<u8>>,
    /// Files that changed every time they were copied.
    mixed: Vec<Vec<u8>>,
    /// Files to stat again once everything is read ([`Capture::settle`]).
    settle: Vec<(Vec<u8>, Seen)>,
    /// The object of every file this capture read and kept.
    read_objects: Vec<Hash>,
    /// An entry it went to look at had gone, or was passed over.
    lost_sight: bool,
}

/// Counters bumped from every walker thread: atomics, not the mutex.
#[derive(Default)]
struct Counters {
    entries: AtomicU64,
    files_hashed: AtomicU64,
    bytes_hashed: AtomicU64,
    files_known_restored: AtomicU64,
    bytes_new: AtomicU64,
    cloned: AtomicU64,
    copied: AtomicU64,
    inlined: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> CaptureStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CaptureStats {
            entries: get(&self.entries),
            files_hashed: get(&self.files_hashed),
            bytes_hashed: get(&self.bytes_hashed),
            files_known_restored: get(&self.files_known_restored),
            bytes_new: get(&self.bytes_new),
            cloned: get(&self.cloned),
            copied: get(&self.copied),
            inlined: get(&self.inlined),
        }
    }
}

/// Where captured file contents go: stored as objects (checkpoint) or only
/// hashed (status, diff against the live tree, dry runs).
#[derive(Clone, Copy)]
pub enum Sink<'a> {
    Store(&'a ObjectStore, &'a crate::blobs::BlobWriter),
    HashOnly,
}

/// The ignore rules in force in one directory: each rule file from the
/// root down, with the offset in a workspace-relative path where the
/// directory holding it ends (its patterns are anchored there).
pub(crate) type IgnoreStack = Vec<(usize, Arc<ignore::gitignore::Gitignore>)>;

/// `parent` with the rules of `dir_rel`'s rule file (`text`) added on top.
pub(crate) fn with_rules(
    parent: &IgnoreStack,
    dir_rel: &[u8],
    text: &str,
    path: &Path,
) -> Result<IgnoreStack> {
    let matcher = ignore_matcher(text, path)?;
    let mut stack = parent.clone();
    stack.push((
        if dir_rel.is_empty() {
            0
        } else {
            dir_rel.len() + 1
        },
        Arc::new(matcher),
    ));
    Ok(stack)
}

/// `parent` with the rules of the `.rewindignore` in `dir` (at `rel`) on
/// top, when it holds one as a regular file.
pub(crate) fn with_rules_in(dir: &Dir, rel: &[u8], parent: &IgnoreStack) -> Result<IgnoreStack> {
    Ok(rules_in(dir, rel, parent)?.0)
}

/// [`with_rules_in`], with the hash of the rule file's bytes (`None`
/// where there is no regular rule file).
fn rules_in(dir: &Dir, rel: &[u8], parent: &IgnoreStack) -> Result<(IgnoreStack, Option<Hash>)> {
    let (mut f, _) = match dir.open_read(OsStr::new(IGNORE_FILE)) {
        Ok(v) => v,
        Err(_) => return Ok((parent.clone(), None)), // not a regular file: not a rule file
    };
    let mut bytes = Vec::new();
    let path = PathBuf::from(OsStr::from_bytes(&join(rel, IGNORE_FILE.as_bytes())));
    std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| Error::InvalidPath {
        path: path.clone(),
        reason: format!("cannot read ignore rules: {e}"),
    })?;
    // Not UTF-8 (a byte an agent wrote): read as far as it is text.
    // Refused, it stopped every checkpoint and every rewind, even the one
    // that would have put the target's rules back (helper-32, D223); the
    // target's own rules are read the same way.
    let stack = with_rules(parent, rel, &String::from_utf8_lossy(&bytes), &path)?;
    Ok((stack, Some(Hash::of(&bytes))))
}

/// Whether the rules in `stack` exclude `rel`; the nearest rule file that
/// says anything decides, as in git.
pub(crate) fn is_ignored(
    stack: &[(usize, Arc<ignore::gitignore::Gitignore>)],
    rel: &[u8],
    is_dir: bool,
) -> bool {
    for (base, m) in stack.iter().rev() {
        let sub = &rel[(*base).min(rel.len())..];
        let path = std::path::Path::new("/").join(OsStr::from_bytes(sub));
        match m.matched(&path, is_dir) {
            ignore::Match::Ignore(_) => return true,
            ignore::Match::Whitelist(_) => return false,
            ignore::Match::None => {}
        }
    }
    false
}

/// What one entry of a directory needs, decided from its stat alone.
enum Slot<'c> {
    Same(&'c CacheRec),
    File(OsString, Meta),
    Link(OsString, Meta),
    /// A directory to descend into: its record if the cache vouches for
    /// it, and whether the cached rows at its path describe it at all.
    Dir(OsString, Meta, Option<&'c CacheRec>, CachedRows),
    /// Scoped: a directory whose own metadata changed but whose content
    /// the tracker saw no change in: its cached subtree stands.
    DirMeta(OsString, Meta, &'c CacheRec),
}

/// Whether the stat-cache rows at a directory's path describe the
/// directory there now. Rows are keyed by path: after `mv made elsewhere;
/// mkdir made`, the rows at `made` still list what the old directory held.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CachedRows {
    /// The cached record at this name is a directory with this inode.
    ThisDir,
    /// Another directory's, or none: only a full listing says what is here.
    NotThisDir,
}

/// An entry's record after the work: unchanged (borrowed from the cache)
/// or new.
enum Resolved<'c> {
    Same(&'c CacheRec),
    New(CacheRec),
}

impl Resolved<'_> {
    fn rec(&self) -> &CacheRec {
        match self {
            Resolved::Same(r) => r,
            Resolved::New(r) => r,
        }
    }
}

/// The directory a walker is in, and what it knows about it.
#[derive(Clone, Copy)]
struct Here<'a, 'c> {
    dir: &'a Dir,
    mirror: Option<&'a Dir>,
    rel: &'a [u8],
    cached: Option<&'c CachedDir>,
    ignores: &'a IgnoreStack,
    /// Descend only where the scope lists (see [`Scope`]).
    scoped: bool,
}

struct Walker<'a> {
    root_dev: u64,
    /// The root's mount id, where the kernel says ([`Dir::mount_id`]).
    root_mount: Option<u64>,
    cache: &'a StatCache,
    sink: Sink<'a>,
    clock_ns: i64,
    report_from_ns: Option<i64>,
    store_durable_below_ns: Option<i64>,
    scope: Option<&'a Scope>,
    /// The scope is small: see [`Walker::worth_the_pool`].
    small_scope: bool,
    /// The cache's rows by parent directory (scoped captures only): a
    /// directory kept without opening is recorded only if rows at or
    /// below it were loaded, the only ones `kept` decides about.
    cache_children: Children,
    out: Mutex<Outputs>,
    counters: Counters,
    progress: &'a Progress,
    /// As root in another user's workspace: that user, whose history this
    /// is; what they could not read is left out (D152).
    owner: Option<rewind_platform::UserAccess>,
    /// How many rules at the bottom of every ignore stack are the ones
    /// kept outside the tree (`.rewind/ignore`): 0 or 1.
    state_rules: usize,
    /// Files a mount saw opened for writing (D247).
    writers: &'a Writers,
    /// What the last rewind restored (D275).
    restored: &'a RestoredFiles,
}

/// Gitignore-syntax rules, anchored at the directory holding them.
fn ignore_matcher(text: &str, path: &Path) -> Result<ignore::gitignore::Gitignore> {
    let mut builder = ignore::gitignore::GitignoreBuilder::new("/");
    for line in text.lines() {
        // A NUL ends the pattern, as git reads it (a C string): kept in,
        // the pattern matched no name, and what git ignores was captured.
        let line = line.split('\0').next().unwrap_or_default();
        // A bad pattern is reported by the builder; keep the good ones.
        let _ = builder.add_line(None, line);
    }
    builder.build().map_err(|e| Error::InvalidPath {
        path: path.to_path_buf(),
        reason: format!("bad ignore pattern: {e}"),
    })
}

/// Capture the tree below `root`.
/// `state_ignores` are rules kept outside the tree (`.rewind/ignore`), so
/// that no rewind can change them. `clock_ns` is the filesystem's notion of
/// "now" taken just before the walk (see the module docs on racy entries).
///
/// `Guide::Scope`: only the scope's directories are opened (see [`Scope`]).
///
/// `restored`: the files the last rewind put in place, whose content their
/// stat vouches for where the stat cache cannot (see [`Restored`]).
///
/// `Guide::Mirror`: a tree known to hold, at the same paths, the same inodes as
/// `root` wherever neither changed since the stat cache was written: the
/// live workspace when `root` is a btrfs snapshot of it. An entry whose
/// stat in the mirror the cache vouches for is taken from the cache
/// without a stat in `root`: ctime only grows, so an inode whose ctime
/// still equals the cached one was unchanged, at that path, when the
/// snapshot was taken. This matters because the first stat of each inode
/// of a fresh snapshot reads it from disk (~14 µs), while the live tree's
/// inodes are cached (~1 µs). Names still come from `root`, and whatever
/// the cache does not vouch for is read from `root`.
#[allow(clippy::too_many_arguments)] // each an independent input of one walk
pub fn capture(
    root: &Dir,
    guide: Guide<'_>,
    cache: &StatCache,
    restored: &RestoredFiles,
    sink: Sink<'_>,
    clock: Clock,
    progress: &Progress,
    state_ignores: Option<(&str, &Path)>,
    writers: &Writers,
) -> Result<Capture> {
    let root_meta = root.meta().map_err(Error::os)?;
    let root_seen = Seen::of_dir(&root_meta);
    let (mirror, scope) = match guide {
        Guide::None => (None, None),
        Guide::Mirror(m) => (Some(m), None),
        Guide::Scope(s, m) => (m, Some(s)),
    };
    let walker = Walker {
        root_dev: root_meta.dev,
        root_mount: root.mount_id(),
        cache,
        sink,
        clock_ns: clock.now_ns,
        report_from_ns: clock.report_from_ns,
        store_durable_below_ns: clock.store_durable_below_ns,
        scope,
        small_scope: scope.is_some_and(Scope::is_small),
        cache_children: if scope.is_some() {
            children_of(cache.keys().map(Vec::as_slice))
        } else {
            Children::new()
        },
        out: Mutex::new(Outputs::default()),
        counters: Counters::default(),
        progress,
        owner: rewind_platform::UserAccess::owner_of(&root_meta),
        state_rules: usize::from(state_ignores.is_some()),
        writers,
        restored,
    };
    let root_dir = root.try_clone().map_err(Error::os)?;
    let mut base = IgnoreStack::new();
    if let Some((text, path)) = state_ignores {
        base.push((0, Arc::new(ignore_matcher(text, path)?)));
    }
    let mirror = mirror.and_then(|m| m.try_clone().ok());
    let walk = || walker.walk_dir(root_dir, mirror, Vec::new(), &base, scope.is_some());
    // Without the pool (no thread could be started), on this thread: as
    // deep as its stack allows.
    let root_hash = match walk_pool() {
        Some(pool) => pool.install(walk)?,
        None => walk()?,
    };
    let stats = walker.counters.snapshot();
    let out = walker.out.into_inner().unwrap_or_else(|p| p.into_inner());
    let kept = |k: &[u8]| is_at_or_below(k, &out.kept);
    let cache_removals = cache
        .keys()
        .filter(|k| !out.visited.contains(*k) && !kept(k))
        .cloned()
        .collect();
    let mut skipped = out.skipped;
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Capture {
        root: root_hash,
        new_nodes: out.new_nodes,
        replaced_nodes: out.replaced_nodes,
        cache_updates: out.cache_updates,
        cache_removals,
        cache_removed_trees: out.removed_trees,
        skipped,
        stats,
        blobs: Vec::new(),
        manifests: Vec::new(),
        replaces_cache: false,
        from_snapshot: false,
        cache_mark: None,
        cache_rules: None,
        clock_ns: clock.now_ns,
        recent: out.recent,
        scoped: scope.is_some(),
        new_objects: (!out.objects_unknown).then_some(out.new_objects),
        durable: None,
        durable_changed: false,
        restored_done: out.restored_done,
        unsettled: out.mixed,
        settle: {
            let mut settle = out.settle;
            settle.push((Vec::new(), root_seen));
            settle
        },
        read_objects: out.read_objects,
        lost_sight: out.lost_sight,
        moved: Vec::new(),
    })
}

/// The proper ancestors of a workspace-relative path below the root, the
/// root (`""`) excluded, top-most first: `a/b/c` gives `a`, `a/b`. Sets of
/// paths hold top-most entries (a removed directory, a kept one), so a
/// lookup top-down stops at the first level, not after hashing every
/// longer prefix: below a chain 1,000 levels deep that was ~0.5 GB of
/// hashing for one rewind (D166).
pub(crate) fn ancestors(rel: &[u8]) -> impl Iterator<Item = &[u8]> {
    rel.iter()
        .enumerate()
        .filter(|&(_, &c)| c == b'/')
        .map(move |(i, _)| &rel[..i])
}

/// A workspace-relative path's parent and name: `a/b/c` gives `a/b` and
/// `c`, `c` gives `""` and `c`.
pub(crate) fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&c| c == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// Whether `path` is a path inside the directory `top` (not `top` itself).
pub(crate) fn is_below(path: &[u8], top: &[u8]) -> bool {
    path.strip_prefix(top)
        .is_some_and(|r| r.first() == Some(&b'/'))
}

/// Whether `path` is one of `set` or below one.
pub(crate) fn is_at_or_below(path: &[u8], set: &HashSet<Vec<u8>>) -> bool {
    !set.is_empty() && (ancestors(path).any(|a| set.contains(a)) || set.contains(path))
}

pub(crate) fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        name.to_vec()
    } else {
        let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
        p.extend_from_slice(rel);
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// Whether `path` is a nested workspace's state directory or lies in one
/// (D82; `is_dir`: the entry at `path` is a directory). Such paths are
/// never captured, and never written or deleted by a rewind, even one to
/// a checkpoint an older rewind captured them in. A file named `.rewind`
/// is an ordinary file.
pub fn in_nested_state(path: &[u8], is_dir: bool) -> bool {
    let mut parts = path.split(|&b| b == b'/').peekable();
    while let Some(c) = parts.next() {
        if c == STATE_DIR.as_bytes() && (is_dir || parts.peek().is_some()) {
            return true;
        }
    }
    false
}

pub fn display_path(rel: &[u8]) -> String {
    String::from_utf8_lossy(rel).into_owned()
}

impl Walker<'_> {
    fn skip(&self, rel: &[u8], reason: impl Into<String>) {
        let mut o = self.lock_out();
        o.skip_dirs.insert(split_parent(rel).0.to_vec());
        o.skipped.push(Skipped::new(rel, reason));
    }

    /// The rules in force in `dir`, and the hash of its rule file's bytes.
    fn ignore_stack(
        &self,
        dir: &Dir,
        rel: &[u8],
        has_rules: bool,
        parent: &IgnoreStack,
    ) -> Result<(IgnoreStack, Option<Hash>)> {
        if !has_rules {
            return Ok((parent.clone(), None));
        }
        rules_in(dir, rel, parent)
    }

    /// Capture one directory: stat every entry here (cheap, sequential),
    /// then hash misses and descend into subdirectories in parallel. A
    /// directory whose records all match the cache keeps its node as is.
    /// `scoped`: descend only into directories the scope lists.
    fn walk_dir(
        &self,
        dir: Dir,
        mirror: Option<Dir>,
        rel: Vec<u8>,
        parent_ignores: &IgnoreStack,
        scoped: bool,
    ) -> Result<Hash> {
        let scoped = scoped && self.scope.is_some_and(|s| !s.deep.contains(&rel));
        crate::failpoint::hit("capture:dir");
        if self.progress.cancelled() {
            return Err(Error::Cancelled);
        }
        let row = self.cache.get(&rel);
        let cached_skips = row.is_some_and(LazyDir::skips);
        let cached = row.and_then(LazyDir::get);
        // A listing that skipped an entry is never taken from the cache:
        // the entry is in no record (D235).
        let listed_by_cache = cached
            .zip(self.scope)
            .filter(|(_, s)| scoped && !cached_skips && s.entries_known(&rel));
        // Each name with its inode and, if it has one, its cached row.
        let mut names: Vec<(Cow<'_, OsStr>, u64, Option<&CacheRec>)> = match listed_by_cache {
            Some((c, scope)) => {
                let cached_names = c.recs.iter().map(|r| {
                    (
                        Cow::Borrowed(OsStr::from_bytes(&r.entry.name)),
                        r.ino,
                        Some(r),
                    )
                });
                let unseen = scope
                    .named(&rel)
                    .filter(|n| c.lookup(n).is_none())
                    .map(|n| (Cow::Owned(OsStr::from_bytes(n).to_owned()), 0, None));
                cached_names.chain(unseen).collect()
            }
            None => dir
                .entries_with_ino()
                .map_err(Error::os)?
                .into_iter()
                .map(|(n, ino)| {
                    let prev = cached.and_then(|c| c.lookup(n.as_bytes()));
                    (Cow::Owned(n), ino, prev)
                })
                .collect(),
        };
        // Cached rows are sorted already: the stable sort only merges the
        // names they lack.
        names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let has_rules = names
            .iter()
            .any(|(n, _, _)| n.as_bytes() == IGNORE_FILE.as_bytes());
        let (ignores, rules_hash) = self.ignore_stack(&dir, &rel, has_rules, parent_ignores)?;
        // A rule file added, removed or rewritten here since the cache
        // changes what is captured anywhere below, where nothing moved:
        // the cached subtrees kept leaving out (or holding) what the old
        // rules said, and a file a removed rule had hidden was in no
        // checkpoint, then lost (helper-78). Compared by content: a rule
        // file swapped with another file by RENAME_EXCHANGE moves no ctime
        // on XFS, and the bulk stat vouched for the old one (helper-82).
        // Below here, nothing is taken from the scope.
        let scoped = scoped
            && cached.is_none_or(|c| {
                let before = c
                    .lookup(IGNORE_FILE.as_bytes())
                    .map(|r| match &r.entry.target {
                        Target::Object(h) => Some(*h),
                        _ => None,
                    });
                // `before`: whether the cache has an entry of that name,
                // and its content if it was a regular file (a rule file).
                match (before, rules_hash) {
                    (None, None) => true,
                    // Rules unchanged, or none then and none now (a
                    // directory or symlink of that name, still not a file).
                    (Some(was), now) => was == now,
                    (None, Some(_)) => false,
                }
            });
        let here = Here {
            dir: &dir,
            mirror: mirror.as_ref(),
            rel: &rel,
            cached,
            ignores: &ignores,
            scoped,
        };

        let mut slots = Vec::with_capacity(names.len());
        let in_scope = self.scope.filter(|_| scoped).map(|s| s.at(&rel));
        for (name, ino, prev) in names {
            // Scoped: an entry the tracker saw no change to is what the
            // cache says, without a stat.
            if let Some(scope) = &in_scope
                && let Some(prev) = prev
                && !scope.looks_at(name.as_bytes(), ino, prev.ino)
            {
                if prev.entry.kind() == Kind::Dir {
                    self.keep_unopened(&rel, name.as_bytes());
                }
                Counters::add(&self.counters.entries, 1);
                slots.push(Slot::Same(prev));
                continue;
            }
            if let Some(slot) = self.classify(&here, name.into_owned())? {
                slots.push(slot);
            }
        }
        crate::failpoint::hit("capture:stated");
        let resolved: Vec<Result<Option<Resolved<'_>>>> = if self.worth_the_pool(scoped, &slots) {
            slots
                .into_par_iter()
                .map(|slot| self.resolve(&here, slot))
                .collect()
        } else {
            slots
                .into_iter()
                .map(|slot| self.resolve(&here, slot))
                .collect()
        };
        let mut recs: Vec<Resolved<'_>> = Vec::with_capacity(resolved.len());
        for r in resolved {
            match r? {
                Some(r) => recs.push(r),
                // Gone (or skipped) between its stat and its read.
                None => self.lock_out().lost_sight = true,
            }
        }
        if let Some(from) = self.report_from_ns {
            let recent: Vec<(Vec<u8>, i64)> = recs
                .iter()
                .map(Resolved::rec)
                .filter(|r| r.ctime_ns >= from)
                .map(|r| (join(&rel, &r.entry.name), r.ctime_ns))
                .collect();
            if !recent.is_empty() {
                self.lock_out().recent.extend(recent);
            }
        }
        // What must not move before the end for the capture to be of one
        // moment: the files read here and the directories it listed (an
        // entry made after the listing moves its directory's times) and,
        // walked whole, every directory and the neighbours of what it read
        // (a database's WAL read here, the database itself vouched for by
        // the cache and written meanwhile).
        let read_here = recs
            .iter()
            .any(|r| matches!(r, Resolved::New(n) if n.entry.kind() == Kind::File));
        let settle: Vec<(Vec<u8>, Seen)> = recs
            .iter()
            .filter(|r| match r.rec().entry.kind() {
                Kind::File => matches!(r, Resolved::New(_)) || (read_here && !scoped),
                Kind::Dir => matches!(r, Resolved::New(_)) || !scoped,
                Kind::Symlink => false,
            })
            .map(|r| (join(&rel, &r.rec().entry.name), Seen::of(r.rec())))
            .collect();
        if !settle.is_empty() {
            self.lock_out().settle.extend(settle);
        }
        let skips = self.lock_out().skip_dirs.contains(&rel);
        if let Some(c) = cached
            && skips == cached_skips
            && recs.len() == c.recs.len()
            && recs.iter().all(|r| matches!(r, Resolved::Same(_)))
        {
            self.lock_out().visited.insert(rel);
            return Ok(c.node_hash);
        }
        // Scoped: subdirectories that are gone (or no longer directories)
        // take their rows below them along.
        if scoped && let Some(c) = cached {
            let now: HashSet<&[u8]> = recs
                .iter()
                .map(|r| &r.rec().entry)
                .filter(|e| e.kind() == Kind::Dir)
                .map(|e| e.name.as_slice())
                .collect();
            let gone: Vec<Vec<u8>> = c
                .recs
                .iter()
                .filter(|r| r.entry.kind() == Kind::Dir && !now.contains(r.entry.name.as_slice()))
                .map(|r| join(&rel, &r.entry.name))
                .collect();
            self.lock_out().removed_trees.extend(gone);
        }
        let encoded = Node::encode_entries(recs.iter().map(|r| &r.rec().entry));
        let hash = Node::hash_of_encoding(&encoded);
        let stats = CacheRec::encode_all(recs.iter().map(Resolved::rec));
        let changed = cached.is_none_or(|c| c.node_hash != hash);
        let replaced = cached.filter(|_| changed).map(CachedDir::node);
        let mut out = self.lock_out();
        if changed {
            let entries = recs.iter().map(|r| r.rec().entry.clone()).collect();
            out.new_nodes
                .push((hash, SharedNode::new(Node { entries })));
        }
        out.replaced_nodes.extend(replaced);
        out.cache_updates.push((rel.clone(), hash, stats, skips));
        out.visited.insert(rel);
        Ok(hash)
    }

    /// Directory `rel/name` is taken from the cache without being walked:
    /// its rows, and those below it, stay. Recorded only when rows at or
    /// below it were loaded, the only ones `kept` decides about (a scoped
    /// capture loads the rows of the directories it lists).
    fn keep_unopened(&self, rel: &[u8], name: &[u8]) {
        if self
            .cache_children
            .get(rel)
            .is_some_and(|loaded| loaded.contains(name))
        {
            self.lock_out().kept.insert(join(rel, name));
        }
    }

    /// Why an entry is not part of this tree, if it is not (D137): it is
    /// on another filesystem, in a nested btrfs subvolume, or on another
    /// mount. A bind mount from the same filesystem has the root's device,
    /// and a rewind that walked into one deleted what it held outside the
    /// workspace; an overlayfs whose layers are different filesystems
    /// gives each non-directory its layer's device, in the root's mount.
    fn not_crossed(&self, meta: &Meta, mount: Option<u64>) -> Option<&'static str> {
        let same_mount = mount.zip(self.root_mount).map(|(m, r)| m == r);
        if meta.dev != self.root_dev {
            if same_mount == Some(true) && meta.kind != EntryKind::Dir {
                return None;
            }
            // A btrfs subvolume's root is inode 256 (BTRFS_FIRST_FREE_OBJECTID).
            return Some(if meta.kind == EntryKind::Dir && meta.ino == 256 {
                "nested btrfs subvolume or btrfs mount (not crossed: not part of this workspace)"
            } else {
                "mount point (another filesystem is not crossed)"
            });
        }
        (same_mount == Some(false))
            .then_some("mount point (a bind mount: another mount is not crossed)")
    }

    /// Whether the sink stores a file of `size` bytes by a clone (which
    /// writes its pages back first).
    fn clones(&self, size: u64) -> bool {
        matches!(self.sink, Sink::Store(store, _) if store.should_clone(size))
    }

    fn lock_out(&self) -> std::sync::MutexGuard<'_, Outputs> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stat one entry and decide what it needs: nothing (the cache vouches
    /// for it), hashing, a readlink, or a descent.
    fn classify<'c>(&self, here: &Here<'_, 'c>, name: OsString) -> Result<Option<Slot<'c>>> {
        let Here {
            dir,
            mirror,
            rel,
            cached,
            ignores,
            scoped,
        } = *here;
        let nb = name.as_bytes();
        // rewind's own state and policy are never captured, so no rewind
        // can roll them back (an agent rewinding to before an effect rule
        // was written must not switch the rule off).
        if rel.is_empty() && (nb == STATE_DIR.as_bytes() || nb == CONFIG_FILE.as_bytes()) {
            return Ok(None);
        }
        let cached_rec = cached.and_then(|c| c.lookup(nb));
        let reread = self.writers.since(rel, nb);
        let mirrored = match (mirror, cached_rec) {
            (Some(m), Some(prev)) if !reread => {
                m.stat_at(&name).ok().filter(|lm| prev.vouches_for(lm))
            }
            _ => None,
        };
        let vouched_by_mirror = mirrored.is_some();
        let (meta, mount) = match mirrored {
            Some(m) => (m, None),
            None => match dir.stat_mount_at(&name) {
                Ok(v) => v,
                Err(e) if e.is_not_found() => {
                    // Vanished while we walked.
                    self.lock_out().lost_sight = true;
                    return Ok(None);
                }
                Err(e) => return Err(Error::os(e)),
            },
        };
        // Another workspace's state (`rewind init` in a subdirectory): its
        // history is its own. Captured here, a rewind of this workspace
        // would roll it back or delete it (D82).
        if meta.kind == EntryKind::Dir && nb == STATE_DIR.as_bytes() {
            // Said, not silent: a `.rewind/` that holds no ledger is most
            // likely someone's files under that name, which no checkpoint
            // will hold (helper-30, D214).
            use crate::workspace::{LEDGER_FILE, STATE_SUBVOLUME};
            let holds_ledger = dir.open_dir(&name).is_ok_and(|d| {
                [LEDGER_FILE, STATE_SUBVOLUME]
                    .iter()
                    .any(|n| d.stat_at(OsStr::new(n)).is_ok())
            });
            self.skip(
                &join(rel, nb),
                if holds_ledger {
                    "another workspace's history (a `rewind init` in this subdirectory): it has its own checkpoints; never captured or rewound here"
                } else {
                    "a directory named .rewind is never captured or rewound (it is where a nested workspace keeps its history): rename it if it holds your files"
                },
            );
            return Ok(None);
        }
        self.progress.inc(1);
        if self.progress.cancelled() {
            return Err(Error::Cancelled);
        }
        Counters::add(&self.counters.entries, 1);
        if meta.kind.is_special() {
            self.skip(
                &join(rel, nb),
                format!("{} (never opened, not captured)", meta.kind.as_str()),
            );
            return Ok(None);
        }
        // A rule file is captured whatever the rules in the tree say: one
        // that ignored itself (`*`) was left in place by every rewind,
        // which then could restore nothing it hid (helper-30, D217).
        // Those kept outside the tree (`.rewind/ignore`) still decide.
        let rules = if nb == IGNORE_FILE.as_bytes() {
            &ignores[..self.state_rules.min(ignores.len())]
        } else {
            &ignores[..]
        };
        if !rules.is_empty() && is_ignored(rules, &join(rel, nb), meta.kind == EntryKind::Dir) {
            return Ok(None);
        }
        if let Some(why) = self
            .not_crossed(&meta, mount)
            .filter(|_| !vouched_by_mirror)
        {
            self.skip(&join(rel, nb), why);
            return Ok(None);
        }
        if let Some(owner) = &self.owner
            && !owner.may_read(&meta)
        {
            self.skip(
                &join(rel, nb),
                format!(
                    "{} not readable by the workspace's owner (uid {}): root does not put it in their history",
                    if meta.kind == EntryKind::Dir { "directory" } else { "file" },
                    owner.uid()
                ),
            );
            return Ok(None);
        }
        let reread = reread && meta.kind == EntryKind::File && !self.clones(meta.size);
        let prev = cached_rec.filter(|r| !reread && r.vouches_for(&meta));
        if prev.is_none()
            && meta.kind == EntryKind::File
            && meta.size.saturating_sub(meta.allocated) > MAX_HOLE_BYTES
        {
            self.skip(
                &join(rel, nb),
                format!(
                    "a sparse file of {} holding {} of data: hashing its holes would take {}, so it is not captured; a rewind leaves it as it is (add it to .rewindignore, or make it smaller)",
                    crate::progress::human_bytes(meta.size),
                    crate::progress::human_bytes(meta.allocated),
                    roughly_at_a_gib_a_second(meta.size - meta.allocated),
                ),
            );
            return Ok(None);
        }
        // The cached record names this very directory (same inode): only
        // then do the cached subtree and the rows at its path describe it.
        // One renamed over it or swapped in by RENAME_EXCHANGE brings
        // entries the tracker saw no change in (D84); one made where
        // another was moved away has that one's rows (D86).
        let this_dir = cached_rec.filter(|r| {
            meta.kind == EntryKind::Dir && r.entry.kind() == Kind::Dir && r.ino == meta.ino
        });
        if prev.is_none()
            && let (Some(scope), Some(old)) = (self.scope, this_dir)
            && !scope.lists(&join(rel, nb))
            && scoped
        {
            return Ok(Some(Slot::DirMeta(name, meta, old)));
        }
        Ok(Some(match (meta.kind, prev) {
            (EntryKind::Dir, prev) => {
                let rows = match this_dir {
                    Some(_) => CachedRows::ThisDir,
                    None => CachedRows::NotThisDir,
                };
                Slot::Dir(name, meta, prev, rows)
            }
            (_, Some(prev)) => Slot::Same(prev),
            (EntryKind::Symlink, None) => Slot::Link(name, meta),
            (_, None) => Slot::File(name, meta),
        }))
    }

    /// Whether to resolve a directory's slots on the pool. Not for one
    /// slot or none (a directory whose entries the cache vouches for is
    /// finished right here), nor, in a small scoped capture, unless a
    /// slot is real work: a directory listed in full (it may be a new
    /// tree) or files of [`POOL_WORTH_BYTES`] together. A scoped descent
    /// into a directory the rows describe stays within the small scope.
    fn worth_the_pool(&self, scoped: bool, slots: &[Slot<'_>]) -> bool {
        let mut pending = slots.iter().filter(|s| !matches!(s, Slot::Same(_)));
        if pending.clone().nth(1).is_none() {
            return false;
        }
        if !(scoped && self.small_scope) {
            return true;
        }
        let mut bytes = 0u64;
        pending.any(|s| {
            bytes += match s {
                Slot::File(_, meta) => meta.size,
                Slot::Dir(_, _, _, CachedRows::NotThisDir) => POOL_WORTH_BYTES,
                _ => 0,
            };
            bytes >= POOL_WORTH_BYTES
        })
    }

    fn resolve<'c>(&self, here: &Here<'_, 'c>, slot: Slot<'c>) -> Result<Option<Resolved<'c>>> {
        self.resolve_at(here, slot, 0)
    }

    /// An entry whose type changed between its stat and its read (an
    /// editor's atomic save put a file where a symlink was): looked at
    /// again as what it is now. A readlink of the file failed the whole
    /// command with "Invalid argument" (helper-34, D238), and a file that
    /// became a symlink was left out of the capture. `tries` bounds it: a
    /// name that keeps changing is an error, and nothing was changed.
    fn resolve_again<'c>(
        &self,
        here: &Here<'_, 'c>,
        name: OsString,
        tries: u8,
    ) -> Result<Option<Resolved<'c>>> {
        if tries >= 3 {
            return Err(Error::InvalidPath {
                path: PathBuf::from(OsStr::from_bytes(&join(here.rel, name.as_bytes()))),
                reason: "changed type three times while it was read: nothing was changed; retry once what writes it has settled".into(),
            });
        }
        // Counted when first classified: one entry, looked at again.
        self.counters.entries.fetch_sub(1, Ordering::Relaxed);
        match self.classify(here, name)? {
            Some(slot) => self.resolve_at(here, slot, tries + 1),
            None => Ok(None),
        }
    }

    fn resolve_at<'c>(
        &self,
        here: &Here<'_, 'c>,
        slot: Slot<'c>,
        tries: u8,
    ) -> Result<Option<Resolved<'c>>> {
        let Here {
            dir,
            mirror,
            rel,
            ignores,
            scoped,
            cached,
        } = *here;
        match slot {
            Slot::Same(prev) => Ok(Some(Resolved::Same(prev))),
            Slot::File(name, meta) => {
                let path = join(rel, name.as_bytes());
                // The object this path held last: a big file is hashed on
                // from what it still shares with it (D314). What the last
                // rewind put there comes first: the file is a clone of
                // that object, newer than the cache's row (helper-69).
                let prev = self.restored.get(&path).map(|r| r.hash).or_else(|| {
                    cached
                        .and_then(|c| c.lookup(name.as_bytes()))
                        .and_then(|r| match r.entry.target {
                            Target::Object(h) => Some(h),
                            _ => None,
                        })
                });
                let mut meta = meta;
                let mut reads = 1u32;
                let hashed = loop {
                    match self.hash_file(dir, &name, &path, &meta, prev.as_ref())? {
                        // A big file is not read four times over: a log
                        // of a GiB appended to on ext4 is said at once.
                        Hashed::Mixed(entry)
                            if reads >= READS_OF_A_CHANGING_FILE || meta.size > REREAD_MAX =>
                        {
                            self.lock_out().mixed.push(path.clone());
                            break Hashed::File(entry, true);
                        }
                        // Read again from a fresh stat: a dev server's
                        // SQLite database copied while it committed was
                        // malformed after a rewind to the checkpoint
                        // (helper-84: 249 of 300 on ext4).
                        Hashed::Mixed(_) => match dir.stat_at(&name) {
                            Ok(now) if now.kind == EntryKind::File => {
                                meta = now;
                                reads += 1;
                            }
                            Ok(_) => break Hashed::NotAFile,
                            Err(e) if e.is_not_found() => break Hashed::Gone,
                            Err(e) => return Err(Error::os(e)),
                        },
                        other => break other,
                    }
                };
                let (entry, racy) = match hashed {
                    Hashed::File(entry, racy) => (entry, racy),
                    // Read as often as allowed, changing each time: kept,
                    // said, and read again by the next capture.
                    Hashed::Mixed(entry) => (entry, true),
                    Hashed::Gone => return Ok(None),
                    Hashed::NotAFile => return self.resolve_again(here, name, tries),
                };
                if let Target::Object(h) = entry.target {
                    self.lock_out().read_objects.push(h);
                }
                let mut rec = CacheRec::new(entry, &meta, self.clock_ns);
                rec.racy |= racy;
                // The cache vouches for it from now on, in place of what
                // the rewind recorded (used or stale).
                if !rec.racy && self.restored.contains_key(&path) {
                    self.lock_out().restored_done.push(path);
                }
                Ok(Some(Resolved::New(rec)))
            }
            Slot::Link(name, meta) => {
                let target = match dir.readlink(&name) {
                    Ok(t) => t,
                    Err(e) if e.is_not_found() => return Ok(None),
                    // No longer a symlink.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                        return self.resolve_again(here, name, tries);
                    }
                    Err(e) => return Err(Error::os(e)),
                };
                let entry = Entry {
                    name: name.as_bytes().to_vec(),
                    mode: meta.mode,
                    size: target.len() as u64,
                    mtime_ns: meta.mtime_ns,
                    target: Target::Link(target),
                    xattrs: Vec::new(),
                };
                Ok(Some(Resolved::New(CacheRec::new(
                    entry,
                    &meta,
                    self.clock_ns,
                ))))
            }
            Slot::DirMeta(name, meta, old) => {
                let xattrs = match dir.open_dir(&name) {
                    Ok(d) => d.user_xattrs().map_err(Error::os)?,
                    Err(e) if e.is_not_found() || e.is_redirected() => return Ok(None),
                    Err(e) => return Err(Error::os(e)),
                };
                self.keep_unopened(rel, name.as_bytes());
                let entry = Entry {
                    name: name.as_bytes().to_vec(),
                    mode: meta.mode,
                    size: 0,
                    mtime_ns: meta.mtime_ns,
                    target: old.entry.target.clone(),
                    xattrs,
                };
                Ok(Some(Resolved::New(CacheRec::new(
                    entry,
                    &meta,
                    self.clock_ns,
                ))))
            }
            Slot::Dir(name, meta, prev, rows) => {
                let path = join(rel, name.as_bytes());
                if depth_of(&path) > MAX_DEPTH {
                    self.skip(
                        &path,
                        format!("directory nested more than {MAX_DEPTH} levels deep: not captured, and a rewind keeps it"),
                    );
                    return Ok(None);
                }
                // Outside the scope, a directory the cache vouches for is
                // unchanged below too: the tracker saw every change.
                if let Some(p) = prev
                    && scoped
                    && self.scope.is_some_and(|s| !s.lists(&path))
                {
                    self.keep_unopened(rel, name.as_bytes());
                    return Ok(Some(Resolved::Same(p)));
                }
                let sub = match dir.open_dir(&name) {
                    Ok(d) => d,
                    Err(e) if e.is_not_found() || e.is_redirected() => return Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        self.skip(&path, "directory not readable (permission denied)");
                        return Ok(None);
                    }
                    Err(e) => return Err(Error::os(e)),
                };
                // xattr or chmod changes move ctime, so a vouched-for
                // directory keeps its cached xattrs.
                let xattrs = match prev {
                    Some(p) => p.entry.xattrs.clone(),
                    None => sub.user_xattrs().map_err(Error::os)?,
                };
                let sub_mirror = mirror.and_then(|m| m.open_dir(&name).ok());
                // A scope names what changed in the directory the rows
                // describe; another one at this path is listed in full (D86).
                let sub_scoped = scoped
                    && rows == CachedRows::ThisDir
                    && self.scope.is_some_and(|s| s.lists(&path));
                let listed = sub.path().to_path_buf();
                let subtree =
                    match self.walk_dir(sub, sub_mirror, path.clone(), ignores, sub_scoped) {
                        Ok(h) => h,
                        // Opened but not listable (mode 000 or -wx, another
                        // user's): skipped like one that cannot be opened, not
                        // an error that stopped every checkpoint and rewind.
                        Err(Error::Os(e))
                            if e.is_permission_denied()
                                && e.op == "read directory"
                                && e.path == listed =>
                        {
                            self.skip(&path, "directory not readable (permission denied)");
                            return Ok(None);
                        }
                        Err(e) => return Err(e),
                    };
                if let Some(p) = prev
                    && p.entry.subtree() == Some(subtree)
                {
                    return Ok(Some(Resolved::Same(p)));
                }
                let entry = Entry {
                    name: name.as_bytes().to_vec(),
                    mode: meta.mode,
                    size: 0,
                    mtime_ns: meta.mtime_ns,
                    target: Target::Tree(subtree),
                    xattrs,
                };
                Ok(Some(Resolved::New(CacheRec::new(
                    entry,
                    &meta,
                    self.clock_ns,
                ))))
            }
        }
    }

    /// Hash (and store) one regular file. Returns the entry and whether it
    /// changed while we read it (then its cache record is marked racy).
    fn hash_file(
        &self,
        dir: &Dir,
        name: &OsStr,
        path: &[u8],
        meta: &Meta,
        prev: Option<&Hash>,
    ) -> Result<Hashed> {
        let (mut file, opened) = match dir.open_read(name) {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(Hashed::Gone),
            // Swapped for a symlink (O_NOFOLLOW) or another non-file.
            Err(e) if e.is_redirected() || e.kind() == std::io::ErrorKind::Other => {
                return Ok(Hashed::NotAFile);
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                self.skip(path, "file not readable (permission denied)");
                return Ok(Hashed::Gone);
            }
            Err(e) => return Err(Error::os(e)),
        };
        // The file opened, not the one stat'ed: a name swapped between the
        // two for root's file got past D152 (helper-20, D160).
        if let Some(owner) = &self.owner
            && (opened.ino != meta.ino || !owner.may_read(&opened))
        {
            self.skip(
                path,
                format!(
                    "file not readable by the workspace's owner (uid {}), or swapped while read: root does not put it in their history",
                    owner.uid()
                ),
            );
            return Ok(Hashed::Gone);
        }
        let restored = self.restored_content(path, meta, &opened)?;
        // Its writeback started before it is read, unless a clone does
        // that: a page read while a write through a shared mapping is
        // still dirty stays writable, and later writes through it move no
        // time, so the stat cache would vouch for a file that changed
        // (D247, D254). A clean file costs one syscall; past
        // WRITE_BACK_MAX a copy (ext4) leaves the file's writeback alone.
        if restored.is_none()
            && (self.writers.is_open(path)
                || (!self.clones(meta.size) && meta.size <= WRITE_BACK_MAX))
        {
            rewind_platform::clean_for_read(&file);
        }
        let xattrs = Xattr::list_user(&file).map_err(|e| {
            Error::os(rewind_platform::Error::new(
                "list xattrs",
                display_path(path),
                e,
            ))
        })?;
        let entry = |hash, size| Entry {
            name: path.rsplit(|&c| c == b'/').next().unwrap_or(path).to_vec(),
            mode: meta.mode,
            size,
            mtime_ns: meta.mtime_ns,
            target: Target::Object(hash),
            xattrs,
        };
        if let Some(r) = restored {
            return Ok(Hashed::File(entry(r.hash, r.size), false));
        }
        let (hash, size, read, in_one_instant) = match self.sink {
            Sink::Store(store, blobs) => {
                let ing = store
                    .ingest(&file, meta.size, blobs, self.store_durable_below_ns, prev)
                    .map_err(|e| e.storing(path, meta.size))?;
                Counters::add(&self.counters.bytes_new, ing.new_bytes);
                let counter = match ing.stored {
                    Stored::Cloned => &self.counters.cloned,
                    Stored::Copied | Stored::Chunked => &self.counters.copied,
                    Stored::Inline => &self.counters.inlined,
                };
                Counters::add(counter, 1);
                match ing.stored {
                    // Found already stored, too: maybe by a capture killed
                    // before its sync, so not durable yet.
                    Stored::Cloned | Stored::Copied => self.lock_out().new_objects.push(ing.hash),
                    Stored::Chunked => {
                        let mut out = self.lock_out();
                        match ing.unsynced_chunks {
                            Some(chunks) => out.new_objects.extend(chunks),
                            None => out.objects_unknown = true,
                        }
                    }
                    _ => {}
                }
                (ing.hash, ing.size, ing.read, ing.stored == Stored::Cloned)
            }
            Sink::HashOnly => {
                let (hash, size) = hash_reader(&mut file).map_err(|e| {
                    Error::os(rewind_platform::Error::new("read", display_path(path), e))
                })?;
                (hash, size, size, false)
            }
        };
        crate::failpoint::hit("capture:object-stored");
        let after = dir.stat_at(name).ok();
        let changed_meanwhile = after
            .is_none_or(|a| a.ino != meta.ino || a.ctime_ns != meta.ctime_ns || a.size != size);
        Counters::add(&self.counters.files_hashed, 1);
        Counters::add(&self.counters.bytes_hashed, read);
        // Only what is stored must be of one moment; a read that changed
        // while hashed for `status` is racy and looked at again next time.
        if changed_meanwhile && !in_one_instant && matches!(self.sink, Sink::Store(..)) {
            return Ok(Hashed::Mixed(entry(hash, size)));
        }
        Ok(Hashed::File(entry(hash, size), changed_meanwhile))
    }

    /// The content of a file the last rewind restored and nothing changed
    /// since (D275), which need not be read: its stat, before and once
    /// open, is the one the rewind recorded. Not for a file a mount saw
    /// opened for writing (D247), nor, when storing, for one whose object
    /// has left the store (gc), which is then stored again.
    fn restored_content(
        &self,
        path: &[u8],
        meta: &Meta,
        opened: &Meta,
    ) -> Result<Option<Restored>> {
        let Some(r) = self.restored.get(path) else {
            return Ok(None);
        };
        if !(r.vouches_for(meta) && r.vouches_for(opened)) || self.writers.is_open(path) {
            return Ok(None);
        }
        if let Sink::Store(store, _) = self.sink
            && !store.contains(&r.hash, r.size)?
        {
            return Ok(None);
        }
        Counters::add(&self.counters.files_known_restored, 1);
        Ok(Some(*r))
    }
}

/// What reading a file a stat called regular found.
enum Hashed {
    /// Its entry, and whether it changed while read (then racy).
    File(Entry, bool),
    /// Read by copying while something wrote it: the bytes may come
    /// from several moments (a clone is one instant, a copy is not).
    Mixed(Entry),
    /// Gone, or left out (skipped, with the reason recorded).
    Gone,
    /// No longer a regular file: to be looked at again.
    NotAFile,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_keeps_eight_threads_on_few_cores_unless_descriptors_are_short() {
        // Two cores under the usual raised limit: eight, for cold reads.
        assert_eq!(walk_threads(2, Some(65_000)), 8);
        // Under 1,024 descriptors, room for six more: eight.
        assert_eq!(walk_threads(2, Some(1_000)), 8);
        // A low limit keeps one per core, as before (D321: 24 descriptors).
        assert_eq!(walk_threads(2, Some(20)), 2);
        assert_eq!(walk_threads(2, Some(300)), 4);
        assert_eq!(walk_threads(2, None), 2);
        // More cores than eight: one per core.
        assert_eq!(walk_threads(32, Some(65_000)), 32);
    }

    #[test]
    fn a_nul_in_a_rule_line_ends_its_pattern_as_in_git() {
        let m = ignore_matcher("build\0junk\n*.log\n", Path::new(".rewindignore")).expect("rules");
        assert!(m.matched("build", true).is_ignore());
        assert!(m.matched("a.log", false).is_ignore());
        assert!(!m.matched("buildjunk", true).is_ignore());
    }

    #[test]
    fn ancestors_are_listed_top_most_first_without_the_path_itself() {
        assert_eq!(
            ancestors(b"a/b/c").collect::<Vec<_>>(),
            vec![&b"a"[..], &b"a/b"[..]]
        );
        assert_eq!(ancestors(b"top").count(), 0);
        let set: HashSet<Vec<u8>> = [b"a/b".to_vec()].into();
        assert!(is_at_or_below(b"a/b", &set) && is_at_or_below(b"a/b/c/d", &set));
        assert!(!is_at_or_below(b"a", &set) && !is_at_or_below(b"a/bc", &set));
    }

    #[test]
    fn children_group_every_step_of_a_path_under_its_parent() {
        let c = children_of([&b"a/b/c"[..], b"a/d", b"", b"e"].into_iter());
        let names = |p: &[u8]| {
            let mut v: Vec<Vec<u8>> = c.get(p).into_iter().flatten().cloned().collect();
            v.sort();
            v
        };
        assert_eq!(names(b""), vec![b"a".to_vec(), b"e".to_vec()]);
        assert_eq!(names(b"a"), vec![b"b".to_vec(), b"d".to_vec()]);
        assert_eq!(names(b"a/b"), vec![b"c".to_vec()]);
        assert!(!c.contains_key(&b"a/b/c"[..]));
        // A scope lists exactly the paths it names or their ancestors.
        let scope = Scope::new(
            [(b"x/y".to_vec(), None)].into_iter().collect(),
            HashSet::new(),
        );
        assert!(scope.at(b"").looks_at(b"x", 1, 1));
        assert!(scope.at(b"x").looks_at(b"y", 1, 1));
        assert!(!scope.at(b"x").looks_at(b"z", 1, 1));
        assert!(scope.at(b"x/y").looks_at(b"anything", 1, 1));
    }

    /// Every step of every path, top down, the way `children_of` once
    /// built it: the reference its bottom-up early stop must equal.
    fn children_top_down(paths: &[Vec<u8>]) -> Children {
        let mut out = Children::new();
        for p in paths.iter().filter(|p| !p.is_empty()) {
            for step in ancestors(p).chain(std::iter::once(p.as_slice())) {
                let (parent, name) = split_parent(step);
                out.entry(parent.to_vec())
                    .or_default()
                    .insert(name.to_vec());
            }
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn children_and_spine_are_the_same_whatever_order_paths_come_in(
            paths in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'/']), 0..9),
                0..24,
            )
        ) {
            // Workspace-relative: no empty step, no leading or trailing '/'.
            let paths: Vec<Vec<u8>> = paths
                .into_iter()
                .map(|p| p.split(|&c| c == b'/').filter(|s| !s.is_empty()).collect::<Vec<_>>().join(&b'/'))
                .collect();
            let expected = children_top_down(&paths);
            proptest::prop_assert_eq!(&children_of(paths.iter().map(Vec::as_slice)), &expected);
            let reversed: Vec<Vec<u8>> = paths.iter().rev().cloned().collect();
            proptest::prop_assert_eq!(&children_of(reversed.iter().map(Vec::as_slice)), &expected);
            // The spine is every proper ancestor of what the scope names.
            let scope = Scope::new(paths.iter().map(|p| (p.clone(), None)).collect(), HashSet::new());
            let mut spine: HashSet<Vec<u8>> = paths
                .iter()
                .flat_map(|p| ancestors(p).map(<[u8]>::to_vec))
                .collect();
            spine.insert(Vec::new());
            proptest::prop_assert_eq!(&scope.spine, &spine);
        }
    }

    fn file(name: &str, ino: u64, mtime_ns: i64, ctime_ns: i64, racy: bool) -> CacheRec {
        CacheRec {
            entry: Entry {
                name: name.as_bytes().to_vec(),
                mode: 0o100644,
                size: 3000,
                mtime_ns,
                target: Target::Object(Hash([ino as u8; 32])),
                xattrs: Vec::new(),
            },
            ino,
            ctime_ns,
            racy,
        }
    }

    /// A row's records are its node's entries plus their stat fields, so a
    /// row read back with its node gives back exactly what was cached, and
    /// costs a few bytes per entry rather than the entry again (three
    /// pages rewritten per changed directory per checkpoint, D180).
    #[test]
    fn a_cache_row_holds_only_stat_fields_and_reads_back_with_its_node() {
        let recs: Vec<CacheRec> = (0..100)
            .map(|i| {
                let mtime = 1_700_000_000_000_000_000 + i * 1_000;
                let ctime = if i % 7 == 0 { mtime + 5_000_000 } else { mtime };
                file(
                    &format!("f{i:03}.txt"),
                    10_000 + i as u64,
                    mtime,
                    ctime,
                    i == 99,
                )
            })
            .collect();
        let node = Node {
            entries: recs.iter().map(|r| r.entry.clone()).collect(),
        };
        let hash = Node::hash_of_encoding(&node.encode());
        let stats = CacheRec::encode_all(recs.iter());
        assert!(
            stats.len() < 100 * 12,
            "{} bytes for 100 records",
            stats.len()
        );
        let stored = node.encode_stored();
        assert_eq!(
            CacheRec::decode_all(&hash, &stored, &stats),
            Some(recs.clone())
        );
        // Canonical node rows (written before D49) serve as well.
        assert_eq!(
            CacheRec::decode_all(&hash, &node.encode(), &stats),
            Some(recs.clone())
        );
        // Another node, a record too many or too few: not trusted.
        let other = Node {
            entries: node.entries[1..].to_vec(),
        };
        assert_eq!(
            CacheRec::decode_all(&hash, &other.encode_stored(), &stats),
            None
        );
        let other_hash = Node::hash_of_encoding(&other.encode());
        assert_eq!(
            CacheRec::decode_all(&other_hash, &other.encode_stored(), &stats),
            None
        );
        assert_eq!(
            CacheRec::decode_all(&hash, &stored, &stats[..stats.len() - 1]),
            None
        );
        let mut longer = stats.clone();
        longer.extend_from_slice(&[1, 0, 0]);
        assert_eq!(CacheRec::decode_all(&hash, &stored, &longer), None);
    }

    /// Rows written before D180 hold the entries themselves and keep
    /// vouching after an upgrade, so the first checkpoint after it does
    /// not re-read every file.
    #[test]
    fn a_cache_row_in_the_self_contained_format_still_reads() {
        let recs = vec![file("a", 7, 100, 100, false), file("b", 8, 200, 250, true)];
        let mut old = Vec::new();
        for r in &recs {
            r.entry.encode_into(&mut old);
            old.extend_from_slice(&42u64.to_be_bytes());
            old.extend_from_slice(&r.ino.to_be_bytes());
            old.extend_from_slice(&r.ctime_ns.to_be_bytes());
            old.push(r.racy as u8);
        }
        let node = Node {
            entries: recs.iter().map(|r| r.entry.clone()).collect(),
        };
        let hash = Node::hash_of_encoding(&node.encode());
        assert_eq!(
            CacheRec::decode_all(&hash, &node.encode_stored(), &old),
            Some(recs.clone())
        );
        let other = Node::hash_of_encoding(
            &Node {
                entries: Vec::new(),
            }
            .encode(),
        );
        assert_eq!(
            CacheRec::decode_all(&other, &node.encode_stored(), &old),
            None
        );
    }

    /// A small scope runs on the calling thread; one that walks a
    /// directory in full or names many entries may be real work.
    #[test]
    fn only_a_few_named_entries_and_no_deep_walk_make_a_scope_small() {
        let named = |n: usize| {
            let mut b = ScopeBuilder::default();
            for i in 0..n {
                b.entry_changed(
                    format!("d{}", i % 10).as_bytes(),
                    format!("f{i}").as_bytes(),
                );
            }
            b
        };
        assert!(named(10).build().is_small());
        assert!(named(SMALL_SCOPE).build().is_small());
        assert!(!named(SMALL_SCOPE + 1).build().is_small());
        let mut deep = named(1);
        deep.entry_changed(b"d0", IGNORE_FILE.as_bytes());
        assert!(!deep.build().is_small(), "an ignore file walks in full");
        let mut dirs = named(0);
        for i in 0..=SMALL_SCOPE {
            dirs.dir_changed(format!("d{i}").into_bytes());
        }
        assert!(!dirs.build().is_small(), "many directories listed");
    }

    #[test]
    fn only_paths_in_a_state_directory_are_nested_state() {
        assert!(in_nested_state(b"pkg/.rewind", true));
        assert!(
            !in_nested_state(b"pkg/.rewind", false),
            "a file of that name"
        );
        for p in ["pkg/.rewind/ledger.db", "a/b/.rewind/objects/x"] {
            assert!(in_nested_state(p.as_bytes(), false), "{p}");
        }
        for p in [
            "pkg",
            "pkg/.rewindignore",
            "x.rewind/y",
            "pkg/rewind/.rewinds",
        ] {
            assert!(!in_nested_state(p.as_bytes(), true), "{p}");
        }
    }
}
