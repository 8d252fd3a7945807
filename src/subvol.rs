//! `rewind init --subvolume DIR`: turn an ordinary directory on btrfs into
//! a subvolume in place, keeping every file, mode, owner, symlink, hard
//! link, xattr and mtime.
//!
//! Before it makes anything it refuses, naming the path, what it could not
//! carry over faithfully or take out of the old tree afterwards
//! (`survey`): a mount point or nested subvolume below DIR (the copy
//! would not cross it and the cleanup would empty it), an immutable or
//! append-only entry (the cleanup could not remove it), a FIFO, socket or
//! device, and, without root, an entry another user owns (only root can
//! give it back its owner). DIR inside another workspace is refused too:
//! that workspace's checkpoints would skip the subvolume as a mount point.
//!
//! A directory cannot become a subvolume, and rename cannot move files
//! across subvolumes, so: create a subvolume beside DIR, fill it with
//! reflink clones (O(1) per file, no data copied), then swap the two names
//! atomically with `renameat2(RENAME_EXCHANGE)` and remove the old tree.
//! `.rewind/` stays an ordinary directory inside the subvolume: rewinds
//! rename files from `.rewind/tmp/` into the tree, and rename cannot cross
//! a subvolume boundary (D45).
//!
//! Crash safety: until the swap, DIR is untouched and the half-filled
//! subvolume sits under a temporary name; after it, DIR is the complete
//! subvolume and the old tree sits under that name. Either way the next
//! run finds the temporary name, tells which case it is (a subvolume, or a
//! plain directory), removes it, and carries on. A SIGKILL at any named
//! point (`subvol:*`) leaves DIR either the old directory or the new
//! subvolume, complete.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rewind_platform::{
    CloneOutcome, Dir, EntryKind, FsInfo, FsKind, RenameMode, Within, Xattr, clone_or_copy,
};
use serde::Serialize;

use crate::capture::STATE_DIR;
use crate::error::{Error, Result};
use crate::progress::Progress;

#[derive(Debug, Default, Serialize)]
pub struct Converted {
    pub path: String,
    /// It was a subvolume already: nothing to do.
    pub already: bool,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub bytes: u64,
    /// Files whose bytes were copied, not cloned (btrfs refused the clone).
    pub copied: u64,
    /// Left by an interrupted earlier run and removed: `partial-subvolume`
    /// (before the swap) or `old-tree` (after it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleaned_up: Option<&'static str>,
    /// The existing history was moved into `.rewind/state/`, where
    /// snapshots do not copy it (D126).
    pub history_moved: bool,
    /// Something in the old tree changed after the copy was checked (a
    /// write in the instant before the swap, or through a file held open
    /// across it): the old tree is kept here instead of removed (D240).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_old_tree: Option<String>,
}

const TEMP_SUFFIX: &str = ".rewind-subvol";

/// The name the new subvolume is filled under, beside DIR: `.DIR.rewind-subvol`,
/// or for a name too long to take the suffix, one derived from its hash (a
/// later run must find the same name to clean up after a crash).
fn temp_name(base: &OsStr) -> OsString {
    let mut n = OsString::from(".");
    if base.len() + 1 + TEMP_SUFFIX.len() <= NAME_MAX {
        n.push(base);
    } else {
        let h = crate::hash::Hash::of(base.as_bytes()).to_hex();
        n.push(&h[..16]);
    }
    n.push(TEMP_SUFFIX);
    n
}

/// What to say when a conversion of `root` was stopped before it finished
/// (Ctrl-C, a kill): its temporary name beside `root` holds a partial copy
/// (stopped before the swap) or what is left of the old tree (after it),
/// which only `init --subvolume` run again removes. Nothing said it
/// (helper-92: 6 of 16 runs stopped after the swap, ~45,000 entries
/// left), so `checkpoint` and `doctor` do (D352).
pub fn interrupted_conversion(root: &Path) -> Option<String> {
    let (parent, base) = (root.parent()?, root.file_name()?);
    let temp = parent.join(temp_name(base));
    temp.symlink_metadata().ok()?;
    Some(format!(
        "{} beside the workspace is left from an `init --subvolume` that was stopped before it finished; `rewind init --subvolume {}` run again finishes the conversion and removes it",
        crate::names::human_os_path(&temp),
        crate::names::pasteable_word(&crate::names::human_os_path(root))
    ))
}

