//! Tree diff: the changes between two Merkle trees, skipping every subtree
//! whose hash is equal on both sides, so the work is O(changed × depth).

use std::collections::HashMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::ledger::Ledger;
use crate::tree::{Entry, Kind, Node, SharedNode, Target};

/// Reads tree nodes from the ledger, or from an in-memory overlay of nodes
/// that were captured but not persisted (status, dry runs).
pub struct Trees<'a> {
    ledger: &'a Ledger,
    overlay: HashMap<Hash, SharedNode>,
    target: Option<Hash>,
}

impl<'a> Trees<'a> {
    pub fn new(ledger: &'a Ledger) -> Trees<'a> {
        Trees {
            ledger,
            overlay: HashMap::new(),
            target: None,
        }
    }

    pub fn with_overlay(ledger: &'a Ledger, overlay: HashMap<Hash, SharedNode>) -> Trees<'a> {
        Trees {
            ledger,
            overlay,
            target: None,
        }
    }

    /// Give the overlay back, to build a new `Trees` after the ledger was
    /// written (the borrow of the ledger must end first).
    pub fn into_overlay(self) -> HashMap<Hash, SharedNode> {
        self.overlay
    }

    /// Remember the root a plan leads to (for looking up unchanged parents).
    pub fn with_target(mut self, root: Hash) -> Self {
        self.target = Some(root);
        self
    }

    pub fn target_root(&self) -> Option<Hash> {
        self.target
    }

    pub fn node(&self, hash: &Hash) -> Result<SharedNode> {
        if let Some(n) = self.overlay.get(hash) {
            return Ok(n.clone());
        }
        // The empty tree needs no storage: it is the "before" of a first
        // checkpoint.
        if *hash == Node::empty_hash() {
            return Ok(SharedNode::default());
        }
        let path = self.ledger.path().to_owned();
        self.ledger.tree(hash)?.ok_or_else(|| {
            // A read without the lock, and a gc committed meanwhile: it
            // swept the node, the ledger is whole (helper-34, D237).
            if self.ledger.pruned_under_the_read() {
                Error::HistoryChanged { path }
            } else {
                Error::LedgerCorrupt {
                    path,
                    detail: format!("tree node {hash} is missing"),
                }
            }
        })
    }

    /// The entry at a relative path (components split on '/'), if any.
    pub fn entry_at(&self, root: &Hash, path: &[u8]) -> Result<Option<Entry>> {
        let mut node = self.node(root)?;
        let mut comps = path
            .split(|&c| c == b'/')
            .filter(|c| !c.is_empty())
            .peekable();
        while let Some(comp) = comps.next() {
            let Some(e) = node.get(comp).cloned() else {
                return Ok(None);
            };
            if comps.peek().is_none() {
                return Ok(Some(e));
            }
            match e.target {
                Target::Tree(h) => node = self.node(&h)?,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Added,
    Modified,
    Deleted,
    Type,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Added => "added",
            Status::Modified => "modified",
            Status::Deleted => "deleted",
            Status::Type => "type",
        }
    }
}

/// Keep the changes at or below one of `filters` (workspace-relative
/// paths; the empty path is the whole tree). No filter keeps everything.
pub fn retain_under(changes: &mut Vec<Change>, filters: &[Vec<u8>]) {
    if filters.is_empty() {
        return;
    }
    changes.retain(|c| {
        filters
            .iter()
            .any(|f| f.is_empty() || c.path == *f || crate::capture::is_below(&c.path, f))
    });
}

/// One changed path. `old` is the entry on the "from" side, `new` on the
/// "to" side.
#[derive(Debug, Clone)]
pub struct Change {
    pub path: Vec<u8>,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
}

impl Change {
    pub fn status(&self) -> Status {
        match (&self.old, &self.new) {
            (None, _) => Status::Added,
            (_, None) => Status::Deleted,
            (Some(a), Some(b)) if a.kind() != b.kind() => Status::Type,
            _ => Status::Modified,
        }
    }

    pub fn depth(&self) -> usize {
        self.path.iter().filter(|&&c| c == b'/').count()
    }

    /// Whether it takes a directory away: deletes it, or puts another
    /// kind of entry in its place.
    pub fn removes_dir(&self) -> bool {
        self.old.as_ref().is_some_and(|o| o.kind() == Kind::Dir)
            && self.new.as_ref().is_none_or(|n| n.kind() != Kind::Dir)
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct DiffOptions {
    /// Count a differing mtime as a change (`--exact-times`).
    pub compare_mtime: bool,
}

pub fn diff(trees: &Trees<'_>, from: &Hash, to: &Hash, opts: DiffOptions) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    if from != to {
        let a = trees.node(from)?;
        let b = trees.node(to)?;
        diff_nodes(trees, &a, &b, &[], opts, &mut out)?;
    }
    Ok(out)
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    if prefix.is_empty() {
        return name.to_vec();
    }
    let mut p = prefix.to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

fn diff_nodes(
    trees: &Trees<'_>,
    a: &Node,
    b: &Node,
    prefix: &[u8],
    opts: DiffOptions,
    out: &mut Vec<Change>,
) -> Result<()> {
    let (mut i, mut j) = (0, 0);
    while i < a.entries.len() || j < b.entries.len() {
        let ea = a.entries.get(i);
        let eb = b.entries.get(j);
        let ord = match (ea, eb) {
            (Some(x), Some(y)) => x.name.cmp(&y.name),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match ord {
            std::cmp::Ordering::Less => {
                diff_entries(
                    trees,
                    ea,
                    None,
                    &join(prefix, &a.entries[i].name),
                    opts,
                    out,
                )?;
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                diff_entries(
                    trees,
                    None,
                    eb,
                    &join(prefix, &b.entries[j].name),
                    opts,
                    out,
                )?;
                j += 1;
            }
            // Identical entries (most of a changed directory) need no path.
            std::cmp::Ordering::Equal if ea == eb => {
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                diff_entries(trees, ea, eb, &join(prefix, &a.entries[i].name), opts, out)?;
                i += 1;
                j += 1;
            }
        }
    }
    Ok(())
}

/// Diff one path, recursing into directories. Public so `restore` can diff
/// just the paths it was given.
pub fn diff_entries(
    trees: &Trees<'_>,
    old: Option<&Entry>,
    new: Option<&Entry>,
    path: &[u8],
    opts: DiffOptions,
    out: &mut Vec<Change>,
) -> Result<()> {
    match (old, new) {
        (None, None) => {}
        (Some(o), Some(n)) if o.kind() == n.kind() => {
            let meta_differs =
                !o.same_content(n) || (opts.compare_mtime && o.mtime_ns != n.mtime_ns);
            if meta_differs {
                out.push(Change {
                    path: path.to_vec(),
                    old: Some(o.clone()),
                    new: Some(n.clone()),
                });
            }
            if let (Some(ha), Some(hb)) = (o.subtree(), n.subtree())
                && ha != hb
            {
                let (na, nb) = (trees.node(&ha)?, trees.node(&hb)?);
                diff_nodes(trees, &na, &nb, path, opts, out)?;
            }
        }
        _ => {
            out.push(Change {
                path: path.to_vec(),
                old: old.cloned(),
                new: new.cloned(),
            });
            // List what disappears below an old directory and what appears
            // below a new one.
            if let Some(h) = old.and_then(Entry::subtree) {
                diff_nodes(trees, &*trees.node(&h)?, &Node::default(), path, opts, out)?;
            }
            if let Some(h) = new.and_then(Entry::subtree) {
                diff_nodes(trees, &Node::default(), &*trees.node(&h)?, path, opts, out)?;
            }
        }
    }
    Ok(())
}

/// Added / modified / deleted counts over every changed path (files,
/// symlinks and directories alike).
#[derive(Debug, Default, Clone, Copy, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
}

pub fn count(changes: &[Change]) -> Counts {
    let mut c = Counts::default();
    for ch in changes {
        match ch.status() {
            Status::Added => c.added += 1,
            Status::Deleted => c.deleted += 1,
            Status::Modified | Status::Type => c.modified += 1,
        }
    }
    c
}
