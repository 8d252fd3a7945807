//! `rewind integrate claude|codex|gemini|cursor`: write the agent's MCP
//! server entry and hook config into the project, merging with what is
//! there. Rules: the user's settings survive byte-for-byte where we do not
//! touch them (JSON key order, TOML comments); a file that does not parse is
//! reported and nothing at all is written; a second run changes nothing.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::Ctx;
use crate::error::{Error, Result};
use crate::workspace::Workspace;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent: claude, codex, gemini or cursor
    #[arg(value_parser = ["claude", "codex", "gemini", "cursor"])]
    agent: String,
    /// Show what would change (a unified diff per file); write nothing
    #[arg(long)]
    dry_run: bool,
    /// The command agents run (default: `rewind` when that is this binary
    /// on PATH, else this binary's absolute path)
    #[arg(long, value_name = "PATH")]
    command: Option<String>,
}

#[derive(Serialize)]
struct FileChange {
    path: String,
    /// created, updated or unchanged
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    diff: Option<String>,
}

#[derive(Serialize)]
struct Out {
    agent: String,
    dry_run: bool,
    workspace: String,
    workspace_created: bool,
    files: Vec<FileChange>,
    /// Paths added to .rewind/ignore: captured by no checkpoint, changed by no rewind
    never_rewound: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// One file's planned content.
struct Plan {
    path: PathBuf,
    old: Option<String>,
    new: String,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let root = ctx.start_dir();
    if !root.is_dir() {
        return Err(Error::InvalidPath {
            path: root,
            reason: "not a directory: run integrate in the project directory or pass -C DIR".into(),
        });
    }
    let start = root.clone();
    let mut notes = Vec::new();
    let root = Workspace::discover(&root).unwrap_or(root);
    // The agent's project files there would be the user's own, read by
    // every project: `~/.claude/settings.json` with hooks for all of them.
    if let Some(what) = super::too_broad_for_a_workspace(&root) {
        return Err(Error::InvalidPath {
            path: root,
            reason: format!(
                "is {what}: integrate would write user-wide agent settings that act in every project; run it in the project directory (`rewind init` there first if the workspace above it was made by accident), or pass -C DIR; nothing was written"
            ),
        });
    }
    if root != start {
        notes.push(format!(
            "writing into the workspace at {}, which holds {}",
            root.display(),
            start.display()
        ));
    }
    let cmd = match &args.command {
        // Every hook and server entry would run nothing at all.
        Some(c) if c.trim().is_empty() => {
            return Err(Error::Usage(
                "--command is empty: give the rewind binary the agent should run (an absolute path, or `rewind` if it is on the agent's PATH), or leave --command out for this one; nothing was written".into(),
            ));
        }
        Some(c) => {
            notes.extend(command_warning(c));
            c.clone()
        }
        None => default_command(),
    };
    let plans = match args.agent.as_str() {
        "claude" => vec![
            json_plan(&root.join(".mcp.json"), |v| mcp_entry(v, &cmd))?,
            json_plan(&root.join(".claude/settings.json"), |v| {
                hooks_entry(v, &cmd, CLAUDE_HOOKS, &mut notes)
            })?,
        ],
        "gemini" => vec![json_plan(&root.join(".gemini/settings.json"), |v| {
            mcp_entry(v, &cmd)?;
            hooks_entry(v, &cmd, GEMINI_HOOKS, &mut notes)
        })?],
        "cursor" => {
            notes.push("cursor: MCP server only; Cursor's hooks use another protocol, so take checkpoints with the `checkpoint` tool".into());
            vec![json_plan(&root.join(".cursor/mcp.json"), |v| {
                mcp_entry(v, &cmd)
            })?]
        }
        _ => vec![codex_plan(
            &root.join(".codex/config.toml"),
            &cmd,
            &mut notes,
        )?],
    };
    // The agent's config must not flip with rewinds (a rewind to before
    // the integration would switch the hooks off mid-session): the files we
    // manage are ignored by rules in .rewind/ignore, which no rewind touches.
    let protect: Vec<String> = plans
        .iter()
        .map(|p| format!("/{}", rel(&root, &p.path)))
        .collect();
    // Every file parsed and planned before any is written.
    let mut files = Vec::new();
    for p in &plans {
        let action = match &p.old {
            None => "created",
            Some(old) if *old == p.new => "unchanged",
            Some(_) => "updated",
        };
        let diff = (args.dry_run && action != "unchanged").then(|| {
            similar::TextDiff::from_lines(p.old.as_deref().unwrap_or(""), &p.new)
                .unified_diff()
                .header(
                    &format!("a/{}", rel(&root, &p.path)),
                    &format!("b/{}", rel(&root, &p.path)),
                )
                .to_string()
        });
        files.push(FileChange {
            path: rel(&root, &p.path),
            action,
            diff,
        });
    }
    let mut workspace_created = false;
    if !args.dry_run {
        let mut written: Vec<&Plan> = Vec::new();
        let installed = (|| {
            for p in plans.iter().filter(|p| p.old.as_deref() != Some(&p.new)) {
                super::write_atomically(&p.path, &p.new, true)?;
                written.push(p);
            }
            // Hooks only act in a workspace: make sure there is one.
            let ws = match Workspace::discover(&root) {
                Some(r) => Workspace::open(&r, false)?,
                None => {
                    workspace_created = true;
                    Workspace::init(&root, false)?.0
                }
            };
            ws.add_state_ignores(&protect)
        })();
        if let Err(e) = installed {
            // Half an install (MCP without hooks, hooks without the
            // workspace they act in) is worse than none: put back what
            // was written.
            for p in written.iter().rev() {
                match &p.old {
                    Some(old) => drop(super::write_atomically(&p.path, old, true)),
                    None => drop(std::fs::remove_file(&p.path)),
                }
            }
            return Err(e);
        }
    }
    let out = Out {
        agent: args.agent,
        dry_run: args.dry_run,
        workspace: root.display().to_string(),
        workspace_created,
        files,
        never_rewound: protect,
        notes,
    };
    ctx.emit(&out, || {
        let mut s = String::new();
        for f in &out.files {
            match &f.diff {
                Some(d) => s.push_str(d),
                None => s.push_str(&format!(
                    "{}{}\n",
                    f.path,
                    match f.action {
                        "unchanged" => ": already set up, unchanged",
                        "created" if out.dry_run => ": would be created",
                        "created" => ": created",
                        _ if out.dry_run => ": would be updated",
                        _ => ": updated",
                    }
                )),
            }
        }
        if out.workspace_created {
            s.push_str(&format!("initialized the workspace {}\n", out.workspace));
        }
        for n in &out.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    })
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// `name` in each directory of PATH, in order: where a shell would look.
fn on_path(name: &str) -> impl Iterator<Item = PathBuf> + '_ {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(move |d| d.join(name))
}

/// `rewind` when the `rewind` on PATH is this binary, else our absolute path.
fn default_command() -> String {
    let Ok(me) = std::env::current_exe().and_then(|p| p.canonicalize()) else {
        return "rewind".into();
    };
    match runs_this_build("rewind") {
        Some(true) => "rewind".into(),
        _ => me.display().to_string(),
    }
}

/// A `--command` the agent could not start fails every hook, and a hook
/// that fails to start lets the call through: effect rules would guard
/// nothing (helper-28, D197). Said, not refused: the config may be meant
/// for another machine (a team's `.mcp.json`) where the binary exists.
fn command_warning(cmd: &str) -> Option<String> {
    let problem = cannot_start(cmd)?;
    Some(format!(
        "--command {} {problem}: an agent that cannot start it runs every tool call unguarded and unchecked; give the absolute path of the rewind binary unless this config is for another machine",
        crate::names::human_os_path(Path::new(cmd))
    ))
}

/// Why a program named `cmd` (a path, or a name looked up on PATH) could
/// not be started here, if it could not.
fn cannot_start(cmd: &str) -> Option<&'static str> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let path = Path::new(cmd);
    if cmd.contains('/') {
        if !path.is_absolute() {
            Some("is a relative path, which the agent resolves from its own working directory")
        } else if !executable(path) {
            Some("is not an executable file here")
        } else {
            None
        }
    } else if on_path(cmd).any(|c| executable(&c)) {
        None
    } else {
        Some("is not an executable on this PATH")
    }
}

