//! `rewind mount DIR` and `rewind unmount DIR`: serve a workspace through
//! the FUSE overlay (DESIGN §6). By default `mount` starts the daemon in
//! the background and returns once the mount answers; `--foreground` runs
//! it in this process (the background daemon is this, detached).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Ctx;
use crate::capture::STATE_DIR;
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::mount::MountLink;
use crate::workspace::Workspace;
use rewind_platform::Heir;

/// The daemon's log, in the backing `.rewind/`.
const LOG_FILE: &str = "mount.log";
/// How long `mount` waits for the daemon to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The workspace directory to mount over (default: the current workspace)
    // Its own id: named `dir` like the global -C, it made clap refuse
    // `-C` after this verb (helper-31, D224).
    #[arg(id = "directory", value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Mount a view of the workspace here instead of over it (needed as a non-root user); made if missing, in a directory that exists
    #[arg(long, value_name = "VIEW")]
    at: Option<PathBuf>,
    /// Run the daemon in this process until unmounted
    #[arg(long)]
    foreground: bool,
    /// Serve opened files through the daemon even where kernel passthrough works
    #[arg(long)]
    no_passthrough: bool,
}

#[derive(clap::Args, Debug)]
pub struct UnmountArgs {
    /// The mounted workspace directory (default: the current workspace)
    // Its own id: named `dir` like the global -C, it made clap refuse
    // `-C` after this verb (helper-31, D224).
    #[arg(id = "directory", value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Serialize)]
struct Mounted {
    mounted: String,
    workspace: String,
    /// The mount made the directory a workspace: it had none.
    initialized: bool,
    daemon_pid: u32,
    passthrough: bool,
    log: String,
    warnings: Vec<String>,
}

#[derive(Serialize)]
struct Unmounted {
    unmounted: String,
}

/// The workspace root a mount command names: the argument (or -C, or the
/// current workspace), canonical.
fn target(ctx: &Ctx, dir: Option<&Path>) -> Result<PathBuf> {
    let start = ctx.dir_arg(dir);
    match Workspace::discover(&start) {
        Some(root) => Ok(root),
        None => Err(Error::NotAWorkspace { path: start }),
    }
}

/// The user root's mount over `root` opens a door for (D151): the
/// workspace's owner, when that is not root. A view is its maker's alone.
fn door_owner(root: &Path, view: bool) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    if view || !rewind_platform::is_root() {
        return None;
    }
    let uid = std::fs::metadata(root).ok()?.uid();
    (uid != 0).then_some(uid)
}

