//! `rewind integrate AGENT`: merges, never clobbers, is idempotent, and
//! what it writes actually runs.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{rewind, rewind_json, write};
use serde_json::{Value, json};

const FILES: &[(&str, &[&str])] = &[
    ("claude", &[".mcp.json", ".claude/settings.json"]),
    ("codex", &[".codex/config.toml"]),
    ("gemini", &[".gemini/settings.json"]),
    ("cursor", &[".cursor/mcp.json"]),
];

fn files_of(agent: &str) -> &'static [&'static str] {
    FILES
        .iter()
        .find(|(a, _)| *a == agent)
        .map(|(_, f)| *f)
        .unwrap_or(&[])
}

fn read_all(ws: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    FILES
        .iter()
        .flat_map(|(_, f)| f.iter())
        .chain(&[".rewind/ignore"])
        .map(|f| (f.to_string(), std::fs::read(ws.join(f)).ok()))
        .collect()
}

fn json_file(ws: &Path, f: &str) -> Value {
    let text = std::fs::read_to_string(ws.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{f} is not valid JSON ({e}):\n{text}"))
}

fn toml_file(ws: &Path, f: &str) -> toml_edit::DocumentMut {
    let text = std::fs::read_to_string(ws.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    text.parse()
        .unwrap_or_else(|e| panic!("{f} is not valid TOML ({e}):\n{text}"))
}

fn integrate(ws: &Path, agent: &str, extra: &[&str]) -> Value {
    let mut args = vec!["integrate", agent, "--command", "rewind"];
    args.extend_from_slice(extra);
    rewind_json(ws, &args)
}

fn actions(out: &Value) -> Vec<String> {
    out["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            format!(
                "{} {}",
                f["path"].as_str().unwrap_or(""),
                f["action"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn on_an_empty_project_each_agent_gets_valid_config_and_a_second_run_is_a_no_op() {
    for (agent, files) in FILES {
        let dir = common::tmp();
        let ws = dir.path();
        let out = integrate(ws, agent, &[]);
        let want: Vec<String> = files.iter().map(|f| format!("{f} created")).collect();
        assert_eq!(actions(&out), want, "{agent}");
        let ignore = std::fs::read_to_string(ws.join(".rewind/ignore")).expect(".rewind/ignore");
        for f in *files {
            assert!(
                ignore.lines().any(|l| l == format!("/{f}")),
                "{agent}: {f} not ignored:\n{ignore}"
            );
        }
        assert!(ws.join(".rewind").is_dir(), "{agent}: no workspace");
        for f in *files {
            if f.ends_with(".toml") {
                let doc = toml_file(ws, f);
                assert_eq!(
                    doc["mcp_servers"]["rewind"]["command"].as_str(),
                    Some("rewind")
                );
                assert!(
                    doc.to_string().contains("rewind hook pre-tool-use"),
                    "{agent}"
                );
            } else {
                let v = json_file(ws, f);
                if f.ends_with("mcp.json") || *agent == "gemini" {
                    assert_eq!(
                        v["mcpServers"]["rewind"],
                        json!({"command": "rewind", "args": ["mcp"]}),
                        "{agent} {f}"
                    );
                }
                if f.contains("settings") {
                    let text = v["hooks"].to_string();
                    assert!(
                        text.contains("rewind hook pre-tool-use")
                            && text.contains("rewind hook post-tool-use"),
                        "{agent}: {text}"
                    );
                }
            }
        }
        let before = read_all(ws);
        let again = integrate(ws, agent, &[]);
        let want: Vec<String> = files.iter().map(|f| format!("{f} unchanged")).collect();
        assert_eq!(actions(&again), want, "{agent} second run");
        assert_eq!(
            read_all(ws),
            before,
            "{agent}: the second run changed bytes"
        );
    }
}

#[test]
fn the_users_settings_survive_and_the_merge_is_idempotent() {
    let dir = common::tmp();
    let ws = dir.path();
    let mcp = r#"{
  "mcpServers": {
    "github": {"command": "gh-mcp", "args": ["--stdio"], "env": {"TOKEN": "x"}}
  },
  "zzz_user_key": true
}"#;
    let settings = r#"{
  "permissions": {"allow": ["Bash(npm test)"], "deny": ["Read(./.env)"]},
  "model": "opus",
  "hooks": {
    "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./audit.sh"}]}]
  }
}"#;
    let codex = "# my codex settings\nmodel = \"gpt-5\"  # keep this comment\n\n[mcp_servers.docs]\ncommand = \"docs-mcp\"\n";
    let gemini = r#"{"theme": "Dracula", "mcpServers": {"fs": {"command": "fs-mcp"}}}"#;
    let cursor = r#"{"mcpServers": {"rewind": {"command": "old-rewind", "args": ["serve"], "env": {"A": "1"}}}}"#;
    write(&ws.join(".mcp.json"), mcp.as_bytes());
    write(&ws.join(".claude/settings.json"), settings.as_bytes());
    write(&ws.join(".codex/config.toml"), codex.as_bytes());
    write(&ws.join(".gemini/settings.json"), gemini.as_bytes());
    write(&ws.join(".cursor/mcp.json"), cursor.as_bytes());
    for (agent, files) in FILES {
        let out = integrate(ws, agent, &[]);
        let got = actions(&out);
        let want: Vec<String> = files.iter().map(|f| format!("{f} updated")).collect();
        assert_eq!(got[..files.len()], want[..], "{agent}");
    }
    let m = json_file(ws, ".mcp.json");
    assert_eq!(
        m["mcpServers"]["github"],
        json!({"command": "gh-mcp", "args": ["--stdio"], "env": {"TOKEN": "x"}})
    );
    assert_eq!(m["zzz_user_key"], json!(true));
    let keys: Vec<&String> = m.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["mcpServers", "zzz_user_key"],
        "key order was not kept"
    );
    let s = json_file(ws, ".claude/settings.json");
    assert_eq!(
        s["permissions"],
        json!({"allow": ["Bash(npm test)"], "deny": ["Read(./.env)"]})
    );
    assert_eq!(s["model"], json!("opus"));
    let pre = s["hooks"]["PreToolUse"].as_array().expect("PreToolUse");
    assert_eq!(
        pre.len(),
        2,
        "the user's hook must stay, ours added: {pre:?}"
    );
    assert_eq!(pre[0]["hooks"][0]["command"], json!("./audit.sh"));
    let c = std::fs::read_to_string(ws.join(".codex/config.toml")).expect("codex");
    assert!(
        c.starts_with("# my codex settings\nmodel = \"gpt-5\"  # keep this comment\n"),
        "{c}"
    );
    let doc = toml_file(ws, ".codex/config.toml");
    assert_eq!(
        doc["mcp_servers"]["docs"]["command"].as_str(),
        Some("docs-mcp")
    );
    assert_eq!(
        doc["mcp_servers"]["rewind"]["command"].as_str(),
        Some("rewind")
    );
    let g = json_file(ws, ".gemini/settings.json");
    assert_eq!(g["theme"], json!("Dracula"));
    assert_eq!(g["mcpServers"]["fs"], json!({"command": "fs-mcp"}));
    assert!(
        g["hooks"]["BeforeTool"]
            .to_string()
            .contains("hook pre-tool-use")
    );
    let cu = json_file(ws, ".cursor/mcp.json");
    assert_eq!(
        cu["mcpServers"]["rewind"],
        json!({"command": "rewind", "args": ["mcp"], "env": {"A": "1"}}),
        "our entry is refreshed, the user's env kept"
    );

    let before = read_all(ws);
    for (agent, _) in FILES {
        let out = integrate(ws, agent, &[]);
        assert!(
            actions(&out).iter().all(|a| a.ends_with(" unchanged")),
            "{agent}: {out}"
        );
    }
    assert_eq!(read_all(ws), before);

    // The user's own arguments to our server (a profile) survive a rerun;
    // they were reset to `["mcp"]` (helper-24).
    let mut m = json_file(ws, ".mcp.json");
    m["mcpServers"]["rewind"]["args"] = json!(["mcp", "--profile", "lean"]);
    write(&ws.join(".mcp.json"), m.to_string().as_bytes());
    let mut doc = toml_file(ws, ".codex/config.toml");
    let mut args = toml_edit::Array::new();
    for a in ["mcp", "--profile", "recovery"] {
        args.push(a);
    }
    doc["mcp_servers"]["rewind"]["args"] = toml_edit::value(args);
    write(&ws.join(".codex/config.toml"), doc.to_string().as_bytes());
    let before = read_all(ws);
    for agent in ["claude", "codex"] {
        let out = integrate(ws, agent, &[]);
        assert!(
            actions(&out).iter().all(|a| a.ends_with(" unchanged")),
            "{agent}: {out}"
        );
    }
    assert_eq!(read_all(ws), before);
    assert_eq!(
        json_file(ws, ".mcp.json")["mcpServers"]["rewind"]["args"],
        json!(["mcp", "--profile", "lean"])
    );
}

