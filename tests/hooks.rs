//! `rewind hook pre-tool-use|post-tool-use` on real Claude Code hook
//! payloads (tests/hooks/*.json, with `$CWD` standing for the workspace).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{rewind, rewind_json, snapshot, write};

const RULES: &str = r#"
[[effect]]
match = "Bash(git push*)"
kind = "push"

[[effect]]
match = "mcp__stripe__*"
kind = "payment"
key = "order_id"
"#;

fn payload(name: &str, cwd: &Path) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/hooks")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("$CWD", &cwd.display().to_string())
}

/// Run a hook as an agent does: payload on stdin, from some other cwd.
fn hook(event: &str, stdin: &str) -> Output {
    rewind_with_stdin(&["hook", event], stdin)
}

/// `rewind ARGS` from `/` with `stdin` as its input.
fn rewind_with_stdin(args: &[&str], stdin: &str) -> Output {
    rewind_with_stdin_env(args, stdin, &[]).1
}

/// [`rewind_with_stdin`] with `env` added; also the process id.
fn rewind_with_stdin_env(args: &[&str], stdin: &str, env: &[(&str, &Path)]) -> (u32, Output) {
    common::rewind_fed_pid(Path::new("/"), args, stdin.as_bytes(), env)
}

fn pre(name: &str, ws: &Path) -> Output {
    hook("pre-tool-use", &payload(name, ws))
}

