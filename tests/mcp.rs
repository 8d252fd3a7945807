//! `rewind mcp` against real MCP clients: the Python `mcp` package (driven
//! by tests/mcp/client.py) and the MCP Inspector CLI. `.ci/run` installs
//! both under target/; elsewhere the tests skip and say why.

// Tests and benches may panic on a closed stream (D348).
#![allow(clippy::disallowed_macros)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Python with the `mcp` and `jsonschema` packages, if there is one.
fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("REWIND_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest().join("target/venv/bin/python"));
    let ok = Command::new(&candidate)
        .args(["-c", "import mcp, jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(candidate)
    } else {
        common::skip_or_fail(&format!(
            "no Python with the `mcp` and `jsonschema` packages at {} (set REWIND_TEST_PYTHON, or run .ci/run once)",
            candidate.display()
        ));
        None
    }
}

fn client(
    python: &Path,
    scenario: &str,
    dir: &Path,
    profile: &str,
    mode: &str,
    env: &[(&str, &str)],
) {
    let mut c = Command::new(python);
    c.arg(manifest().join("tests/mcp/client.py"))
        .args([scenario, env!("CARGO_BIN_EXE_rewind")])
        .arg(dir)
        .args([profile, mode]);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run the Python MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "MCP client scenario {scenario} ({profile}, {mode}) failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{scenario} {profile} {mode}: {}", stdout.trim());
}

/// A raw stdio session with `rewind mcp` in a directory: one request at
/// a time, each answer read by its id.
struct RawSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next: u32,
}

impl RawSession {
    fn start(cwd: &Path) -> RawSession {
        let mut child = common::raw_mcp(cwd);
        let stdin = child.stdin.take().expect("stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut s = RawSession {
            child,
            stdin,
            stdout,
            next: 2,
        };
        s.send(1, common::INITIALIZE);
        s
    }

    fn send(&mut self, id: u32, line: &str) -> serde_json::Value {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{line}").expect("write");
        loop {
            let mut l = String::new();
            assert!(
                self.stdout.read_line(&mut l).expect("read") > 0,
                "server closed"
            );
            let v: serde_json::Value = serde_json::from_str(&l).expect("json");
            if v["id"] == id {
                return v;
            }
        }
    }

    /// `tools/call` of `name` with `args` (a JSON object's text).
    fn tool(&mut self, name: &str, args: &str) -> serde_json::Value {
        let id = self.next;
        self.next += 1;
        self.send(
            id,
            &format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{args}}}}}"#
            ),
        )
    }
}

impl Drop for RawSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn every_profile_lists_described_schema_checked_tools_over_both_lifecycles() {
    let Some(py) = python() else { return };
    let dir = common::tmp();
    for mode in ["legacy", "auto"] {
        for profile in ["lean", "recovery", "all"] {
            client(&py, "lifecycle", dir.path(), profile, mode, &[]);
        }
    }
}

#[test]
fn a_session_checkpoints_survives_shell_damage_remembers_failures_and_guards_effects() {
    let Some(py) = python() else { return };
    for mode in ["legacy", "auto"] {
        let dir = common::tmp();
        client(&py, "session", dir.path(), "all", mode, &[]);
    }
}

#[test]
fn long_calls_report_progress_to_clients_that_ask() {
    let Some(py) = python() else { return };
    let dir = common::tmp();
    client(&py, "progress", dir.path(), "all", "legacy", &[]);
}

#[test]
fn a_cancelled_checkpoint_commits_nothing_and_the_server_keeps_serving() {
    let Some(py) = python() else { return };
    let dir = common::tmp();
    client(
        &py,
        "cancel",
        dir.path(),
        "all",
        "legacy",
        &[
            ("REWIND_FAILPOINT", "capture:dir"),
            ("REWIND_FAILPOINT_ACTION", "pause:2000"),
        ],
    );
}

