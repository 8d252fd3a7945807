//! Shell commands that would delete a workspace's history (`.rewind/`),
//! read from a hook's shell line before it runs (D296, D300): nothing a
//! rewind does can bring the history back once it is gone, so
//! `pre-tool-use` refuses them, naming a form that keeps it where there is
//! one. Pure: the words of each command and the directory it runs in come
//! from [`super::ToolCall`]; nothing here touches the filesystem.

use std::path::{Path, PathBuf};

use rewind_platform::lexical;

use super::Resolve;
use crate::names::{self, shell_word};

/// What `.rewind/` holds that its history cannot do without, as paths
/// below it, each with whether it is a directory: the ledger, its WAL,
/// the objects and their fan-out directories, the btrfs engine's state
/// subvolume. (`tmp/`, `lock`, `clock` and `reserve` are made again.)
/// A pattern is judged by whether it would take one of them.
pub(super) const HISTORY_PATHS: &[(&str, bool)] = &[
    ("", true),
    ("ledger.db", false),
    ("ledger.db-wal", false),
    ("objects", true),
    ("objects/dd", true),
    (
        "objects/dd/37f9edb281f5de29e0f43f64dabaea6d693a0a2ca27a622246c9df9d8edcae",
        false,
    ),
    ("state", true),
    ("state/ledger.db", false),
];

/// What in `.rewind/` is made again when gone: deleting it loses nothing.
const REMADE: &[&str] = &["tmp", "lock", "clock", "reserve"];

/// A shell command that would delete a workspace's history, as
/// [`super::ToolCall::deletes_the_history`] found it; its `Display` is the
/// refusal the agent reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryLoss {
    /// A git command taking ignored files; `instead` leaves the history out.
    IgnoredFiles { runs: String, instead: String },
    /// `rm` of the history or of something in it.
    Removed { runs: String, history: PathBuf },
    /// A command that could delete the history from a directory the line
    /// does not name (`cd "$DIR"`): no form is named, as one repeating
    /// only the `cd` ran in another directory (helper-65).
    Unclear { runs: String, history: PathBuf },
    /// A command that deletes what is in the history (`find -delete`,
    /// `rsync --delete`); `instead` leaves it out.
    Deletes {
        runs: String,
        history: PathBuf,
        instead: String,
    },
    /// A write over a file the history holds (`> .rewind/ledger.db`,
    /// `truncate`, `cp x .rewind/ledger.db`).
    Overwritten { runs: String, history: PathBuf },
    /// A recursive listing that takes in the history (`runs`), fed to an
    /// in-place editor (`editor`): `grep -rl old . | xargs sed -i …`.
    Rewritten {
        runs: String,
        editor: String,
        history: PathBuf,
        /// What leaves the history out of the listing.
        instead: String,
    },
    /// `rm -r` of the workspace root (or a directory above it), the
    /// history with it.
    RemovedWithWorkspace {
        runs: String,
        history: PathBuf,
        /// The directory `rm` names: the workspace root or one above.
        target: PathBuf,
    },
}

impl std::fmt::Display for HistoryLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistoryLoss::IgnoredFiles { runs, instead } => write!(
                f,
                "`{runs}` deletes ignored files, and .rewind/, this workspace's history of every checkpoint, is one of them; run `{instead}` instead, which leaves the history alone and does the rest"
            ),
            HistoryLoss::Removed { runs, history } => write!(
                f,
                "`{runs}` deletes {}, this workspace's history of every checkpoint, and nothing could rewind it; to free space run `rewind gc`; to stop using rewind here, the user runs `rewind deinit --yes`, not the agent",
                names::human_os_path(history)
            ),
            HistoryLoss::Overwritten { runs, history } => write!(
                f,
                "`{runs}` writes over what {} holds, this workspace's history of every checkpoint, and nothing could rewind it; leave it to rewind (`rewind gc` frees space, `rewind doctor` checks and repairs it)",
                names::human_os_path(history)
            ),
            HistoryLoss::Rewritten {
                runs,
                editor,
                history,
                instead,
            } => write!(
                f,
                "`{runs}` lists files of {}, this workspace's history of every checkpoint, and `{editor}` rewrites what it is given in place, which nothing could rewind; {instead}",
                names::human_os_path(history)
            ),
            HistoryLoss::Unclear { runs, history } => write!(
                f,
                "`{runs}` names a place this line does not spell out (a variable, a command's output, `cd -`, `popd`, or a nesting too deep to read), and there it could delete {}, this workspace's history of every checkpoint; write the directory or path plainly (an absolute path), so that what it takes can be told",
                names::human_os_path(history)
            ),
            HistoryLoss::Deletes {
                runs,
                history,
                instead,
            } => write!(
                f,
                "`{runs}` deletes what is in {}, this workspace's history of every checkpoint, and nothing could rewind it; run `{instead}` instead, which leaves the history alone and does the rest",
                names::human_os_path(history)
            ),
            HistoryLoss::RemovedWithWorkspace {
                runs,
                history,
                target,
            } => {
                let root = history.parent().unwrap_or(history);
                if target == root {
                    write!(
                        f,
                        "`{runs}` deletes the workspace and {}, its history of every checkpoint, so nothing could bring it back; to empty the workspace and keep its history, run `find {} -mindepth 1 -maxdepth 1 ! -name .rewind -exec rm -rf {{}} +`",
                        names::human_os_path(history),
                        names::pasteable_word(&root.to_string_lossy()),
                    )
                } else {
                    write!(
                        f,
                        "`{runs}` deletes the workspace {} and its history of every checkpoint with it, so nothing could bring them back; leave it out, or the user deletes it, not the agent",
                        names::human_os_path(root)
                    )
                }
            }
        }
    }
}

impl HistoryLoss {
    /// The same, for a command run after `cds` (the `cd`s before it in
    /// its line): a form to run instead repeats them. Run from the
    /// agent's directory without them, `find .. -delete` reached a
    /// sibling project (helper-64).
    pub(super) fn after(self, cds: &str) -> Self {
        match self {
            HistoryLoss::IgnoredFiles { runs, instead } if !cds.is_empty() => {
                HistoryLoss::IgnoredFiles {
                    runs,
                    instead: format!("{cds} && {instead}"),
                }
            }
            HistoryLoss::Deletes {
                runs,
                history,
                instead,
            } if !cds.is_empty() => HistoryLoss::Deletes {
                runs,
                history,
                instead: format!("{cds} && {instead}"),
            },
            other => other,
        }
    }

    /// The same, for a command whose directory the line does not name.
    pub(super) fn unclear(self, history: &Path) -> Self {
        match self {
            HistoryLoss::IgnoredFiles { runs, .. } | HistoryLoss::Deletes { runs, .. } => {
                HistoryLoss::Unclear {
                    runs,
                    history: history.to_path_buf(),
                }
            }
            other => other,
        }
    }

    /// The same, naming `args` after `program` as what runs.
    fn ran(self, args: &[String], program: &str) -> Self {
        self.running(format!("{program} {}", shown(args)))
    }

    /// The same, with `runs` as what runs (a removal, or one unclear).
    fn running(self, runs: String) -> Self {
        match self {
            HistoryLoss::Removed { history, .. } => HistoryLoss::Removed { runs, history },
            HistoryLoss::RemovedWithWorkspace {
                history, target, ..
            } => HistoryLoss::RemovedWithWorkspace {
                runs,
                history,
                target,
            },
            HistoryLoss::Unclear { history, .. } => HistoryLoss::Unclear { runs, history },
            other => other,
        }
    }
}

