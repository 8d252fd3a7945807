use std::path::Path;

use serde::Serialize;

use super::Ctx;
use crate::error::{Error, Result};
use crate::mount::MountLink;
use crate::warm::Held;
use crate::workspace::Workspace;

#[derive(Serialize)]
struct Out {
    workspace: String,
    fs: String,
    /// Mounted read-only: only the reading verbs run (D119).
    read_only: bool,
    reflink: bool,
    reflink_why: String,
    engine: &'static str,
    engine_why: String,
    /// The workspace root is a btrfs subvolume (`init --subvolume` makes one).
    subvolume: bool,
    /// btrfs engine: whether `gc` can delete snapshots here (root, or the
    /// `user_subvol_rm_allowed` mount option).
    #[serde(skip_serializing_if = "Option::is_none")]
    snapshot_delete: Option<bool>,
    /// btrfs engine: whether `hook post-tool-use` starts a background
    /// writeback (D72) and `rewind mcp` writes back once a second (D75);
    /// `REWIND_WRITEBACK=0` turns both off.
    #[serde(skip_serializing_if = "Option::is_none")]
    hook_writeback: Option<bool>,
    openat2: bool,
    /// `.rewind/` holds a `.gitignore` of everything (D80).
    git_ignored: bool,
    fuse: Fuse,
    durability: Durability,
    ledger: Ledger,
    /// An `init --subvolume` stopped half-way left its temporary name
    /// beside the workspace (D352).
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupted_conversion: Option<String>,
    /// The rewind each agent's settings run (`integrate` writes them): a
    /// hook left on an earlier build after an upgrade is refused by the
    /// history, and lets every call through unchecked (D334).
    agents: Vec<AgentProgram>,
}

#[derive(Serialize)]
struct AgentProgram {
    /// The config file, relative to the workspace root.
    file: String,
    /// The program its hooks or MCP server run, as written.
    program: String,
    /// That program is this binary (`null`: it names nothing here).
    this_build: Option<bool>,
}

/// What a rewind must make durable besides what it writes (D85).
#[derive(Serialize)]
struct Durability {
    /// The ledger holds a durability mark that still holds (same boot, no
    /// clock step).
    mark: bool,
    /// Entries changed since the mark (`null`: too many to fsync one by
    /// one, or no mark).
    unsynced: Option<usize>,
    /// The ledger knows which files were on disk after the last `syncfs`
    /// (`.rewind/` included): a checkpoint then fsyncs only the chunk
    /// files it may need to (D90).
    store_mark: bool,
    /// Page cache dirty or under writeback machine-wide: what a `syncfs`
    /// may wait for.
    dirty_bytes: Option<u64>,
    note: String,
}

#[derive(Serialize)]
struct Fuse {
    dev_fuse: bool,
    fusermount3: bool,
    /// Served by a `rewind mount` daemon right now.
    mounted: bool,
    /// Where it is mounted: the workspace itself, or a view (D98: one
    /// mount per workspace).
    #[serde(skip_serializing_if = "Option::is_none")]
    mount_point: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_pid: Option<u32>,
    /// The daemon answered its control socket within
    /// `rewind_fuse::ANSWER_TIMEOUT` (false: stopped or hung).
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_answers: Option<bool>,
    /// The command server kept beside the daemon (D93), if it listens.
    #[serde(skip_serializing_if = "Option::is_none")]
    command_server_pid: Option<u32>,
    /// Kernel passthrough of opened files (needs CAP_SYS_ADMIN): reads and
    /// writes at native speed instead of through the daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    passthrough: Option<bool>,
    /// Directories the next checkpoint looks at ("all": it walks
    /// everything, as after a fresh mount or new ignore rules).
    #[serde(skip_serializing_if = "Option::is_none")]
    dirty_dirs: Option<serde_json::Value>,
    /// File descriptors the daemon holds and may hold: past 5/8 of the
    /// limit its inodes give theirs back and are reopened by name (D65).
    #[serde(skip_serializing_if = "Option::is_none")]
    fds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fd_limit: Option<u64>,
    note: String,
}

