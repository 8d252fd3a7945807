//! Apply a plan in place (DESIGN §4 rule 4): only changed entries are
//! touched; files are materialized under `.rewind/tmp/` and renamed over
//! their destination; extras are removed deepest-first, guided by the
//! captured tree so that nothing the capture did not see is deleted;
//! directories are created before their children and get their final mode
//! last; symlinks are placed after files. The workspace root and unchanged
//! directories keep their inodes, so a shell whose cwd is inside survives.
//!
//! Every path is opened relative to the root fd with no symlink followed
//! (rule 5): if a directory on the way was swapped for a symlink, the open
//! fails instead of writing outside the workspace.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rewind_platform::{CloneOutcome, Dir, EntryKind, Heir, Meta, RenameMode, Xattr};
use serde::Serialize;

use crate::capture::{Restored, Skipped, ancestors, display_path, is_at_or_below, split_parent};
use crate::diff::{Change, Trees};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::objects::ObjectStore;
use crate::progress::Progress;
use crate::tree::{Entry, Kind, Target};

#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions {
    pub exact_times: bool,
    pub allow_setuid: bool,
    /// The filesystem clock read before the apply began, if known: files
    /// of [`RESTORED_MIN`] bytes or more get an mtime of their own below
    /// it and are kept in [`ApplyReport::restored`] (D275).
    pub restored_below_ns: Option<i64>,
}

/// The smallest file whose stat a rewind records (D275): re-reading a
/// smaller one costs less than its row, read by every later capture.
pub const RESTORED_MIN: u64 = crate::blobs::INLINE_MAX;

/// The most files one apply records (D275): bounds its rows, read by
/// every later capture.
const RESTORED_MAX: usize = 4096;

/// How long a restored file waits for [`Restoring::settle`] at most, and
/// how many wait at once: until then a program that writes it and puts
/// its own mtime back goes unseen.
const SETTLE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);
const SETTLE_BATCH: usize = 256;
/// A file this big may take longer than [`SETTLE_EVERY`] to copy: those
/// waiting are settled before it is.
const SETTLE_BEFORE: u64 = 16 << 20;

/// Restored files made ahead of their apply (D357): a small plan's files,
/// written into `.rewind/tmp/` on another thread while the rewind's
/// intent commit waits for the disk. Nothing in the tree changes until
/// the apply renames them into place, after the intent is durable (DESIGN
/// §4 rule 3); those it does not use are unlinked when this is dropped,
/// and a crash leaves them to the next command's cleanup of `tmp/`.
#[derive(Default)]
pub struct Staged {
    tmp: Option<Dir>,
    /// By the index of their change in the plan: temp name, open file,
    /// and whether it was copied (not cloned).
    files: std::collections::HashMap<usize, (std::ffi::OsString, std::fs::File, bool)>,
}

impl Staged {
    /// At most this many files are made ahead, of at most this many bytes
    /// in all: what one intent commit's wait covers. A bigger plan makes
    /// its files in the apply, one at a time, as before.
    const MAX_FILES: usize = 64;
    const MAX_BYTES: u64 = 4 << 20;

    /// Make the plan's files ahead, if it is small enough. A file that
    /// cannot be made here (a full disk, an object missing) is left to the
    /// apply, which says why.
    pub fn stage(store: &ObjectStore, changes: &[Change]) -> Staged {
        let _t = crate::trace::span("stage restored files");
        let files: Vec<(usize, &crate::hash::Hash, u64)> = changes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.new.as_ref().map(|e| (&e.target, e.size)) {
                Some((Target::Object(h), size)) => Some((i, h, size)),
                _ => None,
            })
            .collect();
        let bytes: u64 = files.iter().map(|f| f.2).sum();
        if files.len() > Self::MAX_FILES || bytes > Self::MAX_BYTES {
            return Staged::default();
        }
        let Ok(tmp) = store.tmp_dir().try_clone() else {
            return Staged::default();
        };
        let mut staged = Staged {
            tmp: Some(tmp),
            files: Default::default(),
        };
        for (i, hash, size) in files {
            match store.materialize(hash, size) {
                Ok((name, file, how)) => {
                    staged
                        .files
                        .insert(i, (name, file, how == CloneOutcome::Copied));
                }
                Err(_) => break,
            }
        }
        staged
    }

    /// The file made ahead for the plan's change `i`, if any.
    fn take(&mut self, i: usize) -> Option<(std::ffi::OsString, std::fs::File, bool)> {
        self.files.remove(&i)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            for (name, _, _) in self.files.values() {
                let _ = tmp.unlink(name);
            }
        }
    }
}

/// The mtimes a rewind gives the files it writes, without `--exact-times`
/// (D318): each its own, a microsecond apart just below the clock read
/// before the apply, in the order of the mtimes the checkpoint recorded.
///
/// Newer than whatever the rewind left alone, so a build rebuilds what
/// depends on a restored file (DESIGN §4.9, as after `git checkout`); and
/// among the restored files as they were, so a build whose outputs came
/// back with its sources finds them as fresh as they were. Given the
/// moment each was written, a `target/` restored after `cargo clean`
/// rebuilt all 17 crates of a small project, 6 s (helper-70): a
/// dependency written after its dependent looked newer.
#[derive(Default)]
struct RestoredOrder<'a> {
    /// Each written file's path and mtime, by path.
    by_path: Vec<(&'a [u8], i64)>,
}