/// A word of the agent's line as a form to run instead repeats it:
/// quoted as a shell needs, but with its expansions still expanding
/// (`"$PWD"`, `"$(git rev-parse --show-toplevel)"`; single quotes made
/// them literal, helper-64).
pub(super) fn word_as_written(w: &str) -> String {
    // Only a word that starts with an expansion (a path: `"$PWD/build"`);
    // a script (`sh -c 'rm "$1"'`) was single-quoted, and double quotes
    // emptied its `$1` (helper-66).
    if w.starts_with(['$', '`']) {
        format!("\"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        shell_word(w)
    }
}

/// `path` with the part before its first glob component resolved: a
/// directory reached through a link is the one the filesystem means.
fn resolved_to_glob(path: &Path, resolve: Resolve) -> PathBuf {
    let components: Vec<_> = path.components().collect();
    let first_glob = components
        .iter()
        .position(|c| c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .unwrap_or(components.len());
    let head: PathBuf = components[..first_glob].iter().collect();
    let mut out = resolve(&head);
    out.extend(&components[first_glob..]);
    out
}

/// A word's brace expansion, as the shell makes it: `./{build,.rewind}`
/// is `./build` and `./.rewind` (helper-64). A brace without a comma
/// inside is literal.
pub(super) fn expand_braces(word: &str) -> Vec<String> {
    let mut out = Vec::new();
    expand_braces_into(word, &mut out);
    out
}

/// At most this many words from one brace expansion; the rest are not
/// judged (`{a,b}` twenty times over is a million words, and took the
/// hook 6 s, helper-65).
const MAX_BRACE_WORDS: usize = 256;

fn expand_braces_into(word: &str, out: &mut Vec<String>) {
    if out.len() >= MAX_BRACE_WORDS {
        return;
    }
    let chars: Vec<char> = word.chars().collect();
    let Some(open) = chars.iter().position(|c| *c == '{') else {
        out.push(word.to_string());
        return;
    };
    let mut depth = 0;
    let mut commas = Vec::new();
    let mut close = None;
    for (i, c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(i),
            _ => {}
        }
    }
    let (Some(close), false) = (close, commas.is_empty()) else {
        out.push(word.to_string());
        return;
    };
    let text = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    let (head, tail) = (text(0, open), text(close + 1, chars.len()));
    let mut bounds = vec![open];
    bounds.extend(&commas);
    bounds.push(close);
    for w in bounds.windows(2) {
        expand_braces_into(&format!("{head}{}{tail}", text(w[0] + 1, w[1])), out);
    }
}

/// The home directory a `~` stands for.
pub(super) fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// A command word as the absolute, lexical path the shell would hand on:
/// `~`, `$HOME` and `$PWD` expanded; `None` for a word that names a place
/// only the shell knows (another variable, a command substitution,
/// `~user`, `-`).
pub(super) fn expand_path(word: &str, dir: &Path) -> Option<PathBuf> {
    if word == "-" {
        return None;
    }
    let (base, rest) = if let Some(rest) = word
        .strip_prefix("~+")
        .filter(|r| r.is_empty() || r.starts_with('/'))
    {
        (dir.to_path_buf(), rest.trim_start_matches('/'))
    } else if let Some(rest) = word.strip_prefix('~') {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        (home()?, rest.trim_start_matches('/'))
    } else if let Some((var, rest)) = [
        "$HOME",
        "${HOME}",
        "$PWD",
        "${PWD}",
        "$(pwd)",
        "`pwd`",
        "$CLAUDE_PROJECT_DIR",
        "${CLAUDE_PROJECT_DIR}",
    ]
    .iter()
    .find_map(|v| Some((*v, word.strip_prefix(v)?)))
    .filter(|(_, rest)| rest.is_empty() || rest.starts_with('/'))
    {
        let base = if var.contains("HOME") {
            home()?
        } else if var.contains("CLAUDE") {
            PathBuf::from(std::env::var_os("CLAUDE_PROJECT_DIR").filter(|p| !p.is_empty())?)
        } else {
            dir.to_path_buf()
        };
        (base, rest.trim_start_matches('/'))
    } else {
        // An absolute word replaces `dir` in the join.
        (dir.to_path_buf(), word)
    };
    if rest.contains(['$', '`']) {
        return None;
    }
    Some(lexical(&base.join(rest)))
}

/// [`ToolCall::deletes_the_history`] for one `rm` command (`words`,
/// `rm` first) run in `dir`: an operand that names the history, a path in
/// it, or (with `-r`) a directory holding it, globs read as the shell
/// expands them.
pub(super) fn rm_reaching(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    // What `.rewind/` makes again when gone (`tmp/`, `lock`).
    reaching(words, dir, history, resolve, &|part| REMADE.contains(&part))
}

/// `btrfs subvolume delete` or `btrfs property set … ro false` of a
/// snapshot in the history: with `user_subvol_rm_allowed` an agent could
/// delete the btrfs engine's checkpoints themselves (helper-79). Every
/// path the command names is judged as `rm -r` would be.
pub(super) fn btrfs_reaching(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let args: Vec<&str> = words
        .iter()
        .skip(1)
        .map(String::as_str)
        .skip_while(|w| w.starts_with('-'))
        .collect();
    let [group, command, rest @ ..] = args.as_slice() else {
        return None;
    };
    // btrfs takes any unique prefix (`su de`, `prop s`).
    let is = |word: &str, name: &str| word.len() >= 2.min(name.len()) && name.starts_with(word);
    let changes = (is(group, "subvolume") && is(command, "delete"))
        || (is(group, "property") && is(command, "set"));
    if !changes {
        return None;
    }
    let mut as_rm: Vec<String> = ["rm", "-r", "--"].map(String::from).to_vec();
    as_rm.extend(
        rest.iter()
            .filter(|w| !w.starts_with('-'))
            .map(|w| w.to_string()),
    );
    Some(reaching(&as_rm, dir, history, resolve, &|_| false)?.running(shown(words)))
}

/// [`rm_reaching`], sparing a path in the history whose first component
/// below it `spared` says loses nothing.
fn reaching(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
    spared: &dyn Fn(&str) -> bool,
) -> Option<HistoryLoss> {
    let mut recursive = false;
    let mut operands = Vec::new();
    let mut after_dashes = false;
    for w in &words[1..] {
        if after_dashes || w == "-" || !w.starts_with('-') {
            operands.push(w.as_str());
        } else if w == "--" {
            after_dashes = true;
        } else if let Some(long) = w.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or(long);
            recursive |= unique_prefix(name, RM_LONG) == Some("recursive");
        } else {
            recursive |= w[1..].contains(['r', 'R']);
        }
    }
    let depth = history.components().count();
    let operands: Vec<String> = operands.iter().flat_map(|o| expand_braces(o)).collect();
    // Past the bound, what the shell would make of it is not all known.
    if operands.len() >= MAX_BRACE_WORDS {
        return Some(HistoryLoss::Unclear {
            runs: shown(words),
            history: history.to_path_buf(),
        });
    }
    for op in operands.iter().map(String::as_str) {
        let trimmed = op.trim_end_matches('/');
        // rm itself refuses `.`, `..` and `/`-less emptiness.
        if trimmed.is_empty() && op.is_empty()
            || matches!(trimmed.rsplit('/').next(), Some("." | ".."))
        {
            continue;
        }
        let Some(named) = expand_path(op, dir).map(|p| resolved_to_glob(&p, resolve)) else {
            // A place only the shell knows, ending in the history's name
            // (`"$(git rev-parse --show-toplevel)/.rewind"`, helper-65).
            let tail = op.rsplit(['$', '`', ')', '}']).next().unwrap_or_default();
            if Path::new(tail)
                .components()
                .any(|c| glob_component(&c.as_os_str().to_string_lossy(), ".rewind"))
            {
                return Some(HistoryLoss::Unclear {
                    runs: shown(words),
                    history: history.to_path_buf(),
                });
            }
            continue;
        };
        let named: Vec<String> = named
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let matches = named.iter().zip(history.components()).all(|(n, h)| {
            let h = h.as_os_str().to_string_lossy();
            if n.contains(['*', '?', '[']) {
                glob_component(n, &h)
            } else {
                *n == h
            }
        });
        if !matches {
            continue;
        }
        if named.get(depth).is_some_and(|part| spared(part)) {
            continue;
        }
        let runs = shown(words);
        let history = history.to_path_buf();
        if named.len() > depth || (named.len() == depth && recursive) {
            return Some(HistoryLoss::Removed { runs, history });
        }
        if named.len() < depth && recursive {
            let target = history.components().take(named.len()).collect();
            return Some(HistoryLoss::RemovedWithWorkspace {
                runs,
                history,
                target,
            });
        }
    }
    None
}