/// A Bash call's payload: `command` run in `cwd`.
fn bash(command: &str, cwd: &Path) -> String {
    serde_json::json!({"tool_name": "Bash", "tool_input": {"command": command}, "cwd": cwd})
        .to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The hook refused the call (exit 2) saying `says`.
fn refused_saying(out: &Output, context: &str, says: &str) {
    assert_eq!(out.status.code(), Some(2), "{context}: {}", stderr(out));
    assert!(stderr(out).contains(says), "{context}: {}", stderr(out));
}

/// The status (`admitted`, `failed`, `succeeded`) of the workspace's first
/// effect.
fn first_effect_status(ws: &Path) -> serde_json::Value {
    rewind_json(ws, &["effects"])["effects"][0]["status"].clone()
}

/// Run a command a message told the user to paste, as pasted, in `ws`
/// (`rewind` standing for this build); it must succeed.
fn run_pasted(ws: &Path, command: &str) {
    let sh = Command::new("sh")
        .arg("-c")
        .arg(command.replacen("rewind", env!("CARGO_BIN_EXE_rewind"), 1))
        .current_dir(ws)
        .output()
        .expect("run the pasted command");
    assert!(sh.status.success(), "{command}: {}", stderr(&sh));
}

/// The `rewind effects resolve …` a refusal or a warning names.
fn resolve_command_in(err: &str) -> String {
    err.split('`')
        .find(|s| s.starts_with("rewind effects resolve"))
        .unwrap_or_else(|| panic!("no command in: {err}"))
        .to_string()
}

fn project(with_rules: bool) -> tempfile::TempDir {
    let dir = common::tmp();
    write(&dir.path().join("src/main.py"), b"print('v1')\n");
    write(&dir.path().join("src/lib/util.py"), b"X = 1\n");
    write(&dir.path().join("README.md"), b"v1\n");
    if with_rules {
        write(&dir.path().join("rewind.toml"), RULES.as_bytes());
    }
    rewind_json(dir.path(), &["init"]);
    dir
}

/// The keys `rewind effects` lists, in its order.
fn effect_keys(ws: &Path) -> Vec<String> {
    rewind_json(ws, &["effects"])["effects"]
        .as_array()
        .expect("effects")
        .iter()
        .filter_map(|e| e["key"].as_str().map(str::to_string))
        .collect()
}

/// A hook effect admitted under `key`, as an earlier build keyed it.
fn recorded_by_an_earlier_build(ws: &Path, key: &str, payload: &str) {
    let out = rewind(
        ws,
        &[
            "guard",
            "--scope",
            "hook",
            "--key",
            key,
            "--payload",
            payload,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

fn checkpoints(ws: &Path) -> Vec<serde_json::Value> {
    rewind_json(ws, &["list"])["checkpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn an_auto_checkpoint_before_bash_makes_its_damage_undoable() {
    let dir = project(false);
    let ws = dir.path();
    let before = snapshot(ws);
    let out = pre("bash_rm.json", ws);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cks = checkpoints(ws);
    assert_eq!(cks.len(), 1);
    assert_eq!(cks[0]["kind"], "hook");
    assert_eq!(cks[0]["label"], "before Bash: rm -rf src && echo cleaned");
    // The agent's command runs; the hook's checkpoint undoes it.
    let run = Command::new("sh")
        .args(["-c", "rm -rf src && echo cleaned"])
        .current_dir(ws)
        .output()
        .expect("run the command");
    assert!(run.status.success() && !ws.join("src").exists());
    let id = cks[0]["id"].as_str().expect("id");
    rewind_json(ws, &["rewind", id]);
    common::assert_same("after undoing the Bash call", &before, &snapshot(ws));
}

/// `REWIND_TRACE=/abs/path` sends a hook's phase timings to that file:
/// the agent reads the hook's stdout and stderr, so they stay as without
/// tracing, and each line names the process that wrote it.
#[test]
fn a_traced_hook_writes_its_phases_to_the_named_file_not_to_the_agent() {
    let dir = project(false);
    let ws = dir.path();
    let trace = common::tmp();
    let file = trace.path().join("trace.txt");
    let (pid, out) = rewind_with_stdin_env(
        &["hook", "pre-tool-use"],
        &payload("bash_rm.json", ws),
        &[("REWIND_TRACE", &file)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("trace:")
            && !String::from_utf8_lossy(&out.stdout).contains("trace:"),
        "trace lines reached the agent: {out:?}"
    );
    let text = std::fs::read_to_string(&file).expect("the trace file was written");
    let prefix = format!("trace: [{pid}] ");
    assert!(
        text.lines().all(|l| l.starts_with(&prefix)),
        "every line names the hook's pid {pid}:\n{text}"
    );
    assert!(
        text.contains(" ms  open ledger") && text.contains(" ms  total"),
        "the phases are there:\n{text}"
    );
    assert_eq!(checkpoints(ws).len(), 1, "the hook still checkpointed");
}

#[test]
fn write_and_edit_are_checkpointed_and_read_is_not() {
    let dir = project(false);
    let ws = dir.path();
    for (name, label) in [
        ("write.json", "before Write: src/main.py"),
        ("edit.json", "before Edit: README.md"),
    ] {
        let out = pre(name, ws);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let cks = checkpoints(ws);
        assert_eq!(cks.last().expect("a checkpoint")["label"], label, "{name}");
        // Change the tree as the tool would, so the next call has something new.
        write(
            &ws.join("src/main.py"),
            format!("print('{name}')\n").as_bytes(),
        );
    }
    let n = checkpoints(ws).len();
    let out = pre("read.json", ws);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(checkpoints(ws).len(), n, "Read took a checkpoint");
}

/// A file tool's label named its path from the payload's `cwd`, which can
/// be anywhere: `/tmp` gave `before Write: h77/mnt/proj/web/lib/util.js`
/// (helper-77). It is named from the workspace root, as `status` does.
#[test]
fn a_file_tools_label_names_its_path_from_the_workspace_root() {
    let dir = project(false);
    let ws = dir.path();
    for (i, cwd) in [std::path::PathBuf::from("/"), ws.join("src")]
        .iter()
        .enumerate()
    {
        write(&ws.join("src/lib/util.py"), format!("x = {i}\n").as_bytes());
        let stdin = serde_json::json!({
            "session_id": "s",
            "hook_event_name": "PreToolUse",
            "tool_name": "Write",
            "tool_input": {"file_path": ws.join("src/lib/util.py"), "content": "y"},
            "cwd": cwd,
        })
        .to_string();
        let out = hook("pre-tool-use", &stdin);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let cks = checkpoints(ws);
        assert_eq!(
            cks.last().expect("a checkpoint")["label"],
            "before Write: src/lib/util.py",
            "cwd {}",
            cwd.display()
        );
    }
}

/// `integrate gemini` installs these hooks; Gemini CLI's calls name its own
/// tools, and none of them took a checkpoint.
#[test]
fn gemini_clis_shell_and_file_tools_are_checkpointed() {
    let dir = project(false);
    let ws = dir.path();
    for (i, tool) in ["run_shell_command", "write_file", "replace"]
        .iter()
        .enumerate()
    {
        write(&ws.join("src/main.py"), format!("print({i})\n").as_bytes());
        let stdin = format!(
            r#"{{"hook_event_name":"BeforeTool","tool_name":"{tool}","tool_input":{{"command":"rm -rf build","file_path":"src/main.py"}},"cwd":"{}"}}"#,
            ws.display()
        );
        let out = hook("pre-tool-use", &stdin);
        assert_eq!(out.status.code(), Some(0), "{tool}: {}", stderr(&out));
        let cks = checkpoints(ws);
        assert_eq!(cks.len(), i + 1, "{tool}: no checkpoint");
    }
}

/// Codex edits files through `apply_patch` (the patch in
/// `tool_input.command`), which its hooks name as such: no checkpoint came
/// before any Codex edit (helper-33, D234).
#[test]
fn codexs_apply_patch_is_checkpointed() {
    let dir = project(false);
    let ws = dir.path();
    write(&ws.join("src/main.py"), b"print(2)\n");
    let stdin = format!(
        r#"{{"hook_event_name":"PreToolUse","tool_name":"apply_patch","tool_input":{{"command":"*** Begin Patch\n*** Update File: src/main.py\n@@\n-print(2)\n+print(3)\n*** End Patch\n"}},"cwd":"{}"}}"#,
        ws.display()
    );
    let out = hook("pre-tool-use", &stdin);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let cks = checkpoints(ws);
    assert_eq!(cks.len(), 1, "no checkpoint before apply_patch");
    let label = cks[0]["label"].as_str().unwrap_or_default();
    assert!(label.starts_with("before apply_patch: "), "{label}");
    assert!(!label.chars().any(char::is_control), "{label:?}");
}

/// The agent's shell may sit outside the project (`cd /tmp`): its calls
/// still change the project, so the hook falls back to the project the
/// agent was started in (`CLAUDE_PROJECT_DIR`), then to its own directory.
#[test]
fn a_call_from_outside_the_project_is_checkpointed_in_the_project() {
    let dir = project(false);
    let ws = dir.path();
    let stdin = r#"{"tool_name":"Bash","tool_input":{"command":"rm -rf build"},"cwd":"/tmp"}"#;
    let (_, out) = rewind_with_stdin_env(
        &["hook", "pre-tool-use"],
        stdin,
        &[("CLAUDE_PROJECT_DIR", ws)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(checkpoints(ws).len(), 1, "no checkpoint in the project");
    write(&ws.join("README.md"), b"v2\n");
    let out = common::rewind_fed(
        ws,
        &["hook", "pre-tool-use"],
        stdin.as_bytes(),
        &[] as &[(&str, &str)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        checkpoints(ws).len(),
        2,
        "the process's own directory is the last resort"
    );
}

/// The agent's shell removed the directory it was in (`rm -rf ../sub`
/// from inside it): the payload's `cwd` and the hook's own directory are
/// both gone, and no `CLAUDE_PROJECT_DIR` says where the project is (Codex
/// sets none). The hook judges the call by the nearest directory that
/// exists, inside the workspace, so the barrier still refuses the repeat.
/// Before, every push got exit 1, a non-blocking error: it ran unguarded.
#[test]
fn a_push_from_a_removed_directory_is_guarded_all_the_same() {
    let dir = project(true);
    let ws = dir.path();
    let sub = ws.join("sub");
    let payload = payload("bash_push.json", &sub);
    let run = || {
        std::fs::create_dir_all(&sub).expect("mkdir sub");
        let mut child = Command::new("sh")
            .args([
                "-c",
                "cd \"$1\" && rmdir \"$1\" && exec \"$2\" hook pre-tool-use",
            ])
            .arg("sh")
            .arg(&sub)
            .arg(env!("CARGO_BIN_EXE_rewind"))
            .env_remove("CLAUDE_PROJECT_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(payload.as_bytes())
            .expect("payload");
        child.wait_with_output().expect("hook")
    };
    let first = run();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let second = run();
    assert_eq!(
        second.status.code(),
        Some(2),
        "the repeat was not refused: {}",
        stderr(&second)
    );
    assert!(stderr(&second).contains("SPENT"), "{}", stderr(&second));
    assert_eq!(effect_keys(ws), ["Bash:git push origin main"]);
}

#[test]
fn a_matching_effect_is_admitted_once_then_refused_with_exit_2() {
    let dir = project(true);
    let ws = dir.path();
    for name in ["bash_push.json", "mcp_stripe.json"] {
        let first = pre(name, ws);
        assert_eq!(first.status.code(), Some(0), "{name}: {}", stderr(&first));
        let second = pre(name, ws);
        assert_eq!(second.status.code(), Some(2), "{name} was admitted twice");
        let err = stderr(&second);
        assert!(err.contains("SPENT"), "{name}: {err}");
    }
    // The same order with another amount is a different payload: refused too.
    let changed = payload("mcp_stripe.json", ws).replace("4200", "9900");
    let out = hook("pre-tool-use", &changed);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("PAYLOAD_MISMATCH"),
        "{}",
        stderr(&out)
    );
    let keys = effect_keys(ws);
    assert_eq!(
        keys,
        [
            "Bash:git push origin main",
            "mcp__stripe__create_payment_intent:ord_1234"
        ]
    );
}

#[test]
fn a_call_that_matches_no_rule_is_never_blocked() {
    let dir = project(true);
    let ws = dir.path();
    for _ in 0..3 {
        let out = pre("bash_npm_test.json", ws);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(
        rewind_json(ws, &["effects"])["effects"],
        serde_json::json!([])
    );
}

#[test]
fn a_failed_effect_may_be_retried_and_a_succeeded_one_may_not() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    let post = hook("post-tool-use", &payload("post_push_failed.json", ws));
    assert_eq!(post.status.code(), Some(0), "{}", stderr(&post));
    let retry = pre("bash_push.json", ws);
    assert_eq!(
        retry.status.code(),
        Some(0),
        "retry after failure refused: {}",
        stderr(&retry)
    );
    let post = hook("post-tool-use", &payload("post_push_ok.json", ws));
    assert_eq!(post.status.code(), Some(0), "{}", stderr(&post));
    let again = pre("bash_push.json", ws);
    assert_eq!(
        again.status.code(),
        Some(2),
        "a succeeded push was admitted again"
    );
}

/// Claude Code sends a call that failed (a command that exited non-zero
/// included) as `PostToolUseFailure`, never as `PostToolUse`: a failed push
/// recorded nothing, stayed spent, and its retry was refused.
#[test]
fn a_push_that_claude_code_reports_as_failed_may_be_retried() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    let post = hook(
        "post-tool-use-failure",
        &payload("post_push_failure.json", ws),
    );
    assert_eq!(post.status.code(), Some(0), "{}", stderr(&post));
    assert_eq!(first_effect_status(ws), "failed");
    let retry = pre("bash_push.json", ws);
    assert_eq!(
        retry.status.code(),
        Some(0),
        "retry after a PostToolUseFailure refused: {}",
        stderr(&retry)
    );
    // The same payload sent to `post-tool-use` (a hand-written config
    // mapping every post event there) is a failure too.
    let post = hook("post-tool-use", &payload("post_push_failure.json", ws));
    assert_eq!(post.status.code(), Some(0), "{}", stderr(&post));
    assert_eq!(first_effect_status(ws), "failed");
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
}

/// Gemini CLI reports a failed tool through `AfterTool`, the error beside
/// its output in `tool_response`: it was read as a success, and the retry
/// of a rejected push was refused for good (helper-53).
#[test]
fn a_push_that_gemini_cli_reports_as_failed_may_be_retried() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("gemini_push.json", ws).status.code(), Some(0));
    let post = hook("post-tool-use", &payload("gemini_push_failed.json", ws));
    assert_eq!(post.status.code(), Some(0), "{}", stderr(&post));
    assert_eq!(first_effect_status(ws), "failed");
    assert_eq!(pre("gemini_push.json", ws).status.code(), Some(0));
    // Its success (no `error`) keeps it spent.
    let ok = payload("gemini_push_failed.json", ws).replace(
        r#","error":{"message":"Command failed with exit code 1","type":"shell_execute_error"}"#,
        "",
    );
    assert!(!ok.contains("shell_execute_error"), "{ok}");
    assert_eq!(hook("post-tool-use", &ok).status.code(), Some(0));
    assert_eq!(first_effect_status(ws), "succeeded");
    assert_eq!(pre("gemini_push.json", ws).status.code(), Some(2));
}

/// A refusal says how a person opens the effect again when it did not
/// happen, whether its outcome was never reported (an MCP client has no
/// way to) or reported as a success, and the command runs as pasted.
#[test]
fn a_refusal_names_the_command_that_reopens_an_effect_that_did_not_happen() {
    let dir = project(true);
    let ws = dir.path();
    let fix = |refusal: &Output| {
        let err = stderr(refusal);
        assert_eq!(refusal.status.code(), Some(2), "{err}");
        resolve_command_in(&err)
    };
    // Never reported: `--outcome failed` is enough.
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    let unreported = fix(&pre("bash_push.json", ws));
    assert!(!unreported.contains("--reopen"), "{unreported}");
    // The agent's own shell may not run it: that is the user's call
    // (helper-54, D286); the push stays spent.
    let by_agent = serde_json::json!({
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": format!("cd {} && {unreported}", ws.display())},
        "cwd": ws,
    })
    .to_string();
    let refused = hook("pre-tool-use", &by_agent);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("the user's decision"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(2));
    run_pasted(ws, &unreported);
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    // Reported as a success: the person must say `--reopen`.
    let ok = hook("post-tool-use", &payload("post_push_ok.json", ws));
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let succeeded = fix(&pre("bash_push.json", ws));
    assert!(succeeded.contains(" --reopen "), "{succeeded}");
    run_pasted(ws, &succeeded);
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    // The same through `rewind guard`, the barrier's CLI, also for a
    // scope clap would read as an option and a key with a colon
    // (helper-54, helper-56).
    for effect in [
        r#"{"key":"charge-1","payload":"5"}"#,
        r#"{"scope":"-x","key":"a:b"}"#,
        r#"{"scope":"--scope","key":"-k"}"#,
    ] {
        let guard = ["guard", effect];
        assert_eq!(
            common::rewind(ws, &guard).status.code(),
            Some(0),
            "{effect}"
        );
        let refused = common::rewind(ws, &guard);
        run_pasted(ws, &fix(&refused));
        assert_eq!(
            common::rewind(ws, &guard).status.code(),
            Some(0),
            "{effect}"
        );
    }
    // A hook's key holds what the agent ran, U+202E included: shown
    // escaped, pasted as the bytes it is (helper-60). (`guard` refuses
    // such a key, D306.)
    let evil = serde_json::json!({"tool_name": "Bash", "tool_input": {"command": "git push origin evil\u{202e}gnp"}, "cwd": ws})
        .to_string();
    assert_eq!(hook("pre-tool-use", &evil).status.code(), Some(0));
    let refused = hook("pre-tool-use", &evil);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    run_pasted(ws, &fix(&refused));
    assert_eq!(hook("pre-tool-use", &evil).status.code(), Some(0));
}

/// A succeeded push stays spent: a failure reported afterwards by another
/// call (a refused retry's own failure event, an unrelated call) flipped it
/// to failed, and the next push was admitted (D108). A person may still
/// reopen it, saying so.
#[test]
fn a_succeeded_effect_is_not_reopened_by_a_later_failure() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    let ok = hook("post-tool-use", &payload("post_push_ok.json", ws));
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(first_effect_status(ws), "succeeded");
    let retry = payload("bash_push.json", ws).replace("STU2", "STU9");
    assert_eq!(hook("pre-tool-use", &retry).status.code(), Some(2));
    let refused_failure = payload("post_push_failure.json", ws).replace("STU2", "STU9");
    let out = hook("post-tool-use-failure", &refused_failure);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already succeeded"),
        "{}",
        stderr(&out)
    );
    // The same call's failure event (sent twice, or out of order) neither.
    let out = hook(
        "post-tool-use-failure",
        &payload("post_push_failure.json", ws),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(first_effect_status(ws), "succeeded");
    assert_eq!(
        hook("pre-tool-use", &retry).status.code(),
        Some(2),
        "a succeeded push was admitted again after a later failure"
    );
    let key = "hook:Bash:git push origin main";
    let out = common::rewind(ws, &["effects", "resolve", key, "--outcome", "failed"]);
    assert_eq!(out.status.code(), Some(1), "reopened without --reopen");
    assert!(stderr(&out).contains("--reopen"), "{}", stderr(&out));
    assert_eq!(first_effect_status(ws), "succeeded");
    // The command the error gives runs as pasted: the key is quoted
    // (helper-31, D214).
    run_pasted(ws, &resolve_command_in(&stderr(&out)));
    assert_eq!(first_effect_status(ws), "failed");
    assert_eq!(hook("pre-tool-use", &retry).status.code(), Some(0));
}

/// While a push is admitted and still running, the failure event of
/// another call for the same command (a retry the barrier refused) is not
/// its outcome: recording it let a third push through beside the first.
#[test]
fn only_the_admitted_call_resolves_a_running_effect() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    let other = payload("post_push_failure.json", ws).replace("STU2", "STU8");
    let out = hook("post-tool-use-failure", &other);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not its outcome"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        rewind_json(ws, &["effects"])["effects"][0]["status"],
        "admitted"
    );
    let third = payload("bash_push.json", ws).replace("STU2", "STU7");
    assert_eq!(hook("pre-tool-use", &third).status.code(), Some(2));
}

/// helper-83: a push admitted by a build from before the admitted call
/// was kept (its row has none) was reopened by the failure event of a
/// retry the barrier refused after an upgrade, and a third push went
/// through. Such a row takes a failure from no call; a person reopens it.
#[test]
fn a_push_admitted_without_its_call_is_not_reopened_by_another_calls_failure() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    rusqlite::Connection::open(ws.join(".rewind/ledger.db"))
        .expect("open ledger")
        .execute("UPDATE effects SET admitted_call = NULL", [])
        .expect("as an earlier build left it");
    let retry = payload("bash_push.json", ws).replace("STU2", "STU8");
    assert_eq!(hook("pre-tool-use", &retry).status.code(), Some(2));
    let failed = payload("post_push_failure.json", ws).replace("STU2", "STU8");
    let out = hook("post-tool-use-failure", &failed);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("kept no call"), "{}", stderr(&out));
    assert_eq!(first_effect_status(ws), "admitted");
    let third = payload("bash_push.json", ws).replace("STU2", "STU7");
    assert_eq!(
        hook("pre-tool-use", &third).status.code(),
        Some(2),
        "a push still running was admitted again"
    );
    // The command the message names reopens it.
    run_pasted(ws, &resolve_command_in(&stderr(&out)));
    assert_eq!(first_effect_status(ws), "failed");
}

/// helper-83: a push an earlier build admitted under its own key (the
/// whole line, before D301) whose failure is reported after the upgrade:
/// this build looked only under its key, found nothing, and dropped the
/// failure without a word, so the retry was refused. The outcome now
/// reaches the row under the former key.
#[test]
fn a_failure_reaches_a_push_an_earlier_build_admitted_under_its_whole_line() {
    let dir = project(true);
    let ws = dir.path();
    let line = "git push origin main 2>&1 | tail -3";
    let with_line = |file: &str| {
        let mut v: serde_json::Value =
            serde_json::from_str(&payload(file, ws)).expect("payload json");
        v["tool_input"]["command"] = serde_json::Value::from(line);
        v.to_string()
    };
    let pre_push = with_line("bash_push.json");
    assert_eq!(hook("pre-tool-use", &pre_push).status.code(), Some(0));
    let changed = rusqlite::Connection::open(ws.join(".rewind/ledger.db"))
        .expect("open ledger")
        .execute("UPDATE effects SET key = ?1", [format!("Bash:{line}")])
        .expect("as an earlier build keyed it");
    assert_eq!(changed, 1);
    let out = hook(
        "post-tool-use-failure",
        &with_line("post_push_failure.json"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(first_effect_status(ws), "failed", "{}", stderr(&out));
    // (The retry itself is not tried here: the row was renamed behind the
    // chain, which records the key an effect was admitted under, and the
    // barrier refuses a row the chain disagrees with.)
}

#[test]
fn a_broken_ledger_fails_closed_for_a_matching_rule_only() {
    let dir = project(true);
    let ws = dir.path();
    let ledger = ws.join(".rewind/ledger.db");
    assert!(ledger.exists(), "ledger path changed: update this test");
    std::fs::write(
        &ledger,
        b"this is not a SQLite database, it was overwritten",
    )
    .expect("corrupt");
    let _ = std::fs::remove_file(ws.join(".rewind/ledger.db-wal"));
    let out = pre("bash_push.json", ws);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a matching call ran without a ledger"
    );
    assert!(
        stderr(&out).contains("LEDGER_UNAVAILABLE"),
        "{}",
        stderr(&out)
    );
    // Not an effect: the hook reports the missing checkpoint but does not block.
    let out = pre("bash_npm_test.json", ws);
    assert_ne!(
        out.status.code(),
        Some(2),
        "a non-matching call was blocked"
    );
    assert!(stderr(&out).contains("no checkpoint"), "{}", stderr(&out));
}

/// With `.rewind/` gone (`git clean -x`), a push from the project root
/// was refused (no ledger to decide), but the same push from `src/`, or
/// from a shell outside the project with `CLAUDE_PROJECT_DIR` set, went
/// through again: only the `cwd`'s own `rewind.toml` was read (helper-33,
/// D229). A call no rule matches still runs.
#[test]
fn a_lost_ledger_fails_closed_from_every_directory_of_the_project() {
    let dir = project(true);
    let ws = dir.path();
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    std::fs::remove_dir_all(ws.join(".rewind")).expect("rm .rewind");
    let elsewhere = common::tmp();
    for (cwd, project_dir) in [
        (ws.to_path_buf(), None),
        (ws.join("src"), None),
        (ws.join("src/lib"), Some(ws)),
        (elsewhere.path().to_path_buf(), Some(ws)),
    ] {
        let env: Vec<(&str, &Path)> = project_dir
            .map(|p| ("CLAUDE_PROJECT_DIR", p))
            .into_iter()
            .collect();
        let push = payload("bash_push.json", &cwd);
        let (_, out) = rewind_with_stdin_env(&["hook", "pre-tool-use"], &push, &env);
        assert_eq!(
            out.status.code(),
            Some(2),
            "a push from {} ran again: {}",
            cwd.display(),
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("LEDGER_UNAVAILABLE"),
            "{}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(&ws.display().to_string()),
            "{}",
            stderr(&out)
        );
        let test = payload("bash_npm_test.json", &cwd);
        let (_, out) = rewind_with_stdin_env(&["hook", "pre-tool-use"], &test, &env);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert!(
        !ws.join(".rewind").exists(),
        "a refused hook made a workspace"
    );
}

#[test]
fn an_invalid_rewind_toml_fails_closed_naming_the_file() {
    let dir = project(false);
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[[effect]]\nmatch = \"Bash(git push*\"\n",
    );
    let out = pre("bash_npm_test.json", ws);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("rewind.toml") && err.contains("')'"), "{err}");
    assert!(
        checkpoints(ws).is_empty(),
        "a refused call took a checkpoint"
    );
    // As root a link is not followed (D160): the message says so and
    // what to do, not "Too many levels of symbolic links" (helper-33, D234).
    if common::is_root() {
        let shared = common::tmp();
        write(&shared.path().join("rules.toml"), RULES.as_bytes());
        std::fs::remove_file(ws.join("rewind.toml")).expect("rm");
        std::os::unix::fs::symlink(shared.path().join("rules.toml"), ws.join("rewind.toml"))
            .expect("symlink");
        let out = pre("bash_npm_test.json", ws);
        assert_eq!(out.status.code(), Some(2));
        let err = stderr(&out);
        assert!(
            err.contains("rewind.toml: is a symbolic link") && err.contains("put the file itself"),
            "{err}"
        );
    }
}

/// Rules written to `.rewind/rewind.toml` (beside the ledger) were never
/// read: the push they guard ran, every time, without a word. Now every
/// call is refused naming the file and where it belongs, as for a
/// rewind.toml that does not parse.
#[test]
fn rules_put_beside_the_ledger_fail_closed_naming_where_they_belong() {
    let dir = project(false);
    let ws = dir.path();
    write(&ws.join(".rewind/rewind.toml"), RULES.as_bytes());
    for call in ["bash_push.json", "bash_npm_test.json"] {
        let out = pre(call, ws);
        assert_eq!(out.status.code(), Some(2), "{call}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(".rewind/rewind.toml") && err.contains("belongs at the workspace root"),
            "{err}"
        );
    }
    std::fs::rename(ws.join(".rewind/rewind.toml"), ws.join("rewind.toml")).expect("move");
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    assert_eq!(
        pre("bash_push.json", ws).status.code(),
        Some(2),
        "the moved rules guard the push"
    );
}

#[test]
fn outside_a_workspace_hooks_do_nothing_unless_a_rule_matches() {
    let dir = common::tmp();
    let ws = dir.path();
    let out = pre("bash_rm.json", ws);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!ws.join(".rewind").exists(), "a hook created a workspace");
    write(&ws.join("rewind.toml"), RULES.as_bytes());
    let out = pre("bash_push.json", ws);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an effect ran with no ledger to record it"
    );
    assert!(stderr(&out).contains("rewind init"), "{}", stderr(&out));
}

