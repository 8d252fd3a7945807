//! Reading a shell line as the hooks need it: its simple commands, their
//! words, wrappers and redirections, and its here-documents. Not a shell
//! parser; enough to find `git push` or an `rm -rf .rewind` wherever a
//! line puts it (D129, D153). [`super::ShellLine`] gives the words their
//! meaning (directories, variables, what they reach).

use super::history;

/// A shell line without the text of its here-documents, unless a shell
/// reads them (`bash <<EOF`): a commit message or a README written through
/// `cat <<'EOF'` that mentions `rewind effects resolve` read as running it
/// (helper-56). Only for the hooks' own refusals (D286, D296): an effect
/// rule matches more, not less (D129).
fn without_heredoc_text(line: &str) -> String {
    let mut out = String::new();
    let mut lines = line.split('\n');
    while let Some(l) = lines.next() {
        out.push_str(l);
        out.push('\n');
        let Some(at) = heredoc_at(l) else {
            continue;
        };
        let spec = l[at + 2..].trim_start();
        let (strip_tabs, spec) = match spec.strip_prefix('-') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, spec),
        };
        let delimiter: String = spec
            .chars()
            .filter(|c| !matches!(c, '\'' | '"' | '\\'))
            .take_while(|c| !c.is_whitespace() && !";|&)<>".contains(*c))
            .collect();
        let reader = simple_commands(&l[..at]).pop().unwrap_or_default();
        let reader = words(&reader)
            .first()
            .map(|(_, w)| w.clone())
            .unwrap_or_default();
        let shell = ["sh", "bash", "zsh", "dash", "ksh", "eval", "source", "."]
            .contains(&reader.rsplit('/').next().unwrap_or_default());
        if delimiter.is_empty() || shell {
            continue;
        }
        for body in lines.by_ref() {
            // (`<<-` strips tabs; the line reached here with its blanks
            // squeezed to spaces, helper-66.)
            let end = if strip_tabs {
                body.trim_start_matches([' ', '\t'])
            } else {
                body
            };
            if end == delimiter {
                out.push_str(body);
                out.push('\n');
                break;
            }
        }
    }
    out
}

