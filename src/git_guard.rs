//! Keeps git away from `.rewind/` (D80).
//!
//! A workspace is usually a git checkout, and `.rewind/` an untracked
//! directory in it. So an agent's `git add -A` committed the ledger,
//! `git stash -u` took it away with the other untracked files, and
//! `git clean -fd` deleted the whole history: nothing left to rewind to,
//! right after the command a rewind exists for. A `.gitignore` holding
//! `*` inside `.rewind/` makes git ignore the directory, wherever the
//! repository's root is and even for a repository made after `rewind
//! init`, as jj does for `.jj/`. It is never captured or rewound
//! (`.rewind/` is not part of the tree). `git clean -x` and `git stash -a`
//! take ignored files too; only the mount (`rewind mount`, which hides
//! `.rewind/`) keeps those away.

use std::ffi::OsStr;
use std::io::Write;

use rewind_platform::{Dir, RenameMode};

use crate::error::{Error, Result};

const IGNORE_FILE: &str = ".gitignore";

const IGNORE_TEXT: &str =
    "# rewind's checkpoint history: never added, stashed or cleaned by git\n*\n";

/// Whether the guard is in place.
pub fn in_place(state: &Dir) -> bool {
    state.stat_at(OsStr::new(IGNORE_FILE)).is_ok()
}

/// Write the guard into `state` (`.rewind/`) if it is missing: into `tmp`
/// (`.rewind/tmp/`) first, then renamed in, so it is never half written.
pub fn ensure(state: &Dir, tmp: &Dir) -> Result<()> {
    if in_place(state) {
        return Ok(());
    }
    let (name, mut file) = crate::objects::create_temp(tmp, "gitignore", 0o644)?;
    let written = file
        .write_all(IGNORE_TEXT.as_bytes())
        .map_err(|e| {
            Error::os(rewind_platform::Error::new(
                "write",
                tmp.path().join(&name),
                e,
            ))
        })
        .and_then(|()| {
            tmp.rename(&name, state, OsStr::new(IGNORE_FILE), RenameMode::Replace)
                .map_err(Error::os)
        });
    if written.is_err() {
        let _ = tmp.unlink(&name);
    }
    written
}