/// [`ToolCall::deletes_the_history`] for one `mv` command: a source that
/// is the history or holds it takes it away as `rm -r` would (`mv .rewind
/// old && rm -rf old` passed, helper-65).
pub(super) fn mv_reaching(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let mut operands: Vec<String> = Vec::new();
    let mut target_given = false;
    let mut it = words[1..].iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "-t" | "--target-directory" | "--target" => {
                it.next();
                target_given = true;
            }
            w if w.starts_with("--target") => target_given = true,
            // `-t/DIR`, `-vt DIR`: the target in the cluster.
            w if w.starts_with('-') && !w.starts_with("--") && w.contains('t') => {
                if w.ends_with('t') {
                    it.next();
                }
                target_given = true;
            }
            w if w.starts_with('-') && w != "-" => {}
            _ => operands.push(w.clone()),
        }
    }
    if !target_given {
        operands.pop();
    }
    let as_rm: Vec<String> = ["rm".to_string(), "-r".into(), "--".into()]
        .into_iter()
        .chain(operands)
        .collect();
    // A rename of the workspace takes its history along: only a move of
    // the history itself, or of what is in it, loses it here (helper-66).
    rm_reaching(&as_rm, dir, history, resolve)
        .filter(|loss| matches!(loss, HistoryLoss::Removed { .. }))
        .map(|loss| loss.ran(&words[1..], "mv"))
}

/// What one command writes, as written in the line.
pub(super) struct Written {
    /// The files it writes over or makes.
    pub files: Vec<String>,
    /// The directories a copy puts whole trees onto (see [`destinations`]).
    pub onto: Vec<String>,
}

/// [`Written`] for one command: its output redirections (`writes`), the
/// files `truncate`, `shred`, `tee`, `sed -i` and `perl -i` name, `dd
/// of=`, and the destination of `cp`, `mv`, `install` and `ln`. `near`:
/// a directory whose own subdirectories are known by name (see
/// [`destinations`]).
pub(super) fn written_by(
    words: &[String],
    writes: &[String],
    dir: &Path,
    near: &Path,
    resolve: Resolve,
) -> Written {
    let args = words.get(1..).unwrap_or_default();
    let mut files: Vec<String> = writes.to_vec();
    let mut onto = Vec::new();
    match program(words) {
        "truncate" => files.extend(operands(args, &["-s", "-r", "--size", "--reference"])),
        "shred" => files.extend(operands(args, &["-n", "-s", "--iterations", "--size"])),
        "tee" => files.extend(operands(args, &[])),
        "dd" => files.extend(
            args.iter()
                .filter_map(|a| a.strip_prefix("of="))
                .map(str::to_string),
        ),
        "cp" | "mv" | "install" | "ln" => {
            let (written, trees) = destinations(args, dir, near, resolve);
            files.extend(written);
            onto = trees;
        }
        _ if rewrites_in_place(words) => files.extend(edited_files(words)),
        _ => {}
    }
    Written { files, onto }
}

/// [`ToolCall::deletes_the_history`] for what one command writes: its
/// output redirections (`writes`), the files `truncate`, `shred`, `tee`,
/// `sed -i` and `perl -i` name, `dd of=`, and the destination of `cp`,
/// `mv`, `install` and `ln`. A write over the ledger, its WAL, an object
/// or the btrfs state loses the history as an `rm` does: `truncate -s0
/// .rewind/ledger.db` and `: > .rewind/ledger.db-wal` passed (D310). The
/// rest of `.rewind/` (`ignore`, `mount.log`, `tmp/`) may be written.
pub(super) fn overwrite_reaching(
    words: &[String],
    writes: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let Written {
        files: targets,
        onto,
    } = written_by(words, writes, dir, history, resolve);
    // A copy onto the history itself (`cp -a ../bak/.rewind .`) replaces
    // its files with another copy's.
    let whole = onto
        .iter()
        .any(|t| expand_path(t, dir).is_some_and(|p| resolve(&p) == history));
    if targets.is_empty() && !whole {
        return None;
    }
    let runs = || shown_with_writes(words, writes);
    if whole {
        return Some(HistoryLoss::Overwritten {
            runs: runs(),
            history: history.to_path_buf(),
        });
    }
    let as_rm: Vec<String> = ["rm".to_string(), "--".into()]
        .into_iter()
        .chain(targets)
        .collect();
    // Only what the history cannot do without: a file of its own in
    // `.rewind/` (`ignore`, `mount.log`, a copy of the ledger) is no loss.
    let spared = |part: &str| !HELD.iter().any(|h| glob_component(part, h));
    match reaching(&as_rm, dir, history, resolve, &spared)? {
        HistoryLoss::Removed { history, .. } => Some(HistoryLoss::Overwritten {
            runs: runs(),
            history,
        }),
        // Past what can be read (a path only the shell knows ending in
        // the history's name, too many operands): said, not let through.
        HistoryLoss::Unclear { history, .. } => Some(HistoryLoss::Unclear {
            runs: runs(),
            history,
        }),
        _ => None,
    }
}