impl<'a> RestoredOrder<'a> {
    fn new(changes: &'a [Change], clock_ns: i64) -> RestoredOrder<'a> {
        let mut written: Vec<(i64, &[u8])> = changes
            .iter()
            .filter_map(|ch| {
                let new = ch.new.as_ref()?;
                matches!((new.kind(), &new.target), (Kind::File, Target::Object(_)))
                    .then_some((new.mtime_ns, ch.path.as_slice()))
            })
            .collect();
        written.sort_unstable();
        let n = written.len() as i64;
        // 1 ns below the clock and 1 µs apart: no clock tick of 1, 4 or
        // 10 ms lands on one (D275).
        let mut by_path: Vec<(&[u8], i64)> = written
            .into_iter()
            .enumerate()
            .map(|(rank, (_, path))| (path, clock_ns - 1 - 1000 * (n - rank as i64)))
            .collect();
        by_path.sort_unstable();
        RestoredOrder { by_path }
    }

    /// The mtime for the file at `path`, if this apply gives one.
    fn mtime(&self, path: &[u8]) -> Option<i64> {
        self.by_path
            .binary_search_by(|(p, _)| (*p).cmp(path))
            .ok()
            .map(|i| self.by_path[i].1)
    }
}

/// The restored files whose stat may come to vouch for their content
/// (D275).
///
/// Each got an mtime no other file has before the rename made it
/// visible: the clock read before the apply less 1 ns and a microsecond
/// per file, which no clock tick of 1, 4 or 10 ms lands on, and which a
/// filesystem keeping coarser times than that cannot store (the file is
/// then left out). A write sets the mtime to the time of the write, and a
/// program that puts an mtime back copies one from another file: so
/// while the mtime is the one set, nothing wrote the file. A stat taken
/// once the filesystem clock has passed its ctime then vouches for it as
/// a stat-cache record does: any later change moves the ctime past it.
#[derive(Debug, Default)]
pub struct Restoring {
    /// In place, not yet settled: path, stat before the rename, content.
    pending: Vec<(Vec<u8>, Meta, crate::hash::Hash)>,
    /// When the first of `pending` was renamed into place.
    since: Option<std::time::Instant>,
    /// How many files are recorded (at most [`RESTORED_MAX`]).
    given: usize,
    settled: Vec<(Vec<u8>, Restored)>,
}

impl Restoring {
    /// Whether one more file may be recorded: not past [`RESTORED_MAX`].
    fn take_slot(&mut self) -> bool {
        let free = self.given < RESTORED_MAX;
        self.given += usize::from(free);
        free
    }

    fn add(&mut self, path: Vec<u8>, set: Meta, hash: crate::hash::Hash) {
        self.since.get_or_insert_with(std::time::Instant::now);
        self.pending.push((path, set, hash));
    }

    fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    fn due(&self) -> bool {
        self.pending.len() >= SETTLE_BATCH
            || self.since.is_some_and(|t| t.elapsed() >= SETTLE_EVERY)
    }

    /// Record the pending files still as the apply left them, with the
    /// stat that now vouches for each. `clock_ns`: the filesystem clock
    /// read after their renames and past the time it was read (`i64::MIN`:
    /// none, and none is recorded: a change in the same tick as the stat
    /// would not show). Each is looked up by name below `root`, no symlink
    /// followed: nothing is held open meanwhile, so a rewind of thousands
    /// of big files needs no descriptor per file.
    fn settle(&mut self, root: &Dir, clock_ns: i64) {
        self.since = None;
        let pending = std::mem::take(&mut self.pending);
        if clock_ns == i64::MIN {
            return;
        }
        let mut stat = rewind_platform::StatBeneath::new(root);
        for (path, set, hash) in pending {
            let Some(now) = stat.stat(&path) else {
                continue;
            };
            let still = now.kind == EntryKind::File
                && now.ino == set.ino
                && now.size == set.size
                && now.mtime_ns == set.mtime_ns
                && now.ctime_ns < clock_ns;
            if still {
                let r = Restored {
                    ino: now.ino,
                    size: now.size,
                    mtime_ns: now.mtime_ns,
                    ctime_ns: now.ctime_ns,
                    hash,
                };
                self.settled.push((path, r));
            }
        }
    }