/// A hook the user wrapped around `rewind hook VERB` is kept as it is
/// (D104), so a rerun with a new `--command` does not update it. When
/// the binary it runs is gone, every call runs unguarded: said, as for a
/// `--command` (helper-33, D232). The binary is the word before `hook
/// VERB`.
fn wrapped_warning(command: &str, verb: &str, cmd: &str) -> Option<String> {
    let at = command.find(&format!(" hook {verb}"))?;
    let word = command[..at].split_whitespace().last()?;
    let program = word.trim_matches(|c| c == '\'' || c == '"');
    // A variable or a substitution is the shell's to expand.
    if program.is_empty() || program.contains(['$', '`']) {
        return None;
    }
    let problem = cannot_start(program)?;
    Some(format!(
        "the hook you wrapped, `{command}`, runs {} which {problem}: it fails, and the agent runs every call unguarded; integrate keeps wrapped hooks as they are, so point it at {} yourself",
        crate::names::human_os_path(Path::new(program)),
        crate::names::shell_word(cmd)
    ))
}

fn hook_command(cmd: &str, verb: &str) -> String {
    format!("{} hook {verb}", crate::names::shell_word(cmd))
}

/// A config file we cannot merge into: named, with the fix; nothing is
/// written (every file is planned before any is written).
fn unusable(path: &Path, reason: String) -> Error {
    Error::InvalidPath {
        path: path.to_path_buf(),
        reason: format!("{reason}; fix or move the file, then rerun: nothing was changed"),
    }
}

