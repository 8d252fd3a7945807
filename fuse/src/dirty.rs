//! The dirty set: which entries of which directories changed since the
//! last checkpoint's capture began. A checkpoint takes the set (new changes go to a fresh
//! one); if its capture is not committed, the taken set is merged back, so
//! a failed or killed checkpoint loses nothing.

use std::collections::{HashMap, HashSet};

/// The ignore file whose change alters what is captured in a whole subtree.
const IGNORE_FILE: &[u8] = b".rewindignore";

/// Past this many changed names, a directory is simply "all changed"
/// (listing and stat-ing it is cheaper than remembering).
const NAMES_CAP: usize = 512;

/// The changed entries of one directory: `None` means any of them.
pub type Names = Option<HashSet<Vec<u8>>>;

/// What a checkpoint must look at.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DirtySet {
    /// Everything may have changed (fresh mount, lost track, a hard link
    /// with names the daemon never saw): walk the whole tree.
    pub all: bool,
    /// Directories whose entries changed, with the names that did.
    pub dirs: HashMap<Vec<u8>, Names>,
    /// Directories whose whole subtree must be walked.
    pub deep: HashSet<Vec<u8>>,
    /// Files opened for writing since the last capture: read again
    /// whatever their stat says (a write through a shared mapping may
    /// move no time, D247).
    pub reread: HashSet<Vec<u8>>,
    /// Files open for writing now: their writeback is started before they
    /// are read, so that a later write through a mapping moves their
    /// times (D250). Not kept: each take says it anew.
    pub open: HashSet<Vec<u8>>,
}

impl DirtySet {
    fn merge(&mut self, other: DirtySet) {
        self.all |= other.all;
        for (dir, names) in other.dirs {
            match names {
                None => {
                    self.dirs.insert(dir, None);
                }
                Some(ns) => {
                    for n in ns {
                        self.add(&dir, &n);
                    }
                }
            }
        }
        self.deep.extend(other.deep);
        self.reread.extend(other.reread);
    }

    fn add(&mut self, dir: &[u8], name: &[u8]) {
        let slot = self
            .dirs
            .entry(dir.to_vec())
            .or_insert_with(|| Some(HashSet::new()));
        if let Some(names) = slot {
            names.insert(name.to_vec());
            if names.len() > NAMES_CAP {
                *slot = None;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.dirs.is_empty() && self.deep.is_empty() && self.reread.is_empty()
    }
}

#[derive(Default)]
struct State {
    current: DirtySet,
    taken: Option<DirtySet>,
    /// Turns at every take: a [`Mutation`] that began before the turn
    /// marks its paths again when it ends.
    epoch: u64,
    /// Inodes open for writing, with their open count: written through
    /// passthrough without the daemon seeing it, so they stay dirty.
    writers: HashMap<u64, u32>,
    /// Inodes opened for writing since the last take (D247).
    reread: HashSet<u64>,
    /// Inodes whose passthrough handle for writing was released, with the
    /// processes that opened them so: a shared mapping made through the
    /// handle outlives it, and writes through it reach the backing file
    /// unseen (D256). Each take keeps only the processes that still map
    /// the file. Every one is kept until then: with the last two only,
    /// two short-lived openers pushed out the process that mapped it, and
    /// its writes were in no checkpoint (helper-41).
    ///
    /// With each, how many releases it has had: a take forgets nothing
    /// of a file released again since it looked (helper-43: a process
    /// that unmapped, mapped again and released in between was
    /// forgotten).
    mappable: HashMap<u64, (Vec<u32>, u64)>,
}

pub struct Tracker {
    st: std::sync::Mutex<State>,
}

/// What one mutating request marked.
enum Mark {
    Entry(Option<Vec<u8>>, Vec<u8>),
    Dir(Option<Vec<u8>>),
    Deep(Option<Vec<u8>>),
    All,
}

impl Mark {
    fn apply(&self, set: &mut DirtySet) {
        match self {
            Mark::Entry(None, _) | Mark::Dir(None) | Mark::Deep(None) | Mark::All => set.all = true,
            Mark::Entry(Some(p), name) => {
                if name == IGNORE_FILE {
                    set.deep.insert(p.clone());
                }
                set.add(p, name);
            }
            Mark::Dir(Some(d)) => {
                set.dirs.insert(d.clone(), None);
            }
            Mark::Deep(Some(d)) => {
                set.deep.insert(d.clone());
            }
        }
    }
}

/// One mutating request, from before its marks until its syscalls are
/// done. A request marks first (a capture may look for nothing, never
/// miss a change), but a checkpoint that takes the set between the mark
/// and the end of the syscall captured the old state, and its commit
/// cleared the mark: the change was in no checkpoint until `unmount`
/// (helper-12: an `rm` waiting on the inode lock behind a long read). So
/// a mutation that sees the epoch turn while it runs marks its paths
/// again as it ends, for the next checkpoint; nobody waits for anybody.
pub struct Mutation<'a> {
    tracker: &'a Tracker,
    epoch: u64,
    marks: Vec<Mark>,
}

impl Mutation<'_> {
    /// Entry `name` of directory `parent` changes (see [`Tracker::mark`]).
    pub fn mark(&mut self, parent: Option<&[u8]>, name: &[u8]) {
        self.add(Mark::Entry(parent.map(<[u8]>::to_vec), name.to_vec()));
    }