    /// What the apply recorded.
    pub fn settled(&self) -> &[(Vec<u8>, Restored)] {
        &self.settled
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ApplyReport {
    pub written: u64,
    pub deleted: u64,
    /// Directories left in place because they hold files the capture did
    /// not see (ignored or created meanwhile).
    pub kept: Vec<Skipped>,
    /// Paths restored without their setuid/setgid bits.
    pub setuid_stripped: Vec<String>,
    /// What to fsync to make this apply durable, where that is cheaper
    /// than one `syncfs`.
    #[serde(skip)]
    pub touched: Touched,
    /// Files written whose stat may vouch for their content (D275).
    #[serde(skip)]
    pub restored: Restoring,
}

/// The entries an apply changed, for making them durable one by one
/// (DESIGN §4 rule 6: "files fsynced, or one `syncfs`").
///
/// Why not always `syncfs`: on btrfs it commits a whole transaction, and
/// right after the safety snapshot every changed leaf is shared and must be
/// copied with its back references: 15–27 ms measured for 10 files on T1,
/// growing with the number of snapshots. An fsync goes through btrfs's log
/// tree instead (~1 ms each). On btrfs an fsynced file that is new in the
/// transaction also persists its name and new parent directories, so a
/// rename over the old file needs no directory fsync; removals do (the
/// rules RocksDB relies on, facebook/rocksdb#8903). Symlinks cannot be
/// fsynced and removed directories take their children with them: an
/// apply with either, or with more than [`Touched::MAX`] entries, asks
/// for `syncfs`. So does the rewind when the tree before the apply may
/// not be durable (no safety snapshot), and an apply that finishes an
/// interrupted one: the fsyncs cover only what this apply touched.
#[derive(Debug, Clone, Default)]
pub struct Touched {
    /// Regular files written (renamed into place).
    pub files: Vec<Vec<u8>>,
    /// Directories to fsync: those that lost an entry, were created, or had
    /// their metadata set.
    pub dirs: std::collections::BTreeSet<Vec<u8>>,
    /// Only a `syncfs` covers this apply.
    pub whole_fs: bool,
}

impl Touched {
    /// Past this many entries, only a `syncfs` is considered (see
    /// `Workspace::sync_applied` for where fewer fsyncs pay).
    pub const MAX: usize = crate::durable::MAX;

    fn file(&mut self, path: &[u8]) {
        if self.files.iter().any(|f| f == path) {
            return;
        }
        self.files.push(path.to_vec());
        self.check();
    }

    fn dir(&mut self, path: &[u8]) {
        self.dirs.insert(path.to_vec());
        self.check();
    }

    /// Only a `syncfs` will do (see the callers).
    pub fn needs_syncfs(&mut self) {
        self.whole_fs = true;
        self.files = Vec::new();
        self.dirs.clear();
    }

    fn check(&mut self) {
        if self.files.len() + self.dirs.len() > Self::MAX {
            self.needs_syncfs();
        }
    }

    /// Nothing was changed.
    pub fn is_empty(&self) -> bool {
        !self.whole_fs && self.files.is_empty() && self.dirs.is_empty()
    }

    /// How many fsyncs [`Touched::fsync_each`] makes.
    pub fn len(&self) -> usize {
        self.files.len() + self.dirs.len()
    }

    /// Add the entries that may not be durable although the apply left
    /// them alone (`crate::durable`), and the root. Each is stat'ed first:
    /// one that is gone needs nothing (its parent's ctime moved, so the
    /// parent is listed too); a symlink cannot be fsynced.
    pub fn add_unsynced<'p>(
        &mut self,
        root: &Dir,
        paths: impl IntoIterator<Item = &'p Vec<u8>>,
    ) -> Result<()> {
        self.dir(b"");
        let mut parents = Parents::new(root);
        for path in paths {
            if self.whole_fs {
                break;
            }
            let (parent, name) = split_parent(path);
            let meta = match parents.get(parent) {
                Ok(dir) => dir.stat_at(OsStr::from_bytes(name)),
                Err(Error::Os(e)) if e.is_not_found() => continue,
                Err(Error::Os(e)) if e.is_redirected() => {
                    self.needs_syncfs();
                    break;
                }
                Err(e) => return Err(e),
            };
            match meta {
                Ok(m) if m.kind == EntryKind::File => self.file(path),
                Ok(m) if m.kind == EntryKind::Dir => self.dir(path),
                Ok(m) if m.kind == EntryKind::Symlink => self.needs_syncfs(),
                // Never captured: not part of any checkpoint.
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(Error::os(e)),
            }
        }
        Ok(())
    }

    /// fsync every entry, reopened beneath `root` without following a
    /// symlink (siblings share their parent's fd), on up to `threads`
    /// threads (the filesystem decides what concurrency buys, see
    /// `Workspace::fsync_budget`). An error (an entry the agent removed
    /// meanwhile) tells the caller to `syncfs` instead. Gives back each
    /// entry with its ctime just before its fsync (`crate::durable`, 4).
    pub fn fsync_each(&self, root: &Dir, threads: usize) -> Result<Vec<(Vec<u8>, i64)>> {
        let jobs: Vec<(&[u8], bool)> = self
            .files
            .iter()
            .map(|f| (f.as_slice(), false))
            .chain(self.dirs.iter().map(|d| (d.as_slice(), true)))
            .collect();
        let done = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
        crate::threads::in_parts(&jobs, threads, |part| fsync_entries(root, part, &done))?;
        Ok(done.into_inner().unwrap_or_else(|p| p.into_inner()))
    }
}

/// fsync these entries in turn (a directory when the flag says so), adding
/// each with its ctime before the fsync to `done`.
fn fsync_entries(
    root: &Dir,
    entries: &[(&[u8], bool)],
    done: &std::sync::Mutex<Vec<(Vec<u8>, i64)>>,
) -> Result<()> {
    let mut parents = Parents::new(root);
    let mut mine = Vec::with_capacity(entries.len());
    for &(path, is_dir) in entries {
        let meta = if is_dir {
            let dir = parents.get(path)?;
            let meta = dir.meta().map_err(Error::os)?;
            dir.fsync().map_err(Error::os)?;
            meta
        } else {
            let (parent, name) = split_parent(path);
            parents
                .get(parent)?
                .fsync_file(OsStr::from_bytes(name))
                .map_err(Error::os)?
        };
        mine.push((path.to_vec(), meta.ctime_ns));
    }
    done.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
    Ok(())
}

const SETID_BITS: u32 = 0o6000;

/// Clone `path` out of a read-only snapshot into a temp file. `None` when
/// the snapshot does not hold a regular file of that size there (then the
/// object store is asked).
fn from_snapshot(
    snap: &Dir,
    store: &ObjectStore,
    path: &[u8],
    size: u64,
) -> Result<Option<(std::ffi::OsString, std::fs::File)>> {
    use std::os::fd::AsFd;
    let (parent, name) = split_parent(path);
    let Ok(dir) = snap.open_beneath(Path::new(OsStr::from_bytes(parent))) else {
        return Ok(None);
    };
    let Ok((src, meta)) = dir.open_read(OsStr::from_bytes(name)) else {
        return Ok(None);
    };
    if meta.kind != EntryKind::File || meta.size != size {
        return Ok(None);
    }
    let (tmp_name, file) = store.temp_file("wr", 0o600)?;
    if let Err(e) = rewind_platform::clone_or_copy(src.as_fd(), file.as_fd()) {
        let _ = store.tmp_dir().unlink(&tmp_name);
        return Err(Error::os(rewind_platform::Error::new(
            "clone from snapshot",
            snap.path().join(OsStr::from_bytes(path)),
            e,
        )));
    }
    Ok(Some((tmp_name, file)))
}

/// Opens parent directories beneath the root, reusing the last one (a plan
/// is in path order, so siblings come together).
///
/// A parent its owner may not write (mode 500 or 555: a Go module cache,
/// `chmod -R a-w`) is made writable for the apply and given its mode back
/// after ([`Parents::restore`]). Root writes there anyway; another user
/// could, before, never rewind a change inside one (D115).
///
/// Run as root (`sudo rewind`, or the daemon of `sudo rewind mount`), the
/// apply gives what it makes to the owner and group of the directory it
/// goes into ([`Parents::heir`]): made root's, a user's restored files
/// were theirs no more, and their next edit failed (D147).
struct Parents<'a> {
    root: &'a Dir,
    last: Option<(Vec<u8>, Dir)>,
    /// Who gets what is made in `last` ([`Heir::of`]), when `bequeath`.
    last_heir: Option<Heir>,
    /// Whether to look for heirs (as root).
    bequeath: bool,
    /// Directories made writable, with the mode each had.
    relaxed: Vec<(Vec<u8>, u32)>,
    /// Whether to make read-only parents writable (not as root, who
    /// writes there anyway, and only for the apply).
    relax: bool,
}

impl<'a> Parents<'a> {
    /// For reading and fsyncing: modes are left alone.
    fn new(root: &'a Dir) -> Parents<'a> {
        Parents {
            root,
            last: None,
            last_heir: None,
            bequeath: false,
            relaxed: Vec::new(),
            relax: false,
        }
    }

    /// For the apply, which writes: a parent the owner cannot write is
    /// made writable until [`Parents::restore`].
    fn for_writing(root: &'a Dir) -> Parents<'a> {
        let root_runs = rewind_platform::is_root();
        Parents {
            relax: !root_runs,
            bequeath: root_runs,
            ..Parents::new(root)
        }
    }

    fn get(&mut self, parent: &[u8]) -> Result<&Dir> {
        if self.last.as_ref().is_none_or(|(p, _)| p != parent) {
            let dir = self
                .root
                .open_beneath(Path::new(OsStr::from_bytes(parent)))
                .map_err(Error::os)?;
            if self.relax && !self.relaxed.iter().any(|(p, _)| p == parent) {
                let meta = dir.meta().map_err(Error::os)?;
                if meta.mode & 0o300 != 0o300 && dir.set_own_mode(meta.mode | 0o300).is_ok() {
                    self.relaxed.push((parent.to_vec(), meta.mode));
                }
            }
            self.last_heir = if self.bequeath {
                Heir::of(&dir).map_err(Error::os)?
            } else {
                None
            };
            self.last = Some((parent.to_vec(), dir));
        }
        match &self.last {
            Some((_, d)) => Ok(d),
            None => Err(Error::Usage(
                "internal: parent directory cache empty".into(),
            )),
        }
    }

    fn forget(&mut self) {
        self.last = None;
        self.last_heir = None;
    }

    /// Who is to own what the apply makes in `parent`: `None` keeps the
    /// maker's (not root, or a directory of root's).
    fn heir(&mut self, parent: &[u8]) -> Result<Option<Heir>> {
        if !self.bequeath {
            return Ok(None);
        }
        self.get(parent)?;
        Ok(self.last_heir)
    }

    /// `parent`, to make an entry in, with its heir; `None` when another
    /// program removed it while the rewind ran (D172).
    fn enter(&mut self, parent: &[u8]) -> Result<Option<(&Dir, Option<Heir>)>> {
        let Some(heir) = unless_vanished(self.heir(parent))? else {
            return Ok(None);
        };
        Ok(unless_vanished(self.get(parent))?.map(|dir| (dir, heir)))
    }

    /// Give the directories made writable their modes back, deepest
    /// first, except those the apply set a mode on itself (`done`).
    fn restore(&mut self, done: &HashSet<Vec<u8>>) -> Result<()> {
        self.forget();
        let mut relaxed = std::mem::take(&mut self.relaxed);
        relaxed.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        for (path, mode) in relaxed {
            if done.contains(&path) {
                continue;
            }
            // Removed by the apply, or replaced by a non-directory.
            let dir = match self.root.open_beneath(Path::new(OsStr::from_bytes(&path))) {
                Ok(d) => d,
                Err(e) if e.is_not_found() || e.raw_os_error() == Some(20) => continue,
                Err(e) => return Err(Error::os(e)),
            };
            dir.set_own_mode(mode).map_err(Error::os)?;
        }
        Ok(())
    }
}

/// Apply `changes` to the tree at `root`. File contents come from
/// `snapshot` (the target checkpoint's read-only btrfs snapshot) when it
/// has one, else from the object store. `clock` reads the filesystem
/// clock once it has passed its reading (for [`Restoring`], D275).
#[allow(clippy::too_many_arguments)] // each an independent input of one apply
pub fn apply(
    root: &Dir,
    store: &ObjectStore,
    snapshot: Option<&Dir>,
    trees: &Trees<'_>,
    changes: &[Change],
    opts: ApplyOptions,
    progress: &Progress,
    clock: &dyn Fn() -> i64,
    mut staged: Staged,
) -> Result<ApplyReport> {
    let mut report = ApplyReport::default();
    let mut parents = Parents::for_writing(root);
    let dest = |path: &[u8]| root.path().join(OsStr::from_bytes(path));

    let phase = crate::trace::span("apply: removals");
    // 1. Removals: everything whose old entry goes away or changes type.
    //    Only top-most ones: a removed directory takes its captured
    //    children with it.
    //    Parents come before their children in a plan, so checking each
    //    change's ancestors against the set is enough (O(depth) each).
    let mut removed_dirs: HashSet<&[u8]> = HashSet::new();
    let mut removals: Vec<&Change> = Vec::new();
    // Every entry that goes, those below a removed directory included: a
    // deleted `node_modules` showed `0/1` until its 60,000 entries were
    // gone (helper-74).
    let mut going = 0u64;
    for ch in changes {
        let Some(old) = &ch.old else { continue };
        let goes = ch.new.as_ref().is_none_or(|n| n.kind() != old.kind());
        going += u64::from(goes);
        if !goes || ancestors(&ch.path).any(|a| removed_dirs.contains(a)) {
            continue;
        }
        if old.kind() == Kind::Dir {
            removed_dirs.insert(&ch.path);
        }
        removals.push(ch);
    }
    removals.sort_by_key(|c| std::cmp::Reverse(c.depth()));
    // What the progress line counts: each entry removed, each file and
    // directory made, as the final line's "written" counts them (its
    // total counted files only, helper-74 and helper-76).
    let made = changes
        .iter()
        .filter(|c| {
            c.new.as_ref().is_some_and(|n| match n.kind() {
                Kind::File => true,
                Kind::Dir => c.old.as_ref().is_none_or(|o| o.kind() != Kind::Dir),
                Kind::Symlink => false,
            })
        })
        .count();
    progress.set_total(going + made as u64);
    for ch in removals {
        let (parent, name) = split_parent(&ch.path);
        // Its directory removed meanwhile by another program: so is it.
        let Some(dir) = unless_vanished(parents.get(parent))? else {
            continue;
        };
        let old = ch
            .old
            .as_ref()
            .ok_or_else(|| Error::Usage("internal: removal without old entry".into()))?;
        let deleted_before = report.deleted;
        remove_guided(
            dir,
            OsStr::from_bytes(name),
            old,
            trees,
            &ch.path,
            &mut report,
            progress,
        )?;
        // A type change is one entry written, as its dry run counts it:
        // what it replaced is no deletion of its own; what was below a
        // directory it replaced is (helper-58, D295).
        if ch.new.is_some()
            && report.deleted > deleted_before
            && dir
                .stat_at(OsStr::from_bytes(name))
                .is_err_and(|e| e.is_not_found())
        {
            report.deleted -= 1;
        }
        if old.kind() == Kind::Dir {
            report.touched.needs_syncfs();
        } else {
            report.touched.dir(parent);
        }
        failpoint::hit("apply:removed");
    }
    parents.forget();

    drop(phase);
    let phase = crate::trace::span("apply: directories and files");
    // 2. Directories and files, parents first (changes are in pre-order).
    // Directories whose metadata is set last, with their target entry when
    // a change carries it (parents under --exact-times are looked up).
    let mut dir_fixups: BTreeMap<Vec<u8>, Option<Entry>> = BTreeMap::new();
    // Directories the plan changes in place (mode, xattrs): written once
    // their metadata is set, so that a rewind's count is its dry run's
    // (helper-55).
    let mut changed_in_place: HashSet<Vec<u8>> = HashSet::new();
    let mut links: Vec<&Change> = Vec::new();
    // Paths where something the capture did not see was found (D111):
    // they and everything below them are left as they are.
    let mut uncaptured: HashSet<Vec<u8>> = HashSet::new();
    let mut writeback = Writeback::default();
    let order = match opts.restored_below_ns {
        Some(clock) if !opts.exact_times => RestoredOrder::new(changes, clock),
        _ => RestoredOrder::default(),
    };
    for (i, ch) in changes.iter().enumerate() {
        // Every entry, not only after a file: thousands of directories
        // made in a row kept a restored file waiting (helper-51).
        if report.restored.due() {
            report.restored.settle(root, clock());
        }
        let Some(new) = &ch.new else { continue };
        if is_at_or_below(&ch.path, &uncaptured) {
            continue;
        }
        let (parent, name) = split_parent(&ch.path);
        let name = OsStr::from_bytes(name);
        match new.kind() {
            Kind::Dir => {
                if ch.old.as_ref().is_none_or(|o| o.kind() != Kind::Dir) {
                    let Some((dir, heir)) = parents.enter(parent)? else {
                        keep_vanished(parent, &mut uncaptured, &mut report);
                        continue;
                    };
                    match dir.mkdir(name, 0o700) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            keep_uncaptured(&ch.path, &mut uncaptured, &mut report);
                            continue;
                        }
                        Err(e) if e.is_not_found() => {
                            keep_vanished(parent, &mut uncaptured, &mut report);
                            continue;
                        }
                        Err(e) => return Err(Error::os(e)),
                    }
                    if let Some(h) = heir {
                        h.give_at(dir, name).map_err(Error::os)?;
                    }
                    report.written += 1;
                    report.touched.dir(&ch.path);
                    progress.inc(1);
                    failpoint::hit("apply:dir-created");
                } else {
                    changed_in_place.insert(ch.path.clone());
                }
                dir_fixups.insert(ch.path.clone(), Some(new.clone()));
            }
            Kind::File => {
                let Target::Object(hash) = &new.target else {
                    continue;
                };
                // Not left waiting through a long copy (D275).
                if report.restored.waiting() && new.size >= SETTLE_BEFORE {
                    report.restored.settle(root, clock());
                }
                let made = match staged.take(i) {
                    Some(made) => Some(made),
                    None => snapshot
                        .map(|s| from_snapshot(s, store, &ch.path, new.size))
                        .transpose()?
                        .flatten()
                        .map(|(n, f)| (n, f, false)),
                };
                let (tmp_name, file, copied) = match made {
                    Some(made) => made,
                    None => {
                        let (n, f, how) = store.materialize(hash, new.size).map_err(|e| {
                            // Named for the file it was for, as the objects
                            // check names one.
                            match &e {
                                Error::Os(os) if os.kind() == std::io::ErrorKind::InvalidData => {
                                    Error::ObjectMissing {
                                        hash: hash.to_hex(),
                                        path: dest(&ch.path),
                                    }
                                }
                                _ => e,
                            }
                        })?;
                        (n, f, how == CloneOutcome::Copied)
                    }
                };
                let mode = allowed_mode(new, opts, &ch.path, &mut report);
                // The file is made under a temp name in `.rewind/tmp`; a
                // failure names the path it is for (a temp name meant
                // nothing to the user whose filesystem cannot store an
                // xattr or a mode).
                let failed = |op, e| Error::os(rewind_platform::Error::new(op, dest(&ch.path), e));
                let Some((dir, heir)) = parents.enter(parent)? else {
                    let _ = store.tmp_dir().unlink(&tmp_name);
                    keep_vanished(parent, &mut uncaptured, &mut report);
                    continue;
                };
                if let Some(h) = heir {
                    h.give_fd(&file, &dest(&ch.path)).map_err(Error::os)?;
                }
                rewind_platform::file_set_mode(&file, mode)
                    .map_err(|e| failed("restore: chmod", e))?;
                if !new.xattrs.is_empty() {
                    Xattr::set_user(&file, &new.xattrs)
                        .map_err(|e| failed("restore: set xattrs of", e))?;
                }
                if opts.exact_times {
                    rewind_platform::file_set_mtime(&file, new.mtime_ns)
                        .map_err(|e| failed("restore: set the mtime of", e))?;
                }
                // An mtime of its own just below the clock, in the order
                // the checkpoint had (D318); the big files' recorded
                // (D275). With exact times the checkpoint's, which other
                // files may share.
                let given = order
                    .mtime(&ch.path)
                    .filter(|m| rewind_platform::file_set_mtime(&file, *m).is_ok());
                let restoring = given
                    .filter(|_| new.size >= RESTORED_MIN && report.restored.take_slot())
                    .and_then(|mtime| {
                        Meta::of_file(&file)
                            .ok()
                            .filter(|m| m.mtime_ns == mtime && m.size == new.size)
                    });
                if let Some(old) = ch.old.as_ref().filter(|o| o.kind() == Kind::File)
                    && written_since_capture(dir, name, old)
                {
                    let _ = store.tmp_dir().unlink(&tmp_name);
                    keep_written(&ch.path, &mut uncaptured, &mut report);
                    continue;
                }
                if let Err(e) =
                    store
                        .tmp_dir()
                        .rename(&tmp_name, dir, name, replacing(ch, Kind::File))
                {
                    let _ = store.tmp_dir().unlink(&tmp_name);
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        keep_uncaptured(&ch.path, &mut uncaptured, &mut report);
                        continue;
                    }
                    if e.is_not_found() {
                        keep_vanished(parent, &mut uncaptured, &mut report);
                        continue;
                    }
                    return Err(Error::os(e));
                }
                // Only now (D243): the writeback's completion locks the
                // file's inode, and a rename that cannot take that lock
                // at once sleeps a whole tick on XFS.
                if copied {
                    writeback.start(file, report.touched.whole_fs);
                } else {
                    drop(file);
                }
                if let Some(set) = restoring {
                    report.restored.add(ch.path.clone(), set, *hash);
                }
                // Before the progress line, which a stopped terminal
                // could hold.
                if report.restored.due() {
                    report.restored.settle(root, clock());
                }
                report.written += 1;
                report.touched.file(&ch.path);
                failpoint::hit("apply:file-written");
                progress.inc(1);
            }
            Kind::Symlink => links.push(ch),
        }
    }

