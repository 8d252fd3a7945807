//! The command line: one file per verb. Each verb returns a JSON value and a
//! human rendering; `--json` prints exactly one JSON object on stdout.

mod anchor;
mod checkpoint;
mod deinit;
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
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod verify;
mod writeback;

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
    version = crate::BUILD,
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
    /// Checkpoints as a tree, HEAD marked, with branch notes (the newest 50; `--all`)
    List(list::Args),
    /// What changed since HEAD (`status PATH...`: only there)
    Status(status::Args),
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
    /// Delete the workspace's whole history (`--yes`), leaving its files as they are
    Deinit(deinit::Args),
    /// MCP server on stdio for AI agents (tools: checkpoint, rewind, guard_effect, ...)
    Mcp(mcp::Args),
    /// Agent hooks: `hook pre-tool-use` / `post-tool-use` / `post-tool-use-failure` read the hook JSON on stdin
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
    /// Run the commands of a mounted workspace (started by its mount daemon)
    #[command(hide = true, name = "serve-commands")]
    ServeCommands(serve::Args),
}

/// Verbs (and aliases) a mounted workspace's command server may run for
/// this process (D93). Not: those that set up or tear down (init, mount,
/// unmount, integrate), diagnose this process's own abilities (doctor),
/// run long or serve (gc, du, mcp, the background verbs).
pub(crate) const SERVER_VERBS: &[&str] = &[
    "checkpoint",
    "list",
    "status",
    "diff",
    "rewind",
    "to",
    "replay",
    "undo",
    "restore",
    "verify",
    "anchor",
    "guard",
    "effects",
    "hook",
];

