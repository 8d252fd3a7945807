//! The one error type of the `rewind` crate. Every variant renders as one
//! line that names the path or id at fault and what to do about it.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Os(#[from] rewind_platform::Error),

    #[error("{0}")]
    Mount(#[from] rewind_fuse::Error),

    #[error(
        "{}; the {op} to {target} could not finish and was rolled back: the tree is as it was before it (checkpoint {safety}){}; fix the cause and run it again",
        without_nothing_changed(cause),
        saved.as_ref().map(|id| format!(", and the tree as the failed {op} left it, with whatever else was written meanwhile, is checkpoint {id}")).unwrap_or_default()
    )]
    RolledBack {
        op: &'static str,
        target: String,
        safety: String,
        /// What the tree held when the apply failed, made after the
        /// safety checkpoint (D213).
        saved: Option<String>,
        cause: Box<Error>,
    },

    #[error(
        "{}; the {op} to {target} stopped half-way and could not go back: the tree is half-rewound (as it was before, it is checkpoint {safety}{}), and the next rewind command finishes the {op} once that is fixed",
        without_nothing_changed(cause),
        saved.as_ref().map(|id| format!("; the tree as the failed {op} left it, with whatever else was written meanwhile, is checkpoint {id}")).unwrap_or_default()
    )]
    Unfinished {
        op: &'static str,
        target: String,
        safety: String,
        saved: Option<String>,
        cause: Box<Error>,
    },

    #[error("no space left on the device holding {}{}{}: {}free some space (`rewind gc` prunes old checkpoints, `rewind du` shows what they hold), then retry; nothing was changed", crate::names::human_os_path(existing_part(path)), storing.as_deref().map(Storing::what).unwrap_or_default(), shortfall.map(|s| s.to_string()).unwrap_or_default(), storing.as_deref().map(Storing::fix).unwrap_or_default())]
    NoSpace {
        path: PathBuf,
        /// What ran short, when known.
        shortfall: Option<Shortfall>,
        /// The file whose copy the disk had no room for, when one did
        /// (boxed: every `Result` carries this error's size).
        storing: Option<Box<Storing>>,
    },

    /// The first checkpoint filled the disk: there is no checkpoint for
    /// `gc` to prune, and on a filesystem without clones it stores a copy
    /// of every file (helper-70).
    #[error(
        "no space left on the device holding {} for the first checkpoint, which stores a copy of every file this filesystem cannot clone{}: free some space, or leave big generated directories out with `.rewindignore` at the workspace root (gitignore syntax: `target/`, `node_modules/`, `.venv/`), then retry; the tree was not changed, and what the checkpoint had stored was removed",
        crate::names::human_os_path(existing_part(path)),
        storing.as_ref().map(|s| format!(" (it stopped at {})", s.file())).unwrap_or_default()
    )]
    NoSpaceForFirstCheckpoint {
        path: PathBuf,
        storing: Option<Box<Storing>>,
    },

    /// `gc` itself could not write what it prunes: pointing at `gc` again
    /// sent the user round in a circle (helper-52).
    #[error(
        "no space left on the device holding {}, not even for `rewind gc` to record what it prunes (it needs a few MiB; the reserve beside the ledger is used or was never made on a filesystem this small): free some space outside the history (build output, caches, other files on that filesystem), then run `rewind gc` again; nothing was changed",
        crate::names::human_os_path(path)
    )]
    NoSpaceToPrune { path: PathBuf },

    #[error("{}: nothing was changed (list, status, diff, du and verify work read-only)", read_only_fix(path, subvolume.as_deref(), *denied))]
    ReadOnly {
        path: PathBuf,
        /// The read-only btrfs subvolume `path` is in, when that is why
        /// (the filesystem is mounted read-write): D201.
        subvolume: Option<PathBuf>,
        /// Neither: the filesystem is writable, and this user may not
        /// write `path` (its owner or mode): D216.
        denied: bool,
    },

    #[error("{}", not_owner(path, *owner, *me, state, *from_sudo))]
    NotOwner {
        path: PathBuf,
        owner: u32,
        me: u32,
        state: PathBuf,
        /// Root's history in this user's own workspace: a `sudo rewind`
        /// made it, and `chown` gives it back. Anything else is another
        /// user's, and the `chown` told them to take it (helper-79).
        from_sudo: bool,
    },

    /// What root's command server does not do for a workspace's owner
    /// (D151): `path` is the workspace.
    #[error(
        "{}: {what}, which root's mount does not do for the workspace's owner: {fix}",
        crate::names::human_os_path(path)
    )]
    RootOnly {
        path: PathBuf,
        what: String,
        fix: String,
    },

    #[error(
        "{source}: {} is immutable or append-only (`lsattr -d` shows it; set with `chattr +i`/`+a`), which not even root can replace; `sudo chattr -i -a {}` if that is meant to change, then retry",
        crate::names::human_os_path(locked),
        crate::names::human_os_path(locked)
    )]
    Immutable {
        locked: PathBuf,
        source: rewind_platform::Error,
    },

    #[error(
        "{} is not a rewind workspace (no .rewind/ in it or any parent): run `rewind init` there first",
        crate::names::human_os_path(path)
    )]
    NotAWorkspace { path: PathBuf },

    #[error(
        "the ledger {} is missing: restore it from a backup, or start a new history from the tree as it is with `{}` (deinit deletes what is left of the old one, btrfs snapshots included, which `rm -rf` cannot)",
        crate::names::human_os_path(path),
        start_over(path)
    )]
    LedgerMissing { path: PathBuf },

    #[error(
        "{} is a btrfs snapshot (or copy) of a workspace: its history, the nested subvolume .rewind/state, is never part of a snapshot and stayed with the original workspace (run rewind there); to give this tree a history of its own, move its .rewind aside and run `rewind init`",
        crate::names::human_os_path(path)
    )]
    HistoryElsewhere { path: PathBuf },

    #[error(
        "the history of {} is being deleted: `rewind deinit` stopped half-way{}, after its ledger; nothing can be rewound there any more: run `rewind deinit --yes` to remove the rest (once what stopped it is fixed), and a checkpoint then starts a new history",
        crate::names::human_os_path(path),
        cause.as_deref().map(|c| format!(" ({c})")).unwrap_or_default()
    )]
    HistoryBeingDeleted {
        path: PathBuf,
        cause: Option<String>,
    },

    #[error(
        "the history of {} was deleted (`rewind deinit`) while this command waited for it: nothing was done; run the command again (a checkpoint starts a new history)",
        crate::names::human_os_path(path)
    )]
    HistoryDeleted { path: PathBuf },

    /// A later build wrote this history (D334): an earlier build that
    /// writes it leaves out the rows and keys it does not know.
    #[error(
        "the ledger {} was written by a later build of rewind ({found}; this build, {}, reads up to ledger format {} and schema {}): run the later rewind here, and in every agent's hook and MCP settings (its `doctor` names the rewind each agent runs, and its `integrate AGENT` points the agent at it); nothing was changed",
        crate::names::human_os_path(path),
        crate::BUILD,
        crate::ledger::FORMAT_VERSION,
        crate::ledger::MIGRATED
    )]
    NewerLedger { path: PathBuf, found: String },

    /// An earlier build's ledger on a read-only filesystem: it is upgraded
    /// once, at the first open that may write (helper-83: "read-only"
    /// alone, from the very commands that say they work read-only).
    #[error(
        "the ledger {} was written by an earlier build of rewind and is upgraded once, the first time this build opens it on a writable filesystem; this one is read-only: run the earlier rewind to read it, or mount the filesystem read-write and run `rewind list` once; nothing was changed",
        crate::names::human_os_path(path)
    )]
    LedgerNeedsUpgrade { path: PathBuf },

    #[error(
        "the ledger {} is unreadable or corrupt ({detail}): restore it from a backup; `rewind doctor` shows more",
        crate::names::human_os_path(path)
    )]
    LedgerCorrupt { path: PathBuf, detail: String },

    #[error(
        "the history changed while this command read it: another process (`rewind gc`, or a rewind's retention) pruned what it was reading from {}; nothing was changed, run it again",
        crate::names::human_os_path(path)
    )]
    HistoryChanged { path: PathBuf },

    #[error(
        "the ledger {} was never finished: a `rewind init` or first checkpoint was interrupted before it recorded anything; `rewind init` (or `rewind checkpoint`) creates it again",
        crate::names::human_os_path(path)
    )]
    LedgerUnfinished { path: PathBuf },

    #[error("ledger {}: {source}", crate::names::human_os_path(path))]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },

    #[error(
        "no checkpoint matches '{}': run `rewind list` to see the ids and labels",
        crate::names::cut(id, 64)
    )]
    UnknownId { id: String },

    /// `HEAD~N` past the first checkpoint: said with how far back one can
    /// go, not as an id nobody typed (helper-52).
    #[error("{} (`rewind list` shows them)", before_history(spec, *ancestors))]
    BeforeHistory { spec: String, ancestors: usize },

    #[error(
        "checkpoint {id} is made, but its manifest could not be built yet (the warning above says why: a full disk, a read-only filesystem, the open-file limit): `rewind list` shows it, and `rewind status` and a plain `rewind diff` compare with it; fix that and run this again"
    )]
    ManifestPending { id: String },

    #[error("'{id}' is ambiguous: it matches {}; type more characters of the id", candidates.join(", "))]
    AmbiguousId { id: String, candidates: Vec<String> },

    #[error("the workspace is busy: {} holds {}; wait for it, or retry", locked_by(*pid, path), crate::names::human_os_path(path))]
    Locked { path: PathBuf, pid: Option<u32> },

    #[error(
        "the plan changed since the dry run (expected {expected}, now {actual}): run the same command with --dry-run again and review it (only a change to what the plan writes, deletes or replaces changes it)"
    )]
    PlanChanged { expected: String, actual: String },

    #[error(
        "{} is outside the workspace {}: name a path inside it",
        crate::names::human_os_path(path),
        crate::names::human_os_path(workspace)
    )]
    OutsideWorkspace { path: PathBuf, workspace: PathBuf },

    #[error("{}: {reason}", crate::names::human_os_path(path))]
    InvalidPath { path: PathBuf, reason: String },

    #[error(
        "nothing to undo: no rewind, replay or restore has been done in this workspace (`undo` takes back those, not edits: `rewind rewind HEAD` puts the tree back to the last checkpoint, saving the edits in one first)"
    )]
    NothingToUndo,

    #[error("{0}")]
    Usage(String),

    #[error(
        "the event chain fails verification ({detail}): {consequence}; `rewind verify --deep` shows it, and an anchor kept elsewhere is the evidence"
    )]
    Tampered { detail: String, consequence: String },

    #[error(
        "checkpoint {id} was pruned by `rewind gc`: its contents are gone (its history entry stays); `rewind list` shows the checkpoints you can still rewind to"
    )]
    Pruned { id: String },

    #[error("{}", over_budget(*budget, *used, *checkpoints, *force_frees))]
    OverBudget {
        budget: u64,
        used: u64,
        /// Checkpoints left (all protected); none: the ledger alone is over.
        checkpoints: usize,
        /// What `gc --force` would free now, when measured (D203).
        force_frees: Option<u64>,
    },

    #[error("btrfs: {}: {reason}", crate::names::human_os_path(path))]
    Btrfs { path: PathBuf, reason: String },

    /// Processes use a directory an operation must replace (`init
    /// --subvolume`): BUSY, as for a busy `unmount` (helper-42, D262).
    #[error("{} {reason}", crate::names::human_os_path(path))]
    Busy { path: PathBuf, reason: String },

    #[error("cancelled by the caller before anything was committed: nothing changed")]
    Cancelled,

    #[error(
        "stored object {hash} for {} is missing or damaged: the history is incomplete; `rewind verify --deep` lists what is damaged, and a checkpoint stores them again from a file holding them once its stat changed (`touch` it; an unchanged file is not read again)",
        crate::names::human_os_path(path)
    )]
    ObjectMissing { hash: String, path: PathBuf },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// For a path in a workspace's `.rewind/` that this user was refused: the