    if report.restored.waiting() {
        report.restored.settle(root, clock());
    }
    writeback.finish();
    drop(phase);
    let phase = crate::trace::span("apply: symlinks");
    // 3. Symlinks last: made in tmp, renamed over (atomic replace).
    for ch in links {
        let Some(Entry {
            target: Target::Link(target),
            mtime_ns,
            ..
        }) = &ch.new
        else {
            continue;
        };
        if is_at_or_below(&ch.path, &uncaptured) {
            continue;
        }
        let (parent, name) = split_parent(&ch.path);
        let tmp_name = store.temp_name("ln");
        store.tmp_dir().symlink(target, &tmp_name).map_err(|e| {
            Error::os(rewind_platform::Error::new(
                "restore: make the symlink",
                dest(&ch.path),
                e.source,
            ))
        })?;
        let Some((dir, heir)) = parents.enter(parent)? else {
            let _ = store.tmp_dir().unlink(&tmp_name);
            keep_vanished(parent, &mut uncaptured, &mut report);
            continue;
        };
        if let Some(h) = heir {
            h.give_at(store.tmp_dir(), &tmp_name).map_err(|e| {
                let _ = store.tmp_dir().unlink(&tmp_name);
                Error::os(rewind_platform::Error::new(
                    "restore: chown",
                    dest(&ch.path),
                    e.source,
                ))
            })?;
        }
        if let Err(e) = store.tmp_dir().rename(
            &tmp_name,
            dir,
            OsStr::from_bytes(name),
            replacing(ch, Kind::Symlink),
        ) {
            let _ = store.tmp_dir().unlink(&tmp_name);
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                keep_uncaptured(&ch.path, &mut uncaptured, &mut report);
                continue;
            }
            if e.is_not_found() {
                keep_vanished(parent, &mut uncaptured, &mut report);
                continue;
            }
            return Err(Error::os(e));
        }
        // The link's own time: it was left at "now", so `--exact-times`
        // saw it differ at every rewind, which then recorded an
        // operation each time (D177).
        if opts.exact_times {
            dir.set_mtime(OsStr::from_bytes(name), EntryKind::Symlink, *mtime_ns)
                .map_err(Error::os)?;
        }
        report.written += 1;
        report.touched.needs_syncfs();
        failpoint::hit("apply:symlink-written");
    }
    parents.forget();

    drop(phase);
    let _phase = crate::trace::span("apply: directory metadata");
    // 4. Directory metadata, deepest first, so a read-only directory is
    //    made read-only only after its children are in place. With exact
    //    times, every parent of a change gets its recorded mtime back too.
    if opts.exact_times {
        for ch in changes {
            let mut p: &[u8] = &ch.path;
            while !p.is_empty() {
                p = split_parent(p).0;
                dir_fixups.entry(p.to_vec()).or_insert(None);
            }
        }
    }
    // The root's own metadata is not part of the tree.
    dir_fixups.remove(&Vec::new());
    let mut fixed: HashSet<Vec<u8>> = HashSet::new();
    let mut fixups: Vec<(Vec<u8>, Option<Entry>)> = dir_fixups.into_iter().collect();
    fixups.sort_by_key(|(p, _)| std::cmp::Reverse(p.iter().filter(|&&c| c == b'/').count()));
    for (path, entry) in fixups {
        if is_at_or_below(&path, &uncaptured) {
            continue;
        }
        let Some(entry) = entry.or_else(|| lookup_target(trees, &path)) else {
            continue;
        };
        if entry.kind() != Kind::Dir {
            continue;
        }
        let mode = allowed_mode(&entry, opts, &path, &mut report);
        let (parent, name) = split_parent(&path);
        let Some(dir) = unless_vanished(parents.get(parent))? else {
            keep_vanished(parent, &mut uncaptured, &mut report);
            continue;
        };
        let name = OsStr::from_bytes(name);
        let set = || -> rewind_platform::Result<()> {
            dir.set_user_xattrs(name, EntryKind::Dir, &entry.xattrs)?;
            if opts.exact_times {
                dir.set_mtime(name, EntryKind::Dir, entry.mtime_ns)?;
            }
            dir.set_mode(name, EntryKind::Dir, mode)
        };
        match set() {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {
                keep_vanished(&path, &mut uncaptured, &mut report);
                continue;
            }
            Err(e) => return Err(Error::os(e)),
        }
        if changed_in_place.contains(&path) {
            report.written += 1;
        }
        report.touched.dir(&path);
        fixed.insert(path);
        failpoint::hit("apply:meta-fixed");
    }
    parents.restore(&fixed)?;
    Ok(report)
}

