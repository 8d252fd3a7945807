use super::{Ctx, human_bytes};
use crate::error::Result;

pub fn run(ctx: &Ctx) -> Result<()> {
    let mut ws = ctx.workspace()?;
    ws.recover_if_needed()?;
    let u = crate::du::usage(&ws)?;
    ctx.emit(&u, || {
        let mut s = format!(
            "{:<10} {:>10} {:>10} {:>10}  label\n",
            "checkpoint", "logical", "unique", "on disk"
        );
        for c in &u.checkpoints {
            s.push_str(&format!(
                "{:<10} {:>10} {:>10} {:>10}  {}\n",
                c.id,
                human_bytes(c.logical),
                human_bytes(c.unique),
                human_bytes(c.unique_physical),
                c.label.as_deref().unwrap_or("")
            ));
        }
        let t = &u.total;
        let f = &t.footprint;
        s.push_str(&format!(
            "\n{} checkpoints ({} pruned); distinct content {} (whole-file sizes: what the disk holds is below)\n\
             on disk: {} = ledger {} ({} in use) + objects {} ({} files, {} logical, {} allocated incl. extents shared with the workspace{}; measured by {}) + metadata ~{} ({} extents, estimated) + reserve {} (for gc on a full disk)",
            t.checkpoints,
            t.pruned,
            human_bytes(t.content),
            human_bytes(f.physical),
            human_bytes(f.ledger_file),
            human_bytes(t.ledger_used),
            human_bytes(f.object_physical),
            f.object_files,
            human_bytes(f.object_logical),
            human_bytes(f.object_allocated),
            if f.snapshots > 0 {
                format!(
                    "; and {} btrfs snapshots, {} of their files measured as content no object file holds",
                    f.snapshots, f.snapshot_files
                )
            } else {
                String::new()
            },
            f.method,
            human_bytes(f.metadata_estimate),
            f.object_extents,
            human_bytes(f.reserve)
        ));
        if f.snapshots_left > 0 {
            s.push_str(&format!(
                "\n{} that no kept checkpoint has {} still on disk, not counted above (`rewind gc` deletes them where this user may, see `rewind doctor`)",
                crate::names::counted(f.snapshots_left, "btrfs snapshot"),
                if f.snapshots_left == 1 { "is" } else { "are" }
            ));
        }
        s
    })
}
