use std::path::{Path, PathBuf};

use super::Ctx;
use crate::chain::Anchor;
use crate::error::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write the anchor to this file (default: print it)
    file: Option<PathBuf>,
}

impl Args {
    /// Whether it writes a file (D151 refuses that to an owner in root's
    /// mount).
    pub(crate) fn writes_file(&self) -> bool {
        self.file.is_some()
    }
}

/// Export the chain head (seq + hash) to keep somewhere the agent cannot
/// reach; `verify --anchor FILE` then detects truncation and rewriting.
///
/// An existing FILE is replaced only by a newer anchor of the same
/// workspace whose chain still verifies against it: anchoring routinely
/// after a truncation or a rewrite overwrote the one piece of evidence,
/// and a shared file name overwrote another workspace's anchor.
pub fn run(ctx: &Ctx, mut args: Args) -> Result<()> {
    args.file = args.file.map(|f| ctx.path_arg(&f));
    let mut ws = ctx.workspace()?;
    // The anchor commits to every checkpoint acknowledged so far: a btrfs
    // one whose manifest is pending gets its chain entry first.
    ws.recover_if_needed()?;
    let workspace = ws.ledger().workspace_id()?;
    let previous = match &args.file {
        Some(path) => previous_anchor(path, &workspace)?,
        None => None,
    };
    let verdict = ws.ledger().verify_chain(previous.as_ref())?;
    if let Some(bad) = &verdict.first_bad {
        return Err(Error::Tampered {
            detail: bad.summary(),
            consequence: match &args.file {
                Some(p) => format!("{} was kept as it was", p.display()),
                None => "no anchor was exported".into(),
            },
        });
    }
    let (seq, head) = ws
        .ledger()
        .chain_head()?
        .ok_or_else(|| Error::Usage("the chain is empty".into()))?;
    let anchor = Anchor {
        workspace,
        seq,
        head: head.to_hex(),
    };
    let text = serde_json::to_string_pretty(&anchor)
        .map_err(|e| Error::Usage(format!("internal: {e}")))?;
    if let Some(path) = &args.file {
        super::write_atomically(path, &format!("{text}\n"), false)?;
    }
    // Without FILE the anchor is the output, not a report on it: `-q`
    // keeps it, or `rewind -q anchor > FILE` wrote an empty file.
    if args.file.is_none() && ctx.quiet && !ctx.json {
        return super::print_result(&text);
    }
    ctx.emit(&anchor, || match &args.file {
        Some(p) => format!("anchored entry {seq} ({}) in {}", anchor.head, p.display()),
        None => text.clone(),
    })
}

/// The anchor already in `path`, if any; an error when the file is
/// something else or another workspace's.
fn previous_anchor(path: &Path, workspace: &str) -> Result<Option<Anchor>> {
    let refuse = |reason: String| Error::InvalidPath {
        path: path.to_path_buf(),
        reason: format!("{reason}; nothing was written"),
    };
    let old = Anchor::read(path).map_err(|e| match e {
        Error::InvalidPath { reason, .. } => {
            refuse(format!("{reason}: name a new file, or move this one aside"))
        }
        e => e,
    })?;
    match old {
        Some(old) if old.workspace != workspace => Err(refuse(format!(
            "holds the anchor of workspace {}, and this is {workspace}: keep one anchor file per workspace",
            old.workspace
        ))),
        old => Ok(old),
    }
}