/// Where a line's here-document operator `<<` is: outside quotes and
/// arithmetic (`echo "x <<END"` and `$((1<<2))` start none, and took the
/// lines after them for text, an `rm -rf .rewind` among them, helper-65),
/// and not a here-string `<<<`.
fn heredoc_at(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut quote: Option<u8> = None;
    let mut arithmetic = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(b'"') if b == b'\\' => i += 1,
            Some(_) => {}
            None => match b {
                b'\\' => i += 1,
                b'\'' | b'"' => quote = Some(b),
                // A comment: nothing after it opens a here-document.
                b'#' if i == 0 || bytes[i - 1].is_ascii_whitespace() => return None,
                // `$[1<<2]`, the old arithmetic.
                b'$' if bytes.get(i + 1) == Some(&b'[') => {
                    arithmetic += 1;
                    i += 1;
                }
                b']' if arithmetic > 0 => arithmetic -= 1,
                b'(' if bytes.get(i + 1) == Some(&b'(') => {
                    arithmetic += 1;
                    i += 1;
                }
                b')' if arithmetic > 0 && bytes.get(i + 1) == Some(&b')') => {
                    arithmetic -= 1;
                    i += 1;
                }
                b'<' if arithmetic == 0 && bytes.get(i + 1) == Some(&b'<') => {
                    if bytes.get(i + 2) == Some(&b'<') {
                        i += 3;
                        continue;
                    }
                    return Some(i);
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

/// The simple commands of a shell line, each without its leading variable
/// assignments, shell keywords (`then`, `do`, `!`, ...) and wrappers
/// with their options (`sudo -u deploy`, `env -u X`, `timeout 60`, `nice
/// -n 5`, ...; see [`WRAPPERS`]), and the commands of a `sh -c STRING`:
/// split at `&&`, `||`, `;`, `|`, `&`, newlines and subshell parentheses
/// or braces outside quotes. Not a shell parser; enough to find `git
/// push` wherever a line puts it (D129, D153).
pub(super) fn simple_commands(line: &str) -> Vec<String> {
    without_markers(commands_in(line, false, 0))
}

/// Commands without [`ASSIGNS`]' entries and the scope markers.
fn without_markers(commands: Vec<String>) -> Vec<String> {
    commands
        .into_iter()
        .filter(|c| !c.starts_with(ASSIGNS) && !is_marker(c))
        .collect()
}

/// Whether a command (or its first word) is one of [`commands_in`]'s
/// markers, not a command.
pub(super) fn is_marker(first: &str) -> bool {
    first == ASSIGNS || first == SCOPE_OPEN || first == SCOPE_CLOSE
}

/// How deep `$(…)` and `sh -c` are read. Past it the line is one the
/// hook cannot judge: `$(` nested 100,000 deep took the hook to 24 GB,
/// and 10,000 deep crashed it, which let its call through (helper-66).
const MAX_NESTING: usize = 16;

/// What [`simple_commands`] gives in place of what lies past
/// [`MAX_NESTING`]: no command, and a sign for the hook's own refusals.
pub(super) const TOO_DEEP: &str = "\u{0}too-deep";

/// [`simple_commands`] without the text of here-documents, in the line
/// and in each shell string it runs (`bash -lc '…'`, Codex's argv, whose
/// here-document text read as commands, helper-65).
pub(super) fn runnable_commands(line: &str) -> Vec<String> {
    without_markers(runnable_commands_and_assignments(line))
}

/// [`runnable_commands`] with the variable assignments among them (see
/// [`ASSIGNS`]) and where each subshell starts and ends (see
/// [`SCOPE_OPEN`]).
pub(super) fn runnable_commands_and_assignments(line: &str) -> Vec<String> {
    commands_in(&without_heredoc_text(line), true, 0)
}

fn commands_in(line: &str, runnable: bool, depth: usize) -> Vec<String> {
    let nested = |text: &str| {
        if depth >= MAX_NESTING {
            vec![TOO_DEEP.to_string()]
        } else if runnable {
            commands_in(&without_heredoc_text(text), true, depth + 1)
        } else {
            commands_in(text, false, depth + 1)
        }
    };
    // A backslash-newline joins two lines into one (`git \⏎ push`).
    let line = &line.replace("\\\n", "");
    // Each piece of the line, and the command substitutions (`$(…)`,
    // `` `…` ``) found in it, which run before it.
    let mut parts: Vec<(String, Vec<String>)> = Vec::new();
    let mut cur = String::new();
    let mut inner: Vec<String> = Vec::new();
    let mut quote: Option<char> = None;
    // The subshells and `case`s open where the reader is.
    let mut open: Vec<Opened> = Vec::new();
    // Where the current list of `&&`/`||`/`|` began, and whether the
    // piece being read comes after a `|`.
    let mut list_start = 0usize;
    let mut piped = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                cur.push(c);
            }
            // A backslash escapes the next character, except inside
            // single quotes.
            (None | Some('"'), '\\') => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            // `${PWD}` is one word, not a group.
            (None | Some('"'), '$') if chars.peek() == Some(&'{') => {
                cur.push(c);
                for n in chars.by_ref() {
                    cur.push(n);
                    if n == '}' {
                        break;
                    }
                }
            }
            // `$(…)` and `` `…` `` stay in their word (`rm -rf
            // $(pwd)/.rewind` is one operand), and their commands are
            // read too (helper-64, D300).
            (None | Some('"'), '$') if chars.peek() == Some(&'(') => {
                chars.next();
                let sub = substitution(&mut chars);
                cur.push_str(&format!("$({sub})"));
                inner.push(sub);
            }
            (None | Some('"'), '`') => {
                let sub: String = chars.by_ref().take_while(|n| *n != '`').collect();
                cur.push_str(&format!("`{sub}`"));
                inner.push(sub);
            }
            (Some(_), c) => cur.push(c),
            // A comment runs to the end of its line: its `don't` opened a
            // quote that hid every later line, a repeated push included,
            // and its `;` split it into commands (helper-65, D301).
            (None, '#') if cur.is_empty() || cur.ends_with(char::is_whitespace) => {
                while chars.next_if(|n| *n != '\n').is_some() {}
            }
            (None, '\'' | '"') => {
                quote = Some(c);
                cur.push(c);
            }
            // `2>&1`, `&>log`, `<&3`, `>|f` are redirections, not a
            // background `&` or a pipe: split there, `git push 2>&1`
            // read as `git push 2>` and a second push went through
            // (helper-63, D301).
            (None, '&') if cur.ends_with(['>', '<']) || chars.peek() == Some(&'>') => cur.push(c),
            (None, '|') if cur.ends_with('>') => cur.push(c),
            // A brace is a group only as a word of its own: `find -exec
            // rm {} +` and `rm -rf ./{a,b}` keep theirs (helper-64).
            (None, '{' | '}') if !is_group_brace(c, &cur, chars.peek().copied()) => cur.push(c),
            (None, ';' | '&' | '|' | '\n' | '(' | ')' | '{' | '}') => {
                let part = std::mem::take(&mut cur);
                match first_command_word(&part).as_deref() {
                    Some("case") => open.push(Opened::Case),
                    Some("esac") if open.last() == Some(&Opened::Case) => {
                        open.pop();
                    }
                    _ => {}
                }
                // `&&` and `||` go on with the list; a single `|` makes the
                // pieces on both sides subshells, a single `&` the whole
                // list before it (helper-71: `cd src &` moved no command
                // after it, and `cd src & git clean -fdx` was judged in
                // `src`).
                let double = matches!(c, '&' | '|') && chars.peek() == Some(&c);
                if double {
                    chars.next();
                }
                let pipe = c == '|' && !double;
                push_piece(
                    &mut parts,
                    (part, std::mem::take(&mut inner)),
                    pipe || piped,
                );
                piped = pipe;
                if c == '&' && !double {
                    parts.insert(list_start.min(parts.len()), (SCOPE_OPEN.into(), Vec::new()));
                    parts.push((SCOPE_CLOSE.into(), Vec::new()));
                }
                match (c, open.last()) {
                    ('(', _) => {
                        open.push(Opened::Subshell);
                        parts.push((SCOPE_OPEN.into(), Vec::new()));
                    }
                    // `a)` in a `case`: a pattern, not a subshell's end
                    // (helper-71: `(cd .. && case 1 in 1) git clean -fdx;;
                    // esac)` ran the clean where the line started).
                    (')', Some(Opened::Case)) => {}
                    (')', _) => {
                        open.pop();
                        parts.push((SCOPE_CLOSE.into(), Vec::new()));
                    }
                    _ => {}
                }
                if !double && !pipe {
                    list_start = parts.len();
                }
            }
            (None, c) => cur.push(c),
        }
    }
    // The last piece of a pipeline is a subshell too.
    push_piece(&mut parts, (cur, inner), piped);
    let mut out = Vec::new();
    // What runs in a subshell of its own: a `cd` or an assignment in it
    // does not reach the commands after it.
    let scoped = |out: &mut Vec<String>, commands: Vec<String>| {
        out.push(SCOPE_OPEN.to_string());
        out.extend(commands);
        out.push(SCOPE_CLOSE.to_string());
    };
    for (p, substitutions) in &parts {
        if is_marker(p) {
            out.push(p.clone());
            continue;
        }
        for sub in substitutions {
            scoped(&mut out, nested(sub));
        }
        let squeezed = squeeze_blanks(p);
        let (cmd, chdir) = strip_prefixes(squeezed.trim());
        // `bash -c 'git push'`: the commands of the string too.
        if let Some(inner) = shell_string(&cmd) {
            scoped(&mut out, nested(&inner));
        }
        if let Some(dir) = chdir.filter(|_| !cmd.is_empty()) {
            // `env -C DIR cmd`: cmd alone runs in DIR.
            scoped(&mut out, vec![format!("cd {}", single_quoted(&dir)), cmd]);
        } else if !cmd.is_empty() {
            out.push(cmd);
        } else if words(squeezed.trim())
            .first()
            .is_some_and(|(_, w)| is_assignment(w))
        {
            // `D=.rewind` alone sets a shell variable a later command
            // may name (D311).
            out.push(format!("{ASSIGNS} {}", squeezed.trim()));
        }
    }
    out
}