/// owner of the nearest existing entry on it, if that is another user,
/// and the `.rewind/` directory. A command run with sudo leaves root's
/// lock, ledger or object directories behind, and the owner's next
/// command failed with a bare "Permission denied" on a path that depends
/// on content hashes (helper-18).
fn foreign_history(path: &std::path::Path) -> Option<(u32, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let state = path
        .ancestors()
        .find(|a| a.file_name() == Some(std::ffi::OsStr::new(crate::capture::STATE_DIR)))?;
    let owner = path
        .ancestors()
        .take_while(|a| a.starts_with(state))
        .find_map(|a| std::fs::symlink_metadata(a).ok())?
        .uid();
    (owner != rewind_platform::euid()).then(|| (owner, state.to_path_buf()))
}

/// For a path an operation got EPERM on: it, or its directory, if that
/// is immutable or append-only (`chattr +i`/`+a`): "Operation not
/// permitted" and "fix the cause" did not say which or how (helper-18).
fn locked_entry(path: &std::path::Path) -> Option<PathBuf> {
    let locked = |p: &std::path::Path| {
        let (parent, name) = (p.parent()?, p.file_name()?);
        rewind_platform::Dir::open(parent)
            .ok()?
            .is_locked_at(name)
            .ok()?
            .then(|| p.to_path_buf())
    };
    locked(path).or_else(|| locked(path.parent()?))
}

