use std::path::PathBuf;

use serde::Serialize;

use super::Ctx;
use super::status::render_changes;
use crate::capture::Sink;
use crate::diff::{self, Change, DiffOptions, Trees};
use crate::error::{Error, Result};
use crate::tree::Target;
use crate::workspace::{ChangeJson, Workspace};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// From this checkpoint (default: HEAD)
    pub from: Option<String>,
    /// To this checkpoint, or `live` (default: the live tree)
    pub to: Option<String>,
    /// Show a unified text diff of changed files
    #[arg(long)]
    pub patch: bool,
    /// List every changed path: an added or deleted directory is
    /// otherwise one line with the number of entries below it
    #[arg(long, short)]
    pub all: bool,
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

/// How a diff names the live tree, in its output and as TO.
const LIVE: &str = "live";

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let out = compute(ctx, &args)?;
    // Said on stderr: stdout stays empty for scripts (`| wc -l`, `git
    // apply`), but a typo in a path no longer reads as "nothing changed"
    // without a word (helper-52).
    if out.changes.is_empty() && !ctx.json && !ctx.quiet {
        let under = match args.paths.as_slice() {
            [] => String::new(),
            paths => format!(
                " under {}",
                paths
                    .iter()
                    .map(|p| {
                        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str());
                        crate::names::c_style("", bytes, crate::names::Escapes::Hex)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        rewind_platform::stderr_line!(
            "rewind: no changes{under} between {} and {}",
            out.from.as_deref().unwrap_or("the empty tree"),
            out.to
        );
    }
    ctx.emit(&out, || {
        if let Some(p) = &out.patch {
            return p.clone();
        }
        render_changes(&out.changes, args.all)
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
    patch_range: impl Fn(usize) -> Result<std::ops::Range<usize>>,
) -> Result<Out> {
    let mut ws = ctx.workspace()?;
    // No lock: a gc may prune what it reads (D237).
    ws.read_unlocked(|ws| compute_in(ctx, ws, args, &patch_range))
}

fn compute_in(
    ctx: &Ctx,
    ws: &mut Workspace,
    args: &Args,
    patch_range: &impl Fn(usize) -> Result<std::ops::Range<usize>>,
) -> Result<Out> {
    ws.recover_if_needed()?;
    let mut head_nodes = crate::tree::Overlay::new();
    let from = match args.from.as_deref() {
        Some(LIVE) => {
            return Err(Error::Usage(format!(
                "the live tree can only be TO: `rewind diff {} live` shows the same changes the other way round",
                args.to.as_deref().unwrap_or("HEAD")
            )));
        }
        Some(spec) => Some(ws.resolve(spec)?),
        None => match ws.head_for_reading()? {
            Some((head, nodes)) => {
                head_nodes = nodes;
                Some(head)
            }
            None => None,
        },
    };
    // `live` is what the output calls the live tree (helper-31); a
    // checkpoint labelled `live` is named by its id here.
    let to = match args.to.as_deref() {
        Some(LIVE) | None => None,
        Some(spec) => Some(ws.resolve(spec)?),
    };
    let filters: Vec<Vec<u8>> = args
        .paths
        .iter()
        .map(|p| ws.relative_path(p, &ctx.start_dir()))
        .collect::<Result<_>>()?;
    let live = match &to {
        None => Some(ws.capture(Sink::HashOnly, "scanning")?),
        Some(_) => None,
    };
    if let Some(cap) = &live {
        head_nodes.extend(cap.overlay());
    }
    let trees = Trees::with_overlay(ws.ledger(), head_nodes);
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
    diff::retain_under(&mut changes, &filters);
    let patch = if args.patch {
        let range = patch_range(changes.len())?;
        let snapshot_of = |c: &Option<crate::ledger::Checkpoint>| match c {
            Some(c) => crate::snapshot::open(ws, &c.id),
            None => Ok(None),
        };
        let from_tree = snapshot_of(&from)?;
        let to_tree = match &to {
            Some(_) => snapshot_of(&to)?,
            None => Some(ws.root_dir().try_clone().map_err(Error::os)?),
        };
        Some(render_patch(
            ws,
            &changes[range],
            from_tree.as_ref(),
            to_tree.as_ref(),
        )?)
    } else {
        None
    };
    Ok(Out {
        from: from.map(|c| c.id),
        to: to.map(|c| c.id).unwrap_or_else(|| LIVE.into()),
        changes: ChangeJson::from_changes(&changes),
        patch,
    })
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
        // A directory has no content of its own (its files are changes of
        // their own): a file that replaced one, or that one replaced, is
        // shown as added or deleted. Before, the file's content was missing.
        let not_dir = |e: &Option<crate::tree::Entry>| e.clone().filter(|e| e.subtree().is_none());
        let (old, new) = (not_dir(&c.old), not_dir(&c.new));
        let sides = Sides {
            ws,
            path: &c.path,
            from_tree,
            to_tree,
        };
        match (&old, &new) {
            (None, None) => {}
            // git writes a file that became a symlink (or back) as a
            // deletion and an addition; one diff cannot change the type.
            (Some(o), Some(n)) if o.kind() != n.kind() => {
                sides.patch(&mut out, Some(o), None)?;
                sides.patch(&mut out, None, Some(n))?;
            }
            _ => sides.patch(&mut out, old.as_ref(), new.as_ref())?,
        }
    }
    Ok(out)
}

/// One path of a patch, with where each side's content is read from.
struct Sides<'a> {
    ws: &'a Workspace,
    path: &'a [u8],
    from_tree: Option<&'a rewind_platform::Dir>,
    to_tree: Option<&'a rewind_platform::Dir>,
}

impl Sides<'_> {
    /// A file's or symlink's content as git diffs it: a symlink's is its
    /// target, with no newline (it was written `-> target`, and `git
    /// apply` then failed on a retargeted link and made a new one a
    /// regular file).
    fn content(
        &self,
        e: Option<&crate::tree::Entry>,
        tree: Option<&rewind_platform::Dir>,
    ) -> Result<Content> {
        Ok(match e.map(|e| (&e.target, e.size)) {
            // Not read: the section says so either way, and a file
            // neither stored nor in a tree read as empty on both sides,
            // which dropped the section (helper-58, D295).
            Some((Target::Object(_), size)) if size > PATCH_LIMIT => Content::NotRead,
            Some((Target::Object(h), size)) => {
                match self
                    .ws
                    .read_content(self.path, h, size, tree, PATCH_LIMIT + 1)?
                {
                    Some(bytes) => Content::Bytes(bytes),
                    None => Content::NotRead,
                }
            }
            Some((Target::Link(t), _)) => Content::Bytes(t.clone()),
            _ => Content::Bytes(Vec::new()),
        })
    }

    /// One `diff --git` section, as `git apply` takes it (D176): `new
    /// file mode` and `deleted file mode` lines make an empty file and a
    /// symlink come out as what they are.
    fn patch(
        &self,
        out: &mut String,
        old: Option<&crate::tree::Entry>,
        new: Option<&crate::tree::Entry>,
    ) -> Result<()> {
        let (a_name, b_name) = (git_path("a/", self.path), git_path("b/", self.path));
        let same_object = matches!((old, new), (Some(o), Some(n)) if o.target == n.target);
        let modes = mode_lines(old, new);
        let (a, b) = match (
            self.content(old, self.from_tree)?,
            self.content(new, self.to_tree)?,
        ) {
            (Content::Bytes(a), Content::Bytes(b)) => (a, b),
            // Not compared byte for byte: the entries' objects say
            // whether the content changed.
            _ => {
                if !same_object || !modes.is_empty() {
                    out.push_str(&format!("diff --git {a_name} {b_name}\n{modes}"));
                    if !same_object {
                        not_shown(out, &a_name, &b_name);
                    }
                }
                return Ok(());
            }
        };
        // A change git cannot say (644 to 600, an mtime): no section. A
        // bare `diff --git` line made `git apply` reject the whole patch
        // (helper-54).
        if modes.is_empty() && a == b {
            return Ok(());
        }
        out.push_str(&format!("diff --git {a_name} {b_name}\n{modes}"));
        if a == b {
            return Ok(()); // a mode change, or an empty file made or deleted
        }
        // Not UTF-8 is shown as binary too: a patch of replacement
        // characters would not apply, and would read as a different file.
        let text = std::str::from_utf8(&a)
            .ok()
            .zip(std::str::from_utf8(&b).ok());
        let Some((ta, tb)) = text.filter(|(ta, tb)| {
            !ta.contains('\0')
                && !tb.contains('\0')
                && ta.len() as u64 <= PATCH_LIMIT
                && tb.len() as u64 <= PATCH_LIMIT
        }) else {
            not_shown(out, &a_name, &b_name);
            return Ok(());
        };
        let old_name = if old.is_some() { &a_name } else { "/dev/null" };
        let new_name = if new.is_some() { &b_name } else { "/dev/null" };
        out.push_str(
            &similar::TextDiff::from_lines(ta, tb)
                .unified_diff()
                .context_radius(3)
                .header(old_name, new_name)
                .to_string(),
        );
        Ok(())
    }
}

/// A changed file whose content the patch does not show (binary, over
/// 1 MiB, or not stored), as git writes a binary change: `git apply`
/// rejected a whole patch holding a section without its `index` line,
/// even with `--exclude` of that file (helper-60, D295). The zeros are no
/// blob ids: applying that one file is refused, the rest applies.
fn not_shown(out: &mut String, a_name: &str, b_name: &str) {
    out.push_str(&format!(
        "index 0000000..0000000\nBinary files {a_name} and {b_name} differ\n"
    ));
}

/// The mode lines of a section: git's own for a file made, deleted, or
/// changed between its two modes.
fn mode_lines(old: Option<&crate::tree::Entry>, new: Option<&crate::tree::Entry>) -> String {
    match (old, new) {
        (None, Some(n)) => format!("new file mode {}\n", git_mode(n)),
        (Some(o), None) => format!("deleted file mode {}\n", git_mode(o)),
        (Some(o), Some(n)) if git_mode(o) != git_mode(n) => {
            format!("old mode {}\nnew mode {}\n", git_mode(o), git_mode(n))
        }
        _ => String::new(),
    }
}

/// One side of a patch section.
enum Content {
    Bytes(Vec<u8>),
    /// Over the patch limit, or neither stored nor in a tree to read it
    /// from.
    NotRead,
}

/// A mode as git's patches print it. Git knows two file modes, `100755`
/// when the owner may execute and `100644` otherwise, and a symlink's
/// `120000`: `git apply` rejected a whole patch that held a `100600` (a
/// file of secrets) as garbage (helper-52). A change git cannot say, such
/// as 644 to 600, prints no mode lines.
fn git_mode(e: &crate::tree::Entry) -> &'static str {
    match e.kind() {
        crate::tree::Kind::Symlink => "120000",
        _ if e.mode & 0o100 != 0 => "100755",
        _ => "100644",
    }
}

/// `prefix` and `path` as git's patch headers write a path: in C-style
/// quotes when it holds a control character, a quote, a backslash or
/// bytes that are not UTF-8 (octal escapes). Unquoted, a newline in a
/// name split the header and `git apply` rejected the whole patch
/// (helper-19, D158).
fn git_path(prefix: &str, path: &[u8]) -> String {
    crate::names::c_style(prefix, path, crate::names::Escapes::Octal)
}
