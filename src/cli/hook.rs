//! `rewind hook pre-tool-use|post-tool-use|post-tool-use-failure`: the agent hook protocol of
//! Claude Code and Codex. Hook JSON on stdin; exit 0 lets the call run,
//! exit 2 blocks it with the reason on stderr (shown to the model), exit 1
//! is a non-blocking error shown to the user. A call Claude Code sends
//! that runs without its checkpoint is answered in Claude Code's JSON
//! instead, so that the model learns it too (D307).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Ctx;
use crate::effects::{Decision, Resolution};
use crate::hooks::{Config, ToolCall};
use crate::workspace::Workspace;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    event: Event,
}

#[derive(clap::Subcommand, Debug, Clone, Copy)]
enum Event {
    /// Before a tool call: auto-checkpoint, and the effect barrier for
    /// calls matching an [[effect]] rule in rewind.toml
    PreToolUse,
    /// After a tool call: record whether a guarded effect succeeded or
    /// failed; on the btrfs engine, start writing back what the tool wrote
    PostToolUse,
    /// After a tool call that failed (Claude Code's PostToolUseFailure): a
    /// guarded effect is recorded as failed, so the agent may retry it
    PostToolUseFailure,
}

#[derive(Serialize, Default)]
struct Out {
    event: &'static str,
    tool: String,
    checkpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    effect: Option<Decision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resolved: Option<String>,
    /// post-tool-use started a background writeback (btrfs engine, D72).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    writeback: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

const BLOCK: i32 = 2;

pub fn run(ctx: &Ctx, args: Args) -> i32 {
    // Bytes, not a String: a payload that is not UTF-8 is a malformed
    // payload like any other, answered in JSON under `--json`.
    let mut text = Vec::new();
    let parsed = std::io::stdin()
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot read the hook payload on stdin: {e}"))
        .and_then(|_| {
            serde_json::from_slice::<ToolCall>(&text).map_err(|e| {
                format!(
                    "the hook payload is not the expected JSON ({e}); expected {{\"tool_name\": ..., \"tool_input\": {{...}}, \"cwd\": ...}}"
                )
            })
        });
    let call = match parsed {
        Ok(c) => c,
        // Not knowing the call, we cannot know a rule matches: report,
        // do not block.
        Err(message) => {
            if ctx.json {
                rewind_platform::stdout_line!("{}", super::json_error("USAGE", &message));
            }
            rewind_platform::stderr_line!("rewind hook: {message}");
            return 1;
        }
    };
    let start = match &ctx.dir {
        Some(_) => ctx.start_dir(),
        None => hook_start(ctx, &call),
    };
    // Where a shell call's line starts: its own `cwd`, which `start`
    // is not when that is outside every workspace (D300).
    let line_dir = call
        .cwd
        .as_deref()
        .map(|c| ctx.cwd.join(c))
        .unwrap_or_else(|| start.clone());
    let claude = call.hook_event_name.as_deref() == Some("PreToolUse");
    let ask = call.permission_mode.as_deref() == Some("default");
    let (out, code) = match args.event {
        Event::PreToolUse => pre(&start, &line_dir, call),
        Event::PostToolUse => post(&start, call, "post-tool-use"),
        Event::PostToolUseFailure => post(&start, call, "post-tool-use-failure"),
    };
    if let Some(w) = &out.warning {
        rewind_platform::stderr_line!("rewind hook: {w}");
    }
    // A checkpoint that failed (a full disk, a damaged ledger) let the
    // call run unprotected with exit 1, which Claude Code shows the user
    // only in verbose mode and the model never: the agent went on to
    // `rm -rf` with nothing to rewind to (helper-63, D307). Claude Code
    // is told in its own terms: the model reads why, the user sees it,
    // and where the user approves calls anyway, is asked.
    if code == 1
        && claude
        && !ctx.json
        && let Some(w) = out.warning.as_deref().filter(|_| out.checkpoint.is_none())
    {
        rewind_platform::stdout_line!("{}", unprotected_call(w, ask));
        return 0;
    }
    let _ = ctx.emit(&out, String::new);
    code
}

/// Claude Code's PreToolUse answer for a call that runs without a
/// checkpoint: context for the model, a message for the user, and with
/// `ask` the user's decision (D307).
fn unprotected_call(warning: &str, ask: bool) -> String {
    let why = warning
        .strip_prefix("no checkpoint before this call: ")
        .unwrap_or(warning);
    let reason = format!(
        "rewind took no checkpoint before this call, so it cannot be undone ({why}); fix that before anything destructive"
    );
    let mut specific = serde_json::json!({
        "hookEventName": "PreToolUse",
        "additionalContext": reason,
    });
    if ask {
        specific["permissionDecision"] = "ask".into();
        specific["permissionDecisionReason"] = reason.clone().into();
    }
    serde_json::json!({
        "systemMessage": reason,
        "hookSpecificOutput": specific,
    })
    .to_string()
}

/// Where a hook looks for its workspace: the file a file tool writes,
/// else the payload's `cwd` (where the command runs), else the project
/// the agent was started in (`CLAUDE_PROJECT_DIR`), else this process's
/// directory; the first that is in a workspace. An Edit of a file in
/// another workspace than the shell's checkpointed the shell's, and left
/// the edited one unprotected (helper-58, D296). A `cwd` outside the
/// project (the agent's shell in /tmp) took no checkpoint and skipped the
/// barrier. A `cwd` that is gone (the agent's shell removed it) is judged
/// by its nearest existing directory: it was inside the workspace, and
/// its rules still apply. Past the project, the directories the line
/// works in (`cd ~/proj && …` from /tmp, D316), then the paths its `rm`s
/// and writes name.
fn hook_start(ctx: &Ctx, call: &crate::hooks::ToolCall) -> PathBuf {
    let payload_cwd = call.cwd.as_deref().map(|c| ctx.cwd.join(c));
    let written = call.file_written().map(|f| {
        let base = payload_cwd.as_deref().unwrap_or(&ctx.cwd);
        // `..` by name, as the agent's tool resolves it (helper-60).
        super::nearest_existing(&rewind_platform::lexical(&base.join(f)))
    });
    let line = call.shell_line(payload_cwd.as_deref().unwrap_or(&ctx.cwd), &resolve_links);
    // What its `rm`s and writes name (`rm -rf ~/proj/src` from /tmp,
    // helper-71), where those are.
    let named = line
        .removed_paths()
        .into_iter()
        .map(|p| super::nearest_existing(&p));
    let candidates: Vec<PathBuf> = written
        .into_iter()
        .chain(payload_cwd.map(|c| super::nearest_existing(&c)))
        .chain(std::env::var_os("CLAUDE_PROJECT_DIR").map(PathBuf::from))
        .chain(line.dirs_worked_in())
        .chain(named)
        .chain(std::iter::once(ctx.start_dir()))
        .collect();
    candidates
        .iter()
        .find(|p| Workspace::discover(p).is_some())
        .or(candidates.first())
        .cloned()
        .unwrap_or_else(|| ctx.start_dir())
}

/// A call no rule of its own workspace matches, in a workspace nested in
/// another (`rewind init` in a subdirectory, D82): the enclosing
/// workspaces' rules, nearest first, still apply there. Without them,
/// one `cd vendor-lib` in the agent's shell let every push through
/// unrecorded (helper-31, D215). The request and the workspace whose
/// rule matched, which decides; an enclosing rule file that cannot be
/// read is an error (fail closed, as one's own is).
fn enclosing_effect(
    root: &Path,
    call: &crate::hooks::ToolCall,
) -> crate::error::Result<Option<(crate::effects::Request, PathBuf)>> {
    let mut inner = root.to_path_buf();
    while let Some(outer) = inner.parent().and_then(Workspace::discover) {
        if let Some((req, _)) = Config::load(&outer)?.effect(call) {
            return Ok(Some((req, outer)));
        }
        inner = outer;
    }
    Ok(None)
}

/// A call outside every workspace that a `rewind.toml` above `start`, or
/// above the agent's project (`CLAUDE_PROJECT_DIR`), has a rule for:
/// the workspace there lost its `.rewind/` (`git clean -x`, `rm -rf`),
/// and its rules still hold, so the call is refused (fail closed). Only
/// `start`'s own file was read: the same push from `src/` went through
/// again (helper-33, D229). The request and the directory of the rule
/// file that matched; one that cannot be read is an error.
fn orphan_effect(
    start: &Path,
    call: &crate::hooks::ToolCall,
) -> crate::error::Result<Option<(crate::effects::Request, PathBuf)>> {
    let project = std::env::var_os("CLAUDE_PROJECT_DIR").map(PathBuf::from);
    let dirs = start
        .ancestors()
        .skip(1)
        .chain(project.iter().flat_map(|p| p.ancestors()));
    let mut seen = std::collections::HashSet::new();
    // A link counts (as root it is refused, and so is the call).
    for dir in dirs.filter(|d| d.join(crate::hooks::CONFIG_FILE).symlink_metadata().is_ok()) {
        if seen.insert(dir.to_path_buf())
            && let Some((req, _)) = Config::load(dir)?.effect(call)
        {
            return Ok(Some((req, dir.to_path_buf())));
        }
    }
    Ok(None)
}

/// `path` as the filesystem means it (D300): see
/// [`rewind_platform::resolve_existing`].
fn resolve_links(path: &Path) -> PathBuf {
    rewind_platform::lexical(&rewind_platform::resolve_existing(path))
}

/// Where the workspace and its rewind.toml are, if anywhere.
fn locate(start: &Path) -> (PathBuf, Option<PathBuf>) {
    match Workspace::discover(start) {
        Some(root) => (root.clone(), Some(root)),
        None => (start.to_path_buf(), None),
    }
}

fn pre(start: &Path, line_dir: &Path, call: ToolCall) -> (Out, i32) {
    let mut out = Out {
        event: "pre-tool-use",
        tool: call.tool_name.clone(),
        ..Out::default()
    };
    // Wherever it runs, rules or none: the effect it reopens may be any
    // workspace's (D286).
    if call.reopens_an_effect() {
        rewind_platform::stderr_line!(
            "rewind: refused: reopening a guarded effect (`rewind effects resolve`) is the user's decision, not the agent's: if the effect really did not happen, ask the user to run that command in their own terminal"
        );
        return (out, BLOCK);
    }
    if call.runs_deinit() {
        rewind_platform::stderr_line!(
            "rewind: refused: `rewind deinit` deletes every checkpoint of the workspace for good; that is the user's decision, not the agent's: ask the user to run it in their own terminal if they mean it"
        );
        return (out, BLOCK);
    }
    if let Some(gc) = call.prunes_past_the_policy() {
        rewind_platform::stderr_line!(
            "rewind: refused: `{gc}` prunes checkpoints the retention policy keeps, and a pruned checkpoint cannot be rewound to; which history to give up is the user's decision, not the agent's: `rewind gc --dry-run` shows what a plain `rewind gc` (the configured policy) would free, or ask the user to run that command in their own terminal"
        );
        return (out, BLOCK);
    }
    let (config_root, workspace) = locate(start);
    let line = call.shell_line(line_dir, &resolve_links);
    // Where there is a history to lose (D296, D300): this workspace's,
    // the line's own, the project's, and any an `rm` names.
    let mut histories: Vec<PathBuf> = workspace
        .iter()
        .cloned()
        .chain(Workspace::discover(line_dir))
        .chain(
            std::env::var_os("CLAUDE_PROJECT_DIR").and_then(|p| Workspace::discover(Path::new(&p))),
        )
        .chain(
            line.removed_paths()
                .iter()
                .chain(&line.dirs_worked_in())
                .filter_map(|p| Workspace::discover(p)),
        )
        .map(|root| root.join(crate::capture::STATE_DIR))
        .collect();
    histories.sort();
    histories.dedup();
    if let Some(loss) = line.deletes_the_history(&histories) {
        rewind_platform::stderr_line!("rewind: refused: {loss}");
        return (out, BLOCK);
    }
    // The rules that bind the agent are the user's (D317).
    let rules: Vec<PathBuf> = histories
        .iter()
        .filter_map(|h| h.parent())
        .map(|root| root.join(crate::hooks::CONFIG_FILE))
        .collect();
    let edited = call
        .file_written()
        .map(|f| resolve_links(&line_dir.join(f)))
        .filter(|f| rules.contains(f))
        .map(|f| format!("{} {}", call.tool_name, f.display()));
    if let Some(runs) = edited.or_else(|| line.changes_the_rules(&rules)) {
        rewind_platform::stderr_line!(
            "rewind: refused: `{runs}` changes rewind.toml, which holds this workspace's effect rules and retention policy: which effects may run again and which checkpoints are kept is the user's decision, not the agent's; reading it is fine; ask the user to make this change in their own editor"
        );
        return (out, BLOCK);
    }
    // Root's server running its owner's hook (D151): not another
    // workspace's rules either.
    if let Some(Err(e)) = workspace.as_deref().map(crate::workspace::check_confined) {
        out.warning = Some(format!("no checkpoint before this call: {e}"));
        return (out, 0);
    }
    let config = match Config::load(&config_root) {
        Ok(c) => c,
        Err(e) => {
            // The rules cannot be read, so any call might be an effect: fail closed.
            rewind_platform::stderr_line!("rewind hook: refused, fail closed: {e}");
            return (out, BLOCK);
        }
    };
    let mut effect = config.effect(&call).map(|(req, _)| (req, None));
    if effect.is_none()
        && let Some(root) = &workspace
    {
        match enclosing_effect(root, &call) {
            Ok(found) => effect = found.map(|(req, outer)| (req, Some(outer))),
            Err(e) => {
                rewind_platform::stderr_line!("rewind hook: refused, fail closed: {e}");
                return (out, BLOCK);
            }
        }
    }
    let Some(root) = workspace else {
        let orphan = match effect {
            Some((req, _)) => Ok(Some((req, config_root.clone()))),
            None => orphan_effect(&config_root, &call),
        };
        return match orphan {
            Ok(Some((req, rules))) => {
                rewind_platform::stderr_line!(
                    "rewind: LEDGER_UNAVAILABLE ({}:{}): refused, fail closed: {} is not a rewind workspace; run `rewind init` there",
                    req.scope,
                    req.key,
                    rules.display()
                );
                (out, BLOCK)
            }
            Ok(None) => (out, 0),
            Err(e) => {
                rewind_platform::stderr_line!("rewind hook: refused, fail closed: {e}");
                (out, BLOCK)
            }
        };
    };
    let checkpoint = config.checkpoints(&call.tool_name);
    if !checkpoint && effect.is_none() {
        return (out, 0); // a read: nothing to save, nothing to guard
    }
    let mut open_error = String::new();
    let mut ws = match Workspace::open(&root, false) {
        Ok(ws) => Some(ws),
        Err(e) => {
            if checkpoint {
                out.warning = Some(format!("no checkpoint before this call: {e}"));
            }
            open_error = e.to_string();
            None
        }
    };
    // Checkpoint first: an admitted effect is then recorded against the
    // tree it was made from, which is what a later rewind compares with.
    if checkpoint && let Some(ws) = ws.as_mut() {
        match ws.checkpoint(Some(&call.label(&root)), "hook", true) {
            Ok(r) => out.checkpoint = Some(r.id),
            Err(e) => out.warning = Some(format!("no checkpoint before this call: {e}")),
        }
    }
    let Some((req, outer)) = effect else {
        let code = if out.warning.is_some() { 1 } else { 0 };
        return (out, code);
    };
    let decision = match outer {
        // Decided in the workspace whose rule matched, where the same
        // call from its own directory is recorded.
        Some(outer) => match Workspace::open(&outer, false) {
            Ok(mut ows) => super::guard::decide_in(&mut ows, &req),
            Err(e) => Decision::unavailable(&req, e.to_string()),
        },
        None => match ws.as_mut() {
            Some(ws) => super::guard::decide_in(ws, &req),
            None => Decision::unavailable(&req, open_error),
        },
    };
    let admitted = decision.code.admitted();
    if !admitted {
        rewind_platform::stderr_line!("{}", decision.refusal_line());
    }
    out.effect = Some(decision);
    (out, if admitted { 0 } else { BLOCK })
}

/// Record the outcome of a guarded effect, so a failed one may be retried
/// (RETRY_AFTER_FAILURE) and a succeeded one stays spent. After a tool
/// that checkpoints (it may have written), start the btrfs engine's
/// background writeback: the next pre-tool-use snapshot then finds the
/// writes committed instead of committing them itself (D72).
/// Under `post-tool-use-failure` the call failed whatever its payload says.
fn post(start: &Path, call: ToolCall, event: &'static str) -> (Out, i32) {
    let mut out = Out {
        event,
        tool: call.tool_name.clone(),
        ..Out::default()
    };
    let (config_root, workspace) = locate(start);
    if let Some(Err(_)) = workspace.as_deref().map(crate::workspace::check_confined) {
        return (out, 0);
    }
    let (Ok(config), Some(root)) = (Config::load(&config_root), workspace) else {
        return (out, 0);
    };
    if config.checkpoints(&call.tool_name) {
        out.writeback = crate::snapshot::spawn_writeback(&root);
    }
    let (req, guard_root) = match config.effect(&call) {
        Some((req, _)) => (req, root),
        None => match enclosing_effect(&root, &call) {
            Ok(Some(found)) => found,
            _ => return (out, 0),
        },
    };
    let failed = event == "post-tool-use-failure" || call.failed();
    let outcome = if failed { "failed" } else { "succeeded" };
    let call_id = call.tool_use_id.as_deref().filter(|c| !c.is_empty());
    let result = Workspace::open(&guard_root, false).and_then(|mut ws| {
        // An earlier build admitted the call under a key of its own (the
        // whole line before D301, the other agent's tool before D210):
        // its outcome goes there when this build's key holds nothing.
        // Found nowhere, a failure was dropped without a word, and the
        // push stayed spent (helper-83).
        for key in req.keys() {
            let r = ws
                .ledger_mut()
                .resolve_effect(&req.scope, key, outcome, call_id, false)?;
            if !matches!(r, Resolution::Unknown) {
                return Ok(r);
            }
        }
        Ok(Resolution::Unknown)
    });
    match result {
        Ok(Resolution::Recorded(_)) => out.resolved = Some(outcome.into()),
        Ok(Resolution::Refused(why)) => out.warning = Some(format!("not recorded: {why}")),
        Ok(Resolution::Unknown | Resolution::Unchanged) => {}
        Err(e) => {
            out.warning = Some(format!(
                "could not record that {}:{} {outcome}: {e}",
                req.scope, req.key
            ));
            return (out, 1);
        }
    }
    (out, 0)
}
