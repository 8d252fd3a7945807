//! A workspace: the directory tree under version, its `.rewind/` state, and
//! the operations on both. Everything the CLI (and later MCP and hooks)
//! does goes through here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rewind_platform::{Dir, FsInfo, FsKind, Heir, LockFile};
use serde::Serialize;

use crate::capture::{self, Capture, STATE_DIR, Sink, Skipped};
use crate::chain::Fields;
use crate::diff::{self, Counts, DiffOptions, Trees};
use crate::durable;
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::ids;
use crate::ledger::{Checkpoint, Ledger};
use crate::mount::{Frozen, MountLink};
use crate::objects::ObjectStore;
use crate::progress::{Observer, Progress};
use crate::snapshot::{self, Engine};
use crate::tree::Overlay;
use crate::{failpoint, time};

/// On btrfs, up to this many fsyncs cost less than a `syncfs` (D68).
const BTRFS_FSYNCS_PAY: usize = 16;

/// Up to how many fsyncs cost less than one `syncfs` (`max`, `None`:
/// none do), and on how many threads they run.
#[derive(Clone, Copy)]
struct FsyncBudget {
    max: Option<usize>,
    threads: usize,
}

impl FsyncBudget {
    fn pays(self, fsyncs: usize) -> bool {
        self.max.is_some_and(|max| fsyncs <= max)
    }
}

/// Concurrent fsyncs on XFS and ext4 share log forces and device flushes
/// (13 entries: 2.6 ms on 8 threads against 4.9 in turn, D85). On btrfs
/// they contend for the subvolume's log tree, and a rewind's 13 took
/// 37 ms on 8 threads against 5–12 in turn (D89).
const FSYNC_THREADS: usize = 8;

/// On XFS and ext4, with more than this many dirty bytes machine-wide a
/// `syncfs` may cost more than fsyncs (D85): at ~1 GB/s, 4 MiB is ~4 ms,
/// what 16 fsyncs cost.
const DIRTY_PAGES_PAY: u64 = 4 << 20;

pub const LEDGER_FILE: &str = "ledger.db";
/// On a btrfs subvolume, everything rewind changes at every checkpoint
/// (the ledger, lock files, the clock file, the snapshots directory) lives
/// in this nested subvolume of `.rewind/`: nested subvolumes are not part
/// of snapshots, so the snapshots do not pin old versions of it (D50).
/// `objects/` and `tmp/` stay beside it, in the workspace's subvolume,
/// where restored files are renamed from.
pub const STATE_SUBVOLUME: &str = "state";

/// A file of real blocks beside the ledger, given back when `gc` meets a
/// full disk: gc's first write (the ledger's WAL) needs space, so on an
/// exactly full disk the one command that frees space could not run,
/// while every `NO_SPACE` message pointed at it (helper-47, D274).
pub(crate) const RESERVE: &str = "reserve";
const RESERVE_BYTES: u64 = 2 << 20;
/// Free space the reserve leaves the user when it is made.
const RESERVE_SPARE: u64 = 64 << 20;

/// A history root makes in a user's directory (`sudo rewind checkpoint`
/// or `init` in their project) is theirs, as if they had made it: made
/// root's, every later command of theirs was `NOT_OWNER` (D148). What
/// root adds to it later is given to them where it is made (shards,
/// locks, the mount's claim and log). At init it holds a handful of
/// entries: the ledger, `objects/`, `tmp/`, `.gitignore`, and on btrfs the
/// state subvolume with the ledger in it.
fn bequeath_history(root_dir: &Dir, state: &Dir) -> Result<()> {
    let Some(heir) = Heir::of(root_dir).map_err(Error::os)? else {
        return Ok(());
    };
    heir.give_at(root_dir, OsStr::new(STATE_DIR))
        .map_err(Error::os)?;
    let mut dirs = vec![state.try_clone().map_err(Error::os)?];
    while let Some(dir) = dirs.pop() {
        for name in dir.entries().map_err(Error::os)? {
            heir.give_at(&dir, &name).map_err(Error::os)?;
            if name == STATE_SUBVOLUME {
                dirs.push(dir.open_dir(&name).map_err(Error::os)?);
            }
        }
    }
    Ok(())
}

/// Take group and other access off `.rewind/` when its owner runs: it
/// holds a copy of every file, secrets of mode 0600 included (`.env`, a
/// key), in objects of mode 0444 and a WAL of 0644. Made 0755 before
/// D140; tightened on the next command. Not the owner, or a filesystem
/// that refuses: left as it is (the command does not need it).
fn keep_private(state: &Dir) {
    if let Ok(m) = state.meta()
        && m.mode & 0o077 != 0
        && m.uid == rewind_platform::euid()
    {
        let _ = state.set_own_mode(m.mode & 0o700);
    }
}

/// Whether `.rewind/` (without a ledger) is what an `init` killed before
/// making its ledger leaves: nothing, or an empty state subvolume.
fn killed_before_its_ledger(state: &Dir) -> Result<bool> {
    for name in state.entries().map_err(Error::os)? {
        let empty_subvolume = name == STATE_SUBVOLUME
            && state
                .open_dir(&name)
                .and_then(|d| d.entries())
                .is_ok_and(|e| e.is_empty());
        if !empty_subvolume {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `.rewind/state` is what a btrfs snapshot of the workspace
/// holds where the history's nested subvolume was: an empty directory
/// with inode 2 (`BTRFS_EMPTY_SUBVOL_DIR_OBJECTID`). Such a fork was told
/// its ledger was missing, at a path where it never lived (helper-37).
fn is_snapshot_placeholder(state: &Dir) -> bool {
    state
        .stat_at(OsStr::new(STATE_SUBVOLUME))
        .is_ok_and(|m| m.kind == rewind_platform::EntryKind::Dir && m.ino == 2)
}

/// Where the workspace's mutable state is: `.rewind/state/` when that
/// subvolume is there (it holds the ledger, or held it: a missing one is
/// named there, helper-75), else `.rewind/` itself.
fn meta_path(root_path: &Path) -> PathBuf {
    let state = root_path.join(STATE_DIR);
    let nested = state.join(STATE_SUBVOLUME);
    if nested.join(LEDGER_FILE).exists() || nested.is_dir() {
        nested
    } else {
        state
    }
}
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// `REWIND_BULKSTAT=0`: the walk stats each path even where root could
/// bulk stat XFS's inode chunks (D60); `doctor` says so.
pub(crate) fn bulkstat_turned_off() -> bool {
    std::env::var("REWIND_BULKSTAT").is_ok_and(|v| v == "0")
}

/// Ignore rules kept in the state directory, where no rewind reaches.
pub const STATE_IGNORE_FILE: &str = "ignore";

/// Meta key: which engine wrote the stat cache. Rows written from a btrfs
/// snapshot vouch for hashes whose content lives in that snapshot, not in
/// the object store, so the walk engine, which stores what it captures,
/// must not trust them (it starts from an empty cache once instead).
pub(crate) const STAT_CACHE_FROM: &str = "stat_cache_from";

/// Which tree a capture reads: the live workspace, a btrfs snapshot of it
/// whose unchanged inodes the live tree stands in for (`Mirrored`), or
/// another tree (a snapshot hashed on its own).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tree {
    Live,
    Mirrored,
    Other,
}

/// Meta key: `capture::rules_key` of the ignore rules the stat cache was
/// written under (a scope from a bulk stat is only valid under them).
pub(crate) const STAT_CACHE_RULES: &str = "stat_cache_rules";

pub struct Workspace {
    /// The workspace as the user names it (messages, path arguments).
    root_path: PathBuf,
    /// How this process reaches the tree by path: `root_path`, or the
    /// backing root behind a `rewind mount` (where `.rewind/` is hidden).
    io_path: PathBuf,
    /// The daemon serving the workspace, when mounted.
    mount: Option<MountLink>,
    root: Dir,
    state: Dir,
    /// Where mutable state lives: `.rewind/state/` (a subvolume, D50) or
    /// `.rewind/`.
    meta_path: PathBuf,
    meta: Dir,
    ledger: Ledger,
    store: ObjectStore,
    fs: FsInfo,
    engine: Engine,
    engine_reason: &'static str,
    show_progress: bool,
    observer: Option<Observer>,
    lock: Option<LockFile>,
    /// What this workspace was opened on; see [`Workspace::is_current`].
    identity: Identity,
    /// Captures walk the whole tree: see [`Workspace::walk_in_full`].
    in_full: std::cell::Cell<bool>,
}

/// The files an open workspace stands for, by (device, inode). A process
/// that keeps a workspace open between commands (`rewind mcp`) must
/// reopen it when one was replaced: the root by `init --subvolume`, the
/// ledger by a new `.rewind/`, the mount's socket by `mount`/`unmount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    root: (u64, u64),
    ledger: (u64, u64),
    socket: Option<(u64, u64)>,
}

impl Identity {
    fn of(root_path: &Path, ledger: &Path) -> Option<Identity> {
        let id = rewind_platform::file_id;
        Some(Identity {
            root: id(root_path)?,
            ledger: id(ledger)?,
            socket: id(&rewind_fuse::socket_path(root_path)),
        })
    }
}

static HISTORY_LOSS_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this command has said on stderr that the history lost what
/// its kept anchor recorded (D313): said once, not again per checkpoint.
pub(crate) fn history_loss_said() -> bool {
    HISTORY_LOSS_SAID.load(std::sync::atomic::Ordering::Relaxed)
}

static UNBUILT_MANIFESTS_SAID: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A command server's next command begins: what a command says once, it
/// says again (the server's first command alone said that the history
/// lost entries, helper-93).
pub(crate) fn new_command() {
    for said in [&HISTORY_LOSS_SAID, &UNBUILT_MANIFESTS_SAID] {
        said.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What `checkpoint` reports.
#[derive(Debug, Serialize)]
pub struct CheckpointReport {
    pub id: String,
    pub label: Option<String>,
    pub parent: Option<String>,
    /// Empty while the manifest is pending (btrfs engine).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub root: String,
    pub created_at: String,
    pub kind: String,
    pub engine: &'static str,
    pub fs: String,
    pub reflink: bool,
    /// The btrfs engine acknowledges a checkpoint once its snapshot exists;
    /// its root and changes are known when the manifest is built, shortly
    /// after (`rewind list` shows them).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub manifest_pending: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// `None` while the manifest is pending (btrfs engine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Counts>,
    pub bytes_new: u64,
    pub files_hashed: u64,
    /// Bytes those files' hashing read: less than their size where a big
    /// file was hashed on from what it still shares (D314).
    pub bytes_hashed: u64,
    pub cloned: u64,
    pub copied: u64,
    pub inlined: u64,
    /// `None` while the manifest is pending (btrfs engine): not known
    /// yet. A `0` and `[]` there said "empty, nothing skipped" of a tree
    /// with a skipped nested subvolume (helper-28, D198).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Vec<Skipped>>,
    /// True when nothing changed and an existing checkpoint was reused.
    pub unchanged: bool,
    pub duration_ms: u64,
    /// Checkpoints pruned by retention around this one (rewind.toml).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pruned: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The history lost what its kept anchor recorded (D313): on every
    /// checkpoint until it is resolved, where an agent reads it (D354).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_lost: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ChangeJson {
    pub path: String,
    /// The exact name when it is not UTF-8 (`path` is then lossy, D128).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    pub status: &'static str,
    /// `status`: a path still there that the capture could not read (a
    /// FIFO, another user's file): why. It is absent from the next
    /// checkpoint, hence "deleted", and a rewind keeps it (D111, D121).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncaptured: Option<String>,
}

impl ChangeJson {
    pub fn from_changes(changes: &[diff::Change]) -> Vec<ChangeJson> {
        changes
            .iter()
            .map(|c| ChangeJson {
                path: capture::display_path(&c.path),
                path_hex: capture::hex_unless_utf8(&c.path),
                status: c.status().as_str(),
                uncaptured: None,
            })
            .collect()
    }
}

/// A bulk stat is used while the inode chunks holding the tree's entries
/// number at most this many inodes per entry (D76): it costs ~0.65 µs per
/// inode read against ~1.6 µs per entry walked.
const BULKSTAT_SPREAD: u64 = 2;

/// The longest label a checkpoint takes, in bytes: one line of `list`
/// (and of an MCP answer) must stay a line, not megabytes.
pub const LABEL_MAX: usize = 256;

/// A label is one line of text someone can type again: no control
/// characters (a newline would fake a line of `list`, an escape sequence
/// would reach the terminal), not empty, at most [`LABEL_MAX`] bytes.
/// `HEAD`, `@`, `HEAD~`, `@~3`: what [`Workspace::resolve_any`] reads as
/// the current checkpoint or an ancestor before it looks at labels;
/// `HEAD~x` included: it is an unknown id, never a label.
fn names_head(spec: &str) -> bool {
    let base = spec.split_once('~').map_or(spec, |(b, _)| b);
    base == "HEAD" || base == "@"
}

/// The one checkpoint an id prefix matched, `None` for none, and
/// `AMBIGUOUS_ID` naming them for more.
fn only_one(spec: &str, found: Vec<Checkpoint>) -> Result<Option<Checkpoint>> {
    if found.len() > 1 {
        return Err(Error::AmbiguousId {
            id: spec.to_string(),
            candidates: found.iter().map(|c| c.id.clone()).collect(),
        });
    }
    Ok(found.into_iter().next())
}

/// `.rewind/NAME`, made if it is not there: by `init`, and for a history
/// whose empty directories git did not bring back (D295).
fn made_dir(state: &Dir, name: &str) -> Result<Dir> {
    let name = OsStr::new(name);
    match state.mkdir(name, 0o755) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(e)),
    }
    state.open_dir(name).map_err(Error::os)
}

pub fn check_label(label: &str) -> Result<()> {
    let one_line = format!("give one line of text of at most {LABEL_MAX} bytes");
    let (why, fix) = if label.trim().is_empty() {
        ("is empty", one_line)
    } else if label.len() > LABEL_MAX {
        ("is longer than 256 bytes", one_line)
    } else if label.chars().any(crate::names::unseen) {
        (
            "holds a control or invisible character (newline, tab, escape, a direction override)",
            one_line,
        )
    } else if names_head(label) {
        (
            "could never be named: HEAD, @, HEAD~N and @~N mean the current checkpoint and its ancestors",
            "choose another label".to_string(),
        )
    } else if label == "live" {
        (
            "is what `diff` calls the live tree",
            "choose another label".to_string(),
        )
    } else {
        return Ok(());
    };
    // An empty one is not quoted: "the label  is empty" (helper-31).
    let shown = if label.is_empty() {
        String::new()
    } else {
        format!(
            " {}",
            crate::cli::human_path(&label.chars().take(40).collect::<String>())
        )
    };
    Err(Error::Usage(format!("the label{shown} {why}: {fix}")))
}

/// The one workspace this process may open, while it runs commands for a
/// workspace's owner in root's mount (D151): as root, a `-C`, a hook
/// payload's `cwd` or a working directory elsewhere would otherwise open,
/// checkpoint or rewind any workspace on the machine for that user.
static CONFINED_TO: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Set by root's command server in the environment of the owner's
/// `rewind mcp` (D151): the workspace it is confined to, and every
/// process it starts.
pub const CONFINE_VAR: &str = "REWIND_CONFINE";

/// Confine this process to the workspace at `root` (canonical), or lift
/// the confinement (`None`).
pub fn confine(root: Option<PathBuf>) {
    *CONFINED_TO.lock().unwrap_or_else(|p| p.into_inner()) = root;
}

/// Whether this process runs commands for a workspace's owner (D151):
/// then root changes for them only what they could (D164).
pub(crate) fn is_confined() -> bool {
    CONFINED_TO
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some()
}

/// Refuse `root` (canonical) when this process is confined to another
/// workspace.
pub(crate) fn check_confined(root: &Path) -> Result<()> {
    match &*CONFINED_TO.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(only) if only != root => Err(Error::InvalidPath {
            path: root.to_path_buf(),
            reason: format!(
                "is not the workspace {}, the only one root's mount there runs commands in for its owner: run rewind in that workspace, or as root (`sudo rewind`) for another one",
                only.display()
            ),
        }),
        _ => Ok(()),
    }
}

