//! `rewind.toml` at the workspace root: hook, effect and retention rules.
//! It is never captured (`capture::CONFIG_FILE`), so no rewind rolls the
//! rules back. A missing file means the defaults; a broken one is an error
//! naming the file, on which callers fail closed.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

pub use crate::capture::CONFIG_FILE;

/// Tools whose calls change files, checkpointed before they run by default:
/// Claude Code's, then Gemini CLI's (`integrate gemini` installs the same
/// hooks, whose calls name its own tools), then Codex's file edits (its
/// shell calls are `Bash`), then MCP tools named for writing (a
/// filesystem server's `write_file`, an editing server's
/// `replace_symbol_body`): an Edit made just before an MCP server's write
/// was lost with it, no checkpoint between (helper-63, D308). A call that
/// changed nothing costs a checkpoint that reuses HEAD.
pub const DEFAULT_CHECKPOINT_TOOLS: &[&str] = &[
    "Bash",
    "Write",
    "Edit",
    "MultiEdit",
    "NotebookEdit",
    "run_shell_command",
    "write_file",
    "replace",
    "apply_patch",
    "mcp__*write*",
    "mcp__*edit*",
    "mcp__*create*",
    "mcp__*delete*",
    "mcp__*remove*",
    "mcp__*move*",
    "mcp__*rename*",
    "mcp__*replace*",
    "mcp__*insert*",
    "mcp__*patch*",
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub hook: HookConfig,
    #[serde(default, rename = "effect")]
    pub effects: Vec<EffectRule>,
    #[serde(default)]
    pub retention: Retention,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Tool names (or globs) checkpointed before they run.
    #[serde(default = "default_checkpoint_tools")]
    pub checkpoint: Vec<String>,
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            checkpoint: default_checkpoint_tools(),
        }
    }
}

fn default_checkpoint_tools() -> Vec<String> {
    DEFAULT_CHECKPOINT_TOOLS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectRule {
    /// `Tool(glob)` (glob over the command or main argument) or `glob`
    /// (over the tool name).
    #[serde(rename = "match")]
    pub pattern: String,
    #[serde(default)]
    pub kind: Option<String>,
    /// A `tool_input` field naming the effect (e.g. an order id); default:
    /// the whole call, so only an identical call counts as the same effect.
    #[serde(default)]
    pub key: Option<String>,
}

/// `[retention]`: which checkpoints `gc` keeps, and the store's size budget.
/// A checkpoint is kept when any rule keeps it (the newest `keep_last`, or
/// younger than `keep_within`, or given a label with `keep_labeled`: not the
/// labels hook and safety checkpoints give themselves) or when it
/// is protected (see `gc`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    #[serde(default = "default_keep_last")]
    pub keep_last: usize,
    #[serde(default = "default_keep_within", deserialize_with = "de_duration")]
    pub keep_within: Duration,
    #[serde(default = "default_true")]
    pub keep_labeled: bool,
    /// Prune (by the rules above, then oldest first) when the store grows past this.
    #[serde(default, deserialize_with = "de_bytes")]
    pub max_store_bytes: Option<u64>,
    /// Apply the policy after checkpoints (batched: see `gc::auto`).
    #[serde(default = "default_true")]
    pub auto: bool,
}

fn default_keep_last() -> usize {
    100
}
fn default_keep_within() -> Duration {
    Duration::from_secs(7 * 86400)
}
fn default_true() -> bool {
    true
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_last: default_keep_last(),
            keep_within: default_keep_within(),
            keep_labeled: true,
            max_store_bytes: None,
            auto: true,
        }
    }
}