/// Whether a command lists files of the history for another to read:
/// a recursive `grep` (`-r`, `-R`, `rgrep`) or `rg --hidden`/`-uu` whose
/// scope holds it, unless it leaves `.rewind` out (`--exclude-dir`, an
/// `--include` no file of the history matches, `-g '!.rewind'`), or a
/// `find` whose expression takes one in. `Some(advice)`: how to leave it
/// out.
pub(super) fn lists_history(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<&'static str> {
    let program = program(words);
    // `--exclude-dir={.git,.rewind}`: as bash hands it on.
    let expanded: Vec<String> = words
        .get(1..)
        .unwrap_or_default()
        .iter()
        .flat_map(|w| expand_braces(w))
        .collect();
    let args = &expanded[..];
    // A place only the shell knows (`"$(git rev-parse --show-toplevel)"`)
    // may hold it.
    let reaches = |ops: &[String]| {
        let dot = [".".to_string()];
        let ops = if ops.is_empty() { &dot[..] } else { ops };
        ops.iter()
            .any(|o| match expand_path(o, dir).map(|p| resolve(&p)) {
                Some(p) => history.starts_with(&p) || p.starts_with(history),
                None => o.contains(['$', '`']),
            })
    };
    // Only a listing of names feeds an editor (`grep -rn` prints lines).
    let lists_names = |long: &[&str], short: &str| {
        args.iter().any(|a| {
            a.strip_prefix("--")
                .is_some_and(|l| long.contains(&l.split('=').next().unwrap_or(l)))
                || (a.starts_with('-')
                    && !a.starts_with("--")
                    && a[1..].contains(|c| short.contains(c)))
        })
    };
    let history_files: Vec<&str> = HISTORY_PATHS
        .iter()
        .filter(|(_, is_dir)| !is_dir)
        .filter_map(|(p, _)| p.rsplit('/').next())
        .collect();
    match program {
        "grep" | "egrep" | "fgrep" | "rgrep" => {
            let mut recursive = program == "rgrep";
            let mut pattern_given = false;
            let mut excluded = false;
            let mut includes: Vec<String> = Vec::new();
            let mut ops = Vec::new();
            let mut it = args.iter();
            let leaves_out = |g: &str| wildcard(g.trim_end_matches('/'), ".rewind", true);
            while let Some(a) = it.next() {
                let long = a
                    .strip_prefix("--")
                    .map(|l| l.split_once('=').unwrap_or((l, "")));
                match (a.as_str(), long) {
                    ("--", _) => ops.extend(it.by_ref().cloned()),
                    (_, Some(("recursive" | "dereference-recursive", _))) => recursive = true,
                    (_, Some(("directories", v))) => {
                        let v = if v.is_empty() {
                            it.next().map_or("", String::as_str)
                        } else {
                            v
                        };
                        recursive |= v == "recurse";
                    }
                    (_, Some(("regexp" | "file", v))) => {
                        pattern_given = true;
                        if v.is_empty() {
                            it.next();
                        }
                    }
                    (_, Some(("exclude-dir", v))) => {
                        let v = if v.is_empty() {
                            it.next().map_or("", String::as_str)
                        } else {
                            v
                        };
                        excluded |= leaves_out(v);
                    }
                    (_, Some(("include", v))) => {
                        let v = if v.is_empty() {
                            it.next().map_or("", String::as_str)
                        } else {
                            v
                        };
                        includes.push(v.to_string());
                    }
                    (_, Some((name, v))) => {
                        if v.is_empty()
                            && matches!(
                                name,
                                "exclude"
                                    | "max-count"
                                    | "label"
                                    | "context"
                                    | "after-context"
                                    | "before-context"
                                    | "devices"
                                    | "binary-files"
                                    | "exclude-from"
                            )
                        {
                            it.next();
                        }
                    }
                    (w, None) if w.starts_with('-') && w.len() > 1 => {
                        for (i, c) in w.char_indices().skip(1) {
                            match c {
                                'r' | 'R' => recursive = true,
                                'e' | 'f' | 'A' | 'B' | 'C' | 'm' | 'd' | 'D' => {
                                    let rest = &w[i + 1..];
                                    let value = if rest.is_empty() {
                                        it.next().map_or("", String::as_str)
                                    } else {
                                        rest
                                    };
                                    pattern_given |= matches!(c, 'e' | 'f');
                                    recursive |= c == 'd' && value == "recurse";
                                    break;
                                }
                                _ => {}
                            }
                        }
                    }
                    _ if !pattern_given => pattern_given = true,
                    _ => ops.push(a.clone()),
                }
            }
            let included = includes.is_empty()
                || includes
                    .iter()
                    .any(|g| history_files.iter().any(|f| wildcard(g, f, true)));
            let names = lists_names(&["files-with-matches", "files-without-match"], "lL");
            (recursive && names && !excluded && included && reaches(&ops))
                .then_some("add `--exclude-dir=.rewind` to the grep")
        }
        // Recursive, and reads dot directories, by default.
        "ack" | "ack-grep" => {
            let excluded = args.iter().any(|a| {
                a.strip_prefix("--ignore-dir=")
                    .or_else(|| a.strip_prefix("--ignore-directory="))
                    .is_some_and(|d| d.trim_end_matches('/') == ".rewind")
            });
            let names = lists_names(&["files-with-matches", "files-without-matches"], "lLf");
            let ops: Vec<String> = args
                .iter()
                .filter(|a| !a.starts_with('-'))
                .skip(usize::from(!args.iter().any(|a| a == "-f")))
                .cloned()
                .collect();
            (names && !excluded && reaches(&ops)).then_some("add `--ignore-dir=.rewind` to the ack")
        }
        "ag" => {
            let hidden = args.iter().any(|a| {
                matches!(
                    a.as_str(),
                    "--hidden" | "--unrestricted" | "-u" | "-U" | "--all-types"
                )
            });
            let names = lists_names(&["files-with-matches", "files-without-matches"], "lLg");
            (hidden && names && reaches(&[])).then_some("add `--ignore .rewind` to the ag")
        }
        "rg" => {
            // `--no-ignore` alone still skips dot directories.
            let unrestricted: usize = args
                .iter()
                .filter(|a| a.starts_with('-') && !a.starts_with("--"))
                .map(|a| a.matches('u').count())
                .sum();
            let hidden = unrestricted >= 2
                || args.iter().any(|a| {
                    a == "--hidden"
                        || (a.starts_with('-') && !a.starts_with("--") && a.contains('.'))
                });
            // An allow-list (`-g '*.py'`, `-t py`) no file of the history
            // is on.
            let allowed: Vec<&String> = args
                .windows(2)
                .filter(|w| {
                    matches!(w[0].as_str(), "-g" | "--glob" | "--iglob") && !w[1].starts_with('!')
                })
                .map(|w| &w[1])
                .collect();
            let typed = args.iter().any(|a| {
                a == "-t"
                    || a == "--type"
                    || (a.starts_with("-t") && a.len() > 2)
                    || a.starts_with("--type=")
            });
            let allow_listed = typed
                || (!allowed.is_empty()
                    && !allowed
                        .iter()
                        .any(|g| history_files.iter().any(|f| wildcard(g, f, true))));
            let names = lists_names(&["files-with-matches", "files-without-match", "files"], "l");
            let hidden = hidden && names && !allow_listed;
            let leaves_out = args.windows(2).any(|w| {
                matches!(w[0].as_str(), "-g" | "--glob" | "--iglob")
                    && w[1].starts_with('!')
                    && w[1].contains(".rewind")
            }) || args
                .iter()
                .any(|a| a.starts_with("--glob=!") && a.contains(".rewind"));
            let mut ops = Vec::new();
            let mut pattern_given = false;
            let mut it = args.iter();
            while let Some(a) = it.next() {
                if matches!(
                    a.as_str(),
                    "-g" | "--glob"
                        | "--iglob"
                        | "-t"
                        | "--type"
                        | "-T"
                        | "--type-not"
                        | "-m"
                        | "-A"
                        | "-B"
                        | "-C"
                        | "-j"
                        | "-M"
                ) {
                    it.next();
                } else if matches!(a.as_str(), "-e" | "--regexp" | "-f" | "--file") {
                    pattern_given = true;
                    it.next();
                } else if a.starts_with('-') {
                } else if !pattern_given {
                    pattern_given = true;
                } else {
                    ops.push(a.clone());
                }
            }
            (hidden && !leaves_out && reaches(&ops)).then_some("add `-g '!.rewind'` to the rg")
        }
        "find" => super::find::lists(words, dir, history, resolve)
            .then_some("add `! -path '*/.rewind/*'` to the find"),
        _ => None,
    }
}

/// What `.rewind/` holds that its history cannot do without, by the name
/// below it: a write over any of them loses checkpoints.
const HELD: &[&str] = &["ledger.db", "ledger.db-wal", "objects", "state"];