/// Who holds a workspace's lock, by the pid the holder wrote in it. A
/// pid that no longer runs was named all the same, while another
/// program held the file (helper-31, D225): then that is said, with the
/// command that names the holder.
fn locked_by(pid: Option<u32>, path: &Path) -> String {
    match pid {
        Some(p) if Path::new(&format!("/proc/{p}")).exists() => {
            format!("another rewind process (pid {p})")
        }
        Some(p) => format!(
            "a process other than the one recorded in it (pid {p}, which has exited; `fuser -v {}` names the holder)",
            crate::names::shell_word(&path.to_string_lossy())
        ),
        None => "another rewind process".into(),
    }
}

/// The file a capture was storing a copy of when the disk filled
/// (a filesystem that cannot clone). Usually the cause: one big new file,
/// as a runaway log that filled the disk, and a rewind away from it that
/// first saves the tree, so that `undo` can bring it back, needs room for
/// a second copy. "Free some space" alone did not say where (D332).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storing {
    /// The file, relative to the workspace root.
    pub rel: Vec<u8>,
    pub size: u64,
    /// Set by a rewind whose target has no entry at `rel`: its path,
    /// and the operation ("rewind to ID (LABEL)"). The rewind deletes the file;
    /// deleting it first costs nothing the rewind would keep, save the
    /// copy `undo` would bring back.
    pub removed_by: Option<(PathBuf, String)>,
}

