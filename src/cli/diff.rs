use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Ctx;
use super::status::status_letter;
use crate::capture::Sink;
use crate::diff::{self, Change, DiffOptions, Trees};
use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::tree::Target;
use crate::workspace::{ChangeJson, Workspace};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// From this checkpoint (default: HEAD)
    pub from: Option<String>,
    /// To this checkpoint (default: the live tree)
    pub to: Option<String>,
    /// Show a unified text diff of changed files
    #[arg(long)]
    pub patch: bool,
    /// Only these paths
    #[arg(last = true)]
    pub paths: Vec<PathBuf>,
}

#[derive(Serialize)]
pub(crate) struct Out {
    pub from: Option<String>,
    pub to: String,
    pub changes: Vec<ChangeJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

const PATCH_LIMIT: u64 = 1 << 20;

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let out = compute(ctx, &args)?;
    ctx.emit(&out, || {
        if let Some(p) = &out.patch {
            return p.clone();
        }
        let mut s = String::new();
        for c in &out.changes {
            s.push_str(&format!(
                "{} {}\n",
                status_letter(c.status),
                super::human_path(&c.path)
            ));
        }
        s
    })
}

pub(crate) fn compute(ctx: &Ctx, args: &Args) -> Result<Out> {
    compute_patching(ctx, args, |n| Ok(0..n))
}

/// Like [`compute`], with the patch (when asked for) covering only the
/// changes in `patch_range(number of changes)`: a caller that pages the
/// list gets the page's patch from the same capture of the live tree.
pub(crate) fn compute_patching(
    ctx: &Ctx,
    args: &Args,
    patch_range: impl FnOnce(usize) -> Result<std::ops::Range<usize>>,
) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    ws.recover_if_needed()?;
    let from = match &args.from {
        Some(spec) => Some(ws.resolve(spec)?),
        None => ws.head()?,
    };
    let to = args.to.as_deref().map(|s| ws.resolve(s)).transpose()?;
    let filters: Vec<Vec<u8>> = args
        .paths
        .iter()
        .map(|p| ws.relative_path(p, &ctx.start_dir()))
        .collect::<Result<_>>()?;
    let live = match &to {
        None => Some(ws.capture(Sink::HashOnly, "scanning")?),
        Some(_) => None,
    };
    let trees = match &live {
        Some(cap) => Trees::with_overlay(ws.ledger(), cap.overlay()),
        None => Trees::new(ws.ledger()),
    };
    let from_root = from
        .as_ref()
        .map(|c| c.root)
        .unwrap_or_else(crate::tree::Node::empty_hash);
    let to_root = match (&to, &live) {
        (Some(c), _) => c.root,
        (None, Some(cap)) => cap.root,
        (None, None) => crate::tree::Node::empty_hash(),
    };
    let mut changes = diff::diff(&trees, &from_root, &to_root, DiffOptions::default())?;
    if !filters.is_empty() {
        changes.retain(|c| {
            filters.iter().any(|f| {
                f.is_empty()
                    || c.path == *f
                    || (c.path.starts_with(f) && c.path.get(f.len()) == Some(&b'/'))
            })
        });
    }
    let patch = if args.patch {
        let range = patch_range(changes.len())?;
        let snapshot_of = |c: &Option<crate::ledger::Checkpoint>| match c {
            Some(c) => crate::snapshot::open(&ws, &c.id),
            None => Ok(None),
        };
        let from_tree = snapshot_of(&from)?;
        let to_tree = match &to {
            Some(_) => snapshot_of(&to)?,
            None => Some(ws.root_dir().try_clone().map_err(Error::os)?),
        };
        Some(render_patch(
            &ws,
            &changes[range],
            from_tree.as_ref(),
            to_tree.as_ref(),
        )?)
    } else {
        None
    };
    Ok(Out {
        from: from.map(|c| c.id),
        to: to.map(|c| c.id).unwrap_or_else(|| "live".into()),
        changes: ChangeJson::from_changes(&changes),
        patch,
    })
}

/// Content of one side of a change: a stored object, or the file at
/// `path` under `tree` (the live tree, or a btrfs checkpoint's snapshot).
fn content(
    ws: &Workspace,
    path: &[u8],
    hash: &Hash,
    size: u64,
    tree: Option<&rewind_platform::Dir>,
) -> Result<Option<Vec<u8>>> {
    if ws.store().contains(hash, size)? {
        return ws
            .store()
            .read_prefix(hash, size, PATCH_LIMIT + 1)
            .map(Some);
    }
    let Some(tree) = tree else {
        return Ok(None);
    };
    // Not stored (a status-style hash-only capture, or a btrfs
    // checkpoint): read the file itself.
    let p = Path::new(OsStr::from_bytes(path));
    let dir = tree
        .open_beneath(p.parent().unwrap_or(Path::new("")))
        .map_err(Error::os)?;
    let (file, _) = dir
        .open_read(p.file_name().unwrap_or_default())
        .map_err(Error::os)?;
    let mut buf = Vec::new();
    file.take(PATCH_LIMIT + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::os(rewind_platform::Error::new("read", p_lossy(path), e)))?;
    Ok(Some(buf))
}