/// The longest file name Linux filesystems take.
const NAME_MAX: usize = 255;

/// How deep a tree `init --subvolume` carries over. Deeper than the
/// capture walks (`capture::MAX_DEPTH`): a conversion must keep every
/// file, captured or not.
const CONVERT_MAX_DEPTH: usize = 16 << 10;

/// Stack of the thread a conversion runs on: its survey and copy recurse
/// a level per directory (~1.4 KiB a level measured), and on the main
/// thread's 8 MiB a 5,800-level tree aborted the command (exit 134,
/// helper-46, D269). Reserved address space, backed only where touched.
const CONVERT_STACK: usize = 256 << 20;

/// `show_progress`: a line counting the entries cloned, on a terminal
/// (a million files: a minute, helper-89).
pub fn convert(dir: &Path, show_progress: bool) -> Result<Converted> {
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("rewind-convert".into())
            .stack_size(CONVERT_STACK)
            .spawn_scoped(s, || {
                let progress = Progress::new("cloning into the subvolume", show_progress);
                convert_here(dir, &progress)
            })
            .map_err(|e| Error::os(rewind_platform::Error::new("start a thread for", dir, e)))?;
        worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn convert_here(dir: &Path, progress: &Progress) -> Result<Converted> {
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::os(rewind_platform::Error::new("open", dir, e)))?;
    let (Some(parent_path), Some(base)) = (dir.parent(), dir.file_name()) else {
        return Err(Error::InvalidPath {
            path: dir,
            reason: "the filesystem root cannot be converted: name a directory below it".into(),
        });
    };
    let parent = Dir::open(parent_path).map_err(Error::os)?;
    let mut out = Converted {
        path: dir.display().to_string(),
        ..Converted::default()
    };
    let tmp = temp_name(base);
    out.cleaned_up = recover(&parent, &tmp)?;
    let target = Dir::open(&dir).map_err(Error::os)?;
    if FsInfo::of(&target).map_err(Error::os)?.kind != FsKind::Btrfs {
        return Err(Error::InvalidPath {
            path: dir,
            reason: "not on btrfs, where alone subvolumes exist (on XFS the walk engine clones files instead)".into(),
        });
    }
    if rewind_platform::is_subvolume(&target).map_err(Error::os)? {
        out.already = true;
        // Finishes a move a crash interrupted after the swap below.
        out.history_moved = move_history_into_state_subvolume(&dir)?;
        return Ok(out);
    }
    refuse_inside_workspace(&dir)?;
    refuse_if_busy(&dir)?;
    let owner = Owner::me();
    let root = target.meta().map_err(Error::os)?;
    if parent.is_locked_at(base).map_err(Error::os)? {
        return Err(refused(&dir, LOCKED));
    }
    owner.check(&dir, &root)?;
    // An active swap file can be neither moved nor removed: the old
    // tree's removal failed after the swap (helper-37, D246).
    if let Some(swap) = rewind_platform::swap_files_under(&dir).first() {
        return Err(refused(
            swap,
            &format!(
                "is an active swap file, which btrfs lets nobody move, remove or snapshot: `swapoff {}`, move it out of the directory, and retry",
                crate::names::shell_word(&swap.to_string_lossy())
            ),
        ));
    }
    survey(
        &target,
        target.within().map_err(Error::os)?,
        &owner,
        1,
        None,
    )?;
    // Writers of an existing history wait while its files are cloned.
    let _lock = lock_history(&dir)?;

    // What is written into DIR while it is copied would be lost with the
    // old tree: a write the copy may have missed (its ctime at or past the
    // new subvolume's) makes the copy start over, up to three times
    // (helper-34, D240).
    let mut tries = 0;
    let since = loop {
        rewind_platform::create_subvolume(&parent, &tmp).map_err(|e| {
            if e.is_permission_denied() {
                // It said only "Permission denied" on a path never seen
                // (helper-42, D262).
                refused(
                    parent_path,
                    &format!(
                        "is not writable by this user (uid {}): the new subvolume is made beside {} and then takes its name, so its parent directory must be writable; convert as its owner or root",
                        rewind_platform::euid(),
                        dir.display()
                    ),
                )
            } else {
                Error::os(e)
            }
        })?;
        crate::failpoint::hit("subvol:created");
        let copy = parent.open_dir(&tmp).map_err(Error::os).and_then(|new| {
            let since = new.meta().map_err(Error::os)?.ctime_ns;
            let mut counts = Converted {
                path: out.path.clone(),
                cleaned_up: out.cleaned_up,
                ..Converted::default()
            };
            let mut links = HashMap::new();
            copy_tree(&target, &new, &owner, &mut counts, &mut links, progress)?;
            progress.finish();
            // DIR's own flag too, after its entries (helper-38).
            rewind_platform::match_nocow(&target, &new);
            copy_meta_dir(&target, &parent, &tmp, &new, &root, &owner)?;
            new.syncfs().map_err(Error::os)?;
            crate::failpoint::hit("subvol:copied");
            Ok((since, counts, changed_since(&target, &dir, since)?))
        });
        match copy {
            Ok((since, counts, None)) => {
                out = counts;
                break since;
            }
            Ok((_, _, Some(changed))) => {
                let _ = remove_subvolume(&parent, &tmp);
                tries += 1;
                if tries == 3 {
                    return Err(refused(
                        &changed,
                        "changed while the directory was copied into the subvolume, three times over: stop what writes into it and retry",
                    ));
                }
            }
            Err(e) => {
                // Nothing was changed: DIR is untouched; drop the half-made copy.
                let _ = remove_subvolume(&parent, &tmp);
                return Err(e);
            }
        }
    };
    parent
        .rename(base, &parent, &tmp, RenameMode::Exchange)
        .map_err(Error::os)?;
    parent.fsync().map_err(Error::os)?;
    crate::failpoint::hit("subvol:swapped");
    // Written between the last check and the swap, or through a file held
    // open across it: the old tree is kept, and named.
    let old = parent.open_dir(&tmp).map_err(Error::os)?;
    if changed_below(&old, &parent.path().join(&tmp), since)?.is_some() {
        drop(old);
        let mut n = 0;
        let kept = loop {
            let kept = kept_name(base, n);
            match parent.rename(&tmp, &parent, &kept, RenameMode::NoReplace) {
                Ok(()) => break kept,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(Error::os(e)),
            }
        };
        out.kept_old_tree = Some(parent.path().join(&kept).display().to_string());
    } else {
        drop(old);
        parent.remove_all(&tmp).map_err(Error::os)?;
    }
    out.history_moved = move_history_into_state_subvolume(&dir)?;
    Ok(out)
}

