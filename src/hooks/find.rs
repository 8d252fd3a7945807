//! `find` with a deleting action, judged against a workspace's history:
//! its expression is evaluated on the paths `.rewind/` holds, as `find`
//! would visit them, in three-valued logic (a test that depends on what
//! is on disk, such as `-size` or `-newer`, may be true). `find . -name
//! '*.db' -delete` took the ledger, and `find . -size +100k -delete` its
//! WAL, the only copy of the history not yet folded (helper-63, D300);
//! `find . -name '*.pyc' -delete` passes.

use std::path::{Path, PathBuf};

use super::Resolve;
use super::history::{HISTORY_PATHS, HistoryLoss, expand_path, fnmatch, shown, word_as_written};
use crate::names::shell_word;

/// Three-valued truth, ordered: `and` is the least, `or` the greatest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tri {
    No,
    Maybe,
    Yes,
}

impl Tri {
    fn not(self) -> Tri {
        match self {
            Tri::No => Tri::Yes,
            Tri::Maybe => Tri::Maybe,
            Tri::Yes => Tri::No,
        }
    }
}

/// A node of a `find` expression.
enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    /// `a , b`: both run, the value is `b`'s.
    Comma(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Name {
        pattern: String,
        fold: bool,
    },
    Path {
        pattern: String,
        fold: bool,
    },
    Type(String),
    /// `-delete`, or an `-exec` of a command that deletes (`rm`);
    /// `tree`: it takes a directory with what is in it (`rm -r`, `mv`).
    Deletes {
        tree: bool,
    },
    Prune,
    Constant(Tri),
}

/// What evaluating an expression on one path gives: its value, whether a
/// deleting action ran, whether `-prune` did.
#[derive(Clone, Copy)]
struct Outcome {
    value: Tri,
    deletes: Tri,
    /// Whether an action that takes a directory whole ran.
    takes_tree: Tri,
    prunes: Tri,
}

impl Expr {
    fn eval(&self, path: &Visited) -> Outcome {
        let leaf = |value| Outcome {
            value,
            deletes: Tri::No,
            takes_tree: Tri::No,
            prunes: Tri::No,
        };
        match self {
            // `b` runs only as far as `a` may be true (for `or`, false).
            Expr::And(a, b) | Expr::Or(a, b) => {
                let a_out = a.eval(path);
                let gate = match self {
                    Expr::And(..) => a_out.value,
                    _ => a_out.value.not(),
                };
                if gate == Tri::No {
                    return a_out;
                }
                let b_out = b.eval(path);
                Outcome {
                    value: match self {
                        Expr::And(..) => a_out.value.min(b_out.value),
                        _ => a_out.value.max(b_out.value),
                    },
                    deletes: a_out.deletes.max(b_out.deletes.min(gate)),
                    takes_tree: a_out.takes_tree.max(b_out.takes_tree.min(gate)),
                    prunes: a_out.prunes.max(b_out.prunes.min(gate)),
                }
            }
            Expr::Comma(a, b) => {
                let (a, b) = (a.eval(path), b.eval(path));
                Outcome {
                    value: b.value,
                    deletes: a.deletes.max(b.deletes),
                    takes_tree: a.takes_tree.max(b.takes_tree),
                    prunes: a.prunes.max(b.prunes),
                }
            }
            Expr::Not(a) => {
                let out = a.eval(path);
                Outcome {
                    value: out.value.not(),
                    ..out
                }
            }
            Expr::Name { pattern, fold } => leaf(matches(pattern, &path.name, *fold)),
            Expr::Path { pattern, fold } => leaf(matches(pattern, &path.shown, *fold)),
            Expr::Type(types) => leaf(
                if types
                    .split(',')
                    .any(|t| t == if path.is_dir { "d" } else { "f" })
                {
                    Tri::Yes
                } else {
                    Tri::No
                },
            ),
            Expr::Deletes { tree } => Outcome {
                value: Tri::Maybe,
                deletes: Tri::Yes,
                takes_tree: if *tree { Tri::Yes } else { Tri::No },
                prunes: Tri::No,
            },
            Expr::Prune => Outcome {
                value: Tri::Yes,
                deletes: Tri::No,
                takes_tree: Tri::No,
                prunes: Tri::Yes,
            },
            Expr::Constant(t) => leaf(*t),
        }
    }