fn read_existing(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::os(rewind_platform::Error::new("read", path, e))),
    }
}

fn json_plan(
    path: &Path,
    edit: impl FnOnce(&mut Map<String, Value>) -> Result<()>,
) -> Result<Plan> {
    let old = read_existing(path)?;
    let invalid = |reason: String| unusable(path, reason);
    let mut value: Value = match old.as_deref().map(str::trim) {
        None | Some("") => json!({}),
        Some(text) => {
            serde_json::from_str(text).map_err(|e| invalid(format!("not valid JSON ({e})")))?
        }
    };
    let Value::Object(map) = &mut value else {
        return Err(invalid("the top level is not a JSON object".into()));
    };
    let before = map.clone();
    edit(map).map_err(|e| match e {
        Error::Usage(m) => invalid(m),
        other => other,
    })?;
    // Semantically unchanged: keep the user's bytes (and formatting).
    let new = match (&old, *map == before) {
        (Some(o), true) => o.clone(),
        _ => {
            let mut s = serde_json::to_string_pretty(&value)
                .map_err(|e| Error::Usage(format!("internal: {e}")))?;
            s.push('\n');
            s
        }
    };
    Ok(Plan {
        path: path.to_path_buf(),
        old,
        new,
    })
}

/// An object member, created empty when missing; an error when it exists
/// and is not an object.
fn object<'a>(map: &'a mut Map<String, Value>, key: &str) -> Result<&'a mut Map<String, Value>> {
    let v = map.entry(key.to_string()).or_insert_with(|| json!({}));
    v.as_object_mut()
        .ok_or_else(|| Error::Usage(format!("\"{key}\" is not a JSON object")))
}

fn mcp_entry(map: &mut Map<String, Value>, cmd: &str) -> Result<()> {
    let servers = object(map, "mcpServers")?;
    let ours = json!({"command": cmd, "args": ["mcp"]});
    // Keep fields the user added to our entry (env, timeouts, ...).
    match servers.get_mut("rewind").and_then(Value::as_object_mut) {
        Some(existing) => {
            existing.insert("command".into(), ours["command"].clone());
            // `mcp --profile lean` and the like are the user's choice; only
            // args that do not start our server are replaced.
            let serves = existing
                .get("args")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                == Some("mcp");
            if !serves {
                existing.insert("args".into(), ours["args"].clone());
            }
        }
        None => {
            servers.insert("rewind".into(), ours);
        }
    }
    Ok(())
}

/// The hook events of Claude Code and the `rewind hook` verb for each.
/// A failed call (a command that exited non-zero included) is sent as
/// `PostToolUseFailure`, never as `PostToolUse`: without it, a guarded push
/// that failed stayed spent and its retry was refused.
const CLAUDE_HOOKS: &[(&str, &str)] = &[
    ("PreToolUse", "pre-tool-use"),
    ("PostToolUse", "post-tool-use"),
    ("PostToolUseFailure", "post-tool-use-failure"),
];
const GEMINI_HOOKS: &[(&str, &str)] = &[
    ("BeforeTool", "pre-tool-use"),
    ("AfterTool", "post-tool-use"),
];
const CODEX_HOOKS: &[(&str, &str)] = &[
    ("PreToolUse", "pre-tool-use"),
    ("PostToolUse", "post-tool-use"),
];