impl Storing {
    /// "PATH (SIZE)".
    fn file(&self) -> String {
        format!(
            "{} ({})",
            crate::capture::display_path(&self.rel),
            crate::progress::human_bytes(self.size)
        )
    }

    fn what(&self) -> String {
        format!(
            " to store a copy of {}, which this filesystem cannot clone",
            self.file()
        )
    }

    fn fix(&self) -> String {
        match &self.removed_by {
            Some((abs, target)) => format!(
                "a rewind first saves the tree as it is, so that `undo` can bring it back, and the {target} deletes this file: if it is not needed back, delete it (`rm {}`) and run the rewind again; or ",
                crate::names::shell_word(&abs.to_string_lossy())
            ),
            None => String::new(),
        }
    }
}

/// What a full disk ran short of, when known: said in [`Error::NoSpace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// Bytes the work needs and bytes free, known before it started.
    Bytes { needed: u64, free: u64 },
    /// Inodes: how many the work makes, when known before it started,
    /// and how many are free (`df -i`).
    Inodes { needed: Option<u64>, free: u64 },
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::progress::human_bytes;
        match self {
            Shortfall::Bytes { needed, free } => write!(
                f,
                " (this needs {} and {} are free)",
                human_bytes(*needed),
                human_bytes(*free)
            ),
            Shortfall::Inodes {
                needed: Some(n),
                free,
            } => write!(
                f,
                " (this makes {n} files and directories and {free} more fit: the filesystem has run out of inodes, not bytes, `df -i`)"
            ),
            Shortfall::Inodes { needed: None, .. } => write!(
                f,
                " (no inode is left, though bytes may be: `df -i`; each file, directory and stored object takes one)"
            ),
        }
    }
}

/// The deepest part of `path` that exists: a full disk was said to hold
/// `.rewind/tmp/ch.27621.0`, a temporary file already removed
/// (helper-59).
fn existing_part(path: &Path) -> &Path {
    path.ancestors()
        .find(|p| p.symlink_metadata().is_ok())
        .unwrap_or(path)
}

