use super::{Ctx, human_bytes};
use crate::config::{Config, Retention, parse_duration};
use crate::error::{Error, Result};
use crate::gc::{self, Options};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Keep the N newest checkpoints
    #[arg(long, value_name = "N")]
    keep_last: Option<usize>,
    /// Keep checkpoints younger than this (90s, 30m, 24h, 7d, 2w)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    keep_within: Option<std::time::Duration>,
    /// Keep every labeled checkpoint
    #[arg(long)]
    keep_labeled: bool,
    /// Show what would be pruned and freed; change nothing
    #[arg(long)]
    dry_run: bool,
    /// Also prune protected checkpoints (recent past, unresolved effects,
    /// undo target); never HEAD or a rewind in progress
    #[arg(long)]
    force: bool,
}

/// Pruned ids a human report lists before it counts the rest.
const PRUNED_SHOWN: usize = 10;

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let mut ws = ctx.workspace()?;
    // Flags given: they are the whole policy. None: rewind.toml's [retention].
    let policy = if args.keep_last.is_some() || args.keep_within.is_some() || args.keep_labeled {
        Retention {
            keep_last: args.keep_last.unwrap_or(0),
            keep_within: args.keep_within.unwrap_or_default(),
            keep_labeled: args.keep_labeled,
            ..Retention::default()
        }
    } else {
        Config::load(ws.io_path())
            .map_err(|e| Error::Usage(format!("{e} (gc reads [retention] from it)")))?
            .retention
    };
    let opts = Options {
        policy,
        dry_run: args.dry_run,
        force: args.force,
        give_back: gc::GIVE_BACK_ALL,
    };
    let r = match gc::run(&mut ws, &opts) {
        // An exactly full disk: the reserve's space lets gc start, and
        // what it prunes frees more (D274).
        Err(e) if e.is_no_space() && !args.dry_run && ws.release_reserve() => {
            drop(ws);
            let mut ws = ctx.workspace()?;
            gc::run(&mut ws, &opts)
        }
        r => r,
    }
    .map_err(|e| match e {
        Error::NoSpace { path, .. } => Error::NoSpaceToPrune { path },
        e => e,
    })?;
    if let Some(first) = r.freed.snapshots_left.first() {
        rewind_platform::stderr_line!(
            "rewind: warning: {} snapshot(s) could not be deleted and still use space; {first}",
            r.freed.snapshots_left.len()
        );
    }
    ctx.emit(&r, || {
        let verb = if r.dry_run { "would prune" } else { "pruned" };
        let mut s = format!(
            "{verb} {}, kept {} ({} protected)",
            crate::names::counted(r.pruned.len() as u64, "checkpoint"),
            r.kept,
            r.protected.len()
        );
        // 499 ids on one line filled an agent's context (helper-77): the
        // oldest few, and the rest counted; `--json` lists every one.
        if !r.pruned.is_empty() {
            let shown = &r.pruned[..r.pruned.len().min(PRUNED_SHOWN)];
            s.push_str(&format!(": {}", shown.join(" ")));
            if r.pruned.len() > shown.len() {
                s.push_str(&format!(
                    " … and {} more (`--json` lists every one)",
                    r.pruned.len() - shown.len()
                ));
            }
        }
        let f = &r.freed;
        s.push_str(&format!(
            "\n{} {} tree nodes ({}), {} small objects, {} object files: {} in whole-file sizes, {} allocated, at least {} of it held by no other file, in {} ms",
            if r.dry_run { "would free" } else { "freed" },
            f.tree_nodes,
            human_bytes(f.tree_bytes),
            f.small_objects,
            f.object_files,
            human_bytes(f.bytes),
            human_bytes(f.allocated),
            human_bytes(f.unshared),
            r.duration_ms
        ));
        if f.ledger_released > 0 || f.ledger_free > 0 {
            s.push_str(&format!(
                "; the ledger file gave back {}",
                human_bytes(f.ledger_released)
            ));
            if f.ledger_free > 0 {
                s.push_str(&format!(
                    ", and {} more inside it is free: new checkpoints reuse it, and each `gc` gives back a share of it",
                    human_bytes(f.ledger_free)
                ));
            }
        }
        if f.snapshots > 0 {
            s.push_str(&format!(
                ", {} snapshots {} (holding {} no kept checkpoint has; btrfs frees it in the background)",
                f.snapshots,
                if r.dry_run { "to delete" } else { "deleted" },
                human_bytes(f.snapshot_bytes)
            ));
        }
        for left in &f.snapshots_left {
            s.push_str(&format!(
                "
kept: {left}"
            ));
        }
        s
    })
}