#[test]
fn a_malformed_payload_is_reported_and_changes_nothing() {
    let dir = project(true);
    let ws = dir.path();
    for bad in ["", "not json", "{\"tool_input\": {}}", "[1,2]"] {
        let out = hook("pre-tool-use", bad);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("tool_name"),
            "{bad:?}: {}",
            stderr(&out)
        );
    }
    assert!(checkpoints(ws).is_empty());
}

#[test]
fn a_rewind_to_before_the_rules_existed_keeps_the_rules() {
    let dir = project(false);
    let ws = dir.path();
    let before = common::checkpoint_id(ws, &[]);
    write(&ws.join("rewind.toml"), RULES.as_bytes());
    assert_eq!(pre("bash_push.json", ws).status.code(), Some(0));
    rewind_json(ws, &["rewind", &before]);
    assert_eq!(
        std::fs::read_to_string(ws.join("rewind.toml")).expect("rules"),
        RULES
    );
    let again = pre("bash_push.json", ws);
    assert_eq!(
        again.status.code(),
        Some(2),
        "the rules were rewound away: {}",
        stderr(&again)
    );
}

/// Does FIEMAP still report data of `path` as delayed allocation (in the
/// page cache, not yet written back)?
fn delalloc(path: &Path) -> bool {
    let out = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .expect("run filefrag (e2fsprogs)");
    assert!(out.status.success(), "filefrag {}", path.display());
    String::from_utf8_lossy(&out.stdout).contains("delalloc")
}