fn not_owner(path: &Path, owner: u32, me: u32, state: &Path, from_sudo: bool) -> String {
    let path = crate::names::human_os_path(path);
    let owner_name = owner_name(owner);
    if from_sudo {
        format!(
            "{path}: permission denied: it belongs to {owner_name}, not to this user (uid {me}), most likely from a rewind run with sudo; give the history back with `sudo chown -R {me}: {}`, or run rewind as its owner",
            crate::names::human_os_path(state)
        )
    } else {
        format!(
            "{path}: permission denied: it belongs to {owner_name}, not to this user (uid {me}): it is another user's history, which only they (or root) may read or change; run rewind as its owner"
        )
    }
}

fn owner_name(uid: u32) -> String {
    match uid {
        0 => "root".into(),
        u => format!("uid {u}"),
    }
}

impl Error {
    /// The code of what stopped a rewind that was rolled back or left
    /// unfinished: `--json` gives it as `cause`, so a client that acts on
    /// `NO_SPACE` sees a rewind the disk stopped (helper-47).
    pub fn cause_code(&self) -> Option<&'static str> {
        match self {
            Error::RolledBack { cause, .. } | Error::Unfinished { cause, .. } => Some(cause.code()),
            _ => None,
        }
    }

    /// Whether the disk is full, here or under a rewind it stopped
    /// half-way (a recovery's roll-forward answers that).
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::NoSpace { .. }
            | Error::NoSpaceToPrune { .. }
            | Error::NoSpaceForFirstCheckpoint { .. } => true,
            Error::Unfinished { cause, .. } => cause.is_no_space(),
            _ => false,
        }
    }

    /// A full disk at `path`, saying so when it is the inodes that ran
    /// out: `NO_SPACE` with "free some space" while `df -h` showed 54 MB
    /// free sent the user looking for bytes (helper-81).
    pub fn no_space(path: PathBuf) -> Error {
        let shortfall = rewind_platform::available_inodes(existing_part(&path))
            .filter(|free| *free == 0)
            .map(|free| Shortfall::Inodes { needed: None, free });
        Error::NoSpace {
            path,
            shortfall,
            storing: None,
        }
    }

    /// This error, saying which file's copy the disk had no room for
    /// (see [`Storing`]); any other error as it is. A disk out of inodes
    /// says that instead: a smaller file would not have fitted either.
    pub fn storing(self, rel: &[u8], size: u64) -> Error {
        match self {
            Error::NoSpace {
                path,
                shortfall: None,
                storing: None,
            } => Error::NoSpace {
                path,
                shortfall: None,
                storing: Some(Box::new(Storing {
                    rel: rel.to_vec(),
                    size,
                    removed_by: None,
                })),
            },
            e => e,
        }
    }

    /// Wrap an OS error, turning ENOSPC/EDQUOT into the actionable variant.
    pub fn os(e: rewind_platform::Error) -> Error {
        if e.is_no_space() {
            Error::no_space(e.path)
        } else if e.raw_os_error() == Some(30) {
            Error::read_only(e.path) // EROFS
        } else if e.raw_os_error() == Some(1)
            && let Some(locked) = locked_entry(&e.path)
        {
            Error::Immutable { locked, source: e }
        } else if e.is_permission_denied()
            && let Some((owner, state)) = foreign_history(&e.path)
        {
            Error::not_owner(e.path, owner, state)
        } else {
            Error::Os(e)
        }
    }

    /// The process exit code for this error (DESIGN §3): every error is 1;
    /// 2 is reserved for refusals by the effect barrier.
    pub fn exit_code(&self) -> i32 {
        1
    }

    /// A stable machine-readable code for `--json` error output.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Os(_) => "IO",
            Error::Mount(rewind_fuse::Error::AlreadyMounted { .. }) => "ALREADY_MOUNTED",
            Error::Mount(rewind_fuse::Error::Busy { .. }) | Error::Busy { .. } => "BUSY",
            Error::Mount(_) => "MOUNT",
            Error::RolledBack { .. } => "ROLLED_BACK",
            // The cause says what to fix (NO_SPACE: free space).
            Error::Unfinished { cause, .. } => cause.code(),
            Error::NoSpace { .. }
            | Error::NoSpaceToPrune { .. }
            | Error::NoSpaceForFirstCheckpoint { .. } => "NO_SPACE",
            Error::NotAWorkspace { .. } => "NOT_A_WORKSPACE",
            Error::NotOwner { .. } => "NOT_OWNER",
            Error::RootOnly { .. } => "ROOT_ONLY",
            Error::Immutable { .. } => "IMMUTABLE",
            Error::ReadOnly { .. } => "READ_ONLY",
            Error::LedgerMissing { .. }
            | Error::HistoryElsewhere { .. }
            | Error::HistoryBeingDeleted { .. }
            | Error::HistoryDeleted { .. } => "LEDGER_MISSING",
            Error::LedgerCorrupt { .. } => "LEDGER_CORRUPT",
            Error::NewerLedger { .. } => "LEDGER_NEWER",
            Error::LedgerNeedsUpgrade { .. } => "READ_ONLY",
            Error::HistoryChanged { .. } => "HISTORY_CHANGED",
            Error::LedgerUnfinished { .. } => "LEDGER_UNFINISHED",
            Error::Db { .. } => "LEDGER",
            Error::UnknownId { .. } | Error::BeforeHistory { .. } => "UNKNOWN_ID",
            Error::ManifestPending { .. } => "MANIFEST_PENDING",
            Error::AmbiguousId { .. } => "AMBIGUOUS_ID",
            Error::Locked { .. } => "LOCKED",
            Error::PlanChanged { .. } => "PLAN_CHANGED",
            Error::OutsideWorkspace { .. } => "OUTSIDE_WORKSPACE",
            Error::InvalidPath { .. } => "INVALID_PATH",
            Error::NothingToUndo => "NOTHING_TO_UNDO",
            Error::Usage(_) => "USAGE",
            Error::Tampered { .. } => "TAMPERED",
            Error::ObjectMissing { .. } => "OBJECT_MISSING",
            Error::Cancelled => "CANCELLED",
            Error::Pruned { .. } => "PRUNED",
            Error::OverBudget { .. } => "OVER_BUDGET",
            Error::Btrfs { .. } => "BTRFS",
        }
    }
}

