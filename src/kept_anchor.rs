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
/// workspace. Read under the file's lock: a read racing a
/// [`keep`] could pair one anchor's sequence number with another's head,
/// which parses, and would say the history lost entries it has.
fn read_at(path: &Path, workspace_id: &str) -> Option<Anchor> {
    let record = rewind_platform::LockedRecord::read_only(path).ok()?;
    parse(&record.read().ok()?, workspace_id)
}

/// An anchor record's bytes (padded with spaces, D356) as this
/// workspace's anchor.
fn parse(bytes: &[u8], workspace_id: &str) -> Option<Anchor> {
    serde_json::from_slice::<Anchor>(bytes.trim_ascii())
        .ok()
        .filter(|a| a.workspace == workspace_id)
}

/// After a commit: keep the chain's head as the workspace's anchor at
/// `path` ([`path`]), if it extends the one kept (or none is).
pub fn keep(conn: &Connection, ledger: &Path, workspace_id: &str, path: &Path) {
    let Ok(Some((seq, head))) = crate::chain::head(conn, ledger) else {
        return;
    };
    // Read, checked and replaced under one lock: two commits keeping at
    // once move it to the later head, never back.
    let Some(record) = open_for_update(path) else {
        return;
    };
    if let Some(a) = record.read().ok().and_then(|b| parse(&b, workspace_id)) {
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
    if let Ok(text) = serde_json::to_string(&anchor) {
        let _ = record.replace(format!("{text}\n").as_bytes());
    }
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

/// The anchor file at `path`, opened and locked to be updated in place
/// (D356), made with its directories if missing. The file is 0600 and
/// the directories rewind makes 0700, whatever the umask: under `umask
/// 000` they were 0666 and 0777, and any local user could delete the
/// anchor, which accepts a cut ledger (helper-92, D351).
fn open_for_update(path: &Path) -> Option<rewind_platform::LockedRecord> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent()?;
    let record = match rewind_platform::LockedRecord::for_update(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .ok()?;
            rewind_platform::LockedRecord::for_update(path)
        }
        r => r,
    }
    .ok()?;
    // `anchors/` and `rewind/` above it, left open by an earlier build:
    // write access to either lets another user take the file away.
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        close_to_others(d);
    }
    record.make_private();
    Some(record)
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

    /// D356: the anchor is rewritten in place, so a reader must wait for
    /// the writer's lock: half of an update can parse as an anchor (one
    /// entry's number, another's head) and say the history lost entries.
    #[test]
    fn a_reader_waits_for_an_update_in_progress_and_reads_it_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.json");
        let anchor = |seq: u64, h: char| Anchor {
            workspace: "w".into(),
            seq,
            head: h.to_string().repeat(64),
        };
        let text = |a: &Anchor| format!("{}\n", serde_json::to_string(a).expect("json"));
        let old = open_for_update(&path).expect("open");
        old.replace(text(&anchor(12, 'a')).as_bytes())
            .expect("write");
        drop(old);

        let writer = open_for_update(&path).expect("open");
        // Torn: the new number before the new head.
        let mut torn = text(&anchor(12, 'a')).into_bytes();
        torn[..30].copy_from_slice(&text(&anchor(13, 'b')).as_bytes()[..30]);
        writer.replace(&torn).expect("write");
        let reader = std::thread::spawn({
            let path = path.clone();
            move || read_at(&path, "w")
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        writer
            .replace(text(&anchor(13, 'b')).as_bytes())
            .expect("write");
        drop(writer);
        let read = reader.join().expect("reader").expect("an anchor");
        assert_eq!((read.seq, read.head), (13, "b".repeat(64)));
    }
}