/// D63: the server keeps its workspace open between calls, and must not
/// lock others out or keep using a workspace that was replaced or mounted.
#[test]
fn a_kept_open_workspace_releases_its_lock_and_follows_reinit_and_mounts() {
    let Some(py) = python() else { return };
    let dir = common::tmp();
    let mount = common::is_root() && Path::new("/dev/fuse").exists();
    if !mount {
        common::skip_or_fail("the mount part needs root and /dev/fuse");
    }
    // Unmounted on drop, in case the client failed while mounted.
    let _cleanup = common::MountGuard {
        dir: dir.path().to_path_buf(),
    };
    client(
        &py,
        "warm",
        dir.path(),
        "all",
        "legacy",
        &[("REWIND_TEST_MOUNT", if mount { "1" } else { "0" })],
    );
}

#[test]
fn an_unknown_profile_fails_at_startup() {
    let dir = common::tmp();
    for (args, env) in [
        (vec!["mcp", "--profile", "huge"], None),
        (vec!["mcp"], Some("tiny")),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rewind"));
        c.current_dir(dir.path()).args(&args);
        if let Some(p) = env {
            c.env("REWIND_MCP_PROFILE", p);
        }
        let out = c.output().expect("run rewind mcp");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("unknown MCP profile") && err.contains("lean, recovery, all"),
            "{err}"
        );
    }
}