/// The verb and the `-C` directory of a command line, read without clap
/// (building its parser costs more than handing the command over): enough
/// to choose the command server. Anything unusual before the verb leaves
/// the decision to clap, in this process.
fn scan_command_line(args: &[std::ffi::OsString]) -> Option<(&OsStr, Option<&OsStr>)> {
    let (mut verb, mut dir) = (None, None);
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let b = a.as_bytes();
        if b == b"--" {
            break;
        } else if b == b"-C" {
            dir = Some(it.next()?.as_os_str());
        } else if let Some(d) = b.strip_prefix(b"-C") {
            dir = Some(OsStr::from_bytes(d.strip_prefix(b"=").unwrap_or(d)));
        } else if b.starts_with(b"-") {
            if verb.is_none() && !matches!(b, b"--json" | b"-q" | b"--quiet") {
                return None;
            }
        } else if verb.is_none() {
            verb = Some(a.as_os_str());
        }
    }
    Some((verb?, dir))
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

    pub(crate) fn progress(&self) -> bool {
        !self.json && !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr())
    }

    /// The directory named by -C, or the current one.
    pub fn start_dir(&self) -> PathBuf {
        self.dir_arg(None)
    }

    /// A directory argument, as [`Ctx::path_arg`] reads it; none: the -C
    /// directory or the current one.
    pub fn dir_arg(&self, dir: Option<&std::path::Path>) -> PathBuf {
        match dir {
            Some(d) => self.path_arg(d),
            None => self.path_arg(std::path::Path::new(".")),
        }
    }

    /// A path given on the command line, relative to the -C directory
    /// when there is one, as with `git -C` (an absolute one stands as
    /// is): `rewind -C proj init sub` made `sub/.rewind` in the current
    /// directory (helper-59, D294).
    pub fn path_arg(&self, path: &std::path::Path) -> PathBuf {
        let base = match &self.dir {
            Some(d) => self.cwd.join(d),
            None => self.cwd.clone(),
        };
        // `.` components dropped: errors name `/ws`, not `/ws/.`.
        base.join(path).components().collect()
    }

    /// Open the workspace holding the start directory.
    pub fn workspace(&self) -> Result<Held<'_>> {
        let _t = crate::trace::span("open workspace");
        let start = self.existing_start_dir()?;
        match Workspace::discover(&start) {
            Some(root) => self.observed(self.reuse_or_open(&root)?),
            None if !start.is_dir() => Err(not_a_directory(start)),
            None => match mounted_by_another_user(&start) {
                // Root's door is there, for the owner (D151): this command
                // was not handed to it.
                Some(mp) if door_is_mine(&mp) => Err(Error::InvalidPath {
                    path: mp,
                    reason: "is a workspace mounted with `rewind mount` by root; this command could not be handed to its command server (its owner's commands are; a REWIND_* variable in the environment keeps a command in its own process; or root's daemon stopped): run it as the workspace's owner without REWIND_* variables, or as root (`sudo rewind`)".into(),
                }),
                Some(mp) => Err(Error::InvalidPath {
                    path: mp,
                    reason: "is a workspace mounted with `rewind mount` by another user, whose daemon this user cannot reach: run rewind as that user, or have them unmount it and mount a view as yourself (`rewind mount DIR --at VIEW`)".into(),
                }),
                None => Err(Error::NotAWorkspace { path: start }),
            },
        }
    }

    /// The start directory, refused when it names something else: `-C`
    /// naming a file was taken inside a workspace (as the workspace
    /// around it) and refused outside one (helper-74). A missing one is
    /// left to the caller, which says how to make it.
    fn existing_start_dir(&self) -> Result<PathBuf> {
        let start = self.start_dir();
        match start.exists() && !start.is_dir() {
            true => Err(not_a_directory(start)),
            false => Ok(start),
        }
    }

    /// Open the workspace, creating it if needed (checkpoint, init).
    pub fn workspace_or_init(&self) -> Result<Held<'_>> {
        let _t = crate::trace::span("open workspace");
        let start = self.existing_start_dir()?;
        let ws = match Workspace::discover(&start) {
            Some(root) => match self.reuse_or_open(&root) {
                // Its first `init` or checkpoint was killed before the
                // ledger had tables: this checkpoint makes it again.
                Err(Error::LedgerUnfinished { .. }) => Workspace::init(&root, self.progress())?.0,
                r => r?,
            },
            None => self.init_implicitly(&start, "a checkpoint")?,
        };
        self.observed(ws)
    }

    /// Make `start` a workspace because `what` (a first checkpoint, a
    /// mount) found none there or above, unless it is too broad to be
    /// one without `rewind init` (D162).
    pub fn init_implicitly(&self, start: &std::path::Path, what: &str) -> Result<Workspace> {
        if !start.is_dir() {
            return Err(not_a_directory(start.to_path_buf()));
        }
        if let Some(too_broad) = too_broad_for_a_workspace(start) {
            return Err(Error::InvalidPath {
                path: start.to_path_buf(),
                reason: format!(
                    "is {too_broad}: {what} does not make it a workspace on its own (it would capture everything below it, and `integrate` run anywhere under it would write there); run rewind in a project directory, or `rewind init` here if you mean it"
                ),
            });
        }
        Ok(Workspace::init(start, self.progress())?.0)
    }

    /// The workspace at `root`: the one a long-lived caller kept, if it is
    /// still current, else opened.
    fn reuse_or_open(&self, root: &std::path::Path) -> Result<Workspace> {
        match self.warm.as_ref().and_then(|w| w.take(root)) {
            Some(ws) => {
                crate::workspace::check_confined(ws.root_path())?;
                // Said at every open; a kept workspace is not opened again.
                ws.warn_if_history_lost();
                Ok(ws)
            }
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
        if self.json {
            let mut v =
                serde_json::to_value(value).map_err(|e| Error::Usage(format!("internal: {e}")))?;
            if let serde_json::Value::Object(m) = &mut v {
                m.insert("version".into(), JSON_VERSION.into());
            }
            print_result(&v.to_string())?;
        } else if !self.quiet {
            let text = human();
            if !text.is_empty() {
                print_result(text.trim_end())?;
            }
        }
        Ok(())
    }
}