/// What [`Error::BeforeHistory`] says, whoever reads it.
pub(crate) fn before_history(spec: &str, ancestors: usize) -> String {
    match ancestors {
        0 => format!("'{spec}' goes back further than the history: HEAD is its first checkpoint"),
        1 => format!(
            "'{spec}' goes back further than the history: HEAD has 1 ancestor (`HEAD~1` is the oldest)"
        ),
        n => format!(
            "'{spec}' goes back further than the history: HEAD has {n} ancestors (`HEAD~{n}` is the oldest)"
        ),
    }
}

/// Attach the ledger path to a SQLite error, classifying corruption.
pub(crate) fn db_err(path: &std::path::Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |source| {
        use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
        match source.sqlite_error_code() {
            Some(DatabaseCorrupt) | Some(NotADatabase) => Error::LedgerCorrupt {
                path: path.to_owned(),
                detail: source.to_string(),
            },
            Some(rusqlite::ErrorCode::DiskFull) => Error::no_space(path.to_owned()),
            // A write to a ledger opened on a read-only filesystem (D119).
            Some(rusqlite::ErrorCode::ReadOnly) => Error::read_only(path.to_owned()),
            // A write SQLite could not make is "disk I/O error" to it, ENOSPC
            // included (a copy-on-write `-shm` page, say): say so when the
            // filesystem is in fact full (under 1 MiB left).
            // Or "unable to open database file" when not even the `-shm`
            // could be made (XFS has no inode left, D267).
            Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::CannotOpen)
                if rewind_platform::available_bytes(path.parent().unwrap_or(path))
                    .is_some_and(|b| b < 1 << 20) =>
            {
                Error::no_space(path.to_owned())
            }
            _ => Error::Db {
                path: path.to_owned(),
                source,
            },
        }
    }
}

/// What to do about a read-only `path`: make its btrfs subvolume
/// writable, or remount its filesystem. A subvolume with the `ro`
/// property on a read-write mount was told to remount (helper-28).
fn read_only_fix(path: &Path, subvolume: Option<&Path>, denied: bool) -> String {
    match subvolume {
        None if denied => format!(
            "{} is not writable by this user (uid {}), though its filesystem is: its owner or mode keeps this user out; fix them (`ls -ld` shows them; `chown`/`chmod`), or run rewind as its owner, then retry",
            crate::names::human_os_path(path),
            rewind_platform::euid()
        ),
        Some(sub) => format!(
            "{} is in a read-only btrfs subvolume: make it writable (`btrfs property set {} ro false`), then retry",
            crate::names::human_os_path(path),
            crate::names::shell_word(&sub.to_string_lossy())
        ),
        None => format!(
            "{} is on a read-only filesystem: remount it read-write (mount -o remount,rw), then retry",
            crate::names::human_os_path(path),
        ),
    }
}

