//! The `btrfs` engine (DESIGN §2): when the workspace root is a btrfs
//! subvolume, a checkpoint is a read-only snapshot of it, taken in O(1)
//! and acknowledged as soon as it exists. The manifest (the Merkle tree
//! that `list`, `diff`, `rewind` and the chain read) is built from the
//! snapshot afterwards, by the walk engine's capture with its stat cache,
//! in a detached process (`rewind finish-manifests`), or by the next
//! command that needs it, whichever comes first.
//!
//! Crash between acknowledgement and manifest: the snapshot and the
//! pending row are both durable before the acknowledgement, and the
//! snapshot is read-only, so building the manifest later gives exactly the
//! tree building it at once would have (D47). Commands that read
//! checkpoints call `finish_pending` first; writers of the stat cache
//! hold `manifest.lock` (beside the ledger) while they do.
//!
//! Snapshots live in `.rewind/state/snapshots/<id>`. A nested subvolume is not
//! part of its parent's snapshots, so history never snapshots itself.
//! Every checkpoint this engine makes has its own snapshot, which is the
//! source of clones when a rewind restores it; gc deletes the snapshots of
//! the checkpoints it prunes.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rewind_platform::{Dir, FsInfo, FsKind, LockFile};
use serde::Serialize;

use crate::capture::Sink;
use crate::chain::Fields;
use crate::error::{Error, Result};
use crate::ledger::Pending;
use crate::workspace::{
    NewCheckpoint, Workspace, content_changes, insert_checkpoint, write_capture,
};
use crate::{failpoint, ids, time};

pub const SNAPSHOT_DIR: &str = "snapshots";
const MANIFEST_LOCK: &str = "manifest.lock";
/// Log of the detached manifest builder (its stderr).
pub const FINISHER_LOG: &str = "finisher.log";
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// How a workspace detects changes (DESIGN §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Walk,
    Btrfs,
    /// Mounted with `rewind mount`: a walk guided by the daemon's dirty set.
    Fuse,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Walk => "walk",
            Engine::Btrfs => "btrfs",
            Engine::Fuse => "fuse",
        }
    }

    /// The engine for a workspace root, and why. `REWIND_ENGINE=walk`
    /// forces the walk engine (benchmarks compare the two on one tree).
    pub fn choose(root: &Dir, fs: &FsInfo) -> (Engine, &'static str) {
        if std::env::var("REWIND_ENGINE").is_ok_and(|v| v == "walk") {
            return (Engine::Walk, "REWIND_ENGINE=walk");
        }
        // Whether clones work is `doctor`'s own line: an XFS made without
        // reflink has none, which "walk with clones" here contradicted
        // (helper-55).
        if fs.kind == FsKind::Xfs {
            return (
                Engine::Walk,
                match (
                    rewind_platform::is_root(),
                    crate::workspace::bulkstat_turned_off(),
                ) {
                    (true, false) => {
                        "XFS: stat-cache walk; as root, a bulk stat of the tree's inode chunks replaces the stat per path (REWIND_BULKSTAT=0 turns it off)"
                    }
                    (true, true) => {
                        "XFS: stat-cache walk, a stat per path (REWIND_BULKSTAT=0 turns off the bulk stat root would use)"
                    }
                    (false, _) => {
                        "XFS: stat-cache walk, a stat per path (as root, a bulk stat of the tree's inode chunks would replace it)"
                    }
                },
            );
        }
        if fs.kind != FsKind::Btrfs {
            return (
                Engine::Walk,
                "not btrfs: stat-cache walk, clones where the filesystem has them",
            );
        }
        match rewind_platform::is_subvolume(root) {
            Ok(true) => (
                Engine::Btrfs,
                "the workspace root is a btrfs subvolume: O(1) read-only snapshots",
            ),
            _ => (
                Engine::Walk,
                "btrfs, but the workspace root is not a subvolume (`rewind init --subvolume DIR` makes it one)",
            ),
        }
    }
}

