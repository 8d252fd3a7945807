use serde::Serialize;

use super::Ctx;
use crate::capture::Sink;
use crate::diff::{self, DiffOptions, Trees};
use crate::error::Result;
use crate::workspace::ChangeJson;

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
        for c in &out.changes {
            s.push_str(&format!(
                "{} {}{}\n",
                status_letter(c.status),
                super::human_name(&c.path, c.path_hex.as_deref()),
                c.uncaptured.as_ref().map_or(String::new(), |why| format!(
                    " (still there, but not captured: {why})"
                ))
            ));
        }
        s
    })
}

pub(crate) fn compute(ctx: &Ctx) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    ws.read_unlocked(compute_in)
}

fn compute_in(ws: &mut crate::workspace::Workspace) -> Result<Out> {
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
    let mut changes = ChangeJson::from_changes(&changes);
    for c in changes.iter_mut().filter(|c| c.status == "deleted") {
        c.uncaptured = cap
            .skipped
            .iter()
            .find(|s| {
                c.path == s.path
                    || c.path
                        .strip_prefix(s.path.as_str())
                        .is_some_and(|r| r.starts_with('/'))
            })
            .map(|s| s.reason.clone());
    }
    Ok(Out {
        head: head.map(|h| h.id),
        changes,
        skipped: cap.skipped,
    })
}

pub fn status_letter(status: &str) -> char {
    match status {
        "added" => 'A',
        "deleted" => 'D',
        "type" => 'T',
        _ => 'M',
    }
}
