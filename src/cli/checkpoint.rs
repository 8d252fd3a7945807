use super::{Ctx, human_bytes};
use crate::error::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A label to find this checkpoint by later
    label: Option<String>,
    /// The label, as `git commit -m` takes a message
    #[arg(
        short = 'm',
        long = "message",
        value_name = "LABEL",
        conflicts_with = "label"
    )]
    message: Option<String>,
    /// Kind recorded with the checkpoint (manual, auto, hook)
    #[arg(long, default_value = "manual", value_parser = ["manual", "auto", "hook"])]
    kind: String,
}

pub fn run(ctx: &Ctx, mut args: Args) -> Result<()> {
    args.label = args.label.or(args.message.take());
    let mut ws = ctx.workspace_or_init()?;
    let reuse = args.kind != "manual";
    let mut r = ws.checkpoint(args.label.as_deref(), &args.kind, reuse)?;
    // A reused HEAD keeps its own label: say that this one was not
    // recorded, or a later `rewind LABEL` is UNKNOWN_ID (helper-33, D231).
    if let Some(label) = args
        .label
        .as_deref()
        .filter(|l| r.unchanged && r.label.as_deref() != Some(*l))
    {
        r.warnings.push(format!(
            "nothing changed since {}, so no checkpoint was made and the label {} was not recorded: `rewind checkpoint {}` (kind manual) makes a labelled one",
            r.id,
            crate::names::quoted_label(label),
            crate::names::shell_word(label)
        ));
    }
    {
        let _t = crate::trace::span("close workspace");
        drop(ws);
    }
    // Retention happens on the side: say so on stderr, never silently.
    if !r.pruned.is_empty() {
        rewind_platform::stderr_line!(
            "rewind: pruned {} checkpoint{} by the retention policy (rewind.toml [retention]): {}",
            r.pruned.len(),
            if r.pruned.len() == 1 { "" } else { "s" },
            r.pruned.join(" ")
        );
    }
    for w in &r.warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    if let Some(w) = (r.history_lost.as_ref()).filter(|_| !crate::workspace::history_loss_said()) {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    ctx.emit(&r, || {
        let mut how = Vec::new();
        if r.cloned > 0 {
            how.push(format!("{} cloned", r.cloned));
        }
        if r.copied > 0 {
            how.push(format!(
                "{} copied{}",
                r.copied,
                if r.reflink {
                    ""
                } else {
                    ": no clones on this filesystem"
                }
            ));
        }
        if r.inlined > 0 {
            how.push(format!("{} small in the ledger", r.inlined));
        }
        let read = r.cloned + r.copied + r.inlined;
        let how = if how.is_empty() {
            String::new()
        } else if r.bytes_new == 0 {
            // Files rewritten with the same bytes (`npm install` again):
            // "168 cloned" read as if they had been stored (helper-70).
            format!(" ({read} files read again, all already stored)")
        } else {
            format!(" ({})", how.join(", "))
        };
        let counts = match r.changes {
            Some(c) => format!("+{} ~{} -{}", c.added, c.modified, c.deleted),
            None => "snapshot taken, manifest following".to_string(),
        };
        let mut s = format!(
            "{} {}{}: {counts}, {} new{how}, {} ms",
            if r.unchanged {
                "unchanged, still at"
            } else {
                "checkpoint"
            },
            r.id,
            r.label
                .as_ref()
                .map(|l| format!(" {}", crate::names::quoted_label(l)))
                .unwrap_or_default(),
            human_bytes(r.bytes_new),
            r.duration_ms
        );
        for sk in r.skipped.iter().flatten() {
            s.push_str(&format!(
                "\n  skipped {}: {}",
                super::human_name(&sk.path, sk.path_hex.as_deref()),
                sk.reason
            ));
        }
        s
    })
}
