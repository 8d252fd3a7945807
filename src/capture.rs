//! The `walk` engine's change detection: a parallel, fd-relative walk that
//! stats every entry and hashes only what the stat cache cannot vouch for.
//!
//! The stat cache is git-index-like: per directory, the (dev, ino, mode,
//! size, mtime, ctime) of each entry when it was last hashed, aligned with
//! the tree node that holds its hash. An entry whose ctime is not older than
//! the start of the capture that cached it is "racy" (it could change again
//! within the same timestamp tick without the stat changing), so it is
//! re-hashed next time. ctime, not mtime: user space cannot set ctime, and
//! an xattr or chmod change moves it too.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use rewind_platform::{Dir, EntryKind, Meta, Xattr};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::objects::{ObjectStore, hash_reader};
use crate::progress::Progress;
use crate::tree::{Entry, Kind, Node, Target};

pub const STATE_DIR: &str = ".rewind";
pub const IGNORE_FILE: &str = ".rewindignore";

/// One stat record of the cache, aligned with a tree entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatRec {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub racy: bool,
}

const STAT_REC_LEN: usize = 8 + 8 + 4 + 8 + 8 + 8 + 1;

impl StatRec {
    fn from_meta(m: &Meta, clock_ns: i64) -> StatRec {
        StatRec {
            dev: m.dev,
            ino: m.ino,
            mode: kind_bits(m.kind) | m.mode,
            size: m.size,
            mtime_ns: m.mtime_ns,
            ctime_ns: m.ctime_ns,
            racy: m.ctime_ns >= clock_ns,
        }
    }

    /// The cache vouches for an entry when nothing in its stat moved and it
    /// was not racy when cached.
    pub fn vouches_for(&self, m: &Meta) -> bool {
        !self.racy
            && self.dev == m.dev
            && self.ino == m.ino
            && self.mode == kind_bits(m.kind) | m.mode
            && self.size == m.size
            && self.mtime_ns == m.mtime_ns
            && self.ctime_ns == m.ctime_ns
    }

    fn encode_all(recs: &[StatRec]) -> Vec<u8> {
        let mut out = Vec::with_capacity(recs.len() * STAT_REC_LEN);
        for r in recs {
            out.extend_from_slice(&r.dev.to_le_bytes());
            out.extend_from_slice(&r.ino.to_le_bytes());
            out.extend_from_slice(&r.mode.to_le_bytes());
            out.extend_from_slice(&r.size.to_le_bytes());
            out.extend_from_slice(&r.mtime_ns.to_le_bytes());
            out.extend_from_slice(&r.ctime_ns.to_le_bytes());
            out.push(r.racy as u8);
        }
        out
    }

    fn decode_all(bytes: &[u8]) -> Option<Vec<StatRec>> {
        if bytes.len() % STAT_REC_LEN != 0 {
            return None;
        }
        let u64_at =
            |c: &[u8], o: usize| u64::from_le_bytes(c[o..o + 8].try_into().unwrap_or([0; 8]));
        Some(
            bytes
                .chunks_exact(STAT_REC_LEN)
                .map(|c| StatRec {
                    dev: u64_at(c, 0),
                    ino: u64_at(c, 8),
                    mode: u32::from_le_bytes(c[16..20].try_into().unwrap_or([0; 4])),
                    size: u64_at(c, 20),
                    mtime_ns: u64_at(c, 28) as i64,
                    ctime_ns: u64_at(c, 36) as i64,
                    racy: c[44] != 0,
                })
                .collect(),
        )
    }
}

fn kind_bits(k: EntryKind) -> u32 {
    match k {
        EntryKind::File => 0o100000,
        EntryKind::Dir => 0o040000,
        EntryKind::Symlink => 0o120000,
        _ => 0,
    }
}

/// The previous capture of one directory.
pub struct CachedDir {
    pub node_hash: Hash,
    pub node: Node,
    pub stats: Vec<StatRec>,
}

impl CachedDir {
    fn lookup(&self, name: &[u8]) -> Option<(&Entry, &StatRec)> {
        let i = self
            .node
            .entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()?;
        Some((&self.node.entries[i], self.stats.get(i)?))
    }
}

pub type StatCache = HashMap<Vec<u8>, CachedDir>;

/// A stat-cache row as stored: (dir path, node hash, stat records, node bytes).
pub type StatCacheRow = (Vec<u8>, Hash, Vec<u8>, Vec<u8>);

