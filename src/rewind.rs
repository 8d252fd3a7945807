//! Rewind, replay, undo and restore: one mechanism (DESIGN §4).
//!
//! 1. capture the live tree as a `pre-rewind` checkpoint (nothing is lost);
//! 2. plan = tree diff(live, target), O(changed);
//! 3. persist the intent in the same transaction as the safety checkpoint;
//! 4. apply in place; 5. syncfs; 6. commit HEAD and clear the intent.
//!
//! A crash anywhere after 3 leaves the intent; the next command that opens
//! the workspace re-captures the live tree and applies diff(live, target)
//! again. Applying is idempotent, so recovery always ends at the target.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

use serde::Serialize;

use crate::apply::{self, ApplyOptions, ApplyReport};
use crate::capture::{Sink, Skipped};
use crate::chain::Fields;
use crate::diff::{self, Change, DiffOptions, Trees};
use crate::durable::{self, Before, Synced};
use crate::error::{Error, Result, Shortfall};
use crate::failpoint;
use crate::hash::{Hash, Hasher};
use crate::keep;
use crate::ledger::{Checkpoint, Intent, Operation};
use crate::mount::Frozen;
use crate::progress::Progress;
use crate::snapshot::{self, Engine};
use crate::workspace::{
    ChangeJson, NewCheckpoint, Workspace, content_changes, insert_checkpoint, write_capture,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Rewind,
    Replay,
    Undo,
    Restore,
}

/// "restore from X" (it copies paths out of X), "rewind to X" (the tree
/// becomes X): the label "before restore to X" misread (helper-74).
pub fn preposition(op: &str) -> &'static str {
    if op == Op::Restore.as_str() {
        "from"
    } else {
        "to"
    }
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Rewind => "rewind",
            Op::Replay => "replay",
            Op::Undo => "undo",
            Op::Restore => "restore",
        }
    }

    fn parse(s: &str) -> Op {
        match s {
            "replay" => Op::Replay,
            "undo" => Op::Undo,
            "restore" => Op::Restore,
            _ => Op::Rewind,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RewindOptions {
    pub dry_run: bool,
    pub expect: Option<String>,
    pub report: Option<String>,
    pub exact_times: bool,
    pub allow_setuid: bool,
    /// Restore only these workspace-relative paths.
    pub paths: Vec<Vec<u8>>,
}

#[derive(Debug, Default, Serialize)]
pub struct Written {
    pub written: u64,
    pub deleted: u64,
}

#[derive(Debug, Serialize)]
pub struct RewindReport {
    pub op: &'static str,
    pub rewound_to: String,
    pub safety_checkpoint: Option<String>,
    pub head: Option<String>,
    pub dry_run: bool,
    pub plan_fingerprint: String,
    pub changes: Written,
    pub plan: Vec<ChangeJson>,
    pub kept: Vec<Skipped>,
    pub setuid_stripped: Vec<String>,
    /// Admitted external effects that this rewind went back past and that
    /// no rewind can undo (DESIGN §5): `guard` refuses them again. Those an
    /// earlier rewind left behind are not listed again (`rewind effects`
    /// lists them all).
    pub effects_not_undone: Vec<crate::effects::Effect>,
    pub duration_ms: u64,
    /// Something asked for that was not done, said rather than dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// `PLAN_CHANGED` unless the plan's fingerprint `fp` is the one
/// `--expect` names (when it names one). A fingerprint is read as ids
/// are, whatever its case; anything that cannot be one is a usage error,
/// not a plan that changed (helper-59, D294).
fn check_expected(opts: &RewindOptions, fp: &str) -> Result<()> {
    let Some(expected) = &opts.expect else {
        return Ok(());
    };
    let given = expected.trim();
    if given.len() != fp.len() || !given.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Usage(format!(
            "--expect takes the {}-hex-digit fingerprint a --dry-run printed, not {}",
            fp.len(),
            crate::names::quoted_label(&crate::names::cut(expected, 40))
        )));
    }
    if !given.eq_ignore_ascii_case(fp) {
        return Err(Error::PlanChanged {
            expected: given.to_string(),
            actual: fp.to_string(),
        });
    }
    Ok(())
}

/// The fingerprint `--expect` compares: the plan itself, what it writes
/// and deletes and what it replaces there, not the whole live tree. A
/// fingerprint of the live tree's root changed with any change anywhere,
/// a `touch` of a file the plan never looks at included, and refused a
/// plan that was still exactly the one reviewed (helper-19, D156).
/// Modification times count only with `--exact-times`, as in the plan.
fn fingerprint(op: Op, to: &Hash, changes: &[Change], opts: &RewindOptions) -> String {
    fn bytes(h: &mut Hasher, b: &[u8]) {
        h.update(&(b.len() as u64).to_be_bytes());
        h.update(b);
    }
    let mut h = Hasher::default();
    h.update(b"rewind-plan-v2\0");
    h.update(op.as_str().as_bytes());
    h.update(&to.0);
    h.update(&[opts.exact_times as u8, opts.allow_setuid as u8]);
    for p in &opts.paths {
        bytes(&mut h, p);
    }
    for c in changes {
        bytes(&mut h, &c.path);
        for side in [&c.old, &c.new] {
            let Some(e) = side else {
                h.update(&[0]);
                continue;
            };
            h.update(&[1]);
            h.update(&e.mode.to_be_bytes());
            h.update(&e.size.to_be_bytes());
            if opts.exact_times {
                h.update(&e.mtime_ns.to_be_bytes());
            }
            match &e.target {
                crate::tree::Target::Object(x) => bytes(&mut h, &[b"o".as_slice(), &x.0].concat()),
                crate::tree::Target::Tree(x) => bytes(&mut h, &[b"t".as_slice(), &x.0].concat()),
                crate::tree::Target::Link(t) => bytes(&mut h, &[b"l".as_slice(), t].concat()),
            }
            for x in &e.xattrs {
                bytes(&mut h, &x.name);
                bytes(&mut h, &x.value);
            }
        }
    }
    h.finish().to_hex()[..16].to_string()
}

/// The changes that take the live tree `from` to `to`, the tree of
/// checkpoint `target_id`, restricted to `paths` when given (then missing
/// parent directories are created too). Nothing at or below a path that
/// checkpoint skipped (`kept`) is touched: it holds nothing for it (D143).
fn plan(
    live: &rewind_platform::Dir,
    trees: &Trees<'_>,
    from: &Hash,
    (target_id, to): (&str, &Hash),
    paths: &[Vec<u8>],
    kept: &[Vec<u8>],
    opts: DiffOptions,
) -> Result<Vec<Change>> {
    let mut out = plan_all(live, trees, from, (target_id, to), paths, opts)?;
    if !kept.is_empty() {
        let kept: std::collections::HashSet<Vec<u8>> = kept.iter().cloned().collect();
        out.retain(|c| !crate::capture::is_at_or_below(&c.path, &kept));
    }
    // A nested workspace's state is not ours to write or delete, even
    // where a checkpoint from before D82 holds it.
    out.retain(|c| {
        let is_dir = [&c.old, &c.new]
            .into_iter()
            .flatten()
            .any(|e| e.kind() == crate::tree::Kind::Dir);
        !crate::capture::in_nested_state(&c.path, is_dir)
    });
    Ok(out)
}

/// Whether something is at `rel` in the live tree (not following a
/// symlink on the way or at the end).
fn live_entry_exists(live: &rewind_platform::Dir, rel: &[u8]) -> bool {
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(rel));
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return false;
    };
    live.open_beneath(parent)
        .and_then(|d| d.stat_at(name))
        .is_ok()
}

