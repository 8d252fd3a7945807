//! Retention and garbage collection (issue 7).
//!
//! Pruning is two steps, each crash-safe on its own:
//! 1. **Prune**: in one transaction, checkpoints the policy drops are marked
//!    `pruned_at` and a `gc` entry naming them goes on the chain. Rows stay,
//!    so history keeps its shape and the chain its entries.
//! 2. **Sweep** (mark and sweep): everything reachable from a live root is
//!    marked (unpruned checkpoints, the stat cache's nodes, an in-flight
//!    rewind's target); unmarked tree nodes and small objects are deleted in
//!    one transaction, then unmarked object files are unlinked.
//!
//! A crash between or inside the steps leaves only garbage that the next
//! sweep removes: nothing a live checkpoint reaches is ever deleted, because
//! the mark is computed afresh under the workspace lock, which every writer
//! (checkpoint, rewind, gc) holds for its whole run.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use serde::Serialize;

use crate::config::Retention;
use crate::error::Result;
use crate::hash::Hash;
use crate::ledger::Checkpoint;
use crate::tree::Target;
use crate::workspace::Workspace;

/// HEAD and this many of its nearest ancestors are protected: the agent's
/// recent past, where an undo most likely goes.
pub const RECENT_ANCESTORS: usize = 3;

/// Why a checkpoint may not be pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protection {
    /// The tree as it is now: never pruned, not even with `--force`.
    Head,
    /// The source or target of a rewind in flight: never pruned.
    RewindInProgress,
    RecentPast,
    UnresolvedEffect,
    /// The last rewind's safety checkpoint or target: `undo` goes there.
    UndoTarget,
}

