//! `rewind init --subvolume DIR`: turn an ordinary directory on btrfs into
//! a subvolume in place, keeping every file, mode, symlink, hard link,
//! xattr and mtime.
//!
//! A directory cannot become a subvolume, and rename cannot move files
//! across subvolumes, so: create a subvolume beside DIR, fill it with
//! reflink clones (O(1) per file, no data copied), then swap the two names
//! atomically with `renameat2(RENAME_EXCHANGE)` and remove the old tree.
//! `.rewind/` stays an ordinary directory inside the subvolume: rewinds
//! rename files from `.rewind/tmp/` into the tree, and rename cannot cross
//! a subvolume boundary (D45).
//!
//! Crash safety: until the swap, DIR is untouched and the half-filled
//! subvolume sits under a temporary name; after it, DIR is the complete
//! subvolume and the old tree sits under that name. Either way the next
//! run finds the temporary name, tells which case it is (a subvolume, or a
//! plain directory), removes it, and carries on. A SIGKILL at any named
//! point (`subvol:*`) leaves DIR either the old directory or the new
//! subvolume, complete.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use rewind_platform::{Dir, EntryKind, FsInfo, FsKind, RenameMode, Xattr, clone_or_copy};
use serde::Serialize;

use crate::capture::STATE_DIR;
use crate::error::{Error, Result};

#[derive(Debug, Default, Serialize)]
pub struct Converted {
    pub path: String,
    /// It was a subvolume already: nothing to do.
    pub already: bool,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub bytes: u64,
    /// Left by an interrupted earlier run and removed: `partial-subvolume`
    /// (before the swap) or `old-tree` (after it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleaned_up: Option<&'static str>,
}

fn temp_name(base: &OsStr) -> OsString {
    let mut n = OsString::from(".");
    n.push(base);
    n.push(".rewind-subvol");
    n
}

pub fn convert(dir: &Path) -> Result<Converted> {
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::os(rewind_platform::Error::new("open", dir, e)))?;
    let (Some(parent_path), Some(base)) = (dir.parent(), dir.file_name()) else {
        return Err(Error::InvalidPath {
            path: dir,
            reason: "the filesystem root cannot be converted: name a directory below it".into(),
        });
    };
    let parent = Dir::open(parent_path).map_err(Error::os)?;
    let mut out = Converted {
        path: dir.display().to_string(),
        ..Converted::default()
    };
    let tmp = temp_name(base);
    out.cleaned_up = recover(&parent, &tmp)?;
    let target = Dir::open(&dir).map_err(Error::os)?;
    if FsInfo::of(&target).map_err(Error::os)?.kind != FsKind::Btrfs {
        return Err(Error::InvalidPath {
            path: dir,
            reason: "is not on btrfs: subvolumes exist only there (the walk engine with clones works on XFS too)".into(),
        });
    }
    if rewind_platform::is_subvolume(&target).map_err(Error::os)? {
        out.already = true;
        return Ok(out);
    }
    refuse_if_busy(&dir)?;
    // Writers of an existing history wait while its files are cloned.
    let _lock = lock_history(&dir)?;

    rewind_platform::create_subvolume(&parent, &tmp).map_err(Error::os)?;
    crate::failpoint::hit("subvol:created");
    let filled = parent.open_dir(&tmp).map_err(Error::os).and_then(|new| {
        let mut links = HashMap::new();
        copy_tree(&target, &new, &mut out, &mut links)?;
        copy_meta_dir(&target, &parent, &tmp)?;
        new.syncfs().map_err(Error::os)
    });
    if let Err(e) = filled {
        // Nothing was changed: DIR is untouched; drop the half-made copy.
        let _ = remove_subvolume(&parent, &tmp);
        return Err(e);
    }
    crate::failpoint::hit("subvol:copied");
    parent
        .rename(base, &parent, &tmp, RenameMode::Exchange)
        .map_err(Error::os)?;
    parent.fsync().map_err(Error::os)?;
    crate::failpoint::hit("subvol:swapped");
    parent.remove_all(&tmp).map_err(Error::os)?;
    Ok(out)
}

/// Finish or undo an interrupted conversion: the temporary name holds a
/// partial subvolume (before the swap) or the old tree (after it).
fn recover(parent: &Dir, tmp: &OsStr) -> Result<Option<&'static str>> {
    let found = match parent.open_dir(tmp) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(Error::os(e)),
    };
    if rewind_platform::is_subvolume(&found).map_err(Error::os)? {
        drop(found);
        remove_subvolume(parent, tmp)?;
        Ok(Some("partial-subvolume"))
    } else {
        drop(found);
        parent.remove_all(tmp).map_err(Error::os)?;
        Ok(Some("old-tree"))
    }
}

/// Delete the half-made subvolume of an interrupted conversion.
fn remove_subvolume(parent: &Dir, name: &OsStr) -> Result<()> {
    rewind_platform::delete_subvolume(parent, name).map_err(Error::os)
}