#[test]
fn dry_run_shows_a_diff_and_writes_nothing() {
    let dir = common::tmp();
    let ws = dir.path();
    write(&ws.join(".mcp.json"), br#"{"mcpServers": {}}"#);
    let before = read_all(ws);
    let out = rewind(
        ws,
        &["integrate", "claude", "--dry-run", "--command", "rewind"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--- a/.mcp.json") && text.contains("+++ b/.mcp.json"),
        "{text}"
    );
    assert!(text.contains("+    \"rewind\": {"), "{text}");
    assert!(text.contains("+++ b/.claude/settings.json"), "{text}");
    assert_eq!(read_all(ws), before, "dry run wrote files");
    assert!(
        !ws.join(".rewind").exists(),
        "dry run created the workspace"
    );
}

#[test]
fn a_config_file_that_does_not_parse_is_named_and_nothing_is_written() {
    for (agent, file, junk) in [
        ("claude", ".claude/settings.json", "{\"hooks\": [1, 2"),
        (
            "claude",
            ".claude/settings.json",
            "{\"hooks\": {\"PreToolUse\": {}}}",
        ),
        ("codex", ".codex/config.toml", "[mcp_servers\nx = "),
        ("gemini", ".gemini/settings.json", "[]"),
    ] {
        let dir = common::tmp();
        let ws = dir.path();
        write(&ws.join(file), junk.as_bytes());
        let before = read_all(ws);
        let out = rewind(ws, &["integrate", agent, "--command", "rewind"]);
        assert_eq!(out.status.code(), Some(1), "{agent} {junk}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(file) && err.contains("nothing was changed"),
            "{agent} {junk}: {err}"
        );
        assert_eq!(
            read_all(ws),
            before,
            "{agent}: files written despite the error"
        );
    }
    let _ = files_of("claude");
}

#[test]
fn the_hook_command_written_for_claude_runs_and_checkpoints() {
    let dir = common::tmp();
    let ws = dir.path();
    write(&ws.join("a.txt"), b"a\n");
    let bin = env!("CARGO_BIN_EXE_rewind");
    rewind_json(ws, &["integrate", "claude", "--command", bin]);
    let s = json_file(ws, ".claude/settings.json");
    let group = &s["hooks"]["PreToolUse"][0];
    assert_eq!(group["matcher"], json!("*"));
    let cmd = group["hooks"][0]["command"]
        .as_str()
        .expect("command")
        .to_string();
    let payload = json!({"cwd": ws, "tool_name": "Bash", "tool_input": {"command": "rm a.txt"}, "session_id": "s", "tool_use_id": "t"});
    let mut child = Command::new("sh")
        .args(["-c", &cmd])
        .current_dir(ws)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the hook command");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(payload.to_string().as_bytes())
        .expect("payload");
    let out = child.wait_with_output().expect("hook");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = rewind_json(ws, &["list"]);
    assert_eq!(
        list["checkpoints"][0]["label"],
        json!("before Bash: rm a.txt")
    );
    let m = json_file(ws, ".mcp.json");
    assert_eq!(m["mcpServers"]["rewind"]["command"], json!(bin));
}

/// Runs `command` as the agent would (`sh -c`, payload on stdin).
fn run_hook(ws: &Path, command: &str, payload: &Value) -> std::process::Output {
    let mut child = Command::new("sh")
        .args(["-c", command])
        .current_dir(ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the hook command");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(payload.to_string().as_bytes())
        .expect("payload");
    child.wait_with_output().expect("hook")
}

/// The commands of every hook registered for `event` in Claude's settings.
fn claude_hooks(ws: &Path, event: &str) -> Vec<String> {
    json_file(ws, ".claude/settings.json")["hooks"][event]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["hooks"].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h["command"].as_str().map(str::to_string))
        .collect()
}

/// A failed push reaches Claude Code's `PostToolUseFailure` hook only;
/// integrate registers it, so the effect is recorded as failed and the
/// agent's retry is admitted.
#[test]
fn the_failure_hook_claude_code_sends_failed_calls_to_is_installed_and_runs() {
    let dir = common::tmp();
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[[effect]]\nmatch = \"Bash(git push*)\"\n",
    );
    let bin = env!("CARGO_BIN_EXE_rewind");
    rewind_json(ws, &["integrate", "claude", "--command", bin]);
    let [pre] = &claude_hooks(ws, "PreToolUse")[..] else {
        panic!("one PreToolUse hook expected");
    };
    let [failure] = &claude_hooks(ws, "PostToolUseFailure")[..] else {
        panic!("one PostToolUseFailure hook expected");
    };
    let call =
        json!({"cwd": ws, "tool_name": "Bash", "tool_input": {"command": "git push origin main"}});
    let out = run_hook(ws, pre, &call);
    assert!(
        out.status.success(),
        "{pre}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut failed = call.clone();
    failed["hook_event_name"] = json!("PostToolUseFailure");
    failed["error"] = json!("Command exited with non-zero status code 128");
    let out = run_hook(ws, failure, &failed);
    assert!(
        out.status.success(),
        "{failure}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        rewind_json(ws, &["effects"])["effects"][0]["status"],
        json!("failed")
    );
    let out = run_hook(ws, pre, &call);
    assert!(
        out.status.success(),
        "the retry of a failed push was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A binary path with spaces and a `'` is one shell word in the hook
/// command: the quoting broke on the `'`, and the hook never ran.
#[test]
fn a_command_path_with_a_quote_and_spaces_runs_through_the_shell() {
    let dir = common::tmp();
    let ws = dir.path();
    write(&ws.join("a.txt"), b"a\n");
    let bin_dir = common::tmp();
    let odd = bin_dir.path().join("it's a \"dir\" $HOME");
    std::fs::create_dir_all(&odd).expect("mkdir");
    let link = odd.join("rewind");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rewind"), &link).expect("symlink");
    let link = link.to_str().expect("utf-8");
    rewind_json(ws, &["integrate", "claude", "--command", link]);
    let [pre] = &claude_hooks(ws, "PreToolUse")[..] else {
        panic!("one PreToolUse hook expected");
    };
    let call = json!({"cwd": ws, "tool_name": "Bash", "tool_input": {"command": "rm a.txt"}});
    let out = run_hook(ws, pre, &call);
    assert!(
        out.status.success(),
        "{pre}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        rewind_json(ws, &["list"])["checkpoints"][0]["label"],
        json!("before Bash: rm a.txt")
    );
}

/// D197: a `--command` no agent could start (a typo, a binary not built
/// yet) is said, with the file still written (the config may be meant
/// for another machine); the real binary draws no word.
#[test]
fn a_command_the_agent_could_not_start_is_warned_about() {
    let dir = common::tmp();
    let ws = dir.path();
    for (cmd, warned) in [
        (
            "/nonexistent/bin/rewind",
            Some("is not an executable file here"),
        ),
        ("bin/rewind", Some("is a relative path")),
        (
            "no-such-rewind-binary",
            Some("is not an executable on this PATH"),
        ),
        (env!("CARGO_BIN_EXE_rewind"), None),
    ] {
        let out = rewind_json(ws, &["integrate", "claude", "--command", cmd]);
        let notes = out["notes"].to_string();
        match warned {
            Some(w) => assert!(
                notes.contains(w) && notes.contains("unguarded"),
                "{cmd}: {out}"
            ),
            None => assert!(!notes.contains("--command"), "{cmd}: {out}"),
        }
        assert!(
            claude_hooks(ws, "PreToolUse")
                .iter()
                .any(|h| h.contains(cmd)),
            "{cmd}: written anyway"
        );
    }
}

/// An empty `--command` would install hooks that run nothing: a usage
/// error, and no file is written (helper-29, D207).
#[test]
fn an_empty_command_is_refused_and_writes_nothing() {
    let dir = common::tmp();
    let ws = dir.path();
    for cmd in ["", "  "] {
        let out = rewind(ws, &["--json", "integrate", "claude", "--command", cmd]);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {out:?}");
        let err: Value = serde_json::from_slice(&out.stdout).expect("json error");
        assert_eq!(err["error"]["code"], "USAGE", "{err}");
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--command is empty")),
            "{err}"
        );
        assert!(!ws.join(".mcp.json").exists(), "{cmd:?}");
        assert!(!ws.join(".claude").exists(), "{cmd:?}");
        assert!(!ws.join(".rewind").exists(), "{cmd:?}");
    }
}

/// Re-running with another `--command` (the binary moved) points the hooks
/// integrate installed at it instead of leaving them on the old path; a
/// hook the user wrapped around `rewind hook` is theirs and kept.
#[test]
fn a_rerun_with_a_new_command_moves_our_hooks_and_keeps_wrapped_ones() {
    let dir = common::tmp();
    let ws = dir.path();
    let wrapped = "cd sub && rewind hook post-tool-use --quiet";
    write(
        &ws.join(".claude/settings.json"),
        json!({"hooks": {"PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": wrapped}]}]}})
            .to_string()
            .as_bytes(),
    );
    rewind_json(ws, &["integrate", "claude", "--command", "/old/bin/rewind"]);
    rewind_json(
        ws,
        &["integrate", "claude", "--command", "/new path/rewind"],
    );
    assert_eq!(
        claude_hooks(ws, "PreToolUse"),
        ["'/new path/rewind' hook pre-tool-use"]
    );
    assert_eq!(claude_hooks(ws, "PostToolUse"), [wrapped]);
    assert_eq!(
        claude_hooks(ws, "PostToolUseFailure"),
        ["'/new path/rewind' hook post-tool-use-failure"]
    );
    let codex = |ws: &Path| {
        toml_file(ws, ".codex/config.toml")["hooks"]["PreToolUse"]
            .as_array_of_tables()
            .expect("hooks")
            .iter()
            .flat_map(|g| g["hooks"].as_array_of_tables().expect("inner").iter())
            .map(|h| h["command"].as_str().expect("command").to_string())
            .collect::<Vec<_>>()
    };
    rewind_json(ws, &["integrate", "codex", "--command", "/old/bin/rewind"]);
    rewind_json(ws, &["integrate", "codex", "--command", "/new/bin/rewind"]);
    assert_eq!(codex(ws), ["/new/bin/rewind hook pre-tool-use"]);
}