/// `.rewind/state/snapshots/`, created on first use.
pub(crate) fn snapshots_dir(ws: &Workspace) -> Result<Dir> {
    let name = OsStr::new(SNAPSHOT_DIR);
    let dir = ws
        .meta_dir()
        .open_or_make_dir(name, 0o755)
        .map_err(Error::os)?;
    // Root's in a user's history: theirs, or they cannot delete a
    // snapshot in it (D148).
    if let Some(h) = rewind_platform::Heir::of(ws.meta_dir()).map_err(Error::os)? {
        h.give_fd(&dir, dir.path()).map_err(Error::os)?;
    }
    Ok(dir)
}

/// Snapshot the live tree, read-only, as `.rewind/state/snapshots/<id>`.
pub(crate) fn take(ws: &Workspace, id: &str) -> Result<()> {
    let _t = crate::trace::span("btrfs snapshot");
    let dir = snapshots_dir(ws)?;
    rewind_platform::snapshot(ws.root_dir(), &dir, OsStr::new(id), true).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            Error::Btrfs {
                path: ws.root_path().to_owned(),
                reason: "creating a snapshot was refused (permission denied): the workspace subvolume must belong to you; set REWIND_ENGINE=walk to use the walk engine instead".into(),
            }
        } else if e.is_text_file_busy() {
            // btrfs refuses to snapshot a subvolume with an active swap
            // file; ETXTBSY alone named a snapshot path that never
            // existed (helper-37, D246).
            let swaps = rewind_platform::swap_files_under(ws.root_path());
            let named = swaps
                .iter()
                .map(|p| crate::names::shell_word(&p.to_string_lossy()))
                .collect::<Vec<_>>();
            let fix = match named.first() {
                Some(f) => format!(
                    "{} is an active swap file; `swapoff {f}` and move it out of the workspace",
                    named.join(", ")
                ),
                None => "find it in /proc/swaps, `swapoff` it and move it out of the workspace".into(),
            };
            Error::Btrfs {
                path: ws.root_path().to_owned(),
                reason: format!(
                    "btrfs cannot snapshot a subvolume that holds an active swap file (nothing was changed): {fix}; or set REWIND_ENGINE=walk to use the walk engine"
                ),
            }
        } else {
            Error::os(e)
        }
    })
}

/// The snapshots directory, if it exists yet.
fn existing_snapshots_dir(ws: &Workspace) -> Result<Option<Dir>> {
    match ws.meta_dir().open_dir(OsStr::new(SNAPSHOT_DIR)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Error::os(e)),
    }
}

/// Where checkpoint `id`'s snapshot is (or was).
pub(crate) fn path_of(ws: &Workspace, id: &str) -> PathBuf {
    ws.meta_path().join(SNAPSHOT_DIR).join(id)
}

/// A checkpoint's snapshot, when it has one that can still be trusted
/// (present and read-only): the source of its content.
pub(crate) fn open(ws: &Workspace, id: &str) -> Result<Option<Dir>> {
    if !crate::ids::is_id(id) {
        return Ok(None);
    }
    let Some(dir) = existing_snapshots_dir(ws)? else {
        return Ok(None);
    };
    let snap = match dir.open_dir(OsStr::new(id)) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(Error::os(e)),
    };
    match rewind_platform::is_readonly_subvolume(&snap) {
        Ok(true) => Ok(Some(snap)),
        _ => Ok(None),
    }
}

/// The root hash of the tree a snapshot holds, walked and hashed (the
/// stat cache vouches for unchanged inodes). `message`: its progress
/// line's, none when empty (the caller shows its own).
pub(crate) fn root_of(
    ws: &Workspace,
    snap: &Dir,
    message: &'static str,
) -> Result<crate::hash::Hash> {
    Ok(walk_of(ws, snap, message)?.root)
}

/// The tree a snapshot holds, walked and hashed (see [`root_of`]), with
/// its nodes, for a diff against the manifest it should equal.
pub(crate) fn walk_of(
    ws: &Workspace,
    snap: &Dir,
    message: &'static str,
) -> Result<crate::capture::Capture> {
    ws.capture_dir(
        snap,
        false,
        crate::capture::Sink::HashOnly,
        i64::MIN,
        message,
    )
}

