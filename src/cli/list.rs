use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::Ctx;
use crate::error::Result;
use crate::ledger::Checkpoint;

/// How many checkpoints `list` prints without `-n` or `--all`: hooks make
/// one per tool call, and a list of thousands (221 KB at 5,000) buried
/// the recent ones a person looks for and flooded an agent that ran
/// `rewind list` through its shell.
const DEFAULT_SHOWN: usize = 50;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Show the newest N checkpoints (HEAD always among them); the text
    /// shows the newest 50 by default, JSON every checkpoint
    #[arg(short = 'n', long, value_name = "N", conflicts_with = "all")]
    limit: Option<usize>,
    /// Show every checkpoint
    #[arg(long)]
    all: bool,
}

#[derive(Serialize)]
pub(crate) struct Out {
    pub head: Option<String>,
    /// Checkpoints in the ledger, shown or not.
    pub total: usize,
    /// Oldest first; the newest `-n` of them when limited.
    pub checkpoints: Vec<Checkpoint>,
    /// Acknowledged checkpoints whose manifests are not built yet, oldest
    /// first: a full disk or a read-only filesystem stopped the build, and
    /// their snapshots hold them (D266). Without this, the checkpoint an
    /// agent was just told was made was missing from the list.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingOut>,
}

#[derive(Serialize)]
pub(crate) struct PendingOut {
    #[serde(skip)]
    pub seq: i64,
    pub id: String,
    pub label: Option<String>,
    pub parent: Option<String>,
    pub kind: String,
    pub created_at: String,
}

pub(crate) fn compute(ctx: &Ctx) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    ws.recover_if_needed()?;
    let checkpoints = ws.ledger().checkpoints()?;
    let mut pending = Vec::new();
    for p in ws.ledger().pending()? {
        let parent = match p.parent {
            Some(seq) => ws.ledger().id_of_seq(seq)?,
            None => None,
        };
        pending.push(PendingOut {
            seq: p.seq,
            id: p.id,
            label: p.label,
            parent,
            kind: p.kind,
            created_at: crate::time::format_rfc3339(p.created_at_ms),
        });
    }
    let head = match ws.ledger().head_seq()? {
        Some(seq) => ws.ledger().id_of_seq(seq)?,
        None => None,
    };
    Ok(Out {
        head,
        total: checkpoints.len() + pending.len(),
        checkpoints,
        pending,
    })
}

pub fn run(ctx: &Ctx, args: &Args) -> Result<()> {
    let mut out = compute(ctx)?;
    let limit = match (args.all, args.limit) {
        (true, _) => None,
        (false, Some(n)) => Some(n),
        (false, None) if ctx.json => None,
        (false, None) => Some(DEFAULT_SHOWN),
    };
    // HEAD shown below the newest N: some of those left out are newer.
    let mut head_below = false;
    if let Some(n) = limit {
        let first = out.checkpoints.len().saturating_sub(n);
        head_below = out
            .checkpoints
            .iter()
            .position(|c| Some(c.id.as_str()) == out.head.as_deref())
            .is_some_and(|at| at + 1 < first);
        out.checkpoints = newest(out.checkpoints, n, out.head.as_deref());
    }
    ctx.emit(&out, || {
        let mut text = String::new();
        let omitted = out.total - out.checkpoints.len() - out.pending.len();
        if omitted > 0 {
            text.push_str(&format!(
                "⋮ {omitted} {}checkpoint{} not shown (`rewind list --all`, or `-n N`)\n",
                if head_below { "" } else { "older " },
                if omitted == 1 { "" } else { "s" }
            ));
        }
        let mut text = match (out.checkpoints.is_empty(), out.pending.is_empty()) {
            (true, false) => text,
            _ => text + &render(&out.checkpoints, out.head.as_deref()),
        };
        for p in &out.pending {
            let marker = if Some(p.id.as_str()) == out.head.as_deref() {
                "@"
            } else {
                "○"
            };
            text.push_str(&format!(
                "{}{marker} {}  (manifest not built yet: its snapshot holds it)",
                // One line each, after the tree's last (helper-62 saw a
                // blank line between them).
                if text.is_empty() || text.ends_with('\n') {
                    ""
                } else {
                    "\n"
                },
                row(&p.id, &p.created_at, &p.kind, p.label.as_deref()),
            ));
        }
        text
    })
}