#[derive(Serialize)]
struct Ledger {
    path: String,
    integrity: String,
    checkpoints: i64,
    tree_nodes: i64,
    pending_rewind: bool,
    /// btrfs checkpoints acknowledged whose manifest is not built yet.
    pending_manifests: usize,
    /// Read-only snapshots under .rewind/state/snapshots (btrfs engine).
    snapshots: usize,
    /// What the ledger lost against the anchor rewind keeps (D313).
    #[serde(skip_serializing_if = "Option::is_none")]
    lost: Option<String>,
    /// Where that anchor is kept, or why none is (D351).
    anchor: String,
}

/// Exit 0 when the ledger passes SQLite's integrity check, 1 when it is
/// damaged (the report still printed: the rest of it helps), as `verify`
/// exits 1 on a damaged history (helper-28, D193).
pub fn run(ctx: &Ctx) -> i32 {
    let failed = match report(ctx) {
        Ok(true) => return 0,
        Ok(false) => return 1,
        // A damaged page past the first opens, and fails the first read
        // of it: `doctor` answered with the error that sent the user to
        // it (helper-62, D304). Its report says the ways out.
        Err(Error::LedgerCorrupt { path, detail }) => unopenable(ctx, &path, &detail).map(|()| 1),
        Err(e) => Err(e),
    };
    failed.unwrap_or_else(|e| {
        super::report_error(ctx, &e);
        e.exit_code()
    })
}

