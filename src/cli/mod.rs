//! The command line: one file per verb. Each verb returns a JSON value and a
//! human rendering; `--json` prints exactly one JSON object on stdout.

mod anchor;
mod checkpoint;
pub(crate) mod diff;
mod doctor;
mod du;
mod effects;
mod finish;
mod gc;
pub(crate) mod guard;
mod hook;
mod init;
mod integrate;
pub(crate) mod list;
mod mcp;
mod mount;
mod rewind;
pub(crate) mod status;
pub(crate) mod verify;
mod writeback;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::progress::Observer;
use crate::warm::{Held, WarmSlot};
use crate::workspace::Workspace;

/// Version of the `--json` output contract (bumped on breaking changes).
pub const JSON_VERSION: u32 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "rewind",
    version,
    about = "Reversible workspaces: O(changed) checkpoints and crash-safe rewinds of a whole directory tree"
)]
pub struct Cli {
    /// Workspace directory (default: the nearest ancestor holding .rewind/, else the current directory)
    #[arg(short = 'C', global = true, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print one JSON object on stdout and nothing else
    #[arg(long, global = true)]
    json: bool,
    /// No human output on success
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create .rewind/ in the workspace (the first checkpoint also does this)
    Init(init::Args),
    /// Capture the whole workspace
    Checkpoint(checkpoint::Args),
    /// Checkpoints as a tree, HEAD marked, with branch notes
    List,
    /// What changed since HEAD
    Status,
    /// Changed paths between two checkpoints (TO defaults to the live tree)
    Diff(diff::Args),
    /// Make the tree equal to a checkpoint (saves the live tree first)
    #[command(visible_alias = "to")]
    Rewind(rewind::Args),
    /// Same as rewind, moving forward along history (e.g. back to a branch you left)
    Replay(rewind::Args),
    /// Undo the last rewind, replay or restore (undo twice to redo)
    Undo(rewind::UndoArgs),
    /// Restore only some paths from a checkpoint: rewind restore ID -- PATHS
    Restore(rewind::RestoreArgs),
    /// Filesystem, clone support, engine and ledger health, and why
    Doctor,
    /// Check the tamper-evident event chain (exit 0 ok, 1 tampered, 2 unreadable)
    Verify(verify::Args),
    /// Export the chain head (seq + hash) to keep elsewhere
    Anchor(anchor::Args),
    /// Effect barrier: may this irreversible effect run? (exit 0 admitted, 2 refused)
    Guard(guard::Args),
    /// List recorded effects, or `effects resolve KEY --outcome failed|succeeded`
    Effects(effects::Args),
    /// Disk used by the history: per checkpoint (logical, unique, on disk) and in total
    Du,
    /// Prune checkpoints by the retention policy and free what only they used
    Gc(gc::Args),
    /// MCP server on stdio for AI agents (tools: checkpoint, rewind, guard_effect, ...)
    Mcp(mcp::Args),
    /// Agent hooks: `hook pre-tool-use` / `hook post-tool-use` read the hook JSON on stdin
    Hook(hook::Args),
    /// Write an agent's MCP server entry and hooks: claude, codex, gemini, cursor
    Integrate(integrate::Args),
    /// Serve the workspace through the FUSE overlay: checkpoints without a walk
    Mount(mount::Args),
    /// Stop serving a workspace mounted with `rewind mount`
    Unmount(mount::UnmountArgs),
    /// Build pending btrfs manifests (started in the background by `checkpoint`)
    #[command(hide = true, name = "finish-manifests")]
    FinishManifests,
    /// Write back what is dirty on the workspace's filesystem (started in
    /// the background by `hook post-tool-use` on the btrfs engine)
    #[command(hide = true)]
    Writeback,
}

/// What every verb gets: global options and how to find the workspace.
pub struct Ctx {
    pub(crate) dir: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
    pub cwd: PathBuf,
    /// A machine caller (the MCP server) watching progress and able to cancel.
    pub observer: Option<Observer>,
    /// A long-lived caller's open workspace, reused between calls (D63).
    pub warm: Option<WarmSlot>,
}

impl Ctx {
    /// The context of one MCP tool call: no human output; relative paths
    /// name paths from `cwd`.
    pub fn for_tool(
        dir: Option<PathBuf>,
        cwd: PathBuf,
        observer: Option<Observer>,
        warm: Option<WarmSlot>,
    ) -> Ctx {
        Ctx {
            dir,
            json: true,
            quiet: true,
            cwd,
            observer,
            warm,
        }
    }