/// A 256 KiB file `name` written in `dir` and not synced: it stays in
/// delayed allocation until something writes it back.
fn fresh_write(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, vec![7u8; 256 * 1024]).expect("write");
    p
}

/// Wait up to 5 s for `path` to be written back; `what` says who should
/// have done it.
fn wait_written_back(path: &Path, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while delalloc(path) {
        assert!(
            std::time::Instant::now() < deadline,
            "5 s {what} and the write is still not written back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn post_json(ws: &Path) -> serde_json::Value {
    let out = rewind_with_stdin(
        &["--json", "hook", "post-tool-use"],
        &payload("bash_npm_test.json", ws),
    );
    assert!(
        out.status.success(),
        "post-tool-use failed: {}",
        stderr(&out)
    );
    serde_json::from_slice(&out.stdout).expect("post-tool-use JSON")
}

/// D72: on the btrfs engine, post-tool-use after a tool that may write
/// starts a background writeback, so what the tool left in the page cache
/// is committed while the model thinks, not by the next checkpoint's
/// snapshot (or the kernel's commit 30 s later). The walk engine, whose
/// checkpoints do not commit the filesystem, starts none.
#[test]
fn post_tool_use_writes_back_a_btrfs_engine_workspace_in_the_background() {
    let Some(btrfs) = common::LoopFs::new(common::Fs::Btrfs, 512) else {
        return;
    };
    let sub = btrfs.subvolume("sub");
    rewind_json(&sub, &["init"]);
    let doctor = rewind_json(&sub, &["doctor"]);
    assert_eq!(doctor["hook_writeback"], true, "doctor says so: {doctor}");
    rewind_json(&sub, &["checkpoint"]);
    let fresh = fresh_write(&sub, "fresh.bin");
    assert!(
        delalloc(&fresh),
        "precondition: the write is still in the page cache"
    );
    let v = post_json(&sub);
    assert_eq!(v["writeback"], true, "{v}");
    wait_written_back(&fresh, "after post-tool-use");

    let plain = btrfs.subdir("plain");
    rewind_json(&plain, &["init"]);
    let v = post_json(&plain);
    assert!(v.get("writeback").is_none(), "walk engine: {v}");
    let doctor = rewind_json(&plain, &["doctor"]);
    assert!(
        doctor.get("hook_writeback").is_none(),
        "walk engine: {doctor}"
    );
}

/// D75: `rewind mcp` sees the agent's calls, not its writes, so while it
/// runs on a btrfs engine workspace it writes back the filesystem once a
/// second: what the agent left in the page cache is committed before its
/// next `checkpoint` call, not by that call's snapshot. With
/// `REWIND_WRITEBACK=0` it does not.
#[test]
fn a_running_mcp_server_writes_back_a_btrfs_engine_workspace() {
    let Some(btrfs) = common::LoopFs::new(common::Fs::Btrfs, 512) else {
        return;
    };
    let sub = btrfs.subvolume("sub");
    rewind_json(&sub, &["init"]);
    rewind_json(&sub, &["checkpoint"]);
    let serve = |env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rewind"));
        c.arg("-C")
            .arg(&sub)
            .arg("mcp")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c.spawn().expect("start rewind mcp")
    };

    // The control: nothing else writes it back within seconds.
    let mut off = serve(&[("REWIND_WRITEBACK", "0")]);
    let kept = fresh_write(&sub, "kept.bin");
    assert!(
        delalloc(&kept),
        "precondition: the write is in the page cache"
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(delalloc(&kept), "REWIND_WRITEBACK=0: written back anyway");
    let _ = off.kill();
    let _ = off.wait();

    let mut on = serve(&[]);
    let written = fresh_write(&sub, "written.bin");
    wait_written_back(&written, "with `rewind mcp` running");
    let _ = on.kill();
    let _ = on.wait();
}

/// D129: the README's `Bash(git push*)` let `cd repo && git push …`,
/// `GIT_TRACE=1 git push …` and the argv form through, twice: the
/// barrier failed open for the way agents run the command; D153: so did
/// `timeout 60 git push`, `sudo -u deploy git push`, `if …; then git
/// push; fi` and `bash -c 'git push'`. Each is now admitted once and
/// refused the second time.
#[test]
fn a_push_inside_a_shell_line_is_guarded_like_a_bare_one() {
    let dir = project(true);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    for command in [
        serde_json::json!("cd repo && git push origin main"),
        serde_json::json!("GIT_TRACE=1 git push origin gt"),
        serde_json::json!(["git", "push", "origin", "dev"]),
        // D153: wrappers with options, keywords, `sh -c`.
        serde_json::json!("timeout 60 git push origin t1"),
        serde_json::json!("sudo -u deploy git push origin t2"),
        serde_json::json!("if true; then git push origin t3; fi"),
        serde_json::json!("bash -c 'git push origin t4'"),
        // D293: an argv whose shell runs the push.
        serde_json::json!(["bash", "-lc", "git push origin t5"]),
        serde_json::json!(["/bin/sh", "-c", "cd repo && git push origin t6"]),
    ] {
        let call =
            serde_json::json!({"tool_name": "Bash", "tool_input": {"command": command}, "cwd": ws});
        let first = hook("pre-tool-use", &call.to_string());
        assert_eq!(
            first.status.code(),
            Some(0),
            "{command}: {}",
            stderr(&first)
        );
        let again = hook("pre-tool-use", &call.to_string());
        assert_eq!(
            again.status.code(),
            Some(2),
            "{command}: {}",
            stderr(&again)
        );
    }
}

/// D210: the same push is the same effect whichever agent runs it. Its
/// key named the agent's shell tool (`Bash:` or `run_shell_command:`),
/// so a push Claude Code made, rewound past, was admitted again when
/// Gemini CLI ran it. A push an earlier build recorded under Gemini's
/// key is found too.
#[test]
fn a_push_from_one_agent_is_refused_from_another_after_a_rewind() {
    let dir = project(true);
    let ws = dir.path();
    let before = common::checkpoint_id(ws, &["before the push"]);
    let call = |tool: &str, branch: &str| {
        serde_json::json!({"tool_name": tool, "tool_input": {"command": format!("git push origin {branch}")}, "cwd": ws})
            .to_string()
    };
    let first = hook("pre-tool-use", &call("Bash", "main"));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    rewind_json(ws, &["rewind", &before]);
    let again = hook("pre-tool-use", &call("run_shell_command", "main"));
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("SPENT"), "{}", stderr(&again));
    // Recorded by an earlier build under Gemini's own key.
    recorded_by_an_earlier_build(
        ws,
        "run_shell_command:git push origin dev",
        "git push origin dev",
    );
    for tool in ["Bash", "run_shell_command"] {
        let out = hook("pre-tool-use", &call(tool, "dev"));
        assert_eq!(out.status.code(), Some(2), "{tool}: {}", stderr(&out));
    }
    assert_eq!(
        effect_keys(ws),
        [
            "Bash:git push origin main",
            "run_shell_command:git push origin dev"
        ]
    );
}

/// D293: a push an agent sent as argv (`["bash", "-lc", "git push …"]`)
/// was keyed and matched by its words joined bare, `bash -lc git push
/// …`, which runs no push: the second one went through. A push a build
/// before D293 recorded under that bare key stays spent, and the agent's
/// argv call of the reopening command is refused like its shell line.
#[test]
fn an_argv_push_is_the_same_effect_as_recorded_before_and_is_not_reopened_by_argv() {
    let dir = project(true);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    let call = |argv: serde_json::Value| {
        serde_json::json!({"tool_name": "Bash", "tool_input": {"command": argv}, "cwd": ws})
            .to_string()
    };
    let push = call(serde_json::json!(["bash", "-lc", "git push origin main"]));
    // Recorded by an earlier build, under the bare join.
    recorded_by_an_earlier_build(
        ws,
        "Bash:bash -lc git push origin main",
        "bash -lc git push origin main",
    );
    let again = hook("pre-tool-use", &push);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("SPENT"), "{}", stderr(&again));
    // One agent's argv and another's string of the same line are one
    // effect, payload and all (helper-60).
    let argv = hook(
        "pre-tool-use",
        &call(serde_json::json!(["bash", "-lc", "git push origin dev"])),
    );
    assert_eq!(argv.status.code(), Some(0), "{}", stderr(&argv));
    let line = hook(
        "pre-tool-use",
        &call(serde_json::json!("bash -lc 'git push origin dev'")),
    );
    assert_eq!(line.status.code(), Some(2), "{}", stderr(&line));
    assert!(stderr(&line).contains("SPENT ("), "{}", stderr(&line));
    for reopen in [
        serde_json::json!([
            "bash",
            "-lc",
            "rewind effects resolve --scope=hook --outcome failed -- k"
        ]),
        serde_json::json!([
            "rewind",
            "effects",
            "resolve",
            "--outcome",
            "failed",
            "--",
            "k"
        ]),
    ] {
        let refused = hook("pre-tool-use", &call(reopen.clone()));
        refused_saying(&refused, &reopen.to_string(), "the user's decision");
    }
}

