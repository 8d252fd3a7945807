use super::Ctx;
use crate::error::Result;
use crate::mcp::{self, Profile};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tool set: lean (checkpoint, rewind, guard_effect), recovery (+ list,
    /// replay, diff, status, backtrack_*), all. Default: $REWIND_MCP_PROFILE, else all
    #[arg(long, value_name = "PROFILE")]
    profile: Option<String>,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let name = args
        .profile
        .or_else(|| std::env::var("REWIND_MCP_PROFILE").ok())
        .unwrap_or_else(|| "all".into());
    // An unknown profile fails here, before the session starts.
    let profile = Profile::parse(&name)?;
    mcp::serve(ctx.dir.clone(), ctx.cwd.clone(), profile)
}
