//! `rewind du`: what the history costs, honestly.
//!
//! Three numbers per checkpoint and in total:
//! - **logical**: bytes of the files the checkpoint's tree holds;
//! - **unique**: bytes of content that only this checkpoint references
//!   (what pruning it alone would release);
//! - **physical**: bytes the store occupies on disk. Reflink clones share
//!   extents with the workspace and with each other, so object files are
//!   measured with FIEMAP: each physical extent counts once, and extents the
//!   live workspace still maps count zero (deleting the store would not
//!   free them). Where FIEMAP is unsupported (tmpfs), allocated blocks are
//!   used instead.
//!
//! Cost: one decode per distinct tree node and one pass over the edges
//! between them, whatever the number of checkpoints (D338); one FIEMAP per
//! object file and per large live file.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::Serialize;

use crate::blobs::INLINE_MAX;
use crate::error::Result;
use crate::hash::Hash;
use crate::ledger::Checkpoint;
use crate::tree::Target;
use crate::workspace::Workspace;

#[derive(Debug, Serialize)]
pub struct CheckpointUsage {
    pub id: String,
    pub label: Option<String>,
    pub created_at: String,
    pub logical: u64,
    pub unique: u64,
    /// Disk bytes only this checkpoint holds: its unique content, minus
    /// extents the live tree still maps, and the ledger rows of the tree
    /// nodes it alone reaches (D344).
    pub unique_physical: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Totals {
    pub checkpoints: usize,
    pub pruned: usize,
    /// Distinct content the history references, counted once.
    pub content: u64,
    /// Of `ledger_file`, pages in use (the rest is free space SQLite reuses).
    pub ledger_used: u64,
    #[serde(flatten)]
    pub footprint: Footprint,
}

/// The store's footprint on disk (see the module docs for how each part
/// is measured).
#[derive(Debug, Default, Clone, Serialize)]
pub struct Footprint {
    pub ledger_file: u64,
    pub object_files: u64,
    pub object_logical: u64,
    pub object_allocated: u64,
    /// Object bytes on disk that only the store holds (FIEMAP).
    pub object_physical: u64,
    /// Extents the object files map (each is metadata the filesystem keeps).
    pub object_extents: u64,
    /// Read-only snapshots of btrfs-engine checkpoints, and the files in
    /// them measured as content no object file holds (each once).
    pub snapshots: u64,
    pub snapshot_files: u64,
    /// Snapshots on disk that no kept checkpoint has (a pruned one `gc`
    /// could not delete, helper-79): their space is not measured.
    pub snapshots_left: u64,
    /// Filesystem metadata the object files cost (inodes, extent records):
    /// an estimate, see [`MetadataCost`].
    pub metadata_estimate: u64,
    /// The space `gc` is given back on a full disk (D274).
    pub reserve: u64,
    /// `ledger_file` + `object_physical` + `metadata_estimate` +
    /// `reserve`: what deleting `.rewind/` frees.
    pub physical: u64,
    /// How `object_physical` was measured: fiemap or allocated.
    pub method: &'static str,
}

#[derive(Debug, Serialize)]
pub struct Usage {
    pub checkpoints: Vec<CheckpointUsage>,
    pub total: Totals,
}

/// Which live checkpoints reach a node or an object: all that `unique`
/// needs to know, merged along the tree's edges instead of counted per
/// checkpoint (D338).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    Unreached,
    Only(usize),
    Many,
}

impl Reach {
    fn and(self, other: Reach) -> Reach {
        match (self, other) {
            (Reach::Unreached, r) | (r, Reach::Unreached) => r,
            (Reach::Only(a), Reach::Only(b)) if a == b => self,
            _ => Reach::Many,
        }
    }
}

/// The distinct tree nodes the live checkpoints reach, each read once.
/// Nodes and objects are numbered so that an edge costs two `u32`s: a
/// history of 2,000 versions of a wide directory holds millions of them
/// (helper-85: 514 MiB when every decoded node was kept).
#[derive(Default)]
struct Graph {
    index: HashMap<Hash, u32>,
    /// Per node: its subtrees, once per entry (a tree holding the same
    /// subtree twice holds its bytes twice).
    children: Vec<Vec<u32>>,
    /// Per node: bytes of its own file entries.
    own_bytes: Vec<u64>,
    /// Per node: bytes of its row in the ledger.
    node_bytes: Vec<u64>,
    /// Children before parents.
    post_order: Vec<u32>,
    /// (object, node holding it), once per distinct node.
    holds: Vec<(u32, u32)>,
    objects: Vec<(Hash, u64)>,
    object_index: HashMap<Hash, u32>,
}