/// `"90s"`, `"30m"`, `"24h"`, `"7d"`, `"2w"`, or a number of seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{s}' is not a duration: write e.g. 30m, 24h, 7d"))?;
    let secs = match unit.trim() {
        "" | "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86400,
        "w" => 7 * 86400,
        other => {
            return Err(format!(
                "unknown duration unit '{other}' in '{s}': use s, m, h, d or w"
            ));
        }
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

/// `"500MB"`, `"20GiB"`, `"1.5G"` (powers of 1024 for binary and bare
/// units, of 1000 for KB/MB/GB/TB), or a number of bytes.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n
        .parse()
        .map_err(|_| format!("'{s}' is not a size: write e.g. 500MiB or 20GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}': use KiB, MiB, GiB or TiB"
            ));
        }
    };
    Ok((n * mult) as u64)
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Secs(n) => Ok(Duration::from_secs(n)),
        Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
    }
}

fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Bytes(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) => parse_bytes(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

impl Config {
    /// Read `rewind.toml` under `root`; a missing file is the defaults. A
    /// broken file is an error naming the file and the fix: the caller
    /// fails closed on it.
    pub fn load(root: &Path) -> Result<Config> {
        let path = root.join(CONFIG_FILE);
        let read = match read_config(root, &path) {
            // `root` is a mount whose daemon died (since this command
            // found it: D194): detached, it shows the backing tree.
            Err(e) if crate::mount::is_dead_mount(&e) => {
                crate::mount::detach_dead_above(root)?;
                read_config(root, &path)
            }
            r => r,
        };
        let text = match read {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Rules put beside the ledger were silently not read: a
                // `git push` the user thought guarded ran unguarded.
                let misplaced = root.join(".rewind").join(CONFIG_FILE);
                if misplaced.exists() {
                    return Err(Error::InvalidPath {
                        path: misplaced,
                        reason: format!(
                            "is never read: rewind.toml belongs at the workspace root; move it to {}",
                            path.display()
                        ),
                    });
                }
                return Ok(Config::default());
            }
            Err(e) => {
                return Err(Error::os(rewind_platform::Error::new(
                    "read config",
                    &path,
                    e,
                )));
            }
        };
        Config::parse(&text).map_err(|reason| Error::InvalidPath { path, reason })
    }

    pub fn parse(text: &str) -> std::result::Result<Config, String> {
        // One line (errors are one line on stderr): where, then what.
        let config: Config = toml_edit::de::from_str(text).map_err(|e| {
            let at = e.span().map_or(String::new(), |span| {
                let before = &text.as_bytes()[..span.start.min(text.len())];
                let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                let column = before.len()
                    - before
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |i| i + 1)
                    + 1;
                format!(" at line {line}, column {column}")
            });
            format!(
                "invalid rewind.toml{at}: {}; fix it",
                e.message().trim().replace('\n', " ")
            )
        })?;
        for r in &config.effects {
            crate::hooks::validate_pattern(&r.pattern)?;
        }
        Ok(config)
    }
}

/// The text of `rewind.toml` at `path` in `root`. As root it is read
/// through the workspace's directory, never through a symlink, and only
/// as a regular file of at most 1 MiB: a user's `rewind.toml` linked to a
/// device, a FIFO or a file of root's made root's command read it
/// (helper-20, D160).
fn read_config(root: &Path, path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    const MAX: u64 = 1 << 20;
    if !rewind_platform::is_root() {
        return std::fs::read_to_string(path);
    }
    let (file, meta) = rewind_platform::Dir::open(root)
        .and_then(|d| d.open_read(std::ffi::OsStr::new(CONFIG_FILE)))
        .map_err(|e| {
            // "Too many levels of symbolic links" named neither the link
            // nor the fix (helper-33, D234).
            if e.is_redirected() {
                std::io::Error::other(
                    "is a symbolic link, which rewind does not follow as root (D160): put the file itself there",
                )
            } else {
                e.source
            }
        })?;
    if meta.size > MAX {
        return Err(std::io::Error::other(format!(
            "is {} bytes: rewind.toml is read up to 1 MiB",
            meta.size
        )));
    }
    let mut text = String::new();
    file.take(MAX).read_to_string(&mut text)?;
    Ok(text)
}