/// `integrate claude` (this build as the command) over settings holding
/// one `PreToolUse` hook, `command` under `matcher`.
fn integrate_over_pre_hook(ws: &Path, matcher: &str, command: &str) -> Value {
    write(
        &ws.join(".claude/settings.json"),
        json!({"hooks": {"PreToolUse": [{"matcher": matcher, "hooks": [{"type": "command", "command": command}]}]}})
            .to_string()
            .as_bytes(),
    );
    rewind_json(
        ws,
        &[
            "integrate",
            "claude",
            "--command",
            env!("CARGO_BIN_EXE_rewind"),
        ],
    )
}

/// A wrapped hook is kept as the user wrote it, so a rerun after the
/// binary moved leaves it on the old path: it then fails on every call
/// (exit 127), which the agent does not treat as a block, and every push
/// runs unguarded. Integrate said "updated" and nothing else (helper-33,
/// D232); it now names the hook and the binary it cannot start. A
/// wrapped hook whose binary is there draws no note.
#[test]
fn a_wrapped_hook_whose_binary_is_gone_is_named() {
    let dir = common::tmp();
    let ws = dir.path();
    let live = env!("CARGO_BIN_EXE_rewind");
    let dead = "timeout 10 /old/bin/rewind hook pre-tool-use";
    for (wrapped, noted) in [
        (dead.to_string(), true),
        (format!("timeout 10 '{live}' hook pre-tool-use"), false),
    ] {
        let v = integrate_over_pre_hook(ws, "Bash", &wrapped);
        assert_eq!(
            claude_hooks(ws, "PreToolUse"),
            [wrapped.as_str()],
            "kept as written"
        );
        let notes = v["notes"].to_string();
        assert_eq!(
            notes.contains("/old/bin/rewind") && notes.contains("unguarded"),
            noted,
            "{wrapped}: {v}"
        );
    }
}