/// Whether the snapshot `snap` may be restored from as checkpoint `root`:
/// one never written since it was taken holds it by construction; one
/// written since (made writable and back, or moved by a balance) must
/// still hash to it.
pub(crate) fn holds(ws: &Workspace, snap: &Dir, root: &crate::hash::Hash) -> Result<bool> {
    if !rewind_platform::subvolume_written_since_creation(snap).map_err(Error::os)? {
        return Ok(true);
    }
    Ok(root_of(ws, snap, "verifying")? == *root)
}

/// Delete a checkpoint's snapshot; false when it had none.
pub(crate) fn delete(ws: &Workspace, id: &str) -> Result<bool> {
    if !crate::ids::is_id(id) {
        return Ok(false);
    }
    let Some(dir) = existing_snapshots_dir(ws)? else {
        return Ok(false);
    };
    delete_in(&dir, OsStr::new(id), ws.root_path(), "rewind gc")
}

/// Delete the snapshot `name` in `dir`, a workspace's snapshot directory
/// (of the workspace at `root`); `again`: the command to run once the
/// cause of a refusal is fixed. `false`: there is no such snapshot.
pub(crate) fn delete_in(dir: &Dir, name: &OsStr, root: &Path, again: &str) -> Result<bool> {
    let mut deleted = rewind_platform::delete_subvolume(dir, name);
    // A non-root user may delete a subvolume (`user_subvol_rm_allowed`)
    // only with write access to its root, which a read-only snapshot
    // refuses (EROFS): every gc failed, claiming nothing was changed
    // after it had pruned, and no snapshot space was ever freed
    // (helper-42, D257). Its owner may clear the flag first; it is going.
    if deleted.as_ref().is_err_and(|e| e.is_read_only()) && !rewind_platform::is_root() {
        if let Ok(snap) = dir.open_dir(name) {
            if rewind_platform::set_subvolume_readonly(&snap, false).is_ok() {
                deleted = rewind_platform::delete_subvolume(dir, name);
                // Still there (its own mode keeps the user out): read-only
                // again, as every snapshot is trusted to be (helper-43).
                if deleted.is_err() {
                    let _ = rewind_platform::set_subvolume_readonly(&snap, true);
                }
            }
        }
    }
    match deleted {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let path = dir.path().join(name);
            // Root was told to get root rights, and `chattr -i` alone
            // fails on a read-only snapshot (helper-28, D202).
            let reason = if dir.is_locked_at(name).unwrap_or(false) {
                let p = crate::names::shell_word(&path.to_string_lossy());
                format!(
                    "deleting a snapshot was refused: it is immutable or append-only (`lsattr -d {p}`), which not even root can delete; `sudo btrfs property set {p} ro false && sudo chattr -i -a {p}`, then run `{again}` again"
                )
            } else if rewind_platform::is_root() {
                format!("deleting a snapshot was refused ({e})")
            } else if rewind_platform::can_delete_snapshots(root) {
                // The option is there: the snapshot's own mode refuses
                // (helper-43: a workspace root of mode 555 when taken).
                let p = crate::names::shell_word(&path.to_string_lossy());
                format!(
                    "deleting a snapshot was refused ({e}): its top directory's mode keeps this user out (`ls -ld {p}`); `btrfs property set {p} ro false && chmod u+w {p}`, then run `{again}` again (or run it as root)"
                )
            } else {
                format!(
                    "deleting a snapshot was refused: as a non-root user btrfs needs the `user_subvol_rm_allowed` mount option (or run `{again}` as root)"
                )
            };
            Err(Error::Btrfs { path, reason })
        }
        // Still not deleted: said as a snapshot left (gc frees the rest),
        // not as an error that stops gc after it pruned.
        Err(e) => Err(Error::Btrfs {
            path: dir.path().join(name),
            reason: format!(
                "deleting a snapshot failed ({e}); run `{again}` again once that is fixed"
            ),
        }),
    }
}