    fn progress(&self) -> bool {
        !self.json && !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr())
    }

    /// The directory named by -C, or the current one.
    pub fn start_dir(&self) -> PathBuf {
        self.dir_arg(None)
    }

    /// A directory argument, relative to the current directory (an
    /// absolute one stands as is); none: the -C directory or the current
    /// one.
    pub fn dir_arg(&self, dir: Option<&std::path::Path>) -> PathBuf {
        match dir.or(self.dir.as_deref()) {
            Some(d) => self.cwd.join(d),
            None => self.cwd.clone(),
        }
    }

    /// Open the workspace holding the start directory.
    pub fn workspace(&self) -> Result<Held<'_>> {
        let _t = crate::trace::span("open workspace");
        let start = self.start_dir();
        match Workspace::discover(&start) {
            Some(root) => self.observed(self.reuse_or_open(&root)?),
            None if !start.exists() => Err(Error::Os(rewind_platform::Error::new(
                "open workspace",
                &start,
                std::io::Error::from_raw_os_error(2),
            ))),
            None => Err(Error::NotAWorkspace { path: start }),
        }
    }

    /// Open the workspace, creating it if needed (checkpoint, init).
    pub fn workspace_or_init(&self) -> Result<Held<'_>> {
        let _t = crate::trace::span("open workspace");
        let start = self.start_dir();
        let ws = match Workspace::discover(&start) {
            Some(root) => self.reuse_or_open(&root)?,
            None => Workspace::init(&start, self.progress())?.0,
        };
        self.observed(ws)
    }

    /// The workspace at `root`: the one a long-lived caller kept, if it is
    /// still current, else opened.
    fn reuse_or_open(&self, root: &std::path::Path) -> Result<Workspace> {
        match self.warm.as_ref().and_then(|w| w.take(root)) {
            Some(ws) => Ok(ws),
            None => Workspace::open(root, self.progress()),
        }
    }

    fn observed(&self, mut ws: Workspace) -> Result<Held<'_>> {
        if let Some(o) = &self.observer {
            ws.set_observer(o.clone());
        }
        Ok(Held::new(ws, self.warm.as_ref()))
    }

    /// Print the result: JSON (with the contract version) or the human text.
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce() -> String) -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            let mut v =
                serde_json::to_value(value).map_err(|e| Error::Usage(format!("internal: {e}")))?;
            if let serde_json::Value::Object(m) = &mut v {
                m.insert("version".into(), JSON_VERSION.into());
            }
            let _ = writeln!(stdout, "{v}");
        } else if !self.quiet {
            let text = human();
            if !text.is_empty() {
                let _ = writeln!(stdout, "{}", text.trim_end());
            }
        }
        Ok(())
    }
}

/// Entry point: parse, run, print, and map errors to exit codes.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Usage errors exit 1 (2 means "refused by the effect barrier").
            let code = if e.use_stderr() { 1 } else { 0 };
            if code == 1 && std::env::args().any(|a| a == "--json") {
                let message = e.kind().to_string();
                let v = serde_json::json!({"version": JSON_VERSION, "error": {"code": "USAGE", "message": message}});
                let _ = writeln!(std::io::stdout(), "{v}");
            }
            let _ = e.print();
            return code;
        }
    };
    let _t = crate::trace::span("total");
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let ctx = Ctx {
        dir: cli.dir,
        json: cli.json,
        quiet: cli.quiet,
        cwd,
        observer: None,
        warm: None,
    };
    let result = match cli.command {
        Command::Init(a) => init::run(&ctx, a),
        Command::Checkpoint(a) => checkpoint::run(&ctx, a),
        Command::List => list::run(&ctx),
        Command::Status => status::run(&ctx),
        Command::Diff(a) => diff::run(&ctx, a),
        Command::Rewind(a) => rewind::run(&ctx, crate::rewind::Op::Rewind, a),
        Command::Replay(a) => rewind::run(&ctx, crate::rewind::Op::Replay, a),
        Command::Undo(a) => rewind::undo(&ctx, a),
        Command::Restore(a) => rewind::restore(&ctx, a),
        Command::Doctor => doctor::run(&ctx),
        Command::Anchor(a) => anchor::run(&ctx, a),
        Command::Verify(a) => return verify::run(&ctx, a),
        Command::Guard(a) => return guard::run(&ctx, a),
        Command::Effects(a) => effects::run(&ctx, a),
        Command::Gc(a) => gc::run(&ctx, a),
        Command::Du => du::run(&ctx),
        Command::Mcp(a) => mcp::run(&ctx, a),
        Command::Hook(a) => return hook::run(&ctx, a),
        Command::Integrate(a) => integrate::run(&ctx, a),
        Command::FinishManifests => finish::run(&ctx),
        Command::Writeback => writeback::run(&ctx),
        Command::Mount(a) => mount::run(&ctx, a),
        Command::Unmount(a) => mount::unmount(&ctx, a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            report_error(&ctx, &e);
            e.exit_code()
        }
    }
}

/// One line on stderr; with `--json`, also the error object on stdout.
pub fn report_error(ctx: &Ctx, e: &Error) {
    if ctx.json {
        let v = serde_json::json!({"version": JSON_VERSION, "error": {"code": e.code(), "message": e.to_string()}});
        let _ = writeln!(std::io::stdout(), "{v}");
    }
    eprintln!("rewind: error: {e}");
}

/// Human-readable byte counts.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