/// D174: a server started in a subdirectory of the workspace (an agent
/// launched in one package of a monorepo) goes on serving once that
/// directory is removed, from its nearest existing ancestor: the agent
/// can rewind the very `rm -rf` that removed it. Before, every call,
/// `rewind` included, failed with "does not exist: name the workspace's
/// directory (-C DIR)".
#[test]
fn a_server_whose_directory_was_removed_still_rewinds_the_removal() {
    let dir = common::tmp();
    let ws = dir.path();
    common::write(&ws.join("pkg/a"), b"a\n");
    common::rewind_json(ws, &["init"]);
    let mut session = RawSession::start(&ws.join("pkg"));
    let made = session.tool("checkpoint", r#"{"label":"good"}"#);
    assert!(
        made["result"]["structuredContent"]["id"].is_string(),
        "{made}"
    );
    std::fs::remove_dir_all(ws.join("pkg")).expect("the agent's rm -rf");
    // D309: the dry run lists its plan and says its report went nowhere;
    // the real rewind gives counts, not the plan again.
    let dry = session.tool(
        "rewind",
        r#"{"id":"good","dry_run":true,"report":"only looking"}"#,
    );
    let dry = &dry["result"]["structuredContent"];
    assert_eq!(common::paths_in(dry, "plan"), ["pkg", "pkg/a"], "{dry}");
    assert!(
        dry["warning"]
            .as_str()
            .is_some_and(|w| w.contains("a dry run records nothing")),
        "{dry}"
    );
    let back = session.tool("rewind", r#"{"id":"good"}"#);
    assert_ne!(back["result"]["isError"], true, "{back}");
    assert_eq!(back["result"]["structuredContent"]["written"], 2, "{back}");
    assert!(
        back["result"]["structuredContent"].get("plan").is_none(),
        "{back}"
    );
    assert_eq!(std::fs::read(ws.join("pkg/a")).expect("restored"), b"a\n");
    // D196: a report on a rewind with nothing to leave is not dropped
    // silently (helper-26).
    let again = session.tool("rewind", r#"{"id":"good","report":"tried the rm"}"#);
    assert!(
        again["result"]["structuredContent"]["warning"]
            .as_str()
            .is_some_and(|w| w.contains("report was not stored")),
        "{again}"
    );
}

/// D302: a server whose workspace's own directory is renamed or removed
/// does not climb to the parent. It did: the next `checkpoint` made the
/// parent a workspace, a `rewind` then rewound a sibling project's files,
/// and a spent effect was admitted again (helper-61). Now each call is
/// refused, naming where a renamed directory went, and nothing outside
/// the workspace is touched.
#[test]
fn a_server_whose_workspace_was_renamed_or_removed_touches_nothing_above_it() {
    let dir = common::tmp();
    let parent = dir.path();
    let ws = parent.join("proj");
    common::write(&ws.join("main.c"), b"x\n");
    common::write(&parent.join("other/notes"), b"v1\n");
    common::rewind_json(&ws, &["init"]);
    for damage in ["rename", "remove"] {
        let mut session = RawSession::start(&ws);
        let first = session.tool("guard_effect", r#"{"key":"deploy-v1"}"#);
        assert_ne!(first["result"]["isError"], true, "{first}");
        let moved = parent.join("proj-moved");
        match damage {
            "rename" => std::fs::rename(&ws, &moved).expect("mv"),
            _ => std::fs::remove_dir_all(&ws).expect("rm -rf"),
        }
        common::write(&parent.join("other/notes"), b"v2\n");
        for (name, args) in [
            ("checkpoint", r#"{"label":"after"}"#),
            ("guard_effect", r#"{"key":"deploy-v1"}"#),
            ("rewind", r#"{"id":"after"}"#),
        ] {
            let out = session.tool(name, args);
            assert_eq!(out["result"]["isError"], true, "{damage}: {name}: {out}");
            let text = out["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            assert!(text.contains("is gone"), "{damage}: {name}: {text}");
            if damage == "rename" {
                assert!(text.contains("proj-moved"), "{name}: {text}");
            }
        }
        assert!(
            !parent.join(".rewind").exists(),
            "{damage}: the parent became a workspace"
        );
        assert_eq!(
            std::fs::read(parent.join("other/notes")).expect("notes"),
            b"v2\n"
        );
        drop(session);
        if damage == "rename" {
            std::fs::rename(&moved, &ws).expect("mv back");
        }
    }
}

/// `backtrack_candidates` pages below the last candidate shown, as
/// `list` does: by offset, a checkpoint made between two pages showed
/// one candidate twice (helper-61).
#[test]
fn backtrack_candidates_pages_never_repeat_a_candidate() {
    let dir = common::tmp();
    let ws = dir.path();
    let mut ids = Vec::new();
    for i in 0..4 {
        common::write(&ws.join("a"), format!("{i}").as_bytes());
        ids.push(common::checkpoint_id(ws, &[]));
    }
    let mut session = RawSession::start(ws);
    let shown = |v: &serde_json::Value| -> Vec<String> {
        v["result"]["structuredContent"]["candidates"]
            .as_array()
            .expect("candidates")
            .iter()
            .map(|c| c["id"].as_str().expect("id").to_string())
            .collect()
    };
    let first = session.tool("backtrack_candidates", r#"{"limit":2}"#);
    assert_eq!(shown(&first), [ids[3].clone(), ids[2].clone()], "{first}");
    let cursor = first["result"]["structuredContent"]["next_cursor"]
        .as_str()
        .expect("cursor")
        .to_string();
    common::write(&ws.join("a"), b"new");
    session.tool("checkpoint", "{}");
    let next = session.tool(
        "backtrack_candidates",
        &format!(r#"{{"limit":2,"cursor":"{cursor}"}}"#),
    );
    assert_eq!(shown(&next), [ids[1].clone(), ids[0].clone()], "{next}");
}

/// D334: a server keeps its workspace open between calls (D63); a later
/// build that opens and migrates the ledger meanwhile makes it one this
/// build must not write. The next call opens it again and is refused
/// as `LEDGER_NEWER`, with nothing written.
#[test]
fn a_server_whose_ledger_a_later_build_migrated_refuses_the_next_call() {
    let dir = common::tmp();
    let ws = dir.path();
    common::write(&ws.join("a"), b"1");
    let mut session = RawSession::start(ws);
    let first = session.tool("checkpoint", "{}");
    assert_eq!(first["result"]["isError"], false, "{first}");
    let db = ws.join(".rewind/ledger.db");
    rusqlite::Connection::open(&db)
        .expect("open ledger")
        .execute_batch("PRAGMA user_version = 6")
        .expect("as a later build stamps it");
    let count = || -> i64 {
        rusqlite::Connection::open(&db)
            .expect("open ledger")
            .query_row("SELECT count(*) FROM checkpoints", [], |r| r.get(0))
            .expect("count")
    };
    let before = count();
    common::write(&ws.join("a"), b"2");
    let next = session.tool("checkpoint", "{}");
    assert_eq!(next["result"]["isError"], true, "{next}");
    let text = next["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert!(
        text.contains("LEDGER_NEWER") || text.contains("written by a later build"),
        "{next}"
    );
    assert_eq!(count(), before, "the refused call wrote a checkpoint");
}

/// JSON-RPC 2.0 over raw stdio: every request the server cannot serve is
/// answered with its id and a standard code (a line that is not JSON with
/// -32700 and id null), nothing is changed, and the session goes on. rmcp
/// alone skipped the unparseable line and answered some requests without
/// their id, so a client waiting on that id waited for ever.
#[test]
fn every_request_the_server_cannot_serve_is_answered_with_its_id() {
    let dir = common::tmp();
    common::rewind_json(dir.path(), &["init"]);
    let lines = [
        // D303: a response before the first request ended the session.
        r#"{"jsonrpc":"2.0","id":77,"result":{}}"#,
        common::INITIALIZE,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        // D303: a `_meta` that is no object; a notification rmcp cannot
        // read, which must get no answer.
        r#"{"jsonrpc":"2.0","id":13,"method":"ping","params":{"_meta":5}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"bad"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{"label":"x"}}}"#,
        "this is not json",
        r#"{"jsonrpc":"2.0","id":9}"#,
        r#"{"jsonrpc":"2.0","id":11,"method":"tools/list","params":5}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"checkpoint","arguments":{"label":"after the bad lines"}}}"#,
        r#"{"jsonrpc":"2.0","id":12,"method":"ping"}"#,
    ];
    let answers = common::raw_mcp_answers(dir.path(), &lines);
    let by_id = |id: serde_json::Value| {
        let hits: Vec<_> = answers.iter().filter(|a| a["id"] == id).collect();
        assert_eq!(hits.len(), 1, "answers for id {id}: {answers:#?}");
        hits[0].clone()
    };
    for (id, code) in [
        (2, -32602),
        (3, -32602),
        (9, -32600),
        (11, -32602),
        (13, -32602),
    ] {
        let a = by_id(serde_json::json!(id));
        assert_eq!(a["error"]["code"], code, "id {id}: {a}");
    }
    let unknown = by_id(serde_json::json!(2));
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("'nope'") && m.contains("all profile")),
        "{unknown}"
    );
    assert_eq!(by_id(serde_json::Value::Null)["error"]["code"], -32700);
    assert!(
        answers.iter().all(|a| a["id"] != 77),
        "a response was answered: {answers:#?}"
    );
    assert_eq!(
        by_id(serde_json::json!(12))["result"],
        serde_json::json!({})
    );
    let made = by_id(serde_json::json!(4));
    assert!(
        made["result"]["structuredContent"]["id"].is_string(),
        "{made}"
    );
    let list = common::rewind_json(dir.path(), &["list"]);
    let labels: Vec<_> = list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| c["label"].clone())
        .collect();
    assert_eq!(labels, [serde_json::json!("after the bad lines")]);
}

/// Two answers a model could not act on (helper-52, helper-53): a
/// `guard_effect` outside any workspace told it to run `rewind init`, and
/// `HEAD~N` past the first checkpoint was "no checkpoint matches". Both
/// now name what the model can do.
#[test]
fn guard_outside_a_workspace_and_head_before_history_say_what_to_call() {
    let dir = common::tmp();
    let call = |id: u32, tool: &str, args: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        )
    };
    let guard = call(2, "guard_effect", r#"{"key":"charge-1"}"#);
    let made = call(3, "checkpoint", r#"{"label":"first"}"#);
    let far = call(4, "rewind", r#"{"id":"HEAD~3"}"#);
    let answers = common::raw_mcp_answers(
        dir.path(),
        &[
            common::INITIALIZE,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            &guard,
            &made,
            &far,
        ],
    );
    let by_id = |id: u32| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer {id}: {answers:#?}"))
            .clone()
    };
    let g = &by_id(2)["result"]["structuredContent"];
    assert_eq!(g["code"], "LEDGER_UNAVAILABLE", "{g}");
    assert!(
        g["reason"]
            .as_str()
            .is_some_and(|r| r.contains("call `checkpoint`")),
        "{g}"
    );
    assert!(by_id(3)["result"]["structuredContent"]["id"].is_string());
    let r = by_id(4);
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("HEAD is its first checkpoint") && !text.contains("rewind list"),
        "{text}"
    );
}

/// D183: a request line past rmcp's 16 MiB limit, which it dropped
/// without a word (the client waited on its id for ever), is answered
/// -32600 with id null, and the session goes on.
#[test]
fn a_request_line_past_the_limit_is_answered_and_the_session_goes_on() {
    let dir = common::tmp();
    common::rewind_json(dir.path(), &["init"]);
    let pad = "x".repeat(17 << 20);
    let huge = format!(r#"{{"jsonrpc":"2.0","id":5,"method":"ping","params":{{"pad":"{pad}"}}}}"#);
    let answers = common::raw_mcp_answers(
        dir.path(),
        &[
            common::INITIALIZE,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            &huge,
            r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#,
        ],
    );
    let too_long: Vec<_> = answers.iter().filter(|a| a["id"].is_null()).collect();
    assert_eq!(too_long.len(), 1, "{answers:#?}");
    assert_eq!(too_long[0]["error"]["code"], -32600, "{}", too_long[0]);
    assert!(
        too_long[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("16 MiB")),
        "{}",
        too_long[0]
    );
    assert!(answers.iter().all(|a| a["id"] != 5), "{answers:#?}");
    let ping: Vec<_> = answers.iter().filter(|a| a["id"] == 6).collect();
    assert_eq!(ping.len(), 1, "{answers:#?}");
    assert_eq!(ping[0]["result"], serde_json::json!({}));
}

/// The MCP Inspector CLI, if installed (it needs Node; `.ci/run` installs it).
fn inspector() -> Option<PathBuf> {
    let p = std::env::var_os("REWIND_TEST_INSPECTOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest().join("target/inspector/node_modules/.bin/mcp-inspector"));
    if p.exists() {
        return Some(p);
    }
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if node {
        common::skip_or_fail(&format!(
            "Node is here but the MCP Inspector is not at {} (run .ci/run once, or set REWIND_TEST_INSPECTOR)",
            p.display()
        ));
    } else {
        eprintln!("SKIPPED: no Node.js, so no MCP Inspector");
    }
    None
}

#[test]
fn the_inspector_cli_accepts_every_profile_in_strict_mode() {
    let Some(inspector) = inspector() else { return };
    let dir = common::tmp();
    for profile in ["lean", "recovery", "all"] {
        let out = Command::new(&inspector)
            .current_dir(dir.path())
            .args([
                "--cli",
                env!("CARGO_BIN_EXE_rewind"),
                "mcp",
                "--profile",
                profile,
            ])
            .args(["--method", "tools/list", "--strict"])
            .output()
            .expect("run the MCP Inspector");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "inspector --strict on {profile}: {stderr}\n{stdout}"
        );
        assert!(
            !stderr.contains("Warning"),
            "inspector warns on {profile}: {stderr}"
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("inspector prints JSON");
        let n = v["tools"].as_array().map_or(0, Vec::len);
        assert_eq!(
            n,
            [3, 9, 10][["lean", "recovery", "all"]
                .iter()
                .position(|p| *p == profile)
                .unwrap_or(0)],
            "{profile}"
        );
    }
}
