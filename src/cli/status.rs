use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Ctx;
use crate::capture::{Sink, is_below};
use crate::diff::{self, Change, DiffOptions, Trees};
use crate::error::Result;
use crate::workspace::{ChangeJson, Workspace};

#[derive(Serialize)]
pub(crate) struct Out {
    pub head: Option<String>,
    /// Says what HEAD is: after a restore, "before restore from …" tells
    /// why the restored files show as changes (helper-70).
    #[serde(skip)]
    pub head_label: Option<String>,
    /// Paths asked for that are neither in the tree nor in HEAD: a typo
    /// reads as "no changes" otherwise (as `diff` says, helper-52).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub changes: Vec<ChangeJson>,
    pub skipped: Vec<crate::capture::Skipped>,
}

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// List every changed path: an added or deleted directory is
    /// otherwise one line with the number of entries below it
    #[arg(long, short)]
    pub all: bool,
    /// Only these paths (relative to the current directory, or to -C DIR)
    pub paths: Vec<PathBuf>,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let out = compute(ctx, &args.paths)?;
    for w in &out.warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    ctx.emit(&out, || {
        let mut s = format!(
            "HEAD {}{}\n",
            out.head.as_deref().unwrap_or("(none: no checkpoint yet)"),
            out.head_label
                .as_deref()
                .map(|l| format!("  {}", crate::names::quoted_label(l)))
                .unwrap_or_default()
        );
        if out.changes.is_empty() {
            s.push_str(match args.paths.is_empty() {
                true => "no changes\n",
                false => "no changes under these paths\n",
            });
        }
        for sk in &out.skipped {
            s.push_str(&format!(
                "skipped {}: {}\n",
                super::human_name(&sk.path, sk.path_hex.as_deref()),
                sk.reason
            ));
        }
        s.push_str(&render_changes(&out.changes, args.all));
        s
    })
}

/// One line per change, `A`/`M`/`D`/`T` and the path, for a person to
/// read: an added or deleted directory whose [`COLLAPSE_AT`] or more
/// entries below all went the same way is one line with their number (a
/// deleted `node_modules` was 12,000 lines, helper-70), unless `all`. A path still there but not
/// captured says why once per subtree. A summary line ends a list of
/// more than one change.
pub(crate) fn render_changes(changes: &[ChangeJson], all: bool) -> String {
    let mut s = String::new();
    // The reason once per subtree: below a path that gave it, a
    // line says only that the path is still there.
    let mut said: Option<(&str, &str)> = None;
    let mut i = 0;
    while i < changes.len() {
        let c = &changes[i];
        let below = changes[i + 1..]
            .iter()
            .take_while(|d| is_below(d.path.as_bytes(), c.path.as_bytes()))
            .count();
        let whole = !all
            && below >= COLLAPSE_AT
            && matches!(c.status, "added" | "deleted")
            && changes[i..=i + below]
                .iter()
                .all(|d| d.status == c.status && d.uncaptured.is_none());
        let note = match c.uncaptured.as_deref() {
            None => String::new(),
            Some(why)
                if said.is_some_and(|(top, w)| {
                    w == why && is_below(c.path.as_bytes(), top.as_bytes())
                }) =>
            {
                " (still there)".to_string()
            }
            Some(why) => {
                said = Some((&c.path, why));
                format!(" (still there, but not captured: {why})")
            }
        };
        if whole {
            // Quoted as a whole, as `--all` quotes the paths below it.
            let dir = super::human_name(
                &format!("{}/", c.path),
                c.path_hex.as_ref().map(|h| format!("{h}2f")).as_deref(),
            )
            .into_owned();
            s.push_str(&format!(
                "{} {dir} ({below} entries; --all lists them)\n",
                status_letter(c.status)
            ));
            i += 1 + below;
        } else {
            let name = super::human_name(&c.path, c.path_hex.as_deref());
            s.push_str(&format!("{} {name}{note}\n", status_letter(c.status)));
            i += 1;
        }
    }
    // Even for one change: the README promises the count (helper-74).
    if !changes.is_empty() {
        s.push_str(&summary(changes));
        s.push('\n');
    }
    s
}

/// Below this many entries, a directory's files are worth their lines.
const COLLAPSE_AT: usize = 10;