/// The names in `.rewind/state/snapshots/`.
pub(crate) fn names(ws: &Workspace) -> Result<Vec<String>> {
    let Some(dir) = existing_snapshots_dir(ws)? else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = dir
        .entries()
        .map_err(Error::os)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    out.sort();
    Ok(out)
}

/// The seq and a fresh id for the next checkpoint (the root is not known
/// yet when the snapshot is named after the id). Stable while the caller
/// holds the workspace lock: nothing else allocates seqs.
fn reserve(ws: &Workspace) -> Result<(i64, String)> {
    let workspace_id = ws.ledger().meta("workspace_id")?.unwrap_or_default();
    ws.ledger().next_id(|seq, nonce| {
        ids::make_id(&workspace_id, seq, &crate::hash::Hash::default(), nonce)
    })
}

/// A snapshot of the live tree just taken under a reserved seq and id,
/// with the filesystem clock read just before it (the racy cut-off for
/// its manifest).
struct Taken {
    seq: i64,
    id: String,
    clock_ns: i64,
}

/// Reserve the next seq and id, with the filesystem clock before the
/// snapshot to be named after the id. Reserved, not committed: only this
/// process writes checkpoints while it holds the workspace lock, and an
/// orphan snapshot left by a crash before the commit is removed by gc
/// (or adopted, when it holds its own acknowledgement's record: D324).
fn take_new(ws: &Workspace) -> Result<Taken> {
    let clock_ns = ws.fs_clock_ns();
    let (seq, id) = reserve(ws)?;
    Ok(Taken { seq, id, clock_ns })
}

/// Acknowledge a checkpoint: snapshot the tree and record it as pending,
/// parent = HEAD, and make it HEAD. O(1) in the tree's size. The caller
/// holds the workspace lock.
pub(crate) fn acknowledge(
    ws: &mut Workspace,
    label: Option<&str>,
    kind: &str,
    reuse: bool,
) -> Result<Pending> {
    let taken = take_new(ws)?;
    let mut pending = Pending {
        seq: taken.seq,
        id: taken.id.clone(),
        parent: None,
        label: label.map(str::to_owned),
        kind: kind.to_owned(),
        created_at_ms: time::now_ms(),
        clock_ns: taken.clock_ns,
        reuse,
    };
    // Into the snapshot with the tree: the row's durability (D324).
    crate::acknowledged::write(ws, &pending)?;
    // Deleted again if the pending row is not committed (a full disk):
    // a snapshot no row names was found only by the next gc (D120).
    let snap = snapshot_as(ws, taken)?;
    failpoint::hit("btrfs:snapshotted");
    let _t = crate::trace::span("commit pending checkpoint");
    // No wait for the disk: the snapshot just made holds this row, and
    // the next command adopts it from there if a power cut loses it.
    pending.parent = ws.ledger_mut().write_without_sync(|tx| {
        // Read in the transaction: a manifest builder folding HEAD into
        // its parent needs no workspace lock.
        let parent = tx.head_seq()?;
        tx.insert_pending(&Pending {
            parent,
            ..pending.clone()
        })?;
        tx.set_meta("head", &pending.seq.to_string())?;
        Ok(parent)
    })?;
    snap.keep();
    failpoint::hit("btrfs:acknowledged");
    Ok(pending)
}

/// A snapshot just taken of the live tree, for a checkpoint or a rewind's
/// safety checkpoint. Deleted when dropped unless [`NewSnapshot::keep`]
/// was called: an error before the commit, or HEAD serving as the safety
/// checkpoint, leaves nothing behind.
pub(crate) struct NewSnapshot {
    pub seq: i64,
    pub id: String,
    pub created_at_ms: i64,
    clock_ns: i64,
    dir: Dir,
    keep: std::cell::Cell<bool>,
}

impl NewSnapshot {
    pub fn keep(&self) {
        self.keep.set(true);
    }
}

impl Drop for NewSnapshot {
    fn drop(&mut self) {
        if !self.keep.get() {
            let _ = rewind_platform::delete_subvolume(&self.dir, OsStr::new(&self.id));
        }
    }
}