/// [`plan`] before it leaves out what it must not touch.
fn plan_all(
    live: &rewind_platform::Dir,
    trees: &Trees<'_>,
    from: &Hash,
    (target_id, to): (&str, &Hash),
    paths: &[Vec<u8>],
    opts: DiffOptions,
) -> Result<Vec<Change>> {
    if paths.is_empty() {
        return diff::diff(trees, from, to, opts);
    }
    let mut out: Vec<Change> = Vec::new();
    for p in paths {
        let old = trees.entry_at(from, p)?;
        let new = trees.entry_at(to, p)?;
        if old.is_none() && new.is_none() {
            // Named through a symlink: the trees hold the link, not what
            // is below it.
            let mut link = None;
            for parent in crate::capture::ancestors(p) {
                for root in [from, to] {
                    if trees
                        .entry_at(root, parent)?
                        .is_some_and(|e| e.kind() == crate::tree::Kind::Symlink)
                    {
                        link = link.or(Some(parent));
                    }
                }
            }
            let reason = match link {
                // Never captured (D38): the effect rules are not rewound.
                None if p.as_slice() == crate::capture::CONFIG_FILE.as_bytes() => {
                    "is never captured: the effect rules and hooks in rewind.toml are not rewound (D38), so no checkpoint holds it".into()
                }
                Some(l) => format!(
                    "is below {}, a symlink: rewind restores the link itself; name the path its target leads to",
                    crate::names::human_bytes_name(l)
                ),
                // There, but in neither tree: the capture left it out.
                None if live_entry_exists(live, p) => format!("is in the workspace but in no capture: the ignore rules exclude it (`.rewindignore`, `.rewind/ignore`) or it could not be read, so checkpoint {target_id} holds nothing to restore"),
                None => format!("exists neither in checkpoint {target_id} nor in the workspace (check the path with `rewind diff {target_id} live`)"),
            };
            return Err(Error::InvalidPath {
                path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(p)),
                reason,
            });
        }
        // Parents the live tree lacks (or has as non-directories).
        for prefix in crate::capture::ancestors(p) {
            let live = trees.entry_at(from, prefix)?;
            if live
                .as_ref()
                .is_none_or(|e| e.kind() != crate::tree::Kind::Dir)
                && let Some(t) = trees.entry_at(to, prefix)?
            {
                out.push(Change {
                    path: prefix.to_vec(),
                    old: live,
                    new: Some(t),
                });
            }
        }
        diff::diff_entries(trees, old.as_ref(), new.as_ref(), p, opts, &mut out)?;
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup_by(|a, b| a.path == b.path);
    Ok(out)
}

/// Rewind-like operations. `target` is a user-typed checkpoint name.
pub fn run(ws: &mut Workspace, op: Op, target: &str, opts: &RewindOptions) -> Result<RewindReport> {
    let run = |ws: &mut Workspace| {
        let target = {
            let _t = crate::trace::span("resolve target");
            ws.resolve(target)?
        };
        run_to(ws, op, target, opts)
    };
    locked_unless_dry(ws, opts, run)
}

/// Run `op`; a dry run takes no lock, so a gc may prune what it reads
/// and it reads again (D237).
fn locked_unless_dry(
    ws: &mut Workspace,
    opts: &RewindOptions,
    mut op: impl FnMut(&mut Workspace) -> Result<RewindReport>,
) -> Result<RewindReport> {
    if opts.dry_run {
        ws.read_unlocked(op)
    } else {
        op(ws)
    }
}

/// Undo the last rewind, replay, undo or restore: go back to its safety
/// checkpoint. Undoing twice is a redo.
pub fn undo(ws: &mut Workspace, opts: &RewindOptions) -> Result<RewindReport> {
    let undo = |ws: &mut Workspace| {
        ws.recover_if_needed()?;
        let last = ws.ledger().last_operation()?.ok_or(Error::NothingToUndo)?;
        let target = ws
            .ledger()
            .checkpoint_by_seq(last.safety)?
            .ok_or(Error::NothingToUndo)?;
        run_to(ws, Op::Undo, target, opts)
    };
    locked_unless_dry(ws, opts, undo)
}