/// A hook that runs `rewind hook` for some tools only counted as
/// installed, and integrate said nothing while Write and Edit ran with no
/// checkpoint before them (helper-53). It is kept (a second hook beside
/// it would run twice for the tools it matches) and named, with the fix.
#[test]
fn a_hook_that_runs_for_some_tools_only_is_named() {
    let dir = common::tmp();
    let ws = dir.path();
    let live = env!("CARGO_BIN_EXE_rewind");
    let wrapped = format!("timeout 10 '{live}' hook pre-tool-use");
    for (matcher, noted) in [
        ("Bash", true),
        ("Bash|Write", true),
        ("*", false),
        ("", false),
        (".+", false),
    ] {
        let v = integrate_over_pre_hook(ws, matcher, &wrapped);
        assert_eq!(
            claude_hooks(ws, "PreToolUse"),
            [wrapped.as_str()],
            "kept as written"
        );
        let notes = v["notes"].to_string();
        assert_eq!(
            notes.contains(&format!("only for tools matching \\\"{matcher}\\\"")),
            noted,
            "{matcher}: {v}"
        );
        assert_eq!(notes.contains("no checkpoint"), noted, "{matcher}: {v}");
    }
}

/// A write that fails part-way puts back what was already written: MCP
/// without its hooks is half an install the user would not notice.
#[test]
fn a_failed_install_puts_back_the_files_it_had_written() {
    let dir = common::tmp();
    let ws = dir.path();
    let mcp = br#"{"mcpServers": {"other": {"command": "x"}}}"#;
    write(&ws.join(".mcp.json"), mcp);
    // The second file's temp file cannot be created (root included).
    std::fs::create_dir_all(ws.join(".claude/.settings.json.rewind-tmp")).expect("mkdir");
    let out = rewind(ws, &["integrate", "claude", "--command", "rewind"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".settings.json.rewind-tmp"), "{err}");
    assert_eq!(std::fs::read(ws.join(".mcp.json")).expect("read"), mcp);
    assert!(!ws.join(".claude/settings.json").exists());
    assert!(
        !ws.join(".rewind").exists(),
        "a workspace was made for a failed install"
    );
}