/// D211: a payload whose side fields had another JSON type than the
/// hook expected (`"session_id": 123`, `"tool_use_id": 42`, `"cwd": 1`,
/// `"hook_event_name": 7`) was unreadable as a whole: exit 1, which
/// Claude Code takes as a non-blocking error, so the repeated push ran.
/// The tool and its input are plain: the push is refused.
#[test]
fn a_push_is_refused_whatever_type_the_payloads_side_fields_have() {
    let dir = project(true);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    let call = |extra: &str| {
        format!(
            r#"{{"tool_name":"Bash","tool_input":{{"command":"git push origin main"}},"cwd":{},{extra}}}"#,
            serde_json::json!(ws)
        )
    };
    let first = hook("pre-tool-use", &call(r#""session_id":"s1""#));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    for extra in [
        r#""session_id":123"#,
        r#""tool_use_id":42"#,
        r#""hook_event_name":7"#,
        r#""session_id":{"a":1},"tool_use_id":[1]"#,
    ] {
        let out = hook("pre-tool-use", &call(extra));
        assert_eq!(out.status.code(), Some(2), "{extra}: {}", stderr(&out));
    }
    // A `cwd` that is no path: the hook's own directory stands in.
    let p = r#"{"tool_name":"Bash","tool_input":{"command":"git push origin main"},"cwd":1}"#;
    let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["hook", "pre-tool-use"])
        .current_dir(ws)
        .env_remove("CLAUDE_PROJECT_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(p.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run the hook");
    assert_eq!(out.status.code(), Some(2), "cwd 1: {}", stderr(&out));
}

