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
use std::sync::atomic::{AtomicU64, Ordering};

use rewind_platform::{Dir, RenameMode};

use crate::error::{Error, Result};

const IGNORE_FILE: &str = ".gitignore";

const IGNORE_TEXT: &str =
    "# rewind's checkpoint history: never added, stashed or cleaned by git\n*\n";

static COUNTER: AtomicU64 = AtomicU64::new(0);

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
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("gitignore.{}.{n}", std::process::id());
    let written = write_new(tmp, &name, IGNORE_TEXT).and_then(|()| {
        tmp.rename(
            OsStr::new(&name),
            state,
            OsStr::new(IGNORE_FILE),
            RenameMode::Replace,
        )
        .map_err(Error::os)
    });
    if written.is_err() {
        let _ = tmp.unlink(OsStr::new(&name));
    }
    written
}

fn write_new(dir: &Dir, name: &str, text: &str) -> Result<()> {
    let mut f = dir.create_new(OsStr::new(name), 0o644).map_err(Error::os)?;
    f.write_all(text.as_bytes()).map_err(|e| {
        Error::os(rewind_platform::Error::new(
            "write",
            dir.path().join(name),
            e,
        ))
    })
}
