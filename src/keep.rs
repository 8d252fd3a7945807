//! What a rewind's plan keeps instead of changing, each with its reason.
//!
//! A rewind plans from the live tree as captured to the target as
//! captured; what either capture did not hold, and what the owner of the
//! workspace could not change, is left as it is and reported (`kept`),
//! before anything is recorded, so `--dry-run` shows it and a plan of
//! nothing but such paths records nothing (D155).
//!
//! - What the live capture did not see (ignored by the live rules,
//!   unreadable, made since): D168.
//! - What the target's own `.rewindignore` files excluded: after a rewind
//!   brought back an older rule file, the live capture holds paths the
//!   target set aside, and holds nothing for (D167).
//! - As root for the workspace's owner, what they could not change: D164.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::capture::{
    IGNORE_FILE, IgnoreStack, Skipped, is_at_or_below, is_ignored, join, split_parent, with_rules,
    with_rules_in,
};
use crate::diff::{Change, Trees};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::tree::{Entry, Kind, SharedNode, Target};
use crate::workspace::Workspace;

/// A rewind writes nothing where the live tree holds something its
/// capture did not see (D168): a path the live rules ignore (`.claude/`
/// once `integrate` put it in `.rewind/ignore`), a file it could not
/// read, one made since. The apply finds such an entry too and keeps it
/// (D111), but only after the safety checkpoint and the operation were
/// recorded: a plan of nothing else then took over `undo` and the
/// protection gc gives the last rewind's saved work. Only the top-most
/// missing entry of each subtree is looked at, in a directory the capture
/// holds: below a missing one, nothing can be.
pub(crate) fn what_the_capture_did_not_see(
    ws: &Workspace,
    trees: &Trees<'_>,
    from: &Hash,
    changes: Vec<Change>,
    kept: &mut Vec<Skipped>,
) -> Result<Vec<Change>> {
    if !changes.iter().any(|c| c.old.is_none()) {
        return Ok(changes);
    }
    let root = ws.root_dir();
    // Each parent the plan adds into: opened when the capture holds it as
    // a directory (`None` otherwise, or when it is gone since).
    let mut dirs: HashMap<Vec<u8>, Option<rewind_platform::Dir>> = HashMap::new();
    let mut found: HashSet<Vec<u8>> = HashSet::new();
    let mut out = Vec::with_capacity(changes.len());
    for c in changes {
        if c.old.is_some() || c.new.is_none() {
            out.push(c);
            continue;
        }
        if is_at_or_below(&c.path, &found) {
            continue;
        }
        let (parent, name) = split_parent(&c.path);
        if !dirs.contains_key(parent) {
            let held = parent.is_empty()
                || trees
                    .entry_at(from, parent)?
                    .is_some_and(|e| e.kind() == Kind::Dir);
            let dir = held
                .then(|| root.open_beneath(Path::new(OsStr::from_bytes(parent))).ok())
                .flatten();
            dirs.insert(parent.to_vec(), dir);
        }
        let there = dirs[parent]
            .as_ref()
            .and_then(|d| d.stat_at(OsStr::from_bytes(name)).ok());
        if let Some(meta) = there {
            let is_dir = meta.kind == rewind_platform::EntryKind::Dir;
            kept.push(Skipped::new(
                &c.path,
                if meta.kind.is_special() {
                    // Named for what it is: "ignored, unreadable, or made
                    // since" sent the user looking elsewhere (helper-30).
                    format!(
                        "kept: a {} is there now, which is never captured or replaced; remove it and rewind again to restore what the checkpoint holds",
                        meta.kind.as_str()
                    )
                } else if live_rule_files_exclude(root, &c.path, is_dir) {
                    // A rule file newer than the target hides what the
                    // target holds (helper-30, D217): the rewind brings
                    // the target's rule files back, and the next sees it.
                    "kept: a .rewindignore in the tree now excludes it, so the capture before this rewind did not save what is there; once the rule files are the target's (this rewind restores them), the same rewind again restores it".into()
                } else {
                    "kept: something no checkpoint captured is there (ignored, unreadable, or made since the capture)".into()
                },
            ));
            found.insert(c.path);
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Whether the `.rewindignore` files now in the tree, from the root down
/// to `path`'s directory, exclude `path`.
fn live_rule_files_exclude(root: &rewind_platform::Dir, path: &[u8], is_dir: bool) -> bool {
    // Each directory above `path`, the root first: its prefix before a `/`.
    let ends = std::iter::once(0).chain(
        path.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| i),
    );
    let mut stack = IgnoreStack::new();
    for end in ends {
        let rel = &path[..end];
        let Ok(dir) = root.open_beneath(Path::new(OsStr::from_bytes(rel))) else {
            continue;
        };
        match with_rules_in(&dir, rel, &stack) {
            Ok(s) => stack = s,
            Err(_) => return false,
        }
    }
    is_ignored(&stack, path, is_dir)
}

/// A rewind deletes nothing the target checkpoint's own `.rewindignore`
/// files exclude (D167): `changes` without those deletions; the paths
/// (the top-most of each excluded subtree) go to `kept`, each with why. Directories that hold a kept path are not removed or
/// replaced: their other entries are in the plan one by one and go.
pub(crate) fn what_the_target_ignores(
    ws: &Workspace,
    trees: &Trees<'_>,
    to: &Hash,
    target_id: &str,
    changes: Vec<Change>,
    kept: &mut Vec<Skipped>,
) -> Result<Vec<Change>> {
    if !changes.iter().any(|c| c.new.is_none()) {
        return Ok(changes);
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
        .filter(|(p, v)| **v && !excluded(split_parent(p).0))
        .map(|(p, _)| p.clone())
        .collect();
    if tops.is_empty() {
        return Ok(changes);
    }
    tops.sort();
    let holders: HashSet<&[u8]> = tops
        .iter()
        .flat_map(|p| crate::capture::ancestors(p))
        .collect();
    // A directory the target has a file or link at, kept because it
    // holds what is kept: its file is not restored, and is said so
    // (helper-78: `src` stayed a directory, named nowhere).
    let (changes, not_restored) = without_held_directories(changes, &holders);
    let changes = changes
        .into_iter()
        .filter(|c| !(c.new.is_none() && excluded(&c.path)))
        .collect();
    kept.extend(not_restored.iter().map(|(p, kind)| {
        Skipped::new(
            p,
            format!(
                "kept: a directory, since it holds what is kept below; checkpoint {target_id} has a {} here, which is not restored",
                kind.as_str()
            ),
        )
    }));
    kept.extend(tops.iter().map(|p| {
        Skipped::new(
            p,
            format!(
                "kept: checkpoint {target_id}'s {IGNORE_FILE} excludes it, so that checkpoint holds nothing for it"
            ),
        )
    }));
    Ok(changes)
}

/// What a dry run shows for a directory the plan deletes while it holds
/// something its capture left out (a nested workspace's `.rewind/`, an
/// ignored or unreadable file, one made since): the apply empties it of
/// what the capture held and keeps it, with `apply::HOLDS_UNCAPTURED`,
/// and so keeps every directory above it. The dry run listed it as
/// deleted (helper-76). Only the dry run looks: a readdir per deleted
/// directory would cost every real rewind what its `rmdir` finds anyway,
/// and the plan's fingerprint is taken before this, so `--expect` names
/// the same plan either way.
pub(crate) fn what_deletions_leave(
    ws: &Workspace,
    trees: &Trees<'_>,
    changes: Vec<Change>,
    kept: &mut Vec<Skipped>,
) -> Result<Vec<Change>> {
    let root = ws.root_dir();
    let mut holding: Vec<Vec<u8>> = Vec::new();
    for c in &changes {
        if !c.removes_dir() {
            continue;
        }
        let Some(Target::Tree(h)) = c.old.as_ref().map(|o| &o.target) else {
            continue;
        };
        let Ok(live) = root.open_beneath(Path::new(OsStr::from_bytes(&c.path))) else {
            continue;
        };
        let Ok(names) = live.entries() else {
            continue;
        };
        let node = trees.node(h)?;
        let captured: HashSet<&[u8]> = node.entries.iter().map(|e| e.name.as_slice()).collect();
        if names.iter().any(|n| !captured.contains(n.as_bytes())) {
            holding.push(c.path.clone());
        }
    }
    if holding.is_empty() {
        return Ok(changes);
    }
    // Every directory above one kept is kept too; the deepest says why,
    // as the apply reports it (D166).
    let holders: HashSet<&[u8]> = holding
        .iter()
        .flat_map(|p| crate::capture::ancestors(p).chain(std::iter::once(p.as_slice())))
        .collect();
    // A directory the target has a file or link at stays a directory:
    // said as the apply says it, not left out (helper-78).
    let (changes, replaced) = without_held_directories(changes, &holders);
    let deepest = holding
        .iter()
        .filter(|p| !holding.iter().any(|q| crate::capture::is_below(q, p)));
    kept.extend(deepest.map(|p| Skipped::new(p, crate::apply::HOLDS_UNCAPTURED)));
    kept.extend(
        replaced
            .iter()
            .map(|(p, _)| Skipped::new(p, crate::apply::UNCAPTURED_THERE)),
    );
    Ok(changes)
}

/// `changes` without those that would delete or replace a directory in
/// `holders`, which stays because something kept is in it; and, of
/// those left out, each path the target has a file or link at, with its
/// kind. A directory the target also has (a mode or time put back) stays
/// a change: the rewind makes it (helper-78).
fn without_held_directories(
    changes: Vec<Change>,
    holders: &HashSet<&[u8]>,
) -> (Vec<Change>, Vec<(Vec<u8>, Kind)>) {
    let mut replaced = Vec::new();
    let changes = changes
        .into_iter()
        .filter(|c| {
            let held = holders.contains(c.path.as_slice()) && c.removes_dir();
            if held && let Some(n) = &c.new {
                replaced.push((c.path.clone(), n.kind()));
            }
            !held
        })
        .collect();
    (changes, replaced)
}

/// As root running a workspace owner's command (through root's door, or
/// their `rewind mcp`, D151), the changes that user could not make
/// themselves are kept and reported, as D152 keeps out of the capture what
/// they could not read (D164). Before, root's apply created and deleted
/// entries in root's own directories inside their tree at their request.
/// `sudo rewind` is root's own command, and restores root's files (D147).
/// A user's own rewind is judged the same way by their own rights: one
/// entry in another user's directory made the whole rewind fail and roll
/// back, and `--dry-run` gave no sign of it (helper-42, D260).
pub(crate) fn what_the_owner_could_not_change(
    ws: &Workspace,
    changes: Vec<Change>,
    kept: &mut Vec<Skipped>,
) -> Result<Vec<Change>> {
    use rewind_platform::{Dir, Meta, UserAccess};
    let confined = crate::workspace::is_confined();
    if !confined && rewind_platform::is_root() {
        return Ok(changes);
    }
    let root = Dir::open(ws.io_path())?;
    let judge = if confined {
        match UserAccess::owner_of(&root.meta()?) {
            Some(o) => Judge::Owner(o),
            None => return Ok(changes),
        }
    } else {
        Judge::Me(UserAccess::this_process())
    };
    let uid = judge.uid();
    // Each directory on the plan's paths, opened once; `None` where the
    // live tree has none (the plan makes it in its nearest existing one).
    let mut dirs: HashMap<Vec<u8>, Option<(Dir, Meta)>> = HashMap::new();
    // What each directory a deletion must empty holds that cannot go,
    // found once however many entries of the plan lie below it.
    let mut emptied: HashMap<Vec<u8>, Option<(Meta, Vec<u8>)>> = HashMap::new();
    let mut out = Vec::new();
    'changes: for c in changes {
        let (parent, name) = split_parent(&c.path);
        let mut at = parent;
        let (dir, dir_meta) = loop {
            let opened = dirs.entry(at.to_vec()).or_insert_with(|| {
                let d = root
                    .open_beneath(std::path::Path::new(OsStr::from_bytes(at)))
                    .ok()?;
                d.meta().ok().map(|m| (d, m))
            });
            match opened {
                Some((d, m)) => break (&*d, &*m),
                None if at.is_empty() => {
                    out.push(c);
                    continue 'changes;
                }
                None => at = split_parent(at).0,
            }
        };
        let entry = (at.len() == parent.len())
            .then(|| dir.stat_at(OsStr::from_bytes(name)).ok())
            .flatten();
        let is_dir = |e: &Meta| e.kind == rewind_platform::EntryKind::Dir;
        let stays_dir = c
            .new
            .as_ref()
            .is_some_and(|n| n.kind() == crate::tree::Kind::Dir);
        // A directory is changed in place (mode, times): only its owner can.
        let in_place_not_theirs = entry.is_some_and(|e| is_dir(&e) && e.uid != uid && stays_dir);
        let blocker: Option<(&str, Meta, Vec<u8>)> =
            if !judge.may_remove_in(dir, dir_meta, entry.as_ref()) {
                Some(("its directory belongs to uid", *dir_meta, at.to_vec()))
            } else if in_place_not_theirs {
                entry.map(|e| ("it is a directory of uid", e, c.path.clone()))
            } else if entry.is_some_and(|e| is_dir(&e)) && !stays_dir {
                // Removed, it is emptied first: what is in it must go too
                // (helper-43, helper-45: root's `r/` with a file, a sticky
                // directory holding root's file).
                let m = entry.unwrap_or(*dir_meta);
                match dir.open_dir(OsStr::from_bytes(name)) {
                    Ok(d) => judge.cannot_empty(&d, &m, &c.path, &mut emptied),
                    Err(_) => Some((m, c.path.clone())),
                }
                .map(|(m, p)| ("a directory in it belongs to uid", m, p))
            } else {
                None
            };
        let Some((what, meta, shown)) = blocker else {
            out.push(c);
            continue;
        };
        let reason = if confined {
            format!(
                "kept: the workspace's owner (uid {uid}) could not change it there (another user's directory, or sticky), and root changes for them only what they could (D164)"
            )
        } else {
            let dir_path = if shown.is_empty() {
                ".".into()
            } else {
                crate::names::human_os_path(std::path::Path::new(OsStr::from_bytes(&shown)))
            };
            format!(
                "kept: this user (uid {uid}) cannot change it: {what} {} with mode {:o}{}; `ls -ld {}` shows it: change its owner or mode, or rewind as root (D260)",
                meta.uid,
                meta.mode & 0o7777,
                if meta.mode & 0o1000 != 0 {
                    " (sticky)"
                } else {
                    ""
                },
                crate::names::shell_word(&dir_path),
            )
        };
        kept.push(Skipped::new(&c.path, reason));
    }
    Ok(out)
}

/// Whose rights decide what a rewind may change (D164, D260).
enum Judge {
    /// Root acting for the workspace's owner: their mode bits (D164).
    Owner(rewind_platform::UserAccess),
    /// This process, a user's own rewind: the kernel says (ACLs too),
    /// and their own directories they may make writable (D115).
    Me(rewind_platform::UserAccess),
}

impl Judge {
    fn uid(&self) -> u32 {
        match self {
            Judge::Owner(u) | Judge::Me(u) => u.uid(),
        }
    }

    /// Whether entries may be made and removed in the directory `d`
    /// (`meta`), sticky rules aside.
    fn may_write(&self, d: &rewind_platform::Dir, meta: &rewind_platform::Meta) -> bool {
        match self {
            Judge::Owner(u) => u.may_change_in(meta, None),
            Judge::Me(u) => meta.uid == u.uid() || d.writable_by_me(),
        }
    }

    /// Whether `entry` (`None`: a new name) may be made, removed or
    /// replaced in a directory (`meta`) that [`Judge::may_write`] said
    /// `writable` of: in a sticky one not theirs, only their entries.
    fn may_remove(
        &self,
        writable: bool,
        meta: &rewind_platform::Meta,
        entry: Option<&rewind_platform::Meta>,
    ) -> bool {
        let uid = self.uid();
        let sticky_blocks =
            meta.mode & 0o1000 != 0 && meta.uid != uid && entry.is_some_and(|e| e.uid != uid);
        writable && !sticky_blocks
    }

    fn may_remove_in(
        &self,
        d: &rewind_platform::Dir,
        meta: &rewind_platform::Meta,
        entry: Option<&rewind_platform::Meta>,
    ) -> bool {
        self.may_remove(self.may_write(d, meta), meta, entry)
    }

    /// The first directory in `d` (itself included, at workspace path
    /// `at`) holding an entry this user cannot remove, with its meta; an
    /// empty directory blocks nothing. What cannot be read blocks too: a
    /// kept entry is said, a failed apply rolls everything back. Each
    /// directory is judged once (`memo`).
    fn cannot_empty(
        &self,
        d: &rewind_platform::Dir,
        meta: &rewind_platform::Meta,
        at: &[u8],
        memo: &mut HashMap<Vec<u8>, Option<(rewind_platform::Meta, Vec<u8>)>>,
    ) -> Option<(rewind_platform::Meta, Vec<u8>)> {
        if let Some(known) = memo.get(at) {
            return known.clone();
        }
        let found = (|| {
            let Ok(names) = d.entries() else {
                return Some((*meta, at.to_vec()));
            };
            let writable = names.is_empty() || self.may_write(d, meta);
            for name in names {
                let m = match d.stat_at(&name) {
                    Ok(m) => m,
                    Err(e) if e.is_not_found() => continue,
                    Err(_) => return Some((*meta, at.to_vec())),
                };
                if !self.may_remove(writable, meta, Some(&m)) {
                    return Some((*meta, at.to_vec()));
                }
                if m.kind == rewind_platform::EntryKind::Dir {
                    let mut path = at.to_vec();
                    path.push(b'/');
                    path.extend_from_slice(name.as_bytes());
                    let below = match d.open_dir(&name) {
                        Ok(sub) => self.cannot_empty(&sub, &m, &path, memo),
                        Err(_) => Some((m, path)),
                    };
                    if below.is_some() {
                        return below;
                    }
                }
            }
            None
        })();
        memo.insert(at.to_vec(), found.clone());
        found
    }
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
    dirs: HashMap<Vec<u8>, Option<SharedNode>>,
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
        let parent = split_parent(path).0;
        let v = (!parent.is_empty() && self.excludes(parent, true)?)
            || (self.entry(path)?.is_none() && {
                let rules = self.rules_in(parent)?;
                is_ignored(rules, path, is_dir)
            });
        self.excluded.insert(path.to_vec(), v);
        Ok(v)
    }

    fn entry(&mut self, path: &[u8]) -> Result<Option<Entry>> {
        let (parent, name) = split_parent(path);
        Ok(self.dir(parent)?.and_then(|n| n.get(name).cloned()))
    }

    fn dir(&mut self, path: &[u8]) -> Result<Option<SharedNode>> {
        if let Some(d) = self.dirs.get(path) {
            return Ok(d.clone());
        }
        let node = if path.is_empty() {
            Some(self.trees.node(self.to)?)
        } else {
            match self.entry(path)?.map(|e| e.target) {
                Some(Target::Tree(h)) => Some(self.trees.node(&h)?),
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
                self.rules_in(split_parent(dir).0)?.clone()
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
        if self.snapshot.is_none() {
            self.snapshot = Some(crate::snapshot::open(self.ws, self.target_id)?);
        }
        let snapshot = self.snapshot.as_ref().and_then(Option::as_ref);
        let bytes = self
            .ws
            .read_content(file, hash, size, snapshot, size)?
            .ok_or_else(|| Error::ObjectMissing {
                hash: hash.to_hex(),
                path: Path::new(OsStr::from_bytes(file)).to_path_buf(),
            })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