/// Starts the writeback of each restored file it is given (D200), so that
/// the fsyncs or the `syncfs` that follow find its pages written or in
/// flight. Past [`Touched::MAX`] entries (a deleted `node_modules` coming
/// back) it does so on a thread of its own: `sync_file_range` cost this
/// thread ~8 µs a file, a third of a 63,000-file apply, and leaving the
/// pages to the `syncfs` instead only moved that wait there (D321).
#[derive(Default)]
struct Writeback {
    thread: Option<(
        std::sync::mpsc::SyncSender<std::fs::File>,
        std::thread::JoinHandle<()>,
    )>,
    /// Past [`Touched::MAX`] with no thread: none could be started, or
    /// the process has no descriptors to spare for one.
    inline: bool,
}

impl Writeback {
    /// Most open files waiting for the thread: the descriptors it holds.
    /// 256 failed with EMFILE under hard limits of 160 to 400 that the
    /// apply alone fits in, once the thread fell behind a slow disk
    /// (helper-72); a quarter of what the process may still open, at most
    /// 16, keeps it inside any limit, and no thread where that is none.
    const QUEUE: u64 = 16;

    fn start(&mut self, file: std::fs::File, bulk: bool) {
        if bulk && self.thread.is_none() && !self.inline {
            self.thread = Self::spawn();
            self.inline = self.thread.is_none();
        }
        match &self.thread {
            Some((tx, _)) => {
                if let Err(std::sync::mpsc::SendError(f)) = tx.send(file) {
                    rewind_platform::start_writeback(&f);
                }
            }
            None => rewind_platform::start_writeback(&file),
        }
    }