/// "1 added, 3 modified, 12034 deleted": how many paths of each kind.
fn summary(changes: &[ChangeJson]) -> String {
    let count = |status: &str| changes.iter().filter(|c| c.status == status).count();
    [
        ("added", "added"),
        ("modified", "modified"),
        ("deleted", "deleted"),
        ("type", "changed type"),
    ]
    .iter()
    .map(|(status, said)| (count(status), said))
    .filter(|(n, _)| *n > 0)
    .map(|(n, said)| format!("{n} {said}"))
    .collect::<Vec<_>>()
    .join(", ")
}

pub(crate) fn compute(ctx: &Ctx, paths: &[PathBuf]) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    let filters = paths
        .iter()
        .map(|p| ws.relative_path(p, &ctx.start_dir()))
        .collect::<Result<Vec<_>>>()?;
    ws.read_unlocked(|ws| compute_in(ws, &filters))
}

fn compute_in(ws: &mut Workspace, filters: &[Vec<u8>]) -> Result<Out> {
    ws.recover_if_needed()?;
    let (head, mut overlay) = match ws.head_for_reading()? {
        Some((head, nodes)) => (Some(head), nodes),
        None => (None, Default::default()),
    };
    let cap = ws.capture(Sink::HashOnly, "scanning")?;
    overlay.extend(cap.overlay());
    let trees = Trees::with_overlay(ws.ledger(), overlay);
    let from = head
        .as_ref()
        .map(|h| h.root)
        .unwrap_or_else(crate::tree::Node::empty_hash);
    let mut changes = diff::diff(&trees, &from, &cap.root, DiffOptions::default())?;
    diff::retain_under(&mut changes, filters);
    let mut warnings = Vec::new();
    for f in filters.iter().filter(|f| !f.is_empty()) {
        let (parent, name) = crate::capture::split_parent(f);
        let on_disk = ws
            .root_dir()
            .open_beneath(Path::new(OsStr::from_bytes(parent)))
            .and_then(|d| d.stat_at(OsStr::from_bytes(name)))
            .is_ok();
        if !on_disk && trees.entry_at(&from, f)?.is_none() {
            warnings.push(format!(
                "{} is neither in the tree nor in HEAD",
                crate::names::human_path(&crate::capture::display_path(f))
            ));
        }
    }
    // What the next checkpoint records, as `diff` and `checkpoint` count
    // it: a path the capture skipped (unreadable, a FIFO, a mount point) is
    // absent from it, so "deleted", marked as still there (D121).
    let excluded = still_there_but_excluded(ws, &changes);
    let mut changes = ChangeJson::from_changes(&changes);
    for c in changes.iter_mut().filter(|c| c.status == "deleted") {
        c.uncaptured = cap
            .skipped
            .iter()
            .find(|s| c.path == s.path || is_below(c.path.as_bytes(), s.path.as_bytes()))
            .map(|s| s.reason.clone());
    }
    for (c, why) in changes.iter_mut().zip(excluded) {
        if c.uncaptured.is_none() {
            c.uncaptured = why;
        }
    }
    Ok(Out {
        warnings,
        head_label: head.as_ref().and_then(|h| h.label.clone()),
        head: head.map(|h| h.id),
        changes,
        skipped: cap.skipped,
    })
}

/// For each change, why a path HEAD holds and the capture does not is
/// still on disk: the ignore rules now in force leave it out (a pattern
/// just added to `.rewindignore`). Shown as a plain deletion, it sent the
/// user looking for what deleted `build/` (helper-62); a rewind keeps it
/// (D168). Only the top-most path of each deleted subtree is looked up.
fn still_there_but_excluded(ws: &Workspace, changes: &[Change]) -> Vec<Option<String>> {
    const WHY: &str = "the ignore rules now in force exclude it (`.rewindignore`, `.rewind/ignore`), so the next checkpoint leaves it out and a rewind keeps it";
    let root = ws.root_dir();
    // The top-most deleted path last looked up, and whether it is there.
    let mut last: Option<(&[u8], bool)> = None;
    changes
        .iter()
        .map(|c| {
            if c.new.is_some() {
                return None;
            }
            let below_last = last.is_some_and(|(top, _)| is_below(&c.path, top));
            if !below_last {
                let (parent, name) = crate::capture::split_parent(&c.path);
                let there = root
                    .open_beneath(Path::new(OsStr::from_bytes(parent)))
                    .and_then(|d| d.stat_at(OsStr::from_bytes(name)))
                    .is_ok();
                last = Some((&c.path, there));
            }
            last.and_then(|(_, there)| there.then(|| WHY.to_string()))
        })
        .collect()
}

pub fn status_letter(status: &str) -> char {
    match status {
        "added" => 'A',
        "deleted" => 'D',
        "type" => 'T',
        _ => 'M',
    }
}
