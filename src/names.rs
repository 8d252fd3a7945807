//! How names (paths, labels, notes) are shown to people: as they are
//! when plain; else quoted C-style as git does, so that a newline never
//! reads as two entries and two names never print alike (D188, D189);
//! `diff --patch` writes its paths the same way with git's octal escapes.
//! A name inside a command people are told to run is a shell word.

use std::borrow::Cow;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Private paths and the paths people know them by (see [`show_as`]).
static SHOWN_AS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// From now on, messages from this process name `private` as `shown`. A
/// mounted workspace's backing tree is reached through a path of the
/// daemon's (`/run/rewind/….backing`) that no one knows or can open;
/// errors named it (helper-47, D272).
pub(crate) fn show_as(private: &Path, shown: &Path) {
    let (private, shown) = (
        private.to_string_lossy().into_owned(),
        shown.to_string_lossy().into_owned(),
    );
    let mut all = SHOWN_AS.lock().unwrap_or_else(|p| p.into_inner());
    if private != shown && !all.iter().any(|(p, _)| *p == private) {
        all.push((private, shown));
    }
}

/// `message` with each private path replaced by the one people know.
pub(crate) fn as_people_know_it(message: &str) -> String {
    let all = SHOWN_AS.lock().unwrap_or_else(|p| p.into_inner());
    all.iter().fold(message.to_string(), |m, (private, shown)| {
        m.replace(private, shown)
    })
}

/// `s` as one POSIX shell word: as is when nothing in it is special to
/// the shell, else single-quoted (a `'` inside becomes `'\''`). For the
/// commands rewind writes (agent hooks) or tells people to paste.
pub fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./,:=+@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// A path as a human line shows it: as is, or, when it holds a control
/// character (a newline would read as two entries), a backslash or a
/// double quote, quoted C-style as git does (`"a\nb"`, `\xNN` for other
/// control characters).
pub fn human_path(p: &str) -> Cow<'_, str> {
    if !p.chars().any(needs_escape) {
        return Cow::Borrowed(p);
    }
    Cow::Owned(quoted(p.as_bytes()))
}

/// A path as [`human_path`] prints it, from the lossy `path` and, when
/// the name is not UTF-8, its exact bytes in `path_hex`: each byte that is
/// not UTF-8 prints as `\xNN` inside quotes, so two such names never print
/// alike (the lossy form turned every one into U+FFFD, D188).
pub fn human_name<'a>(path: &'a str, path_hex: Option<&str>) -> Cow<'a, str> {
    match path_hex.and_then(crate::hash::unhex) {
        Some(bytes) => Cow::Owned(quoted(&bytes)),
        None => human_path(path),
    }
}

fn needs_escape(c: char) -> bool {
    unseen(c) || c == '"' || c == '\\'
}

/// A character a terminal does not show as itself: a control character,
/// or an invisible one that reorders or hides what follows (U+202E
/// turned `fix gnp.exe` into what reads as `fix exe.png`; U+2028 breaks
/// the line in some terminals; tag characters carry text no one sees):
/// shown escaped, refused in labels (helper-59, D294). Not the joiners
/// U+200C and U+200D, which emoji sequences and Persian or Devanagari
/// words need (helper-60).
pub fn unseen(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'
            | '\u{200E}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}')
}