/// Write a command's result and a newline to stdout, and flush. A reader
/// that left (EPIPE: `rewind list | head -1`) has what it wanted: no
/// failure. Any other failure is the command's (D350): its output is its
/// result, and `rewind diff --patch > x.patch` on a full disk left a cut
/// patch with exit 0, taken for the whole.
pub(crate) fn print_result(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Os(rewind_platform::Error::new(
                "the command finished, but its output could not be written to",
                "stdout",
                e,
            )))
        }
        _ => Ok(()),
    }
}

/// What a SIGBUS says (D97): a store into SQLite's mapped `-shm` that the
/// filesystem could not back, which on btrfs means it is full.
const SIGBUS_HUMAN: &[u8] = b"rewind: error: a write through a memory-mapped file failed (SIGBUS): the filesystem holding the workspace is most likely full; free some space (`rewind gc` prunes old checkpoints), then retry; nothing was lost (the ledger is crash-safe)\n";
const SIGBUS_JSON: &[u8] = b"{\"version\":1,\"error\":{\"code\":\"NO_SPACE\",\"message\":\"a write through a memory-mapped file failed (SIGBUS): the filesystem holding the workspace is most likely full; free some space, then retry; nothing was lost\"}}\n";

/// Entry point: parse, run (here or in the mount's command server), print,
/// and map errors to exit codes.
pub fn main() -> i32 {
    rewind_platform::return_big_frees_to_the_system();
    rewind_platform::report_sigbus(SIGBUS_HUMAN, SIGBUS_JSON);
    rewind_platform::fail_writes_past_the_size_limit();
    rewind_platform::raise_fd_limit();
    if let Some(root) = std::env::var_os(crate::workspace::CONFINE_VAR) {
        crate::workspace::confine(Some(root.into()));
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json = args.iter().any(|a| a == "--json");
    rewind_platform::sigbus_json(json);
    let scanned = scan_command_line(&args);
    let cwd = match std::env::current_dir() {
        Ok(c) => c,
        // Relative to a directory that is gone, every path would fail
        // with a bare ENOENT or ENOTCONN naming ".".
        Err(e) => match scanned {
            // A hook's payload names where the call runs (its `cwd`); the
            // directory the agent started the hook in may be gone (its
            // shell removed it) and the barrier must still find the
            // workspace's rules, not fail open with exit 1.
            // So must `guard`, the same barrier for scripts (helper-59).
            Some((verb, None)) if verb == "hook" || verb == "guard" => std::env::var_os("PWD")
                .map(|p| nearest_existing(Path::new(&p)))
                .unwrap_or_else(|| PathBuf::from("/")),
            Some((verb, dir))
                if verb != "help"
                    && !dir.is_some_and(|d| std::path::Path::new(d).is_absolute()) =>
            {
                return cwd_gone(&e, json);
            }
            _ => PathBuf::from("/"),
        },
    };
    if let Some((verb, dir)) = scanned {
        let start = dir.map_or_else(|| cwd.clone(), |d| cwd.join(d));
        if let Some(code) = serve::forward(&start, &cwd, verb, args.clone()) {
            rewind_platform::die_of_deferred_signal();
            return code;
        }
    }
    // Not `std::env::args()`: it panics on an argument that is not UTF-8.
    match Cli::try_parse_from(args) {
        Ok(cli) => {
            let code = run(cli, cwd, None);
            // A Ctrl-C a rewind let wait for its last change (D353).
            rewind_platform::die_of_deferred_signal();
            code
        }
        Err(e) => usage_error(e, json),
    }
}

/// A command handed over by a client of the command server (D93).
/// `parser`: the CLI's definition, built once per server. `confine`: the
/// workspace of root's mount whose owner sent it (D151).
fn run_forwarded(
    args: Vec<std::ffi::OsString>,
    cwd: PathBuf,
    warm: &WarmSlot,
    parser: &mut clap::Command,
    confine: Option<&Path>,
) -> i32 {
    use clap::FromArgMatches;
    crate::workspace::new_command();
    let json = args.iter().any(|a| a == "--json");
    rewind_platform::sigbus_json(json);
    match parser
        .try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => match confine {
            None => run(cli, cwd, Some(warm.clone())),
            Some(root) => run_for_owner(cli, cwd, warm, root),
        },
        Err(e) => usage_error(e, json),
    }
}

