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

/// Delete `root/.rewind` whole: each snapshot, then the state subvolume,
/// then the rest. A refusal (a snapshot a non-root user may not delete)
/// stops it there and names the fix; what was deleted before stays
/// deleted, and running it again takes the rest.
pub fn remove(root: &Dir) -> Result<Removed> {
    let mut removed = Removed::default();
    let snapshots = snapshots(root)?;
    // Refused before the first one: half a history is worse than either.
    if !snapshots.is_empty() && !rewind_platform::can_delete_snapshots(root.path()) {
        return Err(Error::Btrfs {
            path: root.path().join(STATE_DIR),
            reason: "its btrfs snapshots can be deleted only by root, or by their owner where the filesystem is mounted with `user_subvol_rm_allowed`; nothing was deleted: run `sudo rewind deinit --yes`".into(),
        });
    }
    for (dir, name) in snapshots {
        if crate::snapshot::delete_in(&dir, &name, root.path(), "rewind deinit --yes")? {
            removed.snapshots += 1;
        }
    }
    if let Some(meta) = existing(root, OsStr::new(STATE_DIR))? {
        let name = OsStr::new(STATE_SUBVOLUME);
        let nested = existing(&meta, name)?
            .map(|state| rewind_platform::is_subvolume(&state).map(|yes| yes.then_some(state)))
            .transpose()
            .map_err(Error::os)?
            .flatten();
        // `remove_all` never crosses into a nested subvolume: it goes on
        // its own, by the ioctl, or (a non-root user without
        // `user_subvol_rm_allowed`) emptied and removed as a directory,
        // which an empty subvolume allows.
        if let Some(state) = nested
            && rewind_platform::delete_subvolume(&meta, name).is_err()
        {
            for child in state.entries().map_err(Error::os)? {
                state.remove_all(&child).map_err(Error::os)?;
            }
            meta.rmdir(name).map_err(Error::os)?;
        }
    }
    root.remove_all(OsStr::new(STATE_DIR)).map_err(Error::os)?;
    root.fsync().map_err(Error::os)?;
    Ok(removed)
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