/// The first path at or below `dir` (the directory at `path`) whose
/// ctime is at or past `since_ns`: changed from then on.
fn changed_since(dir: &Dir, path: &Path, since_ns: i64) -> Result<Option<PathBuf>> {
    if dir.meta().map_err(Error::os)?.ctime_ns >= since_ns {
        return Ok(Some(path.to_path_buf()));
    }
    changed_below(dir, path, since_ns)
}

/// [`changed_since`] for what `dir` holds, not `dir` itself: after the
/// swap the old tree's own ctime moved with its rename. A file made in it
/// since has its own; one removed from it is in the new tree still.
fn changed_below(dir: &Dir, path: &Path, since_ns: i64) -> Result<Option<PathBuf>> {
    for name in dir.entries().map_err(Error::os)? {
        let meta = match dir.stat_at(&name) {
            Ok(m) => m,
            // Gone since the listing: changed.
            Err(e) if e.is_not_found() => return Ok(Some(path.join(&name))),
            Err(e) => return Err(Error::os(e)),
        };
        if meta.ctime_ns >= since_ns {
            return Ok(Some(path.join(&name)));
        }
        if meta.kind == EntryKind::Dir {
            let sub = dir.open_dir(&name).map_err(Error::os)?;
            if let Some(p) = changed_since(&sub, &path.join(&name), since_ns)? {
                return Ok(Some(p));
            }
        }
    }
    Ok(None)
}