fn run_to(
    ws: &mut Workspace,
    op: Op,
    target: Checkpoint,
    opts: &RewindOptions,
) -> Result<RewindReport> {
    let started = Instant::now();
    if let Some(note) = &opts.report
        && note.len() > NOTE_MAX
    {
        return Err(Error::Usage(format!(
            "the report is {} bytes: keep it under {} KiB (what was tried and why it failed)",
            note.len(),
            NOTE_MAX / 1024
        )));
    }
    let mut aopts = ApplyOptions {
        exact_times: opts.exact_times,
        allow_setuid: opts.allow_setuid,
        restored_below_ns: None,
    };
    let dopts = DiffOptions {
        compare_mtime: opts.exact_times,
    };
    // Effects already off the timeline are not this rewind's to report: a
    // long session listed every one an earlier rewind had left behind,
    // 212 lines for a one-file rewind (helper-85). `rewind effects`
    // lists them all.
    let off_before: std::collections::HashSet<(String, String)> = match opts.dry_run {
        true => Default::default(),
        false => ws
            .ledger()
            .effects_not_undone()?
            .into_iter()
            .map(|e| (e.scope, e.key))
            .collect(),
    };
    if opts.dry_run {
        ws.recover_if_needed()?;
        let cap = ws.capture(Sink::HashOnly, "planning")?;
        let trees = Trees::with_overlay(ws.ledger(), cap.overlay()).with_target(target.root);
        let Planned { changes, mut kept } = plan_in(
            ws,
            &trees,
            &cap.root,
            &target.root,
            &target.id,
            &opts.paths,
            dopts,
        )?;
        let fp = fingerprint(op, &target.root, &changes, opts);
        // `--dry-run --expect` asks whether the plan is still that one:
        // answered as the real run would, not ignored (helper-31, D214).
        check_expected(opts, &fp)?;
        // Refused as the real run would be: a dry run offered the plan of
        // a changed snapshot, which the rewind then refused (helper-76).
        check_space(ws, &changes)?;
        check_objects(ws, &target, &changes)?;
        let changes = keep::what_deletions_leave(ws, &trees, changes, &mut kept)?;
        let counts = diff::count(&changes);
        return Ok(RewindReport {
            op: op.as_str(),
            rewound_to: target.id.clone(),
            safety_checkpoint: None,
            head: ws.head()?.map(|h| h.id),
            dry_run: true,
            plan_fingerprint: fp,
            changes: Written {
                written: counts.added + counts.modified,
                deleted: counts.deleted,
            },
            plan: ChangeJson::from_changes(&changes),
            kept,
            setuid_stripped: Vec::new(),
            effects_not_undone: Vec::new(),
            duration_ms: started.elapsed().as_millis() as u64,
            // A dry run records nothing: the agent must know its note
            // went nowhere, or it never gives it again.
            warning: opts.report.as_ref().map(|_| {
                "the report was not stored: a dry run records nothing; give it again with the rewind itself".to_string()
            }),
        });
    }

    ws.lock()?;
    let target = confirm_target(ws, target)?;
    // Mounted: nobody sees the tree from the safety capture until the
    // apply is done and the kernel's caches are dropped.
    let mut frozen = {
        let _t = crate::trace::span("freeze");
        ws.freeze()?
    };
    // Until the apply, nothing changes the tree: a rewind with nothing to
    // do, or refused, thaws without the daemon forgetting every cached
    // entry and marking the whole tree dirty (the next checkpoint walked
    // all of it) or announcing the root to watchers (helper-87, D339).
    if let Some(f) = frozen.as_mut() {
        f.changed(Vec::new());
    }
    // 1. Capture first: the live tree is saved before anything changes
    //    (the btrfs engine snapshots it and builds the manifest right away:
    //    the plan needs it).
    let safety_snapshot = match ws.engine().0 {
        Engine::Btrfs => Some(snapshot::take_snapshot(ws)?),
        Engine::Walk | Engine::Fuse => None,
    };
    // Per-entry fsyncs make only what the apply touched durable; what it
    // left alone (an edit the agent made without an fsync that already
    // equals the target) must be durable already: the safety snapshot's
    // transaction commit saw to that (D68). Without one, the capture says
    // which entries may not be (D85).
    let before_is_durable = safety_snapshot.is_some();
    let new_objects = ws.store().track_new()?;
    let mut cap = match &safety_snapshot {
        Some(s) => snapshot::capture(ws, s)?,
        None => ws
            .capture_live()
            .map_err(|e| deleted_by_the_rewind(ws, op, &target, opts, e))?,
    };
    failpoint::hit("rewind:captured");
    let unsettled = crate::workspace::unsettled_warning(&cap.unsettled, "the safety checkpoint");
    // Read before the apply: what it restores gets an older mtime (D275).
    aopts.restored_below_ns = (cap.clock_ns != i64::MIN).then_some(cap.clock_ns);
    // 2. Plan. The capture's new nodes are decoded once and serve the plan,
    //    the safety checkpoint's diff and the apply.
    let head = ws.head()?;
    let trees = Trees::with_overlay(ws.ledger(), cap.overlay()).with_target(target.root);
    let (changes, kept_skipped) = {
        let _t = crate::trace::span("plan");
        let Planned { changes, kept } = plan_in(
            ws,
            &trees,
            &cap.root,
            &target.root,
            &target.id,
            &opts.paths,
            dopts,
        )?;
        (changes, kept)
    };
    let fp = fingerprint(op, &target.root, &changes, opts);
    check_expected(opts, &fp)?;
    // Nothing to do (a retried rewind, a second `undo` of nothing): no
    // safety checkpoint, no operation. Recorded, it became the last
    // operation, so `undo` led only to the tree it already was, and the
    // safety checkpoint of the rewind before it, where the agent's work
    // was, lost the protection gc gives the last one (helper-19). A
    // rewind to another checkpoint whose tree the live one already is
    // still has HEAD to move, and a note to keep (D185): it goes on, and
    // writes no file.
    let head_is_target = head.as_ref().is_some_and(|h| h.seq == target.seq);
    if changes.is_empty() && (op == Op::Restore || head_is_target) {
        return Ok(RewindReport {
            op: op.as_str(),
            rewound_to: target.id.clone(),
            safety_checkpoint: None,
            head: head.map(|h| h.id),
            dry_run: false,
            plan_fingerprint: fp,
            changes: Written::default(),
            plan: Vec::new(),
            kept: kept_skipped,
            setuid_stripped: Vec::new(),
            effects_not_undone: Vec::new(),
            duration_ms: started.elapsed().as_millis() as u64,
            // The note is about a branch being left, and none is: the
            // agent must know it was not kept (helper-26).
            warning: opts.report.as_ref().map(|_| {
                format!(
                    "the report was not stored: the tree already equals {}, so there is no branch to leave it on",
                    target.id
                )
            }),
        });
    }
    let safety_changes = content_changes(&trees, head.as_ref(), &cap.root)?;
    let overlay = trees.into_overlay();
    // Object files stored again for the plan: kept with the capture's.
    let stored_again;
    {
        let _t = crate::trace::span("check space, sync state");
        ws.check_writable_subvolume()?;
        check_space(ws, &changes)?;
        check_objects(ws, &target, &changes)?;
        stored_again = store_what_the_plan_replaces(ws, &mut cap, &changes)?;
        ws.sync_state(&mut cap)?;
    }
    let before = match before_is_durable {
        true => Before::Durable,
        false => durable::State::before(cap.durable.as_ref()),
    };
    // Mounted, the tree is frozen from the capture to the commit: nothing
    // but the apply changes it.
    let quiescent = frozen.is_some();
    let seen = Seen {
        clock_ns: cap.clock_ns,
        recent: std::mem::take(&mut cap.recent),
        quiescent,
        store_below_ns: cap
            .durable
            .as_ref()
            .and_then(durable::State::store_below_ns),
    };

    // 3. Safety checkpoint + intent, one transaction. HEAD serves as the
    //    safety checkpoint when the live tree has the same content.
    let head_matches = head.is_some() && safety_changes == diff::Counts::default();
    let workspace_id = ws.ledger().meta("workspace_id")?.unwrap_or_default();
    let ws_engine = ws.engine().0;
    let label = format!(
        "before {} {} {}",
        op.as_str(),
        preposition(op.as_str()),
        target.id
    );
    let intent_options = serde_json::json!({
        "exact_times": opts.exact_times,
        "allow_setuid": opts.allow_setuid,
        "paths": opts.paths.iter().map(|p| crate::hash::hex(p)).collect::<Vec<_>>(),
    });
    let t = crate::trace::span("commit safety checkpoint + intent");
    // The plan's files are made meanwhile, unless a snapshot is their
    // source (D357).
    let source = snapshot::open(ws, &target.id)?;
    let stage = source.is_none();
    let (committed, staged) = ws.commit_alongside(
        |ledger| {
            ledger.write_leaving_anchor(|tx| {
                cap.stats.bytes_new += write_capture(tx, &cap)?;
                let safety = match head.as_ref().filter(|_| head_matches) {
                    Some(h) => h.seq,
                    None => insert_checkpoint(
                        tx,
                        &workspace_id,
                        &cap,
                        &NewCheckpoint {
                            label: Some(&label),
                            kind: "pre-rewind",
                            parent: head.as_ref().map(|h| h.seq),
                            changes: safety_changes,
                        },
                        safety_snapshot
                            .as_ref()
                            .map(|s| (s.seq, s.id.as_str(), s.created_at_ms)),
                        ws_engine,
                    )?,
                };
                if let Some(note) = &opts.report {
                    tx.set_note(safety, note)?;
                }
                let safety_id = tx.checkpoint_id(safety)?;
                tx.event(
                    "rewind",
                    Fields::new()
                        .str("op", op.as_str())
                        .str("target", &target.id)
                        .bytes("target_root", &target.root.0)
                        .str("safety", &safety_id)
                        .bytes("from_root", &cap.root.0)
                        .str("fingerprint", &fp),
                )?;
                tx.set_intent(&Intent {
                    op: op.as_str().into(),
                    target: target.seq,
                    safety,
                    to_root: target.root,
                    options: intent_options.clone(),
                })?;
                tx.set_meta("head", &safety.to_string())?;
                tx.probe_operations()?;
                Ok(safety)
            })
        },
        |store| match stage {
            true => apply::Staged::stage(store, &changes),
            false => apply::Staged::default(),
        },
    );
    let safety_seq = committed?;
    // From the intent to the commit, a Ctrl-C waits for the last change.
    let finish_first = finish_first();
    let mut kept = cap.objects_kept();
    kept.extend(stored_again);
    new_objects.keep_named(&kept);
    drop(t);
    ws.commit_dirty()?;
    // The safety snapshot is kept unless HEAD served as the safety
    // checkpoint (then dropping it deletes it).
    if let Some(s) = &safety_snapshot
        && !head_matches
    {
        s.keep();
    }
    drop(safety_snapshot);
    failpoint::hit("rewind:after-intent");
    let t = crate::trace::span("apply");

    let held_open = open_for_writing(ws, &changes, frozen.as_ref());
    // 4. Apply in place. If the tree changed under us (a directory swapped
    //    for a symlink), finish from a fresh capture instead.
    let mut retried_from = None;
    if let Some(f) = frozen.as_mut() {
        f.anything_may_change();
    }
    let report = {
        let trees = Trees::with_overlay(ws.ledger(), overlay).with_target(target.root);
        let report = apply_plan(ws, source.as_ref(), &trees, &changes, aopts, staged);
        // The safety capture's nodes were committed in step 3.
        ws.ledger().remember_nodes(trees.into_overlay());
        report
    };
    let report = match report {
        Ok(r) => {
            if let Some(f) = frozen.as_mut() {
                f.changed(changes.iter().map(|c| c.path.clone()));
            }
            Ok(r)
        }
        Err(Error::Os(e)) if e.is_redirected() || e.is_not_found() => {
            // What was made in the tree since the safety capture is in no
            // checkpoint, and the plan from a fresh capture removes it:
            // saved first (helper-30, D213).
            let label = format!("before retrying a {} to {}", op.as_str(), target.id);
            let to = (target.id.as_str(), target.root);
            checkpoint_live_before(ws, &label, to, safety_seq, &opts.paths, dopts).and_then(
                |saved| {
                    retried_from = saved;
                    reapply_from_live(
                        ws,
                        &target.id,
                        target.root,
                        &opts.paths,
                        (aopts, dopts),
                        Some(safety_seq),
                    )
                },
            )
        }
        Err(e) => Err(e),
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            let (id, paths) = (&target.id, &opts.paths);
            return Err(roll_back(ws, op, id, safety_seq, paths, aopts, dopts, e));
        }
    };
    drop(t);
    // 5 + 6.
    finish(
        ws,
        op,
        target.seq,
        safety_seq,
        &report,
        Finish {
            recovered: false,
            before,
            seen,
            signals: finish_first,
        },
    )?;
    drop(frozen);
    // Named once the mount is thawed: naming reads other processes' maps,
    // which waits for any of them faulting on the frozen mount (D264).
    let held_open = held_open.map(|h| h.warning(ws));
    let safety = ws.ledger().checkpoint_by_seq(safety_seq)?;
    let effects_not_undone: Vec<_> = ws
        .ledger()
        .effects_not_undone()?
        .into_iter()
        .filter(|e| !off_before.contains(&(e.scope.clone(), e.key.clone())))
        .collect();
    Ok(RewindReport {
        op: op.as_str(),
        rewound_to: target.id.clone(),
        safety_checkpoint: safety.map(|s| s.id),
        head: ws.head()?.map(|h| h.id),
        dry_run: false,
        plan_fingerprint: fp,
        changes: Written {
            written: report.written,
            deleted: report.deleted,
        },
        plan: ChangeJson::from_changes(&changes),
        kept: report.kept.into_iter().chain(kept_skipped).collect(),
        setuid_stripped: report.setuid_stripped,
        effects_not_undone,
        duration_ms: started.elapsed().as_millis() as u64,
        warning: join_warnings([
            retried_from.map(|id| {
                format!(
                    "the tree changed while the rewind applied its plan, so it finished from a fresh capture; what the tree held then, made after the safety checkpoint, is checkpoint {id}"
                )
            }),
            held_open,
            unsettled,
        ]),
    })
}

