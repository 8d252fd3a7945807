use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::Serialize;

use super::Ctx;
use crate::capture::{Sink, is_below};
use crate::diff::{self, Change, DiffOptions, Trees};
use crate::error::Result;
use crate::workspace::{ChangeJson, Workspace};

#[derive(Serialize)]
pub(crate) struct Out {
    pub head: Option<String>,
    pub changes: Vec<ChangeJson>,
    pub skipped: Vec<crate::capture::Skipped>,
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let out = compute(ctx)?;
    ctx.emit(&out, || {
        let mut s = format!(
            "HEAD {}\n",
            out.head.as_deref().unwrap_or("(none: no checkpoint yet)")
        );
        if out.changes.is_empty() {
            s.push_str("no changes\n");
        }
        for sk in &out.skipped {
            s.push_str(&format!(
                "skipped {}: {}\n",
                super::human_name(&sk.path, sk.path_hex.as_deref()),
                sk.reason
            ));
        }
        // The reason once per subtree: below a path that gave it, a
        // line says only that the path is still there.
        let mut said: Option<(&str, &str)> = None;
        for c in &out.changes {
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
            s.push_str(&format!(
                "{} {}{note}\n",
                status_letter(c.status),
                super::human_name(&c.path, c.path_hex.as_deref()),
            ));
        }
        s
    })
}

pub(crate) fn compute(ctx: &Ctx) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    ws.read_unlocked(compute_in)
}

fn compute_in(ws: &mut Workspace) -> Result<Out> {
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
    let changes = diff::diff(&trees, &from, &cap.root, DiffOptions::default())?;
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