/// The command of the owner of the workspace `root`, in root's command
/// server (D151): only in that workspace, and nothing that would read
/// or write elsewhere, or make a setuid file, as root.
fn run_for_owner(cli: Cli, cwd: PathBuf, warm: &WarmSlot, root: &Path) -> i32 {
    if let Some((what, fix)) = root_only(&cli.command) {
        let e = Error::RootOnly {
            path: root.to_path_buf(),
            what: what.into(),
            fix: fix.into(),
        };
        report(cli.json, &e);
        return e.exit_code();
    }
    crate::workspace::confine(Some(root.to_path_buf()));
    let code = run(cli, cwd, Some(warm.clone()));
    crate::workspace::confine(None);
    code
}

/// What root's command server does not do for a workspace's owner
/// (D151), and what to do instead; `None`: it does this.
fn root_only(command: &Command) -> Option<(&'static str, &'static str)> {
    const SETUID: (&str, &str) = (
        "restoring setuid and setgid bits (`--allow-setuid`) as root could make a setuid file of root's",
        "leave the flag out (the bits are dropped and listed), or run it with sudo",
    );
    match command {
        Command::Checkpoint(_)
        | Command::List(_)
        | Command::Status(_)
        | Command::Diff(_)
        | Command::Guard(_)
        | Command::Effects(_)
        | Command::Hook(_)
        | Command::Du
        | Command::Gc(_) => None,
        Command::Rewind(rewind::Args { common, .. })
        | Command::Replay(rewind::Args { common, .. })
        | Command::Undo(rewind::UndoArgs { common })
        | Command::Restore(rewind::RestoreArgs { common, .. }) => {
            common.allow_setuid.then_some(SETUID)
        }
        Command::Anchor(a) => a.writes_file().then_some((
            "`anchor FILE` would write FILE as root",
            "`rewind anchor > FILE` writes it as you; or run it with sudo",
        )),
        Command::Verify(a) => a.anchor.is_some().then_some((
            "`verify --anchor FILE` would read FILE as root",
            "run it with sudo",
        )),
        _ => Some(("this verb runs as root", "run it with sudo")),
    }
}

fn usage_error(e: clap::Error, json: bool) -> i32 {
    // Usage errors exit 1 (2 means "refused by the effect barrier").
    let code = if e.use_stderr() { 1 } else { 0 };
    if !json {
        print_usage_error(&e, code);
        return code;
    }
    let rendered = e.render().to_string();
    if code == 0 {
        // `--help` and `--version`: text, but stdout under `--json` holds
        // one JSON object whatever was asked (helper-59, D294).
        let text = serde_json::json!({"version": 1, "text": rendered.trim_end()});
        rewind_platform::stdout_line!("{text}");
        return 0;
    }
    // clap's first paragraph names the argument at fault (a missing one
    // on the line after "the following required arguments were not
    // provided:"); its kind alone ("unexpected argument found") does
    // not. Its `tip:` lines name the fix (a similar verb).
    let mut paragraphs = rendered.split("\n\n");
    let first = paragraphs.next().unwrap_or_default();
    let tips = paragraphs
        .flat_map(str::lines)
        .map(str::trim)
        .filter(|l| l.starts_with("tip:"));
    let message = first
        .lines()
        .map(str::trim)
        .chain(tips)
        .collect::<Vec<_>>()
        .join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    let message = without_hidden_verbs(message);
    rewind_platform::stdout_line!("{}", json_error("USAGE", &message));
    print_usage_error(&e, code);
    code
}

