use std::collections::HashMap;

use serde::Serialize;

use super::Ctx;
use crate::error::Result;
use crate::ledger::Checkpoint;

#[derive(Serialize)]
pub(crate) struct Out {
    pub head: Option<String>,
    pub checkpoints: Vec<Checkpoint>,
}

pub(crate) fn compute(ctx: &Ctx) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    ws.recover_if_needed()?;
    Ok(Out {
        head: ws.head()?.map(|h| h.id),
        checkpoints: ws.ledger().checkpoints()?,
    })
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let out = compute(ctx)?;
    ctx.emit(&out, || render(&out.checkpoints, out.head.as_deref()))
}

/// Checkpoints as a tree: a linear history stays in one column; where
/// history branched (a checkpoint after a rewind), each branch is drawn
/// below its fork point.
fn render(cks: &[Checkpoint], head: Option<&str>) -> String {
    if cks.is_empty() {
        return "no checkpoints yet: run `rewind checkpoint`".into();
    }
    let mut children: HashMap<Option<i64>, Vec<&Checkpoint>> = HashMap::new();
    for c in cks {
        children
            .entry(c.parent.as_ref().map(|p| p.0))
            .or_default()
            .push(c);
    }
    let mut out = String::new();
    let roots = children.get(&None).cloned().unwrap_or_default();
    draw(&roots, "", &children, head, &mut out);
    out
}

fn draw(
    nodes: &[&Checkpoint],
    prefix: &str,
    children: &HashMap<Option<i64>, Vec<&Checkpoint>>,
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
            "{first}{marker} {}  {}  {:<10}{}{}\n",
            c.id,
            &c.created_at[..19].replace('T', " "),
            c.kind,
            c.label
                .as_ref()
                .map(|l| match super::human_path(l) {
                    std::borrow::Cow::Borrowed(l) => format!("  \"{l}\""),
                    quoted => format!("  {quoted}"),
                })
                .unwrap_or_default(),
            c.note
                .as_ref()
                .map(|n| format!("  note: {}", super::human_path(n)))
                .unwrap_or_default(),
        ));
        if c.pruned {
            out.truncate(out.trim_end().len());
            out.push_str("  (pruned)\n");
        }
        if let Some(kids) = children.get(&Some(c.seq)) {
            draw(kids, &rest, children, head, out);
        }
    }
}
