//! The effect barrier (DESIGN §5): one test per row of the decision table,
//! fail-closed refusals, exactly-once admission under concurrency, and a
//! SIGKILL right after admission leaving the key spent.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{checkpoint_id, rewind, rewind_env, rewind_json, write};

fn guard(root: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    guard_env(root, args, &[])
}

fn guard_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let mut a = vec!["--json", "guard"];
    a.extend_from_slice(args);
    let out = rewind_env(root, &a, env);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "guard JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn code(v: &serde_json::Value) -> &str {
    v["code"].as_str().unwrap_or("")
}

fn workspace(root: &Path) -> String {
    write(&root.join("app.txt"), b"v1");
    checkpoint_id(root, &["start"])
}

fn chain_effect_entries(root: &Path) -> usize {
    let c = rusqlite::Connection::open(root.join(".rewind/ledger.db")).expect("open");
    let mut s = c.prepare("SELECT data FROM chain").expect("prepare");
    s.query_map([], |r| r.get::<_, Vec<u8>>(0))
        .expect("query")
        .filter(|d| {
            d.as_ref()
                .ok()
                .and_then(|d| rewind::chain::Entry::decode(d).ok())
                .is_some_and(|e| e.kind == "effect")
        })
        .count()
}

#[test]
fn first_firing_is_admitted_and_a_second_is_spent() {
    let dir = common::tmp();
    workspace(dir.path());
    let (rc, v) = guard(
        dir.path(),
        &[r#"{"key":"charge-1","payload":{"amount":100,"currency":"EUR"},"kind":"payment"}"#],
    );
    assert_eq!((rc, code(&v)), (0, "FIRST_FIRING"), "{v}");
    assert_eq!(v["decision"], "admitted");
    assert!(v["chain_head"].as_str().is_some_and(|h| h.len() == 64));
    let admitted_at = v["seq"].as_u64().expect("seq of the admission");
    assert_eq!(v["first_seq"].as_u64(), Some(admitted_at));
    // Key order and whitespace in the payload do not matter.
    let (rc, v) = guard(
        dir.path(),
        &[
            "--key",
            "charge-1",
            "--payload",
            r#"{ "currency": "EUR", "amount": 100 }"#,
        ],
    );
    assert_eq!((rc, code(&v)), (2, "SPENT"), "{v}");
    assert_eq!(v["decision"], "refused");
    assert_eq!(
        v["first_seq"].as_u64(),
        Some(admitted_at),
        "a refusal names the first admission"
    );
    assert!(v["seq"].as_u64() > Some(admitted_at));
    assert_eq!(
        chain_effect_entries(dir.path()),
        2,
        "refusals are on the chain too"
    );
}

#[test]
fn a_different_payload_for_a_spent_key_is_a_payload_mismatch() {
    let dir = common::tmp();
    workspace(dir.path());
    assert_eq!(
        guard(
            dir.path(),
            &["--key", "mail-7", "--payload", r#"{"to":"a@x"}"#]
        )
        .0,
        0
    );
    let (rc, v) = guard(
        dir.path(),
        &["--key", "mail-7", "--payload", r#"{"to":"b@x"}"#],
    );
    assert_eq!((rc, code(&v)), (2, "PAYLOAD_MISMATCH"), "{v}");
}

#[test]
fn a_failed_effect_may_be_retried_once_resolved() {
    let dir = common::tmp();
    workspace(dir.path());
    assert_eq!(guard(dir.path(), &["--key", "deploy-3"]).0, 0);
    let r = rewind_json(
        dir.path(),
        &["effects", "resolve", "deploy-3", "--outcome", "failed"],
    );
    assert_eq!(r["outcome"], "failed");
    let (rc, v) = guard(dir.path(), &["--key", "deploy-3"]);
    assert_eq!((rc, code(&v)), (0, "RETRY_AFTER_FAILURE"), "{v}");
    let (rc, v) = guard(dir.path(), &["--key", "deploy-3"]);
    assert_eq!((rc, code(&v)), (2, "SPENT"), "{v}");
    rewind_json(
        dir.path(),
        &["effects", "resolve", "deploy-3", "--outcome", "succeeded"],
    );
    assert_eq!(guard(dir.path(), &["--key", "deploy-3"]).1["code"], "SPENT");
    let list = rewind_json(dir.path(), &["effects"]);
    assert_eq!(list["effects"][0]["status"], "succeeded");
    assert_eq!(list["effects"][0]["attempts"], 2);
    let out = rewind(
        dir.path(),
        &["effects", "resolve", "no-such-key", "--outcome", "failed"],
    );
    assert_eq!(out.status.code(), Some(1));
    // The SCOPE:KEY form `rewind effects` prints resolves too.
    assert_eq!(
        guard(dir.path(), &["--scope", "pay", "--key", "inv:9"]).0,
        0
    );
    let shown = format!(
        "{}:{}",
        list_effect(dir.path(), "inv:9", "scope"),
        list_effect(dir.path(), "inv:9", "key")
    );
    let r = rewind_json(
        dir.path(),
        &["effects", "resolve", &shown, "--outcome", "failed"],
    );
    assert_eq!(
        (r["scope"].as_str(), r["key"].as_str()),
        (Some("pay"), Some("inv:9")),
        "{r}"
    );
}

/// Scopes and keys may hold `:`, so `a:x:y` as `rewind effects` prints it
/// can be scope `a`, key `x:y` or scope `a:x`, key `y`: `resolve` took the
/// first split that matched, silently, and `failed` made the wrong one
/// retryable (helper-33, D233). Refused naming both, nothing recorded;
/// with `--scope` each is resolved.
#[test]
fn a_scope_key_that_names_two_effects_is_refused_naming_both() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    assert_eq!(guard(root, &["--scope", "a", "--key", "x:y"]).0, 0);
    assert_eq!(guard(root, &["--scope", "a:x", "--key", "y"]).0, 0);
    let entries = chain_effect_entries(root);
    let out = rewind(
        root,
        &[
            "--json",
            "effects",
            "resolve",
            "a:x:y",
            "--outcome",
            "failed",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "USAGE", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("--scope a x:y") && msg.contains("--scope a:x y"),
        "{msg}"
    );
    assert_eq!(
        chain_effect_entries(root),
        entries,
        "something was recorded"
    );
    let r = rewind_json(
        root,
        &[
            "effects",
            "resolve",
            "y",
            "--scope",
            "a:x",
            "--outcome",
            "failed",
        ],
    );
    assert_eq!(
        (r["scope"].as_str(), r["key"].as_str()),
        (Some("a:x"), Some("y")),
        "{r}"
    );
    assert_eq!(
        guard(root, &["--scope", "a", "--key", "x:y"]).1["code"],
        "SPENT"
    );
}

/// A field of the effect `key` as `rewind effects --json` lists it.
fn list_effect(dir: &std::path::Path, key: &str, field: &str) -> String {
    let list = rewind_json(dir, &["effects"]);
    list["effects"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["key"] == key))
        .and_then(|e| e[field].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn an_effect_from_a_rewound_timeline_is_spent_before_rewind_and_reported() {
    let dir = common::tmp();
    let root = dir.path();
    let a = workspace(root);
    write(&root.join("app.txt"), b"v2: about to pay");
    assert_eq!(guard(root, &["--key", "pay-42", "--kind", "payment"]).0, 0);
    write(&root.join("app.txt"), b"v3: paid");
    rewind_json(root, &["checkpoint", "after payment"]);
    assert_eq!(
        guard(root, &["--key", "pay-42"]).1["code"],
        "SPENT",
        "still on the timeline where it happened"
    );

    let r = rewind_json(root, &["rewind", &a]);
    let not_undone = r["effects_not_undone"].as_array().expect("list");
    assert_eq!(not_undone.len(), 1, "{r}");
    assert_eq!(not_undone[0]["key"], "pay-42");
    let (rc, v) = guard(root, &["--key", "pay-42"]);
    assert_eq!((rc, code(&v)), (2, "SPENT_BEFORE_REWIND"), "{v}");

    // Going forward again to the checkpoint taken after the payment puts us
    // back on the timeline where it happened.
    let back = rewind_json(root, &["undo"]);
    assert!(
        back["effects_not_undone"]
            .as_array()
            .expect("list")
            .is_empty(),
        "{back}"
    );
    assert_eq!(guard(root, &["--key", "pay-42"]).1["code"], "SPENT");
}

#[test]
fn a_rewind_to_the_checkpoint_just_before_the_effect_is_spent_before_rewind() {
    let dir = common::tmp();
    let root = dir.path();
    let a = workspace(root);
    assert_eq!(guard(root, &["--key", "push-1"]).0, 0);
    write(&root.join("app.txt"), b"changed after the push");
    rewind_json(root, &["rewind", &a]);
    assert_eq!(
        guard(root, &["--key", "push-1"]).1["code"],
        "SPENT_BEFORE_REWIND"
    );
}

#[test]
fn the_peer_descriptor_shape_and_stdin_are_accepted() {
    let dir = common::tmp();
    workspace(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(dir.path())
        .args(["--json", "guard"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        br#"{"descriptor":{"effectKey":"email-welcome-9","scopeLabel":"smtp","kind":"email","payload":{"to":"u@x"}}}"#,
    )
    .expect("write");
    let out = child.wait_with_output().expect("wait");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!((out.status.code(), code(&v)), (Some(0), "FIRST_FIRING"));
    assert_eq!(
        (v["scope"].as_str(), v["key"].as_str()),
        (Some("smtp"), Some("email-welcome-9"))
    );
    let (rc, v) = guard(
        dir.path(),
        &[
            "--scope",
            "smtp",
            "--key",
            "email-welcome-9",
            "--payload",
            r#"{"to":"u@x"}"#,
        ],
    );
    assert_eq!((rc, code(&v)), (2, "SPENT"));
}

#[test]
fn malformed_input_is_a_usage_error_that_records_nothing() {
    let dir = common::tmp();
    workspace(dir.path());
    // A misspelt field dropped what it carried (D114: a typo'd
    // "paylod" made every later payload match); a non-string key read as
    // no key.
    for (bad, says) in [
        ("not json", "not valid JSON"),
        (r#"{"payload":{}}"#, "has no \"key\""),
        (
            r#"{"descriptor":{"scopeLabel":"x"}}"#,
            "has no \"effectKey\"",
        ),
        (
            r#"{"key":"k","paylod":{"amount":5}}"#,
            "unknown field \"paylod\"",
        ),
        (r#"{"key":5}"#, "\"key\" must be a string"),
    ] {
        let out = rewind(dir.path(), &["guard", bad]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stderr)
                .trim_end()
                .lines()
                .count(),
            1
        );
    }
    assert_eq!(chain_effect_entries(dir.path()), 0);
}

fn assert_unavailable(root: &Path, env: &[(&str, &str)], label: &str, cause: &str) {
    let (rc, v) = guard_env(root, &["--key", "k-unavailable"], env);
    assert_eq!((rc, code(&v)), (2, "LEDGER_UNAVAILABLE"), "{label}: {v}");
    assert_eq!(v["decision"], "refused");
    assert!(
        v["reason"].as_str().unwrap_or("").contains(cause),
        "{label}: the reason names the cause '{cause}': {v}"
    );
}

#[test]
fn a_ledger_locked_beyond_the_timeout_refuses_and_admits_nothing() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    // Another process holds the ledger's write lock.
    let db = root.join(".rewind/ledger.db");
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3,sys,time\nc=sqlite3.connect({:?},isolation_level=None)\nc.execute('BEGIN IMMEDIATE')\nprint('locked',flush=True)\nsys.stdin.read()\n",
            db.display().to_string()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "locked");
    assert_unavailable(
        root,
        &[("REWIND_GUARD_TIMEOUT_MS", "300")],
        "locked",
        "locked",
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
    let (rc, v) = guard(root, &["--key", "k-unavailable"]);
    assert_eq!(
        (rc, code(&v)),
        (0, "FIRST_FIRING"),
        "the refused attempt admitted nothing: {v}"
    );
}

#[test]
fn a_corrupt_ledger_or_a_broken_chain_refuses() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    assert_eq!(guard(root, &["--key", "before"]).0, 0);
    // Broken chain: the newest entry no longer matches its hash.
    let db = root.join(".rewind/ledger.db");
    let c = rusqlite::Connection::open(&db).expect("open");
    c.execute("UPDATE chain SET data = CAST(data || x'00' AS BLOB) WHERE seq = (SELECT max(seq) FROM chain)", []).expect("tamper");
    drop(c);
    assert_unavailable(root, &[], "broken chain", "event chain is broken");
    // Corrupt ledger file.
    std::fs::write(&db, vec![0x5a; 8192]).expect("clobber");
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-wal"));
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-shm"));
    assert_unavailable(root, &[], "corrupt ledger", "corrupt");
    // No workspace at all.
    let empty = common::tmp();
    assert_unavailable(empty.path(), &[], "no workspace", "not a rewind workspace");
}

/// DESIGN §5: a broken chain refuses, wherever it is broken. The barrier
/// checked the newest two entries only, so an entry deleted or edited in
/// the middle admitted new effects. And it read its own table without the
/// chain: a spent effect's row deleted, or set to failed, by SQL was
/// admitted again, silently (D109).
#[test]
fn the_barrier_refuses_a_chain_broken_anywhere_or_a_row_the_chain_does_not_back() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    for i in 0..6 {
        assert_eq!(guard(root, &["--key", &format!("k{i}")]).0, 0);
    }
    let db = root.join(".rewind/ledger.db");
    let sql = |q: &str| {
        rusqlite::Connection::open(&db)
            .expect("open")
            .execute_batch(q)
            .expect(q);
    };
    let (rc, v) = guard(root, &["--key", "k0"]);
    assert_eq!((rc, code(&v)), (2, "SPENT"), "{v}");

    // A spent effect's row deleted: refused, not a first firing.
    sql("DELETE FROM effects WHERE key = 'k1'");
    let (rc, v) = guard(root, &["--key", "k1"]);
    assert_eq!((rc, code(&v)), (2, "LEDGER_UNAVAILABLE"), "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("default:k1") && r.contains("no row")),
        "{v}"
    );
    // Set to failed behind the chain: refused, not a retry.
    sql("UPDATE effects SET status = 'failed' WHERE key = 'k2'");
    let (rc, v) = guard(root, &["--key", "k2"]);
    assert_eq!((rc, code(&v)), (2, "LEDGER_UNAVAILABLE"), "{v}");
    // Other keys are unaffected by those rows.
    let (rc, v) = guard(root, &["--key", "k3"]);
    assert_eq!((rc, code(&v)), (2, "SPENT"), "{v}");

    // An entry in the middle deleted: every effect is refused.
    sql("DELETE FROM chain WHERE seq = 3");
    let before = chain_effect_entries(root);
    let (rc, v) = guard(root, &["--key", "fresh"]);
    assert_eq!((rc, code(&v)), (2, "LEDGER_UNAVAILABLE"), "{v}");
    assert!(
        v["reason"].as_str().is_some_and(|r| r.contains("SEQ_GAP")),
        "{v}"
    );
    assert_eq!(
        chain_effect_entries(root),
        before,
        "a refusal was recorded on a broken chain"
    );
}

/// An emptied chain beside checkpoints and effects passed `verify` (0
/// entries, ok); a chain row whose data is TEXT gave exit 2 "unreadable"
/// instead of naming the edited entry.
#[test]
fn verify_fails_an_emptied_chain_and_names_a_retyped_entry() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    assert_eq!(guard(root, &["--key", "k"]).0, 0);
    let db = root.join(".rewind/ledger.db");
    // The chain alone: the anchor rewind keeps (D313) names a cut chain
    // TRUNCATED_BELOW_ANCHOR first.
    let no_kept_anchor = common::tmp();
    let verify = || {
        let out = common::rewind_env(
            root,
            &["--json", "verify"],
            &[(
                "XDG_STATE_HOME",
                no_kept_anchor.path().to_str().expect("utf8"),
            )],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        (out.status.code(), v)
    };
    rusqlite::Connection::open(&db)
        .expect("open")
        .execute_batch("UPDATE chain SET data = CAST(data AS TEXT) WHERE seq = 2")
        .expect("retype");
    let (rc, v) = verify();
    assert_eq!(rc, Some(1), "{v}");
    assert_eq!(
        (
            v["first_bad"]["seq"].as_u64(),
            v["first_bad"]["code"].as_str()
        ),
        (Some(2), Some("DECODE_ERROR")),
        "{v}"
    );
    rusqlite::Connection::open(&db)
        .expect("open")
        .execute_batch("DELETE FROM chain")
        .expect("empty");
    let (rc, v) = verify();
    assert_eq!(rc, Some(1), "{v}");
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["first_bad"]["code"], "SEQ_GAP", "{v}");
    let out = common::rewind(root, &["--json", "verify"]);
    let kept: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        kept["first_bad"]["code"], "TRUNCATED_BELOW_ANCHOR",
        "{kept}"
    );
}

#[test]
fn concurrent_firings_admit_exactly_one_per_key() {
    let dir = common::tmp();
    let root = dir.path().to_path_buf();
    workspace(&root);
    const PROCS: usize = 8;
    const KEYS: usize = 200;
    let handles: Vec<_> = (0..PROCS)
        .map(|p| {
            let root = root.clone();
            std::thread::spawn(move || {
                let mut admitted = Vec::new();
                for i in 0..KEYS {
                    // Every process fires every key, in a different order.
                    let k = (i * 7 + p * 31) % KEYS;
                    let out = rewind_env(
                        &root,
                        &["guard", "--key", &format!("key-{k}"), "-q"],
                        &[("REWIND_GUARD_TIMEOUT_MS", "60000")],
                    );
                    match out.status.code() {
                        Some(0) => admitted.push(k),
                        Some(2) => {}
                        other => panic!(
                            "guard exited {other:?}: {}",
                            String::from_utf8_lossy(&out.stderr)
                        ),
                    }
                }
                admitted
            })
        })
        .collect();
    let mut counts = vec![0; KEYS];
    for h in handles {
        for k in h.join().expect("thread") {
            counts[k] += 1;
        }
    }
    assert!(
        counts.iter().all(|&c| c == 1),
        "admissions per key: {counts:?}"
    );
    assert_eq!(
        chain_effect_entries(&root),
        PROCS * KEYS,
        "every decision is on the chain"
    );
    assert_eq!(rewind(&root, &["verify"]).status.code(), Some(0));
}

#[test]
fn a_sigkill_right_after_admission_leaves_the_key_spent() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    let out = rewind_env(
        root,
        &["guard", "--key", "wire-9"],
        &[("REWIND_FAILPOINT", "guard:after-commit")],
    );
    assert_eq!(out.status.signal(), Some(9));
    assert_eq!(
        guard(root, &["--key", "wire-9"]).1["code"],
        "SPENT",
        "admitted before the kill: never admitted again"
    );
    // Killed before the commit: nothing was admitted, so the next firing is the first.
    let out = rewind_env(
        root,
        &["guard", "--key", "wire-10"],
        &[("REWIND_FAILPOINT", "guard:before-commit")],
    );
    assert_eq!(out.status.signal(), Some(9));
    assert_eq!(guard(root, &["--key", "wire-10"]).1["code"], "FIRST_FIRING");
    assert_eq!(rewind(root, &["verify"]).status.code(), Some(0));
}

/// The barrier reads its table; the chain records every decision. A row
/// deleted or changed by SQL re-opened a spent effect and `verify --deep`
/// said nothing: it now compares the table with the chain (D103).
#[test]
fn verify_deep_finds_an_effect_row_changed_behind_the_chain() {
    let dir = common::tmp();
    workspace(dir.path());
    assert_eq!(guard(dir.path(), &["--key", "pay-1"]).0, 0);
    assert_eq!(guard(dir.path(), &["--key", "pay-2"]).0, 0);
    let v = rewind_json(dir.path(), &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    let c = rusqlite::Connection::open(dir.path().join(".rewind/ledger.db")).expect("open");
    c.execute("DELETE FROM effects WHERE key = 'pay-1'", [])
        .expect("delete");
    c.execute(
        "UPDATE effects SET status = 'failed' WHERE key = 'pay-2'",
        [],
    )
    .expect("update");
    drop(c);
    let out = rewind(dir.path(), &["--json", "verify", "--deep"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let bad = v["deep"]["bad"].to_string();
    assert!(bad.contains("pay-1") && bad.contains("row is gone"), "{v}");
    assert!(bad.contains("pay-2") && bad.contains("failed"), "{v}");
}

/// D132: a rewind reads the timeline once for all effects, walking up
/// only as far as the oldest admission. Effects admitted at different
/// depths of a long history, then a branch: each is judged as the
/// module's timeline rule says, by `guard` and in the rewind's
/// `effects_not_undone`, however far up its admission is.
#[test]
fn effects_at_every_depth_are_judged_by_one_reading_of_the_timeline() {
    let dir = common::tmp();
    let root = dir.path();
    workspace(root);
    let mut ids = Vec::new();
    let step = |n: usize, ids: &mut Vec<String>| {
        write(&root.join("app.txt"), format!("v{n}").as_bytes());
        ids.push(checkpoint_id(root, &[&format!("c{n}")]));
    };
    for n in 0..5 {
        step(n, &mut ids);
    }
    assert_eq!(guard(root, &["--key", "early"]).0, 0); // HEAD c4
    for n in 5..25 {
        step(n, &mut ids);
    }
    assert_eq!(guard(root, &["--key", "late"]).0, 0); // HEAD c24
    step(25, &mut ids);
    let not_undone = |r: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = r["effects_not_undone"]
            .as_array()
            .expect("list")
            .iter()
            .map(|e| e["key"].as_str().unwrap_or_default().to_string())
            .collect();
        keys.sort();
        keys
    };
    // Back past `late` only, then past both: the newer branch point
    // first, so the walk must reach the older admission too.
    let r = rewind_json(root, &["rewind", &ids[10]]);
    assert_eq!(not_undone(&r), ["late"], "{r}");
    assert_eq!(code(&guard(root, &["--key", "early"]).1), "SPENT");
    assert_eq!(
        code(&guard(root, &["--key", "late"]).1),
        "SPENT_BEFORE_REWIND"
    );
    // Only what this rewind went back past: `late` was reported by the
    // one before (helper-85: a long session listed every effect ever
    // left behind, 212 lines for a one-file rewind).
    let r = rewind_json(root, &["rewind", &ids[2]]);
    assert_eq!(not_undone(&r), ["early"], "{r}");
    let all = rewind_json(root, &["effects"]);
    assert!(all.to_string().contains("late"), "{all}");
    // A new branch from c2 keeps both undone; forward to c25 restores both.
    step(100, &mut ids);
    assert_eq!(
        code(&guard(root, &["--key", "early"]).1),
        "SPENT_BEFORE_REWIND"
    );
    let r = rewind_json(root, &["replay", &ids[25]]);
    assert_eq!(not_undone(&r), Vec::<String>::new(), "{r}");
    assert_eq!(code(&guard(root, &["--key", "early"]).1), "SPENT");
    assert_eq!(code(&guard(root, &["--key", "late"]).1), "SPENT");
    // On c20, a checkpoint between the two admissions: `early` is on the
    // timeline, `late` is not.
    let r = rewind_json(root, &["replay", &ids[20]]);
    assert_eq!(not_undone(&r), ["late"], "{r}");
}