/// Whether a command rewrites in place the files it is given: `sed -i`,
/// `perl -i` (`-pi`, `-i.bak`), `ruby -i`. Fed a recursive listing of
/// the workspace, it rewrites the history's files too (helper-67).
pub(super) fn rewrites_in_place(words: &[String]) -> bool {
    let program = program(words);
    let args = words.get(1..).unwrap_or_default();
    match program {
        "sed" | "gsed" => args.iter().any(|a| {
            a == "--in-place"
                || a.starts_with("--in-place=")
                || (a.starts_with('-')
                    && !a.starts_with("--")
                    && a[1..].starts_with(|c: char| c != 'e' && c != 'f')
                    && short_cluster_has(a, 'i', "ef"))
        }),
        "perl" | "ruby" => args
            .iter()
            .take_while(|a| a.starts_with('-'))
            .any(|a| !a.starts_with("--") && short_cluster_has(a, 'i', "eE")),
        _ => false,
    }
}

/// Whether a short-option cluster (`-Ei`, `-pi.bak`) holds `flag` before
/// any option in `with_argument`, whose argument is the rest.
fn short_cluster_has(word: &str, flag: char, with_argument: &str) -> bool {
    for c in word.chars().skip(1) {
        if c == flag {
            return true;
        }
        if with_argument.contains(c) {
            return false;
        }
    }
    false
}

/// The files an in-place editor is given: its operands past the script
/// (the first operand, unless `-e` or `-f` gave it).
pub(super) fn edited_files(words: &[String]) -> Vec<String> {
    let args = words.get(1..).unwrap_or_default();
    let mut out = Vec::new();
    let mut script_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            out.extend(it.by_ref().cloned());
        } else if matches!(
            a.as_str(),
            "-e" | "-f" | "--expression" | "--file" | "-E" | "-M" | "-m" | "-I"
        ) {
            script_given |= !matches!(a.as_str(), "-M" | "-m" | "-I");
            it.next();
        } else if a.starts_with("--expression=") || a.starts_with("--file=") {
            script_given = true;
        } else if a.starts_with('-') && a != "-" {
            // `-pe 's/a/b/'`, `-ne …`: the script is the next word.
            if a.len() > 1 && a[1..].ends_with(['e', 'E']) && !a.starts_with("--") {
                script_given = true;
                it.next();
            }
        } else if !script_given {
            script_given = true;
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// A command's operands: its words that are no option, nor the argument
/// of one of `with_argument` given apart (`-s 0`); all after `--`.
pub(super) fn operands(args: &[String], with_argument: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            out.extend(it.by_ref().cloned());
        } else if with_argument.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') || a == "-" {
            out.push(a.clone());
        }
    }
    out
}

/// The files `cp`, `mv`, `install` or `ln` writes, and the directories it
/// copies whole trees onto. Each source lands by its name in a target
/// directory: `-t DIR` (also in a cluster, `-vt DIR`, or abbreviated,
/// `--target=DIR`), or a last operand that is a directory (on disk, or
/// ending in `/`, or a glob); else the last operand is the file written.
/// A source ending in `/.` (`cp -a ../bak/. .`) puts what it holds in
/// the target: its `.rewind`, when it has one, lands on the target's.
/// Looks at the filesystem: which operands are directories (the
/// history's own are known by name).
fn destinations(
    args: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> (Vec<String>, Vec<String>) {
    let mut target_dir: Option<String> = None;
    let mut ops = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            ops.extend(it.by_ref().cloned());
        } else if let Some(long) = a.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            if name.len() >= 2 && "target-directory".starts_with(name) {
                target_dir = value.or_else(|| it.next().cloned());
            } else if value.is_none() && matches!(name, "suffix" | "mode" | "owner" | "group") {
                it.next();
            }
        } else if a.starts_with('-') && a != "-" {
            match a.find('t') {
                Some(at) => {
                    let rest = &a[at + 1..];
                    target_dir = if rest.is_empty() {
                        it.next().cloned()
                    } else {
                        Some(rest.to_string())
                    };
                }
                // install's and cp's options with a separate argument.
                None if matches!(a.as_str(), "-S" | "-m" | "-o" | "-g") => {
                    it.next();
                }
                None => {}
            }
        } else {
            ops.push(a.clone());
        }
    }
    // Whether the directory `from` names holds a `.rewind`.
    let holds_history = |from: &str| {
        expand_path(if from.is_empty() { "." } else { from }, dir)
            .is_some_and(|p| resolve(&p).join(".rewind").is_dir())
    };
    // `cp -rT ../bak .`: the source's content lands in the target.
    let no_target = args.iter().any(|a| {
        a == "--no-target-directory"
            || (a.starts_with('-') && !a.starts_with("--") && a.contains('T'))
    });
    if no_target && target_dir.is_none() && ops.len() == 2 {
        let onto = if holds_history(&ops[0]) {
            vec![format!("{}/.rewind", ops[1].trim_end_matches('/'))]
        } else {
            Vec::new()
        };
        return (vec![ops[1].clone()], onto);
    }
    let is_dir = |w: &str| {
        w.ends_with('/')
            || w.contains(['*', '?', '['])
            || expand_path(w, dir).map(|p| resolve(&p)).is_some_and(|p| {
                p.is_dir() || p.strip_prefix(history).is_ok_and(is_a_history_directory)
            })
    };
    let (into, sources) = match target_dir {
        Some(d) => (d, ops),
        None if ops.len() >= 2 => {
            let last = ops.pop().unwrap_or_default();
            if !is_dir(&last) {
                return (vec![last], Vec::new());
            }
            (last, ops)
        }
        // `ln -s TARGET`: a link of that name here.
        None => return (Vec::new(), Vec::new()),
    };
    let into = into.trim_end_matches('/').to_string();
    let mut files = Vec::new();
    let mut onto = Vec::new();
    for s in &sources {
        let trimmed = s.trim_end_matches('/');
        if trimmed.ends_with("/.") || trimmed == "." {
            let from = trimmed.trim_end_matches('.').trim_end_matches('/');
            if holds_history(from) {
                onto.push(format!("{into}/.rewind"));
            }
            continue;
        }
        if let Some(name) = trimmed.rsplit('/').next() {
            // `../bak/.[!.]*`, `../bak/.*`: a glob that takes the backup's
            // `.rewind` along.
            let parent = trimmed
                .strip_suffix(name)
                .unwrap_or("")
                .trim_end_matches('/');
            if name.contains(['*', '?', '['])
                && wildcard(name, ".rewind", true)
                && holds_history(parent)
            {
                onto.push(format!("{into}/.rewind"));
            }
            files.push(format!("{into}/{name}"));
            onto.push(format!("{into}/{name}"));
        }
    }
    (files, onto)
}

/// Whether a path below the history is one of its directories: itself,
/// `objects/` and its fan-out directories, `state/`.
fn is_a_history_directory(rel: &Path) -> bool {
    let parts: Vec<_> = rel.components().collect();
    match parts.as_slice() {
        [] => true,
        [one] => ["objects", "state"].iter().any(|d| one.as_os_str() == *d),
        [first, _] => first.as_os_str() == "objects",
        _ => false,
    }
}

const RM_LONG: &[&str] = &[
    "force",
    "interactive",
    "one-file-system",
    "no-preserve-root",
    "preserve-root",
    "recursive",
    "dir",
    "verbose",
    "help",
    "version",
];