/// Build the in-memory stat cache from ledger rows; rows that do not line up
/// with their node are dropped (the cache is only an accelerator).
pub fn load_stat_cache(rows: Vec<StatCacheRow>) -> StatCache {
    let mut cache = HashMap::with_capacity(rows.len());
    for (dir, node_hash, stats, data) in rows {
        let (Ok(node), Some(stats)) = (Node::decode(&data), StatRec::decode_all(&stats)) else {
            continue;
        };
        if node.entries.len() == stats.len() {
            cache.insert(
                dir,
                CachedDir {
                    node_hash,
                    node,
                    stats,
                },
            );
        }
    }
    cache
}

/// Something the capture saw and deliberately left out.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CaptureStats {
    pub entries: u64,
    pub files_hashed: u64,
    pub bytes_hashed: u64,
    pub bytes_new: u64,
    pub cloned: u64,
    pub copied: u64,
}

/// A captured tree: the root hash plus everything needed to persist it.
pub struct Capture {
    pub root: Hash,
    /// Nodes that may not be in the ledger yet (encoded, with their hash).
    pub new_nodes: Vec<(Hash, Vec<u8>)>,
    /// Stat-cache rows to write: (dir, node, stats).
    pub cache_updates: Vec<(Vec<u8>, Hash, Vec<u8>)>,
    /// Stat-cache rows of directories that are gone.
    pub cache_removals: Vec<Vec<u8>>,
    pub skipped: Vec<Skipped>,
    pub stats: CaptureStats,
}

impl Capture {
    /// Decoded new nodes, for reading a tree that is not persisted (status).
    pub fn overlay(&self) -> HashMap<Hash, Node> {
        self.new_nodes
            .iter()
            .filter_map(|(h, d)| Node::decode(d).ok().map(|n| (*h, n)))
            .collect()
    }
}

#[derive(Default)]
struct Outputs {
    new_nodes: Vec<(Hash, Vec<u8>)>,
    cache_updates: Vec<(Vec<u8>, Hash, Vec<u8>)>,
    visited: HashSet<Vec<u8>>,
    skipped: Vec<Skipped>,
}

/// Counters bumped from every walker thread: atomics, not the mutex.
#[derive(Default)]
struct Counters {
    entries: AtomicU64,
    files_hashed: AtomicU64,
    bytes_hashed: AtomicU64,
    bytes_new: AtomicU64,
    cloned: AtomicU64,
    copied: AtomicU64,
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
            bytes_new: get(&self.bytes_new),
            cloned: get(&self.cloned),
            copied: get(&self.copied),
        }
    }
}

/// Where captured file contents go: stored as objects (checkpoint) or only
/// hashed (status, diff against the live tree, dry runs).
#[derive(Clone, Copy)]
pub enum Sink<'a> {
    Store(&'a ObjectStore),
    HashOnly,
}

type IgnoreStack = Vec<(usize, Arc<ignore::gitignore::Gitignore>)>;

struct Walker<'a> {
    root_dev: u64,
    cache: &'a StatCache,
    sink: Sink<'a>,
    clock_ns: i64,
    out: Mutex<Outputs>,
    counters: Counters,
    progress: &'a Progress,
}

/// Capture the tree below `root`. `clock_ns` is the filesystem's notion of
/// "now" taken just before the walk (see the module docs on racy entries).
pub fn capture(
    root: &Dir,
    cache: &StatCache,
    sink: Sink<'_>,
    clock_ns: i64,
    progress: &Progress,
) -> Result<Capture> {
    let root_meta = root.meta().map_err(Error::os)?;
    let walker = Walker {
        root_dev: root_meta.dev,
        cache,
        sink,
        clock_ns,
        out: Mutex::new(Outputs::default()),
        counters: Counters::default(),
        progress,
    };
    let root_dir = root.try_clone().map_err(Error::os)?;
    let root_hash = walker.walk_dir(root_dir, Vec::new(), &IgnoreStack::new())?;
    let stats = walker.counters.snapshot();
    let out = walker.out.into_inner().unwrap_or_else(|p| p.into_inner());
    let cache_removals = cache
        .keys()
        .filter(|k| !out.visited.contains(*k))
        .cloned()
        .collect();
    let mut skipped = out.skipped;
    skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Capture {
        root: root_hash,
        new_nodes: out.new_nodes,
        cache_updates: out.cache_updates,
        cache_removals,
        skipped,
        stats,
    })
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
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