impl Protection {
    pub fn forceable(self) -> bool {
        !matches!(self, Protection::Head | Protection::RewindInProgress)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Protected {
    pub id: String,
    pub reason: Protection,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Freed {
    pub tree_nodes: u64,
    /// Stored bytes of those nodes: a directory of 50,000 entries is a
    /// node of ~2 MB, rewritten by each checkpoint that changes it, so
    /// this can be most of what a gc frees (it said "167 B" while the
    /// ledger shrank by 24 MiB).
    pub tree_bytes: u64,
    pub small_objects: u64,
    pub object_files: u64,
    /// Logical bytes of the objects released.
    pub bytes: u64,
    /// Bytes those object files had allocated on disk (shared extents
    /// included: the filesystem frees only what no other file maps).
    pub allocated: u64,
    /// Of those, the bytes of extents no other file maps (fiemap, on a
    /// filesystem with clones; elsewhere the allocated bytes): what the
    /// filesystem frees at least. Clones of one file share nearly all
    /// their extents, so `allocated` said 238 MiB where 20 KiB were freed
    /// (helper-19, D157).
    pub unshared: u64,
    /// btrfs snapshots deleted: of pruned checkpoints, or left by a crash
    /// before their checkpoint was recorded.
    pub snapshots: u64,
    /// Content (logical bytes) that only those snapshots held: btrfs frees
    /// its extents in the background, less what other files still share.
    pub snapshot_bytes: u64,
    /// Snapshots that could not be deleted (a non-root user without the
    /// `user_subvol_rm_allowed` mount option), with why: the next gc with
    /// the right to do so deletes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots_left: Vec<String>,
    /// Bytes of free ledger pages this gc gave back to the filesystem,
    /// and those still free inside the ledger file: SQLite reuses them,
    /// and each gc gives back a bounded share (D44). "freed 66 MiB"
    /// while the file shrank by 7 read as a bug (helper-58, D297).
    pub ledger_released: u64,
    pub ledger_free: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub dry_run: bool,
    pub pruned: Vec<String>,
    pub kept: usize,
    pub protected: Vec<Protected>,
    pub freed: Freed,
    pub duration_ms: u64,
}

pub struct Options {
    pub policy: Retention,
    pub dry_run: bool,
    /// Also prune protected checkpoints (except HEAD and a rewind in flight).
    pub force: bool,
    /// How long to go on giving the ledger's free pages back: the user's
    /// `gc` until none is left (D320), the automatic one after a
    /// checkpoint a batch at most (it holds up the agent's call).
    pub give_back: std::time::Duration,
}

/// [`Options::give_back`] for the `gc` a user runs.
pub const GIVE_BACK_ALL: std::time::Duration = std::time::Duration::from_secs(3);

/// Why each protected checkpoint (by seq) may not be pruned.
pub fn protections(ws: &Workspace, checkpoints: &[Checkpoint]) -> Result<HashMap<i64, Protection>> {
    let ledger = ws.ledger();
    let mut p = HashMap::new();
    let by_seq: HashMap<i64, &Checkpoint> = checkpoints.iter().map(|c| (c.seq, c)).collect();
    for seq in ledger.unresolved_effect_heads()? {
        p.insert(seq, Protection::UnresolvedEffect);
    }
    if let Some(op) = ledger.last_operation()? {
        p.insert(op.safety, Protection::UndoTarget);
        p.insert(op.target, Protection::UndoTarget);
    }
    if let Some(head) = ledger.head()? {
        let mut cur = head.parent.as_ref().map(|p| p.0);
        for _ in 0..RECENT_ANCESTORS {
            let Some(seq) = cur else { break };
            p.insert(seq, Protection::RecentPast);
            cur = by_seq
                .get(&seq)
                .and_then(|c| c.parent.as_ref().map(|p| p.0));
        }
        p.insert(head.seq, Protection::Head);
    }
    if let Some(intent) = ledger.intent()? {
        p.insert(intent.target, Protection::RewindInProgress);
        p.insert(intent.safety, Protection::RewindInProgress);
    }
    Ok(p)
}

/// The checkpoints (seqs) the policy drops: those no rule keeps and no
/// protection (or, with `force`, no unforceable one) saves. Pure, so the
/// property tests can check it against the policy's definition.
pub fn select(
    checkpoints: &[Checkpoint],
    protected: &HashMap<i64, Protection>,
    policy: &Retention,
    now_ms: i64,
    force: bool,
) -> Vec<i64> {
    let live: Vec<&Checkpoint> = checkpoints.iter().filter(|c| !c.pruned).collect();
    let newest: HashSet<i64> = {
        let mut by_age: Vec<&&Checkpoint> = live.iter().collect();
        by_age.sort_by_key(|c| std::cmp::Reverse((c.created_at_ms, c.seq)));
        by_age
            .iter()
            .take(policy.keep_last)
            .map(|c| c.seq)
            .collect()
    };
    let within_ms = i64::try_from(policy.keep_within.as_millis()).unwrap_or(i64::MAX);
    live.iter()
        .filter(|c| {
            let kept_by_rule = newest.contains(&c.seq)
                || now_ms.saturating_sub(c.created_at_ms) < within_ms
                || (policy.keep_labeled && labeled_by_someone(c));
            let saved = protected
                .get(&c.seq)
                .is_some_and(|p| !force || !p.forceable());
            !kept_by_rule && !saved
        })
        .map(|c| c.seq)
        .collect()
}

/// A label someone gave (`checkpoint LABEL`, the MCP tool), which
/// `keep_labeled` keeps. Hook, automatic and safety checkpoints label
/// themselves ("before Bash: …", "before rewind to …"): counted as labeled,
/// every one of them was kept for ever, and once the size budget was
/// reached hooks stopped checkpointing, with advice that freed nothing.
fn labeled_by_someone(c: &Checkpoint) -> bool {
    c.label.is_some() && c.kind == "manual"
}

/// Apply the policy: prune, then sweep. Takes the workspace lock.
pub fn run(ws: &mut Workspace, opts: &Options) -> Result<Report> {
    let start = Instant::now();
    ws.lock()?;
    let sel = selection(ws, &opts.policy, opts.force)?;
    let by_seq: HashMap<i64, &Checkpoint> = sel.checkpoints.iter().map(|c| (c.seq, c)).collect();
    let pruned: Vec<String> = sel
        .prune
        .iter()
        .filter_map(|s| by_seq.get(s).map(|c| c.id.clone()))
        .collect();
    let kept = sel.checkpoints.iter().filter(|c| sel.survives(c)).count();
    let mut protected_list: Vec<Protected> = sel
        .checkpoints
        .iter()
        .filter(|c| sel.survives(c))
        .filter_map(|c| {
            sel.protected.get(&c.seq).map(|&reason| Protected {
                id: c.id.clone(),
                reason,
            })
        })
        .collect();
    protected_list.sort_by(|a, b| a.id.cmp(&b.id));

    if !opts.dry_run && !sel.prune.is_empty() {
        ws.ledger_mut().write(|tx| {
            for seq in &sel.prune {
                tx.mark_pruned(*seq)?;
            }
            tx.event(
                "gc",
                crate::chain::Fields::new()
                    .num("count", sel.prune.len() as u64)
                    .str("pruned", &pruned.join(",")),
            )?;
            Ok(())
        })?;
        crate::failpoint::hit("gc:pruned");
    }
    if !opts.dry_run && ws.ledger().meta(OVER_BUDGET)?.is_some() {
        // Re-evaluated after the next checkpoint's manifest.
        ws.ledger_mut().write(|tx| tx.delete_meta(OVER_BUDGET))?;
    }
    let live = sel.into_live();
    let freed = sweep(ws, &live, opts.dry_run, opts.give_back)?;
    Ok(Report {
        dry_run: opts.dry_run,
        pruned,
        kept,
        protected: protected_list,
        freed,
        duration_ms: start.elapsed().as_millis() as u64,
    })
}

/// Everything reachable from `roots` and the other live roots: tree nodes
/// and object hashes.
pub fn mark(ws: &Workspace, roots: &[Hash]) -> Result<(HashSet<Hash>, HashSet<Hash>)> {
    let ledger = ws.ledger();
    let mut stack: Vec<Hash> = roots.to_vec();
    let manifests: HashMap<Hash, Vec<Hash>> = ledger.chunk_manifests()?.into_iter().collect();
    if let Some(intent) = ledger.intent()? {
        stack.push(intent.to_root);
    }
    let (mut nodes, mut objects) = (HashSet::new(), HashSet::new());
    let progress = ws.progress("finding what is kept");
    while let Some(h) = stack.pop() {
        if !nodes.insert(h) {
            continue;
        }
        progress.inc(1);
        // A node missing here is damage `verify --deep` reports; the sweep
        // only needs to know what is reachable.
        let Some(node) = ledger.tree(&h)? else {
            continue;
        };
        for e in &node.entries {
            match e.target {
                Target::Tree(t) => stack.push(t),
                Target::Object(o) => {
                    // A chunked object keeps its manifest (keyed by its
                    // hash) and its chunks.
                    if objects.insert(o)
                        && let Some(chunks) = manifests.get(&o)
                    {
                        objects.extend(chunks.iter().copied());
                    }
                }
                Target::Link(_) => {}
            }
        }
    }
    Ok((nodes, objects))
}

/// Delete what no checkpoint in `live` reaches (or, dry, count it).
fn sweep(
    ws: &mut Workspace,
    live: &[Checkpoint],
    dry_run: bool,
    give_back: std::time::Duration,
) -> Result<Freed> {
    let roots: Vec<Hash> = live.iter().map(|c| c.root).collect();
    let (nodes, objects) = mark(ws, &roots)?;
    let mut freed = Freed::default();
    // Snapshots first: a pruned btrfs checkpoint's content is its snapshot.
    let mut keep: HashSet<String> = live.iter().map(|c| c.id.clone()).collect();
    keep.extend(ws.ledger().pending()?.into_iter().map(|p| p.id));
    for name in crate::snapshot::names(ws)? {
        if keep.contains(&name) {
            continue;
        }
        if dry_run {
            freed.snapshots += 1;
            continue;
        }
        match crate::snapshot::delete(ws, &name) {
            Ok(_) => freed.snapshots += 1,
            // Not ours to delete: say so, and free everything else.
            Err(e @ crate::error::Error::Btrfs { .. }) => {
                freed.snapshots_left.push(e.to_string());
            }
            Err(e) => return Err(e),
        }
        crate::failpoint::hit("gc:snapshot-deleted");
    }
    // A stat-cache row describing only what was pruned (the tree a rewind
    // left, whose checkpoint went) is dropped, not kept alive: it held the
    // pruned content on disk (D190). Dropping a row costs the next capture
    // a re-hash of that directory; keeping its node without its objects
    // would let the capture vouch for content no longer stored.
    let stale_rows: Vec<Vec<u8>> = ws
        .ledger()
        .stat_cache_nodes()?
        .into_iter()
        .filter(|(_, node)| !nodes.contains(node))
        .map(|(dir, _)| dir)
        .collect();
    let (dead_trees, dead_tree_sizes): (Vec<Hash>, Vec<u64>) = ws
        .ledger()
        .tree_sizes()?
        .into_iter()
        .filter(|(h, _)| !nodes.contains(h))
        .unzip();
    let dead_blobs: Vec<(Hash, u64)> = ws
        .ledger()
        .blob_sizes()?
        .into_iter()
        .filter(|(h, _)| !objects.contains(h))
        .collect();
    let dead_manifests: Vec<Hash> = ws
        .ledger()
        .chunk_manifests()?
        .into_iter()
        .map(|(h, _)| h)
        .filter(|h| !objects.contains(h))
        .collect();
    if freed.snapshots > 0 {
        freed.snapshot_bytes = held_only_by_snapshots(ws, &dead_trees, &objects)?;
    }
    freed.tree_nodes = dead_trees.len() as u64;
    freed.tree_bytes = dead_tree_sizes.iter().sum();
    freed.small_objects = dead_blobs.len() as u64;
    freed.bytes = dead_blobs.iter().map(|(_, n)| n).sum();
    if !dry_run
        && (!dead_trees.is_empty()
            || !dead_blobs.is_empty()
            || !dead_manifests.is_empty()
            || !stale_rows.is_empty())
    {
        // A million small objects: 14 s (helper-89).
        let progress = ws.progress("freeing ledger rows");
        progress.set_total((dead_trees.len() + dead_manifests.len() + dead_blobs.len()) as u64);
        ws.ledger_mut().write(|tx| {
            for dir in &stale_rows {
                tx.delete_stat_cache(dir)?;
            }
            for h in &dead_trees {
                tx.delete_tree(h)?;
                progress.inc(1);
            }
            for h in &dead_manifests {
                tx.delete_manifest(h)?;
                progress.inc(1);
            }
            for (h, _) in &dead_blobs {
                tx.delete_blob(h)?;
                progress.inc(1);
            }
            Ok(())
        })?;
        progress.finish();
        ws.ledger().forget_nodes();
        crate::failpoint::hit("gc:rows-swept");
    }
    let progress = ws.progress("freeing object files");
    for (hash, meta) in ws.store().files()? {
        if objects.contains(&hash) {
            continue;
        }
        progress.inc(1);
        freed.object_files += 1;
        freed.bytes += meta.size;
        freed.allocated += meta.allocated;
        freed.unshared += unshared_bytes(ws.store(), &hash, meta.allocated);
        if !dry_run {
            ws.store().remove_object(&hash)?;
            crate::failpoint::hit("gc:object-removed");
        }
    }
    progress.finish();
    if !dry_run {
        (freed.ledger_released, freed.ledger_free) = ws
            .saying("giving the ledger's free pages back", || {
                ws.ledger().release_free_pages(give_back)
            })?;
    }
    Ok(freed)
}

/// Bytes of the object file `hash`'s extents that no other file maps:
/// what removing it frees for sure. `allocated` where the filesystem
/// makes no clones or cannot say.
fn unshared_bytes(store: &crate::objects::ObjectStore, hash: &Hash, allocated: u64) -> u64 {
    if !store.clones() {
        return allocated;
    }
    let Ok(Some(file)) = store.open_object(hash) else {
        return allocated;
    };
    match rewind_platform::extents(&file, &store.object_path(hash)) {
        Ok(extents) => extents
            .iter()
            .filter(|e| !e.shared)
            .map(|e| e.length)
            .sum::<u64>()
            .min(allocated),
        Err(_) => allocated,
    }
}

/// The content that deleted snapshots held and nothing else does: objects
/// named by the dead tree nodes that no kept checkpoint reaches and the
/// store does not hold (a btrfs-engine checkpoint's content is in its
/// snapshot alone). Logical bytes, each object once: what btrfs frees in
/// the background, less what other files' extents still share.
fn held_only_by_snapshots(
    ws: &Workspace,
    dead_trees: &[Hash],
    live_objects: &HashSet<Hash>,
) -> Result<u64> {
    let mut seen = HashSet::new();
    let mut bytes = 0;
    for h in dead_trees {
        let Some(node) = ws.ledger().tree(h)? else {
            continue;
        };
        for e in &node.entries {
            if let Target::Object(o) = e.target
                && !live_objects.contains(&o)
                && seen.insert(o)
                && !ws.store().contains(&o, e.size)?
            {
                bytes += e.size;
            }
        }
    }
    Ok(bytes)
}

/// Checkpoints the budget may prune, oldest first: unpruned, unprotected,
/// and not labeled when the policy keeps labels.
fn budget_candidates(ws: &Workspace, policy: &Retention) -> Result<Vec<Checkpoint>> {
    let checkpoints = ws.ledger().checkpoints()?;
    let protected = protections(ws, &checkpoints)?;
    let mut c: Vec<Checkpoint> = checkpoints
        .into_iter()
        .filter(|c| !c.pruned && !protected.contains_key(&c.seq))
        .filter(|c| !(policy.keep_labeled && labeled_by_someone(c)))
        .collect();
    c.sort_by_key(|c| (c.created_at_ms, c.seq));
    Ok(c)
}

/// Prune oldest-first until the store fits `budget`. Returns the ids
/// pruned and the size reached.
fn enforce_budget(
    ws: &mut Workspace,
    policy: &Retention,
    budget: u64,
) -> Result<(Vec<String>, u64)> {
    let mut pruned = Vec::new();
    if crate::du::store_upper_bound(ws)? <= budget {
        return Ok((pruned, 0));
    }
    let mut used = crate::du::store_physical(ws)?.total();
    // Prune in growing batches: each round costs a sweep.
    let mut batch = 1;
    while used > budget {
        let candidates = budget_candidates(ws, policy)?;
        if candidates.is_empty() {
            break;
        }
        let take: Vec<&Checkpoint> = candidates.iter().take(batch).collect();
        let ids: Vec<String> = take.iter().map(|c| c.id.clone()).collect();
        ws.ledger_mut().write(|tx| {
            for c in &take {
                tx.mark_pruned(c.seq)?;
            }
            tx.event(
                "gc",
                crate::chain::Fields::new()
                    .num("count", take.len() as u64)
                    .str("pruned", &ids.join(","))
                    .str("reason", "max_store_bytes"),
            )?;
            Ok(())
        })?;
        let live: Vec<Checkpoint> = ws
            .ledger()
            .checkpoints()?
            .into_iter()
            .filter(|c| !c.pruned)
            .collect();
        sweep(ws, &live, false, std::time::Duration::ZERO)?;
        pruned.extend(ids);
        used = crate::du::store_physical(ws)?.total();
        batch *= 2;
    }
    Ok((pruned, used))
}

/// Before a checkpoint: make room under `max_store_bytes`, or refuse when
/// only protected checkpoints are left. Returns the ids pruned.
pub fn before_checkpoint(ws: &mut Workspace, policy: &Retention) -> Result<Vec<String>> {
    let Some(budget) = policy.max_store_bytes else {
        return Ok(Vec::new());
    };
    let (pruned, used) = enforce_budget(ws, policy, budget)?;
    if used > budget {
        return Err(crate::error::Error::OverBudget {
            budget,
            used,
            checkpoints: ws.ledger().live_checkpoints()?,
            force_frees: force_would_free(ws, policy).ok(),
        });
    }
    Ok(pruned)
}

/// What `gc --force` would free now (a dry run of its sweep): advice to
/// run it when it frees nothing sent users round in a circle, refused
/// again after it (helper-28, D203). Tree nodes, the extents only pruned
/// objects map, and what only pruned snapshots held.
fn force_would_free(ws: &mut Workspace, policy: &Retention) -> Result<u64> {
    let live = selection(ws, policy, true)?.into_live();
    let f = sweep(ws, &live, true, std::time::Duration::ZERO)?;
    Ok(f.tree_bytes + f.unshared + f.snapshot_bytes)
}

/// What a gc with `policy` (and `force`) would prune now: the
/// checkpoints, their protections, and the seqs to prune, in order and
/// as a set. One computation for `gc` itself and for what `gc --force`
/// would free (D203).
struct Selection {
    checkpoints: Vec<Checkpoint>,
    protected: HashMap<i64, Protection>,
    prune: Vec<i64>,
    prune_set: HashSet<i64>,
}

impl Selection {
    /// Not pruned before, and not to be pruned now.
    fn survives(&self, c: &Checkpoint) -> bool {
        !c.pruned && !self.prune_set.contains(&c.seq)
    }

    /// The checkpoints left once the selection is pruned.
    fn into_live(mut self) -> Vec<Checkpoint> {
        let all = std::mem::take(&mut self.checkpoints);
        all.into_iter().filter(|c| self.survives(c)).collect()
    }
}

fn selection(ws: &Workspace, policy: &Retention, force: bool) -> Result<Selection> {
    let checkpoints = ws.ledger().checkpoints()?;
    let protected = protections(ws, &checkpoints)?;
    let prune = select(
        &checkpoints,
        &protected,
        policy,
        crate::time::now_ms(),
        force,
    );
    let prune_set = prune.iter().copied().collect();
    Ok(Selection {
        checkpoints,
        protected,
        prune,
        prune_set,
    })
}

/// Meta key: the store's size when the last retention run found it over
/// `max_store_bytes` with only protected checkpoints left.
pub const OVER_BUDGET: &str = "over_budget";

/// A btrfs checkpoint is acknowledged before any retention runs (that
/// happens after its manifest): refuse it when the last run left the store
/// over budget, as the walk engine's `before_checkpoint` would.
pub fn refuse_if_over_budget(ws: &mut Workspace, policy: &Retention) -> Result<()> {
    let (Some(budget), Some(used)) = (policy.max_store_bytes, ws.ledger().meta(OVER_BUDGET)?)
    else {
        return Ok(());
    };
    let used: u64 = used.parse().unwrap_or(u64::MAX);
    if used > budget {
        return Err(crate::error::Error::OverBudget {
            budget,
            used,
            checkpoints: ws.ledger().live_checkpoints()?,
            force_frees: force_would_free(ws, policy).ok(),
        });
    }
    Ok(())
}

/// Whether the policy may prune a batch now. Two counts decide most of the
/// time that nothing can go: too few checkpoints, or too few older than
/// keep_within. No lock needed.
fn enough_to_prune(ws: &Workspace, policy: &Retention) -> Result<bool> {
    let live = ws.ledger().live_checkpoints()?;
    let batch = (policy.keep_last / 10).max(10);
    let within_ms = i64::try_from(policy.keep_within.as_millis()).unwrap_or(i64::MAX);
    Ok(live > policy.keep_last + batch
        && ws
            .ledger()
            .live_checkpoints_before(crate::time::now_ms().saturating_sub(within_ms))?
            >= batch)
}

/// Whether [`after_checkpoint`] has anything to do (a budget to check, or
/// enough checkpoints to prune): callers that do not hold the workspace
/// lock ask first, so they take it only when needed.
pub fn after_checkpoint_needed(ws: &Workspace, policy: &Retention) -> Result<bool> {
    Ok(policy.max_store_bytes.is_some() || (policy.auto && enough_to_prune(ws, policy)?))
}

/// After a checkpoint: apply the policy, batched so that the O(store)
/// sweep runs once per `batch` prunable checkpoints rather than every
/// time; then the budget. Returns the ids pruned and a warning when the
/// store is still over budget.
pub fn after_checkpoint(
    ws: &mut Workspace,
    policy: &Retention,
) -> Result<(Vec<String>, Option<String>)> {
    let mut pruned = Vec::new();
    if policy.auto {
        let batch = (policy.keep_last / 10).max(10);
        // Two cheap counts first; the selection only when they pass.
        if enough_to_prune(ws, policy)? && selection(ws, policy, false)?.prune.len() >= batch {
            let r = run(
                ws,
                &Options {
                    policy: policy.clone(),
                    dry_run: false,
                    force: false,
                    give_back: std::time::Duration::ZERO,
                },
            )?;
            pruned.extend(r.pruned);
        }
    }
    let mut warning = None;
    if let Some(budget) = policy.max_store_bytes {
        let (ids, used) = enforce_budget(ws, policy, budget)?;
        pruned.extend(ids);
        // Remembered for checkpoints that cannot afford to measure the
        // store first (the btrfs engine's acknowledgement).
        let flagged = ws.ledger().meta(OVER_BUDGET)?.is_some();
        if (used > budget) != flagged {
            ws.ledger_mut().write(|tx| {
                if used > budget {
                    tx.set_meta(OVER_BUDGET, &used.to_string())
                } else {
                    tx.delete_meta(OVER_BUDGET)
                }
            })?;
        }
        if used > budget {
            let frees = force_would_free(ws, policy).ok();
            let way_out = match frees {
                Some(f) if used.saturating_sub(f) > budget => format!(
                    "raise the budget to {} or more (`rewind gc --force` would free only {})",
                    crate::progress::human_bytes_above(used),
                    crate::progress::human_bytes(f)
                ),
                _ => "raise the budget or run `rewind gc --force`".into(),
            };
            warning = Some(format!(
                "the store uses {}, over max_store_bytes = {}, and every remaining checkpoint is protected: the next checkpoint will be refused; {way_out}",
                crate::progress::human_bytes(used),
                crate::progress::human_bytes(budget)
            ));
        }
    }
    Ok((pruned, warning))
}

/// What [`missing`] found, and how many btrfs snapshots it walked.
pub struct Missing {
    pub damage: Vec<String>,
    pub snapshots_walked: usize,
}

/// Content a live checkpoint reaches that is not in the store (`verify
/// --deep`): after any gc, crashed or not, this must be empty.
pub fn missing(ws: &Workspace) -> Result<Missing> {
    let checkpoints = ws.ledger().checkpoints()?;
    let mut out = Vec::new();
    // One line for all the snapshots: each walk alone is under the second
    // a line waits for, and 29 of them showed nothing for 14 s (helper-70).
    let snapshots = checkpoints
        .iter()
        .filter(|c| !c.pruned && c.stats["engine"] == "btrfs")
        .count();
    let progress = ws.progress("verifying snapshots");
    progress.set_total(snapshots as u64);
    let mut walked = 0;
    let mut seen = HashSet::new();
    let mut stack: Vec<(Hash, String)> = Vec::new();
    for c in checkpoints.iter().filter(|c| !c.pruned) {
        if c.stats["engine"] != "btrfs" {
            stack.push((c.root, c.id.clone()));
            continue;
        }
        // A btrfs checkpoint's content is its read-only snapshot: walk it
        // (the stat cache vouches for unchanged inodes) and compare roots.
        match crate::snapshot::open(ws, &c.id)? {
            None => out.push(format!(
                "snapshot of checkpoint {} is missing or no longer read-only",
                c.id
            )),
            Some(snap) => {
                let walk = crate::snapshot::walk_of(ws, &snap, "")?;
                walked += 1;
                progress.inc(1);
                if walk.root != c.root {
                    out.push(format!(
                        "snapshot of checkpoint {} does not match its manifest (root {} instead of {}){}",
                        c.id,
                        walk.root,
                        c.root,
                        differing_paths(ws, &walk, &c.root)
                    ));
                }
            }
        }
    }
    progress.finish();
    let progress = ws.progress("checking that every object is stored");
    while let Some((h, owner)) = stack.pop() {
        if !seen.insert(h) {
            continue;
        }
        progress.inc(1);
        let Some(node) = ws.ledger().tree_uncached(&h)? else {
            out.push(format!("tree node {h} of checkpoint {owner} is missing"));
            continue;
        };
        for e in &node.entries {
            match e.target {
                Target::Tree(t) => stack.push((t, owner.clone())),
                Target::Object(o) => {
                    if seen.insert(o) && !ws.store().contains(&o, e.size)? {
                        out.push(format!(
                            "object {o} of checkpoint {owner} is missing or cut short"
                        ));
                    }
                }
                Target::Link(_) => {}
            }
        }
    }
    Ok(Missing {
        damage: out,
        snapshots_walked: walked,
    })
}

/// What differs between a snapshot's walk and the manifest it should
/// equal, its first paths: the roots alone told no one what was changed,
/// nor that only times were (helper-76). Empty when the diff cannot be
/// made (a node of the manifest missing is said on its own).
fn differing_paths(ws: &Workspace, walk: &crate::capture::Capture, manifest: &Hash) -> String {
    const SHOWN: usize = 5;
    let trees = crate::diff::Trees::with_overlay(ws.ledger(), walk.overlay());
    let opts = crate::diff::DiffOptions {
        compare_mtime: true,
    };
    let Ok(changes) = crate::diff::diff(&trees, manifest, &walk.root, opts) else {
        return String::new();
    };
    if changes.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = changes
        .iter()
        .take(SHOWN)
        .map(|c| {
            format!(
                "{} {}",
                crate::names::human_bytes_name(&c.path),
                c.status().as_str()
            )
        })
        .collect();
    let more = match changes.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(": {}{more} (an mtime counts)", shown.join(", "))
}

/// Where each of `wanted` is held: a path and the newest checkpoint that
/// holds it there, for each one found. `verify --deep` named damaged
/// objects by hash alone, which told no one what was affected
/// (helper-74). Walks trees only while something is still unfound, each
/// tree node once (the first checkpoint to reach it names the path).
pub fn where_held(ws: &Workspace, wanted: &[Hash]) -> Result<HashMap<Hash, (String, Vec<u8>)>> {
    let mut left: HashSet<Hash> = wanted.iter().copied().collect();
    let mut found = HashMap::new();
    let mut seen = HashSet::new();
    for c in ws
        .ledger()
        .checkpoints()?
        .iter()
        .rev()
        .filter(|c| !c.pruned)
    {
        let mut stack: Vec<(Hash, Vec<u8>)> = vec![(c.root, Vec::new())];
        while let Some((h, path)) = stack.pop() {
            if left.is_empty() {
                return Ok(found);
            }
            if !seen.insert(h) {
                continue;
            }
            let Some(node) = ws.ledger().tree_uncached(&h)? else {
                continue;
            };
            for e in &node.entries {
                let mut p = path.clone();
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(&e.name);
                match e.target {
                    Target::Tree(t) => stack.push((t, p)),
                    Target::Object(o) if left.remove(&o) => {
                        found.insert(o, (c.id.clone(), p));
                    }
                    Target::Object(_) | Target::Link(_) => {}
                }
            }
        }
    }
    Ok(found)
}