/// Where the old tree is kept when it changed after the last check:
/// `.DIR.rewind-before-subvolume` (then `-1`, `-2`, ... when taken), or a
/// name derived from DIR's hash when that would be too long. Never the
/// temporary name, which the next run removes as a crash's leftover.
fn kept_name(base: &OsStr, n: u32) -> OsString {
    const KEPT: &str = ".rewind-before-subvolume";
    let mut name = OsString::from(".");
    if base.len() + 1 + KEPT.len() + 4 <= NAME_MAX {
        name.push(base);
    } else {
        name.push(&crate::hash::Hash::of(base.as_bytes()).to_hex()[..16]);
    }
    name.push(KEPT);
    if n > 0 {
        name.push(format!("-{n}"));
    }
    name
}

/// A workspace made before DIR was a subvolume keeps its ledger in
/// `.rewind/` itself, which every snapshot then copies: the
/// whole history again, per checkpoint, held until the last snapshot goes.
/// A new subvolume workspace keeps them in `.rewind/state/`, a nested
/// subvolume that snapshots skip (D50). Move them there (D126): fold the
/// WAL, clone the ledger into the new subvolume under a temporary name,
/// make it durable and rename it into place (from then on it is the
/// ledger: `meta_path` prefers it), then remove the old files. A history
/// with snapshots is refused before anything moves (see below).
/// A crash before the rename leaves the old ledger in use; after it, the
/// next run removes the leftovers. Returns whether anything moved.
fn move_history_into_state_subvolume(dir: &Path) -> Result<bool> {
    use crate::workspace::{LEDGER_FILE, STATE_SUBVOLUME};
    let state_path = dir.join(STATE_DIR);
    let Ok(state) = Dir::open(&state_path) else {
        return Ok(false);
    };
    let flat = OsStr::new(LEDGER_FILE);
    let leftovers = |suffix: &str| {
        let mut n = OsString::from(LEDGER_FILE);
        n.push(suffix);
        n
    };
    if state.stat_at(flat).is_err() {
        return Ok(false);
    }
    let _lock = lock_history(dir)?;
    let nested_ledger = state_path.join(STATE_SUBVOLUME).join(LEDGER_FILE);
    if !nested_ledger.exists() {
        // Snapshots taken while the history was still here cannot follow it:
        // btrfs refuses to rename a read-only snapshot into another subvolume
        // (EROFS), and a ledger moved without them names snapshots that are
        // gone (D135). Refused before anything moves; this build never takes
        // them (the walk engine checkpoints such a workspace).
        if let Ok(snaps) = state.open_dir(OsStr::new(crate::snapshot::SNAPSHOT_DIR)) {
            let held = snaps.entries().map_err(Error::os)?.len();
            if held > 0 {
                return Err(Error::InvalidPath {
                    path: state_path.join(crate::snapshot::SNAPSHOT_DIR),
                    reason: format!(
                        "holds {held} btrfs snapshot{} taken before the history had a subvolume of its own; btrfs cannot move a read-only snapshot into one, so the history stays in {} and the walk engine takes the checkpoints (nothing was changed)",
                        if held == 1 { "" } else { "s" },
                        state_path.display()
                    ),
                });
            }
        }
        // Everything into the main file, so that it alone is the ledger.
        let db = state_path.join(LEDGER_FILE);
        let conn = rusqlite::Connection::open(&db).map_err(crate::error::db_err(&db))?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(crate::error::db_err(&db))?;
        drop(conn);
        match rewind_platform::create_subvolume(&state, OsStr::new(STATE_SUBVOLUME)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::os(e)),
        }
        let nested = state
            .open_dir(OsStr::new(STATE_SUBVOLUME))
            .map_err(Error::os)?;
        let tmp = OsStr::new("ledger.db.moving");
        let _ = nested.unlink(tmp);
        let (src, meta) = state.open_read(flat).map_err(Error::os)?;
        let dst = nested
            .create_new(tmp, meta.mode & 0o777)
            .map_err(Error::os)?;
        let io = |e| Error::os(rewind_platform::Error::new("copy", &nested_ledger, e));
        clone_or_copy(src.as_fd(), dst.as_fd()).map_err(io)?;
        dst.sync_all().map_err(io)?;
        let _ = nested.set_owner(tmp, meta.uid, meta.gid);
        nested
            .rename(tmp, &nested, flat, RenameMode::NoReplace)
            .map_err(Error::os)?;
        nested.fsync().map_err(Error::os)?;
        crate::failpoint::hit("subvol:ledger-moved");
    }
    // The nested ledger is the ledger: what is left in `.rewind/` is stale.
    for name in [flat.to_owned(), leftovers("-wal"), leftovers("-shm")] {
        let _ = state.unlink(&name);
    }
    let _ = state.rmdir(OsStr::new(crate::snapshot::SNAPSHOT_DIR));
    state.fsync().map_err(Error::os)?;
    Ok(true)
}