    fn spawn() -> Option<(
        std::sync::mpsc::SyncSender<std::fs::File>,
        std::thread::JoinHandle<()>,
    )> {
        let queue = rewind_platform::fd_headroom()
            .map_or(0, |h| h / 4)
            .min(Self::QUEUE);
        if queue == 0 {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::fs::File>(queue as usize);
        std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                rx.into_iter()
                    .for_each(|f| rewind_platform::start_writeback(&f))
            })
            .ok()
            .map(|t| (tx, t))
    }

    /// Every file handed over has had its writeback started and is closed.
    fn finish(&mut self) {
        if let Some((tx, thread)) = self.thread.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.finish();
    }
}

/// How an entry of kind `kind` goes into place. Over an old entry of the
/// same kind the capture saw, it replaces it; anywhere else the plan
/// expects nothing (the old entry was removed in step 1, or there was
/// none), so something found there was never captured: an ignored path,
/// a file the capture could not read, one created during the rewind.
/// Replacing it lost it for good (D111); `NoReplace` finds it instead.
fn replacing(ch: &Change, kind: Kind) -> RenameMode {
    match &ch.old {
        Some(old) if old.kind() == kind => RenameMode::Replace,
        _ => RenameMode::NoReplace,
    }
}

/// Whether the file the capture saw at `name` was written since: its size
/// or mtime moved (a log a test runner still appends to, an editor's
/// save). Replacing or deleting it lost that write, which no checkpoint
/// holds (D116). Gone or unreadable: nothing to keep here.
fn written_since_capture(dir: &Dir, name: &OsStr, old: &Entry) -> bool {
    dir.stat_at(name)
        .is_ok_and(|m| moved_since_capture(&m, old))
}