/// Of `cks` (oldest first), the newest `n` and HEAD wherever it is.
fn newest(cks: Vec<Checkpoint>, n: usize, head: Option<&str>) -> Vec<Checkpoint> {
    let first = cks.len().saturating_sub(n);
    cks.into_iter()
        .enumerate()
        .filter(|(i, c)| *i >= first || Some(c.id.as_str()) == head)
        .map(|(_, c)| c)
        .collect()
}

/// Checkpoints as a tree: a linear history stays in one column; where
/// history branched (a checkpoint after a rewind), each branch is drawn
/// below its fork point.
fn render(cks: &[Checkpoint], head: Option<&str>) -> String {
    if cks.is_empty() {
        return "no checkpoints yet: run `rewind checkpoint`".into();
    }
    let mut children: HashMap<i64, Vec<&Checkpoint>> = HashMap::new();
    for c in cks {
        if let Some(p) = &c.parent {
            children.entry(p.0).or_default().push(c);
        }
    }
    // A checkpoint whose parent is not shown starts a tree of its own,
    // after a `⋮`: drawn beside the others, HEAD far back and the newest
    // looked like two branches of one fork (helper-52).
    let shown: HashSet<i64> = cks.iter().map(|c| c.seq).collect();
    let (roots, cut): (Vec<&Checkpoint>, Vec<&Checkpoint>) = cks
        .iter()
        .filter(|c| c.parent.as_ref().is_none_or(|p| !shown.contains(&p.0)))
        .partition(|c| c.parent.is_none());
    let mut out = String::new();
    draw(&roots, "", &children, head, &mut out);
    for c in cut {
        if !out.is_empty() {
            out.push_str("⋮\n");
        }
        draw(&[c], "", &children, head, &mut out);
    }
    out
}

/// A checkpoint's line after its marker: id, time, kind, label.
fn row(id: &str, created_at: &str, kind: &str, label: Option<&str>) -> String {
    format!(
        "{id}  {}  {kind:<10}{}",
        &created_at[..19].replace('T', " "),
        label
            .map(|l| format!("  {}", crate::names::quoted_label(l)))
            .unwrap_or_default(),
    )
}

fn draw(
    nodes: &[&Checkpoint],
    prefix: &str,
    children: &HashMap<i64, Vec<&Checkpoint>>,
    head: Option<&str>,
    out: &mut String,
) {
    let branching = nodes.len() > 1;
    for (i, c) in nodes.iter().enumerate() {
        let last = i + 1 == nodes.len();
        let (first, rest) = match (branching, last) {
            (false, _) => (prefix.to_string(), prefix.to_string()),
            (true, false) => (format!("{prefix}├─ "), format!("{prefix}│  ")),
            (true, true) => (format!("{prefix}└─ "), format!("{prefix}   ")),
        };
        let marker = if Some(c.id.as_str()) == head {
            "@"
        } else if c.pruned {
            "·"
        } else {
            "○"
        };
        out.push_str(&format!(
            "{first}{marker} {}{}\n",
            row(&c.id, &c.created_at, &c.kind, c.label.as_deref()),
            c.note
                .as_ref()
                .map(|n| format!("  note: {}", super::human_path(n)))
                .unwrap_or_default(),
        ));
        if c.pruned {
            out.truncate(out.trim_end().len());
            out.push_str("  (pruned)\n");
        }
        if let Some(kids) = children.get(&c.seq) {
            draw(kids, &rest, children, head, out);
        }
    }
}