/// The warnings given, as one (`None` if none).
fn join_warnings<const N: usize>(warnings: [Option<String>; N]) -> Option<String> {
    let all: Vec<String> = warnings.into_iter().flatten().collect();
    (!all.is_empty()).then(|| all.join("; "))
}

/// The most files a rewind checks for writers before it replaces them:
/// an agent's rewind replaces a few; a huge one is not slowed by this.
const WRITERS_CHECKED: usize = 256;

/// The files the plan replaces or deletes that another process has open
/// for writing, said: that process goes on writing into the file the
/// rewind replaced, which no checkpoint sees, and its output is lost
/// when it closes it (a dev server's log: helper-30, D220). Named with
/// their holders. Natively the kernel says it through a read lease,
/// which is refused while a writer has the file open; through a mount
/// its daemon says which files it has open for writing once its freeze
/// let short writers close (D244). The `/proc` walk that names the
/// holders runs only when one is found.
fn open_for_writing(ws: &Workspace, changes: &[Change], frozen: Option<&Frozen>) -> Option<Held> {
    let replaced = changes.iter().filter(|c| {
        c.old
            .as_ref()
            .is_some_and(|e| e.kind() == crate::tree::Kind::File)
    });
    let (paths, under): (Vec<Vec<u8>>, &std::path::Path) = match (ws.mount(), frozen) {
        // The daemon keeps backing files open read-write after their
        // last close (passthrough), so every lease is refused there: it
        // is asked instead, and the holders are found through the mount.
        (Some(m), Some(f)) => {
            let open: HashSet<&[u8]> = f.open_for_writing().iter().map(Vec::as_slice).collect();
            if open.is_empty() {
                return None;
            }
            let held = replaced
                .filter(|c| open.contains(c.path.as_slice()))
                .take(WRITERS_CHECKED)
                .map(|c| c.path.clone())
                .collect();
            (held, m.mount_point())
        }
        (Some(_), None) => return None,
        (None, _) => {
            let held = replaced
                .take(WRITERS_CHECKED)
                .filter(|c| {
                    let (parent, name) = crate::capture::split_parent(&c.path);
                    ws.root_dir()
                        .open_beneath(std::path::Path::new(OsStr::from_bytes(parent)))
                        .ok()
                        .and_then(|d| d.open_for_writing_elsewhere(OsStr::from_bytes(name)))
                        .unwrap_or(false)
                })
                .map(|c| c.path.clone())
                .collect();
            (held, ws.root_path())
        }
    };
    (!paths.is_empty()).then(|| Held {
        paths,
        under: under.to_path_buf(),
    })
}

/// Files a rewind replaced under a writer ([`open_for_writing`]), and
/// where their paths start.
struct Held {
    paths: Vec<Vec<u8>>,
    under: std::path::PathBuf,
}

impl Held {
    /// The warning, with each file's holders.
    fn warning(&self, ws: &Workspace) -> String {
        let me = std::process::id();
        // The daemon's backing fds read as paths under a mount over the
        // workspace itself: it is no holder.
        let daemon = ws.mount().map(|m| m.daemon_pid());
        let named: Vec<String> = self
            .paths
            .iter()
            .map(|p| {
                let abs = self.under.join(OsStr::from_bytes(p));
                let by = rewind_platform::holders(&abs, |pid, _| pid == me || Some(pid) == daemon);
                let path = crate::names::human_os_path(std::path::Path::new(OsStr::from_bytes(p)));
                if by.is_empty() {
                    path.into_owned()
                } else {
                    format!("{path} ({})", by.join(", "))
                }
            })
            .collect();
        format!(
            "open for writing by another process when the rewind replaced it: {}; such a process goes on writing into the replaced file, which no checkpoint holds: restart it (or have it reopen the file)",
            named.join("; ")
        )
    }
}

/// A rewind's plan in this workspace: what `target_id`'s checkpoint
/// skipped is left alone (D143) and, where it is here now, reported; what the
/// live capture did not see (D168), what the target's own ignore rules
/// excluded (D167) and, as root for the workspace's owner, what they
/// could not change (D164) are set apart, each with its reason (`kept`).
struct Planned {
    changes: Vec<Change>,
    kept: Vec<Skipped>,
}

fn plan_in(
    ws: &Workspace,
    trees: &Trees<'_>,
    from: &Hash,
    to: &Hash,
    target_id: &str,
    paths: &[Vec<u8>],
    dopts: DiffOptions,
) -> Result<Planned> {
    let skipped = ws.ledger().skipped(target_id)?;
    let changes = plan(
        ws.root_dir(),
        trees,
        from,
        (target_id, to),
        paths,
        &skipped,
        dopts,
    )?;
    // What the target's capture skipped and is here now: the dry run
    // left these out, the rewind listed them (helper-78).
    let mut kept: Vec<Skipped> = skipped
        .iter()
        .filter(|p| trees.entry_at(from, p).ok().flatten().is_some())
        .map(|p| {
            Skipped::new(
                p,
                format!(
                    "kept: checkpoint {target_id} skipped it (unreadable, not a regular file, or a mount point then), so it holds nothing for it"
                ),
            )
        })
        .collect();
    let changes = keep::what_the_capture_did_not_see(ws, trees, from, changes, &mut kept)?;
    let changes = keep::what_the_target_ignores(ws, trees, to, target_id, changes, &mut kept)?;
    let changes = keep::what_the_owner_could_not_change(ws, changes, &mut kept)?;
    Ok(Planned { changes, kept })
}

