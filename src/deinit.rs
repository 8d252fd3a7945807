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

/// The snapshots in `root/.rewind`: each snapshot directory (in
/// `state/snapshots/`, or beside the ledger in a history from before the
/// state subvolume, D126) with the names in it. One descriptor per
/// directory, not per snapshot: a long history has hundreds.
pub fn snapshots(root: &Dir) -> Result<Vec<(Dir, Vec<OsString>)>> {
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
        let names: Vec<OsString> = dir
            .entries()
            .map_err(Error::os)?
            .into_iter()
            .filter(|n| dir.stat_at(n).is_ok_and(|m| m.kind == EntryKind::Dir))
            .collect();
        if !names.is_empty() {
            out.push((dir, names));
        }
    }
    Ok(out)
}

/// How many snapshots [`snapshots`] found.
pub fn count(snapshots: &[(Dir, Vec<OsString>)]) -> usize {
    snapshots.iter().map(|(_, names)| names.len()).sum()
}

/// What `.rewind/` holds while a deletion is under way, with the cause
/// that stopped it once one did: every command then says the history is
/// being deleted and how to finish, where "the ledger is missing: restore
/// it from a backup" sent the user looking for one (helper-73).
pub const MARKER: &str = "deinit";

/// Why the history whose `.rewind/` is `state` is half-deleted:
/// `Some(cause)` (none known yet) when a deletion began there and did not
/// finish.
pub fn stopped_half_way(state: &Dir) -> Option<Option<String>> {
    state.stat_at(OsStr::new(MARKER)).ok()?;
    let mut cause = String::new();
    if let Ok((mut f, _)) = state.open_read(OsStr::new(MARKER)) {
        let _ = std::io::Read::read_to_string(&mut f, &mut cause);
    }
    Some(Some(cause.trim().to_string()).filter(|c| !c.is_empty()))
}

/// Why deleting the history at `root` would be refused before anything
/// goes: a non-root user's btrfs snapshots where btrfs does not let them
/// delete subvolumes. Half a history, whose checkpoints name snapshots
/// that are gone, is worse than either.
pub fn check(root: &Dir, snapshots: &[(Dir, Vec<OsString>)]) -> Result<()> {
    if !snapshots.is_empty() && !rewind_platform::can_delete_snapshots(root.path()) {
        return Err(Error::Btrfs {
            path: root.path().join(STATE_DIR),
            reason: "its btrfs snapshots can be deleted only by root, or by their owner where the filesystem is mounted with `user_subvol_rm_allowed`; nothing was deleted: run `sudo rewind deinit --yes`".into(),
        });
    }
    Ok(())
}

/// Delete `root/.rewind` whole, in an order that leaves no history that
/// looks whole but is not (helper-72: one stopped half-way by an
/// immutable file passed `status`, `doctor` and `verify`, and its
/// rewinds failed on missing objects):
/// 1. what would refuse is checked first ([`check`]);
/// 2. [`MARKER`] is made, then the ledger goes: from here on the history
///    is gone, and whatever is left says so and how to finish;
/// 3. the snapshots, then everything but the lock and the marker, then
///    the state subvolume, then `.rewind/` with them. No other mount or
///    subvolume is ever crossed, one mounted right in `.rewind/`
///    included. A directory a late writer filled meanwhile is emptied
///    again. A command that was waiting on the lock finds it deleted
///    and does nothing ([`rewind_platform::LockFile::is_deleted`]).
///
/// `snapshots`: what [`snapshots`] found there, under the lock.
pub fn remove(root: &Dir, snapshots: Vec<(Dir, Vec<OsString>)>) -> Result<Removed> {
    let Some(meta) = existing(root, OsStr::new(STATE_DIR))? else {
        return Ok(Removed::default());
    };
    check(root, &snapshots)?;
    let mut marker = meta
        .open_or_create(OsStr::new(MARKER), 0o600, false)
        .map_err(Error::os)?;
    meta.fsync().map_err(Error::os)?;
    let removed = remove_marked(root, &meta, snapshots);
    if let Err(e) = &removed {
        // Said by every command from now on.
        let _ = std::io::Write::write_all(&mut marker, e.to_string().as_bytes());
        return Err(Error::HistoryBeingDeleted {
            path: root.path().to_path_buf(),
            cause: Some(e.to_string()),
        });
    }
    removed
}

fn remove_marked(root: &Dir, meta: &Dir, snapshots: Vec<(Dir, Vec<OsString>)>) -> Result<Removed> {
    let mut removed = Removed::default();
    let state = existing(meta, OsStr::new(STATE_SUBVOLUME))?;
    let holders: Vec<&Dir> = std::iter::once(meta).chain(state.as_ref()).collect();
    for dir in &holders {
        for name in LEDGER_FILES {
            dir.remove_all(OsStr::new(name)).map_err(Error::os)?;
        }
    }
    for (dir, names) in snapshots {
        for name in names {
            if crate::snapshot::delete_in(&dir, &name, root.path(), "rewind deinit --yes")? {
                removed.snapshots += 1;
            }
        }
    }
    let keep = [
        OsStr::new("lock"),
        OsStr::new(MARKER),
        OsStr::new(STATE_SUBVOLUME),
    ];
    for dir in &holders {
        dir.remove_all_but(&keep).map_err(Error::os)?;
    }
    if let Some(state) = state {
        // `remove_all` never crosses into a nested subvolume: it goes on
        // its own, by the ioctl, or (a non-root user without
        // `user_subvol_rm_allowed`) emptied and removed as a directory,
        // which an empty subvolume allows.
        let name = OsStr::new(STATE_SUBVOLUME);
        let is_subvolume = rewind_platform::is_subvolume(&state).map_err(Error::os)?;
        if !is_subvolume || rewind_platform::delete_subvolume(meta, name).is_err() {
            state.remove_all_but(&[]).map_err(Error::os)?;
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
