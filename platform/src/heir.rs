//! Who owns what root makes in someone else's directory.
//!
//! Owners are not recorded (D18): what rewind makes is its runner's. Run
//! as root in a user's workspace (`sudo rewind`, the daemon of `sudo
//! rewind mount`), that made the user's restored files root's, and the
//! shards, claim and log it added to their history too: the user's next
//! edit, checkpoint or mount failed on them. Root gives what it makes to
//! the owner and group of the directory it goes into (D147, D148).

use std::os::fd::AsFd;

use rustix::fs::{Gid, Uid};

use crate::{Dir, Error, Result};

/// The owner and group that what this process makes in a directory is
/// given to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heir {
    pub uid: u32,
    pub gid: u32,
}

impl Heir {
    /// Whose is what this process makes in `dir`: the directory's owner
    /// and group when this process is root and they are not root's.
    /// `None` keeps the maker's: only root could give it away, and root's
    /// own directories want root's.
    pub fn of(dir: &Dir) -> Result<Option<Heir>> {
        if !crate::is_root() {
            return Ok(None);
        }
        let meta = dir.meta()?;
        Ok(Heir::owning(meta.uid, meta.gid))
    }

    /// [`Heir::of`] a directory whose owner and group are `uid`, `gid`.
    pub fn owning(uid: u32, gid: u32) -> Option<Heir> {
        Some(Heir { uid, gid }).filter(|h| crate::is_root() && (h.uid, h.gid) != (0, 0))
    }

    /// Give the open file or directory `fd` to this heir, unless it is
    /// theirs already: a chown changes the ctime even when the owner
    /// stays, and a lock every command takes would be written each time.
    /// Before any chmod: a chown clears setuid and setgid.
    pub fn give_fd(&self, fd: impl AsFd, path: &std::path::Path) -> Result<()> {
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::new("stat", path, e))?;
        if (st.st_uid, st.st_gid) == (self.uid, self.gid) {
            return Ok(());
        }
        tolerate_fixed_owners(
            rustix::fs::fchown(
                fd,
                Some(Uid::from_raw(self.uid)),
                Some(Gid::from_raw(self.gid)),
            )
            .map_err(|e| Error::new("chown", path, e)),
        )
    }

    /// Give the entry `name` of `dir`, just made (a symlink itself, not
    /// followed), to this heir.
    pub fn give_at(&self, dir: &Dir, name: &std::ffi::OsStr) -> Result<()> {
        tolerate_fixed_owners(dir.set_owner(name, self.uid, self.gid))
    }
}

/// A filesystem that stores one owner for every file (vfat, exfat, some
/// FUSE ones) refuses a chown even to root: the entry stays as made, as
/// it would have been without an heir.
fn tolerate_fixed_owners(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) => Ok(()),
        r => r,
    }
}

/// A user whose read access root checks on their behalf (D152). Root's
/// capture of a user's workspace read what the user could not (root's
/// 0600 files in it), and stored it in the history D148 gives the user:
/// their `diff --patch` then printed it. Root now leaves out what the
/// workspace's owner could not read, as their own capture does (D143).
///
/// Groups are those `/etc/passwd` and `/etc/group` give the user (no
/// other name service: a group found nowhere only skips more). POSIX
/// ACLs are not consulted: the mode's group bits are their mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAccess {
    uid: u32,
    gids: Vec<u32>,
}

impl UserAccess {
    /// As root, the owner of the directory `meta` describes, when that is
    /// another user; `None` otherwise (a process reads as itself).
    pub fn owner_of(meta: &crate::Meta) -> Option<UserAccess> {
        (crate::is_root() && meta.uid != 0).then(|| UserAccess::of(meta.uid))
    }

    /// This process's effective user and groups.
    pub fn this_process() -> UserAccess {
        let (uid, gids) = crate::credentials();
        UserAccess { uid, gids }
    }

    /// The user `uid` with the groups the files in /etc give them.
    pub fn of(uid: u32) -> UserAccess {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
        UserAccess::from_files(uid, &passwd, &groups)
    }

