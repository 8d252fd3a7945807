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
        !self.all && self.dirs.is_empty() && self.deep.is_empty()
    }
}

#[derive(Default)]
struct State {
    current: DirtySet,
    taken: Option<DirtySet>,
    /// Inodes open for writing, with their open count: written through
    /// passthrough without the daemon seeing it, so they stay dirty.
    writers: HashMap<u64, u32>,
}

pub struct Tracker {
    st: std::sync::Mutex<State>,
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

    /// Entry `name` of directory `parent` changed; `None`: the directory's
    /// path is unknown, so everything is dirty.
    pub fn mark(&self, parent: Option<&[u8]>, name: &[u8]) {
        let mut st = self.lock();
        match parent {
            None => st.current.all = true,
            Some(p) => {
                if name == IGNORE_FILE {
                    st.current.deep.insert(p.to_vec());
                }
                st.current.add(p, name);
            }
        }
    }

    /// Any entry of directory `dir` may have changed; `None`: the
    /// directory's path is unknown, so everything is dirty.
    pub fn mark_dir(&self, dir: Option<&[u8]>) {
        let mut st = self.lock();
        match dir {
            None => st.current.all = true,
            Some(d) => {
                st.current.dirs.insert(d.to_vec(), None);
            }
        }
    }

    pub fn mark_all(&self) {
        self.lock().current.all = true;
    }

    pub fn opened_for_write(&self, ino: u64) {
        *self.lock().writers.entry(ino).or_default() += 1;
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

    pub fn pending(&self) -> usize {
        let st = self.lock();
        if st.current.all {
            return usize::MAX;
        }
        st.current.dirs.len() + st.current.deep.len()
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
    fn an_ignore_file_change_makes_its_subtree_deep() {
        let t = Tracker::new();
        t.take(true);
        t.commit();
        t.mark(Some(b"a"), IGNORE_FILE);
        assert!(t.take(false).deep.contains(b"a".as_slice()));
    }
}