/// Whether what is at a path now is not the file the capture saw there.
fn moved_since_capture(now: &Meta, old: &Entry) -> bool {
    now.kind != EntryKind::File || now.size != old.size || now.mtime_ns != old.mtime_ns
}

/// Leave a file written during the rewind as it is, and say so.
fn keep_written(path: &[u8], kept: &mut HashSet<Vec<u8>>, report: &mut ApplyReport) {
    kept.insert(path.to_vec());
    report_written_during(path, report);
}

fn report_written_during(path: &[u8], report: &mut ApplyReport) {
    report.kept.push(Skipped::new(
        path,
        "kept: written during the rewind, after it was captured",
    ));
}

/// `Ok(None)` where `r` failed because a directory of the plan is no
/// longer there: another program removed it while the rewind ran (a watcher, a build, `npm install`). Such an
/// error was fatal, and its retry and roll-back met it again, leaving
/// the rewind pending behind a bare IO error (D172).
fn unless_vanished<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        // Only "gone": a symlink or file put in its place (ENOTDIR, ELOOP)
        // is an error, and D96's retry from a fresh capture replaces it.
        Err(Error::Os(e)) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Leave what another program removed during the rewind as it is now,
/// with everything the plan would put below it, and say so (D172). A
/// parent met gone by several entries is reported once.
fn keep_vanished(path: &[u8], uncaptured: &mut HashSet<Vec<u8>>, report: &mut ApplyReport) {
    if !uncaptured.contains(path) {
        keep_as_is(
            path,
            uncaptured,
            report,
            "kept: another program removed it while the rewind ran",
        );
    }
}