#[test]
fn a_rewind_to_before_the_integration_keeps_the_agent_config() {
    let dir = common::tmp();
    let ws = dir.path();
    write(&ws.join("a.txt"), b"a\n");
    let before = common::checkpoint_id(ws, &[]);
    integrate(ws, "claude", &[]);
    integrate(ws, "codex", &[]);
    write(&ws.join("b.txt"), b"b\n");
    common::checkpoint_id(ws, &[]);
    // Twice: the protection must not itself be something a rewind undoes.
    for round in 0..2 {
        rewind_json(ws, &["rewind", &before]);
        assert!(!ws.join("b.txt").exists(), "the rewind did not happen");
        for f in [".mcp.json", ".claude/settings.json", ".codex/config.toml"] {
            assert!(ws.join(f).is_file(), "round {round}: {f} was rewound away");
        }
        write(&ws.join("b.txt"), b"again\n");
        common::checkpoint_id(ws, &[]);
    }
    assert!(
        !ws.join(".rewindignore").exists(),
        "integrate wrote into the user's tree rules"
    );
}

/// A config kept as a symlink into a dotfiles checkout is written where it
/// points: renaming over the link replaced it with a plain file, and the
/// dotfile never saw the change.
#[test]
fn a_symlinked_config_is_updated_through_its_link() {
    let dir = common::tmp();
    let ws = dir.path().join("proj");
    let dotfiles = dir.path().join("dotfiles");
    std::fs::create_dir_all(ws.join(".claude")).expect("mkdir");
    write(&dotfiles.join("settings.json"), br#"{"theme": "dark"}"#);
    std::os::unix::fs::symlink(
        dotfiles.join("settings.json"),
        ws.join(".claude/settings.json"),
    )
    .expect("symlink");
    integrate(&ws, "claude", &[]);
    let link = std::fs::symlink_metadata(ws.join(".claude/settings.json")).expect("lstat");
    assert!(link.file_type().is_symlink(), "the symlink was replaced");
    let v: Value =
        serde_json::from_slice(&std::fs::read(dotfiles.join("settings.json")).expect("read"))
            .expect("json");
    assert_eq!(v["theme"], "dark", "{v}");
    assert!(
        v["hooks"]["PreToolUse"].is_array(),
        "the hooks went elsewhere: {v}"
    );
}

/// helper-14: with a workspace made in the home directory (an MCP
/// `checkpoint` from a server started there made one without a word),
/// `integrate claude` in any project below wrote the user's own
/// `~/.claude/settings.json`: hooks for every project. The home directory
/// and `/` are now workspaces only by an explicit `rewind init`, and
/// `integrate` refuses to write there.
#[test]
fn the_home_directory_is_never_integrated_or_made_a_workspace_by_accident() {
    let tmp = common::tmp();
    let home = tmp.path();
    std::fs::create_dir_all(home.join("proj")).expect("mkdir");
    common::write(
        &home.join(".claude/settings.json"),
        b"{\"model\":\"opus\"}\n",
    );
    let env = [("HOME", home.to_str().expect("utf8"))];
    let out = common::rewind_env(home, &["--json", "checkpoint"], &env);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        !home.join(".rewind").exists(),
        "a checkpoint made $HOME a workspace"
    );
    let out = common::rewind_env(home, &["init"], &env);
    assert!(out.status.success(), "an explicit init is obeyed: {out:?}");
    let out = common::rewind_env(&home.join("proj"), &["integrate", "claude"], &env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("your home directory"), "{err}");
    assert_eq!(
        std::fs::read(home.join(".claude/settings.json")).expect("read"),
        b"{\"model\":\"opus\"}\n"
    );
    assert!(!home.join(".mcp.json").exists());
}