/// What an existing hook command is to us.
#[derive(PartialEq)]
enum Existing {
    /// Exactly what we install (`WORD hook VERB`), perhaps with another
    /// binary: updated to the current one.
    Ours,
    /// Runs `rewind hook VERB` inside something the user wrote: kept as is.
    Wrapped,
    Other,
}

fn existing(command: &str, verb: &str) -> Existing {
    let call = format!("hook {verb}");
    if let Some(word) = command.trim().strip_suffix(&format!(" {call}")) {
        // One word as `shell_word` writes it: plain, or single-quoted.
        let inner = word
            .strip_prefix('\'')
            .and_then(|w| w.strip_suffix('\''))
            .map(|w| w.replace("'\\''", ""));
        let one_word = match inner {
            Some(inner) => !inner.contains('\''),
            None => !word
                .chars()
                .any(|c| c.is_whitespace() || "'\"\\;&|$`<>()".contains(c)),
        };
        if one_word {
            return Existing::Ours;
        }
    }
    // `hook VERB` not followed by more of a verb (post-tool-use is not
    // post-tool-use-failure).
    let wrapped = command.match_indices(&call).any(|(i, _)| {
        !command[i + call.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    });
    if wrapped {
        Existing::Wrapped
    } else {
        Existing::Other
    }
}

/// An existing hook command against the one we would write (`wanted`):
/// whether it already runs `hook VERB`, and whether it is ours but names
/// another binary (then it is rewritten).
fn reconcile(
    command: &str,
    verb: &str,
    wanted: &str,
    cmd: &str,
    notes: &mut Vec<String>,
) -> (bool, bool) {
    match existing(command, verb) {
        Existing::Ours => (true, command != wanted),
        Existing::Wrapped => {
            notes.extend(wrapped_warning(command, verb, cmd));
            (true, false)
        }
        Existing::Other => (false, false),
    }
}

/// Add our hook groups, or point the ones we installed before at `cmd`; a
/// hook the user wrapped around `rewind hook` is left alone.
fn hooks_entry(
    map: &mut Map<String, Value>,
    cmd: &str,
    events: &[(&str, &str)],
    notes: &mut Vec<String>,
) -> Result<()> {
    let hooks = object(map, "hooks")?;
    for &(event, verb) in events {
        let groups = hooks.entry(event.to_string()).or_insert_with(|| json!([]));
        let groups = groups
            .as_array_mut()
            .ok_or_else(|| Error::Usage(format!("\"hooks.{event}\" is not a JSON array")))?;
        let wanted = hook_command(cmd, verb);
        let mut present = false;
        // Matchers of groups running it for some tools only, and whether a
        // group runs it for all.
        let mut narrow: Vec<String> = Vec::new();
        let mut everywhere = false;
        for group in groups.iter_mut() {
            let matcher = group
                .get("matcher")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let Some(hooks) = group.get_mut("hooks").and_then(Value::as_array_mut) else {
                continue;
            };
            for hook in hooks {
                let Some(command) = hook.get("command").and_then(Value::as_str) else {
                    continue;
                };
                let (covers, stale) = reconcile(command, verb, &wanted, cmd, notes);
                present |= covers;
                if covers && matches!(matcher.as_str(), "" | "*" | ".*" | ".+") {
                    everywhere = true;
                } else if covers && !narrow.contains(&matcher) {
                    narrow.push(matcher.clone());
                }
                if stale {
                    hook["command"] = json!(wanted);
                }
            }
        }
        // Kept, not widened: a second hook beside it would run twice for
        // the tools it matches (two checkpoints, and the effect barrier
        // refusing its own second decision). Said, because it read as
        // installed while Write and Edit ran with no checkpoint (helper-53).
        if !narrow.is_empty() && !everywhere {
            notes.push(format!(
                "your {event} hook runs `rewind hook {verb}` only for tools matching {}: calls of the tools it does not match get {}; set its matcher to \"*\" if that is not what you want",
                narrow
                    .iter()
                    .map(|m| format!("\"{m}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
                if verb == "pre-tool-use" {
                    "no checkpoint and no effect barrier"
                } else {
                    "no outcome recorded"
                }
            ));
        }
        if !present {
            groups.push(json!({
                "matcher": "*",
                "hooks": [{"type": "command", "command": wanted}]
            }));
        }
    }
    Ok(())
}

fn codex_plan(path: &Path, cmd: &str, notes: &mut Vec<String>) -> Result<Plan> {
    use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, value};
    let old = read_existing(path)?;
    let invalid = |reason: String| unusable(path, reason);
    let mut doc: DocumentMut =
        old.as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|e: toml_edit::TomlError| {
                // The message and its line, not the caret diagram: an
                // error is one line (D218).
                let line = e.span().map(|s| {
                    let text = old.as_deref().unwrap_or("");
                    text[..s.start.min(text.len())].matches('\n').count() + 1
                });
                invalid(format!(
                    "not valid TOML ({}{})",
                    e.message().trim(),
                    line.map(|l| format!(", line {l}")).unwrap_or_default()
                ))
            })?;
    let implicit = || {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    };
    // An inline table made a standard one keeps its key's spacing
    // (`mcp_servers = {` becomes `[mcp_servers ]`): drop it.
    for key in ["mcp_servers", "hooks"] {
        if doc.get(key).is_some_and(toml_edit::Item::is_inline_table)
            && let Some(mut k) = doc.key_mut(key)
        {
            k.leaf_decor_mut().clear();
        }
    }
    let servers = table_mut(doc.entry("mcp_servers").or_insert_with(implicit))
        .ok_or_else(|| invalid("`mcp_servers` is not a table".into()))?;
    let entry = table_mut(
        servers
            .entry("rewind")
            .or_insert_with(|| Item::Table(Table::new())),
    )
    .ok_or_else(|| invalid("`mcp_servers.rewind` is not a table".into()))?;
    if entry.get("command").and_then(Item::as_str) != Some(cmd) {
        entry["command"] = value(cmd);
    }
    let args_ok = entry
        .get("args")
        .and_then(Item::as_array)
        .is_some_and(|a| a.get(0).and_then(|v| v.as_str()) == Some("mcp"));
    if !args_ok {
        let mut a = toml_edit::Array::new();
        a.push("mcp");
        entry["args"] = value(a);
    }
    let hooks = table_mut(doc.entry("hooks").or_insert_with(implicit))
        .ok_or_else(|| invalid("`hooks` is not a table".into()))?;
    for &(event, verb) in CODEX_HOOKS {
        let groups = array_of_tables_mut(
            hooks
                .entry(event)
                .or_insert_with(|| Item::ArrayOfTables(ArrayOfTables::new())),
        )
        .ok_or_else(|| invalid(format!("`hooks.{event}` is not an array of tables")))?;
        let wanted = hook_command(cmd, verb);
        let mut present = false;
        for hook in groups
            .iter_mut()
            .filter_map(|g| g.get_mut("hooks").and_then(array_of_tables_mut))
            .flat_map(|hs| hs.iter_mut())
        {
            let Some(command) = hook.get("command").and_then(Item::as_str) else {
                continue;
            };
            let (covers, stale) = reconcile(command, verb, &wanted, cmd, notes);
            present |= covers;
            if stale {
                hook["command"] = value(wanted.as_str());
            }
        }
        if !present {
            let mut hook = Table::new();
            hook["type"] = value("command");
            hook["command"] = value(wanted);
            let mut inner = ArrayOfTables::new();
            inner.push(hook);
            let mut group = Table::new();
            group["matcher"] = value("*");
            group["hooks"] = Item::ArrayOfTables(inner);
            groups.push(group);
        }
    }
    let new = doc.to_string();
    Ok(Plan {
        path: path.to_path_buf(),
        old,
        new,
    })
}

/// `item` as a table: an inline one (`mcp_servers = { … }`) is a table to
/// TOML too, and is made a standard one to be edited (it was refused as
/// "not a table").
fn table_mut(item: &mut toml_edit::Item) -> Option<&mut toml_edit::Table> {
    if item.is_inline_table() {
        match std::mem::take(item).into_table() {
            Ok(t) => *item = toml_edit::Item::Table(t),
            Err(back) => *item = back,
        }
    }
    item.as_table_mut()
}

/// `item` as an array of tables: an inline array of inline tables (or an
/// empty one, `PreToolUse = []`) is made a standard one to be edited.
fn array_of_tables_mut(item: &mut toml_edit::Item) -> Option<&mut toml_edit::ArrayOfTables> {
    if item.as_array().is_some_and(|a| a.is_empty()) {
        // toml_edit will not cast an empty array; it is an empty list.
        *item = toml_edit::Item::ArrayOfTables(toml_edit::ArrayOfTables::new());
    } else if item.is_array() {
        match std::mem::take(item).into_array_of_tables() {
            Ok(a) => *item = toml_edit::Item::ArrayOfTables(a),
            Err(back) => *item = back,
        }
    }
    item.as_array_of_tables_mut()
}

/// The config files `integrate` writes, relative to the project root.
const CONFIG_FILES: &[&str] = &[
    ".mcp.json",
    ".claude/settings.json",
    ".gemini/settings.json",
    ".cursor/mcp.json",
    ".codex/config.toml",
];

/// The agent whose settings `file` (one of [`CONFIG_FILES`]) holds.
pub(crate) fn agent_of(file: &str) -> &'static str {
    match file.split('/').next().unwrap_or_default() {
        ".gemini" => "gemini",
        ".cursor" => "cursor",
        ".codex" => "codex",
        _ => "claude",
    }
}

