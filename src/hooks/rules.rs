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
use super::history::{Written, expand_path, operands, program, written_by};

/// Whether one command writes over, makes, removes or moves away `rules`
/// (a workspace's `rewind.toml`), run in `dir`. Only paths the line
/// spells out: `rm -rf *` at the top is an agent emptying its workspace,
/// which a rewind undoes, not a way around the rules.
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
    if matches!(program(words), "rm" | "unlink" | "mv") {
        // A move's sources are gone from where they were.
        files.extend(operands(args, &["-t", "-S", "--suffix"]));
    }
    files
        .iter()
        .filter(|f| !f.contains(['*', '?', '[']))
        .any(|f| expand_path(f, dir).is_some_and(|p| resolve(&p) == rules))
}