/// Add a piece of a line (its text and its command substitutions) to
/// `parts`, between scope markers when it runs in a subshell of its own.
fn push_piece(parts: &mut Vec<(String, Vec<String>)>, piece: (String, Vec<String>), own: bool) {
    if own {
        parts.push((SCOPE_OPEN.into(), Vec::new()));
        parts.push(piece);
        parts.push((SCOPE_CLOSE.into(), Vec::new()));
    } else {
        parts.push(piece);
    }
}

/// What a `(` or a `case` opened, for the `)` that follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opened {
    Subshell,
    Case,
}

/// The first word of a piece of a line that is no keyword (`then case x
/// in` starts a `case`).
fn first_command_word(part: &str) -> Option<String> {
    words(part)
        .into_iter()
        .map(|(_, w)| w)
        .find(|w| !KEYWORDS.contains(&w.as_str()))
}

/// The text of a `$( … )` whose `$(` was just read, up to its own `)`:
/// not one inside quotes (`$(echo ')')`), a nested `( … )`, or a `case`
/// pattern (`$(case a in a) …;; esac)`), each of which ended it early
/// and hid the rest of the line (helper-71).
pub(super) fn substitution(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut sub = String::new();
    let mut depth = 1usize;
    let mut cases = 0usize;
    let mut quote: Option<char> = None;
    let mut word = String::new();
    while let Some(n) = chars.next() {
        match (quote, n) {
            (Some(q), n) if n == q => quote = None,
            (None | Some('"'), '\\') => {
                sub.push(n);
                if let Some(e) = chars.next() {
                    sub.push(e);
                }
                continue;
            }
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(n),
            (None, n) if n.is_alphanumeric() || n == '_' => {
                word.push(n);
                sub.push(n);
                continue;
            }
            (None, n) => {
                match std::mem::take(&mut word).as_str() {
                    "case" => cases += 1,
                    "esac" => cases = cases.saturating_sub(1),
                    _ => {}
                }
                match n {
                    '(' => depth += 1,
                    ')' if cases > 0 => {}
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            return sub;
                        }
                    }
                    _ => {}
                }
            }
        }
        word.clear();
        sub.push(n);
    }
    sub
}

