use std::path::PathBuf;

use serde::Serialize;

use super::Ctx;
use crate::error::Result;
use crate::subvol::Converted;
use crate::workspace::Workspace;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// First turn the directory into a btrfs subvolume in place (keeps
    /// every file, mode, owner, symlink, hard link and xattr; crash-safe;
    /// refuses mounts, nested subvolumes and immutable files inside)
    #[arg(long)]
    subvolume: bool,
    /// The directory (default: -C, else the current directory)
    // Its own id: named `dir` like the global -C, it made clap refuse
    // `-C` after this verb (helper-31, D224).
    #[arg(id = "directory", value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Serialize)]
struct Out {
    workspace: String,
    engine: &'static str,
    reflink: bool,
    fs: String,
    created: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    subvolume: Option<Converted>,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let dir = match args.dir {
        Some(d) if d.is_absolute() => d,
        Some(d) => ctx.path_arg(&d),
        None => ctx.start_dir(),
    };
    if !dir.is_dir() {
        return Err(super::not_a_directory(dir));
    }
    let subvolume = if args.subvolume {
        Some(crate::subvol::convert(&dir, ctx.progress())?)
    } else {
        None
    };
    if let Some(kept) = subvolume.as_ref().and_then(|c| c.kept_old_tree.as_ref()) {
        rewind_platform::stderr_line!(
            "rewind: warning: something in {} changed after it was copied into the subvolume; the old tree is kept at {kept}: compare, copy what you need, then remove it",
            dir.display()
        );
    }
    let (ws, created) = Workspace::init(&dir, false)?;
    // A workspace inside another went unsaid: from then on `status`,
    // `list` and `rewind` there used a new, empty history (helper-74).
    if created
        && let Some(outer) = ws
            .root_path()
            .parent()
            .and_then(Workspace::discover)
            .filter(|o| o != ws.root_path())
    {
        rewind_platform::stderr_line!(
            "rewind: note: {} is inside the workspace {}: it has a history of its own now, which commands run in it use; {}'s checkpoints still hold its files, never its history",
            crate::names::human_os_path(ws.root_path()),
            crate::names::human_os_path(&outer),
            crate::names::human_os_path(&outer),
        );
    }
    let out = Out {
        workspace: ws.root_path().display().to_string(),
        engine: ws.engine().0.as_str(),
        reflink: ws.clones(),
        fs: ws.fs().kind.to_string(),
        created,
        subvolume,
    };
    ctx.emit(&out, || {
        let mut s = String::new();
        if let Some(c) = &out.subvolume {
            if c.already {
                s.push_str(&format!("{} is a btrfs subvolume already\n", c.path));
            } else {
                let how = match c.copied {
                    0 => "by reflink".to_string(),
                    n if n == c.files => "by copying (btrfs refused every clone)".to_string(),
                    n => format!("by reflink ({n} files copied: btrfs refused their clone)"),
                };
                s.push_str(&format!(
                    "{} is now a btrfs subvolume: {} files, {} directories, {} symlinks, {} hard links carried over {how}\n",
                    c.path, c.files, c.dirs, c.symlinks, c.hard_links
                ));
            }
            if let Some(what) = c.cleaned_up {
                s.push_str(&format!("(removed the {what} an interrupted earlier run left)\n"));
            }
            if c.history_moved {
                s.push_str("the existing history moved into .rewind/state/, a nested subvolume that snapshots do not copy\n");
            }
            if let Some(kept) = &c.kept_old_tree {
                s.push_str(&format!(
                    "the old tree is kept at {kept}: something in it changed after it was copied; compare, copy what you need, then remove it\n"
                ));
            }
        }
        s.push_str(&format!(
            "{} workspace {} ({} on {}, {})",
            if out.created {
                "initialized"
            } else {
                "already a"
            },
            out.workspace,
            out.engine,
            out.fs,
            if out.reflink {
                "copy-on-write clones"
            } else {
                "no clones here: files are copied"
            }
        ));
        s
    })
}