/// `s` with each character [`unseen`] hides written as `\u{XXXX}`, the
/// rest as it is: for text shown inside a line that quotes it already.
pub fn shown(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unseen) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if unseen(c) {
                    format!("\\u{{{:04x}}}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// `s` as one word a person pastes into a POSIX shell: [`shell_word`],
/// with each character [`unseen`] hides written as the `printf` of its
/// bytes (`"$(printf '\342\200\256')"`), so that what the terminal
/// shows is what runs (helper-60).
pub fn pasteable_word(s: &str) -> String {
    if !s.chars().any(unseen) {
        return shell_word(s);
    }
    let mut out = String::new();
    let mut seen = String::new();
    for c in s.chars() {
        if !unseen(c) {
            seen.push(c);
            continue;
        }
        if !seen.is_empty() {
            out.push_str(&shell_word(&std::mem::take(&mut seen)));
        }
        let bytes: String = c
            .encode_utf8(&mut [0; 4])
            .bytes()
            .map(|b| format!("\\{b:03o}"))
            .collect();
        out.push_str(&format!("\"$(printf '{bytes}')\""));
    }
    if !seen.is_empty() {
        out.push_str(&shell_word(&seen));
    }
    out
}

/// How a quoted name writes what it cannot show as is.
#[derive(Clone, Copy)]
pub enum Escapes {
    /// For people: `\xNN` for a control character's code point and for
    /// each byte that is not UTF-8.
    Hex,
    /// As git's patch headers do, which `git apply` reads back: `\NNN`
    /// in octal for each byte of a control character and each byte that
    /// is not UTF-8.
    Octal,
}

/// `prefix` and `name` as one C-style token: as they are when plain
/// (valid UTF-8 with no control character, quote or backslash), else in
/// quotes with `\n`, `\t`, `\"`, `\\` and `escapes` for the rest.
pub fn c_style(prefix: &str, name: &[u8], escapes: Escapes) -> String {
    match std::str::from_utf8(name) {
        Ok(text) if !text.chars().any(needs_escape) => format!("{prefix}{text}"),
        _ => quoted_with(prefix, name, escapes),
    }
}

fn quoted(name: &[u8]) -> String {
    quoted_with("", name, Escapes::Hex)
}

fn quoted_with(prefix: &str, name: &[u8], escapes: Escapes) -> String {
    let mut q = String::with_capacity(prefix.len() + name.len() + 2);
    q.push('"');
    q.push_str(prefix);
    let byte = |q: &mut String, b: u8| match escapes {
        Escapes::Hex => q.push_str(&format!("\\x{b:02x}")),
        Escapes::Octal => q.push_str(&format!("\\{b:03o}")),
    };
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => q.push_str("\\n"),
                '\t' => q.push_str("\\t"),
                '"' => q.push_str("\\\""),
                '\\' => q.push_str("\\\\"),
                c if unseen(c) => match escapes {
                    Escapes::Hex if (c as u32) <= 0xff => {
                        q.push_str(&format!("\\x{:02x}", c as u32));
                    }
                    Escapes::Hex => q.push_str(&format!("\\u{{{:04x}}}", c as u32)),
                    Escapes::Octal => {
                        for b in c.encode_utf8(&mut [0; 4]).bytes() {
                            byte(&mut q, b);
                        }
                    }
                },
                c => q.push(c),
            }
        }
        for &b in chunk.invalid() {
            byte(&mut q, b);
        }
    }
    q.push('"');
    q
}

/// A label always in quotes (it may hold spaces), escaped as
/// [`human_path`] escapes: `say "hi"` shows as `"say \"hi\""`.
pub fn quoted_label(label: &str) -> String {
    match human_path(label) {
        Cow::Borrowed(plain) => format!("\"{plain}\""),
        quoted => quoted.into_owned(),
    }
}

/// What a user typed, cut to `max` characters for an error that echoes
/// it: a 1 MiB id came back whole in "no checkpoint matches".
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((end, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len())),
        None => Cow::Borrowed(text),
    }
}

/// Raw bytes (a path as the filesystem gives it) as [`human_path`] shows
/// text: each byte that is not UTF-8 as `\xNN` inside quotes, never as
/// U+FFFD.
pub fn human_bytes_name(name: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(name) {
        Ok(text) => human_path(text),
        Err(_) => Cow::Owned(quoted(name)),
    }
}

/// `path` with `suffix` added to its last component: a ledger's `-wal`
/// or `-shm` beside it, `.rewind.copy` beside `.rewind`.
pub fn with_suffix(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    name.into()
}

/// A path for an error message, shown as [`human_bytes_name`] shows it.
pub fn human_os_path(path: &Path) -> Cow<'_, str> {
    human_bytes_name(path.as_os_str().as_bytes())
}

/// "1 checkpoint", "2 checkpoints": a count with its noun (plural by `s`).
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