/// What [`commands_in`] gives for a command of variable assignments
/// only (`D=.rewind`), before them: no command, and the values the
/// hook's own refusals read later words with.
pub(super) const ASSIGNS: &str = "\u{0}assigns";

/// What [`commands_in`] gives where a subshell starts (`(`, `$(`, `` ` ``,
/// `sh -c`, `env -C DIR`) and [`SCOPE_CLOSE`] where it ends: a `cd` in
/// `(cd sub && make)` moved every command after it into `sub`, and `(cd
/// sub && make); git clean -fdx` went through (D316).
pub(super) const SCOPE_OPEN: &str = "\u{0}(";
pub(super) const SCOPE_CLOSE: &str = "\u{0})";

/// Whether a word is `NAME=value`.
pub(super) fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Whether an unquoted `{` or `}` is the shell's group brace: a word of
/// its own (`{ a; b; }`), not part of one (`{}`, `{a,b}`, `x{1..3}`).
fn is_group_brace(c: char, before: &str, next: Option<char>) -> bool {
    let starts_word = before.is_empty() || before.ends_with(char::is_whitespace);
    match c {
        '{' => starts_word && next.is_none_or(char::is_whitespace),
        _ => starts_word && next.is_none_or(|n| n.is_whitespace() || ";&|)".contains(n)),
    }
}

