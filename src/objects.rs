//! Content-addressed objects under `.rewind/objects/xx/yyyy…`, named by the
//! SHA-256 of their bytes (so `sha256sum` can check any of them).
//!
//! Ingest clones the workspace file first and hashes the clone: the clone is
//! a point-in-time copy even while the agent keeps writing. Where clones are
//! impossible the file is copied while hashing. New objects are written
//! under `.rewind/tmp/` and renamed into place, so a crash leaves at most
//! temp files (removed by the next command), never a half-written object.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rewind_platform::{CloneOutcome, Dir, RenameMode, clone_or_copy, copy_with};

use crate::error::{Error, Result};
use crate::hash::{Hash, Hasher};

pub struct ObjectStore {
    objects: Dir,
    tmp: Dir,
    clones: bool,
    /// `objects/00/` … `objects/ff/`, opened lazily and kept open.
    shards: Box<[OnceLock<Dir>]>,
}

/// The result of storing one file.
#[derive(Debug, Clone, Copy)]
pub struct Ingested {
    pub hash: Hash,
    pub size: u64,
    /// Bytes that became new in the store (0 when the object already existed).
    pub new_bytes: u64,
    pub outcome: CloneOutcome,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ObjectStore {
    pub fn new(objects: Dir, tmp: Dir, clones: bool) -> ObjectStore {
        ObjectStore {
            objects,
            tmp,
            clones,
            shards: (0..256).map(|_| OnceLock::new()).collect(),
        }
    }

    pub fn clones(&self) -> bool {
        self.clones
    }

    pub fn tmp_dir(&self) -> &Dir {
        &self.tmp
    }

    /// A fresh temp file in `.rewind/tmp/`, created O_EXCL.
    pub fn temp_file(&self, prefix: &str, mode: u32) -> Result<(OsString, File)> {
        loop {
            let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = OsString::from(format!("{prefix}.{}.{n}", std::process::id()));
            match self.tmp.create_new(&name, mode) {
                Ok(f) => return Ok((name, f)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::os(e)),
            }
        }
    }

    /// A fresh unused name in `.rewind/tmp/` (for symlinks and directories).
    pub fn temp_name(&self, prefix: &str) -> OsString {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        OsString::from(format!("{prefix}.{}.{n}", std::process::id()))
    }

    /// Store the content of `src` (an open regular file).
    pub fn ingest(&self, src: &File) -> Result<Ingested> {
        // Created read-only: the fd stays writable, the object never is.
        let (tmp_name, tmp) = self.temp_file("in", 0o444)?;
        let stored = self.fill_and_hash(src, &tmp);
        let (hash, size, outcome) = match stored {
            Ok(v) => v,
            Err(e) => {
                let _ = self.tmp.unlink(&tmp_name);
                return Err(e);
            }
        };
        drop(tmp);
        let new_bytes = self.publish(&tmp_name, &hash, size)?;
        Ok(Ingested {
            hash,
            size,
            new_bytes,
            outcome,
        })
    }

    fn fill_and_hash(&self, src: &File, tmp: &File) -> Result<(Hash, u64, CloneOutcome)> {
        let tmp_path = || self.tmp.path().to_owned();
        if self.clones {
            let outcome = clone_or_copy(src.as_fd(), tmp.as_fd())
                .map_err(|e| Error::os(rewind_platform::Error::new("clone", tmp_path(), e)))?;
            // Hash the clone, not the source: it cannot change under us.
            let (hash, size) = hash_from_start(tmp)
                .map_err(|e| Error::os(rewind_platform::Error::new("read", tmp_path(), e)))?;
            Ok((hash, size, outcome))
        } else {
            let mut h = Hasher::default();
            let size = copy_with(src.as_fd(), tmp.as_fd(), |chunk| h.update(chunk))
                .map_err(|e| Error::os(rewind_platform::Error::new("copy", tmp_path(), e)))?;
            Ok((h.finish(), size, CloneOutcome::Copied))
        }
    }

    /// Rename a filled temp file to its content address. Returns the bytes
    /// that are new to the store (0 if an identical object was there).
    fn publish(&self, tmp_name: &OsStr, hash: &Hash, size: u64) -> Result<u64> {
        let hex = hash.to_hex();
        let shard = self.shard(&hex[..2])?;
        let name = OsStr::new(&hex[2..]);
        match self
            .tmp
            .rename(tmp_name, shard, name, RenameMode::NoReplace)
        {
            Ok(()) => return Ok(size),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::os(e)),
        }
        match shard.stat_at(name) {
            // Same size: trust it (objects only ever appear complete).
            Ok(m) if m.size == size => {
                let _ = self.tmp.unlink(tmp_name);
                Ok(0)
            }
            // Damaged by an earlier crash (or by hand): replace it.
            _ => {
                self.tmp
                    .rename(tmp_name, shard, name, RenameMode::Replace)
                    .map_err(Error::os)?;
                Ok(size)
            }
        }
    }