/// clap's own rendering, styled as it would print it, on its stream;
/// an error's list of verbs without the internal ones.
fn print_usage_error(e: &clap::Error, code: i32) {
    if code == 0 {
        let _ = e.print();
        return;
    }
    let rendered = e.render();
    let text = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        rendered.ansi().to_string()
    } else {
        rendered.to_string()
    };
    let _ = write!(std::io::stderr(), "{}", without_hidden_verbs(&text));
}

/// clap's "[subcommands: …]" list names every verb, the internal ones
/// too (`serve-commands`, `writeback`, `finish-manifests`), which no one
/// types; its help leaves them out, and so does this.
fn without_hidden_verbs(message: &str) -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
    let hidden: Vec<&str> = cli
        .get_subcommands()
        .filter(|c| c.is_hide_set())
        .map(clap::Command::get_name)
        .collect();
    let mut out = message.to_string();
    for name in hidden {
        for form in [format!(", {name}"), format!("{name}, ")] {
            out = out.replace(&form, "");
        }
    }
    out
}

fn run(cli: Cli, cwd: PathBuf, warm: Option<WarmSlot>) -> i32 {
    let _t = crate::trace::span("total");
    let ctx = Ctx {
        dir: cli.dir,
        json: cli.json,
        quiet: cli.quiet,
        cwd,
        observer: None,
        warm,
    };
    let result = match cli.command {
        Command::Init(a) => init::run(&ctx, a),
        Command::Checkpoint(a) => checkpoint::run(&ctx, a),
        Command::List(a) => list::run(&ctx, &a),
        Command::Status(a) => status::run(&ctx, a),
        Command::Diff(a) => diff::run(&ctx, a),
        Command::Rewind(a) => rewind::run(&ctx, crate::rewind::Op::Rewind, a),
        Command::Replay(a) => rewind::run(&ctx, crate::rewind::Op::Replay, a),
        Command::Undo(a) => rewind::undo(&ctx, a),
        Command::Restore(a) => rewind::restore(&ctx, a),
        Command::Doctor => return doctor::run(&ctx),
        Command::Anchor(a) => anchor::run(&ctx, a),
        Command::Verify(a) => return verify::run(&ctx, a),
        Command::Guard(a) => return guard::run(&ctx, a),
        Command::Effects(a) => effects::run(&ctx, a),
        Command::Gc(a) => gc::run(&ctx, a),
        Command::Deinit(a) => deinit::run(&ctx, a),
        Command::Du => du::run(&ctx),
        Command::Mcp(a) => mcp::run(&ctx, a),
        Command::Hook(a) => return hook::run(&ctx, a),
        Command::Integrate(a) => integrate::run(&ctx, a),
        Command::FinishManifests => finish::run(&ctx),
        Command::Writeback => writeback::run(&ctx),
        Command::Mount(a) => mount::run(&ctx, a),
        Command::Unmount(a) => mount::unmount(&ctx, a),
        Command::ServeCommands(a) => serve::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let e = crate::mount::explain_dead_view(e);
            report_error(&ctx, &e);
            e.exit_code()
        }
    }
}

/// The current directory cannot be reached: say where the shell thinks
/// it is (`$PWD`) and that a `cd` there gets the live directory back.
fn cwd_gone(e: &std::io::Error, json: bool) -> i32 {
    let pwd = std::env::var_os("PWD").map(PathBuf::from);
    // A directory a rewind removed is not there to `cd` into: name the
    // nearest one that is (the same path again if an undo made it anew).
    let fix = match pwd.as_deref().map(nearest_existing) {
        Some(p) => format!(
            "`cd {}` and retry (or name the workspace with -C)",
            p.display()
        ),
        None => "`cd` back into the workspace and retry".to_string(),
    };
    let err = Error::InvalidPath {
        path: pwd.unwrap_or_else(|| PathBuf::from(".")),
        reason: format!(
            "this shell's working directory cannot be reached ({e}): it was deleted, or the mount it was on went away (a `rewind mount` whose daemon died); {fix}"
        ),
    };
    report(json, &err);
    1
}