    fn holds(&self, found: &dyn Fn(&Expr) -> bool) -> bool {
        found(self)
            || match self {
                Expr::And(a, b) | Expr::Or(a, b) | Expr::Comma(a, b) => {
                    a.holds(found) || b.holds(found)
                }
                Expr::Not(a) => a.holds(found),
                _ => false,
            }
    }
}

fn matches(pattern: &str, text: &str, fold: bool) -> Tri {
    let hit = if fold {
        fnmatch(&pattern.to_lowercase(), &text.to_lowercase())
    } else {
        fnmatch(pattern, text)
    };
    if hit { Tri::Yes } else { Tri::No }
}

/// One path of the history as `find` visits it.
struct Visited {
    /// As `find` prints it (what `-path` matches).
    shown: String,
    name: String,
    is_dir: bool,
}

/// Options before the start points, and how many words each takes.
fn leading_option(word: &str) -> Option<usize> {
    match word {
        "-H" | "-L" | "-P" => Some(1),
        "-D" => Some(2),
        w if w.starts_with("-O") => Some(1),
        _ => None,
    }
}

/// Primaries that take one argument and only test (their value depends
/// on what is on disk: taken as maybe true), or are global options.
const TAKES_ONE: &[&str] = &[
    "-mtime",
    "-mmin",
    "-atime",
    "-amin",
    "-ctime",
    "-cmin",
    "-newer",
    "-anewer",
    "-cnewer",
    "-user",
    "-group",
    "-uid",
    "-gid",
    "-perm",
    "-links",
    "-inum",
    "-samefile",
    "-used",
    "-fstype",
    "-regex",
    "-iregex",
    "-context",
    "-regextype",
    "-printf",
    "-fprint",
    "-fprint0",
    "-fls",
    "-maxdepth",
    "-mindepth",
];

/// Commands an `-exec` deletes with.
const DELETERS: &[&str] = &["rm", "unlink", "shred", "truncate"];

/// The program a simple command runs, by its name: `\rm` and
/// `/bin/rm` are `rm`.
fn program_of(cmd: &str) -> String {
    let words = super::shell::command_words(cmd);
    let first = words.first().map(String::as_str).unwrap_or_default();
    let first = first.trim_start_matches('\\');
    first.rsplit('/').next().unwrap_or(first).to_string()
}

struct Parser<'a> {
    words: &'a [String],
    at: usize,
    max_depth: Option<usize>,
    min_depth: usize,
    depth_first: bool,
    /// Parentheses open: past [`MAX_PARENS`] the rest is taken to
    /// delete (50,000 of them overflowed the stack, helper-66).
    parens: usize,
}

