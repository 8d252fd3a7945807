use serde::Serialize;

use super::Ctx;
use crate::error::Result;
use crate::workspace::{ENGINE_WALK, Workspace};

#[derive(Serialize)]
struct Out {
    workspace: String,
    engine: &'static str,
    reflink: bool,
    fs: String,
    created: bool,
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let (ws, created) = Workspace::init(&ctx.start_dir(), false)?;
    let out = Out {
        workspace: ws.root_path().display().to_string(),
        engine: ENGINE_WALK,
        reflink: ws.clones(),
        fs: ws.fs().kind.to_string(),
        created,
    };
    ctx.emit(&out, || {
        format!(
            "{} workspace {} ({} on {}, {})",
            if out.created {
                "initialized"
            } else {
                "already a"
            },
            out.workspace,
            out.engine,
            out.fs,
            if out.reflink {
                "copy-on-write clones"
            } else {
                "no clones here: files are copied"
            }
        )
    })
}
