//! The anchor rewind keeps of each workspace's chain head, outside the
//! workspace (D313).
//!
//! A chain cut at its tail verifies (DESIGN §9): without an anchor kept
//! elsewhere, nothing tells a history that lost its newest entries from
//! one that never had them. helper-67 saw that happen by accident: `grep
//! -rl old . | xargs sed -i` rewrote the ledger's WAL, SQLite stopped
//! reading at the first frame whose checksum failed, and the ledger went
//! from 6 entries to 3 while `verify` said ok; restoring a backup of the
//! project, `.rewind/` and all, did the same. So every commit that moves
//! the head also writes it, as `rewind anchor` would, to
//! `$XDG_STATE_HOME/rewind/anchors/` (`~/.local/state/…`), one file per
//! workspace id and root directory (device and inode), and plain `verify`
//! checks the chain against it.
//!
//! The kept anchor only moves forward along the chain it anchors: a
//! ledger that no longer holds its entry (cut, rolled back, replaced)
//! leaves it as it is, so `verify` goes on saying so until the user
//! deletes the file (having restored a backup on purpose). Everything
//! here is best effort: no state directory, or one that cannot be
//! written, keeps nothing and stops nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use crate::chain::Anchor;
use crate::hash::{Hash, hex};

/// Where the anchor of the workspace `workspace_id` at `root` is kept:
/// keyed by both, so a copy of a workspace (`cp -a proj proj2`, the same
/// id) keeps its own, and a workspace made again at a path has a new id.
/// `None` without a state directory, or when `root` cannot be stat'ed.
/// An anchor kept under the key before session 40 is moved here.
pub fn path(workspace_id: &str, root: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(root).ok()?;
    let ino = std::os::unix::fs::MetadataExt::ino(&meta);
    let dev = std::os::unix::fs::MetadataExt::dev(&meta);
    // The root directory by its filesystem and inode, not its path: a
    // mount serves the ledger from another path (`/run/rewind/….backing`),
    // and a workspace moved keeps its anchor (helper-68). The filesystem
    // by its statfs id where it has one: a btrfs subvolume's `st_dev` is
    // handed out again at each mount, and after a reboot the anchor was
    // not found (the check silently off) or another's was (helper-76).
    let fs = rewind_platform::filesystem_id(root).unwrap_or(dev);
    let kept = keyed(workspace_id, fs, ino)?;
    if fs != dev && !kept.exists() {
        if let Some(before) = keyed(workspace_id, dev, ino).filter(|p| p.exists()) {
            let _ = std::fs::rename(before, &kept);
        }
    }
    Some(kept)
}

/// The anchor file of `workspace_id` for a root on filesystem `fs` at
/// inode `ino`, under `$XDG_STATE_HOME/rewind/anchors/`.
fn keyed(workspace_id: &str, fs: u64, ino: u64) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                // Not `/.local/…` for a HOME of `/` (helper-68), and never
                // a HOME that does not exist: root with `HOME=/nonexistent`
                // (nobody's) made that directory (helper-92, D351).
                .filter(|p| p.is_absolute() && p.parent().is_some() && p.is_dir())
                .map(|h| h.join(".local/state"))
        })?;
    let key = format!("{workspace_id}\0{fs}:{ino}");
    let name = hex(&Hash::of(key.as_bytes()).0[..16]);
    Some(base.join("rewind/anchors").join(format!("{name}.json")))
}

/// The workspace root of a ledger at `ledger` (`ROOT/.rewind/ledger.db`,
/// or the btrfs engine's `ROOT/.rewind/state/ledger.db`).
pub fn root_of(ledger: &Path) -> Option<&Path> {
    ledger
        .ancestors()
        .find(|a| {
            a.file_name()
                .is_some_and(|n| n == crate::capture::STATE_DIR)
        })?
        .parent()
}

/// The anchor kept for this workspace, and where, if there is one that
/// parses and names it.
pub fn read(workspace_id: &str, root: &Path) -> Option<(PathBuf, Anchor)> {
    let path = path(workspace_id, root)?;
    let anchor = read_at(&path, workspace_id)?;
    Some((path, anchor))
}

/// The anchor in the file at `path`, if it parses and names this
/// workspace.
fn read_at(path: &Path, workspace_id: &str) -> Option<Anchor> {
    Anchor::read(path)
        .ok()
        .flatten()
        .filter(|a| a.workspace == workspace_id)
}