impl Graph {
    fn read(ws: &Workspace, roots: impl Iterator<Item = Hash>) -> Result<Graph> {
        enum Step {
            Visit(Hash),
            Finish(u32, Vec<Hash>),
        }
        let mut g = Graph::default();
        let progress = ws.progress("reading the checkpoints' trees");
        let mut stack: Vec<Step> = roots.map(Step::Visit).collect();
        stack.reverse();
        while let Some(step) = stack.pop() {
            match step {
                Step::Finish(n, subtrees) => {
                    // A Merkle DAG has no cycles: every subtree is done.
                    g.children[n as usize] = subtrees.iter().map(|h| g.index[h]).collect();
                    g.post_order.push(n);
                }
                Step::Visit(h) => {
                    if g.index.contains_key(&h) {
                        continue;
                    }
                    let n = g.own_bytes.len() as u32;
                    progress.inc(1);
                    g.index.insert(h, n);
                    g.own_bytes.push(0);
                    g.children.push(Vec::new());
                    let mut subtrees = Vec::new();
                    let read = ws.ledger().tree_and_row_bytes(&h)?;
                    g.node_bytes
                        .push(read.as_ref().map_or(0, |(_, bytes)| *bytes));
                    if let Some((node, _)) = read {
                        for entry in &node.entries {
                            match entry.target {
                                Target::Tree(t) => subtrees.push(t),
                                Target::Object(o) => {
                                    g.own_bytes[n as usize] += entry.size;
                                    let next = g.objects.len() as u32;
                                    let obj = *g.object_index.entry(o).or_insert(next);
                                    if obj == next {
                                        g.objects.push((o, entry.size));
                                    }
                                    g.holds.push((obj, n));
                                }
                                Target::Link(_) => {}
                            }
                        }
                    }
                    let unvisited: Vec<Hash> = subtrees
                        .iter()
                        .filter(|t| !g.index.contains_key(*t))
                        .copied()
                        .collect();
                    stack.push(Step::Finish(n, subtrees));
                    stack.extend(unvisited.into_iter().map(Step::Visit));
                }
            }
        }
        Ok(g)
    }

    /// Bytes of every file beneath each node, duplicates included.
    fn logical(&self) -> Vec<u64> {
        let mut total = self.own_bytes.clone();
        for &n in &self.post_order {
            let below: u64 = self.children[n as usize]
                .iter()
                .map(|&c| total[c as usize])
                .fold(0, u64::saturating_add);
            total[n as usize] = total[n as usize].saturating_add(below);
        }
        total
    }

    /// Which of `roots` (checkpoint i's root is `roots[i]`) reach each
    /// node and each object: one pass over the nodes, parents before
    /// children.
    fn reach(&self, roots: &[Hash]) -> (Vec<Reach>, Vec<Reach>) {
        let mut node = vec![Reach::Unreached; self.own_bytes.len()];
        for (i, r) in roots.iter().enumerate() {
            let n = self.index[r] as usize;
            node[n] = node[n].and(Reach::Only(i));
        }
        for &n in self.post_order.iter().rev() {
            let r = node[n as usize];
            for &c in &self.children[n as usize] {
                node[c as usize] = node[c as usize].and(r);
            }
        }
        let mut object = vec![Reach::Unreached; self.objects.len()];
        for &(o, n) in &self.holds {
            object[o as usize] = object[o as usize].and(node[n as usize]);
        }
        (node, object)
    }
}