/// D215: in a workspace nested in the project (`rewind init` in
/// `vendor-lib/`), the project's rules did not apply: one `cd
/// vendor-lib` and every push was admitted, recorded nowhere. The
/// enclosing workspace's rules apply there, decided in its ledger, so a
/// push from either directory is the same effect.
#[test]
fn a_nested_workspace_is_guarded_by_the_projects_rules() {
    let dir = project(true);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    let nested = ws.join("vendor-lib");
    write(&nested.join("lib.rs"), b"// vendored\n");
    rewind_json(&nested, &["init"]);
    let call = |cwd: &Path, branch: &str| {
        serde_json::json!({"tool_name": "Bash", "tool_input": {"command": format!("git push origin {branch}")}, "cwd": cwd})
            .to_string()
    };
    assert_eq!(
        hook("pre-tool-use", &call(ws, "main")).status.code(),
        Some(0)
    );
    let again = hook("pre-tool-use", &call(&nested, "main"));
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    let first = hook("pre-tool-use", &call(&nested, "dev"));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let post = serde_json::json!({"tool_name": "Bash", "tool_input": {"command": "git push origin dev"}, "cwd": nested, "tool_response": {"exit_code": 0}})
        .to_string();
    assert_eq!(hook("post-tool-use", &post).status.code(), Some(0));
    let twice = hook("pre-tool-use", &call(ws, "dev"));
    assert_eq!(twice.status.code(), Some(2), "{}", stderr(&twice));
    assert_eq!(
        effect_keys(ws),
        ["Bash:git push origin main", "Bash:git push origin dev"]
    );
    let outcome = rewind_json(ws, &["effects"])["effects"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|e| e["key"] == "Bash:git push origin dev")
                .cloned()
        })
        .expect("the dev push");
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert!(
        effect_keys(&nested).is_empty(),
        "nothing in the nested ledger"
    );
}

/// D301: the effect is the push, not the line around it. An agent's
/// second `git push origin main 2>&1 | tail -3` went through: `2>&1` was
/// split at its `&`, and the key was the whole line, so another pipe
/// made another effect (helper-63). So did `npm publish 2>&1` past a
/// `Bash(npm publish)` rule.
#[test]
fn a_push_piped_or_redirected_is_the_same_push() {
    let dir = project(false);
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[[effect]]\nmatch = \"Bash(git push*)\"\n[[effect]]\nmatch = \"Bash(npm publish)\"\n",
    );
    rewind_json(ws, &["checkpoint"]);
    let call = |command: &str| bash(command, ws);
    for (first, again) in [
        (
            "git push origin main",
            "git push origin main 2>&1 | tail -3",
        ),
        (
            "git push origin dev 2>&1 | tail -5",
            "git push origin dev >/dev/null 2>&1",
        ),
        ("npm publish 2>&1", "npm publish &> publish.log"),
    ] {
        let out = hook("pre-tool-use", &call(first));
        assert_eq!(out.status.code(), Some(0), "{first}: {}", stderr(&out));
        let out = hook("pre-tool-use", &call(again));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{again} after {first}: {}",
            stderr(&out)
        );
    }
    let keys = effect_keys(ws);
    assert!(
        keys.iter().any(|k| k == "Bash:git push origin main"),
        "{keys:?}"
    );
}

/// D163: a hook's key is the whole command, and a 5 MB `git push` line
/// (a heredoc, a `-d` payload) grew the ledger by 5 MB at every decision.
/// Past 4 KiB the key is cut and named by its SHA-256: the same command
/// is still refused, one that differs only at its end is another effect,
/// and the ledger records kilobytes, not the command.
#[test]
fn a_huge_command_is_guarded_by_its_hash_without_storing_it() {
    let dir = project(true);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    let ledger_bytes = || -> u64 {
        ["ledger.db", "ledger.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(ws.join(".rewind").join(f)).ok())
            .map(|m| m.len())
            .sum()
    };
    let body = "A".repeat(2_000_000);
    let call = |tail: &str| {
        let command = format!("git push origin main -o '{body}{tail}'");
        serde_json::json!({"tool_name": "Bash", "tool_input": {"command": command}, "cwd": ws})
            .to_string()
    };
    let before = ledger_bytes();
    assert_eq!(hook("pre-tool-use", &call("1")).status.code(), Some(0));
    let again = hook("pre-tool-use", &call("1"));
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).len() < 1000, "{}", stderr(&again));
    let other = hook("pre-tool-use", &call("2"));
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
    let grown = ledger_bytes().saturating_sub(before);
    assert!(
        grown < 1_000_000,
        "three decisions on a 2 MB command grew the ledger by {grown} bytes"
    );
    let keys = effect_keys(ws);
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.len() < 400 && k.contains(" sha256:")),
        "{keys:?}"
    );
}

/// D296: `git clean -fdx` and `git stash -a` take ignored files, and
/// `.rewind/` is one (D80): an agent's routine clean deleted every
/// checkpoint, the hook's own for that call included (helper-58). The
/// hook refuses them naming the form that keeps the history, which real
/// git then runs, the history intact. D295: after `git stash -a` and
/// `pop`, which leave out `.rewind/`'s empty directories, every verb
/// works again.
#[test]
fn git_commands_that_would_delete_the_history_are_refused_with_a_safe_form() {
    let dir = project(false);
    let ws = dir.path();
    common::git(ws, &["init", "-q"]);
    common::git(ws, &["add", "src"]);
    common::git(ws, &["commit", "-qm", "init"]);
    write(&ws.join("build/out.o"), b"obj");
    write(&ws.join(".gitignore"), b"build/\n");
    rewind_json(ws, &["checkpoint"]);
    let call = |command: &str| bash(command, ws);
    for (command, instead) in [
        ("git clean -fdx", "git clean -fdx -- ':(exclude).rewind'"),
        // `-e` patterns join the ignore rules, which `-X` deletes
        // (helper-60).
        ("git clean -fdX", "git clean -fdX -- ':(exclude).rewind'"),
        ("git stash -a", "git stash push -a -- ':(exclude).rewind'"),
        // The form repeats the `cd` (helper-64).
        (
            "cd src && git stash -a",
            "cd src && git stash push -a -- ':(exclude)../.rewind'",
        ),
    ] {
        let refused = hook("pre-tool-use", &call(command));
        refused_saying(&refused, command, &format!("run `{instead}` instead"));
        let from = ws.to_path_buf();
        let suggested = format!("cd {} && {instead}", from.display());
        let ok = hook("pre-tool-use", &call(&suggested));
        assert_eq!(ok.status.code(), Some(0), "{instead}: {}", stderr(&ok));
        let run = Command::new("sh")
            .current_dir(&from)
            .args(["-c", instead])
            .output()
            .expect("sh");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(
            ws.join(".rewind/ledger.db").is_file(),
            "{instead} took the history"
        );
        assert!(!ws.join("build").exists(), "{instead} left build/");
        rewind_json(ws, &["verify"]);
        if command.contains("stash") {
            common::git(ws, &["stash", "pop", "-q"]);
        }
        write(&ws.join("build/out.o"), b"obj");
        write(&ws.join(".gitignore"), b"build/\n");
    }
    for harmless in [
        "git clean -fd",
        "git clean -fdx build",
        "cd src && git clean -fdx",
    ] {
        let out = hook("pre-tool-use", &call(harmless));
        assert!(out.status.success(), "{harmless}: {}", stderr(&out));
    }

    // What `git stash -a` and `pop` leave: `.rewind/` without its empty
    // directories.
    for empty in ["objects", "tmp"] {
        let path = ws.join(".rewind").join(empty);
        if std::fs::read_dir(&path).expect("ls").next().is_none() {
            std::fs::remove_dir(&path).expect("rmdir");
        }
    }
    write(&ws.join("src/main.py"), b"print('v2')\n");
    rewind_json(ws, &["status"]);
    rewind_json(ws, &["checkpoint"]);
    rewind_json(ws, &["verify", "--deep"]);
}