fn p_lossy(path: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(path))
}

/// `from_tree`/`to_tree`: where content not in the store is read (a btrfs
/// checkpoint's snapshot, or the live tree for TO).
fn render_patch(
    ws: &Workspace,
    changes: &[Change],
    from_tree: Option<&rewind_platform::Dir>,
    to_tree: Option<&rewind_platform::Dir>,
) -> Result<String> {
    let mut out = String::new();
    for c in changes {
        let (a_name, b_name) = (git_path("a/", &c.path), git_path("b/", &c.path));
        let side = |e: &Option<crate::tree::Entry>,
                    tree: Option<&rewind_platform::Dir>|
         -> Result<Option<Vec<u8>>> {
            match e.as_ref().map(|e| &e.target) {
                Some(Target::Object(h)) => {
                    content(ws, &c.path, h, e.as_ref().map_or(0, |e| e.size), tree)
                }
                Some(Target::Link(t)) => Ok(Some([b"-> ".as_slice(), t].concat())),
                _ => Ok(Some(Vec::new())),
            }
        };
        // A directory has no content of its own (its files are changes of
        // their own): a file that replaced one, or that one replaced, is
        // shown against /dev/null. Before, the file's content was missing.
        let not_dir = |e: &Option<crate::tree::Entry>| e.clone().filter(|e| e.subtree().is_none());
        let (old, new) = (not_dir(&c.old), not_dir(&c.new));
        if old.is_none() && new.is_none() {
            continue;
        }
        let (a, b) = (
            side(&old, from_tree)?.unwrap_or_default(),
            side(&new, to_tree)?.unwrap_or_default(),
        );
        out.push_str(&format!("diff --rewind {a_name} {b_name}\n"));
        if let (Some(o), Some(n)) = (&old, &new)
            && o.mode != n.mode
        {
            out.push_str(&format!(
                "old mode {}\nnew mode {}\n",
                git_mode(o),
                git_mode(n)
            ));
        }
        if a.len() as u64 > PATCH_LIMIT || b.len() as u64 > PATCH_LIMIT {
            out.push_str("Large file, not shown\n");
            continue;
        }
        // Not UTF-8 is shown as binary too: a patch of replacement
        // characters would not apply, and would read as a different file.
        let (Ok(ta), Ok(tb)) = (std::str::from_utf8(&a), std::str::from_utf8(&b)) else {
            out.push_str("Binary files differ\n");
            continue;
        };
        if ta.contains('\0') || tb.contains('\0') {
            out.push_str("Binary files differ\n");
            continue;
        }
        let text = similar::TextDiff::from_lines(ta, tb);
        let old_name = if old.is_some() {
            a_name.clone()
        } else {
            "/dev/null".into()
        };
        let new_name = if new.is_some() {
            b_name.clone()
        } else {
            "/dev/null".into()
        };
        out.push_str(
            &text
                .unified_diff()
                .context_radius(3)
                .header(&old_name, &new_name)
                .to_string(),
        );
    }
    Ok(out)
}

/// A mode as git's patches print it: the type bits, then the permissions
/// (a symlink's are always `120000`: git records none).
fn git_mode(e: &crate::tree::Entry) -> String {
    match e.kind() {
        crate::tree::Kind::Symlink => "120000".into(),
        _ => format!("{:06o}", 0o100000 | e.mode),
    }
}

/// `prefix` and `path` as git's patch headers write a path: in C-style
/// quotes when it holds a control character, a quote, a backslash or
/// bytes that are not UTF-8 (octal escapes). Unquoted, a newline in a
/// name split the header and `git apply` rejected the whole patch
/// (helper-19, D158).
fn git_path(prefix: &str, path: &[u8]) -> String {
    let plain = std::str::from_utf8(path)
        .is_ok_and(|p| !p.chars().any(|c| c.is_control() || c == '"' || c == '\\'));
    if plain {
        return format!("{prefix}{}", String::from_utf8_lossy(path));
    }
    let mut q = format!("\"{prefix}");
    for chunk in path.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => q.push_str("\\n"),
                '\t' => q.push_str("\\t"),
                '"' => q.push_str("\\\""),
                '\\' => q.push_str("\\\\"),
                c if c.is_control() => {
                    for b in c.encode_utf8(&mut [0; 4]).bytes() {
                        q.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => q.push(c),
            }
        }
        for b in chunk.invalid() {
            q.push_str(&format!("\\{b:03o}"));
        }
    }
    q.push('"');
    q
}
