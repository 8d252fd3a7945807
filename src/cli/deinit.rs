//! `rewind deinit`: delete a workspace's whole history, leaving its files
//! as they are.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Ctx;
use crate::error::{Error, Result};
use crate::workspace::Workspace;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Delete it: every checkpoint, for good (without this nothing is
    /// deleted)
    #[arg(long)]
    yes: bool,
    /// Say what would be deleted; delete nothing
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
}

#[derive(Serialize)]
struct Out {
    workspace: String,
    /// Checkpoints in the ledger; none when it could not be read.
    checkpoints: Option<usize>,
    /// The btrfs engine's snapshots, one per checkpoint it took.
    snapshots: usize,
    deleted: bool,
    /// Agent configuration files that still run rewind here: the agent's
    /// next call starts a new history.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    still_configured: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// Files `rewind integrate` writes in a workspace.
const AGENT_FILES: &[&str] = &[
    ".mcp.json",
    ".claude/settings.json",
    ".gemini/settings.json",
    ".cursor/mcp.json",
    ".codex/config.toml",
];

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let start = ctx.start_dir();
    let root = Workspace::discover(&start).ok_or(Error::NotAWorkspace {
        path: start.clone(),
    })?;
    let shown = root.to_string_lossy().into_owned();
    // Run again from a nested workspace it had just deleted, or from any
    // subdirectory, it deleted the history of a workspace above, which
    // the user never named (helper-74): it is named, with -C.
    if std::fs::canonicalize(&start).is_ok_and(|s| s != root) {
        return Err(Error::InvalidPath {
            reason: format!(
                "is not a workspace root: the workspace it is in is {}; `rewind deinit` deletes only the history it is run at, so run `rewind -C {} deinit {}` for that one",
                crate::names::human_os_path(&root),
                crate::names::shell_word(&shown),
                if args.dry_run { "--dry-run" } else { "--yes" }
            ),
            path: start,
        });
    }
    // A daemon holds the history open and serves the tree from it: over
    // the workspace itself, or as a view elsewhere (its claim names it).
    let mounted = match crate::mount::MountLink::connect(&root)? {
        Some(_) => Some(root.clone()),
        None => rewind_fuse::holder(&root).map(|h| h.mountpoint),
    };
    if let Some(mp) = mounted {
        return Err(Error::InvalidPath {
            reason: format!(
                "is served by `rewind mount` at {}, whose daemon holds its history open: `rewind unmount {}` first, then `rewind deinit --yes`",
                crate::names::human_os_path(&mp),
                crate::names::shell_word(&mp.to_string_lossy())
            ),
            path: root,
        });
    }
    let mut warnings = Vec::new();
    // Opened to count, and to see that no rewind was interrupted: one
    // is never finished here (that would change the tree, and what was
    // written since the crash would be kept only in a checkpoint this
    // then deletes, helper-72). A ledger that cannot be read is no reason
    // to keep it: it goes as it is.
    let opened = match Workspace::open(&root, false) {
        Ok(ws) => Some(ws),
        // A deletion stopped half-way: this one finishes it.
        Err(Error::HistoryBeingDeleted { .. }) => None,
        Err(
            e @ (Error::LedgerCorrupt { .. }
            | Error::LedgerMissing { .. }
            | Error::LedgerUnfinished { .. }),
        ) => {
            warnings.push(unreadable(&e));
            None
        }
        Err(e) => return Err(e),
    };
    let root_dir = rewind_platform::Dir::open(&root).map_err(Error::os)?;
    // Counted under the lock: what is deleted is what is said.
    let (checkpoints, id, lock) = match opened {
        Some(mut ws) => {
            // A ledger that opens but whose pages do not read: deleted as
            // it is, as one that does not open (helper-75: `doctor` sent
            // the user here, and this sent them back to `doctor`).
            let counted = ws.lock_as_is().and_then(|op| {
                let n = ws.ledger().checkpoints()?.len() + ws.ledger().pending()?.len();
                Ok((op, n))
            });
            match counted {
                Ok((Some(op), _)) => {
                    return Err(Error::Usage(format!(
                        "`rewind {op}` in {shown} was interrupted and the tree is half-way there; deleting the history now would keep the tree that way and lose the only record of what to finish: run `rewind status` (it finishes the {op}, first saving anything written since in a checkpoint), then `rewind deinit --yes`; nothing was deleted"
                    )));
                }
                Ok((None, n)) => (Some(n), ws.ledger().workspace_id().ok(), ws.into_lock()),
                Err(e @ Error::LedgerCorrupt { .. }) => {
                    warnings.push(unreadable(&e));
                    (None, None, ws.into_lock())
                }
                Err(e) => return Err(e),
            }
        }
        None => (None, None, None),
    };
    let found = crate::deinit::snapshots(&root_dir)?;
    crate::deinit::check(&root_dir, &found)?;
    let snapshots = crate::deinit::count(&found);
    let what = match checkpoints {
        Some(n) => crate::names::counted(n as u64, "checkpoint"),
        None => "its checkpoints".into(),
    };
    let what = match snapshots {
        0 => what,
        n => format!(
            "{what} and {}",
            crate::names::counted(n as u64, "btrfs snapshot")
        ),
    };
    if !args.yes && !args.dry_run {
        return Err(Error::Usage(format!(
            "`rewind deinit` deletes the history of {shown} ({what}) for good, and no rewind can bring it back; nothing was deleted: run `rewind deinit --yes` to delete it (`--dry-run` only says what would go)"
        )));
    }
    let removed = if args.yes {
        let removed = crate::deinit::remove(&root_dir, found)?;
        drop(lock);
        if let Some(p) = id.and_then(|id| crate::kept_anchor::path(&id, &root)) {
            let _ = std::fs::remove_file(p);
        }
        Some(removed)
    } else {
        None
    };
    let out = Out {
        workspace: shown.clone(),
        checkpoints,
        snapshots: removed.as_ref().map_or(snapshots, |r| r.snapshots),
        deleted: removed.is_some(),
        still_configured: still_configured(&root),
        warnings,
    };
    for w in &out.warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    ctx.emit(&out, || {
        let mut s = match out.deleted {
            true => format!("deleted the history of {shown}: {what}; its files are as they were\n"),
            false => format!("would delete the history of {shown}: {what}; nothing was deleted\n"),
        };
        for f in &out.still_configured {
            s.push_str(&format!(
                "note: {f} still runs rewind here: the agent's next call starts a new history; remove rewind's entries from it to stop that\n"
            ));
        }
        s
    })
}

/// The warning for a ledger that cannot be read, which goes as it is.
fn unreadable(e: &Error) -> String {
    format!(
        "the ledger could not be read ({e}): it is deleted as it is, and a rewind it may have been in the middle of is not finished"
    )
}

/// The agent configuration files in `root` that name rewind.
fn still_configured(root: &Path) -> Vec<String> {
    AGENT_FILES
        .iter()
        .map(|f| root.join(f))
        .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(6).any(|w| w == b"rewind")))
        .map(|p: PathBuf| p.to_string_lossy().into_owned())
        .collect()
}
