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

    /// [`Heir::of`] the directory holding `path`; `None` also when it
    /// cannot be read (the entry stays the maker's, as before).
    pub fn of_parent(path: &std::path::Path) -> Option<Heir> {
        use std::os::unix::fs::MetadataExt;
        if !crate::is_root() {
            return None;
        }
        let meta = std::fs::metadata(path.parent()?).ok()?;
        Heir::owning(meta.uid(), meta.gid())
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