    fn from_files(uid: u32, passwd: &str, groups: &str) -> UserAccess {
        let mut name = None;
        let mut gids = Vec::new();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() > 3 && f[2].parse() == Ok(uid) {
                name = Some(f[0].to_string());
                gids.extend(f[3].parse::<u32>().ok());
                break;
            }
        }
        if let Some(name) = name {
            for line in groups.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if f.len() > 3 && f[3].split(',').any(|m| m == name) {
                    gids.extend(f[2].parse::<u32>().ok());
                }
            }
        }
        UserAccess { uid, gids }
    }

    /// Whether this user may read the entry `meta` describes (list and
    /// enter it, for a directory). The kernel's rule: the owner's bits
    /// for the owner, else the group's for a member, else the others'.
    pub fn may_read(&self, meta: &crate::Meta) -> bool {
        let need = match meta.kind {
            crate::EntryKind::Symlink => return true,
            crate::EntryKind::Dir => 0o5,
            _ => 0o4,
        };
        self.bits(meta) & need == need
    }

    /// Whether this user may create, remove or replace `entry` (`None`:
    /// a new name) in the directory `dir` describes: write and search on
    /// it, and in a sticky directory (/tmp) only their own entries unless
    /// the directory is theirs. Root's rewind for a user changes only what
    /// they could (D164).
    pub fn may_change_in(&self, dir: &crate::Meta, entry: Option<&crate::Meta>) -> bool {
        let sticky_blocks = dir.mode & 0o1000 != 0
            && dir.uid != self.uid
            && entry.is_some_and(|e| e.uid != self.uid);
        dir.kind == crate::EntryKind::Dir && self.bits(dir) & 0o3 == 0o3 && !sticky_blocks
    }

    /// The owner's, group's or others' permission bits, as the kernel
    /// picks them for this user.
    fn bits(&self, meta: &crate::Meta) -> u32 {
        if meta.uid == self.uid {
            meta.mode >> 6
        } else if self.gids.contains(&meta.gid) {
            meta.mode >> 3
        } else {
            meta.mode
        }
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: crate::EntryKind, mode: u32, uid: u32, gid: u32) -> crate::Meta {
        crate::Meta {
            kind,
            mode,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            dev: 0,
            ino: 0,
            nlink: 1,
            allocated: 0,
            uid,
            gid,
        }
    }

    #[test]
    fn a_user_reads_by_the_owner_bits_then_a_groups_then_the_others() {
        let passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        let groups = "root:x:0:\nalice:x:1000:\ndev:x:50:bob,alice\nops:x:60:bob\n";
        let alice = UserAccess::from_files(1000, passwd, groups);
        assert_eq!(alice.gids, vec![1000, 50]);
        use crate::EntryKind::{Dir, File, Symlink};
        assert!(alice.may_read(&meta(File, 0o400, 1000, 0)));
        // The owner's bits rule the owner, even when others' would let in.
        assert!(!alice.may_read(&meta(File, 0o044, 1000, 0)));
        assert!(!alice.may_read(&meta(File, 0o600, 0, 0)));
        assert!(alice.may_read(&meta(File, 0o640, 0, 50)));
        assert!(!alice.may_read(&meta(File, 0o640, 0, 60)));
        assert!(alice.may_read(&meta(File, 0o604, 0, 60)));
        // A directory needs r and x.
        assert!(!alice.may_read(&meta(Dir, 0o744, 0, 0)));
        assert!(alice.may_read(&meta(Dir, 0o755, 0, 0)));
        assert!(alice.may_read(&meta(Symlink, 0o777, 0, 0)));
        // Unknown to /etc: the others' bits only.
        let ghost = UserAccess::from_files(4242, passwd, groups);
        assert!(ghost.gids.is_empty());
        assert!(!ghost.may_read(&meta(File, 0o640, 0, 50)));
    }

    #[test]
    fn a_user_changes_entries_where_they_may_write_and_search() {
        let passwd = "alice:x:1000:1000::/home/alice:/bin/sh
";
        let groups = "dev:x:50:alice
";
        let alice = UserAccess::from_files(1000, passwd, groups);
        use crate::EntryKind::{Dir, File};
        let (hers, roots) = (meta(File, 0o644, 1000, 1000), meta(File, 0o644, 0, 0));
        assert!(alice.may_change_in(&meta(Dir, 0o755, 1000, 1000), Some(&roots)));
        assert!(!alice.may_change_in(&meta(Dir, 0o755, 0, 0), None));
        assert!(!alice.may_change_in(&meta(Dir, 0o755, 0, 0), Some(&hers)));
        assert!(alice.may_change_in(&meta(Dir, 0o775, 0, 50), None));
        assert!(
            !alice.may_change_in(&meta(Dir, 0o765, 0, 50), None),
            "w without x"
        );
        assert!(!alice.may_change_in(&meta(File, 0o777, 1000, 1000), None));
        // Sticky: her own entries and new names, not root's.
        let tmp = meta(Dir, 0o1777, 0, 0);
        assert!(alice.may_change_in(&tmp, None));
        assert!(alice.may_change_in(&tmp, Some(&hers)));
        assert!(!alice.may_change_in(&tmp, Some(&roots)));
        assert!(alice.may_change_in(&meta(Dir, 0o1755, 1000, 1000), Some(&roots)));
    }
}