pub fn usage(ws: &Workspace) -> Result<Usage> {
    let checkpoints: Vec<Checkpoint> = ws.ledger().checkpoints()?;
    let live: Vec<&Checkpoint> = checkpoints.iter().filter(|c| !c.pruned).collect();
    let roots: Vec<Hash> = live.iter().map(|c| c.root).collect();
    let graph = Graph::read(ws, roots.iter().copied())?;
    let below = graph.logical();
    let logical: Vec<u64> = roots
        .iter()
        .map(|r| below[graph.index[r] as usize])
        .collect();
    let (node_reach, reach) = graph.reach(&roots);
    // A directory's node is rewritten whole when one entry changes: a
    // one-byte edit in a directory of 200,000 entries added 8.25 MiB of
    // ledger that `du` showed nowhere while `gc` freed it (helper-89).
    let mut unique_nodes = vec![0u64; live.len()];
    for (&r, &bytes) in node_reach.iter().zip(&graph.node_bytes) {
        if let Reach::Only(i) = r {
            unique_nodes[i] += bytes;
        }
    }
    // An object is unique to checkpoint i when i alone reaches it. A
    // chunked object (ext4, D90) is counted by its stored chunks: one
    // chunk is unique to i when every object holding it is. Counting the
    // whole object gave each version of an 8 MiB file "8 MiB unique, 0 on
    // disk" where 1 MiB was theirs (D117).
    let mut unique_objects: Vec<Vec<(Hash, u64)>> = vec![Vec::new(); live.len()];
    let mut chunk_reach: HashMap<Hash, (u64, Reach)> = HashMap::new();
    for (&(o, size), &r) in graph.objects.iter().zip(&reach) {
        match ws.store().stored_chunks(&o, size)? {
            Some(chunks) => {
                for (c, len) in chunks {
                    chunk_reach
                        .entry(c)
                        .and_modify(|(_, who)| *who = who.and(r))
                        .or_insert((len, r));
                }
            }
            None => {
                if let Reach::Only(i) = r {
                    unique_objects[i].push((o, size));
                }
            }
        }
    }
    for (c, (len, r)) in chunk_reach {
        if let Reach::Only(i) = r {
            unique_objects[i].push((c, len));
        }
    }

    let store = store_physical(ws)?;
    let total = Totals {
        checkpoints: live.len(),
        pruned: checkpoints.len() - live.len(),
        content: graph.objects.iter().map(|(_, s)| s).sum(),
        ledger_used: ws.ledger().used_bytes()?.0,
        footprint: store.footprint,
    };
    let (cost, live_extents, object_extents) = (store.cost, store.live, store.objects);
    let method = total.footprint.method;

    let checkpoints = live
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut unique = 0;
            let mut unique_physical = unique_nodes[i];
            for (o, size) in &unique_objects[i] {
                unique += size;
                unique_physical += match object_extents.get(o) {
                    Some(ext) if method == "fiemap" => {
                        outside(&union(ext.clone()), &live_extents) + cost.of(1, ext.len() as u64)
                    }
                    Some(ext) => ext.iter().map(|e| e.1).sum(),
                    // Small objects live in the ledger: their bytes are their cost.
                    None if *size < INLINE_MAX => *size,
                    None => 0,
                };
            }
            CheckpointUsage {
                id: c.id.clone(),
                label: c.label.clone(),
                created_at: c.created_at.clone(),
                logical: logical[i],
                unique,
                unique_physical,
            }
        })
        .collect();
    Ok(Usage { checkpoints, total })
}

/// The store's footprint, and what the per-checkpoint breakdown needs to
/// attribute it.
pub struct StorePhysical {
    pub footprint: Footprint,
    cost: MetadataCost,
    live: Vec<(u64, u64)>,
    objects: HashMap<Hash, Vec<(u64, u64)>>,
}

impl StorePhysical {
    /// What the size budget counts: all but the reserve, which is fixed
    /// and there for the gc a budget runs (D274).
    pub fn total(&self) -> u64 {
        self.footprint.physical - self.footprint.reserve
    }
}

/// What a file and an extent cost in filesystem metadata. Clones are
/// cheap in data but not free: every object file is an inode, and every
/// extent it maps is a record (btrfs keeps a file extent item and a
/// back-reference, twice with its default DUP metadata; XFS a block-map,
/// reverse-map and refcount record). Measured on Linux 6.18 with
/// `tests/gc.rs` (100 clones of a 200 MiB file fragmenting 4 KiB at a
/// time): btrfs ~270 B (2026-11-29) to ~290 B (2026-11-30) and XFS ~47 B
/// per extent. An estimate, reported as such (`metadata_estimate`); btrfs
/// took 256 until its rounding down left `du` 10% under `df`.
#[derive(Debug, Clone, Copy)]
pub struct MetadataCost {
    pub per_file: u64,
    pub per_extent: u64,
    /// A btrfs snapshot: its root item and the tree blocks it keeps
    /// (copy-on-write makes the first change under each one a copy).
    pub per_snapshot: u64,
}

