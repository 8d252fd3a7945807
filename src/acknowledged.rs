//! The record a btrfs acknowledgement leaves in its own snapshot (D324).
//!
//! A btrfs checkpoint is acknowledged once its snapshot exists (D47). The
//! snapshot ioctl commits a btrfs transaction, so the snapshot is on disk
//! when it returns; the ledger row that names it then waited for a flush
//! of its own (the WAL's fsync: 2–3 ms on the benchmark's loop device, a
//! quarter of the acknowledgement). Instead, the row is written to
//! `.rewind/acknowledged` just before the snapshot. `.rewind/` is in the
//! workspace's subvolume, and the ioctl writes the subvolume's dirty data
//! back before it snapshots it, so the snapshot holds the record and is
//! durable with it. The row is then committed without waiting for the
//! disk; the next synced commit (its manifest's, or any writer's: the WAL
//! is one sequence) makes it durable.
//!
//! After a power cut that lost the row (or a crash between the snapshot
//! and the commit), the live record names an id the ledger does not know.
//! The next command takes the lock and adopts each snapshot no row names
//! whose own record names it, oldest first, as the lost commit would
//! have: pending, parent = HEAD, made HEAD. A snapshot without such a
//! record (a rewind's safety snapshot) stays an orphan for gc.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::Path;

use rewind_platform::{Dir, RenameMode};

use crate::capture::STATE_DIR;
use crate::error::{Error, Result};
use crate::ledger::Pending;
use crate::workspace::Workspace;

/// In `.rewind/` (the workspace's subvolume), not in `.rewind/state/`: a
/// nested subvolume is not in its parent's snapshot.
const RECORD: &str = "acknowledged";
const RECORD_TMP: &str = "acknowledged.tmp";

/// Larger is not a record of ours.
const RECORD_MAX: u64 = 4096;

/// Write `p`'s record, to be taken into its snapshot. Replaced whole
/// (a temporary name, then a rename), so a reader never sees half of one.
pub(crate) fn write(ws: &Workspace, p: &Pending) -> Result<()> {
    let dir = ws.state_dir();
    let tmp = OsStr::new(RECORD_TMP);
    let failed = |e: std::io::Error| {
        Error::os(rewind_platform::Error::new(
            "write",
            dir.path().join(tmp),
            e,
        ))
    };
    let text = serde_json::to_vec(p).map_err(|e| failed(std::io::Error::other(e)))?;
    let mut f = dir.open_or_create(tmp, 0o600, false).map_err(Error::os)?;
    // Root's in a user's history: theirs (D148).
    if let Some(h) = rewind_platform::Heir::of(dir).map_err(Error::os)? {
        h.give_fd(&f, &dir.path().join(tmp)).map_err(Error::os)?;
    }
    f.set_len(0)
        .and_then(|()| f.write_all(&text))
        .map_err(failed)?;
    dir.rename(tmp, dir, OsStr::new(RECORD), RenameMode::Replace)
        .map_err(Error::os)
}

/// The record in `dir` (a `.rewind/`): `None` when there is none;
/// `Some(None)` when it cannot be read as one.
fn read(dir: &Dir, rel: &Path) -> Option<Option<Pending>> {
    let (f, meta) = match dir.open_read_beneath(rel) {
        Ok(x) => x,
        Err(e) if e.is_not_found() => return None,
        Err(_) => return Some(None),
    };
    if meta.size > RECORD_MAX {
        return Some(None);
    }
    let mut text = Vec::new();
    if f.take(RECORD_MAX).read_to_end(&mut text).is_err() {
        return Some(None);
    }
    Some(serde_json::from_slice(&text).ok())
}

/// Whether the live record names a checkpoint the ledger does not know
/// (or cannot be read): a row a power cut may have lost. One small read
/// and one query; false in a history that never had a btrfs checkpoint.
pub(crate) fn unadopted(ws: &Workspace) -> bool {
    match read(ws.state_dir(), Path::new(RECORD)) {
        None => false,
        Some(Some(r)) => !ws.ledger().knows_id(&r.id).unwrap_or(true),
        Some(None) => true,
    }
}

/// Adopt every snapshot whose row a power cut lost, oldest first; then
/// retire the live record. The caller holds the workspace lock.
pub(crate) fn adopt(ws: &mut Workspace) -> Result<()> {
    let mut found = Vec::new();
    for name in crate::snapshot::names(ws)? {
        if !crate::ids::is_id(&name) || ws.ledger().knows_id(&name)? {
            continue;
        }
        let Some(snap) = crate::snapshot::open(ws, &name)? else {
            continue;
        };
        // A rewind's safety snapshot holds the record of the checkpoint
        // before it: only a record naming its own snapshot is adopted.
        if let Some(Some(p)) = read(&snap, &Path::new(STATE_DIR).join(RECORD))
            && p.id == name
        {
            found.push(p);
        }
    }
    found.sort_by_key(|p| p.seq);
    for mut p in found {
        // Older than a row the ledger has: not the newest commits, so not
        // what a power cut took (an old binary wrote on after it).
        if p.seq < ws.ledger().next_seq()? {
            continue;
        }
        p.parent = ws.ledger().head_seq()?;
        ws.ledger_mut().write(|tx| {
            tx.insert_pending(&p)?;
            tx.set_meta("head", &p.seq.to_string())
        })?;
        rewind_platform::stderr_line!(
            "rewind: checkpoint {}{}: a crash or power cut lost its ledger row after its snapshot was taken; the snapshot held a copy, and the checkpoint is back",
            p.id,
            p.label
                .as_deref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        );
    }
    let dir = ws.state_dir();
    match dir.unlink(OsStr::new(RECORD)) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        // Not a file (a directory made by hand failed every command,
        // helper-75): it is ours to remove all the same.
        Err(_) => dir.remove_all(OsStr::new(RECORD)).map_err(Error::os),
    }
}