fn report(ctx: &Ctx) -> Result<bool> {
    // A daemon that does not answer is reported, not waited for: the
    // workspace is opened beside it, through its backing tree.
    let mut silent = None;
    let ws = match ctx.workspace() {
        Ok(ws) => ws,
        Err(Error::Mount(e @ rewind_fuse::Error::Unresponsive { .. })) => {
            let rewind_fuse::Error::Unresponsive { path, pid, .. } = &e else {
                unreachable!()
            };
            let Some(access) = backing_of_silent(path, *pid) else {
                return Err(Error::Mount(e));
            };
            let ws = Workspace::open_beside_daemon(path.clone(), &access)?;
            silent = Some((path.clone(), *pid, e.to_string()));
            Held::new(ws, None)
        }
        // Before `init`: what this directory's filesystem can do.
        Err(Error::NotAWorkspace { path }) if path.is_dir() => {
            return before_init(ctx, &path).map(|()| true);
        }
        // The error every other command gives sends the user here: say
        // what is damaged and the ways out, instead of the same error.
        Err(Error::LedgerCorrupt { path, detail }) => {
            return unopenable(ctx, &path, &detail).map(|()| false);
        }
        // Missing, the same: it printed the error that sent the user
        // here and nothing else (helper-31, D218).
        Err(Error::LedgerMissing { path }) => {
            return unopenable(ctx, &path, "the file is missing").map(|()| false);
        }
        Err(e) => return Err(e),
    };
    let fs = ws.fs();
    let reflink = ws.clones();
    let reflink_why = clone_note(fs.kind, reflink);
    let subvolume = ws.is_subvolume();
    let (engine, why) = ws.engine();
    let engine_why = format!("{}: {why}", engine.as_str());
    let openat2 = rewind_platform::Dir::open(ws.io_path()).is_ok_and(|d| d.openat2_available());
    // The mount serving this workspace: through which it was opened, or
    // a view of it mounted elsewhere (its claim names it, D98). Opened in
    // the workspace directory, a command goes through its view (D141):
    // `ws.mount()` is then the view's.
    let elsewhere = match (ws.mount(), &silent) {
        (Some(m), _) if m.mount_point() != ws.root_path() => Some(m.mount_point().to_path_buf()),
        (None, None) => rewind_fuse::holder(ws.io_path()).map(|h| h.mountpoint),
        _ => None,
    };
    let link = match &elsewhere {
        Some(_) if ws.mount().is_some() => None,
        Some(mp) => match MountLink::connect(mp) {
            Ok(l) => l,
            Err(Error::Mount(e @ rewind_fuse::Error::Unresponsive { .. })) => {
                if let rewind_fuse::Error::Unresponsive { path, pid, .. } = &e {
                    silent = Some((path.clone(), *pid, e.to_string()));
                }
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let status = match link
        .as_ref()
        .or(ws.mount())
        .map(|m| (m.status(), m.daemon_pid()))
    {
        Some((Ok(s), _)) => Some(s),
        Some((Err(Error::Mount(e @ rewind_fuse::Error::Unresponsive { .. })), pid)) => {
            let mp = elsewhere
                .clone()
                .unwrap_or_else(|| ws.root_path().to_path_buf());
            silent = Some((mp, pid, e.to_string()));
            None
        }
        Some((Err(e), _)) => return Err(e),
        None => None,
    };
    let mount_point = match (&silent, &status) {
        (Some((mp, ..)), _) => Some(mp.clone()),
        (None, Some(_)) => Some(
            elsewhere
                .clone()
                .unwrap_or_else(|| ws.root_path().to_path_buf()),
        ),
        (None, None) => None,
    };
    let fuse_note = match (&status, &silent) {
        (_, Some((_, _, e))) => format!("mounted, but the daemon does not answer: {e}"),
        (Some(s), None) if elsewhere.is_some() => format!(
            "mounted at {} (daemon pid {}), a view: commands run there use its dirty set, and those run here go through it too: a rewind freezes it",
            mount_point
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            s.pid
        ),
        (s, None) => match s {
            Some(s) if s.passthrough => format!(
                "mounted (daemon pid {}): opened files use kernel passthrough ({} opens; {} small files read through the page cache; {} served by the daemon)",
                s.pid, s.passthrough_opens, s.cached_opens, s.plain_opens
            ),
            Some(s) => format!(
                "mounted (daemon pid {}): no kernel passthrough (it needs root and Linux 6.9+), so file reads and writes go through the daemon",
                s.pid
            ),
            None if rewind_platform::is_root() => {
                "not mounted: `rewind mount DIR` serves the workspace through the overlay".into()
            }
            // A user cannot mount over the workspace itself.
            None => "not mounted: `rewind mount DIR --at VIEW` serves a view of the workspace through the overlay".into(),
        },
    };
    let fuse_note = match status.as_ref().map(|s| s.dirty) {
        Some(Some(n)) => format!(
            "{fuse_note}; the next checkpoint looks at {n} changed director{}",
            if n == 1 { "y" } else { "ies" }
        ),
        Some(None) => format!("{fuse_note}; the next checkpoint walks everything once"),
        None => fuse_note,
    };
    let server = status
        .as_ref()
        .and(mount_point.as_deref())
        .and_then(super::serve::server_pid);
    let fuse_note = match (&status, server) {
        (Some(_), Some(pid)) => format!(
            "{fuse_note}; commands run in its command server (pid {pid}), with the workspace kept open"
        ),
        (Some(_), None) => format!(
            "{fuse_note}; its command server is not running (it is restarted when it dies): commands run in their own process"
        ),
        (None, _) => fuse_note,
    };
    let fuse_note = match &status {
        Some(s) if s.fds > s.fd_limit / 4 * 3 => format!(
            "{fuse_note}; the daemon holds {} of its {} file descriptors: remount after raising the hard limit (`ulimit -Hn`, or run it as root)",
            s.fds, s.fd_limit
        ),
        _ => fuse_note,
    };
    let durability = durability(&ws, engine)?;
    // Read beside the mount, not through it: its daemon may be stopped
    // (D99), and a read through it would wait for ever.
    let agents = super::integrate::configured_programs(ws.io_path())
        .into_iter()
        .map(|(file, program)| AgentProgram {
            this_build: super::integrate::runs_this_build(&program),
            file,
            program,
        })
        .collect();
    let out = Out {
        agents,
        workspace: ws.root_path().display().to_string(),
        interrupted_conversion: crate::subvol::interrupted_conversion(ws.root_path()),
        fs: fs.kind.to_string(),
        read_only: fs.read_only,
        reflink,
        reflink_why,
        engine: engine.as_str(),
        engine_why,
        snapshot_delete: (engine == crate::snapshot::Engine::Btrfs)
            .then(|| rewind_platform::can_delete_snapshots(ws.root_path())),
        hook_writeback: (engine == crate::snapshot::Engine::Btrfs)
            .then(crate::snapshot::writeback_enabled),
        subvolume,
        openat2,
        git_ignored: ws.git_ignored(),
        fuse: Fuse {
            dev_fuse: Path::new("/dev/fuse").exists(),
            fusermount3: rewind_fuse::fusermount3().is_some(),
            mounted: mount_point.is_some(),
            mount_point: mount_point.as_ref().map(|p| p.display().to_string()),
            daemon_pid: status
                .as_ref()
                .map(|s| s.pid)
                .or(silent.as_ref().map(|s| s.1).filter(|&p| p != 0)),
            daemon_answers: mount_point.is_some().then_some(silent.is_none()),
            command_server_pid: server,
            passthrough: status.as_ref().map(|s| s.passthrough),
            dirty_dirs: status.as_ref().map(|s| match s.dirty {
                Some(n) => n.into(),
                None => "all".into(),
            }),
            fds: status.as_ref().map(|s| s.fds),
            fd_limit: status.as_ref().map(|s| s.fd_limit),
            note: fuse_note,
        },
        durability,
        ledger: Ledger {
            path: ws.ledger().path().display().to_string(),
            // 93 s for a 3.5 GB ledger (helper-89): said, not silent.
            integrity: ws.saying("checking the ledger", || ws.ledger().integrity_check())?,
            checkpoints: ws.ledger().count("checkpoints")?,
            tree_nodes: ws.ledger().count("trees")?,
            pending_rewind: ws.ledger().intent()?.is_some(),
            pending_manifests: ws.ledger().pending()?.len(),
            lost: ws.ledger().lost_to_kept_anchor(),
            anchor: ws.ledger().kept_anchor_described(),
            snapshots: crate::snapshot::names(&ws)?.len(),
        },
    };
    let engine_line = format!(
        "{}{}",
        match out.snapshot_delete {
            Some(false) => format!(
                "{}; gc cannot delete snapshots here: mount with `user_subvol_rm_allowed` or run `rewind gc` as root",
                out.engine_why
            ),
            _ => out.engine_why.clone(),
        },
        match out.hook_writeback {
            Some(true) => "; `hook post-tool-use` and `rewind mcp` write back in the background",
            Some(false) => "; background writeback off (REWIND_WRITEBACK=0)",
            None => "",
        }
    );
    ctx.emit(&out, || {
        format!(
            "workspace   {}\nfilesystem  {}\nclones      {} ({})\nengine      {}\nopenat2     {}\ngit         {}\nFUSE        /dev/fuse {}, fusermount3 {} ({})\ndurability  {}\nledger      {}: integrity {}, {}, {}, {}{}{}\nanchor      {}",
            out.workspace,
            if out.read_only {
                format!("{} (mounted read-only: list, status, diff, du and verify work; nothing can be checkpointed or rewound until it is remounted read-write)", out.fs)
            } else {
                out.fs.clone()
            },
            if out.reflink { "yes" } else { "no" },
            out.reflink_why,
            engine_line,
            if out.openat2 { "yes (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)" } else { "no (component-wise O_NOFOLLOW fallback)" },
            if out.git_ignored {
                "ignores .rewind/: `add -A`, `stash -u` and `clean -fd` leave the history alone (`clean -x` would delete it; `rewind mount` hides it)"
            } else {
                "does not ignore .rewind/ (its .gitignore could not be written): `git clean -fd` would delete the history"
            },
            dev_fuse_note(out.fuse.dev_fuse, rewind_fuse::dev_fuse_usable()),
            if out.fuse.fusermount3 {
                "found"
            } else {
                "missing (a mount without root goes through it: `sudo apt-get install fuse3`)"
            },
            out.fuse.note,
            out.durability.note,
            out.ledger.path,
            out.ledger.integrity,
            crate::names::counted(out.ledger.checkpoints as u64, "checkpoint"),
            crate::names::counted(out.ledger.tree_nodes as u64, "tree node"),
            crate::names::counted(out.ledger.snapshots as u64, "snapshot"),
            if out.ledger.pending_manifests > 0 { format!(", {} manifests being built", out.ledger.pending_manifests) } else { String::new() },
            if out.ledger.pending_rewind { ", an interrupted rewind is pending (any command finishes it)" } else { "" },
            out.ledger.anchor,
        ) + if out.ledger.integrity == "ok" { "" } else {
            "\nDAMAGED: the ledger fails SQLite's integrity check; copy .rewind/ aside before anything else writes to it, then `rewind verify --deep` lists what the damage reaches"
        } + &out.ledger.lost.as_ref().map_or(String::new(), |l| format!("\nLOST: {l}"))
            + &out.interrupted_conversion.as_ref().map_or(String::new(), |l| format!("\nLEFT OVER: {l}"))
            + &agents_lines(&out.agents)
    })?;
    Ok(out.ledger.integrity == "ok" && out.ledger.lost.is_none())
}

fn durability(
    ws: &crate::workspace::Workspace,
    engine: crate::snapshot::Engine,
) -> Result<Durability> {
    let state = crate::durable::State::load(ws.ledger())?;
    let unsynced = state.as_ref().and_then(|s| s.unsynced()).map(|u| u.len());
    let dirty_bytes = rewind_platform::dirty_bytes();
    let dirty = dirty_bytes.map_or("unknown".into(), |d| {
        format!("{:.1} MiB", d as f64 / 1048576.0)
    });
    let note = match (engine, &state, unsynced) {
        (crate::snapshot::Engine::Btrfs, _, _) => {
            "a rewind's safety snapshot commits the tree first, then it fsyncs what it writes (up to 16 entries, D68)".into()
        }
        (_, None, _) => format!(
            "no mark yet (first rewind, a new boot or a clock step): the next rewind calls `syncfs`, which waits for the filesystem's dirty pages ({dirty} dirty machine-wide), and sets one (D85)"
        ),
        (_, Some(_), None) => format!(
            "more than {} entries changed since the last sync: the next rewind calls `syncfs` ({dirty} dirty machine-wide)",
            crate::durable::MAX
        ),
        (_, Some(_), Some(n)) => format!(
            "{n} entr{} changed since the last sync; {dirty} dirty machine-wide: a rewind fsyncs {} with what it writes where that costs less than `syncfs` (D85)",
            if n == 1 { "y" } else { "ies" },
            if n == 1 { "it" } else { "them" }
        ),
    };
    Ok(Durability {
        mark: state.is_some(),
        unsynced,
        store_mark: state.as_ref().is_some_and(|s| s.store_below_ns().is_some()),
        dirty_bytes,
        note,
    })
}

/// One line per agent config: the rewind it runs, and whether that is
/// this build.
fn agents_lines(agents: &[AgentProgram]) -> String {
    agents
        .iter()
        .map(|a| {
            let program = crate::names::shell_word(&a.program);
            let verdict = match a.this_build {
                Some(true) => format!("this build ({})", crate::BUILD),
                Some(false) => format!(
                    "another build, not this one ({}): `{program} --version` prints which; `rewind integrate {}`, run with this binary, points the agent here",
                    crate::BUILD,
                    super::integrate::agent_of(&a.file)
                ),
                None => "which is not found here: the agent's calls run unchecked unless its PATH differs".to_string(),
            };
            format!("\nagent       {} runs {program}: {verdict}", a.file)
        })
        .collect()
}

/// What `doctor` says of /dev/fuse.
fn dev_fuse_note(present: bool, usable: bool) -> &'static str {
    match (present, usable) {
        (false, _) => "missing",
        (true, true) => "present",
        (true, false) => {
            "present but not usable by this user (`sudo chmod 0666 /dev/fuse`, or mount as root)"
        }
    }
}

fn clone_note(kind: rewind_platform::FsKind, reflink: bool) -> String {
    match (kind.may_clone(), reflink) {
        (_, true) => {
            format!("a test FICLONE on {kind} succeeded: checkpoints and rewinds share extents")
        }
        (true, false) => format!(
            "{kind} can clone, but a test FICLONE failed (XFS made without reflink=1?): files are copied"
        ),
        (false, false) => format!(
            "{kind} cannot share extents: files are copied (use XFS with reflink or btrfs for O(1) copies)"
        ),
    }
}

/// `doctor` in a directory that is no workspace yet: what its filesystem
/// can do and which engine `init` would give it, so the choice of where
/// to put a workspace is made before one exists.
/// A ledger SQLite cannot open (truncated, overwritten): what `doctor`
/// can still say. Every other command answers `LEDGER_CORRUPT`, whose
/// message names `doctor`; `doctor` answered the same error (helper-28,
/// D199). The workspace's files are not in the ledger, and are fine.
fn unopenable(ctx: &Ctx, ledger: &Path, detail: &str) -> Result<()> {
    #[derive(Serialize)]
    struct Unopenable {
        workspace: String,
        ledger: Ledger,
        damaged: String,
    }
    #[derive(Serialize)]
    struct Ledger {
        path: String,
        bytes: Option<u64>,
        opens: bool,
        integrity: String,
    }
    // `.rewind/`, also for a subvolume's ledger in `.rewind/state/`.
    let state = ledger
        .ancestors()
        .find(|a| a.file_name() == Some(std::ffi::OsStr::new(crate::capture::STATE_DIR)))
        .unwrap_or(ledger.parent().unwrap_or(ledger));
    let root = state.parent().unwrap_or(state);
    let missing = !ledger.exists();
    let name = |p: &Path| crate::names::human_os_path(p).into_owned();
    // Pasted into a shell: each path one word, whatever it holds.
    let word = |p: &Path| crate::names::shell_word(&p.to_string_lossy());
    // Beside the workspace, not in it: a copy inside was captured by the
    // next checkpoint, old objects and all (helper-74).
    let copy_aside = crate::names::with_suffix(root, ".rewind.copy");
    let out = Unopenable {
        workspace: name(root),
        ledger: Ledger {
            path: name(ledger),
            bytes: std::fs::metadata(ledger).ok().map(|m| m.len()),
            opens: false,
            integrity: detail.to_string(),
        },
        damaged: format!(
            "the ledger {}; the workspace's files are not in it and are untouched. Copy {state} aside first, out of the workspace (`cp -a {state} {copy}`), then: restore {ledger} from a backup{}; or start a new history from the tree as it is (`rewind -C {root} deinit --yes && rewind -C {root} init`: deinit deletes what is left of this one)",
            if missing {
                "is missing, so no checkpoint can be read or taken"
            } else {
                "cannot be read, so not every checkpoint can be read and none should be taken"
            },
            if missing {
                " (with its -wal beside it, if there was one)".to_string()
            } else {
                // From the copy: opened in place, sqlite3 may fold or
                // remove the WAL that still holds the history (helper-63).
                let copied = copy_aside.join(ledger.strip_prefix(state).unwrap_or(ledger));
                format!(
                    "; or salvage the rows SQLite can still read, from the copy (`sqlite3 {copied} .recover | sqlite3 ledger-recovered.db`), then put that file in its place and run `rewind verify --deep`",
                    copied = word(&copied)
                )
            },
            state = word(state),
            copy = word(&copy_aside),
            ledger = word(ledger),
            root = word(root),
        ),
    };
    ctx.emit(&out, || {
        format!(
            "workspace   {}\nledger      {} ({}): {} ({})\nDAMAGED: {}",
            out.workspace,
            out.ledger.path,
            out.ledger
                .bytes
                .map_or("size unknown".into(), crate::progress::human_bytes),
            if missing { "missing" } else { "cannot be read" },
            out.ledger.integrity,
            out.damaged
        )
    })
}

fn before_init(ctx: &Ctx, dir: &Path) -> Result<()> {
    #[derive(Serialize)]
    struct BeforeInit {
        workspace: Option<String>,
        directory: String,
        fs: String,
        reflink: bool,
        reflink_why: String,
        engine: &'static str,
        engine_why: String,
        dev_fuse: bool,
        dev_fuse_usable: bool,
        note: String,
    }
    let d = rewind_platform::Dir::open(dir).map_err(Error::os)?;
    let fs = rewind_platform::FsInfo::of(&d).map_err(Error::os)?;
    // The probe makes files here: in a directory this user cannot write,
    // its failure said nothing about the filesystem, yet the answer blamed
    // it (XFS "made without reflink=1?") and `init` was advised, which
    // then failed (helper-42, D258).
    let probe = rewind_platform::clone_support(&d);
    let writable = !probe.as_ref().is_err_and(|e| e.is_permission_denied());
    let reflink = probe.unwrap_or(false);
    let reflink_why = if writable {
        clone_note(fs.kind, reflink)
    } else {
        format!(
            "not tested: this user cannot create files here, so {kind} clones were not tried",
            kind = fs.kind
        )
    };
    let note = if writable {
        "not a workspace yet: `rewind init` (or the first `rewind checkpoint`) makes one here"
            .to_string()
    } else {
        format!(
            "not a workspace, and this user (uid {}) cannot write here, so `rewind init` would fail: use a directory you own, or fix its owner or mode (`ls -ld`)",
            rewind_platform::euid()
        )
    };
    let (engine, why) = crate::snapshot::Engine::choose(&d, &fs);
    let out = BeforeInit {
        workspace: None,
        directory: dir.display().to_string(),
        fs: fs.kind.to_string(),
        reflink,
        reflink_why,
        engine: engine.as_str(),
        engine_why: why.to_string(),
        dev_fuse: Path::new("/dev/fuse").exists(),
        dev_fuse_usable: rewind_fuse::dev_fuse_usable(),
        note,
    };
    ctx.emit(&out, || {
        format!(
            "directory   {} ({})\nfilesystem  {}\nclones      {} ({})\nengine      {}: {}\nFUSE        /dev/fuse {}",
            out.directory,
            out.note,
            out.fs,
            if out.reflink { "yes" } else { "no" },
            out.reflink_why,
            out.engine,
            out.engine_why,
            dev_fuse_note(out.dev_fuse, out.dev_fuse_usable)
        )
    })
}

/// A path to the backing tree of the mount at `mp` whose daemon `pid`
/// does not answer, found without it: the private bind mount of a mount
/// over the workspace itself, or the workspace a view's daemon holds the
/// claim of (`/proc/PID/fd`). Never a path through the mount, which would
/// wait for the daemon.
fn backing_of_silent(mp: &Path, pid: u32) -> Option<std::path::PathBuf> {
    match rewind_fuse::claimed_workspace(pid) {
        Some(ws) if ws != mp => Some(ws),
        _ => {
            let b = rewind_fuse::backing_path(mp);
            b.join(crate::capture::STATE_DIR).is_dir().then_some(b)
        }
    }
}