/// One piece of a shell glob.
enum GlobPiece {
    Any,
    One,
    /// `[...]`: ranges, `!`/`^` negating; a POSIX class (`[:alpha:]`)
    /// is taken as matching anything, which can only refuse more.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
        any: bool,
    },
    Literal(char),
}

/// Whether a shell glob (`*`, `?`, `[...]`) matches one path component
/// as bash expands it without `dotglob`: a leading `.` only by a `.`
/// (`rm -rf .[!.]*` takes `.rewind`, `rm -rf *` does not).
pub(super) fn glob_component(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    fnmatch(pattern, name)
}

/// A shell glob (`*`, `?`, `[...]`) over the whole of `name`, `/` and a
/// leading `.` matched as any other character, as `find -name` and
/// `-path` match. Iterative with one backtrack point.
pub(super) fn fnmatch(pattern: &str, name: &str) -> bool {
    wildcard(pattern, name, true)
}

/// `pattern` over the whole of `text`: `*` any run of characters, `?`
/// any one, and with `classes` a `[...]` any one of its set; everything
/// else literal. Iterative with one backtrack point: linear in practice.
/// The effect rules' globs take no classes (a `[main]` a user meant as a
/// branch would never match, so `validate_pattern` refuses it).
pub(super) fn wildcard(pattern: &str, name: &str, classes: bool) -> bool {
    let chars: Vec<char> = pattern.chars().collect();
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        pieces.push(match c {
            '*' => GlobPiece::Any,
            '?' => GlobPiece::One,
            // `\.`: a literal dot, as fnmatch reads it (`-path '*/\.*'`
            // read a backslash that no name holds, helper-68).
            '\\' if classes && i < chars.len() => {
                i += 1;
                GlobPiece::Literal(chars[i - 1])
            }
            '[' if classes => {
                let mut j = i;
                let negated = matches!(chars.get(j), Some('!' | '^'));
                j += usize::from(negated);
                let start = j;
                // A `]` first is literal; the class ends at the next.
                while j < chars.len() && (chars[j] != ']' || j == start) {
                    j += 1;
                }
                if j >= chars.len() {
                    GlobPiece::Literal('[')
                } else {
                    let body = &chars[start..j];
                    let any = body.windows(2).any(|w| w == ['[', ':']);
                    let mut ranges = Vec::new();
                    let mut k = 0;
                    while k < body.len() {
                        if k + 2 < body.len() && body[k + 1] == '-' {
                            ranges.push((body[k], body[k + 2]));
                            k += 3;
                        } else {
                            ranges.push((body[k], body[k]));
                            k += 1;
                        }
                    }
                    i = j + 1;
                    GlobPiece::Class {
                        negated,
                        ranges,
                        any,
                    }
                }
            }
            c => GlobPiece::Literal(c),
        });
    }
    let one = |p: &GlobPiece, c: char| match p {
        GlobPiece::Any => false,
        GlobPiece::One => true,
        GlobPiece::Literal(l) => *l == c,
        GlobPiece::Class {
            negated,
            ranges,
            any,
        } => *any || ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated,
    };
    let t: Vec<char> = name.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < pieces.len() && one(&pieces[pi], t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < pieces.len() && matches!(pieces[pi], GlobPiece::Any) {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pieces[pi..].iter().all(|p| matches!(p, GlobPiece::Any))
}

/// Where a git command works, past its own options (`-C DIR`, each
/// relative to the one before).
pub(super) struct GitAt {
    pub dir: PathBuf,
    /// A `-C "$ROOT"`: somewhere the line does not say, taken as `/`.
    pub unknown: bool,
    /// The index of its verb in `args`.
    pub verb: usize,
}

/// See [`GitAt`]; `args`: git's words after `git`; `None` when an option
/// lacks its argument.
pub(super) fn git_at(args: &[String], dir: &Path, resolve: Resolve) -> Option<GitAt> {
    let mut at = GitAt {
        dir: dir.to_path_buf(),
        unknown: false,
        verb: 0,
    };
    // git's own options come before its verb; these take the next word.
    while let Some(a) = args.get(at.verb) {
        match a.as_str() {
            "-C" => {
                match expand_path(args.get(at.verb + 1)?, &at.dir) {
                    Some(d) => at.dir = resolve(&d),
                    None => {
                        at.dir = PathBuf::from("/");
                        at.unknown = true;
                    }
                }
                at.verb += 2;
            }
            "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix"
            | "--config-env" | "--attr-source" => at.verb += 2,
            a if a.starts_with('-') => at.verb += 1,
            _ => break,
        }
    }
    Some(at)
}

/// [`ToolCall::deletes_the_history`] for one git command: `args` after
/// `git`, run in `dir`.
pub(super) fn git_taking_ignored(
    args: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let GitAt {
        dir,
        unknown,
        verb: i,
    } = git_at(args, dir, resolve)?;
    let verb = args.get(i)?.as_str();
    // `git worktree remove PATH` removes PATH as `rm -r` does.
    if verb == "worktree" && args.get(i + 1).is_some_and(|s| s == "remove") {
        let path = args[i + 2..].iter().find(|a| !a.starts_with('-'))?;
        let as_rm = ["rm".to_string(), "-r".into(), path.clone()];
        return rm_reaching(&as_rm, &dir, history, resolve).map(|loss| loss.ran(args, "git"));
    }
    let head: Vec<String> = std::iter::once("git")
        .chain(args[..=i].iter().map(String::as_str))
        .map(word_as_written)
        .collect();
    let words = &args[i + 1..];
    let parsed = match verb {
        "clean" => GitArgs::parse(words, CLEAN_LONG, "e", false),
        "stash" => {
            let sub = words.first().filter(|w| !w.starts_with('-'));
            match sub.map(String::as_str) {
                None | Some("push") => {
                    GitArgs::parse(&words[sub.map_or(0, |_| 1)..], STASH_LONG, "m", false)
                }
                // `save`'s words are its message.
                Some("save") => GitArgs::parse(&words[1..], STASH_LONG, "m", true),
                Some(_) => return None,
            }
        }
        _ => return None,
    };
    let takes = match verb {
        "clean" => (parsed.short('x') || parsed.short('X')) && !parsed.dry_run(),
        // git refuses `--patch` with `--all` and does nothing.
        _ => {
            (parsed.short('a') || parsed.long("all"))
                && !(parsed.short('p') || parsed.long("patch"))
        }
    };
    if !takes {
        return None;
    }
    let under = |p: &Path| history.starts_with(p) || p.starts_with(history);
    let positive: Vec<&String> = parsed.pathspecs.iter().filter(|p| !is_exclude(p)).collect();
    // A clean acts below its directory; a stash on the whole repository.
    // The history's paths as a pathspec from `dir` would name them.
    let from_dir = history
        .strip_prefix(&dir)
        .ok()
        .map(|r| r.to_string_lossy().into_owned());
    let reaches = if positive.is_empty() {
        verb == "stash" || history.starts_with(&dir)
    } else {
        positive.iter().any(|p| {
            let path = pathspec_path(p);
            match (p.strip_prefix(":/"), p.starts_with(':')) {
                // From the top: all of it, or a path we cannot place.
                (Some(rest), _) => rest.is_empty() || rest.contains(".rewind"),
                // `:(glob)**/*.pyc`: read as its path, unless from the top.
                (None, true)
                    if p.strip_prefix(":(")
                        .and_then(|m| m.split_once(')'))
                        .is_none_or(|(magic, _)| magic.split(',').any(|m| m == "top")) =>
                {
                    true
                }
                // A glob matches across `/`, as git's pathspecs do: it
                // reaches the history if it names one of its paths
                // (`*.log` does not, helper-65).
                // (The history itself and its files: a directory goes
                // with what is in it.)
                _ if path.contains(['*', '?', '[']) => from_dir.as_ref().is_some_and(|rel| {
                    HISTORY_PATHS
                        .iter()
                        .filter(|(part, is_dir)| part.is_empty() || !is_dir)
                        .any(|(part, _)| match part {
                            &"" => fnmatch(path, rel),
                            part => fnmatch(path, &format!("{rel}/{part}")),
                        })
                }),
                _ => under(&lexical(&dir.join(path))),
            }
        })
    };
    // An `-e` pattern (git's ignore syntax) that takes `.rewind` keeps
    // it: `.rewind`, `/.rewind`, `.*`, `.rewind/*` (helper-65).
    let ignores_history = |e: &str| {
        let e = e
            .trim_start_matches("**/")
            .trim_end_matches("/**")
            .trim_end_matches("/*")
            .trim_end_matches('/');
        match e.strip_prefix('/') {
            Some(anchored) => dir.join(".rewind") == history && fnmatch(anchored, ".rewind"),
            None => fnmatch(e, ".rewind"),
        }
    };
    let left_out = parsed
        .pathspecs
        .iter()
        .any(|p| is_exclude(p) && lexical(&dir.join(pathspec_path(p))) == history)
        || (verb == "clean"
            && !parsed.short('X')
            && parsed.values.iter().any(|e| ignores_history(e)));
    if !reaches || left_out {
        return None;
    }
    let line = head
        .iter()
        .cloned()
        .chain(words.iter().map(|w| word_as_written(w)))
        .collect::<Vec<_>>()
        .join(" ");
    let mut instead = head;
    // `stash -a` and `stash save` say it as `stash push`, which takes
    // pathspecs.
    if verb == "stash" {
        instead.push("push".into());
    }
    // Under `-X` an `-e` pattern that takes `.rewind` makes git delete it
    // even past the exclude (git 2.47, helper-66): the form leaves it out.
    let takes_rewind = |w: &str| ignores_history(w);
    let mut options = parsed.options.iter().peekable();
    while let Some(o) = options.next() {
        if verb == "clean" && parsed.short('X') {
            if o == "-e" && options.peek().is_some_and(|v| takes_rewind(v)) {
                options.next();
                continue;
            }
            let attached = o
                .strip_prefix("--exclude=")
                .or_else(|| o.strip_prefix("-e").filter(|v| !v.is_empty()));
            if attached.is_some_and(takes_rewind) {
                continue;
            }
        }
        instead.push(word_as_written(o));
    }
    instead.push("--".into());
    instead.extend(parsed.pathspecs.iter().map(|p| word_as_written(p)));
    // From a directory not known (judged as `/`), git takes the
    // absolute path inside its work tree.
    let excluded = if dir == Path::new("/") {
        history.to_string_lossy().into_owned()
    } else {
        relative(&dir, history)
    };
    instead.push(shell_word(&format!(":(exclude){excluded}")));
    if unknown {
        return Some(HistoryLoss::Unclear {
            runs: line,
            history: history.to_path_buf(),
        });
    }
    Some(HistoryLoss::IgnoredFiles {
        runs: line,
        instead: instead.join(" "),
    })
}

const CLEAN_LONG: &[&str] = &[
    "dry-run",
    "no-dry-run",
    "exclude",
    "force",
    "no-force",
    "interactive",
    "quiet",
];
const STASH_LONG: &[&str] = &[
    "all",
    "no-all",
    "include-untracked",
    "keep-index",
    "no-keep-index",
    "patch",
    "staged",
    "quiet",
    "message",
    "pathspec-from-file",
    "pathspec-file-nul",
];

/// A git verb's words read as git's option parser reads them: short
/// option clusters (`-fdx`), a value attached or in the next word (`-e
/// PAT`, `-ePAT`, `--exclude=PAT`), long options by any unambiguous
/// prefix (`--al`), `--no-` undoing, and pathspecs after `--` or among
/// the options.
struct GitArgs {
    shorts: String,
    longs: Vec<&'static str>,
    /// The values of the options that take one (`-e`, `-m`).
    values: Vec<String>,
    /// The words, pathspecs left out, as the suggestion repeats them.
    options: Vec<String>,
    pathspecs: Vec<String>,
}

impl GitArgs {
    /// `valued`: the short options that take a value; `words_are_message`:
    /// the words that are no option are a message (`stash save MSG`),
    /// not pathspecs.
    fn parse(
        words: &[String],
        longs: &[&'static str],
        valued: &str,
        words_are_message: bool,
    ) -> Self {
        let mut out = GitArgs {
            shorts: String::new(),
            longs: Vec::new(),
            values: Vec::new(),
            options: Vec::new(),
            pathspecs: Vec::new(),
        };
        let mut message = Vec::new();
        let mut it = words.iter();
        let mut after_dashes = false;
        while let Some(w) = it.next() {
            if after_dashes {
                out.pathspecs.push(w.clone());
            } else if w == "--" {
                after_dashes = true;
            } else if let Some(long) = w.strip_prefix("--") {
                out.options.push(w.clone());
                let (name, value) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (long, None),
                };
                let Some(full) = unique_prefix(name, longs) else {
                    continue;
                };
                // `--no-x` undoes `--x` and its short form.
                if let Some(undone) = full.strip_prefix("no-") {
                    out.longs.retain(|l| *l != undone);
                    if undone == "dry-run" {
                        out.shorts.retain(|c| c != 'n');
                    }
                    continue;
                }
                out.longs.push(full);
                if matches!(full, "exclude" | "message" | "pathspec-from-file") {
                    let value = value.or_else(|| {
                        let v = it.next()?.clone();
                        out.options.push(v.clone());
                        Some(v)
                    });
                    out.values.extend(value);
                }
            } else if w.len() > 1 && w.starts_with('-') {
                out.options.push(w.clone());
                for (i, c) in w[1..].char_indices() {
                    out.shorts.push(c);
                    if valued.contains(c) {
                        let rest = &w[1 + i + c.len_utf8()..];
                        let value = if rest.is_empty() {
                            it.next().cloned().inspect(|v| out.options.push(v.clone()))
                        } else {
                            Some(rest.to_string())
                        };
                        out.values.extend(value);
                        break;
                    }
                }
            } else if words_are_message {
                message.push(w.clone());
            } else {
                out.pathspecs.push(w.clone());
            }
        }
        if !message.is_empty() {
            out.options.push("-m".into());
            out.options.push(message.join(" "));
        }
        out
    }

    fn short(&self, c: char) -> bool {
        self.shorts.contains(c)
    }

    fn long(&self, name: &str) -> bool {
        self.longs.contains(&name)
    }

    fn dry_run(&self) -> bool {
        self.short('n') || self.long("dry-run")
    }
}

/// `name` or the one option of `known` it is an unambiguous prefix of,
/// as git takes `--al` for `--all`.
fn unique_prefix(name: &str, known: &[&'static str]) -> Option<&'static str> {
    if let Some(exact) = known.iter().find(|k| **k == name) {
        return Some(exact);
    }
    let mut found = known
        .iter()
        .filter(|k| k.starts_with(name) && !name.is_empty());
    match (found.next(), found.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// Whether a pathspec excludes (`:!p`, `:^p`, `:(exclude)p`).
fn is_exclude(p: &str) -> bool {
    p.starts_with(":!")
        || p.starts_with(":^")
        || p.strip_prefix(":(")
            .and_then(|m| m.split_once(')'))
            .is_some_and(|(magic, _)| magic.split(',').any(|m| m == "exclude"))
}

/// A pathspec's path, without its magic.
fn pathspec_path(p: &str) -> &str {
    if let Some(m) = p.strip_prefix(":(") {
        return m.split_once(')').map_or(p, |(_, rest)| rest);
    }
    p.strip_prefix(":!")
        .or_else(|| p.strip_prefix(":^"))
        .unwrap_or(p)
        .trim_end_matches('/')
}

/// `to` as a path relative to `from` (both absolute and lexical).
fn relative(from: &Path, to: &Path) -> String {
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let up = std::iter::repeat_n("..".to_string(), f.len() - common);
    let down = t[common..]
        .iter()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let rel: Vec<String> = up.chain(down).collect();
    if rel.is_empty() {
        ".".into()
    } else {
        rel.join("/")
    }
}

/// `rsync` with `--delete` (any of its forms) into a destination that
/// holds the history, without a filter that names `.rewind`: it deletes
/// what the source lacks, `.rewind/` included (helper-63).
pub(super) fn rsync_deleting(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let args = &words[1..];
    // (`--delay-updates` deletes nothing, helper-66.)
    let deletes = args
        .iter()
        .any(|a| a == "--del" || a.starts_with("--delete") || a == "--remove-source-files");
    if !deletes {
        return None;
    }
    // The words, option values paired with their options: rsync's long
    // options take `=VALUE` or the next word; these short ones the next.
    const VALUED: &[&str] = &[
        "--exclude",
        "--include",
        "--filter",
        "-f",
        "--exclude-from",
        "--include-from",
        "--files-from",
        "--rsh",
        "-e",
        "--rsync-path",
        "--backup-dir",
        "--suffix",
        "--compare-dest",
        "--copy-dest",
        "--link-dest",
        "--chmod",
        "--chown",
        "--log-file",
        "--partial-dir",
        "--temp-dir",
        "-T",
        "--timeout",
        "--bwlimit",
        "--max-size",
        "--min-size",
        "--port",
        "--password-file",
        "--out-format",
        "--usermap",
        "--groupmap",
        "-B",
        "--block-size",
        "--modify-window",
        "--max-delete",
        "-M",
        "--remote-option",
        "--checksum-choice",
        "--compress-choice",
        "--compress-level",
        "--skip-compress",
        "--info",
        "--debug",
        "--stop-after",
        "--stop-at",
        "--iconv",
        "--sockopts",
        "--address",
        "--protocol",
        "--outbuf",
        "--contimeout",
        "--checksum-seed",
    ];
    let mut filters: Vec<(&str, String)> = Vec::new();
    let mut operands: Vec<&String> = Vec::new();
    let mut dry_run = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with('-') || a == "-" {
            operands.push(a);
            continue;
        }
        // `-n` in a cluster of short options, not in a value (`-f '-
        // node_modules'` read as a dry run, helper-65).
        dry_run |= a == "--dry-run"
            || !a.starts_with("--")
                && a[1..].chars().all(|c| c.is_ascii_alphanumeric())
                && a.contains('n');
        let (name, attached) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            // `-f'- .rewind'`: a short option's value attached.
            None if a.len() > 2 && !a.starts_with("--") && VALUED.contains(&&a[..2]) => {
                (&a[..2], Some(a[2..].to_string()))
            }
            None => (a.as_str(), None),
        };
        dry_run |= name == "--list-only";
        if VALUED.contains(&name) {
            let value = attached.or_else(|| it.next().cloned()).unwrap_or_default();
            filters.push((name, value));
        }
    }
    // The first filter rule whose pattern matches `.rewind` decides, as
    // rsync's do: an include lets `--delete` take it, an exclude or a
    // protect keeps it. A pattern without `/` is matched against the
    // name, one with `/` against the path below the destination
    // (`node_modules/*` took `.rewind` for protected, helper-66);
    // `.rewind/**` keeps what is in it, so the directory stays too.
    let below_dest = |dest: &Path| {
        history
            .strip_prefix(dest)
            .ok()
            .map(|r| r.to_string_lossy().into_owned())
    };
    let dest_path = operands
        .last()
        .and_then(|d| expand_path(d, dir))
        .map(|d| resolve(&d));
    let rel = dest_path
        .as_deref()
        .and_then(below_dest)
        .unwrap_or_else(|| ".rewind".into());
    let names_history = |pattern: &str| {
        let p = pattern
            .trim_end_matches("/***")
            .trim_end_matches("/**")
            .trim_end_matches('/');
        match p.strip_prefix('/') {
            Some(anchored) => fnmatch(anchored, &rel),
            None if p.contains('/') => fnmatch(p, &rel) || fnmatch(&format!("*/{p}"), &rel),
            None => fnmatch(p, ".rewind"),
        }
    };
    let decided = filters.iter().find_map(|(n, v)| {
        let (kind, pattern) = match *n {
            "--exclude" => ("-", v.as_str()),
            "--include" => ("+", v.as_str()),
            "--filter" | "-f" => {
                let (k, pat) = v.split_once([' ', '_'])?;
                let kind = match k {
                    "-" | "exclude" => "-",
                    "+" | "include" => "+",
                    "P" | "protect" => "P",
                    _ => return None,
                };
                (kind, pat.trim())
            }
            _ => return None,
        };
        names_history(pattern).then_some(kind)
    });
    let kept = match decided {
        Some("P") => true,
        Some("-") => !args.iter().any(|a| a == "--delete-excluded"),
        _ => false,
    };
    if dry_run || kept {
        return None;
    }
    let remove_source = args.iter().any(|a| a == "--remove-source-files");
    // `--delete` empties the destination; `--remove-source-files` the
    // sources. Remote paths are not here.
    let (dest, sources) = operands.split_last()?;
    let reached: Vec<&String> = if remove_source {
        sources.to_vec()
    } else {
        vec![dest]
    };
    let reaches = reached.iter().filter(|p| !p.contains(':')).any(|p| {
        expand_path(p, dir)
            .map(|p| resolve(&p))
            .is_some_and(|p| history.starts_with(&p) || p.starts_with(history))
    });
    if !reaches {
        return None;
    }
    let runs = shown(words);
    let mut instead: Vec<String> = words.iter().map(|w| word_as_written(w)).collect();
    // Protected from deletion, and not taken from a source that has a
    // `.rewind` of its own (a copy of the workspace put its older
    // ledger in place of this one, helper-64).
    instead.insert(1, shell_word("--filter=P .rewind"));
    instead.insert(2, shell_word("--filter=- .rewind"));
    Some(HistoryLoss::Deletes {
        runs,
        history: history.to_path_buf(),
        instead: instead.join(" "),
    })
}

/// The program a command's words run, without its directory (`/bin/rm`
/// is `rm`); empty for none.
pub(super) fn program(words: &[String]) -> &str {
    words
        .first()
        .map_or("", |w| w.rsplit('/').next().unwrap_or(w))
}

/// [`shown`], with what its output redirections write: `:` alone says
/// nothing.
pub(super) fn shown_with_writes(words: &[String], writes: &[String]) -> String {
    std::iter::once(shown(words))
        .chain(writes.iter().map(|w| format!("> {}", word_as_written(w))))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A command's words as a refusal shows what runs: an expansion in
/// double quotes, as the agent wrote it (`"$PWD"`, not `'$PWD'`, which
/// names another path).
pub(super) fn shown(words: &[String]) -> String {
    words
        .iter()
        .map(|w| word_as_written(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A command's words as one line, each quoted as a shell needs it.
pub(super) fn joined(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}