/// A shell line with each run of blanks (spaces, tabs) outside quotes
/// made one space: the shell splits words at any run, so `git  push`
/// and `git\tpush` are `git push`, which a `Bash(git push*)` rule missed
/// and which recorded as another effect than `git push` (helper-28,
/// D191). Quoted and backslash-escaped blanks are kept.
pub(super) fn squeeze_blanks(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut quote: Option<char> = None;
    // The last character written separates words (an escaped or quoted
    // blank does not: `e\  f` is the words `e ` and `f`).
    let mut separated = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None | Some('"'), '\\') => {
                out.push(c);
                if let Some(n) = chars.next() {
                    out.push(n);
                }
                separated = false;
                continue;
            }
            (None, '\'' | '"') => quote = Some(c),
            (None, ' ' | '\t') => {
                if !separated {
                    out.push(' ');
                    separated = true;
                }
                continue;
            }
            _ => {}
        }
        out.push(c);
        separated = false;
    }
    out
}

/// Commands that run the command after them, with the options that take
/// a separate argument and how many operands come before the command.
/// `timeout 60 git push`, `sudo -u deploy git push` and `env -u GIT_DIR
/// git push` let a push through a `Bash(git push*)` rule twice
/// (helper-19, D153).
const WRAPPERS: &[(&str, &[&str], usize)] = &[
    (
        "env",
        &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"],
        0,
    ),
    (
        "sudo",
        &[
            "-u",
            "-g",
            "-h",
            "-p",
            "-C",
            "-D",
            "-r",
            "-t",
            "-U",
            "-T",
            "--user",
            "--group",
            "--host",
            "--prompt",
            "--chdir",
            "--role",
            "--type",
            "--other-user",
            "--command-timeout",
        ],
        0,
    ),
    ("doas", &["-u", "-C"], 0),
    ("command", &[], 0),
    ("builtin", &[], 0),
    ("exec", &["-a"], 0),
    ("nohup", &[], 0),
    ("time", &["-f", "-o", "--format", "--output"], 0),
    ("timeout", &["-s", "-k", "--signal", "--kill-after"], 1),
    ("nice", &["-n", "--adjustment"], 0),
    (
        "ionice",
        &["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"],
        0,
    ),
    ("chrt", &[], 1),
    ("taskset", &[], 1),
    (
        "stdbuf",
        &["-i", "-o", "-e", "--input", "--output", "--error"],
        0,
    ),
    ("setsid", &[], 0),
    (
        "xargs",
        &[
            "-I",
            "-i",
            "-L",
            "-n",
            "-P",
            "-s",
            "-d",
            "-E",
            "-a",
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--replace",
        ],
        0,
    ),
    // GNU parallel runs its command on each input line, as xargs does.
    (
        "parallel",
        &[
            "-j",
            "-P",
            "-N",
            "-n",
            "-L",
            "-a",
            "-d",
            "-C",
            "-I",
            "-S",
            "-E",
            "--jobs",
            "--max-procs",
            "--max-args",
            "--max-lines",
            "--arg-file",
            "--delimiter",
            "--colsep",
            "--sshlogin",
            "--joblog",
            "--results",
            "--tmpdir",
            "--timeout",
            "--retries",
            "--halt",
            "--delay",
            "--tagstring",
            "--workdir",
        ],
        0,
    ),
    ("watch", &["-n", "-d", "--interval"], 0),
    ("unbuffer", &[], 0),
    ("caffeinate", &[], 0),
    ("retry", &["-t", "-d", "--times", "--delay"], 0),
];

/// Shell words that may come before a command.
const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "while", "until", "do", "!", "{", "(",
];

