use std::path::PathBuf;

use super::Ctx;
use crate::error::{Error, Result};
use crate::rewind::{self as engine, Op, RewindOptions, RewindReport};

#[derive(clap::Args, Debug)]
pub struct Common {
    /// Print the plan and its fingerprint; change nothing
    #[arg(long)]
    dry_run: bool,
    /// Apply only if the plan still has this fingerprint (from --dry-run)
    #[arg(long, value_name = "FP")]
    expect: Option<String>,
    /// A note stored on the branch being left (shown by `list`)
    #[arg(long, value_name = "TEXT")]
    report: Option<String>,
    /// Restore recorded modification times. By default each file written
    /// gets one just before the rewind, in the recorded order: builds
    /// rebuild what depends on a restored file, outputs restored with
    /// their sources stay fresh, and Python recompiles the `.pyc` of a
    /// restored `.py`. With this flag, outputs the checkpoint does not
    /// hold (an ignored `target/`, a build directory elsewhere) may look
    /// up to date for sources they were not built from
    #[arg(long)]
    exact_times: bool,
    /// Restore setuid/setgid bits too (stripped by default)
    #[arg(long)]
    pub(crate) allow_setuid: bool,
}

impl Common {
    fn options(self) -> RewindOptions {
        RewindOptions {
            dry_run: self.dry_run,
            expect: self.expect,
            // As over MCP: a blank note is no note.
            report: self.report.filter(|r| !r.trim().is_empty()),
            exact_times: self.exact_times,
            allow_setuid: self.allow_setuid,
            paths: Vec::new(),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint id, unique id prefix, label, HEAD or HEAD~N
    id: String,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(clap::Args, Debug)]
pub struct UndoArgs {
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Checkpoint to restore from
    id: String,
    #[command(flatten)]
    pub(crate) common: Common,
    /// Paths to restore (after --)
    #[arg(last = true, required = true)]
    paths: Vec<PathBuf>,
}

pub fn run(ctx: &Ctx, op: Op, args: Args) -> Result<()> {
    let mut ws = ctx.workspace()?;
    let r = engine::run(&mut ws, op, &args.id, &args.common.options())?;
    emit(ctx, &r)
}

pub fn undo(ctx: &Ctx, args: UndoArgs) -> Result<()> {
    let mut ws = ctx.workspace()?;
    let r = engine::undo(&mut ws, &args.common.options())?;
    emit(ctx, &r)
}

pub fn restore(ctx: &Ctx, args: RestoreArgs) -> Result<()> {
    let mut ws = ctx.workspace()?;
    let mut opts = args.common.options();
    opts.paths = args
        .paths
        .iter()
        .map(|p| ws.relative_path(p, &ctx.start_dir()))
        .collect::<Result<_>>()?;
    if opts.paths.iter().any(|p| p.is_empty()) {
        return Err(Error::Usage(
            "restore of the whole workspace is `rewind rewind ID`".into(),
        ));
    }
    let target = ws.resolve(&args.id)?;
    let r = engine::run(&mut ws, Op::Restore, &target.id, &opts)?;
    emit(ctx, &r)
}

/// Plan entries a human dry run lists before it counts the rest.
const PLAN_LINES: usize = 50;

fn emit(ctx: &Ctx, r: &RewindReport) -> Result<()> {
    // The caller's directory was created after the target: the rewind
    // removed it, and the shell is left in a deleted directory.
    if !r.dry_run && !ctx.cwd.is_dir() {
        rewind_platform::stderr_line!(
            "rewind: warning: this shell's working directory {} was removed by this {}: `cd {}` (from there, `rewind undo` brings it back)",
            ctx.cwd.display(),
            r.op,
            super::nearest_existing(&ctx.cwd).display()
        );
    }
    // A warning goes where `checkpoint`'s go, stderr, so that `-q` and a
    // script reading stdout still see it (helper-62).
    if let Some(w) = r.warning.as_deref().filter(|_| !ctx.json) {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    ctx.emit(r, || {
        let mut s = String::new();
        let toward = crate::rewind::preposition(r.op);
        if r.dry_run {
            s.push_str(&format!(
                "plan: {} {} {} ({} to write, {} to delete)\n",
                r.op, toward, r.rewound_to, r.changes.written, r.changes.deleted
            ));
            // A plan of thousands (a `node_modules` swapped) scrolled the
            // summary away (helper-58): its first lines, and the rest
            // counted; `--json` lists every one.
            for c in r.plan.iter().take(PLAN_LINES) {
                s.push_str(&format!(
                    "  {} {}\n",
                    super::status::status_letter(c.status),
                    super::human_name(&c.path, c.path_hex.as_deref())
                ));
            }
            if r.plan.len() > PLAN_LINES {
                s.push_str(&format!(
                    "  … and {} more (`--json` lists every one)\n",
                    r.plan.len() - PLAN_LINES
                ));
            }
            // What the rewind would keep, with why: the human dry run
            // listed none of it (helper-43, D264).
            // Each reason starts with "kept:", as the rewind prints it.
            for k in &r.kept {
                s.push_str(&format!(
                    "  {}: {}\n",
                    super::human_name(&k.path, k.path_hex.as_deref()),
                    k.reason
                ));
            }
            s.push_str(&format!(
                "fingerprint {}  ({} to write, {} to delete; apply exactly this plan with --expect {})\n",
                r.plan_fingerprint, r.changes.written, r.changes.deleted, r.plan_fingerprint
            ));
            return s;
        }
        if r.safety_checkpoint.is_none() && r.plan.is_empty() && !r.kept.is_empty() {
            // Not "already equals it": what is kept differs (helper-30).
            s.push_str(&format!(
                "{} {toward} {}: nothing done, nothing recorded: the tree differs from it only where it keeps what is there now (below, each with its reason)",
                r.op, r.rewound_to
            ));
        } else if r.safety_checkpoint.is_none() && r.plan.is_empty() {
            s.push_str(&format!(
                "{} {toward} {}: the tree already equals it; nothing done, nothing recorded (`rewind undo` still undoes the last change)",
                r.op, r.rewound_to
            ));
        } else {
            s.push_str(&format!(
                "{} {toward} {}: {} written, {} deleted in {} ms",
                r.op, r.rewound_to, r.changes.written, r.changes.deleted, r.duration_ms
            ));
        }
        if let Some(safety) = &r.safety_checkpoint {
            s.push_str(&format!(
                "\nthe previous tree is saved as {safety} (`rewind undo` goes back)"
            ));
        }
        for k in &r.kept {
            s.push_str(&format!("\n  {}: {}", super::human_name(&k.path, k.path_hex.as_deref()), k.reason));
        }
        for e in &r.effects_not_undone {
            s.push_str(&format!("\n  NOT UNDONE: effect {}:{} ({}) was admitted on a timeline the tree is no longer on, and a rewind does not undo it; `guard` will refuse it again", e.scope, e.key, e.kind));
        }
        for p in &r.setuid_stripped {
            s.push_str(&format!(
                "\n  {p}: setuid/setgid bits not restored (use --allow-setuid)"
            ));
        }
        s
    })
}