pub fn run(ctx: &Ctx, a: Args) -> Result<()> {
    // A directory no workspace holds is made one, as a first checkpoint
    // would: the README's `sudo rewind mount .` was refused on a fresh
    // project (helper-77).
    // Opening checks it is a workspace, finishes an interrupted rewind and
    // refuses a second mount (its daemon answers).
    let (mut ws, initialized) = match target(ctx, a.dir.as_deref()) {
        Err(Error::NotAWorkspace { path }) if !a.foreground => {
            (ctx.init_implicitly(&path, "a mount")?, true)
        }
        r => (Workspace::open(&r?, false)?, false),
    };
    let root = ws.root_path().to_path_buf();
    if let Some(m) = ws.mount() {
        return Err(Error::Mount(rewind_fuse::Error::AlreadyMounted {
            path: m.mount_point().to_path_buf(),
            pid: m.daemon_pid(),
        }));
    }
    // Mounted elsewhere (a view): its daemon holds the workspace's claim
    // (D98). Checked here to change nothing; the daemon's own claim is
    // what keeps two apart.
    already_mounted(ws.io_path())?;
    ws.lock()?;
    ws.recover_if_needed()?;
    // Where the ledger is (`.rewind/` or, on a subvolume, `.rewind/state/`).
    let ledger_path = ws.ledger().path().to_path_buf();
    drop(ws);
    // A view this command made is removed again if the mount fails: a
    // failed `mount --at` left it behind (helper-42, D261).
    let mut made_view: Option<MadeView> = None;
    let view = match &a.at {
        Some(v) => {
            let v = ctx.path_arg(v);
            // Checked before anything is made: a refused view left its
            // directories in the workspace (helper-31, D214). Only the
            // view itself is made, as `mkdir` would. `existing`: the
            // deepest part of it that exists, resolved; `missing`: what
            // is below that.
            let mut base = v.as_path();
            let mut missing = Vec::new();
            let existing = loop {
                match std::fs::canonicalize(base) {
                    Ok(c) => break c,
                    Err(e) => match (base.parent(), base.file_name()) {
                        (Some(parent), Some(name)) => {
                            missing.push(name.to_os_string());
                            base = parent;
                        }
                        _ => return Err(Error::Os(rewind_platform::Error::new("open", base, e))),
                    },
                }
            };
            let existing_is_dir = existing.is_dir();
            let resolved = missing.iter().rev().fold(existing, |p, n| p.join(n));
            if resolved.starts_with(&root) || root.starts_with(&resolved) {
                return Err(Error::InvalidPath {
                    path: resolved,
                    reason: format!(
                        "a view must be outside the workspace {} (and not contain it); nothing was made",
                        root.display()
                    ),
                });
            }
            // A FIFO there hung the daemon in its open for good, the
            // workspace claimed (helper-32, D223); a file, or a symlink
            // to nothing, got errors that named neither.
            let not_a_dir = if missing.is_empty() {
                !resolved.is_dir()
            } else {
                !existing_is_dir || std::fs::symlink_metadata(&resolved).is_ok()
            };
            if not_a_dir {
                return Err(Error::InvalidPath {
                    path: resolved,
                    reason: "is not a directory (or is a symlink to nothing): give --at a directory, or a path to make one at; nothing was made".into(),
                });
            }
            if missing.len() > 1 {
                let parent = resolved.parent().unwrap_or(&resolved);
                return Err(Error::InvalidPath {
                    path: parent.to_path_buf(),
                    reason: format!(
                        "does not exist: make it first (`mkdir -p {}`), or give --at a directory whose parent exists; nothing was made",
                        crate::names::shell_word(&parent.to_string_lossy())
                    ),
                });
            }
            // `lost+found` alone: the top of a filesystem, hiding nothing.
            if missing.is_empty()
                && std::fs::read_dir(&resolved)
                    .is_ok_and(|d| d.flatten().any(|e| e.file_name() != "lost+found"))
                && !rewind_fuse::is_rewind_mount(&resolved)
            {
                // The mount would hide what is there, without a word
                // (helper-42, D261).
                return Err(Error::InvalidPath {
                    path: resolved,
                    reason: "is not empty: a mount there would hide its files; give --at an empty directory, or a path to make one at; nothing was made".into(),
                });
            }
            if !missing.is_empty() {
                std::fs::create_dir(&resolved)
                    .map_err(|e| Error::Os(rewind_platform::Error::new("create", &resolved, e)))?;
                made_view = Some(MadeView(resolved.clone()));
            }
            Some(resolved)
        }
        None => None,
    };
    let mountpoint = view.clone().unwrap_or_else(|| root.clone());
    let opts = rewind_fuse::ServeOptions {
        view: view.clone(),
        passthrough: !a.no_passthrough && rewind_fuse::ServeOptions::default().passthrough,
        companion: Some(super::serve::companion(
            &mountpoint,
            door_owner(&root, view.is_some()),
        )?),
        failpoint: crate::failpoint::hit,
        ..Default::default()
    };
    if a.foreground {
        // Held for the daemon's life, opened before the mount covers the
        // ledger: with a second connection open, a command's connection
        // is never the last one, so it neither folds the WAL into the
        // main file on close nor restarts the WAL on its next write. That
        // is three fsyncs saved per command (D58). The WAL is folded when
        // the daemon exits, or by SQLite every 1,000 pages.
        let _ledger_keeper = Ledger::open(&ledger_path)?;
        return Ok(rewind_fuse::serve(&root, &opts, || {
            rewind_platform::stderr_line!(
                "rewind: serving {} at {} (unmount with `rewind unmount`)",
                root.display(),
                mountpoint.display()
            )
        })?);
    }
    // Processes already inside keep the directory they entered: the
    // backing tree, which the daemon does not see them change.
    let me = format!("pid {} ", std::process::id());
    let mut warnings: Vec<String> = if view.is_some() { Vec::new() } else { rewind_fuse::holders(&root) }
        .into_iter()
        .filter(|h| h.ends_with("working directory") && !h.starts_with(&me))
        .map(|h| format!("{h} inside {} keeps using the directory under the mount, and so do the programs it starts: until it cds back in or exits, the mount does not see what it changes, and every checkpoint walks the whole tree (D319)", root.display()))
        .chain(
            // So do writes through a descriptor or a shared mapping made
            // before the mount (or before a daemon that died): the daemon
            // never sees them (helper-41, D259).
            if view.is_some() { Vec::new() } else { held_for_writing(&root) }
                .into_iter()
                .map(|h| format!("{h}: made before the mount, its writes there bypass the dirty set until it closes or unmaps the file, and every checkpoint walks the whole tree until then (D319)")),
        )
        .collect();
    let log_path = root.join(STATE_DIR).join(LOG_FILE);
    // Through the open `.rewind/`, never a symlink (D160).
    let opened = rewind_platform::Dir::open(&root)
        .and_then(|r| r.open_dir(std::ffi::OsStr::new(STATE_DIR)))
        .and_then(|state| {
            let l = state.open_or_create(std::ffi::OsStr::new(LOG_FILE), 0o644, true)?;
            Ok((state, l))
        });
    let log = match opened {
        Ok((state, l)) => {
            // Made by root in a user's history: theirs, or their own
            // mount later cannot append to it (D148).
            if let Some(h) = Heir::of(&state).map_err(Error::os)? {
                h.give_fd(&l, &log_path).map_err(Error::os)?;
            }
            l
        }
        Err(e) => {
            // Another `rewind mount` mounted over the workspace since it
            // was opened above, hiding `.rewind/`.
            if let Ok(Some(c)) = rewind_fuse::Client::connect(&root) {
                return Err(Error::Mount(rewind_fuse::Error::AlreadyMounted {
                    path: root,
                    pid: c.daemon_pid(),
                }));
            }
            return Err(Error::os(e));
        }
    };
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    // A view that is another workspace's mount: its daemon would refuse
    // this one, reported as a daemon that did not start (MOUNT); said
    // here as what it is (helper-43, D264).
    if let Ok(Some(c)) = rewind_fuse::Client::connect(&mountpoint) {
        return Err(Error::Mount(rewind_fuse::Error::AlreadyMounted {
            path: mountpoint,
            pid: c.daemon_pid(),
        }));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::Os(rewind_platform::Error::new("find", "the rewind binary", e)))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg(&root);
    if let Some(v) = &view {
        cmd.arg("--at").arg(v);
    }
    if a.no_passthrough {
        cmd.arg("--no-passthrough");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .current_dir("/");
    // Its own session: the terminal's hangup and ^C do not reach it.
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(rewind_platform::new_session);
    }
    let mut child = cmd.spawn().map_err(|e| {
        Error::Os(rewind_platform::Error::new(
            "start the daemon for",
            &root,
            e,
        ))
    })?;
    let started = Instant::now();
    let link = loop {
        // Not `MountLink::connect`: a refused connection here is a daemon
        // still starting, not a dead one to detach. Only this command's
        // daemon will do: another one racing it may answer at the same
        // mount point.
        if let Ok(Some(c)) = rewind_fuse::Client::connect(&mountpoint)
            && c.daemon_pid() == child.id()
            && let Some(l) = MountLink::connect(&mountpoint).ok().flatten()
        {
            break l;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // It lost a race to another `rewind mount` of this workspace,
            // whose mount may still be coming up.
            for _ in 0..50 {
                let winner = match rewind_fuse::Client::connect(&root) {
                    Ok(Some(c)) => Some((root.clone(), c.daemon_pid())),
                    _ => rewind_fuse::holder(&root).map(|h| (h.mountpoint, h.pid)),
                };
                if let Some((path, pid)) = winner {
                    return Err(Error::Mount(rewind_fuse::Error::AlreadyMounted {
                        path,
                        pid,
                    }));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // MOUNT, not USAGE: the command was right, the mount failed
            // (helper-42, D258).
            return Err(Error::Mount(rewind_fuse::Error::NotStarted {
                path: root.clone(),
                why: format!("it exited ({status}): {}", log_tail(&log_path, log_start)),
            }));
        }
        if started.elapsed() > READY_TIMEOUT {
            let _ = child.kill();
            return Err(Error::Mount(rewind_fuse::Error::NotStarted {
                path: root.clone(),
                why: format!(
                    "it did not answer within {} s: {}",
                    READY_TIMEOUT.as_secs(),
                    log_tail(&log_path, log_start)
                ),
            }));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Mounted: the view stays.
    std::mem::forget(made_view.take());
    let status = link.status()?;
    // Another path to the tree under the mount, found from the daemon's
    // own bind mount of it: a bind mount of it, or of a directory above
    // or below it, made before (helper-82, D330).
    if view.is_none() {
        let elsewhere = rewind_platform::reached_elsewhere(
            &rewind_fuse::backing_path(&mountpoint),
            rewind_fuse::FUSE_KINDS,
        );
        warnings.extend(elsewhere.iter().map(|p| format!("{} is also reached at {} (a mount made before this one): what is written there bypasses the mount, so every checkpoint walks the whole tree while it is mounted; `umount {}` and mount again for checkpoints that look only at what changed (D330)", root.display(), p.display(), p.display())));
    }
    drop(link);
    record(
        &mountpoint,
        |f| {
            f.str("at", &mountpoint.display().to_string())
                .str("view", if view.is_some() { "1" } else { "0" })
                .str("passthrough", if status.passthrough { "1" } else { "0" })
        },
        "mount",
    )?;
    let out = Mounted {
        mounted: mountpoint.display().to_string(),
        workspace: root.display().to_string(),
        initialized,
        daemon_pid: status.pid,
        passthrough: status.passthrough,
        log: log_path.display().to_string(),
        warnings,
    };
    for w in &out.warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    ctx.emit(&out, || {
        let made = if out.initialized {
            format!(
                "initialized workspace {} (it had no .rewind/)\n",
                out.workspace
            )
        } else {
            String::new()
        };
        format!(
            "{made}mounted {} (daemon pid {}, {}); `rewind unmount {}` to stop",
            out.mounted,
            out.daemon_pid,
            if out.passthrough {
                "kernel passthrough"
            } else {
                "no passthrough"
            },
            out.mounted
        )
    })
}

/// Refuse a second mount of the workspace whose backing root is `root`
/// (D98), naming the mount it has.
fn already_mounted(root: &Path) -> Result<()> {
    match rewind_fuse::holder(root) {
        Some(h) => Err(Error::Mount(rewind_fuse::Error::AlreadyMounted {
            path: h.mountpoint,
            pid: h.pid,
        })),
        None => Ok(()),
    }
}

/// A view directory `mount --at` made: removed on drop (if still empty)
/// unless the mount came up ([`std::mem::forget`] keeps it).
struct MadeView(PathBuf);

impl Drop for MadeView {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Other processes that can write files in the workspace `root` without
/// opening them again (its history aside: servers hold the ledger).
fn held_for_writing(root: &Path) -> Vec<String> {
    let me = std::process::id();
    let history = root.join(STATE_DIR);
    rewind_platform::writers_of(
        |p| p.starts_with(root) && !p.starts_with(&history),
        |pid| pid == me,
    )
}

fn log_tail(path: &Path, from: u64) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        use std::io::Seek;
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.read_to_string(&mut s);
    }
    let s = s.trim();
    if s.is_empty() {
        format!("no output (see {})", path.display())
    } else {
        // The daemon's own error line: its prefix once is enough.
        let last = s.lines().last().unwrap_or(s);
        last.strip_prefix("rewind: error: ")
            .unwrap_or(last)
            .to_string()
    }
}

/// Append a `mount` or `unmount` entry to the workspace's chain.
fn record(
    root: &Path,
    fields: impl FnOnce(crate::chain::Fields) -> crate::chain::Fields,
    kind: &str,
) -> Result<()> {
    let mut ws = Workspace::open(root, false)?;
    ws.ledger_mut().write(|tx| {
        tx.event(kind, fields(crate::chain::Fields::new()))
            .map(|_| ())
    })
}

pub fn unmount(ctx: &Ctx, a: UnmountArgs) -> Result<()> {
    let start = ctx.dir_arg(a.dir.as_deref());
    let root = match std::fs::canonicalize(&start) {
        Ok(r) => Workspace::discover(&r).unwrap_or(r),
        // A dead mount cannot be resolved; name it as given.
        Err(_) => std::path::absolute(&start).unwrap_or(start),
    };
    // The workspace itself while a view of it is mounted: its one mount
    // (D98) is the view. The socket is looked at first: a mount over the
    // workspace hides `.rewind/`, and asking a stopped daemon would hang.
    let root = match rewind_fuse::socket_path(&root).exists() {
        false => rewind_fuse::holder(&root).map_or(root, |h| h.mountpoint),
        true => root,
    };
    let had_daemon = rewind_fuse::socket_path(&root).exists();
    let reason = match MountLink::connect(&root)? {
        Some(link) => {
            // The workspace itself: the mount point, or a view's backing.
            let view = !link.access_path().starts_with(rewind_fuse::runtime_dir());
            let workspace = if view {
                link.access_path().to_path_buf()
            } else {
                root.clone()
            };
            // `rewind unmount .` from inside the mount must not be the
            // process that keeps it busy.
            let _ = std::env::set_current_dir("/");
            let daemon = link.daemon_pid();
            link.unmount()?;
            drop(link);
            // The daemon removes its socket (and bind mount) once the
            // kernel ends the session, then exits, which releases its
            // claim: a `rewind mount` right after an unmount that had only
            // waited for the socket was refused as ALREADY_MOUNTED, naming
            // the daemon on its way out (the suite, under load).
            let sock = rewind_fuse::socket_path(&root);
            let gone = Instant::now();
            while (sock.exists() || rewind_platform::is_running(daemon))
                && gone.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            Some((workspace, "requested"))
        }
        // Its daemon had died: `connect` detached the dead mount.
        None if had_daemon => Workspace::discover(&root).map(|w| (w, "daemon-gone")),
        None if !root.exists() => {
            return Err(Error::Usage(format!(
                "{} does not exist: name the directory you ran `rewind mount` on",
                root.display()
            )));
        }
        None if !root.join(crate::capture::STATE_DIR).is_dir() => {
            return Err(Error::Usage(format!(
                "{} is not mounted by rewind, nor a workspace (no .rewind/ in it or above): name the directory you ran `rewind mount` on",
                root.display()
            )));
        }
        None => {
            let how = if rewind_platform::is_root() {
                ""
            } else {
                " --at VIEW"
            };
            return Err(Error::Usage(format!(
                "{} is not mounted by rewind (`rewind mount {}{how}` mounts it)",
                root.display(),
                root.display()
            )));
        }
    };
    if let Some((workspace, reason)) = reason {
        record(
            &workspace,
            |f| {
                f.str("at", &root.display().to_string())
                    .str("reason", reason)
            },
            "unmount",
        )?;
    }
    let out = Unmounted {
        unmounted: root.display().to_string(),
    };
    ctx.emit(&out, || format!("unmounted {}", out.unmounted))
}