/// D300: an `rm` that would delete the history (`.rewind/`, a file in
/// it, a dotfile glob taking it) or the workspace holding it is refused:
/// nothing could bring either back. For the workspace itself the refusal
/// names a `find` that empties it and keeps the history, which the test
/// runs; a rewind then brings every file back. What leaves the history
/// alone (`rm -rf *`, `rm -rf src`) passes.
#[test]
fn rm_that_would_delete_the_history_is_refused_and_the_named_form_keeps_it() {
    let parent = common::tmp();
    let ws = parent.path().join("proj");
    write(&ws.join("src/main.py"), b"print('v1')\n");
    write(&ws.join(".env"), b"KEY=1\n");
    rewind(&ws, &["init"]);
    let before = rewind_json(&ws, &["checkpoint", "before"])["id"]
        .as_str()
        .expect("id")
        .to_string();
    let tree = snapshot(&ws);
    // A backup of the project, history and all (`cp -a . ../bak`).
    std::fs::create_dir_all(parent.path().join("bak/.rewind")).expect("mkdir bak");
    let call = bash;
    let root = ws.display().to_string();
    for (command, cwd) in [
        ("rm -rf .rewind", ws.clone()),
        ("rm -f .rewind/ledger.db", ws.clone()),
        ("rm -rf .[!.]* *", ws.clone()),
        ("cd src && rm -rf ../.rewind", ws.clone()),
        ("rm -rf proj", parent.path().to_path_buf()),
        (
            &format!("rm -rf '{root}'") as &str,
            Path::new("/").to_path_buf(),
        ),
        ("rm -rf \"$PWD\"", ws.clone()),
        // D310: a write over the ledger, its WAL or an object.
        ("truncate -s0 .rewind/ledger.db", ws.clone()),
        (": > .rewind/ledger.db-wal", ws.clone()),
        ("cd src && cp /dev/null ../.rewind/ledger.db", ws.clone()),
        (
            "cp ~/backup/ledger.db proj/.rewind/",
            parent.path().to_path_buf(),
        ),
        // Restoring a backup of the project, history and all, rolls the
        // history back (helper-67).
        ("cp -a ../bak/. .", ws.clone()),
        ("cp -r bak/.rewind proj/", parent.path().to_path_buf()),
    ] {
        let refused = hook("pre-tool-use", &call(command, &cwd));
        refused_saying(&refused, command, "history of every checkpoint");
    }
    // Through a symbolic link to the workspace (macOS's /tmp, a linked
    // home): every check let its command through (helper-64).
    let link = parent.path().join("link");
    std::os::unix::fs::symlink(&ws, &link).expect("ln -s");
    for command in ["rm -rf .rewind", "git clean -fdx", "rm -rf ../link/.rewind"] {
        let refused = hook("pre-tool-use", &call(command, &link));
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{command} from a link: {}",
            stderr(&refused)
        );
    }
    std::fs::remove_file(&link).expect("rm link");
    // The form the refusal names for the workspace root, run as shown.
    let refused = stderr(&hook("pre-tool-use", &call("rm -rf proj", parent.path())));
    let instead = refused
        .split("run `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("no form named: {refused}"));
    let ok = hook("pre-tool-use", &call(instead, parent.path()));
    assert_eq!(ok.status.code(), Some(0), "{instead}: {}", stderr(&ok));
    let run = Command::new("sh")
        .current_dir(parent.path())
        .args(["-c", instead])
        .output()
        .expect("sh");
    assert!(run.status.success(), "{}", stderr(&run));
    let left: Vec<_> = std::fs::read_dir(&ws)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, [".rewind"], "{instead} left {left:?}");
    rewind_json(&ws, &["rewind", &before]);
    assert_eq!(snapshot(&ws), tree, "the rewind after {instead}");
    for harmless in [
        "rm -rf *",
        "rm -rf src",
        "rm -f .env",
        "find . -name '*.pyc' -delete",
        "cp .rewind/ledger.db /tmp/ledger-copy.db 2>&1",
        "echo note > .rewind/tmp/x",
    ] {
        let out = hook("pre-tool-use", &call(harmless, &ws));
        assert!(out.status.success(), "{harmless}: {}", stderr(&out));
    }

    // `find -delete` and `rsync --delete`: the forms named, run by the
    // real tools, delete the rest and keep the history (helper-63).
    let empty = parent.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    for (command, gone) in [
        ("find . -name '*.db' -delete", "data/app.db"),
        ("find . -type f -size +1k -delete", "data/big.bin"),
        ("rsync -a --delete ../empty/ ./", "src/main.py"),
    ] {
        write(&ws.join("data/app.db"), b"sqlite");
        write(&ws.join("data/big.bin"), &[7u8; 4096]);
        write(&ws.join("src/main.py"), b"print('v1')\n");
        let refused = stderr(&hook("pre-tool-use", &call(command, &ws)));
        let instead = refused
            .split("run `")
            .nth(1)
            .and_then(|r| r.split('`').next())
            .unwrap_or_else(|| panic!("{command}: no form named: {refused}"));
        let ok = hook("pre-tool-use", &call(instead, &ws));
        assert_eq!(ok.status.code(), Some(0), "{instead}: {}", stderr(&ok));
        let run = Command::new("sh")
            .current_dir(&ws)
            .args(["-c", instead])
            .output()
            .expect("sh");
        assert!(run.status.success(), "{instead}: {}", stderr(&run));
        assert!(!ws.join(gone).exists(), "{instead} left {gone}");
        for kept in ["ledger.db", "ledger.db-wal", "objects"] {
            assert!(
                ws.join(".rewind").join(kept).exists(),
                "{instead} took {kept}"
            );
        }
        rewind_json(&ws, &["verify", "--deep"]);
    }
}

/// D307: a checkpoint that fails let the call run with exit 1, which
/// Claude Code shows only in verbose mode and never to the model
/// (helper-63). Claude Code now gets its own JSON: context for the model,
/// a message for the user, and in the default permission mode the
/// user's decision. Other agents keep exit 1.
#[test]
fn a_call_claude_code_would_run_without_a_checkpoint_is_said_to_the_model() {
    let dir = project(false);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint"]);
    let db = ws.join(".rewind/ledger.db");
    let mut bytes = std::fs::read(&db).expect("ledger");
    bytes[..100].fill(0x5a);
    std::fs::write(&db, &bytes).expect("damage");
    for side in ["ledger.db-wal", "ledger.db-shm"] {
        let _ = std::fs::remove_file(ws.join(".rewind").join(side));
    }
    let call = |extra: serde_json::Value| {
        let mut v = serde_json::json!({"tool_name": "Bash", "tool_input": {"command": "rm -rf src"}, "cwd": ws});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            v.extend(extra.clone());
        }
        v.to_string()
    };
    for (mode, asks) in [("default", true), ("bypassPermissions", false)] {
        let out = hook(
            "pre-tool-use",
            &call(serde_json::json!({"hook_event_name": "PreToolUse", "permission_mode": mode})),
        );
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("Claude Code JSON");
        let specific = &v["hookSpecificOutput"];
        assert_eq!(specific["hookEventName"], "PreToolUse", "{v}");
        assert!(
            specific["additionalContext"]
                .as_str()
                .is_some_and(|c| c.contains("cannot be undone")),
            "{v}"
        );
        assert!(v["systemMessage"].is_string(), "{v}");
        assert_eq!(specific["permissionDecision"] == "ask", asks, "{mode}: {v}");
    }
    // Another agent's payload: exit 1 as before, nothing on stdout.
    let out = hook("pre-tool-use", &call(serde_json::json!({})));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert!(ws.join("src").exists(), "the hook ran nothing");
}

/// D306: an agent's own `rewind gc --keep-last 2` after a bad turn
/// pruned the checkpoint from before the damage for good (helper-63).
/// Pruning past the policy is refused; a plain `gc` and a dry run pass.
#[test]
fn an_agent_may_not_prune_checkpoints_past_the_policy() {
    let dir = project(false);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint", "before"]);
    let call = |command: &str| bash(command, ws);
    for command in [
        "rewind gc --keep-last 1",
        "rewind gc --force --keep-within 0s",
    ] {
        let out = hook("pre-tool-use", &call(command));
        assert_eq!(out.status.code(), Some(2), "{command}: {}", stderr(&out));
        assert!(stderr(&out).contains("user's decision"), "{}", stderr(&out));
    }
    for command in ["rewind gc", "rewind gc --dry-run --keep-last 1"] {
        let out = hook("pre-tool-use", &call(command));
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
    }
}

/// D323: `rewind deinit --yes` deletes every checkpoint; run by the agent
/// it is refused, and the history stays. Its dry run passes.
#[test]
fn an_agent_may_not_delete_the_history_with_deinit() {
    let dir = project(false);
    let ws = dir.path();
    rewind_json(ws, &["checkpoint", "before"]);
    let out = hook("pre-tool-use", &bash("rewind deinit --yes", ws));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("user's decision"), "{}", stderr(&out));
    assert!(ws.join(".rewind").is_dir());
    let out = hook("pre-tool-use", &bash("rewind deinit --dry-run", ws));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// D296: an Edit is checkpointed in the workspace of the file it writes.