/// Finish or undo an interrupted conversion: the temporary name holds a
/// partial subvolume (before the swap) or the old tree (after it).
fn recover(parent: &Dir, tmp: &OsStr) -> Result<Option<&'static str>> {
    let found = match parent.open_dir(tmp) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(Error::os(e)),
    };
    if rewind_platform::is_subvolume(&found).map_err(Error::os)? {
        drop(found);
        remove_subvolume(parent, tmp)?;
        Ok(Some("partial-subvolume"))
    } else {
        drop(found);
        parent.remove_all(tmp).map_err(Error::os)?;
        Ok(Some("old-tree"))
    }
}

/// Delete the half-made subvolume of an interrupted or failed conversion.
/// Without root and without the `user_subvol_rm_allowed` mount option the
/// ioctl is refused, but its owner may empty it and `rmdir` it (a left-over
/// subvolume would block every retry).
pub(crate) fn remove_subvolume(parent: &Dir, name: &OsStr) -> Result<()> {
    match rewind_platform::delete_subvolume(parent, name) {
        Err(e) if e.is_permission_denied() => parent.remove_all(name).map_err(Error::os),
        r => r.map_err(Error::os),
    }
}

/// A process with its working directory, an open file or a mapping inside
/// `dir` would keep using the old tree after the swap, and its later writes
/// would be lost with it: refuse, naming them.
fn refuse_if_busy(dir: &Path) -> Result<()> {
    let me = std::process::id();
    let busy = rewind_platform::holders(dir, |pid, _| pid == me);
    if busy.is_empty() {
        return Ok(());
    }
    Err(Error::Busy {
        path: dir.to_path_buf(),
        reason: format!(
            "is in use: {}; cd them out (a shell inside: `cd ..`), close the files or stop them, and retry; nothing was changed",
            busy.join(", ")
        ),
    })
}

/// A subvolume inside a workspace is a mount point to it: its checkpoints
/// would skip everything below, and a rewind could not move files in.
fn refuse_inside_workspace(dir: &Path) -> Result<()> {
    match dir.ancestors().skip(1).find(|a| a.join(STATE_DIR).is_dir()) {
        None => Ok(()),
        Some(ws) => Err(refused(
            dir,
            &format!(
                "is inside the workspace {}, whose checkpoints would skip a subvolume here; convert {} instead",
                ws.display(),
                ws.display()
            ),
        )),
    }
}

/// A refusal before anything was made.
fn refused(path: &Path, why: &str) -> Error {
    Error::InvalidPath {
        path: path.to_path_buf(),
        reason: format!("{why}; nothing was changed"),
    }
}

const LOCKED: &str = "is immutable or append-only (chattr +i/+a): the old tree could not be removed after the swap; `chattr -i -a` it and retry";

/// Who runs the conversion: root carries every owner over; anyone else
/// only entries that are theirs, in groups they belong to (a chown to
/// anything else is refused to them).
struct Owner {
    root: bool,
    uid: u32,
    groups: Vec<u32>,
}

impl Owner {
    fn me() -> Owner {
        let (uid, groups) = rewind_platform::credentials();
        Owner {
            root: rewind_platform::is_root(),
            uid,
            groups,
        }
    }

    fn check(&self, path: &Path, meta: &rewind_platform::Meta) -> Result<()> {
        if self.root || (meta.uid == self.uid && self.groups.contains(&meta.gid)) {
            return Ok(());
        }
        Err(refused(
            path,
            &format!(
                "belongs to uid {} gid {}: only root can keep its owner in the copy; run `rewind init --subvolume` as root",
                meta.uid, meta.gid
            ),
        ))
    }