/// Processes whose working directory is inside `dir` would be left in the
/// old tree after the swap: refuse, naming them.
fn refuse_if_busy(dir: &Path) -> Result<()> {
    let me = std::process::id().to_string();
    let mut busy = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        if cwd.starts_with(dir) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            busy.push(format!("{pid} ({})", comm.trim()));
        }
    }
    if busy.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidPath {
        path: dir.to_path_buf(),
        reason: format!(
            "processes have their working directory inside it: {}; cd them out (or stop them) and retry; nothing was changed",
            busy.join(", ")
        ),
    })
}

fn lock_history(dir: &Path) -> Result<Option<rewind_platform::LockFile>> {
    let path = dir.join(STATE_DIR).join("lock");
    if !dir.join(STATE_DIR).is_dir() {
        return Ok(None);
    }
    match rewind_platform::LockFile::acquire(&path, std::time::Duration::from_secs(10))
        .map_err(Error::os)?
    {
        Ok(l) => Ok(Some(l)),
        Err(pid) => Err(Error::Locked { path, pid }),
    }
}

/// Clone `src`'s entries into `dst`. Hard links stay hard links (keyed by
/// inode); special files are refused (a subvolume cannot take them over
/// faithfully), which leaves DIR untouched.
fn copy_tree(
    src: &Dir,
    dst: &Dir,
    out: &mut Converted,
    links: &mut HashMap<(u64, u64), (PathBuf, OsString)>,
) -> Result<()> {
    let mut names = src.entries().map_err(Error::os)?;
    names.sort();
    for name in names {
        let meta = src.stat_at(&name).map_err(Error::os)?;
        match meta.kind {
            EntryKind::Dir => {
                dst.mkdir(&name, 0o700).map_err(Error::os)?;
                let (s, d) = (
                    src.open_dir(&name).map_err(Error::os)?,
                    dst.open_dir(&name).map_err(Error::os)?,
                );
                copy_tree(&s, &d, out, links)?;
                copy_meta_dir(&s, dst, &name)?;
                out.dirs += 1;
            }
            EntryKind::File => {
                if meta.nlink > 1
                    && let Some((first_dir, first_name)) = links.get(&(meta.dev, meta.ino))
                {
                    let from = Dir::open(first_dir).map_err(Error::os)?;
                    from.link(first_name, dst, &name).map_err(Error::os)?;
                    out.hard_links += 1;
                    continue;
                }
                let (f, _) = src.open_read(&name).map_err(Error::os)?;
                let to = dst.create_new(&name, 0o600).map_err(Error::os)?;
                let io = |op: &'static str, e: std::io::Error| {
                    Error::os(rewind_platform::Error::new(op, dst.path().join(&name), e))
                };
                clone_or_copy(std::os::fd::AsFd::as_fd(&f), std::os::fd::AsFd::as_fd(&to))
                    .map_err(|e| io("clone", e))?;
                let xattrs = Xattr::list_user(&f).map_err(|e| io("read xattrs", e))?;
                Xattr::set_user(&to, &xattrs).map_err(|e| io("set xattrs", e))?;
                rewind_platform::file_set_mode(&to, meta.mode).map_err(|e| io("chmod", e))?;
                rewind_platform::file_set_mtime(&to, meta.mtime_ns)
                    .map_err(|e| io("set mtime", e))?;
                if meta.nlink > 1 {
                    links.insert(
                        (meta.dev, meta.ino),
                        (dst.path().to_path_buf(), name.clone()),
                    );
                }
                out.files += 1;
                out.bytes += meta.size;
                crate::failpoint::hit("subvol:file-cloned");
            }
            EntryKind::Symlink => {
                let target = src.readlink(&name).map_err(Error::os)?;
                dst.symlink(&target, &name).map_err(Error::os)?;
                let _ = dst.set_mtime(&name, EntryKind::Symlink, meta.mtime_ns);
                out.symlinks += 1;
            }
            other => {
                return Err(Error::InvalidPath {
                    path: src.path().join(&name),
                    reason: format!(
                        "is a {}: it cannot be carried into a subvolume; remove it (it is never captured anyway) and retry; nothing was changed",
                        other.as_str()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// A directory's mode, xattrs and mtime (after its children are in).
/// Set through the parent (`dst_parent`/`name`): Dir's setters work on
/// entries by name, relative to an fd.
fn copy_meta_dir(src: &Dir, dst_parent: &Dir, name: &OsStr) -> Result<()> {
    let meta = src.meta().map_err(Error::os)?;
    let xattrs = src.user_xattrs().map_err(Error::os)?;
    dst_parent
        .set_user_xattrs(name, EntryKind::Dir, &xattrs)
        .map_err(Error::os)?;
    dst_parent
        .set_mode(name, EntryKind::Dir, meta.mode)
        .map_err(Error::os)?;
    dst_parent
        .set_mtime(name, EntryKind::Dir, meta.mtime_ns)
        .map_err(Error::os)?;
    Ok(())
}