impl Workspace {
    /// The workspace that holds `start`: the nearest ancestor with a
    /// `.rewind/` directory.
    /// Under a `rewind mount`, `.rewind/` is hidden: the mount point is
    /// found by its control socket instead (looked for first: looking up
    /// `.rewind` in a mount asks its daemon, which may not answer).
    pub fn discover(start: &Path) -> Option<PathBuf> {
        let start = match std::fs::canonicalize(start) {
            Ok(s) => s,
            Err(e) if crate::mount::is_dead_mount(&e) => {
                crate::mount::detach_dead_above(start).ok()?;
                std::fs::canonicalize(start).ok()?
            }
            Err(_) => return None,
        };
        start
            .ancestors()
            .find_map(|p| {
                if rewind_fuse::socket_path(p).exists() || p.join(STATE_DIR).is_dir() {
                    Some(Some(p.to_path_buf()))
                } else if rewind_fuse::door_path(p).exists() {
                    // Root's mount over another user's workspace: not one
                    // this process opens (its commands go through the
                    // door, D151), and no `.rewind/` above it is this
                    // directory's.
                    Some(None)
                } else {
                    None
                }
            })
            .flatten()
    }

    /// Create `.rewind/` in `root` (idempotent), readable by its owner
    /// only (D140). Returns the workspace and whether it was newly created.
    pub fn init(root: &Path, show_progress: bool) -> Result<(Workspace, bool)> {
        let root_path = std::fs::canonicalize(root)
            .map_err(|e| Error::os(rewind_platform::Error::new("open workspace", root, e)))?;
        check_confined(&root_path)?;
        let root_dir = Dir::open(&root_path).map_err(Error::os)?;
        let created = match root_dir.mkdir(OsStr::new(STATE_DIR), 0o700) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(Error::os(e)),
        };
        let made = Self::init_in(root_path, root_dir, created, show_progress);
        if created && let Err(e) = &made {
            // A `.rewind/` this call made holds nothing yet: removed, so
            // that "nothing was changed" holds and the next command is not
            // told of a ledger that was never finished (a full disk left
            // an empty ledger and a state subvolume, helper-47, D270).
            if let Ok(root_dir) = Dir::open(root) {
                if let Ok(state) = root_dir.open_dir(OsStr::new(STATE_DIR)) {
                    let _ = crate::subvol::remove_subvolume(&state, OsStr::new(STATE_SUBVOLUME));
                }
                if let Err(left) = root_dir.remove_all(OsStr::new(STATE_DIR)) {
                    crate::trace::note(format_args!("{e}: and what init made stays: {left}"));
                }
            }
        }
        made
    }

    /// [`Workspace::init`] once `.rewind/` exists (`created`: by this call).
    fn init_in(
        root_path: PathBuf,
        root_dir: Dir,
        created: bool,
        show_progress: bool,
    ) -> Result<(Workspace, bool)> {
        let state = root_dir
            .open_dir(OsStr::new(STATE_DIR))
            .map_err(Error::os)?;
        // The ledger is made first: a `.rewind/` holding anything else
        // had one, and one missing there is lost history, never the trace
        // of an `init` killed early. Made after `objects/` and `tmp/`, the
        // two looked alike, and `init` started a new history in place of
        // one holding only effects: a spent payment was admitted again
        // (helper-33, D230).
        let mut ledger_path = meta_path(&root_path).join(LEDGER_FILE);
        // A ledger file without tables is one whose creation was killed
        // (helper-15: 56 of 60 `init`s killed in their first 40 ms left
        // one, and every later command called it corrupt): nothing was
        // ever recorded in it, so it is created again, in place.
        let unfinished = !created && Ledger::never_finished(&ledger_path);
        let new_ledger = created || unfinished || !ledger_path.exists();
        if new_ledger {
            if !created {
                // Nor over the WAL that still holds its last commits, or
                // next to objects of an old history (D212).
                let lost = if unfinished {
                    let has_objects = state
                        .open_dir(OsStr::new("objects"))
                        .and_then(|d| d.entries())
                        .map(|e| !e.is_empty())
                        .unwrap_or(false);
                    has_objects || crate::ledger::stranded_wal(&ledger_path).is_some()
                } else {
                    !killed_before_its_ledger(&state)?
                };
                if lost && unfinished {
                    // There, but emptied: not "missing" (helper-35).
                    return Err(Error::LedgerCorrupt {
                        path: ledger_path,
                        detail: "it has no tables, beside the objects or the WAL of a history: it was emptied".into(),
                    });
                }
                if lost {
                    return Err(Error::LedgerMissing { path: ledger_path });
                }
            }
            // A new history on a subvolume keeps its ledger out of the
            // snapshots (D50); anywhere else, or if btrfs refuses, a file.
            if Engine::choose(&root_dir, &FsInfo::of(&root_dir).map_err(Error::os)?).0
                == Engine::Btrfs
                && match rewind_platform::create_subvolume(&state, OsStr::new(STATE_SUBVOLUME)) {
                    Ok(()) => true,
                    // Left by a crash before the ledger was made in it.
                    Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
                }
            {
                ledger_path = root_path
                    .join(STATE_DIR)
                    .join(STATE_SUBVOLUME)
                    .join(LEDGER_FILE);
            }
            Ledger::create(&ledger_path, &ids::make_workspace_id())?;
        }
        made_dir(&state, "objects")?;
        let tmp = made_dir(&state, "tmp")?;
        crate::git_guard::ensure(&state, &tmp)?;
        if new_ledger {
            bequeath_history(&root_dir, &state)?;
            state.fsync().map_err(Error::os)?;
        }
        let ws = Self::open_at(root_path, None, None, root_dir, state, show_progress)?;
        // With the history, not with its first checkpoint, whose growth
        // people measure.
        ws.ensure_reserve();
        // A new history, in a new `.rewind/` or in one an interrupted
        // `init` left: not "already a workspace" (helper-35).
        Ok((ws, new_ledger))
    }

    /// Open an existing workspace rooted exactly at `root`, through its
    /// mount daemon when `rewind mount` serves it.
    pub fn open(root: &Path, show_progress: bool) -> Result<Workspace> {
        let canonical = |root: &Path| {
            std::fs::canonicalize(root)
                .map_err(|e| Error::os(rewind_platform::Error::new("open workspace", root, e)))
        };
        let root_path = match std::fs::canonicalize(root) {
            Ok(r) => r,
            Err(e) if crate::mount::is_dead_mount(&e) => {
                crate::mount::detach_dead_above(root)?;
                canonical(root)?
            }
            Err(e) => {
                return Err(Error::os(rewind_platform::Error::new(
                    "open workspace",
                    root,
                    e,
                )));
            }
        };
        check_confined(&root_path)?;
        let mount = match MountLink::connect(&root_path)? {
            Some(m) => Some(m),
            None => Self::view_of(&root_path)?,
        };
        let root_dir = Dir::open(
            mount
                .as_ref()
                .map_or(root_path.as_path(), MountLink::access_path),
        )
        .map_err(Error::os)?;
        let state = match root_dir.open_dir(OsStr::new(STATE_DIR)) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Err(Error::NotAWorkspace { path: root_path }),
            Err(e) => return Err(Error::os(e)),
        };
        Self::open_at(root_path, None, mount, root_dir, state, show_progress)
    }

    /// The link to a view of the workspace at `root` (`rewind mount
    /// --at VIEW`), when one is mounted: commands run in the workspace
    /// directory itself go through its daemon too. A rewind made here
    /// without it left the view's kernel caches naming the files it
    /// replaced, for the view's entry TTL: writes through the view went to
    /// those, and were lost with them (D141).
    fn view_of(root: &Path) -> Result<Option<MountLink>> {
        let h = match rewind_fuse::holder(root) {
            Some(h) if h.mountpoint != root => h,
            Some(_) => return Ok(None),
            None => {
                Self::detach_dead_view(root);
                return Ok(None);
            }
        };
        MountLink::connect(&h.mountpoint).map_err(|e| match e {
            // A stopped or hung daemon is its own error: `doctor` reports
            // it and goes on beside it (D99), others name `kill -CONT`.
            e @ Error::Mount(rewind_fuse::Error::Unresponsive { .. }) => e,
            e => Error::InvalidPath {
                path: root.to_path_buf(),
                reason: format!(
                    "has a view mounted at {} (daemon pid {}) whose daemon this command cannot reach ({e}): run rewind as the user who mounted it, or unmount the view",
                    h.mountpoint.display(),
                    h.pid
                ),
            },
        })
    }

    /// A view whose daemon was killed: its dead mount failed every program
    /// in it with ENOTCONN until a command ran there (helper-79). Detached
    /// from the workspace too, and said.
    fn detach_dead_view(root: &Path) {
        if let Some(view) = rewind_fuse::dead_view(root) {
            let lock = rewind_fuse::MountLock::take(&view);
            if rewind_fuse::detach_dead(&view).is_ok() {
                rewind_platform::stderr_line!(
                    "rewind: the view of this workspace at {} had lost its daemon (killed or crashed): its dead mount is detached; `rewind mount {} --at {}` serves it again",
                    crate::names::human_os_path(&view),
                    crate::names::human_os_path(root),
                    crate::names::human_os_path(&view)
                );
            }
            drop(lock);
        }
    }

    /// Open the mounted workspace `root` (canonical) through `access`, a
    /// path to its backing tree, without asking its daemon: what `doctor`
    /// reports on when the daemon does not answer. Its engine walks.
    pub fn open_beside_daemon(root: PathBuf, access: &Path) -> Result<Workspace> {
        let root_dir = Dir::open(access).map_err(Error::os)?;
        let state = root_dir
            .open_dir(OsStr::new(STATE_DIR))
            .map_err(Error::os)?;
        Self::open_at(
            root,
            Some(access.to_path_buf()),
            None,
            root_dir,
            state,
            false,
        )
    }

    /// `io_path`: where the backing tree is reached when it is not the
    /// mount's access path or `root_path` itself.
    fn open_at(
        root_path: PathBuf,
        io_path: Option<PathBuf>,
        mount: Option<MountLink>,
        root: Dir,
        state: Dir,
        show_progress: bool,
    ) -> Result<Workspace> {
        let io_path = match (&mount, io_path) {
            (Some(m), _) => m.access_path().to_path_buf(),
            (None, Some(p)) => p,
            (None, None) => root_path.clone(),
        };
        crate::names::show_as(&io_path, &root_path);
        // Looked at in the backing tree's `.rewind/`: through a mount
        // whose daemon is stopped, a path lookup would hang.
        if let Some(cause) = crate::deinit::stopped_half_way(&state) {
            return Err(Error::HistoryBeingDeleted {
                path: root_path,
                cause,
            });
        }
        let fs = FsInfo::of(&state).map_err(Error::os)?;
        if !fs.read_only {
            keep_private(&state);
        }
        let meta_path = meta_path(&io_path);
        let meta = Dir::open(&meta_path).map_err(Error::os)?;
        let ledger = {
            let _t = crate::trace::span("open ledger");
            let path = meta_path.join(LEDGER_FILE);
            if fs.read_only {
                // Reading verbs work; the first write says READ_ONLY.
                Ledger::open_read_only(&path).map_err(|e| match e {
                    Error::ReadOnly { .. } => Error::read_only(root_path.clone()),
                    e => e,
                })
            } else {
                Ledger::open(&path)
            }
            .map_err(|e| match e {
                Error::LedgerMissing { .. } if is_snapshot_placeholder(&state) => {
                    Error::HistoryElsewhere {
                        path: root_path.clone(),
                    }
                }
                e => e,
            })?
        };
        // Empty directories git does not bring back: `git stash -a` and
        // `pop` left `.rewind/` without them, and every verb failed on a
        // bare ENOENT (helper-58, D295). Made again where the ledger is;
        // what the ledger names that is not there `verify --deep` lists.
        let open_or_make = |name: &str| match state.open_dir(OsStr::new(name)) {
            Err(e) if e.is_not_found() && !fs.read_only => made_dir(&state, name),
            r => r.map_err(Error::os),
        };
        let objects = open_or_make("objects")?;
        // `tmp` holds nothing once no command runs: a file or link put in
        // its place stopped every command, `deinit` too, on a bare
        // ENOTDIR (helper-79). It is replaced; the objects never are.
        let tmp = match state.open_dir(OsStr::new("tmp")) {
            // ENOTDIR, or ELOOP for a symbolic link.
            Err(e) if matches!(e.raw_os_error(), Some(20 | 40)) && !fs.read_only => {
                rewind_platform::stderr_line!(
                    "rewind: warning: {} was not a directory (something other than rewind put it there): replaced by the directory rewind keeps its temporary files in",
                    crate::names::human_os_path(&root_path.join(STATE_DIR).join("tmp"))
                );
                state.unlink(OsStr::new("tmp")).map_err(Error::os)?;
                made_dir(&state, "tmp")?
            }
            _ => open_or_make("tmp")?,
        };
        // A workspace made before the guards gets them now (one stat when
        // they are there); failing to write them must not stop a command.
        if let Err(e) = crate::git_guard::ensure(&state, &tmp) {
            crate::trace::note(format_args!("git guard not written: {e}"));
        }
        let clones = Self::clone_support_cached(&ledger, &tmp, fs.dev);
        let store = ObjectStore::new(objects, tmp, clones, &ledger);
        let (engine, engine_reason) = match &mount {
            Some(m) if m.is_view() => (
                Engine::Fuse,
                "mounted at a view with `rewind mount --at`: writes made beside it, in the workspace directory, never reach the daemon, so captures walk the stat cache; rewinds freeze the view",
            ),
            Some(_) => (
                Engine::Fuse,
                "mounted with `rewind mount`: the daemon's dirty set guides the capture",
            ),
            None => {
                let _t = crate::trace::span("choose engine");
                match Engine::choose(&root, &fs) {
                    // Snapshots made here could never move into the
                    // history's own subvolume (btrfs will not rename a
                    // read-only snapshot there: EROFS), and the finished
                    // conversion would have lost them (D135).
                    (Engine::Btrfs, _) if !meta_path.ends_with(STATE_SUBVOLUME) => (
                        Engine::Walk,
                        "the workspace root is a btrfs subvolume, but its history is not yet in a subvolume of its own (an interrupted `rewind init --subvolume`): stat-cache walk until `rewind init --subvolume DIR` finishes moving it",
                    ),
                    chosen => chosen,
                }
            }
        };
        // Not through a mount whose daemon is not asked.
        let identity_path = if mount.is_some() {
            &root_path
        } else {
            &io_path
        };
        let identity =
            Identity::of(identity_path, ledger.path()).ok_or_else(|| Error::NotAWorkspace {
                path: root_path.clone(),
            })?;
        let ws = Workspace {
            root_path,
            io_path,
            mount,
            root,
            state,
            meta_path,
            meta,
            ledger,
            store,
            fs,
            engine,
            engine_reason,
            show_progress,
            observer: None,
            lock: None,
            identity,
            in_full: std::cell::Cell::new(false),
        };
        ws.warn_if_history_lost();
        Ok(ws)
    }

    /// From now on, captures walk the whole tree, as `REWIND_ENGINE=walk`
    /// does: for a rewind that plans again after its apply wrote, whose
    /// writes go to the backing tree, where a mount's dirty set never
    /// sees them. Scoped by that set, its retry and roll-back captured
    /// the tree as it was before the apply, planned nothing, and said
    /// "rolled back" over a half-rewound tree (helper-32, D221).
    pub(crate) fn walk_in_full(&self) {
        self.in_full.set(true);
    }

    /// Whether this open workspace still stands for what its path names:
    /// the same root, ledger and mount (a live daemon) as when it was
    /// opened, and a ledger still of this build's format (D334). Three
    /// `stat`s and one query; a long-lived process asks before reusing it.
    pub fn is_current(&self) -> bool {
        Identity::of(&self.root_path, self.ledger.path()) == Some(self.identity)
            && self.mount.as_ref().is_none_or(MountLink::is_alive)
            && self.ledger.still_ours()
    }

    /// End of a command in a process that keeps the workspace open: give
    /// the lock back (other commands may run until the next call) and
    /// forget the caller's progress observer.
    pub fn release(&mut self) {
        self.lock = None;
        self.observer = None;
        self.in_full.set(false);
    }

    /// Whether clones work here, probed once per filesystem (device) and
    /// remembered in the ledger: the probe creates files and costs about a
    /// millisecond, which every command would otherwise pay.
    fn clone_support_cached(ledger: &Ledger, tmp: &Dir, dev: u64) -> bool {
        let key = format!("clone_support:{dev}");
        if let Ok(Some(v)) = ledger.meta(&key) {
            return v == "1";
        }
        let ok = rewind_platform::clone_support(tmp).unwrap_or(false);
        let _ = ledger.set_meta_now(&key, if ok { "1" } else { "0" });
        ok
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Whether git ignores `.rewind/` (D80, [`crate::git_guard`]).
    pub fn git_ignored(&self) -> bool {
        crate::git_guard::in_place(&self.state)
    }

    /// The path to use for I/O on the tree (see the field docs): never a
    /// path through the mount, which a rewind freezes.
    pub fn io_path(&self) -> &Path {
        &self.io_path
    }

    /// The mount daemon serving this workspace, if any.
    pub fn mount(&self) -> Option<&MountLink> {
        self.mount.as_ref()
    }

    /// Freeze the mount (if mounted) until the guard is dropped.
    pub(crate) fn freeze(&self) -> Result<Option<Frozen>> {
        self.mount.as_ref().map(MountLink::freeze).transpose()
    }

    /// After a capture that took the mount's dirty set is committed.
    pub(crate) fn commit_dirty(&self) -> Result<()> {
        match &self.mount {
            Some(m) => m.commit(),
            None => Ok(()),
        }
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub(crate) fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// Run `commit` on the ledger while `alongside` works with the object
    /// store on another thread: a rewind's files are made while its intent
    /// commit waits for the disk (D357). The store reads objects through a
    /// connection of its own, never the one committing.
    pub(crate) fn commit_alongside<T, S: Send>(
        &mut self,
        commit: impl FnOnce(&mut Ledger) -> Result<T>,
        alongside: impl FnOnce(&ObjectStore) -> S + Send,
    ) -> (Result<T>, S) {
        let (ledger, store) = (&mut self.ledger, &self.store);
        std::thread::scope(|s| {
            let side = s.spawn(|| alongside(store));
            let out = commit(ledger);
            match side.join() {
                Ok(made) => (out, made),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    pub fn fs(&self) -> FsInfo {
        self.fs
    }

    /// The workspace root is a btrfs subvolume.
    pub fn is_subvolume(&self) -> bool {
        rewind_platform::is_subvolume(&self.root).unwrap_or(false)
    }

    /// `READ_ONLY` when the root is a btrfs subvolume with the `ro`
    /// property: every write in it fails, so a rewind says so before its
    /// safety checkpoint instead of rolling back from its first write
    /// (D201).
    pub(crate) fn check_writable_subvolume(&self) -> Result<()> {
        if self.is_subvolume()
            && rewind_platform::is_readonly_subvolume(&self.root).unwrap_or(false)
        {
            return Err(Error::read_only(self.root_path.clone()));
        }
        Ok(())
    }

    /// The change-detection engine, and why it was chosen.
    pub fn engine(&self) -> (Engine, &'static str) {
        (self.engine, self.engine_reason)
    }

    /// `.rewind/` itself, in the workspace's own subvolume on btrfs.
    pub(crate) fn state_dir(&self) -> &Dir {
        &self.state
    }

    /// Where mutable state lives (lock files, the clock file, snapshots):
    /// `.rewind/state/` on a btrfs subvolume (D50), else `.rewind/`.
    pub(crate) fn meta_dir(&self) -> &Dir {
        &self.meta
    }

    pub(crate) fn meta_path(&self) -> &Path {
        &self.meta_path
    }

    pub fn clones(&self) -> bool {
        self.store.clones()
    }

    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Up to `limit` bytes of a file's content as a checkpoint recorded
    /// it: its stored object, or, where none is stored (a hash-only
    /// capture, a btrfs checkpoint), the file at `path` under `tree` (the
    /// live tree, or a btrfs checkpoint's snapshot). `None`: not stored,
    /// and no tree to read it from.
    pub(crate) fn read_content(
        &self,
        path: &[u8],
        hash: &Hash,
        size: u64,
        tree: Option<&Dir>,
        limit: u64,
    ) -> Result<Option<Vec<u8>>> {
        if self.store.contains(hash, size)? {
            return self.store.read_prefix(hash, size, limit).map(Some);
        }
        let Some(tree) = tree else {
            return Ok(None);
        };
        let p = Path::new(OsStr::from_bytes(path));
        let (file, _) = tree.open_read_beneath(p).map_err(Error::os)?;
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, limit), &mut buf)
            .map_err(|e| Error::os(rewind_platform::Error::new("read", p, e)))?;
        Ok(Some(buf))
    }

    pub(crate) fn root_dir(&self) -> &Dir {
        &self.root
    }

    /// Progress of long work, shown as `message`; none for an empty one
    /// (part of work that shows its own).
    pub(crate) fn progress(&self, message: &'static str) -> Progress {
        if message.is_empty() {
            return Progress::hidden();
        }
        Progress::with_observer(message, self.show_progress, self.observer.clone())
    }

    /// `f`, under a progress line named `message` while it runs: work that
    /// counts nothing (one SQLite call) and may take long (D341).
    pub(crate) fn saying<T>(&self, message: &'static str, f: impl FnOnce() -> T) -> T {
        let _line = self.progress(message);
        f()
    }

    /// Report progress of long work to a machine caller, and let it cancel
    /// captures (see [`Observer`]).
    pub fn set_observer(&mut self, observer: Observer) {
        self.observer = Some(observer);
    }

    /// Take the workspace lock (once per process), clean temp files left by
    /// a crashed writer, and finish any interrupted rewind. Every command
    /// that writes calls this first.
    pub fn lock(&mut self) -> Result<()> {
        self.lock_for_snapshot()?;
        snapshot::finish_pending(self)?;
        Ok(())
    }

    /// Take the workspace lock, waiting for its holder. A lock whose file
    /// was unlinked meanwhile is a history `rewind deinit` deleted while
    /// this command waited: what it opened before is gone with it, and
    /// going on wrote checkpoints no history holds and rewound over work
    /// with a safety checkpoint `undo` could not reach (helper-73).
    fn take_lock(&mut self) -> Result<()> {
        if self.lock.is_some() {
            return Ok(());
        }
        let path = self.meta_path.join("lock");
        match LockFile::acquire_in(&self.meta, "lock", LOCK_TIMEOUT).map_err(Error::os)? {
            Ok(l) if l.is_deleted() => Err(Error::HistoryDeleted {
                path: self.root_path.clone(),
            }),
            Ok(l) => {
                self.lock = Some(l);
                Ok(())
            }
            Err(pid) => Err(Error::Locked { path, pid }),
        }
    }

    /// The workspace lock, without the recovery every writer runs after
    /// taking it: what deleting the whole history holds (`rewind
    /// deinit`), which never changes the tree. Gives the rewind-like
    /// operation interrupted half-way, if there is one: only this history
    /// can finish it or take it back.
    pub(crate) fn lock_as_is(&mut self) -> Result<Option<String>> {
        self.take_lock()?;
        Ok(self.ledger.intent()?.map(|i| i.op))
    }

    /// The lock [`Workspace::lock_as_is`] took, with the ledger and every
    /// other descriptor closed.
    pub(crate) fn into_lock(mut self) -> Option<LockFile> {
        self.lock.take()
    }

    /// [`Workspace::lock`] without building pending manifests: what a
    /// btrfs checkpoint needs, which must not wait for earlier manifests.
    fn lock_for_snapshot(&mut self) -> Result<()> {
        if self.lock.is_some() {
            return Ok(());
        }
        self.ledger.check_writable()?;
        self.take_lock()?;
        if crate::acknowledged::unadopted(self) {
            crate::acknowledged::adopt(self)?;
        }
        self.ensure_reserve();
        self.store.clean_tmp()?;
        crate::rewind::recover(self)?;
        Ok(())
    }

    /// Finish an interrupted rewind and clean a crashed writer's temp files,
    /// if there are any (read-only commands call this so they never report a
    /// half-applied tree), or adopt a btrfs checkpoint whose row a power
    /// cut lost (D324). Costs one readdir, one small read and a query or
    /// two otherwise.
    ///
    /// On a read-only filesystem nothing can be finished: a reader goes on
    /// (the READ_ONLY error promises that `status`, `list` and `diff`
    /// work there) and is told that the tree it sees is half-rewound.
    pub fn recover_if_needed(&mut self) -> Result<()> {
        let leftovers = self
            .store
            .tmp_dir()
            .entries()
            .map(|e| !e.is_empty())
            .unwrap_or(false);
        let intent = self.ledger.intent()?;
        let unadopted = crate::acknowledged::unadopted(self);
        if !(leftovers || intent.is_some() || self.ledger.has_pending()? || unadopted) {
            return Ok(());
        }
        if self.fs.read_only {
            if let Some(i) = intent {
                rewind_platform::stderr_line!(
                    "rewind: warning: a {} of {} was interrupted and cannot be finished on this read-only filesystem: the tree is half-rewound; remount it read-write (mount -o remount,rw) and run any rewind command to finish it",
                    i.op,
                    self.root_path.display()
                );
            }
            self.warn_unbuilt_manifests(
                "on this read-only filesystem",
                "remount it read-write: mount -o remount,rw",
            );
            if unadopted {
                // `list` left them out without a word (helper-75).
                rewind_platform::stderr_line!(
                    "rewind: warning: checkpoints acknowledged before a crash or power cut may be missing from the ledger; their snapshots hold them, and the first command on a read-write filesystem brings them back (mount -o remount,rw)"
                );
            }
            return Ok(());
        }
        match self.lock() {
            // A full disk stops the finish as a read-only one does: a
            // reader goes on, told the tree is half-rewound, instead of
            // failing with "nothing was changed" (helper-34, D239); and
            // reads a checkpoint whose manifest could not be built from
            // its snapshot (D266).
            Err(e) if e.is_no_space() => {
                self.lock = None;
                let cause = crate::error::without_nothing_changed(&e);
                if let Some(i) = intent {
                    rewind_platform::stderr_line!(
                        "rewind: warning: a {} of {} was interrupted and cannot be finished: {cause}; the tree is half-rewound, and any rewind command finishes it once there is space",
                        i.op,
                        self.root_path.display(),
                    );
                }
                self.warn_unbuilt_manifests(
                    &format!(
                        "while the disk holding {} is full",
                        self.meta_path.display()
                    ),
                    "free some space: `rewind gc` prunes old checkpoints",
                );
                Ok(())
            }
            // Nor does a manifest that cannot be built for another reason
            // (a tree too deep for the open-file limit, helper-46) stop
            // `list` and `verify`: the snapshot holds the checkpoint.
            // Another process's lock still makes the reader wait and fail.
            Err(e)
                if intent.is_none()
                    && !matches!(e, Error::Locked { .. })
                    && self.ledger.has_pending().unwrap_or(false) =>
            {
                self.lock = None;
                self.warn_unbuilt_manifests(
                    &format!("({})", crate::error::without_nothing_changed(&e)),
                    "fix that and run any command",
                );
                Ok(())
            }
            r => r,
        }
    }

    /// Say, once a command, that the ledger lost what the anchor kept
    /// outside the workspace recorded (D313): `list` showed one
    /// checkpoint of four after a `sed -i` over the WAL, and said nothing.
    /// At every open, so `checkpoint`, the hooks and `doctor` say it too
    /// (helper-68).
    pub(crate) fn warn_if_history_lost(&self) {
        if history_loss_said() {
            return;
        }
        let _t = crate::trace::span("check kept anchor");
        if let Some(w) = self.ledger.lost_to_kept_anchor() {
            HISTORY_LOSS_SAID.store(true, std::sync::atomic::Ordering::Relaxed);
            rewind_platform::stderr_line!("rewind: warning: {w}");
        }
    }

    /// Tell a reader that checkpoints were acknowledged whose manifests
    /// cannot be built now (`why`, `fix`): their snapshots hold them,
    /// `list` shows them and `status` reads HEAD from its snapshot (D266).
    fn warn_unbuilt_manifests(&self, why: &str, fix: &str) {
        // Once a command: it may look several times (helper-48).
        if UNBUILT_MANIFESTS_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Ok(pending) = self.ledger.pending() else {
            return;
        };
        let Some(newest) = pending.last() else {
            return;
        };
        let which = match pending.len() {
            1 => format!("checkpoint {}", newest.id),
            n => format!("{n} checkpoints (the newest {})", newest.id),
        };
        rewind_platform::stderr_line!(
            "rewind: warning: the manifest of {which} cannot be built {why}; its snapshot keeps it safe, and the next command that can write builds it ({fix})"
        );
    }

    /// HEAD for a command that only reads: its checkpoint with no nodes
    /// of its own, or, while its manifest cannot be built (a full disk, a
    /// read-only filesystem: [`Workspace::recover_if_needed`] went on),
    /// its tree read from its read-only snapshot, with the nodes that
    /// reading decoded. Without this, `status` compared the live tree
    /// with no checkpoint at all and called every file added (D266).
    pub(crate) fn head_for_reading(&self) -> Result<Option<(Checkpoint, Overlay)>> {
        if let Some(h) = self.ledger.head()? {
            return Ok(Some((h, Overlay::new())));
        }
        let Some(p) = self.ledger.pending_head()? else {
            return Ok(None);
        };
        let Some(snap) = snapshot::open(self, &p.id)? else {
            return Ok(None);
        };
        let cap = self.capture_dir(
            &snap,
            true,
            Sink::HashOnly,
            p.clock_ns,
            "reading HEAD from its snapshot",
        )?;
        let parent = match p.parent {
            Some(seq) => self.ledger.id_of_seq(seq)?.map(|id| (seq, id)),
            None => None,
        };
        Ok(Some((p.as_checkpoint(cap.root, parent), cap.overlay())))
    }

    /// Make the reserve ([`RESERVE`]) if it is missing and the disk has
    /// room to spare: never the last free space a user has. Best effort,
    /// by every command that takes the workspace lock.
    fn ensure_reserve(&self) {
        let name = OsStr::new(RESERVE);
        if self.meta.stat_at(name).is_ok() || self.fs.read_only {
            return;
        }
        let room = rewind_platform::available_bytes(&self.meta_path);
        if room.is_none_or(|b| b < RESERVE_BYTES + RESERVE_SPARE) {
            return;
        }
        let path = self.meta_path.join(RESERVE);
        let made = self.meta.create_new(name, 0o600).and_then(|f| {
            if let Ok(Some(h)) = Heir::of(&self.meta) {
                let _ = h.give_fd(&f, &path);
            }
            rewind_platform::allocate(&f, &path, RESERVE_BYTES)
        });
        if let Err(e) = made {
            crate::trace::note(format_args!("no reserve: {e}"));
            let _ = self.meta.unlink(name);
        }
    }

    /// Give the reserve's space back to the filesystem, for a command that
    /// frees space (`gc`) but could not start on a full disk; whether there
    /// was one. Synced: btrfs frees extents when it commits, XFS when it
    /// inactivates the inode in the background.
    pub fn release_reserve(&self) -> bool {
        let released = self.meta.unlink(OsStr::new(RESERVE)).is_ok();
        if released {
            let _ = self.meta.syncfs();
        }
        released
    }

    /// The filesystem's clock, read by touching a file in `.rewind/`: the
    /// racy-entry cut-off for the stat cache.
    pub(crate) fn fs_clock_ns(&self) -> i64 {
        let name = OsStr::new("clock");
        let _ = self.meta.unlink(name);
        match self.meta.create_new(name, 0o644) {
            Ok(f) => {
                // Root's in a user's history: theirs (D148); it is
                // replaced each time, so this is tidiness, not access.
                if let Ok(Some(h)) = Heir::of(&self.meta) {
                    let _ = h.give_fd(&f, &self.meta_path.join("clock"));
                }
                let _ = std::io::Write::write_all(&mut &f, b"t");
                f.metadata()
                    .map(|m| {
                        rewind_platform::ns_since_epoch(
                            std::os::unix::fs::MetadataExt::ctime(&m),
                            std::os::unix::fs::MetadataExt::ctime_nsec(&m),
                        )
                    })
                    .unwrap_or(i64::MIN)
            }
            // Cannot write: treat every entry as racy (never trust the cache).
            Err(_) => i64::MIN,
        }
    }

    /// Capture the live tree. `Sink::Store` stores new objects; the caller
    /// persists the result with [`Workspace::persist_capture`].
    ///
    /// A storing capture also carries the durability bookkeeping forward
    /// (D85): it reports the entries changed since the mark, to be
    /// committed with it as [`Capture::durable`].
    pub(crate) fn capture(&self, sink: Sink<'_>, message: &'static str) -> Result<Capture> {
        let storing = matches!(sink, Sink::Store(..));
        let (now_ns, durable) = {
            let _t = crate::trace::span("fs clock");
            match storing {
                true => (self.fs_clock_ns(), durable::State::load(&self.ledger)?),
                false => (i64::MIN, None),
            }
        };
        let clock = capture::Clock {
            now_ns,
            report_from_ns: durable::State::reporting_from(durable.as_ref(), now_ns)
                .filter(|_| storing),
            store_durable_below_ns: durable
                .as_ref()
                .and_then(durable::State::store_below_ns)
                .filter(|_| self.root.meta().is_ok_and(|m| self.store.is_on(m.dev))),
        };
        // A checkpoint's files are from one moment: while something moved
        // after the capture read it, the capture runs again (through the
        // mount, taking what changed meanwhile too), up to SETTLE_ROUNDS
        // times and only while one takes less than SETTLE_WITHIN (a first
        // checkpoint of a big tree is not read three times over for a log
        // that grows); what still moved is said.
        let mut round = 1;
        let mut cap = loop {
            let started = Instant::now();
            let mut cap = self.capture_in(&self.root, Tree::Live, sink, clock, message)?;
            if cap.moved.is_empty() || round == SETTLE_ROUNDS || started.elapsed() > SETTLE_WITHIN {
                let moved = std::mem::take(&mut cap.moved);
                cap.unsettled.extend(moved);
                cap.unsettled.sort();
                cap.unsettled.dedup();
                break cap;
            }
            crate::trace::note(format_args!(
                "capture: {} paths moved after they were read; read again",
                cap.moved.len()
            ));
            round += 1;
        };
        cap.durable = durable::State::after_capture(durable.as_ref(), &cap.recent, cap.scoped);
        cap.durable_changed = cap.durable != durable;
        Ok(cap)
    }

    /// Capture the tree below `dir`: the live root, or a btrfs snapshot of
    /// it (then `clock_ns` is the clock when the snapshot was taken, and
    /// with `mirrored` the live tree's cached inodes stand in for the
    /// snapshot's where the stat cache vouches for them: see
    /// [`capture::capture`]).
    pub(crate) fn capture_dir(
        &self,
        dir: &Dir,
        mirrored: bool,
        sink: Sink<'_>,
        clock_ns: i64,
        message: &'static str,
    ) -> Result<Capture> {
        let clock = capture::Clock {
            now_ns: clock_ns,
            report_from_ns: None,
            store_durable_below_ns: None,
        };
        let tree = if mirrored {
            Tree::Mirrored
        } else {
            Tree::Other
        };
        self.capture_in(dir, tree, sink, clock, message)
    }

    fn capture_in(
        &self,
        dir: &Dir,
        tree: Tree,
        sink: Sink<'_>,
        clock: capture::Clock,
        message: &'static str,
    ) -> Result<Capture> {
        let mirrored = tree == Tree::Mirrored;
        // What the mount's daemon or a bulk stat says is about the live
        // tree: applied to a snapshot (`verify --deep`), it hashed the
        // live tree's cached entries as the snapshot's, and called intact
        // snapshots damaged (helper-39, D252).
        let live = tree == Tree::Live;
        // A storing capture cannot trust rows the btrfs engine wrote (see
        // STAT_CACHE_FROM): it starts cold once and replaces them.
        let distrust = matches!(sink, Sink::Store(..))
            && self.ledger.meta(STAT_CACHE_FROM)?.as_deref() == Some("snapshot");
        // Mounted: the daemon says which directories changed. A storing
        // capture takes the set (and commits it once persisted).
        // `REWIND_ENGINE=walk` walks anyway (tests compare the two).
        let walk_anyway =
            self.in_full.get() || std::env::var("REWIND_ENGINE").is_ok_and(|v| v == "walk");
        let rules = self.state_ignores()?;
        let rules_key = capture::rules_key(rules.as_deref());
        // Every scope below says what changed in the tree, not in the rules
        // kept outside it: under other rules than the stat cache was
        // written with, everything is walked (D62).
        let same_rules = self.ledger.meta(STAT_CACHE_RULES)?.as_deref() == Some(rules_key.as_str());
        // The scope as the mount's set or a bulk stat gave it, and which,
        // to compare with what the same source says after the capture.
        let mut taken: Option<(ScopeFrom, capture::Scope)> = None;
        let (scope, writers) = match &self.mount {
            Some(m) if live => {
                let _t = crate::trace::span("dirty set");
                // Taken even when unused: it is committed with the capture
                // (and the daemon's set stays bounded). A capture that
                // walks anyway only looks: it needs the writers (D247).
                let usable = !distrust && !walk_anyway;
                let d = m.dirty(usable && matches!(sink, Sink::Store(..)))?;
                // A view's set misses what was written beside it, in the
                // workspace directory (D123): the stat cache walks.
                let scope = d.scope.filter(|_| usable && same_rules && !m.is_view());
                taken = scope.clone().map(|s| (ScopeFrom::Mount, s));
                (scope, d.writers)
            }
            _ => (None, capture::Writers::default()),
        };
        // A btrfs snapshot: btrfs says what changed since the snapshot the
        // stat cache describes (D59); otherwise the live tree guides.
        let mut cache_mark = None;
        let scope = match scope {
            None if mirrored && !distrust && !walk_anyway => {
                let _t = crate::trace::span("btrfs changes");
                cache_mark = crate::snapshot::cache_mark(dir);
                let since = self.ledger.meta(crate::snapshot::STAT_CACHE_TRANSID)?;
                let scope = if same_rules {
                    crate::snapshot::changes_since(dir, since.as_deref())
                } else {
                    None
                };
                crate::trace::note(if scope.is_some() {
                    "btrfs changes: the capture is scoped to what changed"
                } else {
                    "btrfs changes: unknown, the live tree guides the capture"
                });
                scope
            }
            s => s,
        };
        // What a directory's last listing skipped is in no cached record:
        // such directories are listed again (D235).
        let mut scope = scope;
        if let Some(s) = scope.as_mut() {
            s.relist(self.ledger.stat_cache_dirs_with_skips()?);
        }
        let cache = {
            let rows = {
                let _t = crate::trace::span("read stat cache");
                match &scope {
                    _ if distrust => Vec::new(),
                    Some(s) => scoped_stat_cache(&self.ledger, s)?,
                    None => self.ledger.stat_cache()?,
                }
            };
            let _t = crate::trace::span("decode stat cache");
            capture::load_stat_cache(rows)
        };
        // The walk engine on XFS: one bulk stat instead of a stat per path (D60).
        let scope = match scope {
            None if live && !distrust && !walk_anyway && !cache.is_empty() => {
                // A million inodes: seconds before the walk's own line
                // (helper-89, D341).
                let looking = match message.is_empty() {
                    true => "",
                    false => "looking for what changed",
                };
                let scope = self.saying(looking, || self.bulkstat_scope(&cache, same_rules))?;
                taken = scope.clone().map(|s| (ScopeFrom::BulkStat, s));
                scope
            }
            s => s,
        };
        // About the live tree's inodes, which a snapshot of it shares; not
        // for another tree (`verify --deep` reads what it checks).
        let restored = match tree {
            Tree::Live | Tree::Mirrored => self.ledger.restored()?,
            Tree::Other => Default::default(),
        };
        let _t = crate::trace::span("walk");
        let progress = self.progress(message);
        let rules_path = self.io_path.join(STATE_DIR).join(STATE_IGNORE_FILE);
        let state_ignores = rules.as_deref().map(|t| (t, rules_path.as_path()));
        let guide = match (&scope, mirrored) {
            (Some(s), true) => capture::Guide::Scope(s, Some(&self.root)),
            (Some(s), false) => capture::Guide::Scope(s, None),
            (None, true) => capture::Guide::Mirror(&self.root),
            (None, false) => capture::Guide::None,
        };
        let mut cap = capture::capture(
            dir,
            guide,
            &cache,
            &restored,
            sink,
            clock,
            &progress,
            state_ignores,
            &writers,
        )?;
        if live && matches!(sink, Sink::Store(..)) {
            let _t = crate::trace::span("stat what was read again");
            cap.moved = cap.moved_since_read(dir);
            // What the scope's source says changed meanwhile beyond what
            // this capture looked at: a commit's new object in a directory
            // it did not list, named by a ref it read (helper-84: git's
            // `invalid sha1 pointer` after a rewind). The mount's daemon
            // tells; on XFS a second bulk stat, for a tree none watches.
            // A capture that looked at nothing has nothing to tear: the
            // second bulk stat (3–9 ms on XFS) is spared. So is one whose
            // capture looked only at what had changed before the clock was
            // read: it holds the tree as it was then (D345; the second bulk
            // stat took 130 ms of a 320 ms checkpoint at 300,000 files).
            let looked = taken.as_ref().filter(|(from, _)| match from {
                ScopeFrom::Mount => cap.looked_at_anything(),
                ScopeFrom::BulkStat => {
                    cap.looked_at_anything() && !cap.looked_only_at_what_predates(clock.now_ns)
                }
            });
            if let Some((from, taken)) = looked {
                let later = match (from, &self.mount) {
                    (ScopeFrom::Mount, Some(m)) => m.dirty(false)?.scope,
                    (ScopeFrom::Mount, None) => None,
                    (ScopeFrom::BulkStat, _) => self.bulkstat_scope(&cache, same_rules)?,
                };
                match later {
                    Some(later) => cap.moved.extend(later.changes_beyond(taken)),
                    None => cap.moved.push(Vec::new()),
                }
            }
        }
        crate::trace::note(format_args!(
            "capture: {} files read ({} bytes), {} restored files taken as written",
            cap.stats.files_hashed, cap.stats.bytes_hashed, cap.stats.files_known_restored
        ));
        cap.replaces_cache = distrust;
        cap.cache_mark = cache_mark;
        cap.cache_rules = Some(rules_key);
        progress.finish();
        // Last chance to stop before the caller commits anything.
        if progress.cancelled() {
            return Err(Error::Cancelled);
        }
        Ok(cap)
    }

    /// A capture scope from an XFS bulk stat (D60) of the inode chunks the
    /// tree's cached entries live in (D76), where that is cheaper than a
    /// stat per path and says the same: XFS, root (the ioctl needs
    /// CAP_SYS_ADMIN), no filesystem mounted inside the tree (a walk does
    /// not cross it; bulk stat would not notice it), chunks holding at most
    /// [`BULKSTAT_SPREAD`] times as many inode numbers as the tree has
    /// entries (a bulk stat reads every inode of a chunk: past that, the
    /// walk is cheaper), and the cache written under the same ignore rules
    /// (`same_rules`). `REWIND_BULKSTAT=0` turns it off.
    ///
    /// An inode the cache does not know (a new file, a replaced one) needs
    /// no chunk of its own: the directory that gained its name moved, and
    /// is listed in full.
    fn bulkstat_scope(
        &self,
        cache: &capture::StatCache,
        same_rules: bool,
    ) -> Result<Option<capture::Scope>> {
        if self.fs.kind != FsKind::Xfs || !rewind_platform::is_root() || bulkstat_turned_off() {
            return Ok(None);
        }
        let _t = crate::trace::span("bulk stat");
        let why_not = if !same_rules {
            Some("the stat cache was written under other ignore rules")
        } else if rewind_platform::mounts_below(&self.io_path) {
            Some("a filesystem is mounted inside the tree")
        } else {
            None
        };
        if let Some(why) = why_not {
            crate::trace::note(format!("bulk stat: not used: {why}"));
            return Ok(None);
        }
        let inos = {
            // Decoded here rather than by the walk (which reuses it).
            let _t = crate::trace::span("bulk stat: decode");
            capture::cached_inodes(cache)
        };
        let entries = inos.len() as u64;
        let ranges = rewind_platform::xfs_chunk_ranges(&inos);
        let numbers: u64 = ranges.iter().map(|(a, b)| b - a + 1).sum();
        if numbers > BULKSTAT_SPREAD * entries + 1024 {
            crate::trace::note(format!(
                "bulk stat: not used: the tree's {entries} entries are spread over chunks of {numbers} inodes"
            ));
            return Ok(None);
        }
        // Captures the root and the device, not `self` (its ledger is not
        // `Sync`).
        let (root, dev) = (&self.root, self.fs.dev);
        let read = |part: &[(u64, u64)]| {
            let mut out = Vec::new();
            rewind_platform::xfs_bulkstat_ranges(root, part, dev, &mut out).map(|()| out)
        };
        // Two halves of the ranges (by inode count) read in parallel; in
        // order, their stats are sorted by inode.
        let stats = {
            let _t = crate::trace::span("bulk stat: ioctls");
            let mut seen = 0;
            let split = ranges
                .iter()
                .position(|(a, b)| {
                    seen += b - a + 1;
                    seen > numbers / 2
                })
                .unwrap_or(ranges.len());
            let (lo, hi) = ranges.split_at(split);
            match rayon::join(|| read(lo), || read(hi)) {
                (Ok(mut all), Ok(more)) => {
                    all.extend(more);
                    Ok(all)
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        let stats = match stats {
            Ok(s) => s,
            Err(e) => {
                crate::trace::note(format!("bulk stat: not used: {e}"));
                return Ok(None);
            }
        };
        let mut scope = capture::scope_from_stats(cache, &stats);
        scope.relist(
            cache
                .iter()
                .filter(|(_, row)| row.skips())
                .map(|(dir, _)| dir.clone()),
        );
        crate::trace::note(format_args!(
            "bulk stat: the capture is scoped to what changed ({} inodes read in {} ranges; {})",
            stats.len(),
            ranges.len(),
            scope.summary()
        ));
        Ok(Some(scope))
    }

    /// Ignore rules that live in `.rewind/ignore`, outside the tree: paths
    /// no rewind may touch (an agent's config written by `integrate`).
    fn state_ignores(&self) -> Result<Option<String>> {
        match self.state.open_read(OsStr::new(STATE_IGNORE_FILE)) {
            Ok((mut f, _)) => {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut f, &mut text).map_err(|e| {
                    Error::os(rewind_platform::Error::new(
                        "read",
                        self.io_path.join(STATE_DIR).join(STATE_IGNORE_FILE),
                        e,
                    ))
                })?;
                Ok(Some(text))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Error::os(e)),
        }
    }

    /// Add root-anchored ignore rules to `.rewind/ignore` (missing lines
    /// only); returns the lines added.
    pub fn add_state_ignores(&self, lines: &[String]) -> Result<Vec<String>> {
        let text = self.state_ignores()?.unwrap_or_default();
        let present: Vec<&str> = text.lines().map(str::trim).collect();
        let missing: Vec<String> = lines
            .iter()
            .filter(|l| !present.contains(&l.as_str()))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(missing);
        }
        let mut new = text.clone();
        if !new.is_empty() && !new.ends_with('\n') {
            new.push('\n');
        }
        for l in &missing {
            new.push_str(l);
            new.push('\n');
        }
        let path = self.io_path.join(STATE_DIR).join(STATE_IGNORE_FILE);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, new)
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| Error::os(rewind_platform::Error::new("write", &path, e)))?;
        Ok(missing)
    }

    /// Capture the live tree, storing every new object; small ones are
    /// committed to the ledger before this returns.
    pub(crate) fn capture_live(&self) -> Result<Capture> {
        let blobs = crate::blobs::BlobWriter::new(self.ledger.path());
        let mut cap = self.capture(Sink::Store(&self.store, &blobs), "capturing")?;
        let _t = crate::trace::span("commit spilled small objects");
        let finished = blobs.finish()?;
        cap.stats.bytes_new += finished.spilled_new_bytes;
        cap.take_stored(finished.buffered, finished.manifests);
        Ok(cap)
    }

    /// Durability before acknowledgement (DESIGN §4 rule 6): one syncfs for
    /// all new objects, or an fsync per object where few are new and that
    /// costs less (D87).
    /// Skipped when the capture wrote no object files (small objects are
    /// durable with the ledger commit itself).
    ///
    /// On the workspace's filesystem, that `syncfs` made everything the
    /// capture saw durable too: the capture then commits a new mark (D85).
    pub(crate) fn sync_state(&self, cap: &mut Capture) -> Result<()> {
        if cap.stats.cloned + cap.stats.copied == 0 {
            return Ok(());
        }
        // Few object files: each, its shard and `objects/` (D87).
        let budget = self.fsync_budget();
        if let Some(objects) = &cap.new_objects
            && budget.pays(2 * objects.len() + 1)
        {
            let _t = crate::trace::span("fsync (objects)");
            match self.store.sync_objects(objects, budget.threads) {
                Ok(()) => return Ok(()),
                Err(e) => crate::trace::note(format_args!("fsync per object: {e}; syncfs instead")),
            }
        }
        let same_fs = match (self.state.meta(), self.root.meta()) {
            (Ok(s), Ok(r)) => s.dev == r.dev,
            _ => false,
        };
        // Everything older than this clock is durable once it is done.
        let clock_ns = if same_fs {
            self.fs_clock_ns()
        } else {
            i64::MIN
        };
        let _t = crate::trace::span("syncfs (store)");
        self.state.syncfs().map_err(Error::os)?;
        if same_fs && let Some(state) = durable::State::after_syncfs(clock_ns, &cap.recent) {
            cap.durable = Some(state);
            cap.durable_changed = true;
        }
        Ok(())
    }

    /// Make an applied plan durable (DESIGN §4 rule 6) before the commit
    /// that records it: the entries it wrote, and whatever it left alone
    /// that may not be durable yet (`before`). An fsync per entry where
    /// that costs less (see [`Workspace::fsync_budget`]) and every entry
    /// can be reopened; otherwise one `syncfs`. `record`: the fsynced
    /// entries are recorded with their ctimes (`crate::durable`, 4; not
    /// needed when nothing else could write, a frozen mount).
    pub(crate) fn sync_applied(
        &self,
        touched: &crate::apply::Touched,
        before: durable::Before,
        record: bool,
    ) -> Result<durable::Synced> {
        let mut entries = touched.clone();
        let keeps_mark = !matches!(before, durable::Before::Durable);
        let budget = self.fsync_budget();
        match before {
            durable::Before::Durable if touched.is_empty() => return Ok(durable::Synced::Nothing),
            durable::Before::Durable => {}
            durable::Before::Unknown => entries.needs_syncfs(),
            durable::Before::Unsynced(paths) => {
                if !entries.whole_fs && budget.pays(entries.len() + paths.len()) {
                    let _t = crate::trace::span("stat unsynced entries");
                    entries.add_unsynced(&self.root, &paths)?;
                } else {
                    entries.needs_syncfs();
                }
            }
        }
        let pays = !entries.whole_fs && budget.pays(entries.len());
        crate::trace::note(format_args!(
            "{} entries to make durable: {}",
            entries.len(),
            if pays { "fsync each" } else { "syncfs" }
        ));
        if pays {
            let clock_before_ns = match keeps_mark && record {
                true => self.clock_past_now(),
                false => i64::MIN,
            };
            let _t = crate::trace::span("fsync (changed entries)");
            match entries.fsync_each(&self.root, budget.threads) {
                Ok(fsynced) if keeps_mark => {
                    return Ok(durable::Synced::Entries {
                        fsynced,
                        clock_before_ns,
                    });
                }
                Ok(_) => return Ok(durable::Synced::Nothing),
                Err(e) => crate::trace::note(format_args!("fsync per entry: {e}; syncfs instead")),
            }
        }
        let clock_ns = if keeps_mark {
            self.fs_clock_ns()
        } else {
            i64::MIN
        };
        let _t = crate::trace::span("syncfs (workspace)");
        self.root.syncfs().map_err(Error::os)?;
        Ok(match clock_ns {
            i64::MIN => durable::Synced::Nothing,
            clock_ns => durable::Synced::Filesystem { clock_ns },
        })
    }

    /// The filesystem clock once it has moved past its reading now: every
    /// change made before this call has a smaller ctime, and every change
    /// after it a larger or equal one (`crate::durable`, 4). File times
    /// may be as coarse as a scheduler tick, so this may wait for one (a
    /// few ms at most); here, where reading a ctime makes the next one
    /// fine-grained, it reads the clock twice. `i64::MIN` when there is
    /// no clock or it does not move within 20 ms.
    pub(crate) fn clock_past_now(&self) -> i64 {
        let _t = crate::trace::span("fs clock past now");
        let now = self.fs_clock_ns();
        let deadline = Instant::now() + std::time::Duration::from_millis(20);
        while now != i64::MIN && Instant::now() < deadline {
            let later = self.fs_clock_ns();
            if later > now || later == i64::MIN {
                return later;
            }
            std::thread::sleep(std::time::Duration::from_micros(250));
        }
        i64::MIN
    }

    /// How many fsyncs cost less than one `syncfs` here. On btrfs a
    /// `syncfs` commits a transaction (15–27 ms measured on T1 against
    /// ~1 ms per fsync through the log tree: D68). On XFS and ext4 a quiet
    /// `syncfs` costs ~1.3 ms against ~0.25 ms per fsync, but it first
    /// writes back every dirty page of the filesystem, whoever wrote it
    /// (745 ms behind 1 GB of another program's writes): past
    /// [`DIRTY_PAGES_PAY`] dirty bytes machine-wide, fsyncs pay (D85).
    /// Read once per decision: it reads `/proc/meminfo`.
    fn fsync_budget(&self) -> FsyncBudget {
        let (max, threads) = match self.fs.kind {
            FsKind::Btrfs => (Some(BTRFS_FSYNCS_PAY), 1),
            _ if rewind_platform::dirty_bytes().is_some_and(|d| d > DIRTY_PAGES_PAY) => {
                (Some(crate::apply::Touched::MAX), FSYNC_THREADS)
            }
            _ => (None, FSYNC_THREADS),
        };
        FsyncBudget { max, threads }
    }

    pub fn head(&self) -> Result<Option<Checkpoint>> {
        self.ledger.head()
    }

    /// Create a checkpoint of the live tree.
    ///
    /// `reuse_if_unchanged`: automatic checkpoints (hooks, safety captures)
    /// reuse HEAD when the tree is identical instead of adding a duplicate.
    pub fn checkpoint(
        &mut self,
        label: Option<&str>,
        kind: &str,
        reuse_if_unchanged: bool,
    ) -> Result<CheckpointReport> {
        if let Some(l) = label {
            check_label(l)?;
            // An id wins over a label when a name is resolved: a label that
            // is another checkpoint's id could never be named.
            if ids::looks_like_id_prefix(l)
                && self
                    .ledger
                    .checkpoints_by_prefix(l, 1)?
                    .first()
                    .is_some_and(|c| c.id == l)
            {
                return Err(Error::Usage(format!(
                    "the label {l} is the id of another checkpoint and could never be named: choose another label"
                )));
            }
        }
        if self.engine == Engine::Btrfs {
            return self.checkpoint_snapshot(label, kind, reuse_if_unchanged);
        }
        match self.checkpoint_walk(label, kind, reuse_if_unchanged) {
            Err(Error::NoSpace { path, storing, .. })
                if self.ledger.head().is_ok_and(|h| h.is_none()) =>
            {
                self.forget_a_failed_first_checkpoint();
                Err(Error::NoSpaceForFirstCheckpoint { path, storing })
            }
            r => r,
        }
    }

    /// A first checkpoint the disk stopped had committed the small
    /// objects it spilled ahead of it (more than [`crate::blobs`] keeps in
    /// memory): tens of MiB in a ledger no checkpoint refers to, after an
    /// error that said nothing was changed, and ten `gc` runs to give them
    /// back (helper-70). With no checkpoint at all, every small object is
    /// such a leftover: they are dropped and their pages given back, with
    /// the reserve's room if the disk has none left. Best effort: the
    /// error that stopped the checkpoint is what the user is told.
    fn forget_a_failed_first_checkpoint(&mut self) {
        let drop_them = |ws: &mut Workspace| -> Result<usize> {
            // Folding the WAL first gives back its room (a deletion is
            // written to the WAL, and the disk is full).
            let _ = ws.ledger.fold_wal();
            let n = ws.ledger.write(|tx| tx.delete_blobs_if_no_checkpoint())?;
            if n > 0 {
                ws.ledger.release_free_pages(crate::gc::GIVE_BACK_ALL)?;
            }
            Ok(n)
        };
        match drop_them(self) {
            Err(e) if e.is_no_space() && self.release_reserve() => {
                let _ = drop_them(self);
            }
            _ => {}
        }
    }

    fn checkpoint_walk(
        &mut self,
        label: Option<&str>,
        kind: &str,
        reuse_if_unchanged: bool,
    ) -> Result<CheckpointReport> {
        let started = Instant::now();
        let t = crate::trace::span("lock and retention");
        self.lock()?;
        let (retention, config) = self.retention();
        let standing = self.standing_warnings(config);
        let mut pruned = crate::gc::before_checkpoint(self, &retention)?;
        drop(t);
        let new_objects = self.store.track_new()?;
        let mut cap = self.capture_live()?;
        failpoint::hit("checkpoint:before-sync");
        self.sync_state(&mut cap)?;
        let head = self.ledger.head()?;
        let (changes, nodes) = self.changes_since(head.as_ref(), &cap)?;
        if reuse_if_unchanged
            && let Some(h) = head.as_ref().filter(|_| changes == Counts::default())
        {
            self.persist_capture(&mut cap, None)?;
            new_objects.keep_named(&cap.objects_kept());
            self.ledger.remember_nodes(nodes);
            let mut r = self.report(h, &cap, changes, true, started);
            r.pruned = pruned;
            r.warnings.extend(standing);
            return Ok(r);
        }
        failpoint::hit("checkpoint:before-commit");
        let seq = self
            .persist_capture(
                &mut cap,
                Some(NewCheckpoint {
                    label,
                    kind,
                    parent: head.as_ref().map(|h| h.seq),
                    changes,
                }),
            )?
            .ok_or_else(|| Error::Usage("internal: checkpoint not created".into()))?;
        new_objects.keep_named(&cap.objects_kept());
        self.ledger.remember_nodes(nodes);
        failpoint::hit("checkpoint:after-commit");
        let _t = crate::trace::span("report and retention");
        let ck = self
            .ledger
            .checkpoint_by_seq(seq)?
            .ok_or_else(|| Error::UnknownId {
                id: seq.to_string(),
            })?;
        // Retention after the commit: the checkpoint is safe whatever gc does.
        let (more, warning) = crate::gc::after_checkpoint(self, &retention)?;
        pruned.extend(more);
        let mut r = self.report(&ck, &cap, changes, false, started);
        r.pruned = pruned;
        r.warnings.extend(standing);
        r.warnings.extend(warning);
        Ok(r)
    }

    /// The btrfs engine's checkpoint: a snapshot, acknowledged at once; the
    /// manifest follows in a detached process (or right here with
    /// `REWIND_MANIFEST=inline`). Retention runs after the manifest.
    fn checkpoint_snapshot(
        &mut self,
        label: Option<&str>,
        kind: &str,
        reuse: bool,
    ) -> Result<CheckpointReport> {
        let started = Instant::now();
        {
            let _t = crate::trace::span("lock");
            self.lock_for_snapshot()?;
        }
        let (retention, config) = self.retention();
        let standing = self.standing_warnings(config);
        crate::gc::refuse_if_over_budget(self, &retention)?;
        let p = snapshot::acknowledge(self, label, kind, reuse)?;
        let inline = match snapshot::ManifestMode::from_env() {
            snapshot::ManifestMode::Inline => true,
            snapshot::ManifestMode::Deferred => false,
            snapshot::ManifestMode::Background => {
                let _t = crate::trace::span("start manifest builder");
                !snapshot::spawn_finisher(&self.root_path, &self.meta)
            }
        };
        if inline {
            snapshot::finish_pending(self)?;
            let (pruned, warnings) = self.retention_after_checkpoint()?;
            let seq = self.ledger.alias(&p.id)?.unwrap_or(p.seq);
            let ck = self
                .ledger
                .checkpoint_by_seq(seq)?
                .ok_or_else(|| Error::UnknownId { id: p.id.clone() })?;
            let changes: Counts =
                serde_json::from_value(ck.stats["changes"].clone()).unwrap_or_default();
            let mut r = self.report(&ck, &Capture::default(), changes, seq != p.seq, started);
            r.snapshot = (seq == p.seq).then(|| p.id.clone());
            r.bytes_new = ck.stats["bytes_new"].as_u64().unwrap_or(0);
            r.pruned = pruned;
            r.warnings = standing.into_iter().chain(warnings).collect();
            return Ok(r);
        }
        let parent = match p.parent {
            Some(s) => self.ledger.id_of_seq(s)?,
            None => None,
        };
        Ok(CheckpointReport {
            id: p.id.clone(),
            label: p.label,
            parent,
            root: String::new(),
            created_at: time::format_rfc3339(p.created_at_ms),
            kind: p.kind,
            engine: Engine::Btrfs.as_str(),
            fs: self.fs.kind.to_string(),
            reflink: self.store.clones(),
            manifest_pending: true,
            snapshot: Some(p.id),
            changes: None,
            bytes_new: 0,
            files_hashed: 0,
            bytes_hashed: 0,
            cloned: 0,
            copied: 0,
            inlined: 0,
            entries: None,
            skipped: None,
            unchanged: false,
            duration_ms: started.elapsed().as_millis() as u64,
            pruned: Vec::new(),
            warnings: standing,
            history_lost: self.ledger.lost_to_kept_anchor(),
        })
    }

    /// The retention policy (rewind.toml [retention]). A broken file must
    /// not stop checkpoints, so retention falls back to the defaults then,
    /// and the checkpoint says so: a typo silently turned the size budget
    /// and automatic gc off.
    /// What every checkpoint says until it is fixed: a broken
    /// `rewind.toml` (`config`), a conversion stopped half-way (D352).
    fn standing_warnings(&self, config: Option<String>) -> Vec<String> {
        config
            .into_iter()
            .chain(crate::subvol::interrupted_conversion(&self.root_path))
            .collect()
    }

    fn retention(&self) -> (crate::config::Retention, Option<String>) {
        match crate::config::Config::load(&self.io_path) {
            Ok(c) => (c.retention, None),
            Err(e) => (
                Default::default(),
                Some(format!(
                    "{e}; until then checkpoints use the default retention (no size budget)"
                )),
            ),
        }
    }

    /// Retention after a checkpoint (rewind.toml [retention]).
    pub(crate) fn retention_after_checkpoint(&mut self) -> Result<(Vec<String>, Vec<String>)> {
        // A broken file was reported by the checkpoint itself.
        let (retention, _) = self.retention();
        if !crate::gc::after_checkpoint_needed(self, &retention)? {
            return Ok(Default::default());
        }
        self.lock()?;
        let (pruned, warning) = crate::gc::after_checkpoint(self, &retention)?;
        Ok((pruned, warning.into_iter().collect()))
    }

    /// What changed between HEAD and a capture, by content (mtimes alone
    /// are not a change: a rewind gives restored files the current time).
    /// Also returns the capture's decoded new nodes, for
    /// [`Ledger::remember_nodes`] once they are committed.
    pub(crate) fn changes_since(
        &self,
        head: Option<&Checkpoint>,
        cap: &Capture,
    ) -> Result<(Counts, HashMap<Hash, crate::tree::SharedNode>)> {
        let trees = Trees::with_overlay(&self.ledger, cap.overlay());
        let counts = content_changes(&trees, head, &cap.root)?;
        Ok((counts, trees.into_overlay()))
    }

    fn report(
        &self,
        ck: &Checkpoint,
        cap: &Capture,
        changes: Counts,
        unchanged: bool,
        started: Instant,
    ) -> CheckpointReport {
        CheckpointReport {
            id: ck.id.clone(),
            label: ck.label.clone(),
            parent: ck.parent.as_ref().map(|(_, id)| id.clone()),
            root: ck.root.to_hex(),
            created_at: ck.created_at.clone(),
            kind: ck.kind.clone(),
            engine: self.engine.as_str(),
            fs: self.fs.kind.to_string(),
            reflink: self.store.clones(),
            manifest_pending: false,
            snapshot: None,
            changes: Some(changes),
            bytes_new: cap.stats.bytes_new,
            files_hashed: cap.stats.files_hashed,
            bytes_hashed: cap.stats.bytes_hashed,
            cloned: cap.stats.cloned,
            copied: cap.stats.copied,
            inlined: cap.stats.inlined,
            entries: Some(cap.stats.entries),
            skipped: Some(cap.skipped.clone()),
            unchanged,
            duration_ms: started.elapsed().as_millis() as u64,
            pruned: Vec::new(),
            warnings: unsettled_warning(&cap.unsettled, "this checkpoint")
                .into_iter()
                .collect(),
            history_lost: self.ledger.lost_to_kept_anchor(),
        }
    }

    /// Commit a capture: its tree nodes, stat-cache updates and optionally a
    /// new checkpoint that becomes HEAD, in one transaction. Returns the new
    /// checkpoint's seq.
    pub(crate) fn persist_capture(
        &mut self,
        cap: &mut Capture,
        new: Option<NewCheckpoint<'_>>,
    ) -> Result<Option<i64>> {
        let workspace_id = self.ledger.meta("workspace_id")?.unwrap_or_default();
        let _t = crate::trace::span("commit");
        let engine = self.engine;
        let seq = self.ledger.write(|tx| {
            cap.stats.bytes_new += write_capture(tx, cap)?;
            match new {
                None => Ok(None),
                Some(n) => Ok(Some(insert_checkpoint(
                    tx,
                    &workspace_id,
                    cap,
                    &n,
                    None,
                    engine,
                )?)),
            }
        })?;
        let _t2 = crate::trace::span("commit: dirty set");
        self.commit_dirty()?;
        Ok(seq)
    }

    /// Run `read`, which takes no workspace lock (`status`, `diff`, a dry
    /// run), again when a `gc` committed meanwhile pruned what it was
    /// reading (`HISTORY_CHANGED`): it called a whole ledger corrupt and
    /// said to restore it from a backup (helper-34, D237). Three tries; a
    /// gc at each is the caller's to hear about.
    pub fn read_unlocked<T>(
        &mut self,
        mut read: impl FnMut(&mut Workspace) -> Result<T>,
    ) -> Result<T> {
        let mut tries = 0;
        loop {
            self.ledger.begin_unlocked_read()?;
            let r = read(self);
            self.ledger.end_unlocked_read();
            match r {
                Err(Error::HistoryChanged { .. }) if tries < 2 => tries += 1,
                r => return r,
            }
        }
    }

    /// Resolve a user-typed checkpoint name: `HEAD`/`@` (optionally `~N`
    /// for the N-th parent), a full id, a label (the newest checkpoint
    /// with that label), or a unique id prefix, in that order.
    pub fn resolve(&mut self, spec: &str) -> Result<Checkpoint> {
        let ck = self.resolve_any(spec)?;
        if ck.pruned {
            return Err(Error::Pruned { id: ck.id });
        }
        Ok(ck)
    }

    /// Like [`Workspace::resolve`], pruned checkpoints included. Pending
    /// manifests are finished first: the id may name one.
    pub fn resolve_any(&mut self, spec: &str) -> Result<Checkpoint> {
        // A usage error, not "no checkpoint matches ''" (helper-31, D225).
        if spec.trim().is_empty() {
            return Err(Error::Usage(
                "the checkpoint is empty: name one by id, label, HEAD or HEAD~N (`rewind list` shows them)".into(),
            ));
        }
        self.recover_if_needed()?;
        match self.resolve_built(spec) {
            // One whose manifest could not be built (recover_if_needed went
            // on past it) is there, not unknown (helper-48, D273).
            Err(Error::UnknownId { .. }) if let Some(id) = self.pending_named(spec)? => {
                Err(Error::ManifestPending { id })
            }
            r => r,
        }
    }

    /// The pending checkpoint `spec` names (HEAD and its ancestors while
    /// HEAD is pending, an id prefix, a label), if any.
    fn pending_named(&self, spec: &str) -> Result<Option<String>> {
        if names_head(spec) {
            return Ok(self.ledger.pending_head()?.map(|p| p.id));
        }
        let lower = spec.to_ascii_lowercase();
        Ok(self
            .ledger
            .pending()?
            .into_iter()
            .find(|p| {
                p.label.as_deref() == Some(spec)
                    || (ids::looks_like_id_prefix(&lower) && p.id.starts_with(&lower))
            })
            .map(|p| p.id))
    }

    fn resolve_built(&mut self, spec: &str) -> Result<Checkpoint> {
        let unknown = || Error::UnknownId {
            id: spec.to_string(),
        };
        if names_head(spec) {
            let up = match spec.split_once('~') {
                None => 0,
                Some((_, "")) => 1,
                Some((_, n)) => n.parse::<usize>().map_err(|_| unknown())?,
            };
            let mut ck = self.ledger.head()?.ok_or_else(unknown)?;
            for ancestors in 0..up {
                let parent = ck.parent.as_ref().ok_or_else(|| Error::BeforeHistory {
                    spec: spec.to_string(),
                    ancestors,
                })?;
                ck = self
                    .ledger
                    .checkpoint_by_seq(parent.0)?
                    .ok_or_else(unknown)?;
            }
            return Ok(ck);
        }
        let (exact, found) = if ids::looks_like_id_prefix(spec) {
            self.by_id_prefix(spec)?
        } else {
            (None, Vec::new())
        };
        if let Some(ck) = exact {
            return Ok(ck);
        }
        // A label is a name someone gave; a prefix is a shortcut. A label
        // `x4` must not lose to an id that happens to start with `x4` (a
        // rewind to the wrong checkpoint, silently).
        if let Some(labelled) = self
            .ledger
            .checkpoints_by_label(spec, 1)?
            .into_iter()
            .next()
        {
            return Ok(labelled);
        }
        if let Some(ck) = only_one(spec, found)? {
            return Ok(ck);
        }
        // Ids are lowercase; one typed or pasted in capitals names the
        // same checkpoint (helper-31). Labels stay exact.
        let lower = spec.to_ascii_lowercase();
        if lower != spec && ids::looks_like_id_prefix(&lower) {
            let (exact, found) = self.by_id_prefix(&lower)?;
            if let Some(ck) = exact.map_or_else(|| only_one(spec, found), |ck| Ok(Some(ck)))? {
                return Ok(ck);
            }
        }
        Err(unknown())
    }

    /// The checkpoint whose id is `prefix` (or was, for an automatic
    /// checkpoint identical to its parent and folded into it: its id keeps
    /// naming that checkpoint), and up to six whose id starts with it.
    fn by_id_prefix(&self, prefix: &str) -> Result<(Option<Checkpoint>, Vec<Checkpoint>)> {
        if let Some(seq) = self.ledger.alias(prefix)? {
            let ck = self.ledger.checkpoint_by_seq(seq)?;
            return Ok((ck, Vec::new()));
        }
        let found = self.ledger.checkpoints_by_prefix(prefix, 6)?;
        let exact = found.iter().find(|c| c.id == prefix).cloned();
        Ok((exact, found))
    }

    /// A command-line path (relative to `base` or absolute) as a
    /// workspace-relative byte path. Refuses paths outside the workspace,
    /// naming the path it resolved to, and inside `.rewind/`. `base` is
    /// the `-C` directory when one is given, as for `git -C` and `make -C`.
    pub fn relative_path(&self, arg: &Path, base: &Path) -> Result<Vec<u8>> {
        // `base.join` keeps an absolute `arg` as it is.
        let norm = rewind_platform::lexical(&base.join(arg));
        let outside = || Error::OutsideWorkspace {
            path: norm.clone(),
            workspace: self.root_path.clone(),
        };
        let rel = match norm.strip_prefix(&self.root_path) {
            Ok(rel) => rel.to_path_buf(),
            // The user may have named the workspace through a symlink:
            // resolve the longest existing ancestor and try again. The last
            // component is never resolved (it may itself be a symlink to
            // restore).
            Err(_) => {
                let parent = norm.parent().ok_or_else(outside)?;
                let name = norm.file_name().ok_or_else(outside)?;
                let full = rewind_platform::resolve_existing(parent).join(name);
                full.strip_prefix(&self.root_path)
                    .map_err(|_| outside())?
                    .to_path_buf()
            }
        };
        let bytes = rel.as_os_str().as_bytes().to_vec();
        if bytes == STATE_DIR.as_bytes() || bytes.starts_with(format!("{STATE_DIR}/").as_bytes()) {
            return Err(Error::InvalidPath {
                path: arg.to_path_buf(),
                reason: "is rewind's own state, which is never captured or restored".into(),
            });
        }
        Ok(bytes)
    }
}

/// The stat-cache rows a scoped capture reads: those of the directories
/// it lists and of the subtrees it walks, and below a listed directory
/// that has no row, all of them. Such a directory is listed in full and
/// each subdirectory it holds walked with its own row: gc drops the row of
/// a directory whose tree it pruned (D190), the root's among them, and
/// without the rows below, everything was read again (helper-89: after
/// `rewind`, `undo` and `gc --keep-last 1 --force` on the btrfs engine, a
/// 10-edit checkpoint's manifest read 1,000,003 files, 29.8 s; D340).
fn scoped_stat_cache(
    ledger: &Ledger,
    scope: &capture::Scope,
) -> Result<Vec<capture::StatCacheRow>> {
    let (dirs, trees) = scope.rows();
    let mut rows = ledger.stat_cache_for(&dirs, &trees)?;
    let found: std::collections::HashSet<Vec<u8>> = rows.iter().map(|r| r.dir.clone()).collect();
    let inside = |path: &[u8], top: &[u8]| {
        top.is_empty() && !path.is_empty() || capture::is_below(path, top)
    };
    // `dirs` is sorted: a directory comes before those below it.
    let mut rowless: Vec<Vec<u8>> = Vec::new();
    for d in dirs.iter().filter(|d| !found.contains(*d)) {
        if !rowless.iter().chain(&trees).any(|top| inside(d, top)) {
            rowless.push(d.clone());
        }
    }
    if !rowless.is_empty() {
        let below = ledger.stat_cache_for(&[], &rowless)?;
        rows.extend(below.into_iter().filter(|r| !found.contains(&r.dir)));
    }
    Ok(rows)
}

/// What changed between HEAD and `root`, by content, reading nodes through
/// `trees` (which must hold the capture's new nodes).
pub(crate) fn content_changes(
    trees: &Trees<'_>,
    head: Option<&Checkpoint>,
    root: &crate::hash::Hash,
) -> Result<Counts> {
    let _t = crate::trace::span("diff against HEAD");
    let from = head
        .map(|h| h.root)
        .unwrap_or_else(crate::tree::Node::empty_hash);
    Ok(diff::count(&diff::diff(
        trees,
        &from,
        root,
        DiffOptions::default(),
    )?))
}

/// A checkpoint row to create along with a capture.
pub(crate) struct NewCheckpoint<'a> {
    pub label: Option<&'a str>,
    pub kind: &'a str,
    pub parent: Option<i64>,
    pub changes: Counts,
}

/// Stage a capture in a transaction. Returns the bytes of small objects
/// that were new to the ledger.
pub(crate) fn write_capture(tx: &crate::ledger::Tx<'_>, cap: &Capture) -> Result<u64> {
    let mut new_bytes = 0;
    for (h, data) in &cap.blobs {
        if tx.put_blob(h, data)? {
            new_bytes += data.len() as u64;
        }
    }
    for (h, manifest) in &cap.manifests {
        tx.put_manifest(h, manifest)?;
    }
    for (h, data) in &cap.new_nodes {
        tx.put_tree(h, data)?;
    }
    if cap.replaces_cache {
        tx.clear_stat_cache()?;
        tx.delete_meta(STAT_CACHE_FROM)?;
    }
    if cap.from_snapshot && !cap.cache_updates.is_empty() {
        tx.set_meta(STAT_CACHE_FROM, "snapshot")?;
    }
    if let Some(key) = &cap.cache_rules {
        tx.set_meta(STAT_CACHE_RULES, key)?;
    }
    if let Some(state) = cap.durable.as_ref().filter(|_| cap.durable_changed) {
        tx.set_meta(durable::KEY, &state.encode())?;
    }
    // Which snapshot the rows now describe: only a snapshot's capture knows.
    match &cap.cache_mark {
        Some(mark) => tx.set_meta(crate::snapshot::STAT_CACHE_TRANSID, mark)?,
        None if cap.replaces_cache
            || !cap.cache_updates.is_empty()
            || !cap.cache_removals.is_empty()
            || !cap.cache_removed_trees.is_empty() =>
        {
            tx.delete_meta(crate::snapshot::STAT_CACHE_TRANSID)?
        }
        None => {}
    }
    for (dir, node, stats, skips) in &cap.cache_updates {
        tx.put_stat_cache(dir, node, stats, *skips)?;
    }
    for dir in &cap.cache_removals {
        tx.delete_stat_cache(dir)?;
    }
    for dir in &cap.cache_removed_trees {
        tx.delete_stat_cache_tree(dir)?;
    }
    tx.forget_restored(&cap.restored_done)?;
    Ok(new_bytes)
}

/// Insert a checkpoint row and its chain entry. `preset` is the (seq, id,
/// created_at) a btrfs checkpoint got when it was acknowledged; without it
/// the checkpoint is new and becomes HEAD.
pub(crate) fn insert_checkpoint(
    tx: &crate::ledger::Tx<'_>,
    workspace_id: &str,
    cap: &Capture,
    n: &NewCheckpoint<'_>,
    preset: Option<(i64, &str, i64)>,
    engine: Engine,
) -> Result<i64> {
    let root = &cap.root;
    let stats = serde_json::json!({
        "changes": n.changes, "bytes_new": cap.stats.bytes_new, "engine": engine.as_str(),
        "cloned": cap.stats.cloned, "copied": cap.stats.copied, "inlined": cap.stats.inlined,
    });
    let (seq, id, created_at) = match preset {
        Some((seq, id, at)) => (seq, id.to_owned(), at),
        None => {
            let (seq, id) =
                tx.next_id(|seq, nonce| ids::make_id(workspace_id, seq, root, nonce))?;
            (seq, id, time::now_ms())
        }
    };
    tx.insert_checkpoint(
        seq, &id, root, n.parent, n.label, n.kind, created_at, &stats,
    )?;
    let skipped: Vec<_> = cap.skipped.iter().map(Skipped::path_bytes).collect();
    tx.insert_skipped(seq, skipped.iter().map(|p| p.as_ref()))?;
    let parent_id = match n.parent {
        Some(p) => tx.checkpoint_id(p)?,
        None => String::new(),
    };
    tx.event(
        "checkpoint",
        Fields::new()
            .str("id", &id)
            .bytes("root", &root.0)
            .str("parent", &parent_id)
            .str("label", n.label.unwrap_or(""))
            .str("kind", n.kind),
    )?;
    if preset.is_none() {
        tx.set_meta("head", &seq.to_string())?;
    }
    Ok(seq)
}

/// What gave a capture its scope, asked again once it is done.
enum ScopeFrom {
    /// The mount's daemon: its dirty set.
    Mount,
    /// An XFS bulk stat against the stat cache (D60).
    BulkStat,
}

/// How many times a checkpoint reads the tree while files it read keep
/// moving before it keeps what it read last, and says so.
const SETTLE_ROUNDS: u32 = 3;

/// A capture that took longer is not run again for what moved meanwhile
/// (it is said instead).
const SETTLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// What to say of the files a capture could not take from one moment
/// ([`Capture::unsettled`]).
pub(crate) fn unsettled_warning(paths: &[Vec<u8>], what: &str) -> Option<String> {
    let (first, more) = paths.split_first()?;
    // The root is `.`; directories are named as the files are.
    let name = |p: &[u8]| match p.is_empty() {
        true => ".".to_string(),
        false => crate::names::shell_word(&crate::capture::display_path(p)),
    };
    let mut named = name(first);
    for p in more.iter().take(4) {
        named.push_str(", ");
        named.push_str(&name(p));
    }
    if more.len() > 4 {
        named.push_str(&format!(" and {} more", more.len() - 4));
    }
    Some(format!(
        "{named} changed while {what} read the tree, each time it tried: it may hold {} from different moments, which a database or a git repository does not survive; pause what writes there and checkpoint again",
        if more.is_empty() { "it" } else { "them" },
    ))
}