    /// The xattrs a copy carries: `user.*` and ACLs, which an owner may
    /// set, and as root `trusted.*` and `security.*` (file capabilities,
    /// security labels). Others get what the kernel gives a new file.
    fn carries(&self) -> impl Fn(&[u8]) -> bool + '_ {
        |n: &[u8]| {
            n.starts_with(b"user.")
                || n == b"system.posix_acl_access"
                || n == b"system.posix_acl_default"
                || (self.root && (n.starts_with(b"trusted.") || n.starts_with(b"security.")))
        }
    }
}

/// Walk DIR once before making anything, refusing what the conversion
/// could not carry over or clean up (module docs), so that a refusal
/// leaves nothing behind.
///
/// A mount point is told by its device or, where the kernel gives it, its
/// mount id: a directory bind-mounted from the same filesystem has the
/// same device, and was copied and then emptied with the old tree, its
/// files outside DIR with it (helper-37, D245).
///
/// `chain` is the directory below DIR that `dir` is in: a tree too deep
/// to carry is refused naming it, not a path tens of KiB long.
fn survey(dir: &Dir, top: Within, owner: &Owner, depth: usize, chain: Option<&Path>) -> Result<()> {
    // Something this user cannot read cannot be copied: refused before
    // anything is made, with the fix.
    let unreadable = |e: rewind_platform::Error| match e.kind() {
        std::io::ErrorKind::PermissionDenied => refused(
            &e.path,
            "cannot be read by this user, so it cannot be copied into the subvolume: `chmod u+rx` it (or run as root) and retry",
        ),
        _ => Error::os(e),
    };
    for name in dir.entries().map_err(unreadable)? {
        let (meta, mount) = dir.stat_mount_at(&name).map_err(unreadable)?;
        let path = dir.path().join(&name);
        if !top.holds(&meta, mount) {
            return Err(refused(
                &path,
                "is a mount point or a nested subvolume: the copy would not cross it and removing the old tree would empty it; unmount it or move it out of the directory, and retry",
            ));
        }
        owner.check(&path, &meta)?;
        match meta.kind {
            EntryKind::Dir | EntryKind::File => {
                if dir.is_locked_at(&name).map_err(Error::os)? {
                    return Err(refused(&path, LOCKED));
                }
                if meta.kind == EntryKind::Dir {
                    let chain = chain.unwrap_or(&path);
                    if depth > CONVERT_MAX_DEPTH {
                        return Err(refused(
                            chain,
                            &format!(
                                "holds directories nested more than {CONVERT_MAX_DEPTH} deep, deeper than a conversion carries: move it out of the directory (it is not captured past {} levels anyway) and retry",
                                crate::capture::MAX_DEPTH
                            ),
                        ));
                    }
                    survey(
                        &dir.open_dir(&name).map_err(unreadable)?,
                        top,
                        owner,
                        depth + 1,
                        Some(chain),
                    )?;
                }
            }
            EntryKind::Symlink => {}
            other => {
                return Err(refused(
                    &path,
                    &format!(
                        "is a {}: it cannot be carried into a subvolume; remove it (it is never captured anyway) and retry",
                        other.as_str()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn lock_history(dir: &Path) -> Result<Option<rewind_platform::LockFile>> {
    let path = dir.join(STATE_DIR).join("lock");
    let Ok(state) = Dir::open(dir).and_then(|d| d.open_dir(std::ffi::OsStr::new(STATE_DIR))) else {
        return Ok(None);
    };
    match rewind_platform::LockFile::acquire_in(&state, "lock", std::time::Duration::from_secs(10))
        .map_err(Error::os)?
    {
        Ok(l) => Ok(Some(l)),
        Err(pid) => Err(Error::Locked { path, pid }),
    }
}

/// Clone `src`'s entries into `dst`. Hard links stay hard links (keyed by
/// inode). [`survey`] already refused what cannot be carried over.
fn copy_tree(
    src: &Dir,
    dst: &Dir,
    owner: &Owner,
    out: &mut Converted,
    links: &mut HashMap<(u64, u64), (PathBuf, OsString)>,
    progress: &Progress,
) -> Result<()> {
    let mut names = src.entries().map_err(Error::os)?;
    names.sort();
    for name in names {
        progress.inc(1);
        let meta = src.stat_at(&name).map_err(Error::os)?;
        match meta.kind {
            EntryKind::Dir => {
                dst.mkdir(&name, 0o700).map_err(Error::os)?;
                let (s, d) = (
                    src.open_dir(&name).map_err(Error::os)?,
                    dst.open_dir(&name).map_err(Error::os)?,
                );
                copy_tree(&s, &d, owner, out, links, progress)?;
                // After its entries, which would otherwise inherit it.
                rewind_platform::match_nocow(&s, &d);
                copy_meta_dir(&s, dst, &name, &d, &meta, owner)?;
                out.dirs += 1;
            }
            EntryKind::File => {
                if meta.nlink > 1
                    && let Some((first_dir, first_name)) = links.get(&(meta.dev, meta.ino))
                {
                    let from = Dir::open(first_dir).map_err(Error::os)?;
                    from.link(first_name, dst, &name).map_err(Error::os)?;
                    out.hard_links += 1;
                    continue;
                }
                let (f, _) = src.open_read(&name).map_err(Error::os)?;
                let to = dst.create_new(&name, 0o600).map_err(Error::os)?;
                let io = |op: &'static str, e: std::io::Error| {
                    Error::os(rewind_platform::Error::new(op, dst.path().join(&name), e))
                };
                rewind_platform::match_nocow(&f, &to);
                let how = clone_or_copy(f.as_fd(), to.as_fd()).map_err(|e| io("clone", e))?;
                if how == CloneOutcome::Copied {
                    out.copied += 1;
                }
                // Owner first: a chown drops setuid/setgid and file
                // capabilities, which the mode and xattrs then put back.
                dst.set_owner(&name, meta.uid, meta.gid)
                    .map_err(Error::os)?;
                let xattrs = Xattr::list_where(f.as_fd(), owner.carries())
                    .map_err(|e| io("read xattrs", e))?;
                Xattr::add(to.as_fd(), &xattrs).map_err(|e| io("set xattrs", e))?;
                rewind_platform::file_set_mode(&to, meta.mode).map_err(|e| io("chmod", e))?;
                rewind_platform::file_set_mtime(&to, meta.mtime_ns)
                    .map_err(|e| io("set mtime", e))?;
                if meta.nlink > 1 {
                    links.insert(
                        (meta.dev, meta.ino),
                        (dst.path().to_path_buf(), name.clone()),
                    );
                }
                out.files += 1;
                out.bytes += meta.size;
                crate::failpoint::hit("subvol:file-cloned");
            }
            EntryKind::Symlink => {
                let target = src.readlink(&name).map_err(Error::os)?;
                dst.symlink(&target, &name).map_err(Error::os)?;
                dst.set_owner(&name, meta.uid, meta.gid)
                    .map_err(Error::os)?;
                dst.set_mtime(&name, EntryKind::Symlink, meta.mtime_ns)
                    .map_err(Error::os)?;
                out.symlinks += 1;
            }
            other => {
                // The survey refused it; the tree changed since.
                return Err(refused(
                    &src.path().join(&name),
                    &format!("appeared as a {} during the conversion", other.as_str()),
                ));
            }
        }
    }
    Ok(())
}

/// A directory's owner, xattrs, mode and mtime (after its children are
/// in), set on `dst` (`dst_parent`/`name`) from `src` and its stat `meta`.
fn copy_meta_dir(
    src: &Dir,
    dst_parent: &Dir,
    name: &OsStr,
    dst: &Dir,
    meta: &rewind_platform::Meta,
    owner: &Owner,
) -> Result<()> {
    dst_parent
        .set_owner(name, meta.uid, meta.gid)
        .map_err(Error::os)?;
    let xattrs = Xattr::list_where(src.as_fd(), owner.carries())
        .map_err(|e| Error::os(rewind_platform::Error::new("read xattrs", src.path(), e)))?;
    Xattr::add(dst.as_fd(), &xattrs)
        .map_err(|e| Error::os(rewind_platform::Error::new("set xattrs", dst.path(), e)))?;
    dst_parent
        .set_mode(name, EntryKind::Dir, meta.mode)
        .map_err(Error::os)?;
    dst_parent
        .set_mtime(name, EntryKind::Dir, meta.mtime_ns)
        .map_err(Error::os)?;
    Ok(())
}