impl MetadataCost {
    pub fn for_fs(kind: rewind_platform::FsKind) -> MetadataCost {
        use rewind_platform::FsKind;
        match kind {
            FsKind::Btrfs => MetadataCost {
                per_file: 1024,
                per_extent: 280,
                // tests/gc.rs, 100 snapshots each after a 4 KiB write into
                // a 200 MiB file: ~22 KiB each (copy-on-write of the tree
                // blocks the next change shares with the snapshot, DUP).
                per_snapshot: 22 << 10,
            },
            FsKind::Xfs => MetadataCost {
                per_file: 512,
                per_extent: 48,
                per_snapshot: 0,
            },
            _ => MetadataCost {
                per_file: 256,
                per_extent: 12,
                per_snapshot: 0,
            },
        }
    }

    pub fn of(&self, files: u64, extents: u64) -> u64 {
        files * self.per_file + extents * self.per_extent
    }
}

/// Ledger file bytes, plus object extents not mapped by the live tree,
/// each counted once.
pub fn store_physical(ws: &Workspace) -> Result<StorePhysical> {
    let ledger_file = ledger_allocated(ws);
    let reserve = file_allocated(&ws.meta_path().join(crate::workspace::RESERVE));
    // Snapshots share extents with live files of any size (unchanged
    // since); object files only with those big enough to be cloned.
    let min_size = if crate::snapshot::names(ws)?.is_empty() {
        crate::objects::CLONE_MIN
    } else {
        1
    };
    let live = live_tree_extents(ws, min_size)?;
    let mut method = "fiemap";
    let mut objects: HashMap<Hash, Vec<(u64, u64)>> = HashMap::new();
    let (mut object_files, mut object_logical, mut object_allocated) = (0, 0, 0);
    for (hash, meta) in ws.store().files()? {
        object_files += 1;
        object_logical += meta.size;
        object_allocated += meta.allocated;
        let extents = ws
            .store()
            .open_object(&hash)?
            .and_then(|f| rewind_platform::extents(&f, &ws.store().object_path(&hash)).ok());
        match extents {
            Some(ext) => {
                objects.insert(hash, ext.iter().map(|e| (e.physical, e.length)).collect());
            }
            None => {
                method = "allocated";
                objects.insert(hash, vec![(u64::MAX, meta.allocated)]);
            }
        }
    }
    let (snapshots, snapshot_files) = snapshot_extents(ws, &mut objects)?;
    let snapshots_left = (crate::snapshot::names(ws)?.len() as u64).saturating_sub(snapshots);
    let object_physical = if method == "fiemap" {
        let all: Vec<(u64, u64)> = objects.values().flatten().copied().collect();
        outside(&union(all), &live)
    } else {
        object_allocated
    };
    let object_extents: u64 = objects.values().map(|e| e.len() as u64).sum();
    let cost = MetadataCost::for_fs(ws.fs().kind);
    let metadata_estimate = cost.of(object_files, object_extents) + snapshots * cost.per_snapshot;
    Ok(StorePhysical {
        footprint: Footprint {
            ledger_file,
            object_files,
            object_logical,
            object_allocated,
            object_physical,
            object_extents,
            snapshots,
            snapshot_files,
            snapshots_left,
            metadata_estimate,
            reserve,
            physical: ledger_file + object_physical + metadata_estimate + reserve,
            method,
        },
        cost,
        live,
        objects,
    })
}

/// Content of live btrfs-engine checkpoints that no object file holds is
/// in their snapshots: measure each such object once, at the first path
/// that holds it, into `objects`. Returns (snapshots, files measured).
fn snapshot_extents(
    ws: &Workspace,
    objects: &mut HashMap<Hash, Vec<(u64, u64)>>,
) -> Result<(u64, u64)> {
    let (mut snapshots, mut files) = (0, 0);
    let mut seen = HashSet::new();
    // A million files' extents: 28 s (helper-89).
    let progress = ws.progress("mapping the snapshots' files");
    for c in ws.ledger().checkpoints()? {
        if c.pruned || c.stats["engine"] != "btrfs" {
            continue;
        }
        let Some(snap) = crate::snapshot::open(ws, &c.id)? else {
            continue;
        };
        snapshots += 1;
        for_each_file(ws, c.root, Some(&mut seen), |path, hash, _| {
            if !objects.contains_key(&hash)
                && let Some(ext) = extents_at(&snap, path)
            {
                objects.insert(hash, ext);
                files += 1;
                progress.inc(1);
            }
        })?;
    }
    Ok((snapshots, files))
}

