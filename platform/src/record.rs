//! A small file rewritten in place under its own lock.
//!
//! A temporary file renamed over the old one costs a create and a rename,
//! two metadata transactions (~0.2 ms on ext4, which also starts the new
//! file's writeback at the rename): paid on every commit for a 130-byte
//! record (the kept anchor, D356). Here the record is written at offset 0
//! of the same file, padded to a fixed size so that it never shrinks, and
//! readers and writers take the file's `flock` (shared, exclusive): a
//! reader never sees half of an update. The record fits in one sector, so
//! a power cut leaves the old or the new one.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use rustix::fs::FlockOperation;

/// Every record is padded with spaces to at least this many bytes (a
/// sector's half: written in one piece).
const RECORD_PAD: usize = 256;

/// How long a lock is waited for before going on without it: a holder
/// stopped (SIGSTOP) must not stop every other command. Records are
/// advisory, and so is their lock.
const LOCK_WAIT: Duration = Duration::from_millis(100);

/// An open record file, locked until dropped.
#[derive(Debug)]
pub struct LockedRecord {
    file: File,
}

impl LockedRecord {
    /// Open the record at `path` to read it (a shared lock). `NotFound`
    /// when there is none. Never through a symlink.
    pub fn read_only(path: &Path) -> std::io::Result<LockedRecord> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        lock(&file, FlockOperation::NonBlockingLockShared);
        Ok(LockedRecord { file })
    }

    /// Open the record at `path` to update it (an exclusive lock), made
    /// 0600 if missing. Never through a symlink.
    pub fn for_update(path: &Path) -> std::io::Result<LockedRecord> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        lock(&file, FlockOperation::NonBlockingLockExclusive);
        Ok(LockedRecord { file })
    }

    /// Take group and other permissions away (a record made by an older
    /// build under a loose umask). Best effort.
    pub fn make_private(&self) {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = self.file.metadata()
            && m.permissions().mode() & 0o077 != 0
        {
            let _ = self
                .file
                .set_permissions(std::fs::Permissions::from_mode(0o600));
        }
    }

    /// The record's bytes, padding and all.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        let len = self.file.metadata()?.len().min(64 * 1024) as usize;
        let mut buf = vec![0; len];
        let mut at = 0;
        while at < len {
            match self.file.read_at(&mut buf[at..], at as u64)? {
                0 => break,
                n => at += n,
            }
        }
        buf.truncate(at);
        Ok(buf)
    }

    /// Replace the record with `bytes`, padded with spaces to
    /// [`RECORD_PAD`] (or to the file's size, when an earlier record left
    /// it longer and `bytes` fit: no truncation, no metadata change).
    pub fn replace(&self, bytes: &[u8]) -> std::io::Result<()> {
        let size = self.file.metadata()?.len() as usize;
        let len = match size >= bytes.len() && size <= 4 * RECORD_PAD {
            true => size.max(RECORD_PAD),
            false => bytes.len().max(RECORD_PAD),
        };
        let mut padded = bytes.to_vec();
        padded.resize(len, b' ');
        self.file.write_all_at(&padded, 0)?;
        if size > len {
            self.file.set_len(len as u64)?;
        }
        Ok(())
    }
}

/// Take `op` on `file`, retrying while another holds it, up to
/// [`LOCK_WAIT`]; then go on without it.
fn lock(file: &File, op: FlockOperation) {
    let _ = crate::lock::flock_polling(file, op, LOCK_WAIT, Duration::from_micros(200));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_replaced_by_a_shorter_one_reads_as_the_shorter_one_padded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let w = LockedRecord::for_update(&path).unwrap();
        w.replace(&[b'x'; 300]).unwrap();
        w.replace(b"{\"a\":1}\n").unwrap();
        drop(w);
        let got = LockedRecord::read_only(&path).unwrap().read().unwrap();
        // The file kept its 300 bytes (no truncation); the rest is spaces.
        assert_eq!(got.len(), 300);
        assert_eq!(&got[..8], b"{\"a\":1}\n");
        assert!(got[8..].iter().all(|&c| c == b' '));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_record_is_never_opened_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, b"theirs").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(LockedRecord::for_update(&link).is_err());
        assert!(LockedRecord::read_only(&link).is_err());
        assert_eq!(std::fs::read(&real).unwrap(), b"theirs");
    }
}