/// Leave an entry the capture never saw, and everything the plan would
/// put below it, as it is, and say so.
fn keep_uncaptured(path: &[u8], uncaptured: &mut HashSet<Vec<u8>>, report: &mut ApplyReport) {
    keep_as_is(path, uncaptured, report, UNCAPTURED_THERE);
}

/// Why an entry the plan replaces is still there: something its capture
/// did not see is in it or at it.
pub(crate) const UNCAPTURED_THERE: &str = "kept: something no checkpoint captured is there (ignored, unreadable, or made during the rewind)";

/// Leave `path`, and everything the plan would put below it, as it is,
/// and report why.
fn keep_as_is(path: &[u8], uncaptured: &mut HashSet<Vec<u8>>, report: &mut ApplyReport, why: &str) {
    uncaptured.insert(path.to_vec());
    report.kept.push(Skipped::new(path, why));
}

/// The target-side entry of a parent directory that is not itself a change
/// (only needed for `--exact-times`).
fn lookup_target(trees: &Trees<'_>, path: &[u8]) -> Option<Entry> {
    let root = trees.target_root()?;
    trees.entry_at(&root, path).ok().flatten()
}

/// `entry`'s mode as the rewind may restore it: a file's setuid and
/// setgid bits only with `--allow-setuid`. A directory's setgid bit is
/// kept: it grants nothing, it gives what is made inside the
/// directory's group, and stripping it changed a shared project's
/// group for every file made after the rewind (helper-79).
fn allowed_mode(entry: &Entry, opts: ApplyOptions, path: &[u8], report: &mut ApplyReport) -> u32 {
    let risky = match entry.kind() {
        Kind::Dir => entry.mode & SETID_BITS & !0o2000,
        _ => entry.mode & SETID_BITS,
    };
    if risky != 0 && !opts.allow_setuid {
        report.setuid_stripped.push(display_path(path));
        entry.mode & !risky
    } else {
        entry.mode
    }
}

/// Remove what the capture saw at `name`, and only that. A directory that
/// still holds something else afterwards is kept and reported.
fn remove_guided(
    dir: &Dir,
    name: &OsStr,
    old: &Entry,
    trees: &Trees<'_>,
    path: &[u8],
    report: &mut ApplyReport,
    progress: &Progress,
) -> Result<()> {
    progress.inc(1);
    let meta = match dir.stat_at(name) {
        Ok(m) => m,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(Error::os(e)),
    };
    if meta.kind != EntryKind::Dir {
        if old.kind() == Kind::File && moved_since_capture(&meta, old) {
            report_written_during(path, report);
            return Ok(());
        }
        // A file, a symlink (never followed), or what replaced the captured
        // directory since: unlink the name.
        match dir.unlink(name) {
            Ok(()) => report.deleted += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(Error::os(e)),
        }
        return Ok(());
    }
    let Target::Tree(h) = old.target else {
        // Captured as a file but now a directory: remove it only if empty.
        return rmdir_or_keep(dir, name, path, report, false);
    };
    let sub = match dir.open_dir(name) {
        Ok(d) => d,
        // Removed meanwhile by another program: nothing left to remove.
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            dir.set_mode(name, EntryKind::Dir, 0o700)
                .map_err(Error::os)?;
            dir.open_dir(name).map_err(Error::os)?
        }
        Err(e) => return Err(Error::os(e)),
    };
    if sub.meta().map_err(Error::os)?.mode & 0o300 != 0o300 {
        dir.set_mode(name, EntryKind::Dir, 0o700)
            .map_err(Error::os)?;
    }
    let node = trees.node(&h)?;
    let kept_before = report.kept.len();
    for child in &node.entries {
        let mut child_path = path.to_vec();
        child_path.push(b'/');
        child_path.extend_from_slice(&child.name);
        remove_guided(
            &sub,
            OsStr::from_bytes(&child.name),
            child,
            trees,
            &child_path,
            report,
            progress,
        )?;
    }
    // Kept because something below it was kept: that entry says why, and
    // a chain of 1,000 parents would bury it (D166).
    let below_kept = report.kept.len() > kept_before;
    rmdir_or_keep(dir, name, path, report, below_kept)
}

/// Why a directory the plan deletes is still there: its capture did not
/// hold all of it (a nested workspace's history, an ignored file).
pub(crate) const HOLDS_UNCAPTURED: &str = "kept: holds files that were not captured";

/// `below_kept`: an entry below it is already reported as kept, which
/// explains this directory too.
fn rmdir_or_keep(
    dir: &Dir,
    name: &OsStr,
    path: &[u8],
    report: &mut ApplyReport,
    below_kept: bool,
) -> Result<()> {
    match dir.rmdir(name) {
        Ok(()) => {
            report.deleted += 1;
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) if e.raw_os_error() == Some(39) && below_kept => Ok(()),
        Err(e) if e.raw_os_error() == Some(39) => {
            report.kept.push(Skipped::new(path, HOLDS_UNCAPTURED));
            Ok(())
        }
        Err(e) => Err(Error::os(e)),
    }
}