/// A simple command without its `VAR=value` assignments, keywords and
/// wrappers; empty when nothing is left. With it, the directory a
/// wrapper runs it in (`env -C DIR`, `sudo -D DIR`), as written.
pub(super) fn strip_prefixes(cmd: &str) -> (String, Option<String>) {
    let words = words(cmd);
    let mut i = 0;
    let mut chdir = None;
    while let Some((_, word)) = words.get(i) {
        if is_assignment(word) || KEYWORDS.contains(&word.as_str()) {
            i += 1;
            continue;
        }
        let name = word.rsplit('/').next().unwrap_or(word);
        let Some(&(wrapper, with_argument, operands)) = WRAPPERS.iter().find(|w| w.0 == name)
        else {
            break;
        };
        let chdir_options: &[&str] = match wrapper {
            "env" => &["-C", "--chdir"],
            "sudo" => &["-D", "--chdir"],
            _ => &[],
        };
        i += 1;
        let mut split = None;
        while let Some((_, o)) = words.get(i) {
            if o == "--" {
                i += 1;
                break;
            }
            if !o.starts_with('-') || o == "-" {
                break;
            }
            i += 1;
            if let Some(dir) = option_value(o, chdir_options, words.get(i).map(|(_, w)| w)) {
                chdir = Some(dir);
            }
            // `env -S 'rm -rf .rewind'` runs the words of its string, then
            // the words after it: both are the command (passed unseen).
            if wrapper == "env"
                && let Some(s) =
                    option_value(o, &["-S", "--split-string"], words.get(i).map(|(_, w)| w))
            {
                split = Some(s);
            }
            // `-u deploy`, not `-udeploy` or `--user=deploy`.
            if with_argument.contains(&o.as_str()) {
                i += 1;
            }
        }
        if let Some(split) = split {
            let rest = words.get(i).map_or("", |(at, _)| &cmd[*at..]);
            let (inner, inner_chdir) = strip_prefixes(&format!("{split} {rest}"));
            return (inner, inner_chdir.or(chdir));
        }
        i += operands;
    }
    match words.get(i) {
        Some((at, _)) => (cmd[*at..].to_string(), chdir),
        None => (String::new(), chdir),
    }
}

/// The value option `o` gives, if it is one of `options`: `-C DIR`,
/// `-CDIR`, `--chdir=DIR`, `--chdir DIR` (`next`: the word after `o`).
/// A wrapper's directory (`env -C`, `sudo -D`), `env -S`'s string.
fn option_value(o: &str, options: &[&str], next: Option<&String>) -> Option<String> {
    options.iter().find_map(|opt| {
        if o == *opt {
            return next.cloned();
        }
        let rest = o.strip_prefix(opt)?;
        match opt.starts_with("--") {
            true => rest.strip_prefix('=').map(str::to_string),
            false => (!rest.is_empty()).then(|| rest.to_string()),
        }
    })
}

/// `word` as one shell word, whatever it holds.
fn single_quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The string a `sh -c STRING` (bash, zsh, dash; `-lc`, `-ec`) runs, or
/// `eval`'s words joined as it joins them: `eval rm -rf .rewind` passed
/// the hook as a command named `eval`.
pub(super) fn shell_string(cmd: &str) -> Option<String> {
    let w = words(cmd);
    if w.first().is_some_and(|(_, first)| first == "eval") {
        let args: Vec<&str> = w[1..].iter().map(|(_, a)| a.as_str()).collect();
        return Some(args.join(" "));
    }
    let shell = w.first()?.1.rsplit('/').next()?.to_string();
    if !["sh", "bash", "zsh", "dash", "ksh"].contains(&shell.as_str()) {
        return None;
    }
    let c = w
        .iter()
        .position(|(_, o)| o.starts_with('-') && !o.starts_with("--") && o.contains('c'))?;
    w.get(c + 1).map(|(_, s)| s.clone())
}

/// The words of a simple command: where each starts in `cmd`, and its
/// text with quotes and backslashes removed.
pub(super) fn words(cmd: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    let mut quote: Option<char> = None;
    let mut chars = cmd.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        // A `#` starting a word starts a comment, to the end of the line.
        if c == '#' && quote.is_none() && cur.is_none() {
            break;
        }
        // A redirection ends the word before it: `.rewind>/dev/null` is
        // `.rewind` and `>/dev/null`, `main&>log` is `main` and `&>log`
        // (helper-64). Not `2>` (a descriptor) nor `>>`, `>&`.
        let redirects = quote.is_none()
            && (matches!(c, '>' | '<')
                || (c == '&' && chars.peek().is_some_and(|(_, n)| *n == '>')));
        if redirects
            && let Some((_, w)) = &cur
            && !w.is_empty()
            && !w.chars().all(|d| d.is_ascii_digit())
            && !w.ends_with(['>', '<', '&'])
        {
            out.extend(cur.take());
        }
        let word = &mut cur.get_or_insert_with(|| (at, String::new())).1;
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None | Some('"'), '\\') => {
                if let Some((_, n)) = chars.next() {
                    word.push(n);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c.is_whitespace() => {
                if let Some((start, w)) = cur.take()
                    && at > start
                {
                    out.push((start, w));
                }
            }
            (None, c) => word.push(c),
        }
    }
    out.extend(cur);
    out
}