/// The rewind mount `path` is in, when its daemon is not this user's to
/// reach (its `.rewind/` is hidden, so no workspace is found there).
pub(crate) fn mounted_by_another_user(path: &std::path::Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|a| rewind_fuse::is_rewind_mount(a))
        .filter(|a| !rewind_fuse::socket_path(a).exists())
        .map(std::path::Path::to_path_buf)
}

/// Whether root's mount at `mp` opened its door for this user (D151).
fn door_is_mine(mp: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    !rewind_platform::is_root()
        && std::fs::metadata(rewind_fuse::door_path(mp))
            .is_ok_and(|m| m.uid() == rewind_platform::euid())
}

/// Whether `dir` is the home directory, `/`, or a shared scratch
/// directory like `/tmp`, which only an explicit `rewind init` makes a
/// workspace, and then what it is.
pub(crate) fn too_broad_for_a_workspace(dir: &std::path::Path) -> Option<&'static str> {
    use std::os::unix::fs::PermissionsExt;
    let canonical = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    let here = canonical(dir)?;
    if here == std::path::Path::new("/") {
        return Some("the filesystem root");
    }
    // Sticky and world-writable: every user's scratch files (D162). A
    // checkpoint run there by mistake captured all of /tmp (6.9 GiB).
    if std::fs::metadata(&here).is_ok_and(|m| m.permissions().mode() & 0o1002 == 0o1002) {
        return Some("a directory every user writes into (sticky and world-writable, like /tmp)");
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    (canonical(std::path::Path::new(&home)) == Some(here)).then_some("your home directory")
}

/// The error for a `-C` (or `init DIR`) that names no directory: every
/// verb says the same, where `checkpoint` and `init` gave a bare OS
/// error (helper-31, D218).
pub(crate) fn not_a_directory(path: PathBuf) -> Error {
    let reason = match std::fs::metadata(&path) {
        Ok(_) => "is not a directory: name the workspace's directory (-C DIR)",
        // Not "does not exist" for a directory above it this user may not
        // enter (helper-79).
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            "cannot be reached by this user (a directory on the way denies it: `ls -ld` each one shows whose it is): run rewind as a user who may enter it"
        }
        Err(_) => {
            "does not exist: name the workspace's directory (-C DIR) or run from inside it (`mkdir` it first for a new workspace)"
        }
    };
    Error::InvalidPath {
        path,
        reason: reason.into(),
    }
}

/// `path` itself if it exists, else its nearest ancestor that does.
pub(crate) fn nearest_existing(path: &std::path::Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.is_dir())
        .unwrap_or(std::path::Path::new("/"))
        .to_path_buf()
}

pub fn report_error(ctx: &Ctx, e: &Error) {
    report(ctx.json, e)
}

/// One line on stderr; with `--json`, also the error object on stdout.
fn report(json: bool, e: &Error) {
    let message = one_line(&crate::names::as_people_know_it(&e.to_string()));
    if json {
        let mut v = json_error(e.code(), &message);
        if let Some(cause) = e.cause_code() {
            v["error"]["cause"] = cause.into();
        }
        rewind_platform::stdout_line!("{v}");
    }
    rewind_platform::stderr_line!("rewind: error: {message}");
}

/// `message` as the one line the contract promises (helper-31, D218):
/// a newline is written `\n`. Not joined with "; ": a newline inside a
/// path in the message (a name an agent chose) then read as the end of
/// a pasted command (helper-32, D223).
fn one_line(message: &str) -> String {
    message.replace('\n', "\\n")
}

/// The `--json` error object: `{"version", "error": {"code", "message"}}`.
pub(crate) fn json_error(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"version": JSON_VERSION, "error": {"code": code, "message": message}})
}

pub use crate::names::{human_name, human_path};
pub use crate::progress::human_bytes;