/// Snapshot the live tree under the next seq and id. The caller holds the
/// workspace lock, so the reserved seq and id stay free until its commit.
pub(crate) fn take_snapshot(ws: &mut Workspace) -> Result<NewSnapshot> {
    let taken = take_new(ws)?;
    snapshot_as(ws, taken)
}

/// Snapshot the live tree under a seq and id reserved by the caller.
fn snapshot_as(ws: &Workspace, reserved: Taken) -> Result<NewSnapshot> {
    take(ws, &reserved.id)?;
    let Taken { seq, id, clock_ns } = reserved;
    Ok(NewSnapshot {
        seq,
        id,
        created_at_ms: time::now_ms(),
        clock_ns,
        dir: snapshots_dir(ws)?,
        keep: std::cell::Cell::new(false),
    })
}

/// The manifest of a safety snapshot, built now (the plan needs it).
pub(crate) fn capture(ws: &Workspace, s: &NewSnapshot) -> Result<crate::capture::Capture> {
    let snap = open(ws, &s.id)?.ok_or_else(|| Error::Btrfs {
        path: s.dir.path().join(&s.id),
        reason: "the snapshot just taken is missing or not read-only".into(),
    })?;
    let mut cap = ws.capture_dir(&snap, true, Sink::HashOnly, s.clock_ns, "capturing")?;
    cap.from_snapshot = true;
    Ok(cap)
}

/// What became of a pending checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// Its manifest is committed: a checkpoint like any other.
    Checkpoint(i64),
    /// Same content as its parent (an automatic checkpoint): its id now
    /// names the parent and its snapshot is gone.
    Folded(i64),
    /// Its snapshot disappeared before the manifest was built.
    Lost,
}

/// Build the manifests of every pending checkpoint, oldest first. Takes
/// `manifest.lock` beside the ledger (waiting for a running builder, which usually
/// has finished them by then). Needs no workspace lock: only a holder of
/// that lock adds pending rows, and every holder finishes them first, so
/// nothing a lock holder (gc) does can race this.
pub(crate) fn finish_pending(ws: &mut Workspace) -> Result<usize> {
    if !ws.ledger().has_pending()? {
        return Ok(0);
    }
    let Some(_lock) = wait_for_builder(ws)? else {
        return Ok(0);
    };
    // What is pending now, and no more: a checkpoint acknowledged
    // meanwhile is its own process's to finish (inline, or its builder).
    let Some(last) = ws.ledger().pending()?.last().map(|p| p.seq) else {
        return Ok(0);
    };
    let mut n = 0;
    // Read again after each: a fold gives the next its parent's parent,
    // and the list read once kept the folded parent, which the commit
    // then named (FOREIGN KEY constraint failed, helper-75).
    while let Some(p) = ws
        .ledger()
        .pending()?
        .into_iter()
        .next()
        .filter(|p| p.seq <= last)
    {
        finish_one(ws, &p)?;
        n += 1;
    }
    if n > 1 {
        // Best effort: a reader may hold the WAL; it is folded later.
        let _ = ws.ledger().fold_wal();
    }
    Ok(n)
}

/// Take the lock that serialises builders of manifests (and writers of
/// the stat cache). Another builder may hold it for a long time when many
/// checkpoints were acknowledged quickly (each manifest re-hashes what
/// changed): wait as long as it makes progress, saying so once; give up
/// only when the pending count stops moving for `LOCK_TIMEOUT`. `None`
/// when the other builder finished everything meanwhile.
fn wait_for_builder(ws: &Workspace) -> Result<Option<LockFile>> {
    let path = ws.meta_path().join(MANIFEST_LOCK);
    let mut last = (usize::MAX, std::time::Instant::now());
    let mut said = false;
    loop {
        match LockFile::acquire_in(ws.meta_dir(), MANIFEST_LOCK, Duration::from_secs(1))
            .map_err(Error::os)?
        {
            Ok(l) => return Ok(Some(l)),
            Err(pid) => {
                let n = ws.ledger().pending()?.len();
                if n == 0 {
                    return Ok(None);
                }
                if n != last.0 {
                    last = (n, std::time::Instant::now());
                } else if last.1.elapsed() > LOCK_TIMEOUT {
                    return Err(Error::Locked { path, pid });
                }
                if !said {
                    rewind_platform::stderr_line!(
                        "rewind: waiting for the manifests of {n} checkpoint(s) to be built"
                    );
                    said = true;
                }
            }
        }
    }
}