/// The rewind programs the agents' settings under `root` run: each
/// config file `integrate` writes, with the program of every rewind hook
/// (`PROGRAM hook VERB`) and MCP server (`args` starting with `mcp`) in
/// it, as written. A hook left on an earlier build after an upgrade is
/// refused by the history (D334), and `doctor` names it.
pub(crate) fn configured_programs(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for rel in CONFIG_FILES {
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else {
            continue;
        };
        let mut found = Vec::new();
        if rel.ends_with(".toml") {
            if let Ok(doc) = text.parse::<toml_edit::DocumentMut>() {
                toml_programs(doc.as_item(), &mut found);
            }
        } else if let Ok(v) = serde_json::from_str::<Value>(&text) {
            json_programs(&v, &mut found);
        }
        // Once each: a file's hooks and server may name the same program
        // in any order.
        let mut seen = std::collections::HashSet::new();
        found.retain(|p| seen.insert(p.clone()));
        out.extend(found.into_iter().map(|p| (rel.to_string(), p)));
    }
    out
}

/// The program of a `PROGRAM hook VERB` command, or of a server entry
/// whose arguments start with `mcp`, unquoted as [`hook_command`] quotes.
fn program_of(command: &str, args_start_with_mcp: bool) -> Option<String> {
    let program = match command.find(" hook ") {
        Some(at) => command[..at].trim(),
        None if args_start_with_mcp => command.trim(),
        None => return None,
    };
    let program = match program
        .strip_prefix('\'')
        .and_then(|p| p.strip_suffix('\''))
    {
        Some(inner) => inner.replace(r"'\''", "'"),
        // A hook the user wrapped (`bash -c '… rewind`): not ours to read.
        None if program.contains(char::is_whitespace) => return None,
        None => program.to_string(),
    };
    (!program.is_empty()).then_some(program)
}