/// Temp file beside the target, fsync, rename: a crash leaves the old file
/// or the new one, never half of one.
pub(crate) fn write_atomically(path: &Path, text: &str, create_parents: bool) -> Result<()> {
    use std::io::Write;
    let os = |op: &'static str, p: &Path, e: std::io::Error| {
        Error::os(rewind_platform::Error::new(op, p, e))
    };
    // A config kept as a symlink (dotfiles) is written where it points:
    // renaming over the link replaced it with a plain file.
    let resolved;
    let path = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            resolved = std::fs::canonicalize(path).map_err(|e| os("resolve symlink", path, e))?;
            resolved.as_path()
        }
        _ => path,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if create_parents {
        std::fs::create_dir_all(dir).map_err(|e| os("create directory", dir, e))?;
    } else if !dir.is_dir() {
        return Err(Error::InvalidPath {
            path: dir.to_path_buf(),
            reason: "is not a directory: create it first, or name a file in an existing one; nothing was written".into(),
        });
    }
    let tmp = dir.join(format!(
        ".{}.rewind-tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let mut f = std::fs::File::create(&tmp).map_err(|e| os("create", &tmp, e))?;
    // Whatever fails from here leaves no temp file beside the user's.
    let written = f
        .write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| os("write", &tmp, e))
        .and_then(|()| {
            // Keep the user's permissions on an existing file.
            if let Ok(meta) = std::fs::metadata(path) {
                let _ = std::fs::set_permissions(&tmp, meta.permissions());
            }
            std::fs::rename(&tmp, path).map_err(|e| os("rename", path, e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_with_a_newline_is_one_quoted_line() {
        assert_eq!(super::human_path("src/a.rs"), "src/a.rs");
        assert_eq!(super::human_path("nl\nx"), "\"nl\\nx\"");
        assert_eq!(super::human_path("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\x01\"");
        assert_eq!(super::human_path("café"), "café");
        // Not UTF-8: exact from path_hex, one escape per byte.
        assert_eq!(super::human_name("a\u{fffd}", Some("61ff")), "\"a\\xff\"");
        assert_eq!(super::human_name("a\u{fffd}", Some("61fe")), "\"a\\xfe\"");
        assert_eq!(
            super::human_name("caf\u{e9}\n", Some("636166c3a90a")),
            "\"café\\n\""
        );
        assert_eq!(super::human_name("plain", None), "plain");
    }

    use super::*;

    fn scan(line: &[&str]) -> Option<(String, Option<String>)> {
        let args: Vec<std::ffi::OsString> = line.iter().map(Into::into).collect();
        scan_command_line(&args).map(|(v, d)| {
            (
                v.to_string_lossy().into_owned(),
                d.map(|d| d.to_string_lossy().into_owned()),
            )
        })
    }

    #[test]
    fn the_command_line_scan_finds_the_verb_and_dir_clap_would() {
        let some = |v: &str, d: Option<&str>| Some((v.to_string(), d.map(String::from)));
        assert_eq!(
            scan(&["rewind", "checkpoint", "x"]),
            some("checkpoint", None)
        );
        assert_eq!(
            scan(&["rewind", "-C", "w", "--json", "to", "a"]),
            some("to", Some("w"))
        );
        assert_eq!(scan(&["rewind", "-Cw", "list"]), some("list", Some("w")));
        assert_eq!(scan(&["rewind", "-C=w", "list"]), some("list", Some("w")));
        assert_eq!(
            scan(&["rewind", "checkpoint", "-q", "-C", "w", "--kind", "hook"]),
            some("checkpoint", Some("w"))
        );
        // After `--` nothing is an option; unknown flags before the verb
        // are clap's to judge; no verb, no server.
        assert_eq!(
            scan(&["rewind", "restore", "a", "--", "-C", "x"]),
            some("restore", None)
        );
        assert_eq!(scan(&["rewind", "--version"]), None);
        assert_eq!(scan(&["rewind", "-C"]), None);
        assert_eq!(scan(&["rewind"]), None);
    }

    #[test]
    fn every_server_verb_is_a_verb_or_alias() {
        let cli = <Cli as clap::CommandFactory>::command();
        for v in SERVER_VERBS {
            assert!(cli.find_subcommand(v).is_some(), "{v}");
        }
    }
}