/// Refuse before touching anything rather than fail half-way on a full
/// disk: the inodes the plan makes must be free (ext4 has a fixed
/// number, and ran out with bytes to spare, helper-81), and where clones
/// are impossible, the blocks its files and directories take. Bytes were
/// counted, not blocks: 30,000 one-byte files passed as 165 KiB and
/// needed 120 MiB, and the rewind stopped half-way (helper-81).
fn check_space(ws: &Workspace, changes: &[Change]) -> Result<()> {
    check_descriptors(ws, changes)?;
    let fs = rewind_platform::FsInfo::of(ws.root_dir()).map_err(Error::os)?;
    let (made, removed) = changes
        .iter()
        .fold((0u64, 0u64), |(m, r), c| match c.status() {
            diff::Status::Added => (m + 1, r),
            diff::Status::Type => (m + 1, r + 1),
            diff::Status::Deleted => (m, r + 1),
            diff::Status::Modified => (m, r),
        });
    // The apply removes first: what it removes frees the inodes it makes.
    let net = made.saturating_sub(removed);
    if net > 0
        && let Some(free) = fs.inodes_writable
        && net + INODE_MARGIN > free
    {
        return Err(Error::NoSpace {
            path: ws.root_path().to_owned(),
            shortfall: Some(Shortfall::Inodes {
                needed: Some(made),
                free,
            }),
            storing: None,
        });
    }
    if ws.clones() {
        return Ok(());
    }
    let block = fs.block_size.max(512);
    let blocks = |bytes: u64| bytes.div_ceil(block).saturating_mul(block);
    let needed: u64 = changes
        .iter()
        .filter_map(|c| Some((c.old.as_ref(), c.new.as_ref()?)))
        .map(|(old, e)| match &e.target {
            crate::tree::Target::Object(hash) => blocks(ws.store().bytes_to_write(hash, e.size)),
            // A directory kept as one takes nothing more.
            crate::tree::Target::Tree(_)
                if old.is_some_and(|o| o.kind() == crate::tree::Kind::Dir) =>
            {
                0
            }
            crate::tree::Target::Tree(_) => block,
            // ext4 keeps a target under 60 bytes in the inode.
            crate::tree::Target::Link(t) if t.len() >= 60 => block,
            crate::tree::Target::Link(_) => 0,
        })
        .sum();
    let needed = needed.saturating_add(1 << 20);
    let available = fs.writable_bytes();
    if needed > available {
        return Err(Error::NoSpace {
            path: ws.root_path().to_owned(),
            shortfall: Some(Shortfall::Bytes {
                needed,
                free: available,
            }),
            storing: None,
        });
    }
    Ok(())
}

/// The apply removes a directory holding a descriptor per level below
/// it, and so would the rollback of a removal stopped half-way: a chain
/// 120 levels deep under `ulimit -n 32` stopped the rewind half-way, and
/// it could not go back (helper-81). Refused before anything changes
/// instead, naming the limit (D268 says how to raise it).
fn check_descriptors(ws: &Workspace, changes: &[Change]) -> Result<()> {
    // Changes come in pre-order: each path below the top-most directory
    // removed holds the levels between the two.
    let mut top: Option<&Change> = None;
    let mut deepest: Option<(u64, &[u8])> = None;
    for c in changes {
        match top {
            Some(t) if crate::capture::is_below(&c.path, &t.path) => {
                let held = (c.depth() - t.depth()) as u64;
                if deepest.is_none_or(|(d, _)| held > d) {
                    deepest = Some((held, &c.path));
                }
            }
            _ => top = c.removes_dir().then_some(c),
        }
    }
    let (Some((held, deepest)), Some(headroom)) = (deepest, rewind_platform::fd_headroom()) else {
        return Ok(());
    };
    if held.saturating_add(FD_MARGIN) <= headroom {
        return Ok(());
    }
    const EMFILE: i32 = 24;
    Err(Error::Os(rewind_platform::Error::new(
        "nothing was changed: removing needs a descriptor per level down to",
        ws.root_path().join(OsStr::from_bytes(deepest)),
        std::io::Error::from_raw_os_error(EMFILE),
    )))
}

/// Descriptors the apply holds beside a removal's chain: the parent it
/// works in, the store, the ledger.
const FD_MARGIN: u64 = 8;

/// Inodes a rewind that makes files keeps free beyond them: its
/// temporary files, the ledger's journal.
const INODE_MARGIN: u64 = 8;

/// Every object the plan restores is stored whole (a stat or a ledger lookup each; the
/// target's btrfs snapshot, when it has one, holds them instead): refuse
/// before touching anything rather than stop half-way, or restore a
/// damaged file's bytes, and leave an interrupted rewind that every next
/// command would try to finish and fail the same way.
fn check_objects(ws: &Workspace, target: &Checkpoint, changes: &[Change]) -> Result<()> {
    if let Some(snap) = snapshot::open(ws, &target.id)? {
        // Clones come from the snapshot: one changed after it was taken
        // would restore the change, not the checkpoint.
        if !snapshot::holds(ws, &snap, &target.root)? {
            return Err(Error::Btrfs {
                path: snap.path().to_path_buf(),
                reason: format!(
                    "the snapshot of checkpoint {} was changed after it was taken and no longer holds it: refusing to restore from it; nothing was changed (`rewind verify --deep` lists such snapshots)",
                    target.id
                ),
            });
        }
        return Ok(());
    }
    // A btrfs checkpoint's content is its snapshot, and nothing else has it.
    if target.stats["engine"] == "btrfs" {
        return Err(Error::Btrfs {
            path: snapshot::path_of(ws, &target.id),
            reason: format!(
                "the snapshot of checkpoint {} is missing or no longer read-only (deleted or changed outside rewind): it cannot be restored; nothing was changed (`rewind verify --deep` lists every such checkpoint)",
                target.id
            ),
        });
    }
    let _t = crate::trace::span("check objects");
    // A million files: seconds before the first restore (helper-89).
    let checking = ws.progress("checking what it restores");
    checking.set_total(changes.len() as u64);
    // Re-hash what is restored, up to a budget: a stored object changed in
    // place (same size) was restored as if whole, and the rewind reported
    // success over a wrong tree (D118). Past the budget, presence and
    // length are checked; `verify --deep` re-hashes everything.
    ws.store()
        .in_one_read(|| check_each_object(ws, changes, &checking))
}

fn check_each_object(ws: &Workspace, changes: &[Change], progress: &Progress) -> Result<()> {
    let mut budget = VERIFY_BUDGET;
    for c in changes {
        progress.inc(1);
        let Some(e) = c.new.as_ref() else { continue };
        let crate::tree::Target::Object(hash) = &e.target else {
            continue;
        };
        let mut damaged = !ws.store().contains(hash, e.size)?;
        if !damaged && e.size <= budget {
            budget -= e.size;
            damaged = !ws.store().is_intact(hash, e.size)?;
        }
        if damaged {
            return Err(Error::ObjectMissing {
                hash: hash.to_hex(),
                path: ws.root_path().join(std::ffi::OsStr::from_bytes(&c.path)),
            });
        }
    }
    Ok(())
}