fn json_programs(v: &Value, found: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(c)) = m.get("command") {
                let mcp = m
                    .get("args")
                    .and_then(|a| a.get(0))
                    .is_some_and(|a| a == "mcp");
                found.extend(program_of(c, mcp));
            }
            m.values().for_each(|v| json_programs(v, found));
        }
        Value::Array(a) => a.iter().for_each(|v| json_programs(v, found)),
        _ => {}
    }
}

fn toml_programs(item: &toml_edit::Item, found: &mut Vec<String>) {
    use toml_edit::Item;
    let table_like = match item {
        Item::Table(t) => Some(t as &dyn toml_edit::TableLike),
        Item::Value(toml_edit::Value::InlineTable(t)) => Some(t as &dyn toml_edit::TableLike),
        Item::ArrayOfTables(a) => {
            a.iter()
                .for_each(|t| toml_programs(&Item::Table(t.clone()), found));
            None
        }
        Item::Value(toml_edit::Value::Array(a)) => {
            for v in a.iter() {
                toml_programs(&Item::Value(v.clone()), found);
            }
            None
        }
        _ => None,
    };
    let Some(t) = table_like else {
        return;
    };
    if let Some(c) = t.get("command").and_then(Item::as_str) {
        let mcp = t
            .get("args")
            .and_then(Item::as_array)
            .and_then(|a| a.get(0))
            .and_then(|v| v.as_str())
            == Some("mcp");
        found.extend(program_of(c, mcp));
    }
    for (_, v) in t.iter() {
        toml_programs(v, found);
    }
}

/// Whether `program` (an absolute path, or a name looked up on this
/// PATH) is this very binary; `None` when it names nothing here.
pub(crate) fn runs_this_build(program: &str) -> Option<bool> {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .ok()?;
    let found = if program.contains('/') {
        Path::new(program).canonicalize().ok()
    } else {
        on_path(program)
            .find(|c| c.is_file())
            .and_then(|p| p.canonicalize().ok())
    }?;
    Some(found == me)
}