/// After a commit: keep the chain's head as the workspace's anchor at
/// `path` ([`path`]), if it extends the one kept (or none is).
pub fn keep(conn: &Connection, ledger: &Path, workspace_id: &str, path: &Path) {
    let Ok(Some((seq, head))) = crate::chain::head(conn, ledger) else {
        return;
    };
    if let Some(a) = read_at(path, workspace_id) {
        if a.seq == seq && a.head == head.to_hex() {
            return;
        }
        // Only forward along the same chain: a ledger that lost the kept
        // entry, or holds another there, leaves the evidence alone; and
        // never back (another process kept a newer head meanwhile).
        if a.seq >= seq || !holds(conn, &a) {
            return;
        }
    }
    let anchor = Anchor {
        workspace: workspace_id.to_string(),
        seq,
        head: head.to_hex(),
    };
    let _ = write(path, &anchor);
}

/// Whether the chain in `conn` holds the kept anchor's entry.
fn holds(conn: &Connection, a: &Anchor) -> bool {
    let here: Option<Vec<u8>> = conn
        .query_row(
            "SELECT hash FROM chain WHERE seq = ?1",
            [a.seq as i64],
            |r| r.get(0),
        )
        .optional()
        .ok()
        .flatten();
    here.is_some_and(|h| hex(&h) == a.head)
}

/// What to tell the user when the ledger no longer holds the entry its
/// kept anchor recorded: the history lost its newest entries, or was
/// replaced by another copy. `None` when it holds it, or none is kept.
pub fn lost(conn: &Connection, ledger: &Path, workspace_id: &str) -> Option<String> {
    let (path, a) = read(workspace_id, root_of(ledger)?)?;
    if holds(conn, &a) {
        return None;
    }
    let now = crate::chain::head(conn, ledger)
        .ok()
        .flatten()
        .map_or(0, |(seq, _)| seq);
    Some(format!(
        "this workspace's history reached entry {} (the anchor rewind keeps at {}), and its ledger now {}: it lost its newest checkpoints or was replaced by an older copy (a tool that rewrote .rewind/, a restored backup); `rewind verify` says where, and deleting that file accepts the ledger as it is",
        a.seq,
        crate::names::human_os_path(&path),
        if now < a.seq {
            format!("ends at entry {now}")
        } else {
            format!("holds another entry {}", a.seq)
        }
    ))
}

/// Replace the file at `path` with `anchor`, through a temporary file
/// beside it (a torn write would read as no anchor, never a wrong one).
/// The file is 0600 and the directories rewind makes 0700, whatever the
/// umask: under `umask 000` they were 0666 and 0777, and any local user
/// could delete the anchor, which accepts a cut ledger (helper-92, D351).
fn write(path: &Path, anchor: &Anchor) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{n}.tmp", std::process::id()));
    let text = serde_json::to_string(anchor).map_err(std::io::Error::other)?;
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
    };
    let mut f = match create() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            create()?
        }
        Err(e) => return Err(e),
    };
    // `anchors/` and `rewind/` above it, left open by an earlier build:
    // write access to either lets another user take the file away (the
    // file itself is replaced by one made 0600).
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        close_to_others(d);
    }
    f.write_all(format!("{text}\n").as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Make the directory `dir` 0700 if group or others may write in it and
/// it is this user's: one stat per commit, a chmod once. Best effort, as
/// everything here.
fn close_to_others(dir: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if let Ok(m) = std::fs::metadata(dir)
        && m.mode() & 0o022 != 0
        && m.uid() == rewind_platform::euid()
    {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
}

/// Where this workspace's anchor is kept, or why none is, for `doctor`.
pub fn describe(workspace_id: &str, root: &Path) -> String {
    let Some(path) = path(workspace_id, root) else {
        return "none kept: neither XDG_STATE_HOME nor HOME names an existing directory, so `verify` cannot tell a history cut at its end (D313); set one, or keep an anchor yourself with `rewind anchor FILE`".into();
    };
    let shown = crate::names::human_os_path(&path);
    match read_at(&path, workspace_id) {
        Some(a) => format!("kept at {shown} (entry {})", a.seq),
        None => {
            // The nearest entry that exists must be a directory this
            // user may write in (not a file, nor a dangling link).
            let writable = path
                .ancestors()
                .skip(1)
                .find(|a| a.symlink_metadata().is_ok())
                .is_some_and(|a| a.is_dir() && rewind_platform::may_write(a));
            if writable {
                format!("none kept yet at {shown} (the next checkpoint keeps one)")
            } else {
                format!(
                    "none kept: {shown} cannot be written here (a read-only or foreign directory), so `verify` cannot tell a history cut at its end (D313); set XDG_STATE_HOME to a directory of yours, or keep an anchor yourself with `rewind anchor FILE`"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledgers_root_is_above_its_rewind_directory() {
        assert_eq!(
            root_of(Path::new("/w/p/.rewind/ledger.db")),
            Some(Path::new("/w/p"))
        );
        assert_eq!(
            root_of(Path::new("/w/p/.rewind/state/ledger.db")),
            Some(Path::new("/w/p"))
        );
        assert_eq!(root_of(Path::new("/w/p/ledger.db")), None);
    }
}