pub fn display_path(rel: &[u8]) -> String {
    String::from_utf8_lossy(rel).into_owned()
}

impl Walker<'_> {
    fn skip(&self, rel: &[u8], reason: impl Into<String>) {
        if let Ok(mut o) = self.out.lock() {
            o.skipped.push(Skipped {
                path: display_path(rel),
                reason: reason.into(),
            });
        }
    }

    fn ignore_stack(
        &self,
        dir: &Dir,
        rel: &[u8],
        names: &[OsString],
        parent: &IgnoreStack,
    ) -> Result<IgnoreStack> {
        if !names.iter().any(|n| n.as_bytes() == IGNORE_FILE.as_bytes()) {
            return Ok(parent.clone());
        }
        let (mut f, _) = match dir.open_read(OsStr::new(IGNORE_FILE)) {
            Ok(v) => v,
            Err(_) => return Ok(parent.clone()), // not a regular file: not a rule file
        };
        let mut text = String::new();
        std::io::Read::read_to_string(&mut f, &mut text).map_err(|e| Error::InvalidPath {
            path: PathBuf::from(OsStr::from_bytes(&join(rel, IGNORE_FILE.as_bytes()))),
            reason: format!("cannot read ignore rules: {e}"),
        })?;
        let mut builder = ignore::gitignore::GitignoreBuilder::new("/");
        for line in text.lines() {
            // A bad pattern is reported by the builder; keep the good ones.
            let _ = builder.add_line(None, line);
        }
        let matcher = builder.build().map_err(|e| Error::InvalidPath {
            path: PathBuf::from(OsStr::from_bytes(&join(rel, IGNORE_FILE.as_bytes()))),
            reason: format!("bad ignore pattern: {e}"),
        })?;
        let mut stack = parent.clone();
        stack.push((
            if rel.is_empty() { 0 } else { rel.len() + 1 },
            Arc::new(matcher),
        ));
        Ok(stack)
    }

    fn ignored(stack: &IgnoreStack, rel: &[u8], is_dir: bool) -> bool {
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

    fn walk_dir(&self, dir: Dir, rel: Vec<u8>, parent_ignores: &IgnoreStack) -> Result<Hash> {
        let mut names = dir.entries().map_err(Error::os)?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let ignores = self.ignore_stack(&dir, &rel, &names, parent_ignores)?;
        let cached = self.cache.get(&rel);

        let results: Vec<Result<Option<(Entry, StatRec)>>> = names
            .par_iter()
            .map(|name| self.visit(&dir, &rel, name, cached, &ignores))
            .collect();
        let mut entries = Vec::with_capacity(results.len());
        let mut recs = Vec::with_capacity(results.len());
        for r in results {
            if let Some((e, s)) = r? {
                entries.push(e);
                recs.push(s);
            }
        }
        let node = Node { entries };
        let encoded = node.encode();
        let hash = Node::hash_of_encoding(&encoded);
        let stats = StatRec::encode_all(&recs);
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let unchanged = cached.is_some_and(|c| c.node_hash == hash && c.stats == recs);
        if !unchanged {
            if cached.is_none_or(|c| c.node_hash != hash) {
                out.new_nodes.push((hash, encoded));
            }
            out.cache_updates.push((rel.clone(), hash, stats));
        }
        out.visited.insert(rel);
        Ok(hash)
    }

    fn visit(
        &self,
        dir: &Dir,
        rel: &[u8],
        name: &OsStr,
        cached: Option<&CachedDir>,
        ignores: &IgnoreStack,
    ) -> Result<Option<(Entry, StatRec)>> {
        let nb = name.as_bytes();
        if rel.is_empty() && nb == STATE_DIR.as_bytes() {
            return Ok(None);
        }
        let path = join(rel, nb);
        let meta = match dir.stat_at(name) {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Ok(None), // vanished while we walked
            Err(e) => return Err(Error::os(e)),
        };
        self.progress.inc(1);
        Counters::add(&self.counters.entries, 1);
        if meta.kind.is_special() {
            self.skip(
                &path,
                format!("{} (never opened, not captured)", meta.kind.as_str()),
            );
            return Ok(None);
        }
        if Self::ignored(ignores, &path, meta.kind == EntryKind::Dir) {
            return Ok(None);
        }
        if meta.dev != self.root_dev {
            self.skip(&path, "mount point (another filesystem is not crossed)");
            return Ok(None);
        }
        let rec = StatRec::from_meta(&meta, self.clock_ns);
        let prev = cached
            .and_then(|c| c.lookup(nb))
            .filter(|(_, s)| s.vouches_for(&meta))
            .map(|(e, _)| e);
        let entry = match meta.kind {
            EntryKind::File => match prev.filter(|e| e.kind() == Kind::File) {
                Some(e) => e.clone(),
                None => match self.hash_file(dir, name, &path, &meta)? {
                    Some((e, racy)) => {
                        return Ok(Some((
                            e,
                            StatRec {
                                racy: rec.racy || racy,
                                ..rec
                            },
                        )));
                    }
                    None => return Ok(None),
                },
            },
            EntryKind::Symlink => match prev.filter(|e| e.kind() == Kind::Symlink) {
                Some(e) => e.clone(),
                None => {
                    let target = match dir.readlink(name) {
                        Ok(t) => t,
                        Err(e) if e.is_not_found() => return Ok(None),
                        Err(e) => return Err(Error::os(e)),
                    };
                    Entry {
                        name: nb.to_vec(),
                        mode: meta.mode,
                        size: target.len() as u64,
                        mtime_ns: meta.mtime_ns,
                        target: Target::Link(target),
                        xattrs: Vec::new(),
                    }
                }
            },
            EntryKind::Dir => {
                let sub = match dir.open_dir(name) {
                    Ok(d) => d,
                    Err(e) if e.is_not_found() || e.is_redirected() => return Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        self.skip(&path, "directory not readable (permission denied)");
                        return Ok(None);
                    }
                    Err(e) => return Err(Error::os(e)),
                };
                let xattrs = match prev.filter(|e| e.kind() == Kind::Dir) {
                    Some(e) => e.xattrs.clone(),
                    None => sub.user_xattrs().map_err(Error::os)?,
                };
                let subtree = self.walk_dir(sub, path, ignores)?;
                Entry {
                    name: nb.to_vec(),
                    mode: meta.mode,
                    size: 0,
                    mtime_ns: meta.mtime_ns,
                    target: Target::Tree(subtree),
                    xattrs,
                }
            }
            _ => return Ok(None),
        };
        Ok(Some((entry, rec)))
    }

    /// Hash (and store) one regular file. Returns the entry and whether it
    /// changed while we read it (then its cache record is marked racy).
    fn hash_file(
        &self,
        dir: &Dir,
        name: &OsStr,
        path: &[u8],
        meta: &Meta,
    ) -> Result<Option<(Entry, bool)>> {
        let (mut file, opened) = match dir.open_read(name) {
            Ok(v) => v,
            Err(e) if e.is_not_found() || e.is_redirected() => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                self.skip(path, "file not readable (permission denied)");
                return Ok(None);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Other => return Ok(None), // swapped for a non-file
            Err(e) => return Err(Error::os(e)),
        };
        let xattrs = Xattr::list_user(&file).map_err(|e| {
            Error::os(rewind_platform::Error::new(
                "list xattrs",
                display_path(path),
                e,
            ))
        })?;
        let (hash, size) = match self.sink {
            Sink::Store(store) => {
                let ing = store.ingest(&file)?;
                Counters::add(&self.counters.bytes_new, ing.new_bytes);
                match ing.outcome {
                    rewind_platform::CloneOutcome::Cloned => {
                        Counters::add(&self.counters.cloned, 1)
                    }
                    rewind_platform::CloneOutcome::Copied => {
                        Counters::add(&self.counters.copied, 1)
                    }
                }
                (ing.hash, ing.size)
            }
            Sink::HashOnly => hash_reader(&mut file).map_err(|e| {
                Error::os(rewind_platform::Error::new("read", display_path(path), e))
            })?,
        };
        crate::failpoint::hit("capture:object-stored");
        let after = dir.stat_at(name).ok();
        let changed_meanwhile = after
            .is_none_or(|a| a.ino != meta.ino || a.ctime_ns != meta.ctime_ns || a.size != size);
        Counters::add(&self.counters.files_hashed, 1);
        Counters::add(&self.counters.bytes_hashed, size);
        let entry = Entry {
            name: path.rsplit(|&c| c == b'/').next().unwrap_or(path).to_vec(),
            mode: opened.mode,
            size,
            mtime_ns: opened.mtime_ns,
            target: Target::Object(hash),
            xattrs,
        };
        Ok(Some((entry, changed_meanwhile)))
    }
}