fn finish_one(ws: &mut Workspace, p: &Pending) -> Result<Finished> {
    let _t = crate::trace::span("build manifest from snapshot");
    let Some(snap) = open(ws, &p.id)? else {
        return lose(ws, p);
    };
    let mut cap = ws.capture_dir(&snap, true, Sink::HashOnly, p.clock_ns, "building manifest")?;
    cap.from_snapshot = true;
    failpoint::hit("btrfs:manifest-built");
    let parent = match p.parent {
        Some(s) => ws.ledger().checkpoint_by_seq(s)?,
        None => None,
    };
    let changes = content_changes(
        &crate::diff::Trees::with_overlay(ws.ledger(), cap.overlay()),
        parent.as_ref(),
        &cap.root,
    )?;
    let workspace_id = ws.ledger().meta("workspace_id")?.unwrap_or_default();
    if p.reuse
        && let Some(parent) = parent.as_ref().filter(|_| changes == Default::default())
    {
        ws.ledger_mut().write(|tx| {
            write_capture(tx, &cap)?;
            tx.insert_alias(&p.id, parent.seq)?;
            tx.reparent_pending(p.seq, Some(parent.seq))?;
            tx.delete_pending(p.seq)?;
            if tx.head_seq()? == Some(p.seq) {
                tx.set_meta("head", &parent.seq.to_string())?;
            }
            Ok(())
        })?;
        delete(ws, &p.id)?;
        return Ok(Finished::Folded(parent.seq));
    }
    ws.ledger_mut().write(|tx| {
        cap.stats.bytes_new += write_capture(tx, &cap)?;
        insert_checkpoint(
            tx,
            &workspace_id,
            &cap,
            &NewCheckpoint {
                label: p.label.as_deref(),
                kind: &p.kind,
                parent: p.parent,
                changes,
            },
            Some((p.seq, &p.id, p.created_at_ms)),
            crate::snapshot::Engine::Btrfs,
        )?;
        tx.delete_pending(p.seq)?;
        Ok(())
    })?;
    failpoint::hit("btrfs:manifest-committed");
    Ok(Finished::Checkpoint(p.seq))
}

/// A pending checkpoint whose snapshot is gone (deleted by hand): it can
/// never be built. Record that on the chain, give its children its parent,
/// and move HEAD back if it was HEAD.
fn lose(ws: &mut Workspace, p: &Pending) -> Result<Finished> {
    rewind_platform::stderr_line!(
        "rewind: checkpoint {} cannot be finished: its snapshot {} is missing or no longer read-only; it is dropped",
        p.id,
        ws.meta_path().join(SNAPSHOT_DIR).join(&p.id).display()
    );
    ws.ledger_mut().write(|tx| {
        tx.event(
            "checkpoint-lost",
            Fields::new()
                .str("id", &p.id)
                .str("reason", "snapshot missing before its manifest was built"),
        )?;
        tx.reparent_pending(p.seq, p.parent)?;
        tx.delete_pending(p.seq)?;
        if tx.head_seq()? == Some(p.seq) {
            match p.parent {
                Some(parent) => tx.set_meta("head", &parent.to_string())?,
                None => tx.delete_meta("head")?,
            }
        }
        Ok(())
    })?;
    Ok(Finished::Lost)
}

/// Start `rewind finish-manifests` for this workspace, detached, with
/// stderr to `finisher.log` beside the ledger. Returns false when this
/// process is not the `rewind` binary (the library embedded elsewhere,
/// tests): then the caller builds the manifest itself.
pub(crate) fn spawn_finisher(root: &Path, meta: &Dir) -> bool {
    spawn_detached(root, "finish-manifests", Some((meta, FINISHER_LOG)))
}