/// The live files a plan replaces or deletes are in the store before
/// anything changes: the safety checkpoint is then their only copy. The
/// capture trusts the stat cache for a file it saw before and does not
/// store it again, so one whose object had gone from the store (deleted
/// by hand, a partial copy of `.rewind/`) was overwritten with no copy
/// anywhere, and even a checkpoint did not store it again (helper-19,
/// D154). It is stored again from the live file, which must still hash
/// to what the capture recorded, and synced. A removed directory's files
/// are in the plan one by one (`diff_entries` lists them), so they are
/// looked at too. Small files live in the ledger's rows: only a damaged
/// ledger loses them. A capture of the btrfs engine's safety snapshot
/// needs none of this: the snapshot holds every file it saw. Looking
/// anyway re-read each replaced file from the live tree, and one another
/// program had changed since the snapshot no longer hashed to it: a false
/// `OBJECT_MISSING` that sent the user hunting for damage (D173).
/// Returns the object files it stored.
fn store_what_the_plan_replaces(
    ws: &Workspace,
    cap: &mut crate::capture::Capture,
    changes: &[Change],
) -> Result<Vec<Hash>> {
    if cap.from_snapshot {
        return Ok(Vec::new());
    }
    let mut stored = Vec::new();
    for c in changes {
        let Some(e) = c.old.as_ref() else { continue };
        let crate::tree::Target::Object(hash) = &e.target else {
            continue;
        };
        // A chunked object this capture stored: its chunk list is
        // committed with it, below.
        let stored_now = || cap.manifests.iter().any(|(h, _)| h == hash);
        if e.size < crate::blobs::INLINE_MAX || stored_now() || ws.store().contains(hash, e.size)? {
            continue;
        }
        let rel = std::path::Path::new(std::ffi::OsStr::from_bytes(&c.path));
        let missing = || Error::ObjectMissing {
            hash: hash.to_hex(),
            path: ws.root_path().join(rel),
        };
        if rel.file_name().is_none() {
            return Err(missing());
        }
        let (file, _) = ws.root_dir().open_read_beneath(rel).map_err(Error::os)?;
        let blobs = crate::blobs::BlobWriter::new(ws.ledger().path());
        let ingested = ws.store().ingest(&file, e.size, &blobs, None, None)?;
        if ingested.hash != *hash {
            // Not what the capture saw: no copy of that content is left.
            return Err(missing());
        }
        // A chunked object's chunk list is committed with the capture:
        // its ledger row may be as gone as its chunk files.
        let manifests = blobs.finish()?.manifests;
        match (ingested.stored, ingested.unsynced_chunks) {
            (crate::objects::Stored::Chunked, Some(chunks)) => stored.extend(chunks),
            (crate::objects::Stored::Chunked, None) => {
                for (_, list) in manifests.iter().filter(|(h, _)| h == hash) {
                    stored.extend(crate::blobs::decode_manifest(list));
                }
            }
            _ => stored.push(*hash),
        }
        cap.manifests.extend(manifests);
    }
    if !stored.is_empty() {
        ws.store().sync_objects(&stored, 1)?;
    }
    Ok(stored)
}

/// How many bytes of restored objects a rewind re-hashes before it
/// changes anything (D118): the few files an agent's rewind restores, all
/// of them; a multi-gigabyte restore, its first 64 MiB.
const VERIFY_BUDGET: u64 = 64 << 20;

fn reapply_from_live(
    ws: &Workspace,
    target_id: &str,
    to_root: Hash,
    paths: &[Vec<u8>],
    (aopts, dopts): (ApplyOptions, DiffOptions),
    safety: Option<i64>,
) -> Result<ApplyReport> {
    let cap = ws.capture(Sink::HashOnly, "recovering")?;
    let trees = Trees::with_overlay(ws.ledger(), cap.overlay()).with_target(to_root);
    let Planned {
        mut changes, kept, ..
    } = plan_in(ws, &trees, &cap.root, &to_root, target_id, paths, dopts)?;
    if let Some(before) = safety
        .map(|s| ws.ledger().checkpoint_by_seq(s))
        .transpose()?
        .flatten()
    {
        let made = parents_made_since(&trees, &before.root, &cap.root, &to_root, paths)?;
        if !made.is_empty() {
            changes.extend(made);
            changes.sort_by(|a, b| a.path.cmp(&b.path));
            changes.dedup_by(|a, b| a.path == b.path);
        }
    }
    let source = snapshot::open(ws, target_id)?;
    let mut report = apply_plan(
        ws,
        source.as_ref(),
        &trees,
        &changes,
        aopts,
        Default::default(),
    )?;
    report.kept.extend(kept);
    // An earlier apply (interrupted, or by a crashed process) changed
    // entries this plan no longer lists: only a `syncfs` covers them.
    report.touched.needs_syncfs();
    Ok(report)
}

/// The parents of a restore's `paths` that the tree `before` it lacked
/// and the interrupted apply made, whose metadata is not yet the
/// target's: a restore makes a missing parent at 0700 and gives it its
/// mode last, so one killed in between left them 0700 for good, the
/// plan made again seeing directories that exist (helper-57, D298).
fn parents_made_since(
    trees: &Trees<'_>,
    before: &Hash,
    live: &Hash,
    to: &Hash,
    paths: &[Vec<u8>],
) -> Result<Vec<Change>> {
    let is_dir = |e: &Option<crate::tree::Entry>| {
        e.as_ref()
            .is_some_and(|e| e.kind() == crate::tree::Kind::Dir)
    };
    let mut out = Vec::new();
    for p in paths {
        for prefix in crate::capture::ancestors(p) {
            let (Some(now), Some(want)) =
                (trees.entry_at(live, prefix)?, trees.entry_at(to, prefix)?)
            else {
                continue;
            };
            let differs = now.mode != want.mode || now.xattrs != want.xattrs;
            if differs
                && now.kind() == crate::tree::Kind::Dir
                && want.kind() == crate::tree::Kind::Dir
                && !is_dir(&trees.entry_at(before, prefix)?)
            {
                out.push(Change {
                    path: prefix.to_vec(),
                    old: Some(now),
                    new: Some(want),
                });
            }
        }
    }
    Ok(out)
}

/// Apply a plan, cloning from `source`, the target's btrfs snapshot, when
/// it has one; `staged`: files made ahead of it (D357).
fn apply_plan(
    ws: &Workspace,
    source: Option<&rewind_platform::Dir>,
    trees: &Trees<'_>,
    changes: &[Change],
    aopts: ApplyOptions,
    staged: apply::Staged,
) -> Result<ApplyReport> {
    let progress = ws.progress("restoring");
    ws.store().in_one_read(|| {
        apply::apply(
            ws.root_dir(),
            ws.store(),
            source,
            trees,
            changes,
            aopts,
            &progress,
            &|| ws.clock_past_now(),
            staged,
        )
    })
}

/// How a rewind ends (see [`finish`]).
struct Finish {
    /// By the next command, after a crash.
    recovered: bool,
    /// What may not be durable in the tree the apply started from.
    before: Before,
    /// What the capture before the apply saw, for the next mark (D85).
    seen: Seen,
    /// Taken over since the intent; given back once the commit clears it,
    /// so that no stop after it says the tree is partly rewound (D353).
    signals: rewind_platform::FinishFirst,
}

/// What the capture before an apply saw, for the mark set once the
/// result is durable (D85).
struct Seen {
    /// The filesystem clock when it started (`i64::MIN`: unknown).
    clock_ns: i64,
    /// Entries it saw change since the old mark.
    recent: Vec<(Vec<u8>, i64)>,
    /// Nothing but the apply could change the tree since (a frozen mount).
    quiescent: bool,
    /// The store mark before the apply (`crate::durable`, 3).
    store_below_ns: Option<i64>,
}

