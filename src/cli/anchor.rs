use std::path::PathBuf;

use super::Ctx;
use crate::chain::Anchor;
use crate::error::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the anchor to this file (default: print it)
    file: Option<PathBuf>,
}

/// Export the chain head (seq + hash) to keep somewhere the agent cannot
/// reach; `verify --anchor FILE` then detects truncation and rewriting.
pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let ws = ctx.workspace()?;
    let (seq, head) = ws
        .ledger()
        .chain_head()?
        .ok_or_else(|| Error::Usage("the chain is empty".into()))?;
    let anchor = Anchor {
        workspace: ws.ledger().workspace_id()?,
        seq,
        head: head.to_hex(),
    };
    let text = serde_json::to_string_pretty(&anchor)
        .map_err(|e| Error::Usage(format!("internal: {e}")))?;
    if let Some(path) = &args.file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{text}\n"))
            .map_err(|e| Error::os(rewind_platform::Error::new("write anchor", &tmp, e)))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| Error::os(rewind_platform::Error::new("write anchor", path, e)))?;
    }
    ctx.emit(&anchor, || match &args.file {
        Some(p) => format!("anchored entry {seq} ({}) in {}", anchor.head, p.display()),
        None => text.clone(),
    })
}
