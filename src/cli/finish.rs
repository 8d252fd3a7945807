//! `rewind finish-manifests` (hidden): build the manifests of pending
//! btrfs checkpoints, then apply retention. A btrfs `checkpoint` starts it
//! detached so the agent never waits for the manifest (DESIGN §2, D47);
//! any other command does the same work itself if this did not finish.

use serde::Serialize;

use super::Ctx;
use crate::error::Result;

#[derive(Serialize)]
struct Out {
    finished: usize,
    pruned: Vec<String>,
    /// Time to build the manifests (retention excluded).
    duration_ms: u64,
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let mut ws = ctx.workspace()?;
    let started = std::time::Instant::now();
    let finished = crate::snapshot::finish_pending(&mut ws)?;
    let duration_ms = started.elapsed().as_millis() as u64;
    let (pruned, warnings) = if finished > 0 {
        ws.retention_after_checkpoint()?
    } else {
        Default::default()
    };
    if !pruned.is_empty() {
        rewind_platform::stderr_line!(
            "rewind: pruned by the retention policy: {}",
            pruned.join(" ")
        );
    }
    for w in &warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    // Off the agent's path: leave the next command a WAL of one commit
    // to index instead of up to 4 MiB (D74).
    ws.ledger().fold_wal_if_idle();
    let out = Out {
        finished,
        pruned,
        duration_ms,
    };
    ctx.emit(&out, || format!("{} manifest(s) built", out.finished))
}
