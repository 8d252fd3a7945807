//! `rewind writeback` (hidden): write back and commit everything dirty on
//! the workspace's filesystem (`syncfs`). `hook post-tool-use` starts it
//! detached after a tool that may have written, on the btrfs engine, so
//! the transaction commit that the next checkpoint's snapshot would pay
//! for runs while the model thinks (D72). Nothing in the ledger changes.

use super::Ctx;
use crate::error::{Error, Result};

pub fn run(ctx: &Ctx) -> Result<()> {
    let start = ctx.start_dir();
    let root = crate::workspace::Workspace::discover(&start)
        .ok_or(Error::NotAWorkspace { path: start })?;
    rewind_platform::Dir::open(&root)
        .and_then(|d| d.syncfs())
        .map_err(Error::os)?;
    ctx.emit(&serde_json::json!({ "synced": root }), || {
        format!("synced {}", root.display())
    })
}