/// Start `rewind writeback` for the workspace at `root`, detached, when it
/// is on the btrfs engine: the agent's fresh writes are committed while
/// the model thinks, instead of by the next checkpoint's snapshot (D72).
/// `REWIND_WRITEBACK=0` turns it off. Returns whether it was started.
pub fn spawn_writeback(root: &Path) -> bool {
    if !writeback_enabled() {
        return false;
    }
    Dir::open(root).is_ok_and(|dir| on_btrfs_engine(&dir))
        && spawn_detached(root, "writeback", None)
}

/// Whether the workspace root `dir` is checkpointed by btrfs snapshots:
/// only there do checkpoints commit what the agent wrote, so only there
/// is a background writeback worth it.
fn on_btrfs_engine(dir: &Dir) -> bool {
    FsInfo::of(dir).is_ok_and(|fs| Engine::choose(dir, &fs).0 == Engine::Btrfs)
}

/// How often a running `rewind mcp` writes back a btrfs engine workspace
/// (D75), and how often it looks again whether its workspace is one.
const MCP_WRITEBACK_EVERY: Duration = Duration::from_secs(1);
const MCP_WRITEBACK_RECHECK: Duration = Duration::from_secs(10);

/// `rewind mcp`'s counterpart of [`spawn_writeback`]: the server sees the
/// agent's calls, not its writes, so while it runs it writes back the
/// filesystem of the workspace found from `start` once a second, on the
/// btrfs engine only. The commit a checkpoint's snapshot would pay for the
/// agent's edits then runs while the model thinks (D75). A `syncfs` of a
/// clean filesystem costs ~0.03 ms. The thread ends with the process.
pub fn start_writeback_ticker(start: PathBuf) {
    if !writeback_enabled() {
        return;
    }
    let tick = move || loop {
        // `discover` detaches a dead mount it meets; a background thread
        // leaves that to the next command.
        let dir = std::fs::canonicalize(&start)
            .ok()
            .and_then(|_| Workspace::discover(&start))
            .and_then(|root| Dir::open(&root).ok());
        let synced = dir
            .filter(on_btrfs_engine)
            .is_some_and(|d| d.syncfs().is_ok());
        std::thread::sleep(if synced {
            MCP_WRITEBACK_EVERY
        } else {
            MCP_WRITEBACK_RECHECK
        });
    };
    // Without the thread the server works as before, only slower to
    // acknowledge: not worth failing the session for.
    let _ = std::thread::Builder::new()
        .name("writeback".into())
        .spawn(tick);
}

/// Whether `hook post-tool-use` and `rewind mcp` write back in the
/// background on the btrfs engine (`REWIND_WRITEBACK=0` turns it off).
pub fn writeback_enabled() -> bool {
    !std::env::var("REWIND_WRITEBACK").is_ok_and(|v| v == "0")
}

/// Run `rewind -C ROOT VERB` detached: its own process group, no stdin or
/// stdout (an agent waiting for our stdout to close must not wait for
/// it), stderr appended to `log` or nowhere. False when this process is
/// not the `rewind` binary or the spawn failed.
fn spawn_detached(root: &Path, verb: &str, log: Option<(&Dir, &str)>) -> bool {
    use std::os::unix::process::CommandExt;
    let Some(exe) = std::env::current_exe()
        .ok()
        .filter(|e| e.file_name().is_some_and(|n| n == "rewind"))
    else {
        return false;
    };
    let log = log.and_then(|(dir, name)| {
        let f = dir
            .open_or_create(std::ffi::OsStr::new(name), 0o644, true)
            .ok()?;
        // Root's in a user's history: theirs (D148). A log is best effort.
        if let Ok(Some(h)) = rewind_platform::Heir::of(dir) {
            let _ = h.give_fd(&f, &dir.path().join(name));
        }
        Some(f)
    });
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("-C")
        .arg(root)
        .arg(verb)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(match log {
            Some(f) => std::process::Stdio::from(f),
            None => std::process::Stdio::null(),
        })
        .env_remove("REWIND_FAILPOINT")
        .process_group(0);
    match cmd.spawn() {
        Ok(mut child) => {
            // Reap it when it exits (a long-lived MCP server would otherwise
            // collect zombies); a CLI process exits first and init reaps it.
            std::thread::spawn(move || {
                let _ = child.wait();
            });
            true
        }
        Err(_) => false,
    }
}