const MAX_PARENS: usize = 64;

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.words.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Option<&str> {
        self.at += 1;
        self.words.get(self.at - 1).map(String::as_str)
    }

    fn comma(&mut self) -> Expr {
        let mut left = self.or();
        while self.peek() == Some(",") {
            self.at += 1;
            left = Expr::Comma(Box::new(left), Box::new(self.or()));
        }
        left
    }

    fn or(&mut self) -> Expr {
        let mut left = self.and();
        while matches!(self.peek(), Some("-o" | "-or")) {
            self.at += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()));
        }
        left
    }

    fn and(&mut self) -> Expr {
        let mut left = self.unary();
        loop {
            match self.peek() {
                None | Some(")" | "-o" | "-or" | ",") => return left,
                Some("-a" | "-and") => self.at += 1,
                Some(_) => {}
            }
            left = Expr::And(Box::new(left), Box::new(self.unary()));
        }
    }

    fn unary(&mut self) -> Expr {
        match self.peek() {
            Some("!" | "-not" | "(") if self.parens >= MAX_PARENS => {
                self.at = self.words.len();
                Expr::Deletes { tree: true }
            }
            Some("!" | "-not") => {
                self.at += 1;
                self.parens += 1;
                let inner = self.unary();
                self.parens -= 1;
                Expr::Not(Box::new(inner))
            }
            Some("(") if self.parens >= MAX_PARENS => {
                self.at = self.words.len();
                Expr::Deletes { tree: true }
            }
            Some("(") => {
                self.at += 1;
                self.parens += 1;
                let inner = self.comma();
                self.parens -= 1;
                if self.peek() == Some(")") {
                    self.at += 1;
                }
                inner
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Expr {
        let Some(word) = self.next().map(str::to_string) else {
            return Expr::Constant(Tri::Yes);
        };
        let mut argument = || self.next().unwrap_or_default().to_string();
        match word.as_str() {
            "-name" | "-iname" => Expr::Name {
                fold: word == "-iname",
                pattern: argument(),
            },
            "-path" | "-ipath" | "-wholename" | "-iwholename" => Expr::Path {
                fold: word.starts_with("-i"),
                pattern: argument(),
            },
            "-type" | "-xtype" => Expr::Type(argument()),
            "-delete" => {
                self.depth_first = true;
                Expr::Deletes { tree: false }
            }
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let mut command = Vec::new();
                while let Some(w) = self.next() {
                    if w == ";" || (w == "+" && command.last().is_some_and(|l| l == "{}")) {
                        break;
                    }
                    command.push(w.to_string());
                }
                // The program past wrappers, their options and operands,
                // and assignments, read as the hook reads any command
                // (`env X=1 rm`, `timeout 5 rm`, `nice -n 5 rm`, `\rm`).
                let line: Vec<String> = command.iter().map(|w| shell_word(w)).collect();
                let (stripped, _) = super::shell::strip_prefixes(&line.join(" "));
                let program = program_of(&stripped);
                let recursive = command.iter().any(|c| {
                    c == "--recursive"
                        || c.starts_with('-') && !c.starts_with("--") && c.contains(['r', 'R'])
                });
                let in_place =
                    super::history::rewrites_in_place(&super::shell::command_words(&stripped));
                match program.as_str() {
                    "mv" => Expr::Deletes { tree: true },
                    // `-exec sed -i … {} +` rewrites every file it is
                    // given, the history's too (helper-67).
                    _ if in_place => Expr::Deletes { tree: false },
                    p if DELETERS.contains(&p) => Expr::Deletes {
                        tree: p == "rm" && recursive,
                    },
                    // A shell may run anything: taken to delete unless
                    // no command of its script is a deleter (by its
                    // program, not by a substring: `clang-format` holds
                    // "rm", helper-65).
                    "sh" | "bash" | "zsh" | "dash" | "ksh" => {
                        let deletes = super::shell::shell_string(&stripped).is_none_or(|script| {
                            super::shell::runnable_commands(&script).iter().any(|c| {
                                let program = program_of(c);
                                DELETERS.contains(&program.as_str())
                                    || matches!(
                                        program.as_str(),
                                        "mv" | "find" | "xargs" | "eval" | "sh" | "bash"
                                    )
                            })
                        });
                        if deletes {
                            Expr::Deletes { tree: true }
                        } else {
                            Expr::Constant(Tri::Maybe)
                        }
                    }
                    _ => Expr::Constant(Tri::Maybe),
                }
            }
            "-prune" => Expr::Prune,
            "-false" => Expr::Constant(Tri::No),
            "-depth" | "-d" => {
                self.depth_first = true;
                Expr::Constant(Tri::Yes)
            }
            "-maxdepth" | "-mindepth" => {
                let n = argument().parse().ok();
                if word == "-maxdepth" {
                    self.max_depth = n;
                } else {
                    self.min_depth = n.unwrap_or(0);
                }
                Expr::Constant(Tri::Yes)
            }
            "-fprintf" => {
                argument();
                argument();
                Expr::Constant(Tri::Yes)
            }
            // Nothing of the history, nor a directory holding it, is
            // empty: `find . -type d -empty -delete` takes none of it.
            // Nor is any of it a symbolic link.
            "-empty" => Expr::Constant(Tri::No),
            "-lname" | "-ilname" => {
                argument();
                Expr::Constant(Tri::No)
            }
            // Nor smaller than a byte.
            "-size" => {
                let size = argument();
                if size.starts_with('-')
                    || size.trim_end_matches(['c', 'k', 'M', 'G', 'b', 'w']) == "0"
                {
                    Expr::Constant(Tri::No)
                } else {
                    Expr::Constant(Tri::Maybe)
                }
            }
            "-readable" | "-writable" | "-executable" | "-nouser" | "-nogroup" => {
                Expr::Constant(Tri::Maybe)
            }
            w if TAKES_ONE.contains(&w) || w.starts_with("-newer") => {
                argument();
                Expr::Constant(Tri::Maybe)
            }
            // `-print`, `-xdev`, `-true` and the other options: true.
            _ => Expr::Constant(Tri::Yes),
        }
    }
}

/// [`super::ToolCall::deletes_the_history`] for one `find` command
/// (`words`, `find` first) run in `dir`.
/// Whether a `find` lists a file of the history (to feed `xargs sed -i`,
/// helper-67): its listing actions read as deleting ones, or, with no
/// action, its whole expression followed by one.
pub(super) fn lists(words: &[String], dir: &Path, history: &Path, resolve: Resolve) -> bool {
    const LISTS: &[(&str, usize)] = &[
        ("-print", 0),
        ("-print0", 0),
        ("-ls", 0),
        ("-printf", 1),
        ("-fprint", 1),
        ("-fprint0", 1),
        ("-fls", 1),
        ("-fprintf", 2),
    ];
    const ACTS: &[&str] = &["-exec", "-execdir", "-ok", "-okdir", "-delete", "-quit"];
    let has_action = words
        .iter()
        .any(|w| LISTS.iter().any(|(a, _)| a == w) || ACTS.contains(&w.as_str()));
    let mut as_deleting: Vec<String> = Vec::with_capacity(words.len() + 3);
    if has_action {
        let mut it = words.iter();
        while let Some(w) = it.next() {
            match LISTS.iter().find(|(a, _)| a == w) {
                Some((_, takes)) => {
                    for _ in 0..*takes {
                        it.next();
                    }
                    as_deleting.push("-delete".into());
                }
                None => as_deleting.push(w.clone()),
            }
        }
    } else {
        // `find . -type f` is `find . ( -type f ) -print`.
        let (_, at) = start_points(words);
        as_deleting.extend(words[..at].iter().cloned());
        if at < words.len() {
            as_deleting.push("(".into());
            as_deleting.extend(words[at..].iter().cloned());
            as_deleting.push(")".into());
        }
        as_deleting.push("-delete".into());
    }
    deleting(&as_deleting, dir, history, resolve).is_some()
}

/// Where a `find`'s start points begin (past its leading options) and
/// where its expression begins, in its words.
fn start_points(words: &[String]) -> (usize, usize) {
    let mut at = 1;
    while let Some(skip) = words.get(at).and_then(|w| leading_option(w)) {
        at += skip;
    }
    let starts_at = at;
    while words
        .get(at)
        .is_some_and(|w| !(w.len() > 1 && w.starts_with('-') || w == "(" || w == "!" || w == ","))
    {
        at += 1;
    }
    (starts_at, at)
}

pub(super) fn deleting(
    words: &[String],
    dir: &Path,
    history: &Path,
    resolve: Resolve,
) -> Option<HistoryLoss> {
    let (starts_at, at) = start_points(words);
    let explicit: Vec<&String> = words[starts_at..at].iter().collect();
    let dot = ".".to_string();
    let starts = if explicit.is_empty() {
        vec![&dot]
    } else {
        explicit
    };
    // A line too long to read term by term (each term is a level of the
    // tree that is evaluated): judged unclear, not crashed on.
    if words.len() > 2_000 {
        return Some(HistoryLoss::Unclear {
            runs: "this find".into(),
            history: history.to_path_buf(),
        });
    }
    let mut parser = Parser {
        words: &words[at..],
        at: 0,
        max_depth: None,
        min_depth: 0,
        depth_first: false,
        parens: 0,
    };
    let expr = parser.comma();
    if !expr.holds(&|e| matches!(e, Expr::Deletes { .. })) {
        return None;
    }
    // `-delete` turns on `-depth`, under which `-prune` does nothing:
    // find refuses to run such a line, unless `-depth` is explicit.
    let explicit_depth = words[at..].iter().any(|w| w == "-depth" || w == "-d");
    let has_delete = words[at..].iter().any(|w| w == "-delete");
    if has_delete && !explicit_depth && expr.holds(&|e| matches!(e, Expr::Prune)) {
        return None;
    }
    let mut found = None;
    for start in &starts {
        let Some(from) = expand_path(start, dir).map(|p| resolve(&p)) else {
            continue;
        };
        let shown_start = match start.trim_end_matches('/') {
            "" => "/",
            s => s,
        };
        found = visit(&expr, &parser, &from, shown_start, history).map(|d| (d, from));
        if found.is_some() {
            break;
        }
    }
    let (deleted, from) = found?;
    let runs = shown(words);
    let history = history.to_path_buf();
    // A find started in the history deletes it by name: no form keeps it.
    if from.starts_with(&history) {
        return Some(HistoryLoss::Removed { runs, history });
    }
    match deleted {
        Deleted::Workspace(target) => {
            return Some(HistoryLoss::RemovedWithWorkspace {
                runs,
                history,
                target,
            });
        }
        Deleted::InHistory => {}
    }
    // The same line with every path of a `.rewind` left out, after the
    // global options (find warns about one placed after a test).
    let words_after = &words[at..];
    let mut options_end = 0;
    while let Some(w) = words_after.get(options_end) {
        options_end += match w.as_str() {
            "-maxdepth" | "-mindepth" | "-regextype" => 2,
            "-depth"
            | "-d"
            | "-xdev"
            | "-mount"
            | "-follow"
            | "-noleaf"
            | "-daystart"
            | "-ignore_readdir_race" => 1,
            _ => break,
        };
    }
    let options_end = (at + options_end).min(words.len());
    let quoted = |ws: &[String]| ws.iter().map(|w| word_as_written(w)).collect::<Vec<_>>();
    let mut instead = quoted(&words[..options_end]);
    instead.extend(
        [
            "!",
            "-path",
            "'*/.rewind'",
            "!",
            "-path",
            "'*/.rewind/*'",
            "\\(",
        ]
        .map(String::from),
    );
    instead.extend(quoted(&words[options_end..]));
    instead.push("\\)".into());
    Some(HistoryLoss::Deletes {
        runs,
        history,
        instead: instead.join(" "),
    })
}

/// What a `find` would delete of a history.
enum Deleted {
    /// Paths inside it.
    InHistory,
    /// A directory holding it (an `-exec rm -rf {} +` of the workspace).
    Workspace(PathBuf),
}

/// What `find` from `from` (shown as `shown_start`) would delete of the
/// history, visiting as it would: the directories on the way down to it,
/// then its paths, within the depth limits, below a directory only if
/// `-prune` did not stop it there.
fn visit(
    expr: &Expr,
    limits: &Parser,
    from: &Path,
    shown_start: &str,
    history: &Path,
) -> Option<Deleted> {
    if !from.starts_with(history) && !history.starts_with(from) {
        return None;
    }
    let on_the_way = history
        .ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(from))
        .map(|a| (a.to_path_buf(), true, false));
    let mut paths: Vec<(PathBuf, bool, bool)> = on_the_way.collect();
    paths.reverse();
    paths.extend(HISTORY_PATHS.iter().map(|(rel, is_dir)| {
        let full = if rel.is_empty() {
            history.to_path_buf()
        } else {
            history.join(rel)
        };
        (full, *is_dir, true)
    }));
    let mut pruned: Vec<PathBuf> = Vec::new();
    for (full, is_dir, in_history) in paths {
        let Ok(below) = full.strip_prefix(from) else {
            continue;
        };
        if pruned.iter().any(|p| full.starts_with(p) && full != *p) {
            continue;
        }
        let depth = below.components().count();
        let below = below.to_string_lossy();
        let shown = match (below.is_empty(), shown_start) {
            (true, s) => s.to_string(),
            (false, "/") => format!("/{below}"),
            (false, s) => format!("{s}/{below}"),
        };
        let visited = limits.max_depth.is_none_or(|m| depth <= m) && depth >= limits.min_depth;
        if !visited {
            continue;
        }
        let name = full
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into());
        let out = expr.eval(&Visited {
            shown,
            name,
            is_dir,
        });
        // A directory goes only with what is in it: `-delete` and `rm`
        // without `-r` leave one that is not empty (`find . -name .rewind
        // -delete` takes nothing, helper-65).
        let takes = if is_dir { out.takes_tree } else { out.deletes };
        if in_history && takes >= Tri::Maybe {
            return Some(Deleted::InHistory);
        }
        if !in_history && out.takes_tree >= Tri::Maybe {
            return Some(Deleted::Workspace(full));
        }
        if !limits.depth_first && out.prunes == Tri::Yes {
            pruned.push(full);
        }
    }
    None
}