/// D162: `rewind checkpoint` run in /tmp (an agent's `cd /tmp`, a
/// `-C /tmp`) made all of /tmp a workspace, every user's scratch files
/// captured (6.9 GiB here). A sticky, world-writable directory is now a
/// workspace only by an explicit `rewind init`; a project below it is not
/// affected.
#[test]
fn a_shared_scratch_directory_like_tmp_is_never_made_a_workspace_by_accident() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = common::tmp();
    let shared = tmp.path().join("scratch");
    std::fs::create_dir_all(shared.join("proj")).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    write(&shared.join("someone-elses.txt"), b"not yours\n");
    let out = rewind(&shared, &["--json", "checkpoint"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("like /tmp") && err.contains("rewind init"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json error");
    assert_eq!(v["error"]["code"], "INVALID_PATH", "{v}");
    assert!(!shared.join(".rewind").exists(), "/tmp made a workspace");
    // A project below it is an ordinary workspace.
    write(&shared.join("proj/a.txt"), b"a\n");
    let id = common::checkpoint_id(&shared.join("proj"), &[]);
    assert!(!id.is_empty());
    assert!(shared.join("proj/.rewind").is_dir());
    assert!(!shared.join(".rewind").exists());
    // An explicit init is obeyed.
    let out = rewind(&shared, &["init"]);
    assert!(out.status.success(), "{out:?}");
}

/// Inline tables are tables to TOML: `mcp_servers = { … }` and
/// `hooks = { PreToolUse = [] }` were refused as "not a table"
/// (helper-14). They are merged, the user's server kept, and a second
/// run changes nothing.
#[test]
fn codex_inline_tables_are_merged_like_standard_ones() {
    let tmp = common::tmp();
    let dir = tmp.path();
    write(
        &dir.join(".codex/config.toml"),
        b"mcp_servers = { other = { command = \"o\" } }\nhooks = { PreToolUse = [] }\n",
    );
    let out = rewind(dir, &["integrate", "codex"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join(".codex/config.toml")).expect("read");
    let doc: toml_edit::DocumentMut = text.parse().expect("valid TOML");
    assert_eq!(
        doc["mcp_servers"]["other"]["command"].as_str(),
        Some("o"),
        "{text}"
    );
    assert!(doc["mcp_servers"]["rewind"]["command"].is_str(), "{text}");
    assert_eq!(
        doc["hooks"]["PreToolUse"]
            .as_array_of_tables()
            .map(|a| a.len()),
        Some(1),
        "{text}"
    );
    assert!(text.starts_with("[mcp_servers]\n"), "{text}");
    let again = rewind_json(dir, &["integrate", "codex"]);
    assert_eq!(again["files"][0]["action"], "unchanged", "{again}");
}

/// D334: an agent whose hooks still run an earlier build after an upgrade
/// meets a history that build refuses (its hooks fail closed, or run the
/// call unchecked); `doctor` names the rewind each config runs and says
/// whether it is this build, and which `integrate` points it here.
#[test]
fn doctor_names_the_rewind_each_agent_runs() {
    let dir = common::tmp();
    let ws = dir.path();
    rewind_json(ws, &["init"]);
    // The default `--command`: this binary's absolute path (it is not
    // the `rewind` on the tests' PATH).
    rewind_json(ws, &["integrate", "claude"]);
    // Another binary: a copy of this one is another build as far as a
    // path can tell.
    let other = ws.join("bin/old rewind");
    std::fs::create_dir_all(other.parent().expect("parent")).expect("mkdir bin");
    std::fs::copy(env!("CARGO_BIN_EXE_rewind"), &other).expect("copy the binary");
    rewind_json(
        ws,
        &[
            "integrate",
            "gemini",
            "--command",
            &other.display().to_string(),
        ],
    );
    let v = rewind_json(ws, &["doctor"]);
    let agents = v["agents"].as_array().expect("agents");
    let runs = |file: &str| {
        agents
            .iter()
            .find(|a| a["file"] == file)
            .unwrap_or_else(|| panic!("{file} in {v}"))
    };
    assert_eq!(runs(".claude/settings.json")["this_build"], true, "{v}");
    assert_eq!(runs(".mcp.json")["this_build"], true, "{v}");
    let gemini = runs(".gemini/settings.json");
    assert_eq!(gemini["this_build"], false, "{v}");
    assert_eq!(gemini["program"], other.display().to_string(), "{v}");
    let out = rewind(ws, &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(".gemini/settings.json runs")
            && text.contains("another build, not this one")
            && text.contains("`rewind integrate gemini`"),
        "{text}"
    );
    // Pointed here again, it is this build.
    rewind_json(ws, &["integrate", "gemini"]);
    let v = rewind_json(ws, &["doctor"]);
    assert!(
        v["agents"]
            .as_array()
            .expect("agents")
            .iter()
            .all(|a| a["this_build"] == true),
        "{v}"
    );
}