    /// The shard directory `objects/xx/`, opened once per process.
    fn shard(&self, prefix: &str) -> Result<&Dir> {
        let index = usize::from_str_radix(prefix, 16)
            .map_err(|_| Error::Usage(format!("internal: bad object prefix {prefix}")))?;
        let slot = &self.shards[index & 0xff];
        if let Some(d) = slot.get() {
            return Ok(d);
        }
        let name = OsStr::new(prefix);
        let dir = match self.objects.open_dir(name) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => {
                match self.objects.mkdir(name, 0o755) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::os(e)),
                }
                self.objects.open_dir(name).map_err(Error::os)?
            }
            Err(e) => return Err(Error::os(e)),
        };
        Ok(slot.get_or_init(|| dir))
    }

    /// Open a stored object for reading.
    pub fn open(&self, hash: &Hash) -> Result<File> {
        let hex = hash.to_hex();
        match self.shard(&hex[..2])?.open_read(OsStr::new(&hex[2..])) {
            Ok((f, _)) => Ok(f),
            Err(e) if e.is_not_found() => Err(Error::ObjectMissing {
                hash: hex,
                path: self.objects.path().to_owned(),
            }),
            Err(e) => Err(Error::os(e)),
        }
    }

    pub fn contains(&self, hash: &Hash) -> bool {
        let hex = hash.to_hex();
        self.shard(&hex[..2])
            .is_ok_and(|d| d.stat_at(OsStr::new(&hex[2..])).is_ok())
    }

    /// Write an object's bytes into a new temp file (clone where possible).
    /// The caller sets mode/xattrs/times and renames it into the workspace.
    pub fn materialize(&self, hash: &Hash) -> Result<(OsString, File, CloneOutcome)> {
        let src = self.open(hash)?;
        let (name, file) = self.temp_file("wr", 0o600)?;
        let outcome = if self.clones {
            clone_or_copy(src.as_fd(), file.as_fd())
        } else {
            copy_with(src.as_fd(), file.as_fd(), |_| {}).map(|_| CloneOutcome::Copied)
        };
        match outcome {
            Ok(o) => Ok((name, file, o)),
            Err(e) => {
                let _ = self.tmp.unlink(&name);
                Err(Error::os(rewind_platform::Error::new(
                    "write",
                    self.tmp.path().join(&name),
                    e,
                )))
            }
        }
    }

    /// Remove every leftover in `.rewind/tmp/` (after a crash).
    pub fn clean_tmp(&self) -> Result<usize> {
        let names = self.tmp.entries().map_err(Error::os)?;
        for name in &names {
            self.tmp.remove_all(name).map_err(Error::os)?;
        }
        Ok(names.len())
    }

    /// Re-hash an object and compare with its name.
    pub fn verify(&self, hash: &Hash) -> Result<bool> {
        let mut f = self.open(hash)?;
        let (h, _) = hash_reader(&mut f)
            .map_err(|e| Error::os(rewind_platform::Error::new("read", self.objects.path(), e)))?;
        Ok(h == *hash)
    }
}

/// SHA-256 and length of a whole file, read with pread from offset 0
/// (whatever the fd's current offset).
pub fn hash_from_start(file: &File) -> std::io::Result<(Hash, u64)> {
    use std::os::unix::fs::FileExt;
    let mut h = Hasher::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        match file.read_at(&mut buf, off) {
            Ok(0) => return Ok((h.finish(), off)),
            Ok(n) => {
                h.update(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// SHA-256 and length of everything readable from `r`.
pub fn hash_reader(r: &mut impl Read) -> std::io::Result<(Hash, u64)> {
    let mut h = Hasher::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok((h.finish(), total)),
            Ok(n) => {
                h.update(&buf[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}
