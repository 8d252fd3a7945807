//! The rules that bind the agent are the user's to change (D317).
//!
//! `rewind.toml` says which calls are effects the barrier admits once and
//! how many checkpoints retention keeps. An agent refused a second `git
//! push` could delete the rule and push again; one that wrote `[retention]
//! keep_last = 1` pruned what `rewind gc --keep-last 1` may not (D306).
//! The hooks refuse its writes to that file as they refuse reopening an
//! effect (D286): reading it is fine, changing it is the user's decision.

use std::path::Path;

use super::Resolve;
use super::history::{
    Written, expand_braces, expand_path, glob_component, operands, program, written_by,
};

/// Whether one command writes over, makes, removes or moves away `rules`
/// (a workspace's `rewind.toml`), run in `dir`: as its paths are written,
/// with their braces (`mv rewind.toml{,.bak}`), or a glob that aims at
/// it (`rew*.toml`, `*.toml`). Not a bare `*`: `rm -rf *` at the top is an
/// agent emptying its workspace, which a rewind undoes, not a way around
/// the rules.
pub(super) fn changes(
    words: &[String],
    writes: &[String],
    dir: &Path,
    rules: &Path,
    resolve: Resolve,
) -> bool {
    let near = rules.parent().unwrap_or(rules);
    let Written { mut files, .. } = written_by(words, writes, dir, near, resolve);
    let args = words.get(1..).unwrap_or_default();
    match program(words) {
        // A move's sources are gone from where they were.
        "rm" | "unlink" | "mv" => files.extend(operands(args, &["-t", "-S", "--suffix"])),
        // `git rm`, `git mv`: the same, through git (helper-71).
        "git" if matches!(args.first().map(String::as_str), Some("rm" | "mv")) => {
            files.extend(operands(&args[1..], &["-C"]))
        }
        _ => {}
    }
    let name = rules.file_name().map(|n| n.to_string_lossy().into_owned());
    files.iter().flat_map(|f| expand_braces(f)).any(|f| {
        let Some(p) = expand_path(&f, dir) else {
            return false;
        };
        let (Some(parent), Some(last)) = (p.parent(), p.file_name()) else {
            return false;
        };
        let last = last.to_string_lossy();
        if !last.contains(['*', '?', '[']) {
            return resolve(&p) == rules;
        }
        // A glob that names the file by part of its name.
        let aims = last.contains("toml") || last.contains("rewind");
        aims && name.as_deref().is_some_and(|n| glob_component(&last, n)) && resolve(parent) == near
    })
}