impl Seen {
    /// The durability bookkeeping once the result is durable: after a
    /// `syncfs`, everything older than the clock read before it; after
    /// fsyncs of the changed entries, everything older than the capture
    /// (or than now, if nothing else could write meanwhile), since what
    /// changed after it but before the fsyncs may be another program's.
    fn after(&self, ws: &Workspace, synced: Synced) -> Option<durable::State> {
        match synced {
            Synced::Nothing => None,
            Synced::Filesystem { clock_ns } => durable::State::after_syncfs(clock_ns, &self.recent),
            Synced::Entries {
                fsynced,
                clock_before_ns,
            } => {
                let below = match self.quiescent {
                    true => ws.fs_clock_ns(),
                    false => self.clock_ns,
                };
                durable::State::after_fsyncs(
                    self.store_below_ns,
                    below,
                    &self.recent,
                    &fsynced,
                    clock_before_ns,
                )
            }
        }
    }
}

fn finish(
    ws: &mut Workspace,
    op: Op,
    target: i64,
    safety: i64,
    report: &ApplyReport,
    how: Finish,
) -> Result<()> {
    let Finish {
        recovered,
        before,
        seen,
        signals,
    } = how;
    let synced = ws.sync_applied(&report.touched, before, !seen.quiescent)?;
    let after = seen.after(ws, synced);
    failpoint::hit("rewind:before-commit");
    // A restore mixes two states: HEAD stays the safety checkpoint.
    let new_head = if op == Op::Restore { safety } else { target };
    let _t = crate::trace::span("commit HEAD");
    ws.ledger_mut().write(|tx| {
        tx.set_meta("head", &new_head.to_string())?;
        tx.clear_intent()?;
        tx.replace_restored(report.restored.settled())?;
        if let Some(state) = &after {
            tx.set_meta(durable::KEY, &state.encode())?;
        }
        tx.event(
            "rewind-done",
            Fields::new()
                .str("op", op.as_str())
                .str("target", &tx.checkpoint_id(target)?)
                .str("head", &tx.checkpoint_id(new_head)?)
                .num("written", report.written)
                .num("deleted", report.deleted)
                .str("recovered", if recovered { "1" } else { "0" }),
        )?;
        tx.record_operation(
            &Operation {
                op: op.as_str().into(),
                target,
                safety,
            },
            report.written,
            report.deleted,
        )?;
        Ok(())
    })?;
    drop(signals);
    failpoint::hit("rewind:after-commit");
    Ok(())
}

/// The longest report a rewind records on its safety checkpoint: what was
/// tried and why it failed, read back by `list` and MCP's candidates.
const NOTE_MAX: usize = 16 * 1024;

/// EXDEV: a path crossed into another filesystem.
const EXDEV: i32 = 18;

/// A rewind whose apply failed, and failed again from a fresh capture,
/// goes back to its safety checkpoint: the other end state DESIGN §4
/// rule 7 allows. Left pending, the intent would send every later command
/// into the same failure (a path past PATH_MAX, a mount point in the way,
/// a file the filesystem refuses). Answers [`Error::RolledBack`] naming
/// `cause`, or `cause` itself when going back failed too (the intent then
/// stays, and the next command tries again).
#[allow(clippy::too_many_arguments)]
fn roll_back(
    ws: &mut Workspace,
    op: Op,
    target_id: &str,
    safety: i64,
    paths: &[Vec<u8>],
    aopts: ApplyOptions,
    dopts: DiffOptions,
    cause: Error,
) -> Error {
    // Set once the tree is saved: named whether going back succeeds.
    let mut saved = None;
    let mut back = || -> Result<String> {
        let to = ws
            .ledger()
            .checkpoint_by_seq(safety)?
            .ok_or_else(|| Error::UnknownId {
                id: format!("#{safety}"),
            })?;
        // What was made during the failed apply is in no checkpoint, and
        // going back removes it: saved first (helper-30, D213).
        let label = format!("before rolling back a {} to {target_id}", op.as_str());
        saved = checkpoint_live_before(ws, &label, (&to.id, to.root), safety, paths, dopts)?;
        let report = reapply_from_live(ws, &to.id, to.root, paths, (aopts, dopts), None)?;
        ws.sync_applied(&report.touched, Before::Unknown, true)?;
        Ok(to.id)
    };
    // A mount point in the way says only "Invalid cross-device link".
    let cause = match cause {
        Error::Os(e) if e.raw_os_error() == Some(EXDEV) => Error::InvalidPath {
            path: e.path,
            reason: "is a mount point (another filesystem or a btrfs subvolume) inside the workspace: a rewind cannot write below it; unmount it, or restore other paths only (`rewind restore`)".into(),
        },
        e => e,
    };
    let safety_id = match back() {
        Ok(id) => id,
        Err(_) => {
            // Going back failed too: the intent stays, and the next
            // command finishes the rewind. The cause says what to fix,
            // but not "nothing was changed": the tree is half-rewound
            // (helper-34, D239); what it held is named (D223).
            let safety = ws
                .ledger()
                .checkpoint_by_seq(safety)
                .ok()
                .flatten()
                .map_or_else(|| format!("#{safety}"), |c| c.id);
            return Error::Unfinished {
                op: op.as_str(),
                target: target_id.to_string(),
                safety,
                saved,
                cause: Box::new(cause),
            };
        }
    };
    let committed = ws.ledger_mut().write(|tx| {
        tx.set_meta("head", &safety.to_string())?;
        tx.clear_intent()?;
        tx.event(
            "rewind-rolled-back",
            Fields::new()
                .str("op", op.as_str())
                .str("target", target_id)
                .str("head", &safety_id)
                .str("cause", &cause.to_string()),
        )?;
        Ok(())
    });
    match committed {
        Ok(()) => Error::RolledBack {
            op: op.as_str(),
            target: target_id.to_string(),
            safety: safety_id,
            saved,
            cause: Box::new(cause),
        },
        Err(_) => cause,
    }
}

/// A safety capture the disk stopped while storing a file the whole-tree
/// rewind deletes (its target has nothing at that path): say so, and
/// that deleting it first frees the room (D332). A runaway log that
/// filled the disk stopped the very rewind that would remove it, with
/// "free some space" and no word of which file.
fn deleted_by_the_rewind(
    ws: &Workspace,
    op: Op,
    target: &Checkpoint,
    opts: &RewindOptions,
    e: Error,
) -> Error {
    let Error::NoSpace {
        path,
        shortfall,
        storing: Some(mut storing),
    } = e
    else {
        return e;
    };
    let whole_tree = op != Op::Restore && opts.paths.is_empty();
    if whole_tree
        && matches!(
            Trees::new(ws.ledger()).entry_at(&target.root, &storing.rel),
            Ok(None)
        )
    {
        let named = match &target.label {
            Some(l) => format!("{} ({l})", target.id),
            None => target.id.clone(),
        };
        let abs = ws.root_path().join(OsStr::from_bytes(&storing.rel));
        let doing = format!("{} {} {named}", op.as_str(), preposition(op.as_str()));
        storing.removed_by = Some((abs, doing));
    }
    Error::NoSpace {
        path,
        shortfall,
        storing: Some(storing),
    }
}

/// The target as the ledger has it now that the lock is held, checked
/// against the chain entry that recorded it (D112). A `gc` that pruned it
/// while this command waited for the lock gave "ledger corrupt: tree node
/// missing"; now it is `PRUNED`. A row whose root, label, kind or parent
/// was edited by SQL restored another tree; now it is `TAMPERED`, and
/// nothing changes.
fn confirm_target(ws: &Workspace, target: Checkpoint) -> Result<Checkpoint> {
    let now = ws
        .ledger()
        .checkpoint_by_seq(target.seq)?
        .ok_or_else(|| Error::UnknownId {
            id: target.id.clone(),
        })?;
    if now.pruned {
        return Err(Error::Pruned { id: now.id });
    }
    if let Err(detail) = ws.ledger().checkpoint_on_chain(&now)? {
        return Err(Error::Tampered {
            detail,
            consequence: "the rewind was refused and nothing was changed".into(),
        });
    }
    Ok(now)
}

