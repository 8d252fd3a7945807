//! Deleting a workspace's whole history (`rewind deinit`): `.rewind/`,
//! and first the btrfs engine's read-only snapshots and state subvolume
//! in it, which `rm -rf` cannot delete: it stopped on the first snapshot
//! after it had deleted the ledger, leaving snapshots no command could
//! name (helper-70). The tree itself is never touched.

use std::ffi::{OsStr, OsString};

use rewind_platform::{Dir, EntryKind};

use crate::capture::STATE_DIR;
use crate::error::{Error, Result};
use crate::snapshot::SNAPSHOT_DIR;
use crate::workspace::STATE_SUBVOLUME;

/// What a deletion took.
#[derive(Debug, Default)]
pub struct Removed {
    /// btrfs snapshots deleted, one per btrfs checkpoint.
    pub snapshots: usize,
}

/// The snapshots in `root/.rewind` (in `state/snapshots/`, or beside
/// the ledger in a history from before the state subvolume, D126).
pub fn snapshots(root: &Dir) -> Result<Vec<(Dir, OsString)>> {
    let Some(meta) = existing(root, OsStr::new(STATE_DIR))? else {
        return Ok(Vec::new());
    };
    let mut holders = vec![meta.try_clone().map_err(Error::os)?];
    holders.extend(existing(&meta, OsStr::new(STATE_SUBVOLUME))?);
    let mut out = Vec::new();
    for holder in holders {
        let Some(dir) = existing(&holder, OsStr::new(SNAPSHOT_DIR))? else {
            continue;
        };
        for name in dir.entries().map_err(Error::os)? {
            let is_dir = dir.stat_at(&name).is_ok_and(|m| m.kind == EntryKind::Dir);
            if is_dir {
                out.push((dir.try_clone().map_err(Error::os)?, name));
            }
        }
    }
    Ok(out)
}

/// Delete `root/.rewind` whole, in an order that leaves no history that
/// looks whole but is not (helper-72: one stopped half-way by an
/// immutable file passed `status`, `doctor` and `verify`, and its
/// rewinds failed on missing objects):
/// 1. what would refuse is checked first: a non-root user's snapshots
///    where btrfs does not let them delete subvolumes stop it before
///    anything goes;
/// 2. the ledger: from here on the history is gone, and whatever is left
///    says so (`LEDGER_MISSING`, naming this command to finish);
/// 3. the snapshots, then everything but the lock, then the state
///    subvolume, then `.rewind/` with the lock last: a command that was
///    waiting on it finds no ledger, never a half-deleted one to write
///    into. A directory a late writer filled meanwhile is emptied again.
pub fn remove(root: &Dir) -> Result<Removed> {
    let mut removed = Removed::default();
    let Some(meta) = existing(root, OsStr::new(STATE_DIR))? else {
        return Ok(removed);
    };
    let state = existing(&meta, OsStr::new(STATE_SUBVOLUME))?;
    let snapshots = snapshots(root)?;
    if !snapshots.is_empty() && !rewind_platform::can_delete_snapshots(root.path()) {
        return Err(Error::Btrfs {
            path: root.path().join(STATE_DIR),
            reason: "its btrfs snapshots can be deleted only by root, or by their owner where the filesystem is mounted with `user_subvol_rm_allowed`; nothing was deleted: run `sudo rewind deinit --yes`".into(),
        });
    }
    let holders: Vec<&Dir> = std::iter::once(&meta).chain(state.as_ref()).collect();
    for dir in &holders {
        for name in LEDGER_FILES {
            unlink_if_there(dir, OsStr::new(name))?;
        }
    }
    for (dir, name) in snapshots {
        if crate::snapshot::delete_in(&dir, &name, root.path(), "rewind deinit --yes")? {
            removed.snapshots += 1;
        }
    }
    for dir in &holders {
        for child in dir.entries().map_err(Error::os)? {
            if child != "lock" && child != STATE_SUBVOLUME {
                dir.remove_all(&child).map_err(Error::os)?;
            }
        }
    }
    if let Some(state) = state {
        // `remove_all` never crosses into a nested subvolume: it goes on
        // its own, by the ioctl, or (a non-root user without
        // `user_subvol_rm_allowed`) emptied and removed as a directory,
        // which an empty subvolume allows.
        let name = OsStr::new(STATE_SUBVOLUME);
        let is_subvolume = rewind_platform::is_subvolume(&state).map_err(Error::os)?;
        if !is_subvolume || rewind_platform::delete_subvolume(&meta, name).is_err() {
            for child in state.entries().map_err(Error::os)? {
                state.remove_all(&child).map_err(Error::os)?;
            }
            meta.rmdir(name).map_err(Error::os)?;
        }
    }
    let mut tries = 0;
    loop {
        match root.remove_all(OsStr::new(STATE_DIR)) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 3 => tries += 1,
            Err(e) => return Err(Error::os(e)),
        }
    }
    root.fsync().map_err(Error::os)?;
    Ok(removed)
}

/// The ledger and the files SQLite keeps beside it.
const LEDGER_FILES: [&str; 4] = [
    crate::workspace::LEDGER_FILE,
    "ledger.db-wal",
    "ledger.db-shm",
    "ledger.db-journal",
];

fn unlink_if_there(dir: &Dir, name: &OsStr) -> Result<()> {
    match dir.unlink(name) {
        Err(e) if !e.is_not_found() => Err(Error::os(e)),
        _ => Ok(()),
    }
}

/// The directory `name` in `dir`, if there is one. A symlink is none: it
/// is unlinked, and what it points to is left alone.
fn existing(dir: &Dir, name: &OsStr) -> Result<Option<Dir>> {
    match dir.stat_at(name) {
        Ok(m) if m.kind == EntryKind::Dir => {}
        Ok(_) => return Ok(None),
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(Error::os(e)),
    }
    match dir.open_dir(name) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Error::os(e)),
    }
}