/// The commands that replace the history of the ledger at `ledger` with
/// a new one, pasted from anywhere (`deinit` runs only at the root).
fn start_over(ledger: &Path) -> String {
    match crate::kept_anchor::root_of(ledger) {
        Some(root) => {
            let root = crate::names::shell_word(&root.to_string_lossy());
            format!("rewind -C {root} deinit --yes && rewind -C {root} init")
        }
        None => "rewind deinit --yes && rewind init".into(),
    }
}

impl Error {
    /// `NOT_OWNER` for `path` in the history `state`, which `owner` owns.
    fn not_owner(path: PathBuf, owner: u32, state: PathBuf) -> Error {
        let me = rewind_platform::euid();
        let from_sudo = owner == 0
            && state.parent().is_some_and(|root| {
                std::fs::metadata(root).is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == me)
            });
        Error::NotOwner {
            path,
            owner,
            me,
            state,
            from_sudo,
        }
    }

    /// `READ_ONLY` for `path`, naming the read-only btrfs subvolume it is
    /// in when the filesystem itself is mounted read-write. Rewind's own
    /// snapshots are read-only by design and never named.
    pub fn read_only(path: PathBuf) -> Error {
        // An immutable ledger (or its -wal or -shm) reads to SQLite as
        // "readonly" too: named with the `chattr` that frees it, not as
        // a permission problem chmod cannot fix (helper-32, D223).
        let sidecar = |suffix| crate::names::with_suffix(&path, suffix);
        if let Some(locked) = [path.clone(), sidecar("-wal"), sidecar("-shm")]
            .iter()
            .find_map(|p| locked_entry(p).filter(|l| l == p))
        {
            let source =
                rewind_platform::Error::new("write", &locked, std::io::Error::from_raw_os_error(1));
            return Error::Immutable { locked, source };
        }
        // A ledger (or its -wal, -shm) another user owns, most likely
        // root's from a sudo: named with the `chown`, not as a read-only
        // filesystem (helper-62, D306).
        if rewind_platform::euid() != 0
            && let Some((owner, state)) = [path.clone(), sidecar("-wal"), sidecar("-shm")]
                .iter()
                .filter(|p| p.exists())
                .find_map(|p| foreign_history(p))
        {
            return Error::not_owner(path, owner, state);
        }
        let subvolume = path
            .ancestors()
            .filter_map(|a| rewind_platform::Dir::open(a).ok().map(|d| (a, d)))
            .find(|(_, d)| rewind_platform::is_subvolume(d).unwrap_or(false))
            .filter(|(_, d)| {
                rewind_platform::FsInfo::of(d).is_ok_and(|fs| !fs.read_only)
                    && rewind_platform::is_readonly_subvolume(d).unwrap_or(false)
            })
            .map(|(a, _)| a.to_path_buf())
            .filter(|a| {
                !a.components()
                    .any(|c| c.as_os_str() == crate::capture::STATE_DIR)
            });
        // A writable filesystem and no read-only subvolume: permissions
        // (SQLite says "readonly" for both; "remount it read-write" sent
        // the user the wrong way, helper-31).
        let denied = subvolume.is_none()
            && path
                .ancestors()
                .find_map(|a| rewind_platform::Dir::open(a).ok())
                .and_then(|d| rewind_platform::FsInfo::of(&d).ok())
                .is_some_and(|fs| !fs.read_only);
        Error::ReadOnly {
            path,
            subvolume,
            denied,
        }
    }
}

