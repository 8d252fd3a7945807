//! What a rewind's target checkpoint excluded by its own `.rewindignore`
//! files (D167).
//!
//! A rewind plans from the live tree, captured under the live rules. When
//! the target's rules differ (an older rule file brought back by the
//! rewind before it), the live capture holds paths the target set aside:
//! the target holds nothing for them, as for a path it skipped (D143), so
//! the rewind keeps them instead of deleting them.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use crate::capture::{IGNORE_FILE, IgnoreStack, Skipped, is_ignored, join, with_rules};
use crate::diff::{Change, Trees};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::tree::{Entry, Kind, Node, Target};
use crate::workspace::Workspace;

/// `changes` without the deletions of paths the target's rules exclude,
/// and those paths (the top-most of each excluded subtree), each with
/// why it is kept. Directories that hold a kept path are not removed or
/// replaced: their other entries are in the plan one by one and go.
pub(crate) fn keep_what_the_target_ignores(
    ws: &Workspace,
    trees: &Trees<'_>,
    to: &Hash,
    target_id: &str,
    changes: Vec<Change>,
) -> Result<(Vec<Change>, Vec<Skipped>)> {
    if !changes.iter().any(|c| c.new.is_none()) {
        return Ok((changes, Vec::new()));
    }
    let mut target = TargetView {
        ws,
        trees,
        to,
        target_id,
        snapshot: None,
        dirs: HashMap::new(),
        rules: HashMap::new(),
        excluded: HashMap::new(),
    };
    for c in &changes {
        if let (Some(old), None) = (&c.old, &c.new) {
            target.excludes(&c.path, old.kind() == Kind::Dir)?;
        }
    }
    let excluded = |p: &[u8]| target.excluded.get(p).copied().unwrap_or(false);
    let mut tops: Vec<Vec<u8>> = target
        .excluded
        .iter()
        .filter(|(p, v)| **v && !excluded(parent_of(p)))
        .map(|(p, _)| p.clone())
        .collect();
    if tops.is_empty() {
        return Ok((changes, Vec::new()));
    }
    tops.sort();
    let holders: HashSet<&[u8]> = tops
        .iter()
        .flat_map(|p| crate::capture::ancestors(p))
        .collect();
    let changes = changes
        .into_iter()
        .filter(|c| {
            let holds_kept = holders.contains(c.path.as_slice())
                && c.old.as_ref().is_some_and(|o| o.kind() == Kind::Dir)
                && c.new.as_ref().is_none_or(|n| n.kind() != Kind::Dir);
            let is_excluded = c.new.is_none() && excluded(&c.path);
            !holds_kept && !is_excluded
        })
        .collect();
    let kept = tops
        .iter()
        .map(|p| {
            Skipped::new(
                p,
                format!(
                    "kept: checkpoint {target_id}'s {IGNORE_FILE} excludes it, so that checkpoint holds nothing for it"
                ),
            )
        })
        .collect();
    Ok((changes, kept))
}

/// "a/b" → "a"; "a" → "".
fn parent_of(path: &[u8]) -> &[u8] {
    &path[..path.iter().rposition(|&b| b == b'/').unwrap_or(0)]
}

/// The target's tree as the rules see it, each directory node, rule
/// stack and verdict looked up once: a plan deleting a tree 1,000 levels
/// deep asks about every level.
struct TargetView<'a> {
    ws: &'a Workspace,
    trees: &'a Trees<'a>,
    to: &'a Hash,
    target_id: &'a str,
    /// The target's btrfs snapshot, opened when a rule file is not stored.
    snapshot: Option<Option<rewind_platform::Dir>>,
    /// The target's directory at each path; `None`: it has none there.
    dirs: HashMap<Vec<u8>, Option<Rc<Node>>>,
    /// The rules in force in each of the target's directories.
    rules: HashMap<Vec<u8>, IgnoreStack>,
    /// Whether the target's rules exclude a path or a directory above it.
    excluded: HashMap<Vec<u8>, bool>,
}

impl TargetView<'_> {
    /// Whether the capture of the target, under its own rules, would have
    /// left `path` out: it, or a directory above it, is excluded and the
    /// target holds nothing there.
    fn excludes(&mut self, path: &[u8], is_dir: bool) -> Result<bool> {
        if let Some(v) = self.excluded.get(path) {
            return Ok(*v);
        }
        let parent = parent_of(path);
        let v = (!parent.is_empty() && self.excludes(parent, true)?)
            || (self.entry(path)?.is_none() && {
                let rules = self.rules_in(parent)?;
                is_ignored(rules, path, is_dir)
            });
        self.excluded.insert(path.to_vec(), v);
        Ok(v)
    }

    fn entry(&mut self, path: &[u8]) -> Result<Option<Entry>> {
        let parent = parent_of(path);
        let name = &path[if parent.is_empty() {
            0
        } else {
            parent.len() + 1
        }..];
        Ok(self.dir(parent)?.and_then(|n| n.get(name).cloned()))
    }

    fn dir(&mut self, path: &[u8]) -> Result<Option<Rc<Node>>> {
        if let Some(d) = self.dirs.get(path) {
            return Ok(d.clone());
        }
        let node = if path.is_empty() {
            Some(Rc::new(self.trees.node(self.to)?))
        } else {
            match self.entry(path)?.map(|e| e.target) {
                Some(Target::Tree(h)) => Some(Rc::new(self.trees.node(&h)?)),
                _ => None,
            }
        };
        self.dirs.insert(path.to_vec(), node.clone());
        Ok(node)
    }

    fn rules_in(&mut self, dir: &[u8]) -> Result<&IgnoreStack> {
        if !self.rules.contains_key(dir) {
            let parent = if dir.is_empty() {
                IgnoreStack::new()
            } else {
                self.rules_in(parent_of(dir))?.clone()
            };
            let file = join(dir, IGNORE_FILE.as_bytes());
            let stack = match self.entry(&file)? {
                Some(Entry {
                    target: Target::Object(h),
                    size,
                    ..
                }) => {
                    let text = self.read(&file, &h, size)?;
                    with_rules(&parent, dir, &text, Path::new(OsStr::from_bytes(&file)))?
                }
                _ => parent,
            };
            self.rules.insert(dir.to_vec(), stack);
        }
        Ok(&self.rules[dir])
    }

    /// A rule file's text: from the store, or from the target's btrfs
    /// snapshot, which holds what a btrfs checkpoint did not store.
    fn read(&mut self, file: &[u8], hash: &Hash, size: u64) -> Result<String> {
        let store = self.ws.store();
        let bytes = if store.contains(hash, size)? {
            store.read_prefix(hash, size, size)?
        } else {
            if self.snapshot.is_none() {
                self.snapshot = Some(crate::snapshot::open(self.ws, self.target_id)?);
            }
            let path = Path::new(OsStr::from_bytes(file));
            let Some(Some(snap)) = &self.snapshot else {
                return Err(Error::ObjectMissing {
                    hash: hash.to_hex(),
                    path: path.to_path_buf(),
                });
            };
            let dir = snap
                .open_beneath(path.parent().unwrap_or(Path::new("")))
                .map_err(Error::os)?;
            let (f, _) = dir
                .open_read(path.file_name().unwrap_or_default())
                .map_err(Error::os)?;
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(f, size), &mut buf)
                .map_err(|e| Error::os(rewind_platform::Error::new("read", path, e)))?;
            buf
        };
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