/// When a btrfs checkpoint's manifest is built (`REWIND_MANIFEST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestMode {
    /// By a detached `rewind finish-manifests` (the default).
    Background,
    /// Before `checkpoint` returns (`inline`).
    Inline,
    /// By the next command that needs it (`deferred`: benchmarks time
    /// the acknowledgement and the manifest separately).
    Deferred,
}

impl ManifestMode {
    pub fn from_env() -> ManifestMode {
        match std::env::var("REWIND_MANIFEST").as_deref() {
            Ok("inline") => ManifestMode::Inline,
            Ok("deferred") => ManifestMode::Deferred,
            _ => ManifestMode::Background,
        }
    }
}

/// Meta key: which snapshot the stat cache describes (the transaction
/// that created it), written with the rows by a capture of a snapshot and
/// removed by any other capture that writes rows (D59).
pub(crate) const STAT_CACHE_TRANSID: &str = "stat_cache_transid";

/// The value of [`STAT_CACHE_TRANSID`] for a capture of snapshot `snap`;
/// `None` where btrfs cannot say which transaction made it.
pub(crate) fn cache_mark(snap: &Dir) -> Option<String> {
    rewind_platform::subvolume_otransid(snap)
        .ok()
        .map(|t| t.to_string())
}

/// What changed in read-only snapshot `snap` since the snapshot the stat
/// cache describes (`mark`, see [`STAT_CACHE_TRANSID`]), as a capture scope:
/// btrfs knows which inodes were written after a transaction without a
/// walk (D59). `None` (capture guided by the live tree instead) when the
/// mark is missing or newer than `snap`, or the filesystem will not say
/// (the search needs CAP_SYS_ADMIN). The caller checks the ignore rules
/// (D62).
pub(crate) fn changes_since(snap: &Dir, mark: Option<&str>) -> Option<crate::capture::Scope> {
    let since: u64 = mark?.parse().ok()?;
    // Rows describing a newer snapshot say nothing about an older one.
    if since > rewind_platform::subvolume_otransid(snap).ok()? {
        return None;
    }
    let changed = rewind_platform::changed_inodes(snap, since).ok()?;
    let mut dir_paths: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let mut path_of = |ino: u64| -> Option<Vec<u8>> {
        if let Some(p) = dir_paths.get(&ino) {
            return Some(p.clone());
        }
        let p = rewind_platform::inode_path(snap, ino).ok()?;
        dir_paths.insert(ino, p.clone());
        Some(p)
    };
    // rewind's own state (its snapshots change every time) is never captured.
    let state = crate::capture::STATE_DIR.as_bytes();
    let in_state =
        |d: &[u8]| d.starts_with(state) && matches!(d.get(state.len()), None | Some(b'/'));
    let mut scope = crate::capture::ScopeBuilder::default();
    scope.all_changed_inodes(changed.iter().map(|i| i.ino).collect());
    crate::trace::note(format_args!(
        "btrfs changes: {} inodes ({} directories) since transaction {since}",
        changed.len(),
        changed.iter().filter(|i| i.is_dir).count()
    ));
    for inode in &changed {
        if inode.is_dir {
            // Its entries changed (or only its metadata: listing it is cheap).
            let dir = path_of(inode.ino)?;
            if !in_state(&dir) {
                scope.dir_changed(dir);
            }
        }
        for (parent, name) in &inode.names {
            let dir = path_of(*parent)?;
            if !in_state(&dir) {
                scope.entry_changed(&dir, name);
            }
        }
    }
    Some(scope.build())
}