/// Sent from a shell in another workspace, it was checkpointed there, and
/// the edited workspace got nothing (helper-58).
#[test]
fn an_edit_is_checkpointed_in_the_workspace_of_its_file() {
    let a = project(false);
    let b = project(false);
    let file = a.path().join("src/main.py");
    let edit = serde_json::json!({
        "hook_event_name": "PreToolUse",
        "tool_name": "Edit",
        "tool_input": {"file_path": file, "old_string": "v1", "new_string": "v2"},
        "cwd": b.path(),
    })
    .to_string();
    let out = hook("pre-tool-use", &edit);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let hooked = |ws: &Path| {
        checkpoints(ws)
            .iter()
            .filter(|c| c["kind"] == "hook")
            .count()
    };
    assert_eq!(hooked(a.path()), 1, "{:?}", checkpoints(a.path()));
    assert_eq!(hooked(b.path()), 0, "{:?}", checkpoints(b.path()));
}

/// D312: the everyday rename, `grep -rl old . | xargs sed -i
/// 's/old/new/g'`, lists the history's WAL and objects (they hold the
/// project's text) and rewrote them: the ledger silently lost its newest
/// checkpoints, the one made for that very call included (helper-67). It
/// is refused, naming `--exclude-dir=.rewind`; the line with it, run by
/// the real tools, renames every file and leaves the history whole.
#[test]
fn a_rename_through_grep_and_sed_is_refused_until_its_listing_leaves_the_history_out() {
    let dir = common::tmp();
    let ws = dir.path().join("proj");
    for i in 0..4 {
        write(
            &ws.join(format!("src/m{i}.py")),
            format!("def oldname_{i}():\n    return 'oldname'\n").as_bytes(),
        );
    }
    rewind(&ws, &["init"]);
    for label in ["one", "two", "three"] {
        write(
            &ws.join("src/m0.py"),
            format!("# {label} oldname\n").as_bytes(),
        );
        rewind_json(&ws, &["checkpoint", label]);
    }
    let entries = rewind_json(&ws, &["verify"])["entries"].clone();
    let rename = "grep -rl oldname . | xargs sed -i 's/oldname/newname/g'";
    for (line, advice) in [
        (rename, "--exclude-dir=.rewind"),
        (
            "find . -type f | xargs sed -i 's/oldname/newname/g'",
            "! -path",
        ),
        (
            "sed -i 's/oldname/newname/g' $(grep -rl oldname .)",
            "--exclude-dir=.rewind",
        ),
    ] {
        let refused = hook("pre-tool-use", &bash(line, &ws));
        refused_saying(&refused, line, "history of every checkpoint");
        refused_saying(&refused, line, advice);
    }
    let fixed = "grep -rl --exclude-dir=.rewind oldname . | xargs sed -i 's/oldname/newname/g'";
    let ok = hook("pre-tool-use", &bash(fixed, &ws));
    assert_eq!(ok.status.code(), Some(0), "{fixed}: {}", stderr(&ok));
    let run = Command::new("sh")
        .current_dir(&ws)
        .args(["-c", fixed])
        .output()
        .expect("sh");
    assert!(run.status.success(), "{}", stderr(&run));
    for i in 0..4 {
        let text = std::fs::read_to_string(ws.join(format!("src/m{i}.py"))).expect("read");
        assert!(!text.contains("oldname"), "m{i}.py: {text}");
    }
    let after = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(after["ok"], true, "{after}");
    assert_eq!(after["entries"], entries, "{after}");
    // And the history still takes the rename back.
    rewind_json(&ws, &["rewind", "three"]);
    let back = std::fs::read_to_string(ws.join("src/m1.py")).expect("read");
    assert!(back.contains("oldname_1"), "{back}");
}

/// D316: an agent's shell outside every workspace (Codex and Cursor set
/// no `CLAUDE_PROJECT_DIR`) whose line `cd`s into one works on that one:
/// the call is checkpointed there, its effect rules apply, and a
/// deletion of its history is refused. Before, no workspace was in sight:
/// no checkpoint, a push admitted twice, and `cd ~/proj && git clean
/// -fdx` deleted proj's history. A `cd` inside a subshell moves only the
/// commands inside it: `(cd src && make) && git clean -fdx` ran the clean
/// at the top, where it takes the history, and passed as if in `src`.
#[test]
fn a_line_that_cds_into_a_workspace_is_checkpointed_and_judged_there() {
    let dir = project(true);
    let ws = dir.path();
    let outside = common::tmp();
    let from_outside = |line: &str| {
        common::rewind_fed(
            outside.path(),
            &["hook", "pre-tool-use"],
            bash(line, outside.path()).as_bytes(),
            &[] as &[(&str, &str)],
        )
    };
    let quoted = format!("'{}'", ws.display());

    let out = from_outside(&format!("cd {quoted} && rm -rf build"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        checkpoints(ws).len(),
        1,
        "checkpointed in the workspace cd'd into"
    );
    // A path in it named by an `rm` or a write (helper-71).
    write(&ws.join("README.md"), b"v2\n");
    let out = from_outside(&format!("rm -rf '{}'", ws.join("src/lib").display()));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        checkpoints(ws).len(),
        2,
        "checkpointed in the workspace an rm names"
    );

    let push = format!("cd {quoted} && git push origin main");
    let out = from_outside(&push);
    assert_eq!(out.status.code(), Some(0), "first push: {}", stderr(&out));
    refused_saying(&from_outside(&push), "the same push again", "already");

    for line in [
        format!("cd {quoted} && git clean -fdx"),
        format!("git -C {quoted} clean -fdx"),
        format!("(cd {quoted} && git clean -fdx)"),
        format!("env -C {quoted} git clean -fdx"),
        format!("cd {quoted} && rm -rf .rewind"),
    ] {
        refused_saying(&from_outside(&line), &line, "refused");
    }

    for line in [
        "(cd src && true) && git clean -fdx",
        "(cd src; true); rm -rf .rewind",
        "echo $(cd src && pwd); git clean -fdx",
    ] {
        refused_saying(&hook("pre-tool-use", &bash(line, ws)), line, "refused");
    }
    // Inside the subshell the clean is src's alone, and keeps the history.
    let out = hook("pre-tool-use", &bash("(cd src && git clean -fdx)", ws));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ws.join(".rewind/ledger.db").exists());
}

/// D317: an agent refused a second push may not take the rule away. Its
/// shell's `sed -i` of `rewind.toml`, an `rm` of it, and an Edit or Write
/// of it through the file tools are refused, the file unchanged; reading
/// it passes, and the push stays refused. A retention policy written in
/// by the agent would prune what `gc --keep-last` may not (D306).
#[test]
fn the_agent_may_not_change_the_rules_that_bind_it() {
    let dir = project(true);
    let ws = dir.path();
    let push = bash("git push origin main", ws);
    assert_eq!(hook("pre-tool-use", &push).status.code(), Some(0));
    refused_saying(&hook("pre-tool-use", &push), "the second push", "already");
    let rules = std::fs::read(ws.join("rewind.toml")).expect("rules");

    for line in [
        "sed -i '/git push/,+1d' rewind.toml",
        "rm -f rewind.toml",
        "mv rewind.toml rewind.toml.off",
        "printf '[retention]\\nkeep_last = 1\\n' >> rewind.toml",
    ] {
        refused_saying(
            &hook("pre-tool-use", &bash(line, ws)),
            line,
            "user's decision",
        );
    }
    let file = ws.join("rewind.toml");
    for (tool, input) in [
        (
            "Edit",
            serde_json::json!({"file_path": file, "old_string": "git push", "new_string": "git pull"}),
        ),
        (
            "Write",
            serde_json::json!({"file_path": "rewind.toml", "content": ""}),
        ),
    ] {
        let payload =
            serde_json::json!({"tool_name": tool, "tool_input": input, "cwd": ws}).to_string();
        refused_saying(&hook("pre-tool-use", &payload), tool, "rewind.toml");
    }
    assert_eq!(std::fs::read(&file).expect("rules"), rules, "unchanged");

    for line in ["cat rewind.toml", "cp rewind.toml /tmp/rules.bak.toml"] {
        let out = hook("pre-tool-use", &bash(line, ws));
        assert_eq!(out.status.code(), Some(0), "{line}: {}", stderr(&out));
    }
    let other = serde_json::json!({"tool_name": "Write", "tool_input": {"file_path": "src/rewind.toml", "content": "x"}, "cwd": ws}).to_string();
    assert_eq!(hook("pre-tool-use", &other).status.code(), Some(0));
    refused_saying(
        &hook("pre-tool-use", &push),
        "the push after all that",
        "already",
    );
}