/// Call `f(path, object, size)` for every file entry of the tree `root`.
/// With `seen`, a node already in it is skipped (each distinct subtree is
/// visited once, across calls); without, every path is visited.
fn for_each_file(
    ws: &Workspace,
    root: Hash,
    mut seen: Option<&mut HashSet<Hash>>,
    mut f: impl FnMut(&[u8], Hash, u64),
) -> Result<()> {
    let mut stack = vec![(root, Vec::<u8>::new())];
    while let Some((h, dir)) = stack.pop() {
        if let Some(seen) = seen.as_deref_mut()
            && !seen.insert(h)
        {
            continue;
        }
        let Some(node) = ws.ledger().tree(&h)? else {
            continue;
        };
        for e in &node.entries {
            let path = if dir.is_empty() {
                e.name.clone()
            } else {
                [dir.as_slice(), b"/", &e.name].concat()
            };
            match e.target {
                Target::Tree(t) => stack.push((t, path)),
                Target::Object(o) => f(&path, o, e.size),
                Target::Link(_) => {}
            }
        }
    }
    Ok(())
}

/// The physical extents (start, length) of the file at `path` beneath
/// `tree`; `None` when it cannot be opened or mapped.
fn extents_at(tree: &rewind_platform::Dir, path: &[u8]) -> Option<Vec<(u64, u64)>> {
    let p = Path::new(OsStr::from_bytes(path));
    let (f, _) = tree.open_read_beneath(p).ok()?;
    let ext = rewind_platform::extents(&f, p).ok()?;
    Some(ext.iter().map(|x| (x.physical, x.length)).collect())
}

/// A cheap upper bound of [`store_physical`]: allocated blocks, shared
/// extents counted in full (one stat per object file, no FIEMAP).
pub fn store_upper_bound(ws: &Workspace) -> Result<u64> {
    // Snapshots have no cheap bound (their content is whole trees).
    if !crate::snapshot::names(ws)?.is_empty() {
        return Ok(store_physical(ws)?.total());
    }
    let objects: u64 = ws.store().files()?.iter().map(|(_, m)| m.allocated).sum();
    Ok(ledger_allocated(ws) + objects)
}

/// Allocated bytes of the ledger and its WAL and shared-memory files.
fn ledger_allocated(ws: &Workspace) -> u64 {
    let path = ws.ledger().path();
    file_allocated(path)
        + file_allocated(&path.with_extension("db-wal"))
        + file_allocated(&path.with_extension("db-shm"))
}

fn file_allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Extents of the live files that can share with the store: those at HEAD
/// of at least `min_size` bytes, where they still exist.
fn live_tree_extents(ws: &Workspace, min_size: u64) -> Result<Vec<(u64, u64)>> {
    let Some(head) = ws.head()? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    // Every path: two paths with the same content are two files.
    for_each_file(ws, head.root, None, |path, _, size| {
        if size >= min_size
            && let Some(ext) = extents_at(ws.root_dir(), path)
        {
            out.extend(ext);
        }
    })?;
    Ok(union(out))
}

/// Sorted, merged ranges (start, length).
fn union(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, l) in v {
        if let Some(last) = out.last_mut()
            && s <= last.0.saturating_add(last.1)
        {
            let end = (s.saturating_add(l)).max(last.0.saturating_add(last.1));
            last.1 = end - last.0;
            continue;
        }
        out.push((s, l));
    }
    out
}

/// Bytes of `a` (merged) not covered by `b` (merged).
fn outside(a: &[(u64, u64)], b: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    let mut j = 0;
    for &(s, l) in a {
        let end = s.saturating_add(l);
        let mut covered = 0;
        while j < b.len() && b[j].0.saturating_add(b[j].1) <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < end {
            let (bs, be) = (b[k].0.max(s), b[k].0.saturating_add(b[k].1).min(end));
            covered += be.saturating_sub(bs);
            k += 1;
        }
        total += l - covered.min(l);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::{outside, union};

    #[test]
    fn extents_are_counted_once_and_live_ones_not_at_all() {
        assert_eq!(
            union(vec![(10, 5), (0, 4), (12, 10), (30, 1)]),
            vec![(0, 4), (10, 12), (30, 1)]
        );
        let objects = union(vec![(0, 100), (50, 100), (200, 10)]);
        assert_eq!(outside(&objects, &[]), 160);
        assert_eq!(outside(&objects, &union(vec![(0, 150)])), 10);
        assert_eq!(outside(&objects, &union(vec![(100, 105)])), 100 + 5);
    }
}