    /// Any entry of directory `dir` may change.
    pub fn mark_dir(&mut self, dir: Option<&[u8]>) {
        self.add(Mark::Dir(dir.map(<[u8]>::to_vec)));
    }

    /// Anything below directory `dir` may differ from what was captured
    /// at that path: a directory renamed there (D192).
    pub fn mark_deep(&mut self, dir: Option<&[u8]>) {
        self.add(Mark::Deep(dir.map(<[u8]>::to_vec)));
    }

    pub fn mark_all(&mut self) {
        self.add(Mark::All);
    }

    fn add(&mut self, m: Mark) {
        m.apply(&mut self.tracker.lock().current);
        self.marks.push(m);
    }
}

impl Drop for Mutation<'_> {
    fn drop(&mut self) {
        let mut st = self.tracker.lock();
        if st.epoch != self.epoch {
            for m in &self.marks {
                m.apply(&mut st.current);
            }
        }
    }
}

impl Tracker {
    /// A fresh mount knows nothing about what changed before it.
    pub fn new() -> Tracker {
        let mut st = State::default();
        st.current.all = true;
        Tracker {
            st: std::sync::Mutex::new(st),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A mutating request begins: its marks go through the guard, which
    /// it holds until its syscalls are done.
    pub fn mutation(&self) -> Mutation<'_> {
        Mutation {
            tracker: self,
            epoch: self.lock().epoch,
            marks: Vec::new(),
        }
    }

    /// Entry `name` of directory `parent` changed; `None`: the directory's
    /// path is unknown, so everything is dirty. For changes already made
    /// (a rewind's); a request uses [`Mutation::mark`].
    pub fn mark(&self, parent: Option<&[u8]>, name: &[u8]) {
        Mark::Entry(parent.map(<[u8]>::to_vec), name.to_vec()).apply(&mut self.lock().current);
    }

    pub fn mark_all(&self) {
        self.lock().current.all = true;
    }

    /// File `ino` was opened for writing: it stays dirty while open, and
    /// its next capture reads it whatever its stat says. A write through
    /// a shared mapping moves no time once its page is writable, so the
    /// stat cache vouched for a file that had changed (helper-36, D247).
    /// Kept by inode, named at the take: files made and deleted in
    /// between cost nothing there.
    pub fn opened_for_write(&self, ino: u64) {
        let mut st = self.lock();
        *st.writers.entry(ino).or_default() += 1;
        st.reread.insert(ino);
    }

    /// The inodes opened for writing since the last take; with `take`,
    /// a fresh list starts.
    pub fn reread_inodes(&self, take: bool) -> Vec<u64> {
        let mut st = self.lock();
        if take {
            std::mem::take(&mut st.reread).into_iter().collect()
        } else {
            st.reread.iter().copied().collect()
        }
    }

    /// Files to read again at the next capture (see [`DirtySet::reread`]).
    pub fn reread(&self, paths: Vec<Vec<u8>>) {
        if !paths.is_empty() {
            self.lock().current.reread.extend(paths);
        }
    }

    pub fn released(&self, ino: u64) {
        let mut st = self.lock();
        if let Some(n) = st.writers.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                st.writers.remove(&ino);
            }
        }
    }

    /// Process `pid` released its passthrough handle for writing `ino`:
    /// a mapping it made through it may still be written (D256).
    pub fn released_mappable(&self, ino: u64, pid: u32) {
        let mut st = self.lock();
        let (pids, releases) = st.mappable.entry(ino).or_default();
        *releases += 1;
        if !pids.contains(&pid) {
            pids.push(pid);
        }
    }

    /// The inodes [`Tracker::released_mappable`] named, with their
    /// processes and release counts.
    pub fn mappable(&self) -> Vec<(u64, Vec<u32>, u64)> {
        self.lock()
            .mappable
            .iter()
            .map(|(ino, (pids, releases))| (*ino, pids.clone(), *releases))
            .collect()
    }

    /// Of the processes checked for `ino` after `releases` releases,
    /// `gone` map it no more: they are forgotten, and so is `ino` once
    /// none is left; nothing is if it was released again since.
    pub fn unmapped_by(&self, ino: u64, gone: &[u32], releases: u64) {
        let mut st = self.lock();
        if let Some((pids, now)) = st.mappable.get_mut(&ino) {
            if *now != releases {
                return;
            }
            pids.retain(|p| !gone.contains(p));
            if pids.is_empty() {
                st.mappable.remove(&ino);
            }
        }
    }

    pub fn writers(&self) -> Vec<u64> {
        self.lock().writers.keys().copied().collect()
    }

    /// The changes so far. With `take`, they move aside until
    /// [`Tracker::commit`] or [`Tracker::abort`] and a fresh set starts.
    pub fn take(&self, take: bool) -> DirtySet {
        let mut st = self.lock();
        if !take {
            let mut view = st.current.clone();
            if let Some(t) = &st.taken {
                view.merge(t.clone());
            }
            return view;
        }
        st.epoch += 1;
        let now = std::mem::take(&mut st.current);
        match &mut st.taken {
            // A second taker before the first committed: it sees both.
            Some(t) => {
                t.merge(now);
                t.clone()
            }
            None => {
                st.taken = Some(now.clone());
                now
            }
        }
    }

    /// The taken changes are captured for good.
    pub fn commit(&self) {
        self.lock().taken = None;
    }

    /// The taken changes were not captured: they are dirty again.
    pub fn abort(&self) {
        let mut st = self.lock();
        if let Some(t) = st.taken.take() {
            st.current.merge(t);
        }
    }

    /// Directories the next capture will look at: those a capture took
    /// and did not commit included (a rewind with nothing to do takes the
    /// set and commits nothing: the count said 0 with 3 edits waiting,
    /// helper-88).
    pub fn pending(&self) -> usize {
        let view = self.take(false);
        if view.all {
            return usize::MAX;
        }
        view.dirs.len() + view.deep.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_mount_is_all_dirty_until_a_capture_commits() {
        let t = Tracker::new();
        assert!(t.take(true).all);
        t.commit();
        assert!(t.take(true).is_empty());
    }

    #[test]
    fn an_aborted_capture_loses_no_change() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        t.mark(Some(b"src"), b"a.rs");
        let taken = t.take(true);
        assert!(taken.dirs.contains_key(b"src".as_slice()));
        t.mark(Some(b"docs"), b"x.md");
        t.abort();
        let again = t.take(false);
        let names = |d: &[u8]| again.dirs.get(d).cloned().flatten().unwrap_or_default();
        assert!(names(b"src").contains(b"a.rs".as_slice()));
        assert!(names(b"docs").contains(b"x.md".as_slice()));
    }

    #[test]
    fn a_mutation_a_checkpoint_took_halfway_is_dirty_again_when_it_ends() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        let mut m = t.mutation();
        m.mark(Some(b"d"), b"big");
        // The checkpoint takes the mark and commits before the syscall
        // is done: its capture may have seen the old entry.
        assert!(t.take(true).dirs.contains_key(b"d".as_slice()));
        t.commit();
        assert!(t.take(false).is_empty());
        drop(m);
        let again = t.take(false);
        let names = again.dirs.get(b"d".as_slice()).cloned().flatten();
        assert!(
            names.is_some_and(|n| n.contains(b"big".as_slice())),
            "{again:?}"
        );
    }

    #[test]
    fn a_mutation_no_checkpoint_interrupted_marks_once() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        {
            let mut m = t.mutation();
            m.mark(Some(b"d"), b"f");
        }
        assert!(t.take(true).dirs.contains_key(b"d".as_slice()));
        t.commit();
        assert!(t.take(false).is_empty());
    }

    #[test]
    fn a_directory_with_too_many_changed_names_is_all_changed() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        for i in 0..=NAMES_CAP {
            t.mark(Some(b"big"), format!("f{i}").as_bytes());
        }
        assert_eq!(t.take(false).dirs.get(b"big".as_slice()), Some(&None));
    }

    #[test]
    fn every_process_that_released_a_file_is_kept_until_a_take_checks_it() {
        let t = Tracker::new();
        for pid in [1, 2, 3] {
            t.released_mappable(7, pid);
        }
        let (ino, pids, releases) = t.mappable()[0].clone();
        assert_eq!((ino, pids.as_slice()), (7, [1, 2, 3].as_slice()));
        // 2 and 3 are gone, 1 still maps the file (helper-41, D259).
        t.unmapped_by(7, &[2, 3], releases);
        assert_eq!(t.mappable()[0].1, vec![1]);
        t.unmapped_by(7, &[1], releases);
        assert!(t.mappable().is_empty());
    }

    #[test]
    fn a_file_released_again_since_the_check_is_not_forgotten() {
        let t = Tracker::new();
        t.released_mappable(7, 100);
        let checked = t.mappable()[0].2;
        // Unmapped, mapped again and released between the check and the
        // take (helper-43).
        t.released_mappable(7, 100);
        t.unmapped_by(7, &[100], checked);
        assert_eq!(t.mappable().len(), 1, "forgotten after a new release");
    }

    #[test]
    fn an_ignore_file_change_makes_its_subtree_deep() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        t.mark(Some(b"a"), IGNORE_FILE);
        assert!(t.take(false).deep.contains(b"a".as_slice()));
    }
}