/// What the first Ctrl-C (or hangup) of a rewind says (D353).
const FINISHING: &str = "\nrewind: finishing the rewind first, so that the tree is not left half-way (interrupt again to stop now)\n";

/// While the tree is between two checkpoints, the first Ctrl-C (or
/// hangup) lets the rewind finish, and a second one or a SIGTERM stops it
/// with a line that says what was left (D353).
fn finish_first() -> rewind_platform::FinishFirst {
    static TEXTS: rewind_platform::FinishTexts = rewind_platform::FinishTexts {
        finishing: FINISHING,
        stopping: "\nrewind: stopped in the middle of a rewind: the tree may be partly rewound, and nothing is lost; `rewind status` finishes it, as does the next rewind, checkpoint or list\n",
    };
    rewind_platform::finish_first(&TEXTS)
}

/// [`finish_first`] for a client waiting on the command server's rewind
/// (D93): stopped, the client hangs up and the server ends at once, at a
/// moment the client cannot know.
pub(crate) fn finish_first_waiting() -> rewind_platform::FinishFirst {
    static TEXTS: rewind_platform::FinishTexts = rewind_platform::FinishTexts {
        finishing: FINISHING,
        stopping: "\nrewind: stopped; nothing is lost, and if the rewind had begun to change the tree, `rewind status` finishes it, as does the next rewind, checkpoint or list\n",
    };
    rewind_platform::finish_first(&TEXTS)
}

/// Roll an interrupted rewind forward (DESIGN §4 rule 7), or back when it
/// cannot finish ([`roll_back`]). Called with the workspace lock held.
pub(crate) fn recover(ws: &mut Workspace) -> Result<bool> {
    let Some(intent) = ws.ledger().intent()? else {
        return Ok(false);
    };
    let signals = finish_first();
    let opt = |k: &str| {
        intent
            .options
            .get(k)
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    // The clock before the apply that crashed is not known (D275).
    let aopts = ApplyOptions {
        exact_times: opt("exact_times"),
        allow_setuid: opt("allow_setuid"),
        restored_below_ns: None,
    };
    let dopts = DiffOptions {
        compare_mtime: aopts.exact_times,
    };
    let paths: Vec<Vec<u8>> = intent
        .options
        .get("paths")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().and_then(crate::hash::unhex))
                .collect()
        })
        .unwrap_or_default();
    let target = ws
        .ledger()
        .checkpoint_by_seq(intent.target)?
        .map(|c| c.id)
        .unwrap_or_default();
    let frozen = ws.freeze()?;
    let op = Op::parse(&intent.op);
    let label = format!(
        "before finishing an interrupted {} to {target}",
        op.as_str()
    );
    let to = (target.as_str(), intent.to_root);
    let kept = checkpoint_live_before(ws, &label, to, intent.safety, &paths, dopts)?;
    let report = match reapply_from_live(
        ws,
        &target,
        intent.to_root,
        &paths,
        (aopts, dopts),
        Some(intent.safety),
    ) {
        Ok(r) => r,
        Err(e) => {
            // Retried and failed again: the same error would stop every
            // command after this one. Go back instead (module docs).
            let e = roll_back(ws, op, &target, intent.safety, &paths, aopts, dopts, e);
            drop(frozen);
            return match e {
                Error::RolledBack { .. } => {
                    rewind_platform::stderr_line!("rewind: {e}");
                    Ok(true)
                }
                e => Err(e),
            };
        }
    };
    // An earlier apply (interrupted, or by a crashed process) changed
    // entries this plan no longer lists: only a `syncfs` covers them.
    let how = Finish {
        signals,
        recovered: true,
        before: Before::Unknown,
        seen: Seen {
            clock_ns: i64::MIN,
            recent: Vec::new(),
            quiescent: false,
            store_below_ns: None,
        },
    };
    finish(ws, op, intent.target, intent.safety, &report, how)?;
    drop(frozen);
    rewind_platform::stderr_line!(
        "rewind: finished an interrupted {} to {target} ({} written, {} deleted){}",
        op.as_str(),
        report.written,
        report.deleted,
        kept.map(|id| format!("; the tree as it was is checkpoint {id}"))
            .unwrap_or_default()
    );
    Ok(true)
}

/// Save the live tree before a plan made again from a fresh capture,
/// towards `to` (an id and its root), in a rewind whose safety
/// checkpoint is `safety`, unless it is that checkpoint's tree or the
/// newest one's, or the plan would overwrite nothing; `label` names the
/// new checkpoint, whose id is returned. Finishing an interrupted rewind
/// (D110): what was changed after the crash (the agent's next edit, a
/// new file) was in neither checkpoint, and rolling forward overwrote
/// it. A retry or a roll-back after a failed apply (D213): what was made
/// while the rewind ran. Each of these captures walks the whole tree, as
/// does the plan after it: the apply's writes are in no mount's dirty
/// set (D221).
fn checkpoint_live_before(
    ws: &mut Workspace,
    label: &str,
    (target_id, to_root): (&str, Hash),
    safety: i64,
    paths: &[Vec<u8>],
    dopts: DiffOptions,
) -> Result<Option<String>> {
    ws.walk_in_full();
    let new_objects = ws.store().track_new()?;
    let mut cap = ws.capture_live()?;
    let safety_root = ws.ledger().checkpoint_by_seq(safety)?.map(|c| c.root);
    // The newest checkpoint: a recovery whose finish failed made it from
    // this same tree, and each later command would add one more (D161).
    let newest_root = ws.ledger().newest_checkpoint()?.map(|c| c.root);
    // Rolling forward overwrites nothing: a restore's paths already hold
    // the target's content (its tree is neither checkpoint's), or a
    // rewind's whole tree is the target's.
    let overwrites_nothing = || -> Result<bool> {
        let trees = Trees::with_overlay(ws.ledger(), cap.overlay()).with_target(to_root);
        let kept = ws.ledger().skipped(target_id)?;
        Ok(plan(
            ws.root_dir(),
            &trees,
            &cap.root,
            (target_id, &to_root),
            paths,
            &kept,
            dopts,
        )?
        .is_empty())
    };
    if [safety_root, newest_root].contains(&Some(cap.root)) || overwrites_nothing().unwrap_or(false)
    {
        // Whatever it stored again is content those checkpoints name, or
        // stays live.
        new_objects.keep();
        return Ok(None);
    }
    ws.sync_state(&mut cap)?;
    let head = ws.head()?;
    let trees = Trees::with_overlay(ws.ledger(), cap.overlay());
    let changes = content_changes(&trees, head.as_ref(), &cap.root)?;
    let overlay = trees.into_overlay();
    let workspace_id = ws.ledger().workspace_id()?;
    // Its content is in the object store, not in a snapshot: a checkpoint
    // marked `btrfs` is restored from its snapshot only.
    let engine = match ws.engine().0 {
        Engine::Btrfs => Engine::Walk,
        other => other,
    };
    let seq = ws.ledger_mut().write(|tx| {
        write_capture(tx, &cap)?;
        insert_checkpoint(
            tx,
            &workspace_id,
            &cap,
            &NewCheckpoint {
                label: Some(label),
                kind: "pre-rewind",
                parent: head.as_ref().map(|h| h.seq),
                changes,
            },
            None,
            engine,
        )
    })?;
    new_objects.keep_named(&cap.objects_kept());
    ws.ledger().remember_nodes(overlay);
    ws.commit_dirty()?;
    Ok(ws.ledger().checkpoint_by_seq(seq)?.map(|c| c.id))
}