/// `OVER_BUDGET`'s message. With no checkpoint left, `gc --force` frees
/// nothing: what is over the budget is the ledger itself.
fn over_budget(budget: u64, used: u64, checkpoints: usize, force_frees: Option<u64>) -> String {
    use crate::progress::human_bytes;
    if let Some(f) = force_frees.filter(|f| checkpoints > 0 && used.saturating_sub(*f) > budget) {
        return format!(
            "the store uses {}, over its budget (max_store_bytes = {}), and every remaining checkpoint ({checkpoints}) is protected by the policy (HEAD and its recent past, the undo target, those of unresolved effects, and labelled ones while keep_labeled is on); `rewind gc --force` would free only {} (what HEAD holds stays): raise max_store_bytes in rewind.toml to {} or more, or let labelled checkpoints go (`keep_labeled = false` under [retention]); no checkpoint was taken",
            human_bytes(used),
            human_bytes(budget),
            human_bytes(f),
            crate::progress::human_bytes_above(used),
        );
    }
    if checkpoints == 0 {
        format!(
            "the ledger alone uses {}, over the store's budget (max_store_bytes = {}): raise max_store_bytes in rewind.toml (a few MiB is the least that works); no checkpoint was taken",
            human_bytes(used),
            human_bytes(budget)
        )
    } else {
        format!(
            "the store uses {}, over its budget (max_store_bytes = {}), and every remaining checkpoint ({checkpoints}) is protected: raise max_store_bytes in rewind.toml, or run `rewind gc --force`; no checkpoint was taken",
            human_bytes(used),
            human_bytes(budget)
        )
    }
}

/// `cause`'s message without its claim that nothing was changed: a rewind
/// that stopped half-way changed the tree (helper-34, D239).
pub(crate) fn without_nothing_changed(cause: &Error) -> String {
    let text = cause.to_string();
    for claim in ["; nothing was changed", ": nothing was changed"] {
        if let Some(rest) = text.strip_suffix(claim) {
            return rest.to_string();
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// D239: a recovery whose roll-forward ran out of space answers with
    /// the rewind it could not finish; a reader must still see a full disk
    /// in it, and go on (helper-35).
    #[test]
    fn a_full_disk_under_an_unfinished_rewind_is_a_full_disk() {
        let cause = Error::NoSpace {
            path: PathBuf::from("/ws/.rewind/tmp/x"),
            shortfall: None,
            storing: None,
        };
        let unfinished = Error::Unfinished {
            op: "rewind",
            target: "a".into(),
            safety: "b".into(),
            saved: None,
            cause: Box::new(cause),
        };
        assert!(unfinished.is_no_space());
        assert_eq!(unfinished.code(), "NO_SPACE");
        let text = unfinished.to_string();
        assert!(
            text.contains("half-rewound") && !text.contains("nothing was changed"),
            "{text}"
        );
        assert!(!Error::NothingToUndo.is_no_space());
    }

    /// D332: the file a full disk stopped a capture at is named, by
    /// the checkpoint and by a first checkpoint; a disk out of inodes
    /// keeps its own reason, and other errors pass as they are.
    #[test]
    fn a_full_disk_names_the_file_it_was_storing() {
        let full = || Error::NoSpace {
            path: PathBuf::from("/nonexistent/ws/.rewind/tmp"),
            shortfall: None,
            storing: None,
        };
        let said = full().storing(b"logs/run.log", 3 << 20).to_string();
        assert!(
            said.contains("to store a copy of logs/run.log (3.0 MiB), which this filesystem cannot clone: free some space"),
            "{said}"
        );
        let Error::NoSpace { storing, .. } = full().storing(b"big", 5 << 20) else {
            panic!("still NoSpace");
        };
        let first = Error::NoSpaceForFirstCheckpoint {
            path: PathBuf::from("/nonexistent/ws/.rewind/tmp"),
            storing,
        }
        .to_string();
        assert!(
            first.contains("cannot clone (it stopped at big (5.0 MiB)): free"),
            "{first}"
        );
        let inodes = Error::NoSpace {
            path: PathBuf::from("/nonexistent"),
            shortfall: Some(Shortfall::Inodes {
                needed: None,
                free: 0,
            }),
            storing: None,
        };
        assert!(!inodes.storing(b"big", 1).to_string().contains("big"));
        assert!(matches!(
            Error::NothingToUndo.storing(b"big", 1),
            Error::NothingToUndo
        ));
    }

    /// D225: a lock whose recorded pid has exited is not blamed on it.
    #[test]
    fn a_lock_holders_pid_is_named_only_while_it_runs() {
        let path = Path::new("/w/.rewind/lock");
        let me = std::process::id();
        assert_eq!(
            locked_by(Some(me), path),
            format!("another rewind process (pid {me})")
        );
        // Above any pid_max: no process has it.
        let gone = locked_by(Some(4_194_399), path);
        assert!(
            gone.contains("has exited") && gone.contains("fuser -v /w/.rewind/lock"),
            "{gone}"
        );
        assert_eq!(locked_by(None, path), "another rewind process");
    }
}