/// The words of a simple command without its redirections (`2>&1`,
/// `>/dev/null`, `> out.log`, `<in`, `&>f`): they say where the output
/// goes, not what runs. `git clean -fdx 2>&1` read `2>` as a pathspec
/// and passed as a clean of some other path (helper-63, D301).
pub(super) fn command_words(cmd: &str) -> Vec<String> {
    words_keeping_redirections(cmd, |_, _| false)
}

/// The words of a simple command, each redirection (the operator word,
/// and its target when that is the next word) kept only where `keep`
/// says so, given the operator word and its target.
fn words_keeping_redirections(cmd: &str, mut keep: impl FnMut(&str, &str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = words(cmd).into_iter().map(|(_, w)| w);
    while let Some(w) = it.next() {
        match redirection(&w) {
            // The operator alone: its target is the next word.
            Some(true) => {
                let target = it.next().unwrap_or_default();
                if keep(&w, &target) {
                    out.push(w);
                    out.push(target);
                }
            }
            Some(false) => {
                let target = w
                    .trim_start_matches(|c: char| c.is_ascii_digit())
                    .trim_start_matches(['<', '>', '&', '|']);
                if keep(&w, target) {
                    out.push(w);
                }
            }
            None => out.push(w),
        }
    }
    out
}

/// Whether a word is a redirection (`[N]>`, `>>`, `>&`, `>|`, `<`,
/// `<>`, `<&`, `<<`, `<<<`, `&>`, `&>>`), and if so whether its target
/// is the next word (`true`) or attached (`2>&1`, `>log`: `false`).
pub(super) fn redirection(word: &str) -> Option<bool> {
    const OPS: &[&str] = &[
        "&>>", "&>", ">>", ">&", ">|", "<<<", "<<", "<>", "<&", ">", "<",
    ];
    let rest = word.trim_start_matches(|c: char| c.is_ascii_digit());
    let op = OPS.iter().find(|o| rest.starts_with(**o))?;
    // `2&>f` is no redirection.
    if op.starts_with('&') && rest.len() != word.len() {
        return None;
    }
    Some(rest.len() == op.len())
}

/// The files a simple command's output redirections write: `> f`,
/// `>>f`, `2>log`, `&>f`, `>|f`, `<>f`; not a descriptor (`>&2`, `2>&1`,
/// `>&-`).
pub(super) fn written_by_redirections(cmd: &str) -> Vec<String> {
    let mut out = Vec::new();
    words_keeping_redirections(cmd, |op, target| {
        let op = op.trim_start_matches(|c: char| c.is_ascii_digit());
        let writes = op.starts_with(['>', '&']) || op.starts_with("<>");
        let descriptor = target == "-" || target.chars().all(|c| c.is_ascii_digit());
        if writes && !descriptor {
            out.push(target.to_string());
        }
        false
    });
    out
}

/// A simple command as one canonical line: its words without
/// redirections, each quoted as a shell needs it. `git push origin main
/// 2>&1`, `git  push "origin" main` and `git push origin main` are one
/// command (D301).
pub(super) fn canonical_command(cmd: &str) -> String {
    history::joined(&command_words(cmd))
}

/// A simple command as the effect it is: its words without the
/// redirections of its output, each quoted as a shell needs it. What it
/// reads stays: `kubectl apply -f - < staging.yaml` and `< prod.yaml`
/// are two effects (helper-64, D301), but not input from /dev/null,
/// which reads nothing (`</dev/null` keeps a prompt from waiting).
pub(super) fn effect_identity(cmd: &str) -> String {
    let reads = |op: &str, target: &str| {
        let output = op
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .starts_with(['>', '&']);
        !output && target != "/dev/null"
    };
    history::joined(&words_keeping_redirections(cmd, reads))
}
