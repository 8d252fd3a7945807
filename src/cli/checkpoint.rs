use super::{Ctx, human_bytes};
use crate::error::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A label to find this checkpoint by later
    label: Option<String>,
    /// Kind recorded with the checkpoint (manual, auto, hook)
    #[arg(long, default_value = "manual", value_parser = ["manual", "auto", "hook"])]
    kind: String,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let mut ws = ctx.workspace_or_init()?;
    let reuse = args.kind != "manual";
    let r = ws.checkpoint(args.label.as_deref(), &args.kind, reuse)?;
    ctx.emit(&r, || {
        let mut s = format!(
            "{} {}{}: +{} ~{} -{}, {} new ({}), {} ms",
            if r.unchanged {
                "unchanged, still at"
            } else {
                "checkpoint"
            },
            r.id,
            r.label
                .as_ref()
                .map(|l| format!(" \"{l}\""))
                .unwrap_or_default(),
            r.changes.added,
            r.changes.modified,
            r.changes.deleted,
            human_bytes(r.bytes_new),
            if r.reflink {
                "reflink clones"
            } else {
                "copied: no clones on this filesystem"
            },
            r.duration_ms
        );
        for sk in &r.skipped {
            s.push_str(&format!("\n  skipped {}: {}", sk.path, sk.reason));
        }
        s
    })
}
