//! Bad input gets one clear line naming the problem and the fix, exit 1,
//! and changes nothing: unknown ids, ambiguous prefixes, not a workspace,
//! paths outside the workspace, a read-only workspace, a full disk, a
//! corrupt or missing ledger.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Fs, LoopFs, assert_same, checkpoint_id, rewind, rewind_json, snapshot, write};

fn assert_clear_error(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit 1 expected; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "exactly one line: {err}");
    assert!(err.starts_with("rewind: error: "), "{err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

fn workspace_with_checkpoint(root: &Path) -> String {
    write(&root.join("a.txt"), b"a");
    write(&root.join("dir/b.txt"), b"b");
    checkpoint_id(root, &["base"])
}

#[test]
fn unknown_ids_name_the_id_and_suggest_list() {
    let dir = common::tmp();
    let root = dir.path();
    workspace_with_checkpoint(root);
    write(&root.join("a.txt"), b"changed");
    let before = snapshot(root);
    for verb in [
        &["rewind", "nosuchid"][..],
        &["replay", "zzzz"],
        &["restore", "nope", "--", "a.txt"],
        &["diff", "nothere"],
    ] {
        let out = rewind(root, verb);
        assert_clear_error(&out, "rewind list");
    }
    assert_same("unknown id changes nothing", &before, &snapshot(root));
    let out = rewind(root, &["--json", "rewind", "nosuchid"]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("json error object on stdout");
    assert_eq!(v["error"]["code"], "UNKNOWN_ID");
}

#[test]
fn an_ambiguous_prefix_lists_the_candidates() {
    let dir = common::tmp();
    let root = dir.path();
    let mut ids: Vec<String> = Vec::new();
    let clash = loop {
        write(&root.join("f"), format!("{}", ids.len()).as_bytes());
        let id = checkpoint_id(root, &[]);
        if let Some(other) = ids.iter().find(|o| o.as_bytes()[0] == id.as_bytes()[0]) {
            break (other.clone(), id);
        }
        ids.push(id);
        assert!(ids.len() < 100, "ids never share a first character?");
    };
    let before = snapshot(root);
    let out = rewind(root, &["rewind", &clash.0[..1]]);
    assert_clear_error(&out, "ambiguous");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&clash.0) && err.contains(&clash.1), "{err}");
    assert_same("ambiguous prefix changes nothing", &before, &snapshot(root));
}

/// Checkpoints are named as the output shows them (helper-31, D227): an
/// id or its prefix typed in capitals names the same checkpoint (labels
/// stay exact), and `live`, which `diff` prints as its TO, is accepted as
/// TO; as FROM, or as a label, it is a usage error that changes nothing.
#[test]
fn checkpoints_are_named_as_the_output_shows_them() {
    let dir = common::tmp();
    let root = dir.path();
    let mut id = workspace_with_checkpoint(root);
    // One id in ~11,000 is all digits, with no case to change.
    while !id.bytes().any(|b| b.is_ascii_lowercase()) {
        write(&root.join("a.txt"), id.as_bytes());
        id = checkpoint_id(root, &["base"]);
    }
    write(&root.join("a.txt"), b"changed");
    let upper = id.to_ascii_uppercase();
    for spec in [upper.as_str(), &upper[..5]] {
        let v = rewind_json(root, &["diff", spec]);
        assert_eq!(v["from"], id.as_str(), "{spec}: {v}");
    }
    // A label is exact: `BASE` does not name `base`.
    let out = rewind(root, &["diff", "BASE"]);
    assert_clear_error(&out, "rewind list");
    let implicit = rewind_json(root, &["diff"]);
    let named = rewind_json(root, &["diff", "HEAD", "live"]);
    assert_eq!(named, implicit, "`live` as TO is the live tree");
    assert_eq!(named["to"], "live");
    assert_eq!(
        named["changes"].as_array().map(Vec::len),
        Some(1),
        "{named}"
    );
    let before = snapshot(root);
    let out = rewind(root, &["diff", "live", "HEAD"]);
    assert_clear_error(&out, "rewind diff HEAD live");
    let out = rewind(root, &["checkpoint", "live"]);
    assert_clear_error(&out, "the live tree");
    assert_same("refused names change nothing", &before, &snapshot(root));
    assert_eq!(
        rewind_json(root, &["list"])["checkpoints"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "a refused label stored a checkpoint"
    );
}

#[test]
fn outside_a_workspace_says_run_init() {
    let dir = common::tmp();
    let out = rewind(dir.path(), &["status"]);
    assert_clear_error(&out, "rewind init");
    let out = rewind(dir.path(), &["list"]);
    assert_clear_error(&out, "not a rewind workspace");
    assert!(
        !dir.path().join(".rewind").exists(),
        "a failed read-only verb creates nothing"
    );
    let missing = dir.path().join("no-such-dir");
    let out = rewind(
        dir.path(),
        &["-C", missing.to_str().expect("utf8"), "status"],
    );
    assert_clear_error(&out, "does not exist");
    let file = dir.path().join("a-file");
    write(&file, b"x");
    let out = rewind(dir.path(), &["-C", file.to_str().expect("utf8"), "status"]);
    assert_clear_error(&out, "is not a directory");
    // Every verb says the same (D218): `checkpoint` and `init` gave a
    // bare OS error.
    for verb in ["checkpoint", "init", "list"] {
        let out = rewind(dir.path(), &["-C", missing.to_str().expect("utf8"), verb]);
        assert_clear_error(&out, "does not exist: name the workspace's directory");
        let out = rewind(dir.path(), &["-C", file.to_str().expect("utf8"), verb]);
        assert_clear_error(&out, "is not a directory: name the workspace's directory");
    }
    assert!(!missing.exists(), "nothing made");
    // Inside a workspace too: it acted on the one around the file
    // (helper-74).
    let ws = dir.path().join("ws-file");
    workspace_with_checkpoint(&ws);
    let inner = ws.join("a-file");
    write(&inner, b"x");
    for verb in ["status", "checkpoint"] {
        let out = rewind(dir.path(), &["-C", inner.to_str().expect("utf8"), verb]);
        assert_clear_error(&out, "is not a directory: name the workspace's directory");
    }
    // An empty checkpoint is a usage error, not "no checkpoint matches
    // ''", and an empty label is said without a stray space (D225).
    let ws = dir.path().join("ws-empty");
    workspace_with_checkpoint(&ws);
    for verb in ["rewind", "diff"] {
        let out = rewind(&ws, &["--json", verb, ""]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "USAGE", "{verb}: {v}");
    }
    let out = rewind(&ws, &["checkpoint", ""]);
    assert_clear_error(&out, "the label is empty");
    // `-C` after `init`, `mount` and `unmount` too (D224): it was a usage
    // error there, the global option's name taken by their own argument.
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).expect("mkdir");
    let fresh_arg = fresh.to_str().expect("utf8");
    let out = rewind(dir.path(), &["init", "-C", fresh_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fresh.join(".rewind").is_dir());
    let out = rewind(dir.path(), &["unmount", "-C", fresh_arg]);
    assert_clear_error(&out, "is not mounted by rewind");
    // A parser's multi-line error is one line too (D218).
    write(
        &dir.path().join("p/.codex/config.toml"),
        b"[mcp_servers\nx=1\n",
    );
    let out = rewind(&dir.path().join("p"), &["integrate", "codex"]);
    assert_clear_error(&out, "not valid TOML");
    // Usage errors in JSON name what is missing; a hook payload that is
    // not JSON answers in JSON too; an empty effect key is refused.
    let out = rewind(dir.path(), &["--json", "rewind"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("<ID>")),
        "{v}"
    );
    let out = common::rewind_fed(
        dir.path(),
        &["--json", "hook", "pre-tool-use"],
        b"nope",
        &[] as &[(&str, &str)],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "USAGE", "{v}");
    let out = rewind(dir.path(), &["guard", "--key", ""]);
    assert_clear_error(&out, "key is empty");
}

/// An effect key, scope or kind (D189) with a control character in it
/// printed like another effect in `effects` while the barrier kept the
/// two apart; it is refused as a usage error and nothing is recorded.
#[test]
fn an_effect_named_with_a_control_character_is_refused_and_not_recorded() {
    let dir = common::tmp();
    let root = dir.path().join("ws");
    workspace_with_checkpoint(&root);
    for effect in [
        r#"{"key": "deploy\u0000prod"}"#,
        r#"{"key": "deploy\nprod"}"#,
        r#"{"key": "deploy", "scope": "ops\u0007"}"#,
        r#"{"key": "   "}"#,
        r#"{"key": "deploy", "kind": "pay\nFAKE   default:evil  payment"}"#,
        r#"{"key": "deploy", "kind": "   "}"#,
        // D306: characters a terminal hides or reorders (helper-61).
        r#"{"key": "deploy\u202eprod"}"#,
        r#"{"key": "deploy\u200b"}"#,
        r#"{"key": "deploy", "kind": "pay\u2028ment"}"#,
    ] {
        let out = rewind(&root, &["guard", effect]);
        assert_clear_error(&out, "the effect's");
    }
    let out = rewind(&root, &["guard", "--key", "déploiement-👩\u{200d}💻"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "accents and emoji joiners are text"
    );
    let out = rewind(&root, &["guard", "--key", "a\\tb"]);
    assert_eq!(out.status.code(), Some(0), "a backslash is printable");
    let out = rewind(&root, &["--json", "effects"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let keys: Vec<&str> = v["effects"]
        .as_array()
        .expect("effects array")
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(keys, ["déploiement-👩\u{200d}💻", "a\\tb"], "{v}");
}

#[test]
fn paths_outside_the_workspace_are_refused() {
    let dir = common::tmp();
    let root = dir.path().join("ws");
    let id = workspace_with_checkpoint(&root);
    let before = snapshot(&root);
    let out = rewind(&root, &["restore", &id, "--", "../elsewhere"]);
    // The error names the path it resolved to.
    assert_clear_error(
        &out,
        &format!(
            "{} is outside the workspace",
            dir.path().join("elsewhere").display()
        ),
    );
    let out = rewind(&root, &["restore", &id, "--", ".rewind/ledger.db"]);
    assert_clear_error(&out, "rewind's own state");
    assert_same("refused restore changes nothing", &before, &snapshot(&root));
    // With -C, a relative path is relative to that directory, as for
    // `git -C` (it was resolved against the caller's directory, and
    // refused as outside).
    write(&root.join("a.txt"), b"changed");
    let out = rewind(
        dir.path(),
        &["-C", "ws/dir", "restore", &id, "--", "../a.txt"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(root.join("a.txt")).expect("read"), b"a");
    let diff = common::rewind_json(dir.path(), &["-C", "ws", "diff", &id, "--", "a.txt"]);
    assert!(common::changed_paths(&diff).is_empty(), "{diff}");
}

#[test]
fn a_corrupt_or_missing_ledger_is_reported_and_the_tree_is_untouched() {
    let dir = common::tmp();
    let root = dir.path();
    let id = workspace_with_checkpoint(root);
    write(&root.join("a.txt"), b"live work");
    let before = snapshot(root);
    let ledger = root.join(".rewind/ledger.db");
    let good = std::fs::read(&ledger).expect("read ledger");
    let mut bad = good.clone();
    for b in bad.iter_mut().take(100) {
        *b = 0x5a;
    }
    std::fs::write(&ledger, &bad).expect("corrupt");
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-wal"));
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-shm"));
    for verb in [
        &["rewind", &id][..],
        &["checkpoint"],
        &["status"],
        &["list"],
    ] {
        let out = rewind(root, verb);
        assert_clear_error(&out, "corrupt");
    }
    assert_same("corrupt ledger: tree untouched", &before, &snapshot(root));

    std::fs::remove_file(&ledger).expect("rm ledger");
    for verb in [&["rewind", &id][..], &["checkpoint"], &["status"]] {
        let out = rewind(root, verb);
        assert_clear_error(&out, "missing");
    }
    assert_same("missing ledger: tree untouched", &before, &snapshot(root));
}

/// D161: a damaged page of `operations`, the one table only a rewind's
/// finishing commit writes, used to be met after the apply: `restore`
/// overwrote the live file, then failed LEDGER_CORRUPT, and every later
/// command, `list` included, took another "before finishing" checkpoint
/// and failed the same way. The intent's commit now meets it first.
#[test]
fn a_damaged_page_stops_a_restore_before_the_tree_changes() {
    let dir = common::tmp();
    let root = dir.path();
    let id = workspace_with_checkpoint(root);
    write(&root.join("a.txt"), b"second");
    checkpoint_id(root, &["second"]);
    write(&root.join("a.txt"), b"live work, never checkpointed");
    let ledger = root.join(".rewind/ledger.db");
    let (page, page_size) = {
        let c = rusqlite::Connection::open(&ledger).expect("open ledger");
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("fold the WAL");
        let page: i64 = c
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = 'operations'",
                [],
                |r| r.get(0),
            )
            .expect("operations root page");
        let size: i64 = c
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size");
        (page as usize, size as usize)
    };
    let mut bytes = std::fs::read(&ledger).expect("read ledger");
    let at = (page - 1) * page_size;
    for (i, b) in bytes[at..at + page_size].iter_mut().enumerate() {
        *b = (i * 151 % 251) as u8;
    }
    std::fs::write(&ledger, &bytes).expect("damage one page");
    let before = snapshot(root);
    let checkpoints = || -> i64 {
        let c = rusqlite::Connection::open(&ledger).expect("open ledger");
        c.query_row("SELECT count(*) FROM checkpoints", [], |r| r.get(0))
            .expect("count")
    };
    let count = checkpoints();
    for verb in [
        &["restore", &id, "--", "a.txt"][..],
        &["rewind", &id],
        &["undo"],
    ] {
        let out = rewind(root, verb);
        assert_clear_error(&out, "corrupt");
        assert_same(
            &format!("{verb:?} with a damaged page"),
            &before,
            &snapshot(root),
        );
    }
    // Nothing pending: reading verbs work, and add nothing.
    for verb in [&["status"][..], &["list"], &["status"]] {
        let out = rewind(root, verb);
        assert!(out.status.success(), "{verb:?}: {out:?}");
    }
    assert_eq!(checkpoints(), count, "no checkpoint was added");
    assert_eq!(
        std::fs::read(root.join("a.txt")).expect("read"),
        b"live work, never checkpointed"
    );
}

/// D119: on a filesystem mounted read-only (ext4's `errors=remount-ro`
/// after a disk error, say) the reading verbs still show the history, from
/// the persisted WAL or, once folded, from the main file alone; every
/// writing verb fails with one line naming the cause, and nothing changes.
#[test]
fn a_read_only_workspace_reads_its_history_and_refuses_writes() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    let id = workspace_with_checkpoint(&root);
    write(&root.join("a.txt"), b"changed");
    let before = snapshot(&root);
    let reads = |when: &str| {
        let list = rewind_json(&root, &["list"]);
        assert_eq!(list["checkpoints"][0]["id"], id.as_str(), "{when}: {list}");
        let status = rewind_json(&root, &["status"]);
        assert_eq!(
            common::changed_paths(&status),
            ["a.txt"],
            "{when}: {status}"
        );
        let diff = rewind_json(&root, &["diff", &id]);
        assert_eq!(common::changed_paths(&diff), ["a.txt"], "{when}: {diff}");
        let verify = rewind(&root, &["verify", "--deep"]);
        assert!(verify.status.success(), "{when}: {verify:?}");
        let du = rewind_json(&root, &["du"]);
        assert_eq!(
            du["checkpoints"].as_array().map(Vec::len),
            Some(1),
            "{when}: {du}"
        );
    };
    lfs.remount("ro");
    reads("read-only, WAL kept");
    let writes = [
        rewind(&root, &["checkpoint"]),
        rewind(&root, &["rewind", &id]),
        rewind(&root, &["restore", &id, "--", "a.txt"]),
        rewind(&root, &["gc"]),
    ];
    lfs.remount("rw");
    for out in writes {
        assert_clear_error(&out, "read-only filesystem");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&*lfs.mnt.to_string_lossy()),
            "names the path: {err}"
        );
    }
    assert_same("read-only: tree untouched", &before, &snapshot(&root));
    // A ledger whose WAL was folded and removed (a copy, a backup) is read
    // from the main file alone.
    let db = root.join(".rewind/ledger.db");
    let c = rusqlite::Connection::open(&db).expect("open ledger");
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .expect("fold the WAL");
    drop(c);
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-wal"));
    let _ = std::fs::remove_file(root.join(".rewind/ledger.db-shm"));
    lfs.remount("ro");
    reads("read-only, no WAL");
    lfs.remount("rw");
    assert_same("read-only: tree untouched", &before, &snapshot(&root));
    // A format-2 ledger at schema 5 (the last build before format 3)
    // reads as it is; an earlier schema needs its one upgrade, and says
    // so rather than "read-only" from a command that works read-only
    // (helper-83, D334).
    let set = |q: &str| {
        rusqlite::Connection::open(&db)
            .expect("open ledger")
            .execute_batch(q)
            .expect("sql");
    };
    set("UPDATE meta SET value = '2' WHERE key = 'format_version'");
    lfs.remount("ro");
    reads("read-only, format 2");
    lfs.remount("rw");
    set("PRAGMA user_version = 4");
    lfs.remount("ro");
    let out = rewind(&root, &["--json", "list"]);
    lfs.remount("rw");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "READ_ONLY", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("written by an earlier build of rewind and is upgraded once"),
        "{v}"
    );
    reads("read-write again: upgraded");
}

/// A rewind killed halfway, then the filesystem remounted read-only (an
/// ext4 error, a rescue boot): the reading verbs show the tree as it is
/// and say it is half-rewound, as the READ_ONLY error promises; they
/// failed on the lock they took to finish it. Once writable again, the
/// next command finishes the rewind.
#[test]
fn an_interrupted_rewind_on_a_read_only_filesystem_is_shown_not_refused() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    for i in 0..5 {
        write(&root.join(format!("f{i}")), format!("{i}\n").as_bytes());
    }
    let base = checkpoint_id(&root, &["base"]);
    let at_base = snapshot(&root);
    for i in 0..5 {
        write(
            &root.join(format!("f{i}")),
            format!("edited {i}\n").as_bytes(),
        );
    }
    let out = common::rewind_env(
        &root,
        &["rewind", &base, "-q"],
        &[("REWIND_FAILPOINT", "apply:file-written:2")],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "killed at its failpoint: {out:?}"
    );
    lfs.remount("ro");
    let half = snapshot(&root);
    for args in [&["status"][..], &["list"], &["diff"]] {
        let out = rewind(&root, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} works read-only: {err}");
        assert!(
            err.contains("half-rewound") && err.contains("remount"),
            "{args:?} says the tree is half-rewound: {err}"
        );
    }
    let st = rewind_json(&root, &["status"]);
    assert_eq!(
        common::changed_paths(&st).len(),
        2,
        "two files were rewound before the kill: {st}"
    );
    assert_same("read-only: tree untouched", &half, &snapshot(&root));
    lfs.remount("rw");
    let out = rewind(&root, &["status"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("finished an interrupted rewind"),
        "{out:?}"
    );
    assert_same("finished once writable", &at_base, &snapshot(&root));
}

/// A rewind that would need more space than is free (no clones on ext4)
/// is refused before it starts, and says how much it needs and how much
/// is free: "no space left" alone left the user guessing how much to
/// free. Nothing changes; once there is room, the same rewind works.
#[test]
fn a_rewind_that_needs_more_space_than_is_free_says_how_much() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    let big: Vec<u8> = (0..20_000_000u32).map(|i| (i % 251) as u8).collect();
    write(&root.join("big.bin"), &big);
    let id = checkpoint_id(&root, &["with big"]);
    std::fs::remove_file(root.join("big.bin")).expect("rm");
    let avail = || {
        let dir = rewind_platform::Dir::open(&lfs.mnt).expect("open");
        let fs = rewind_platform::FsInfo::of(&dir).expect("statfs");
        fs.blocks_available * fs.block_size
    };
    let pad = lfs.mnt.join("pad");
    let st = Command::new("fallocate")
        .args(["-l", &(avail() - (5 << 20)).to_string()])
        .arg(&pad)
        .status()
        .expect("fallocate");
    assert!(st.success());
    let before = snapshot(&root);
    let out = rewind(&root, &["--json", "rewind", &id]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("this needs 20.1 MiB and ") && msg.contains("MiB are free"),
        "says what it needs and what is free: {msg}"
    );
    assert_same("refused: tree untouched", &before, &snapshot(&root));
    std::fs::remove_file(&pad).expect("rm pad");
    let r = rewind_json(&root, &["rewind", &id]);
    assert_eq!(r["changes"]["written"], 1, "{r}");
    assert_eq!(std::fs::read(root.join("big.bin")).expect("read"), big);
}

/// Root may write into the blocks ext4 keeps for it (5 %): its rewind's
/// space check counts them. Counted out, root was refused a rewind that
/// had room (`NO_SPACE` with 4 MiB "free" and 15 MiB writable).
#[test]
fn roots_rewind_counts_the_blocks_ext4_keeps_for_root() {
    if !common::is_root() {
        return common::skip_or_fail("the blocks ext4 keeps are root's");
    }
    let Some(lfs) = LoopFs::new(Fs::Ext4, 300) else {
        return;
    };
    let root = lfs.subdir("ws");
    let big = common::pseudo_random(8 << 20, 7);
    write(&root.join("big.bin"), &big);
    let id = checkpoint_id(&root, &["with big"]);
    std::fs::remove_file(root.join("big.bin")).expect("rm");
    let statfs = || {
        let dir = rewind_platform::Dir::open(&lfs.mnt).expect("open");
        rewind_platform::FsInfo::of(&dir).expect("statfs")
    };
    let fs = statfs();
    let avail = fs.blocks_available * fs.block_size;
    let st = Command::new("fallocate")
        .args(["-l", &(avail - (4 << 20)).to_string()])
        .arg(lfs.mnt.join("pad"))
        .status()
        .expect("fallocate");
    assert!(st.success());
    let fs = statfs();
    assert!(fs.blocks_available * fs.block_size < 9 << 20, "{fs:?}");
    assert!(fs.blocks_free * fs.block_size > 12 << 20, "{fs:?}");
    let r = rewind_json(&root, &["rewind", &id]);
    assert_eq!(r["changes"]["written"], 1, "{r}");
    assert_eq!(std::fs::read(root.join("big.bin")).expect("read"), big);
}

/// A rewind whose disk filled half-way, with no space left to go back
/// either, said NO_SPACE "... nothing was changed" over a tree that
/// matched neither checkpoint, and `status` failed the same way until
/// space was freed (helper-34, D239). The error now says the tree is
/// half-rewound and what finishes it; `status` shows that tree with a
/// warning; once space is freed the next command finishes the rewind.
#[test]
fn a_rewind_the_disk_stopped_half_way_says_so() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 48) else {
        return;
    };
    let root = lfs.subdir("ws");
    let files = |round: u32| {
        for i in 0..300u32 {
            let bytes: Vec<u8> = (0..20_000u32)
                .map(|j| (j.wrapping_mul(31) ^ i ^ round) as u8)
                .collect();
            write(&root.join(format!("d{}/f{i}.bin", i % 10)), &bytes);
        }
    };
    files(1);
    let c1 = checkpoint_id(&root, &["c1"]);
    let want = snapshot(&root);
    files(2);
    checkpoint_id(&root, &["c2"]);
    let rw = common::spawn_stopped_at(&root, &["--json", "rewind", &c1], "apply:file-written:5");
    // Every block, root's reserve included, down to the last 4 KiB.
    let filler = lfs.mnt.join("filler");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&filler).expect("create filler");
        for chunk in [1 << 20, 64 << 10, 4 << 10] {
            let block = vec![0x5a_u8; chunk];
            while f.write_all(&block).and_then(|()| f.sync_data()).is_ok() {}
        }
    }
    common::resume(&rw);
    let out = rw.wait_with_output().expect("wait");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(1), "{}", v["changes"]);
    assert_eq!(v["error"]["code"], "NO_SPACE", "{}", v["error"]);
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("half-rewound") && !msg.contains("nothing was changed"),
        "{msg}"
    );
    let out = rewind(&root, &["--json", "status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status on the full disk: {err}");
    assert!(err.contains("half-rewound"), "{err}");
    std::fs::remove_file(&filler).expect("free the space");
    rewind_json(&root, &["list"]);
    assert_same(
        "the rewind finished once there was space",
        &want,
        &snapshot(&root),
    );
}

#[test]
fn a_full_disk_fails_cleanly_and_changes_nothing() {
    // ext4 keeps 5% for root, which the test (as root) could use: 8 MB
    // to store against 1 MB free plus those 1.6 MB.
    let Some(lfs) = LoopFs::new(Fs::Ext4, 32) else {
        return;
    };
    let root = lfs.subdir("ws");
    write(&root.join("small.txt"), b"small");
    let id = checkpoint_id(&root, &[]);
    // Fill the disk, then make a change that needs space to store.
    let filler = lfs.mnt.join("filler");
    let _ = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", filler.display()),
            "bs=1M",
            "count=64",
        ])
        .output();
    let _ = Command::new("sync").status();
    let big: Vec<u8> = (0..8_000_000u32).map(|i| (i % 251) as u8).collect();
    let wrote = std::fs::write(root.join("big.bin"), &big).is_ok();
    let _ = std::fs::remove_file(&filler);
    // Leave just enough for the live file but not for a copy of it.
    if !wrote {
        std::fs::write(root.join("big.bin"), &big).expect("write big after freeing");
    }
    let free_target = 1_000_000u64;
    let avail = {
        let dir = rewind_platform::Dir::open(&lfs.mnt).expect("open");
        let fs = rewind_platform::FsInfo::of(&dir).expect("statfs");
        fs.blocks_available * fs.block_size
    };
    if avail > free_target {
        let pad = avail - free_target;
        let _ = Command::new("fallocate")
            .args(["-l", &pad.to_string()])
            .arg(lfs.mnt.join("pad"))
            .status();
    }
    let before = snapshot(&root);
    let stored = common::object_files(&root);
    let out = rewind(&root, &["checkpoint"]);
    assert_clear_error(&out, "no space left");
    assert_same("full disk: tree untouched", &before, &snapshot(&root));
    // D120: the chunks it did store are removed again ("nothing was
    // changed" is true, and the agent's own writes have their space back).
    assert_eq!(
        common::object_files(&root),
        stored,
        "the failed checkpoint left object files behind"
    );
    assert!(common::temp_leftovers(&root).is_empty() || rewind(&root, &["list"]).status.success());
    assert!(
        common::temp_leftovers(&root).is_empty(),
        "temp files of the failed checkpoint are cleaned"
    );
    // The history is intact and usable once there is space again.
    let _ = std::fs::remove_file(lfs.mnt.join("pad"));
    rewind_json(&root, &["checkpoint"]);
    rewind_json(&root, &["rewind", &id]);
    assert!(!root.join("big.bin").exists());
}

/// D332: an agent's runaway log filled the disk (ext4: no clones). The
/// rewind that deletes it first saves the tree, so that `undo` can bring
/// the log back, and that needs room for a copy: it was refused with
/// "free some space", naming neither the file nor that deleting it would
/// do. It names the file, its size, that the rewind deletes it and the
/// `rm`; a checkpoint names the file too. Done as it says, the rewind
/// works.
#[test]
fn a_rewind_stopped_by_the_file_it_deletes_names_it_and_how_to_go_on() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    write(&root.join("src/main.rs"), b"fn main() {}\n");
    let id = checkpoint_id(&root, &["clean"]);
    write(&root.join("src/main.rs"), b"broken\n");
    let log = root.join("logs/runaway.log");
    std::fs::create_dir_all(log.parent().expect("parent")).expect("mkdir logs");
    // Until the disk is full (dd fails at ENOSPC), with bytes that do
    // not repeat: chunks of zeros are stored once.
    let _ = Command::new("dd")
        .args(["if=/dev/urandom", &format!("of={}", log.display()), "bs=1M"])
        .output();
    let _ = Command::new("sync").status();
    assert!(
        std::fs::metadata(&log).expect("log").len() > 30 << 20,
        "the log filled the disk"
    );

    let out = rewind(&root, &["--json", "checkpoint"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
    let said = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("to store a copy of logs/runaway.log (") && said.contains(" MiB)"),
        "{said}"
    );

    let before = snapshot(&root);
    let out = rewind(&root, &["--json", "rewind", &id]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
    assert_same("refused: tree untouched", &before, &snapshot(&root));
    let said = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("to store a copy of logs/runaway.log (")
            && said.contains(&format!("the rewind to {id} (clean) deletes this file")),
        "{said}"
    );
    let rm = said
        .split("(`")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .expect("a command in the message");
    assert_eq!(rm, format!("rm {}", log.display()), "{said}");
    let ran = Command::new("sh").arg("-c").arg(rm).status().expect("sh");
    assert!(ran.success());

    rewind_json(&root, &["rewind", &id]);
    assert_eq!(
        std::fs::read(root.join("src/main.rs")).expect("main.rs"),
        b"fn main() {}\n"
    );
    assert!(!root.join("logs").exists());
    // What was saved first is the tree without the log: `undo` brings
    // the broken edit back, not the log.
    rewind_json(&root, &["undo"]);
    assert_eq!(
        std::fs::read(root.join("src/main.rs")).expect("main.rs"),
        b"broken\n"
    );
    assert!(!log.exists());
}

/// A first checkpoint the disk stopped (ext4: every file is copied) had
/// committed the small objects it spilled ahead of the checkpoint: tens
/// of MiB left in the ledger under "nothing was changed", which ten `gc`
/// runs gave back, and advice to prune checkpoints that did not exist
/// (helper-70). They are dropped with the failure, and the error names
/// `.rewindignore`.
#[test]
fn a_first_checkpoint_the_disk_stopped_leaves_no_objects_in_the_ledger() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 160) else {
        return;
    };
    let root = lfs.subdir("ws");
    // 30 MiB of small files, each stored in the ledger (past what a
    // capture keeps in memory), then a file too big to copy.
    for i in 0..640 {
        write(
            &root.join(format!("small/{i:03}.bin")),
            &common::pseudo_random(48 << 10, 0x9e37_79b9 + i),
        );
    }
    write(
        &root.join("zz/big.bin"),
        &common::pseudo_random(40 << 20, 1 << 20),
    );
    let _ = Command::new("sync").status();
    let avail = {
        let dir = rewind_platform::Dir::open(&lfs.mnt).expect("open");
        let fs = rewind_platform::FsInfo::of(&dir).expect("statfs");
        fs.blocks_available * fs.block_size
    };
    let keep_free = 26u64 << 20;
    assert!(avail > keep_free, "precondition: {avail} bytes free");
    let pad = lfs.mnt.join("pad");
    let padded = Command::new("fallocate")
        .args(["-l", &(avail - keep_free).to_string()])
        .arg(&pad)
        .status()
        .expect("fallocate");
    assert!(padded.success());
    let before = snapshot(&root);
    let out = rewind(&root, &["checkpoint"]);
    assert_same("tree untouched", &before, &snapshot(&root));
    let held: u64 = ["ledger.db", "ledger.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(root.join(".rewind").join(f)).ok())
        .map(|m| m.len())
        .sum();
    assert!(held < 4 << 20, "the ledger keeps {held} bytes");
    assert_clear_error(&out, "for the first checkpoint");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(".rewindignore"),
        "{out:?}"
    );
    assert_eq!(rewind_json(&root, &["list"])["total"], 0);

    // As the error says: leave what does not fit out, and the first
    // checkpoint is made.
    write(&root.join(".rewindignore"), b"zz/\n");
    let ck = rewind_json(&root, &["checkpoint", "first"]);
    assert_eq!(ck["changes"]["added"].as_u64(), Some(642), "{ck}");
    std::fs::remove_file(&pad).expect("free the space");
}

/// On a full btrfs every command died of SIGBUS (exit 135, no word):
/// SQLite stores into its `-shm` through a shared mapping, and a
/// copy-on-write page with no free block to go to can only fault. The
/// `-shm` is now made to be overwritten in place (D97): reading commands
/// keep working and writing ones fail with NO_SPACE, on both engines.
///
/// The btrfs engine's checkpoint is acknowledged before its manifest is
/// built; when the disk filled first (in CI, the detached builder ran
/// late), `list` and `status` tried to build it and failed NO_SPACE. They
/// now read it from its snapshot (D266): `list` names it HEAD, `status`
/// compares with it, and the first command after space is freed builds it.
#[test]
fn a_full_btrfs_gives_no_space_not_a_crash() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 256) else {
        return;
    };
    let plain = lfs.subdir("plain");
    let sub = lfs.subvolume("sub");
    let (fresh_dir, fresh_sub) = (lfs.subdir("fresh"), lfs.subvolume("fresh-sub"));
    let mut ids = Vec::new();
    for ws in [&plain, &sub] {
        write(&ws.join("a.txt"), b"a");
        // Built by the next command that needs it, as when the disk fills
        // before the detached builder runs.
        let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .args(["--json", "checkpoint"])
            .env("REWIND_MANIFEST", "deferred")
            .current_dir(ws)
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        ids.push(v["id"].as_str().expect("id").to_string());
        let shm = ["ledger.db-shm", "state/ledger.db-shm"]
            .iter()
            .map(|p| ws.join(".rewind").join(p))
            .find(|p| p.exists())
            .expect("a -shm file");
        let attrs = Command::new("lsattr").arg(&shm).output().expect("lsattr");
        let attrs = String::from_utf8_lossy(&attrs.stdout);
        assert!(
            attrs.split(' ').next().is_some_and(|a| a.contains('C')),
            "{attrs}"
        );
        write(&ws.join("a.txt"), &vec![7u8; 100_000]);
    }
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", lfs.mnt.join("filler").display()))
        .output();
    let _ = Command::new("sync").status();
    for (ws, id) in [&plain, &sub].into_iter().zip(&ids) {
        for args in [&["list"][..], &["status"]] {
            let out = rewind(ws, args);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}: {args:?}: {}",
                ws.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let list = rewind_json(ws, &["list"]);
        assert_eq!(list["head"], id.as_str(), "{}: {list}", ws.display());
        let (holds, other) = match *ws == sub {
            true => (&list["pending"], &list["checkpoints"]),
            false => (&list["checkpoints"], &list["pending"]),
        };
        assert_eq!(holds[0]["id"], id.as_str(), "{list}");
        assert!(other.as_array().is_none_or(Vec::is_empty), "{list}");
        let status = rewind_json(ws, &["status"]);
        assert_eq!(status["head"], id.as_str(), "{status}");
        if *ws == sub {
            // D273 (helper-48): named, it is not "unknown", and the MCP
            // list holds it.
            let out = rewind(ws, &["--json", "diff", "HEAD"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            assert_eq!(v["error"]["code"], "MANIFEST_PENDING", "{v}");
            let answers = common::raw_mcp_answers(
                ws,
                &[
                    common::INITIALIZE,
                    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                    r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list","arguments":{}}}"#,
                ],
            );
            let listed = &answers[1]["result"]["structuredContent"];
            assert_eq!(listed["head"], id.as_str(), "{listed}");
            assert_eq!(listed["checkpoints"][0]["id"], id.as_str(), "{listed}");
        }
        assert_eq!(
            status["changes"],
            serde_json::json!([{"path": "a.txt", "status": "modified"}]),
            "{}: compared with HEAD, read from its snapshot if need be",
            ws.display()
        );
        let snapshots = |ws: &Path| -> Vec<String> {
            std::fs::read_dir(ws.join(".rewind/state/snapshots"))
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (stored, snapped) = (common::object_files(ws), snapshots(ws));
        let out = rewind(ws, &["--json", "checkpoint"]);
        assert_eq!(out.status.code(), Some(1), "{}", ws.display());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
        // D120: nothing of the failed checkpoint stays behind, neither
        // objects nor (btrfs engine) the snapshot it took.
        assert_eq!(common::object_files(ws), stored, "{}", ws.display());
        assert_eq!(snapshots(ws), snapped, "{}", ws.display());
    }
    // D270: an `init` the full disk stopped leaves no `.rewind/` (it left
    // an empty ledger, and on a subvolume a state subvolume, and said
    // nothing was changed).
    for fresh in [&fresh_dir, &fresh_sub] {
        let out = rewind(fresh, &["--json", "init"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
        assert!(!fresh.join(".rewind").exists(), "{}", fresh.display());
    }
    std::fs::remove_file(lfs.mnt.join("filler")).expect("rm filler");
    let _ = Command::new("sync").status();
    let list = rewind_json(&sub, &["list"]);
    assert_eq!(list["pending"], serde_json::Value::Null, "built: {list}");
    assert_eq!(list["checkpoints"][0]["id"], ids[1].as_str(), "{list}");
}

/// A rewind that restored a small object read it through a second
/// connection to the ledger, which closed last and deleted the WAL and
/// `-shm`; the next command had to make a new `-shm`, and on a full disk
/// every reader failed (helper-47). The second connection now keeps them
/// as the ledger's own does, and a ledger whose `-shm` cannot be made on
/// a full disk is read through a connection that keeps the WAL's index in
/// memory: readers answer, writers say NO_SPACE, nothing changes (D267).
#[test]
fn readers_answer_on_a_full_disk_after_a_rewind_and_without_a_shm() {
    // XFS: on a full one not even an empty `-shm` can be made (no inode).
    let Some(lfs) = LoopFs::new(Fs::Xfs, 320) else {
        return;
    };
    let root = lfs.subdir("ws");
    let id = workspace_with_checkpoint(&root);
    write(&root.join("small.txt"), b"small");
    let small = checkpoint_id(&root, &["small"]);
    std::fs::remove_file(root.join("small.txt")).expect("rm");
    checkpoint_id(&root, &["without"]);
    rewind_json(&root, &["rewind", &small]);
    let state = root.join(".rewind");
    for sidecar in ["ledger.db-wal", "ledger.db-shm"] {
        assert!(state.join(sidecar).exists(), "{sidecar} kept by the rewind");
    }
    write(&root.join("a.txt"), b"changed");
    lfs.fill_to_the_last_block();
    // What a copy or backup of the history lacks, and the old build lost.
    std::fs::remove_file(state.join("ledger.db-shm")).expect("rm -shm");
    let before = snapshot(&root);
    let list = rewind_json(&root, &["list"]);
    assert_eq!(list["head"], small.as_str(), "{list}");
    assert_eq!(list["checkpoints"][0]["id"], id.as_str(), "{list}");
    let status = rewind_json(&root, &["status"]);
    assert_eq!(common::changed_paths(&status), ["a.txt"], "{status}");
    let verify = rewind(&root, &["verify"]);
    assert!(verify.status.success(), "{verify:?}");
    let wal = || std::fs::read(state.join("ledger.db-wal")).expect("read the WAL");
    let wal_before = wal();
    for args in [&["checkpoint"][..], &["rewind", &id]] {
        let out = rewind(&root, &[&["--json"][..], args].concat());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "NO_SPACE", "{args:?}: {v}");
    }
    // D273 (helper-48): the effect barrier admitted and wrote through the
    // exclusive connection; it now fails closed, saying why.
    let guard = rewind_json_any(&root, &["guard", "--key", "k1", "--payload", "p"]);
    assert_eq!(guard["decision"], "refused", "{guard}");
    assert!(
        guard["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no space left")),
        "{guard}"
    );
    assert!(wal() == wal_before, "the ledger was written on a full disk");
    assert_same("a full disk: tree untouched", &before, &snapshot(&root));
    for f in ["FILL", "FILL-tail"] {
        let _ = std::fs::remove_file(lfs.mnt.join(f));
    }
    rewind_json(&root, &["rewind", &id]);
    assert_eq!(std::fs::read(root.join("a.txt")).expect("read"), b"a");
}

/// D274: on an exactly full disk `gc`, the command every NO_SPACE message
/// points at, failed NO_SPACE itself: its first write (the ledger's WAL)
/// needs space (helper-47). A reserve of real blocks beside the ledger,
/// made while there is room, is given back for it, and made again later.
#[test]
fn gc_frees_space_on_an_exactly_full_disk() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 256) else {
        return;
    };
    let root = lfs.subdir("ws");
    write(&root.join("a.txt"), b"a");
    let pattern: Vec<u8> = (0..30u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&root.join("big.bin"), &pattern);
    let big = checkpoint_id(&root, &["big"]);
    std::fs::remove_file(root.join("big.bin")).expect("rm");
    checkpoint_id(&root, &["small"]);
    let reserve = root.join(".rewind/reserve");
    assert!(reserve.exists(), "made while there was room");
    lfs.fill_to_the_last_block();
    let out = rewind(&root, &["--json", "gc", "--keep-last", "1", "--force"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["pruned"], serde_json::json!([big]), "{v}");
    assert!(v["freed"]["bytes"].as_u64() >= Some(30 << 20), "{v}");
    let verify = rewind(&root, &["verify"]);
    assert!(verify.status.success(), "{verify:?}");
    assert!(!reserve.exists(), "given back");
    for f in ["FILL", "FILL-tail"] {
        let _ = std::fs::remove_file(lfs.mnt.join(f));
    }
    lfs.sync();
    checkpoint_id(&root, &["after"]);
    assert!(reserve.exists(), "made again once there is room");
}

/// Without the reserve (a filesystem too small to keep one, or one used
/// already), `gc` on a full disk failed `NO_SPACE` with the advice every
/// `NO_SPACE` gives: run `rewind gc` (helper-52). It says it needs room
/// that only other files can give, changes nothing, and runs once there is.
#[test]
fn gc_that_cannot_write_on_a_full_disk_does_not_point_at_itself() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 128) else {
        return;
    };
    let root = lfs.subdir("ws");
    let pattern: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&root.join("big.bin"), &pattern);
    let big = checkpoint_id(&root, &["big"]);
    std::fs::remove_file(root.join("big.bin")).expect("rm");
    write(&root.join("a.txt"), b"a");
    checkpoint_id(&root, &["small"]);
    let _ = std::fs::remove_file(root.join(".rewind/reserve"));
    lfs.fill_to_the_last_block();
    let before = rewind_json_any(&root, &["list", "--all"]);
    let out = rewind(&root, &["--json", "gc", "--keep-last", "1", "--force"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("not even for `rewind gc`"), "{msg}");
    assert!(!msg.contains("`rewind gc` prunes"), "{msg}");
    assert!(msg.contains("nothing was changed"), "{msg}");
    assert_eq!(rewind_json_any(&root, &["list", "--all"]), before);
    for f in ["FILL", "FILL-tail"] {
        let _ = std::fs::remove_file(lfs.mnt.join(f));
    }
    lfs.sync();
    let v = rewind_json(&root, &["gc", "--keep-last", "1", "--force"]);
    assert_eq!(v["pruned"], serde_json::json!([big]), "{v}");
}

/// `rewind --json ARGS` in `dir`: its JSON whatever its exit code.
fn rewind_json_any(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = rewind(dir, &[&["--json"][..], args].concat());
    serde_json::from_slice(&out.stdout).expect("json")
}

/// A SIGBUS that does come (an older `-shm`, another mapped file) ends
/// the command with exit 1 and a line that says what to do, in JSON too,
/// instead of killing it without a word.
#[test]
fn a_sigbus_is_reported_not_a_silent_death() {
    let dir = common::tmp();
    rewind_json(dir.path(), &["init"]);
    for json in [false, true] {
        let mut args = vec!["hook", "pre-tool-use"];
        if json {
            args.insert(0, "--json");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .args(&args)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // The hook waits for its payload on stdin: deliver SIGBUS then.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let st = Command::new("kill")
            .args(["-BUS", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
        // Rust's own SIGBUS handler swallows a signal that no fault
        // raised: then the hook reads EOF and fails on its payload.
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "json {json}: {err}");
        assert!(err.contains("SIGBUS") && err.contains("full"), "{err}");
        if json {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
        }
    }
}

/// A shell whose working directory is gone (deleted, or a dead mount that
/// was detached) gets one line naming where it thinks it is and the `cd`
/// that fixes it (to the nearest directory still there), not "open
/// workspace .: No such file or directory".
#[test]
fn a_working_directory_that_is_gone_is_named_with_the_cd_that_fixes_it() {
    let tmp = common::tmp();
    let gone = tmp.path().join("gone");
    std::fs::create_dir(&gone).expect("mkdir");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && rmdir '{}' && exec '{}' --json status",
            gone.display(),
            gone.display(),
            env!("CARGO_BIN_EXE_rewind")
        ))
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let m = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        m.contains("working directory cannot be reached")
            && m.contains(&format!("`cd {}`", tmp.path().display())),
        "{v}"
    );
}

/// A rewind that removes the caller's directory says so, and the next
/// command from it names the nearest directory that still exists: its
/// advice was to `cd` into the one that was gone.
#[test]
fn a_rewind_that_removes_the_callers_directory_says_where_to_go() {
    let tmp = common::tmp();
    let ws = tmp.path();
    write(&ws.join("a.txt"), b"a");
    let a = common::checkpoint_id(ws, &["a"]);
    std::fs::create_dir_all(ws.join("sub/deeper")).expect("mkdir");
    common::checkpoint_id(ws, &["b"]);
    let deeper = ws.join("sub/deeper");
    let out = rewind(&deeper, &["rewind", &a]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("working directory") && err.contains(&format!("`cd {}`", ws.display())),
        "{err}"
    );
    // Back (undo from the workspace), then the same rewind from a shell
    // that stays in the removed directory and runs the next command there.
    rewind_json(ws, &["undo"]);
    assert!(deeper.is_dir());
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && '{bin}' rewind -q {a}; exec '{bin}' --json undo",
            deeper.display(),
            bin = env!("CARGO_BIN_EXE_rewind"),
        ))
        .output()
        .expect("sh");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let m = v["error"]["message"].as_str().unwrap_or("");
    assert!(m.contains(&format!("`cd {}`", ws.display())), "{v}");
}

/// Smaller refusals that named the wrong thing or did too much: an anchor
/// file in a directory that does not exist (the directories were made, at
/// `/` if need be), a restore through a symlink ("exists neither…"), and a
/// patch of a file that is not UTF-8 (replacement characters, as if text).
#[test]
fn anchors_symlinked_paths_and_non_utf8_patches_are_refused_or_shown_plainly() {
    let tmp = common::tmp();
    let ws = tmp.path().join("ws");
    write(&ws.join("real/f"), b"f\n");
    std::os::unix::fs::symlink("real", ws.join("link")).expect("symlink");
    write(&ws.join("bin"), b"\xff\xfe");
    let a = common::checkpoint_id(&ws, &["a"]);
    let missing = tmp.path().join("no/such/dir");
    let out = rewind(
        &ws,
        &["anchor", &missing.join("anchor.json").display().to_string()],
    );
    assert_clear_error(&out, "is not a directory");
    assert!(!tmp.path().join("no").exists(), "anchor made directories");
    write(&ws.join("real/f"), b"g\n");
    let out = rewind(&ws, &["restore", &a, "--", "link/f"]);
    assert_clear_error(&out, "is below link, a symlink");
    assert_eq!(std::fs::read(ws.join("real/f")).expect("read"), b"g\n");
    write(&ws.join("bin"), b"\xfe\xff");
    let out = rewind(&ws, &["diff", "--patch", "--", "bin"]);
    let patch = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        patch.contains("Binary files a/bin and b/bin differ"),
        "{patch}"
    );
    assert!(!patch.contains('\u{fffd}'), "{patch}");
}

/// D128: two names that differ only in bytes that are not UTF-8 printed
/// the same in JSON (`bad\u{fffd}x` twice): an agent could not tell them
/// apart. `path_hex` carries the exact bytes of such a name. D188: the
/// text output printed them alike too.
#[test]
fn names_that_are_not_utf8_stay_distinct_in_json_and_text() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = common::tmp();
    let ws = tmp.path();
    let a = ws.join(std::ffi::OsStr::from_bytes(b"bad\xffx"));
    let b = ws.join(std::ffi::OsStr::from_bytes(b"bad\xfex"));
    write(&a, b"1");
    common::checkpoint_id(ws, &[]);
    write(&a, b"2");
    write(&b, b"q");
    let st = rewind_json(ws, &["status"]);
    let mut hex: Vec<&str> = st["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["path_hex"].as_str())
        .collect();
    hex.sort();
    assert_eq!(hex, ["626164fe78", "626164ff78"], "{st}");
    // D188: and in the text, each byte that is not UTF-8 is escaped, so
    // the two lines differ and either name can be typed back.
    let out = rewind(ws, &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("M \"bad\\xffx\""), "{text}");
    assert!(text.contains("A \"bad\\xfex\""), "{text}");
    assert!(!text.contains('\u{fffd}'), "{text}");
    write(&ws.join("plain.txt"), b"p");
    let st = rewind_json(ws, &["status"]);
    let plain = st["changes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["path"] == "plain.txt"))
        .expect("plain.txt");
    assert!(plain.get("path_hex").is_none(), "{st}");
}

/// D189: an error naming a path that is not UTF-8 escapes its bytes as
/// the text output does (D188): two such names gave the same message,
/// `nope�`.
#[test]
fn an_error_names_a_path_that_is_not_utf8_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = common::tmp();
    let ws = tmp.path();
    let id = workspace_with_checkpoint(ws);
    for (name, shown) in [
        (&b"nope\xfe"[..], "\"nope\\xfe\""),
        (&b"nope\xff"[..], "\"nope\\xff\""),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(ws)
            .args(["restore", &id, "--"])
            .arg(std::ffi::OsStr::from_bytes(name))
            .output()
            .expect("run rewind");
        assert_clear_error(&out, &format!("{shown}: exists neither"));
    }
}

/// D189: a label prints escaped alike in `checkpoint` and `list`; the
/// checkpoint line printed `"say "hi" \ there"`.
#[test]
fn a_label_prints_escaped_the_same_in_checkpoint_and_list() {
    let tmp = common::tmp();
    let ws = tmp.path();
    write(&ws.join("a"), b"a");
    let label = r#"say "hi" \ there"#;
    let shown = r#""say \"hi\" \\ there""#;
    let out = rewind(ws, &["checkpoint", label]);
    assert_eq!(out.status.code(), Some(0));
    let made = String::from_utf8_lossy(&out.stdout);
    assert!(made.contains(shown), "{made}");
    let listed = String::from_utf8_lossy(&rewind(ws, &["list"]).stdout).into_owned();
    assert!(listed.contains(shown), "{listed}");
}

/// D189: an unknown id is echoed cut short: a 1 MiB id came back whole.
#[test]
fn an_unknown_id_is_echoed_cut_short() {
    let tmp = common::tmp();
    let ws = tmp.path();
    workspace_with_checkpoint(ws);
    let id = "z".repeat(100_000);
    let out = rewind(ws, &["rewind", &id]);
    assert_clear_error(&out, "no checkpoint matches 'zzzz");
    assert!(
        out.stderr.len() < 1_000,
        "{} bytes of error",
        out.stderr.len()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("(100000 bytes)"));
}

/// D193: a ledger page damaged behind SQLite's back: `doctor` printed
/// SQLite's integrity report and exited 0, so a script checking it saw a
/// healthy workspace. It now exits 1 and says what to do first.
#[test]
fn doctor_exits_1_on_a_ledger_that_fails_its_integrity_check() {
    let sqlite = |db: &Path, sql: &str| {
        std::process::Command::new("sqlite3")
            .arg(db)
            .arg(sql)
            .output()
    };
    let tmp = common::tmp();
    let ws = tmp.path();
    for i in 0..300 {
        write(&ws.join(format!("d/{i}")), format!("{i}\n").as_bytes());
    }
    common::checkpoint_id(ws, &["a"]);
    let healthy = rewind(ws, &["doctor"]);
    assert_eq!(healthy.status.code(), Some(0));
    // Folded after the last command, so that no newer copy of the page
    // in the WAL stands in for the damaged one.
    let db = ws.join(".rewind/ledger.db");
    let page = match sqlite(
        &db,
        "PRAGMA wal_checkpoint(TRUNCATE); SELECT pageno FROM dbstat WHERE name = 'blobs' AND pagetype = 'leaf' LIMIT 1 OFFSET 1;",
    ) {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .and_then(|l| l.trim().parse::<u64>().ok())
            .expect("a leaf page of blobs"),
        _ => {
            common::skip_or_fail(
                "the sqlite3 CLI is needed to find a page to damage (apt-get install sqlite3)",
            );
            return;
        }
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .expect("open ledger");
    use std::io::{Seek, Write};
    // The whole page after its 8-byte header: cell pointers and cells
    // (64 bytes at one offset sometimes fell in the page's free gap).
    f.seek(std::io::SeekFrom::Start((page - 1) * 4096 + 8))
        .expect("seek");
    f.write_all(&[0xa5; 4088]).expect("damage");
    drop(f);
    let out = rewind(ws, &["doctor"]);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(text.contains("DAMAGED"), "{text}{err}");
}

/// D304: a damaged page past the first opens, and fails at the first
/// read of it. `doctor` answered with the very error that sent the user
/// to it (helper-62); it now prints its report with the ways out, the
/// salvage run on the copy, and exits 1. A ledger whose WAL was deleted
/// (an agent's `find . -size +100k -delete`) said "`rewind init` creates
/// it again" (helper-63); it is named as a lost WAL, and no command
/// makes a new history over it.
#[test]
fn doctor_reports_a_damaged_page_and_a_deleted_wal_is_named() {
    let tmp = common::tmp();
    let ws = tmp.path();
    for i in 0..30 {
        write(&ws.join(format!("f{i}")), format!("{i}\n").as_bytes());
        common::checkpoint_id(ws, &[&format!("c{i}")]);
    }
    let db = ws.join(".rewind/ledger.db");
    let fold = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA wal_checkpoint(TRUNCATE);")
        .output()
        .expect("sqlite3");
    assert!(fold.status.success());
    let mut bytes = std::fs::read(&db).expect("ledger");
    let page = 4096 * 22;
    assert!(
        bytes.len() > page + 4096,
        "a ledger of {} bytes",
        bytes.len()
    );
    for (i, b) in bytes[page..page + 4096].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    std::fs::write(&db, &bytes).expect("damage page 23");
    let out = rewind(ws, &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("DAMAGED") && text.contains("cannot be read"),
        "{text}"
    );
    assert!(text.contains(".rewind.copy/ledger.db .recover"), "{text}");
    let json = rewind_json_any(ws, &["doctor"]);
    assert!(json["damaged"].is_string(), "{json}");

    // A young history lives in its WAL: delete that, keep the -shm.
    let young = common::tmp();
    let ws = young.path();
    write(&ws.join("a"), b"a\n");
    common::checkpoint_id(ws, &["first"]);
    let wal = ws.join(".rewind/ledger.db-wal");
    std::fs::remove_file(&wal).expect("the agent's find -delete");
    for args in [&["status"][..], &["list"], &["checkpoint", "after"]] {
        let out = rewind(ws, &[&["--json"][..], args].concat());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "LEDGER_CORRUPT", "{args:?}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("WAL") && !message.contains("creates it again"),
            "{message}"
        );
    }
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "a new history was made over the lost one"
    );
}

/// D199: a ledger SQLite cannot open answers `LEDGER_CORRUPT` everywhere,
/// and the message sends the user to `doctor`, which answered the same
/// error (helper-28). It now says what is damaged, that the files are
/// untouched and the three ways out, exits 1, and writes nothing.
#[test]
fn doctor_on_a_ledger_that_cannot_be_opened_says_the_ways_out() {
    let tmp = common::tmp();
    let ws = tmp.path();
    write(&ws.join("work.txt"), b"the agent's work\n");
    common::checkpoint_id(ws, &["a"]);
    let db = ws.join(".rewind/ledger.db");
    let mut bytes = std::fs::read(&db).expect("read ledger");
    bytes[..100].fill(0x5a);
    std::fs::write(&db, &bytes).expect("damage the header");
    // Without its WAL, whose copy of page 1 would stand in for the header.
    for side in ["ledger.db-wal", "ledger.db-shm"] {
        let _ = std::fs::remove_file(ws.join(".rewind").join(side));
    }
    let status = rewind(ws, &["--json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(v["error"]["code"], "LEDGER_CORRUPT", "{v}");
    assert!(v["error"]["message"].to_string().contains("rewind doctor"));

    let out = rewind(ws, &["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("cannot be read") && text.contains("DAMAGED"),
        "{text}"
    );
    let out = rewind(ws, &["--json", "doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ledger"]["opens"], false, "{v}");
    assert_eq!(v["ledger"]["bytes"], bytes.len() as u64, "{v}");
    let damaged = v["damaged"].as_str().expect("damaged");
    // The new history goes to this workspace whatever the shell's cwd,
    // and the copy aside is not where the damaged state is then moved.
    let root = ws.display().to_string();
    for way in [
        ".recover".to_string(),
        format!("rewind -C {root} init"),
        "backup".into(),
        "untouched".into(),
        ".rewind.copy".into(),
    ] {
        assert!(damaged.contains(&way), "{way}: {damaged}");
    }
    assert_eq!(
        std::fs::read(&db).expect("read"),
        bytes,
        "doctor wrote nothing"
    );
    // Nor left an empty -shm or -wal beside it (D207).
    let mut state: Vec<_> = std::fs::read_dir(ws.join(".rewind"))
        .expect("list .rewind")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n.to_string_lossy().starts_with("ledger.db"))
        .collect();
    state.sort();
    assert_eq!(state, ["ledger.db"], "nothing beside the ledger");
    assert_eq!(
        std::fs::read(ws.join("work.txt")).expect("work"),
        b"the agent's work\n"
    );
}

/// D212: with `ledger.db` lost and its `-wal` still holding the
/// history's last commits, `init` said "already a workspace" and made a
/// new empty ledger over that WAL; with `ledger.db` emptied, even `list`
/// reset the WAL. Both now refuse, and the WAL is left as it was.
#[test]
fn a_lost_ledgers_wal_is_never_overwritten() {
    for emptied in [false, true] {
        let tmp = common::tmp();
        let ws = tmp.path();
        write(&ws.join("a"), b"one\n");
        common::checkpoint_id(ws, &["first-label"]);
        write(&ws.join("a"), b"two\n");
        common::checkpoint_id(ws, &["second-label"]);
        let db = ws.join(".rewind/ledger.db");
        let wal = ws.join(".rewind/ledger.db-wal");
        let kept = std::fs::read(&wal).expect("read the WAL");
        assert!(!kept.is_empty(), "the commits are in the WAL");
        if emptied {
            std::fs::write(&db, b"").expect("empty the ledger");
        } else {
            std::fs::remove_file(&db).expect("remove the ledger");
        }
        for args in [
            &["--json", "list"][..],
            &["--json", "status"],
            &["--json", "init"],
        ] {
            let out = rewind(ws, args);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            assert_eq!(out.status.code(), Some(1), "{emptied} {args:?}: {v}");
            let want = if emptied {
                "LEDGER_CORRUPT"
            } else {
                "LEDGER_MISSING"
            };
            assert_eq!(v["error"]["code"], want, "{emptied} {args:?}: {v}");
            assert_eq!(
                std::fs::read(&wal).expect("WAL"),
                kept,
                "{emptied} {args:?}"
            );
        }
        assert_eq!(
            std::fs::metadata(&db).map(|m| m.len()).ok(),
            emptied.then_some(0),
            "the ledger is left as it was"
        );
        // `doctor` says what is wrong and the ways out, for a missing
        // ledger as for a damaged one (D218), and writes nothing.
        let out = rewind(ws, &["doctor"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{emptied}: {text}");
        let said = if emptied { "cannot be read" } else { "missing" };
        assert!(text.contains(said) && text.contains("DAMAGED"), "{text}");
        assert!(
            text.contains(&format!("rewind -C {} init", ws.display())),
            "{text}"
        );
        assert_eq!(std::fs::read(&wal).expect("WAL"), kept, "{emptied}: doctor");
    }
}

/// A history of effects alone has no objects, and with its ledger and
/// WAL deleted it looked like an `init` killed before making its ledger:
/// `init` said "already a workspace" and started a new history, and a
/// spent payment was admitted again (helper-33, D230). `init` now makes
/// the ledger before anything else in `.rewind/`, so only an empty one
/// is started over.
#[test]
fn init_never_starts_a_new_history_where_one_was_lost() {
    let tmp = common::tmp();
    let ws = tmp.path();
    rewind_json(ws, &["init"]);
    let charge = ["guard", "--scope", "pay", "--key", "charge-1"];
    assert_eq!(rewind_json(ws, &charge)["code"], "FIRST_FIRING");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(ws.join(format!(".rewind/ledger.db{suffix}")));
    }
    let out = rewind(ws, &["--json", "init"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["error"]["code"], "LEDGER_MISSING", "{v}");
    assert!(!ws.join(".rewind/ledger.db").exists(), "init made a ledger");
    let out = rewind(ws, &charge);
    assert_ne!(
        out.status.code(),
        Some(0),
        "the spent charge was admitted again"
    );
    // What an `init` killed before its ledger leaves: an empty `.rewind/`.
    let fresh = common::tmp();
    std::fs::create_dir(fresh.path().join(".rewind")).expect("mkdir");
    let v = rewind_json(fresh.path(), &["init"]);
    assert_eq!(v["created"], true, "a new history: {v}");
    assert_eq!(rewind_json(fresh.path(), &charge)["code"], "FIRST_FIRING");
}

/// D214, from helper-31's hunt: bad input that changed something or was
/// silently overridden. A view refused for being inside the workspace had
/// made its directories there first (and `--at` made missing parents
/// anywhere); `--dry-run --expect` ignored a wrong fingerprint; `guard`
/// dropped the JSON's key when `--key` named another, and a top-level
/// key beside a peer descriptor.
#[test]
fn refused_or_conflicting_input_changes_nothing_and_is_not_overridden() {
    let tmp = common::tmp();
    let root = tmp.path().join("ws");
    let a = workspace_with_checkpoint(&root);
    let out = rewind(&root, &["mount", "--at", "inside/deep/view"]);
    assert_clear_error(&out, "a view must be outside the workspace");
    assert!(
        !root.join("inside").exists(),
        "nothing made in the workspace"
    );
    let far = tmp.path().join("no/such/parent/view");
    let out = rewind(&root, &["mount", "--at", &far.display().to_string()]);
    assert_clear_error(&out, "does not exist");
    assert!(!tmp.path().join("no").exists(), "no parents made");
    // D223: a FIFO there hung the daemon for good; a file, a path below
    // one, and a symlink to nothing got errors that named none of them.
    let fifo = tmp.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    write(&tmp.path().join("afile"), b"x");
    std::os::unix::fs::symlink("nowhere", tmp.path().join("dangling")).expect("symlink");
    for at in ["fifo", "afile", "afile/x", "dangling"] {
        let at = tmp.path().join(at).display().to_string();
        let out = rewind(&root, &["mount", "--at", &at]);
        assert_clear_error(&out, "is not a directory");
    }
    assert!(rewind_fuse_free(&root), "no claim left in the workspace");

    write(&root.join("a.txt"), b"changed");
    let out = rewind(
        &root,
        &[
            "--json",
            "rewind",
            &a,
            "--dry-run",
            "--expect",
            "0000000000000000",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "PLAN_CHANGED", "{v}");
    let plan = rewind_json(&root, &["rewind", &a, "--dry-run"]);
    let fp = plan["plan_fingerprint"].as_str().expect("fingerprint");
    rewind_json(&root, &["rewind", &a, "--dry-run", "--expect", fp]);

    for args in [
        &[
            "guard",
            r#"{"key":"charge-A","payload":{"amt":1}}"#,
            "--key",
            "charge-B",
        ][..],
        &[
            "guard",
            r#"{"key":"k","payload":{"amt":1}}"#,
            "--payload",
            r#"{"amt":2}"#,
        ],
        &["guard", r#"{"descriptor":{"effectKey":"d-1"},"key":"k-1"}"#],
    ] {
        let out = rewind(&root, &[&["--json"][..], args].concat());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "USAGE", "{args:?}: {v}");
    }
    let effects = rewind_json(&root, &["effects"]);
    assert_eq!(effects["effects"], serde_json::json!([]), "{effects}");
    // The same value given twice is one value.
    rewind_json(
        &root,
        &[
            "guard",
            r#"{"key":"charge-A","payload":{"amt":1}}"#,
            "--key",
            "charge-A",
        ],
    );
}

/// Nothing holds the workspace's mount claim: a refused mount left no
/// daemon behind.
fn rewind_fuse_free(root: &Path) -> bool {
    let out = rewind(root, &["--json", "status"]);
    out.status.success()
}

/// D223: an immutable ledger (`chattr +i`) reads to SQLite as
/// "readonly", and D216 then gave chown/chmod advice that cannot work.
/// It is `IMMUTABLE`, with the `chattr` that frees it.
#[test]
fn an_immutable_ledger_is_named_with_the_chattr_that_frees_it() {
    let Some(lfs) = common::LoopFs::new(common::Fs::Xfs, 512) else {
        return;
    };
    let root = lfs.subdir("ws");
    workspace_with_checkpoint(&root);
    let db = root.join(".rewind/ledger.db");
    let chattr = |flag: &str| {
        assert!(
            Command::new("chattr")
                .arg(flag)
                .arg(&db)
                .status()
                .expect("chattr")
                .success()
        );
    };
    chattr("+i");
    write(&root.join("a.txt"), b"changed");
    let out = rewind(&root, &["--json", "checkpoint"]);
    chattr("-i");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "IMMUTABLE", "{v}");
    assert!(
        v["error"]["message"].to_string().contains("chattr -i"),
        "{v}"
    );
}

/// `unmount` of a typo or of a directory that is no workspace says which,
/// not "`rewind mount X` mounts it" (advice to mount a non-workspace).
#[test]
fn unmount_of_a_missing_path_or_a_plain_directory_says_which() {
    let tmp = common::tmp();
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).expect("mkdir");
    for (path, want) in [
        (tmp.path().join("no-such-dir"), "does not exist"),
        (plain, "nor a workspace"),
    ] {
        let out = rewind(tmp.path(), &["unmount", &path.display().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(want) && !err.contains("mounts it"), "{err}");
    }
}

#[test]
fn usage_errors_exit_1_and_answer_json_when_asked() {
    let dir = common::tmp();
    let out = rewind(dir.path(), &["--json", "rewind"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a usage error is exit 1, never 2 (2 means refused)"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert_eq!(v["error"]["code"], "USAGE");
    // The message names the argument at fault, as the human one does.
    let out = rewind(dir.path(), &["--json", "list", "--bogus"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let m = v["error"]["message"].as_str().unwrap_or("");
    assert!(m.contains("--bogus") && !m.starts_with("error:"), "{v}");
    let out = rewind(dir.path(), &["no-such-verb"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir.path().join(".rewind").exists());
}

#[test]
fn a_usage_error_with_an_argument_that_is_not_utf8_is_reported_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let dir = common::tmp();
    let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .arg("bogus")
        .arg(std::ffi::OsStr::from_bytes(b"\xff"))
        .arg("--json")
        .current_dir(dir.path())
        .output()
        .expect("run rewind");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["error"]["code"], "USAGE");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

/// A label is one line a person can read and type: a newline faked a line
/// of `list`, an escape sequence reached the terminal, and a 5 MB label
/// made every page of `list` megabytes; `HEAD`, `@` or `HEAD~2` as a
/// label could never be named (they mean the current checkpoint). Refused
/// with nothing stored; a hook's label made from a command replaces
/// control characters.
#[test]
fn labels_are_one_short_line_of_text() {
    let tmp = common::tmp();
    let ws = tmp.path();
    write(&ws.join("a.txt"), b"a");
    rewind_json(ws, &["init"]);
    let long = "x".repeat(300);
    for bad in [
        "two\nlines",
        "red\u{1b}[31m",
        // D294: what reorders or breaks a line unseen.
        "fix \u{202e}gnp.exe",
        "a\u{2028}b",
        "tag\u{e0041}\u{e0042}",
        "soft\u{ad}hyphen",
        "",
        "   ",
        long.as_str(),
        "HEAD",
        "@",
        "HEAD~2",
        "@~",
        "live",
    ] {
        let out = rewind(ws, &["--json", "checkpoint", bad]);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "USAGE", "{bad:?}: {v}");
    }
    assert_eq!(
        rewind_json(ws, &["list"])["checkpoints"]
            .as_array()
            .map(Vec::len),
        Some(0),
        "a refused label stored a checkpoint"
    );
    // Text that needs the joiners is a label (helper-60).
    for good in ["👩\u{200d}💻 fix", "می\u{200c}خواهم", "café ✓ 修正"] {
        write(&ws.join("good.txt"), good.as_bytes());
        let out = rewind(ws, &["--json", "checkpoint", good]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{good:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Another checkpoint's id as a label: the id always wins.
    write(&ws.join("b.txt"), b"b");
    let id = rewind_json(ws, &["checkpoint"])["id"]
        .as_str()
        .expect("id")
        .to_string();
    write(&ws.join("b.txt"), b"b2");
    let out = rewind(ws, &["--json", "checkpoint", &id]);
    assert_eq!(out.status.code(), Some(1), "{id}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "USAGE", "{v}");
    common::pre_bash_hook(ws, "echo \u{1b}[31mred\u{202e}\nrm -rf x");
    let list = rewind_json(ws, &["list"]);
    let label = list["checkpoints"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["kind"] == "hook"))
        .and_then(|c| c["label"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(label.starts_with("before Bash: echo"), "{list}");
    assert!(!label.chars().any(char::is_control), "{label:?}");
    assert!(!label.contains('\u{202e}'), "{label:?}");
    // A note may hold such characters; `list` shows them escaped (D294).
    write(&ws.join("b.txt"), b"b3");
    rewind_json(ws, &["checkpoint"]);
    rewind_json(
        ws,
        &["rewind", "HEAD~1", "--report", "tried \u{202e}gnp.exe"],
    );
    let human = String::from_utf8_lossy(&rewind(ws, &["list"]).stdout).to_string();
    assert!(
        human.contains(r#"note: "tried \u{202e}gnp.exe""#),
        "{human}"
    );
    assert!(!human.contains('\u{202e}'), "{human}");
}

/// D294 (helper-59): under `--json` stdout holds one JSON object whatever
/// was asked: help and version too, a hook payload that is not UTF-8,
/// clap's tip kept and the internal verbs left out. A fingerprint is read
/// in either case and one that cannot be a fingerprint is `USAGE`, not
/// `PLAN_CHANGED`. Relative paths follow `-C`, as with `git -C`; `guard`
/// from a removed directory finds its workspace as the hooks do.
#[test]
fn json_is_one_object_and_paths_follow_dash_c() {
    let tmp = common::tmp();
    let ws = tmp.path().join("proj");
    std::fs::create_dir_all(ws.join("gone")).expect("mkdir");
    write(&ws.join("a.txt"), b"1");
    rewind_json(&ws, &["init"]);
    let json_of = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    for args in [
        &["--json", "--version"][..],
        &["--json", "--help"],
        &["--json", "list", "--help"],
    ] {
        let out = rewind(&ws, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(json_of(&out)["text"].is_string(), "{args:?}");
    }
    let missing = json_of(&rewind(&ws, &["--json"]));
    let message = missing["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("checkpoint"), "{missing}");
    assert!(!message.contains("serve-commands"), "{missing}");
    // Nor the human's (helper-62): stderr listed every internal verb.
    let human = String::from_utf8_lossy(&rewind(&ws, &["-q"]).stderr).into_owned();
    assert!(human.contains("requires a subcommand"), "{human}");
    assert!(human.contains("checkpoint"), "{human}");
    for hidden in ["serve-commands", "finish-manifests", "writeback"] {
        assert!(!human.contains(hidden), "{human}");
    }
    let typo = json_of(&rewind(&ws, &["--json", "chekpoint"]));
    assert!(
        typo["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tip: a similar subcommand exists: 'checkpoint'")),
        "{typo}"
    );
    let hook = common::rewind_fed(&ws, &["--json", "hook", "pre-tool-use"], b"\xff\xfe{", &[]);
    assert_eq!(hook.status.code(), Some(1));
    assert_eq!(json_of(&hook)["error"]["code"], "USAGE");

    // --expect: capitals are the same fingerprint; garbage is USAGE.
    let before = checkpoint_id(&ws, &[]);
    write(&ws.join("a.txt"), b"2");
    let dry = rewind_json(&ws, &["rewind", &before, "--dry-run"]);
    let fp = dry["plan_fingerprint"].as_str().expect("fingerprint");
    for bad in ["not-a-fingerprint", ""] {
        let out = rewind(&ws, &["--json", "rewind", &before, "--expect", bad]);
        assert_eq!(json_of(&out)["error"]["code"], "USAGE", "{bad:?}");
    }
    assert_eq!(std::fs::read(ws.join("a.txt")).expect("read"), b"2");
    let upper = fp.to_ascii_uppercase();
    rewind_json(&ws, &["rewind", &before, "--expect", &upper]);
    assert_eq!(std::fs::read(ws.join("a.txt")).expect("read"), b"1");

    // -C: `init sub` and `anchor FILE` are relative to DIR.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    std::fs::create_dir_all(ws.join("sub")).expect("mkdir");
    rewind_json(&elsewhere, &["-C", "../proj/sub", "init", "."]);
    rewind_json(&elsewhere, &["-C", "../proj", "anchor", "anchor.json"]);
    assert!(ws.join("sub/.rewind").is_dir());
    assert!(ws.join("anchor.json").is_file());
    assert_eq!(std::fs::read_dir(&elsewhere).expect("ls").count(), 0);
    rewind_json(
        &elsewhere,
        &["-C", "../proj", "verify", "--anchor", "anchor.json"],
    );

    // guard from a directory removed under the shell: the workspace's
    // barrier, refused the second time (exit 2), not a usage error.
    let guard = |cwd: &Path| {
        Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(cwd)
            .env("PWD", cwd)
            .args(["--json", "guard", "--key", "deploy-1"])
            .output()
            .expect("run")
    };
    let gone = ws.join("gone");
    let first = guard(&gone);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let mut held = Command::new("sh")
        .current_dir(&gone)
        .args([
            "-c",
            "rmdir \"$PWD\" && exec \"$0\" --json guard --key deploy-1",
        ])
        .arg(env!("CARGO_BIN_EXE_rewind"))
        .env("PWD", &gone)
        .output()
        .expect("run");
    assert!(!gone.exists());
    assert_eq!(
        held.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    held.stdout.retain(|b| *b != b'\n');
    assert_eq!(
        json_of(&held)["decision"],
        "refused",
        "{}",
        String::from_utf8_lossy(&held.stdout)
    );
}

/// `.rewind/tmp` replaced by a file or a symbolic link (the hook admits
/// `rm -rf .rewind/tmp; touch .rewind/tmp`) stopped every command, `deinit`
/// too, on a bare ENOTDIR (helper-79). It holds nothing between commands:
/// it is made again, with a warning, and nothing it pointed to is touched.
#[test]
fn a_file_or_link_in_place_of_the_temporary_directory_is_replaced() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"a");
    let one = checkpoint_id(root, &["one"]);
    let elsewhere = common::tmp();
    write(&elsewhere.path().join("keep"), b"keep");
    let tmp = root.join(".rewind/tmp");
    for link in [false, true] {
        std::fs::remove_dir_all(&tmp).expect("rm tmp");
        if link {
            std::os::unix::fs::symlink(elsewhere.path(), &tmp).expect("symlink");
        } else {
            write(&tmp, b"not a directory");
        }
        write(&root.join("a"), format!("{link}").as_bytes());
        let out = rewind(root, &["checkpoint", "-q"]);
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(".rewind/tmp was not a directory"), "{err}");
        let meta = std::fs::symlink_metadata(&tmp).expect("stat tmp");
        assert!(meta.is_dir(), "made again as a directory");
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).expect("ls").count(),
            1,
            "the link's target untouched"
        );
    }
    assert!(rewind(root, &["rewind", &one, "-q"]).status.success());
    assert_eq!(std::fs::read(root.join("a")).expect("read"), b"a");
    write(&tmp.with_file_name("tmp2"), b"");
    std::fs::remove_dir_all(&tmp).expect("rm tmp");
    std::fs::rename(tmp.with_file_name("tmp2"), &tmp).expect("file at tmp");
    let out = rewind(root, &["deinit", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!root.join(".rewind").exists());
}

/// Make empty files in `dir` until the filesystem has no inode left, then
/// free `keep` of them; the files are `dir/i*`.
fn use_up_inodes(dir: &Path, keep: usize) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut made = 0;
    while std::fs::File::create(dir.join(format!("i{made}"))).is_ok() {
        made += 1;
        assert!(made < 1_000_000, "no inode limit reached");
    }
    for i in 0..keep.min(made) {
        std::fs::remove_file(dir.join(format!("i{i}"))).expect("rm");
    }
}

/// The message of `rewind ID`'s refusal for want of space, which must
/// change nothing and leave no rewind pending.
fn refused_for_space(root: &Path, id: &str) -> String {
    let before = snapshot(root);
    let out = rewind(root, &["--json", "rewind", id]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "NO_SPACE", "{v}");
    assert_same("refused: tree untouched", &before, &snapshot(root));
    assert_eq!(
        rewind_json(root, &["status"])["changes"],
        serde_json::json!([])
    );
    v["error"]["message"].as_str().unwrap_or("").to_string()
}

/// helper-81: ext4 has a fixed number of inodes, and a rewind that made
/// more files than were left stopped half-way with "no space left … free
/// some space" while `df -h` showed space to spare. It is refused before
/// anything changes, naming inodes and both counts; once they are free,
/// the same rewind works.
#[test]
fn a_rewind_that_makes_more_files_than_inodes_are_free_is_refused_first() {
    let Some(lfs) = LoopFs::made_with(Fs::Ext4, 64, &["-N", "1024"]) else {
        return;
    };
    let root = lfs.subdir("ws");
    for i in 0..300 {
        write(&root.join(format!("many/f{i}")), b"x");
    }
    let id = checkpoint_id(&root, &["with many"]);
    std::fs::remove_dir_all(root.join("many")).expect("rm");
    checkpoint_id(&root, &["without"]);
    use_up_inodes(&lfs.mnt.join("pad"), 100);
    let msg = refused_for_space(&root, &id);
    assert!(
        msg.contains("this makes 301 files and directories and")
            && msg.contains("run out of inodes, not bytes"),
        "names inodes and both counts: {msg}"
    );
    std::fs::remove_dir_all(lfs.mnt.join("pad")).expect("rm pad");
    let r = rewind_json(&root, &["rewind", &id]);
    assert_eq!(r["changes"]["written"], 301, "{r}");
}

/// helper-81: the space check counted a restored file's bytes, not the
/// blocks it takes: 30,000 one-byte files passed as 165 KiB where they
/// needed 120 MiB, and the rewind stopped half-way on a full disk. Each
/// file now counts its blocks, each directory made one.
#[test]
fn a_rewind_counts_the_blocks_its_small_files_take() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    for d in 0..4 {
        for f in 0..1000 {
            write(&root.join(format!("small/d{d}/f{f}")), b"y");
        }
    }
    let id = checkpoint_id(&root, &["with small"]);
    std::fs::remove_dir_all(root.join("small")).expect("rm");
    checkpoint_id(&root, &["without"]);
    let dir = rewind_platform::Dir::open(&lfs.mnt).expect("open");
    let fs = rewind_platform::FsInfo::of(&dir).expect("statfs");
    // 4,000 blocks of at least 1 KiB are wanted; 3 MiB are left.
    assert!(fs.block_size >= 1024, "{fs:?}");
    let pad = fs.blocks_free * fs.block_size - (3 << 20);
    let st = Command::new("fallocate")
        .args(["-l", &pad.to_string()])
        .arg(lfs.mnt.join("pad"))
        .status()
        .expect("fallocate");
    assert!(st.success());
    let msg = refused_for_space(&root, &id);
    assert!(msg.contains("this needs "), "{msg}");
    std::fs::remove_file(lfs.mnt.join("pad")).expect("rm pad");
    let r = rewind_json(&root, &["rewind", &id]);
    assert_eq!(r["changes"]["written"], 4005, "{r}");
}

/// helper-81: a write past the file size limit (`ulimit -f`) raised
/// SIGXFSZ, which killed the rewind with no message; the next command
/// rolled it forward and was killed the same way, `list` and `verify`
/// included. The write now fails with EFBIG: the rewind rolls back naming
/// the limit, and every command still answers under it.
#[test]
fn a_write_past_the_file_size_limit_is_an_error_and_the_rewind_rolls_back() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 64) else {
        return;
    };
    let root = lfs.subdir("ws");
    let big = common::pseudo_random(3 << 20, 11);
    write(&root.join("big.bin"), &big);
    let id = checkpoint_id(&root, &["big"]);
    write(&root.join("big.bin"), b"small now");
    checkpoint_id(&root, &["small"]);
    let limited = |args: &[&str]| {
        Command::new("prlimit")
            .arg("--fsize=1000000")
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_rewind"))
            .args(args)
            .current_dir(&root)
            .output()
            .expect("prlimit")
    };
    let before = snapshot(&root);
    let out = limited(&["--json", "rewind", &id]);
    assert_eq!(out.status.code(), Some(1), "an exit, not a signal: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "ROLLED_BACK", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("the file size limit of 1000000 bytes was reached"),
        "{msg}"
    );
    assert_same("rolled back", &before, &snapshot(&root));
    for args in [&["--json", "list"][..], &["--json", "verify"]] {
        let out = limited(args);
        assert!(out.status.success(), "{args:?} under the limit: {out:?}");
    }
    rewind_json(&root, &["rewind", &id]);
    assert_eq!(std::fs::read(root.join("big.bin")).expect("read"), big);
}

/// `rewind ARGS` in `dir` with stderr at /dev/full (`full`) or a pipe
/// whose reading end is closed before the command starts: every line it
/// writes there fails (ENOSPC, EPIPE). Phase timings (`REWIND_TRACE=1`)
/// make it write many.
fn rewind_with_failing_stderr(dir: &Path, args: &[&str], full: bool) -> std::process::Output {
    use std::process::Stdio;
    let mut c = Command::new(env!("CARGO_BIN_EXE_rewind"));
    c.current_dir(dir)
        .args(args)
        .env("REWIND_TRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if full {
        let dev_full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full");
        c.stderr(dev_full);
    } else {
        c.stderr(Stdio::piped());
    }
    let mut child = c.spawn().expect("spawn rewind");
    drop(child.stderr.take());
    child.wait_with_output().expect("wait rewind")
}

/// D348: a warning or a trace line that cannot be written loses the
/// line, not the work. `eprintln!` panicked on a closed or full stderr,
/// which aborted a checkpoint or a rewind in the middle (exit 134).
#[test]
fn a_closed_or_full_stderr_loses_lines_not_the_checkpoint_or_the_rewind() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let new = ws.join("new");
    write(&ws.join("a.txt"), b"one");

    // A rewind run from a directory made after its target removes that
    // directory, and warns on stderr.
    let one = checkpoint_id(ws, &["one"]);
    write(&new.join("b.txt"), b"b");
    let shown = rewind(&new, &["rewind", &one]);
    assert!(shown.status.success(), "{shown:?}");
    let err = String::from_utf8_lossy(&shown.stderr);
    assert!(
        err.contains("warning") && err.contains("was removed"),
        "{err}"
    );

    for full in [true, false] {
        let stream = if full { "/dev/full" } else { "a closed pipe" };
        write(&ws.join("a.txt"), b"one");
        let _ = std::fs::remove_dir_all(&new);
        let out = rewind_with_failing_stderr(ws, &["--json", "checkpoint", "one"], full);
        assert_eq!(
            out.status.code(),
            Some(0),
            "checkpoint, stderr {stream}: {out:?}"
        );
        let one = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"]
            .as_str()
            .expect("id")
            .to_string();

        write(&ws.join("a.txt"), b"two");
        write(&new.join("b.txt"), b"b");
        let back = rewind_with_failing_stderr(&new, &["rewind", &one], full);
        assert_eq!(
            back.status.code(),
            Some(0),
            "rewind, stderr {stream}: {back:?}"
        );
        assert_eq!(std::fs::read(ws.join("a.txt")).unwrap(), b"one", "{stream}");
        assert!(!new.exists(), "{stream}");
        // The live tree the rewind replaced was saved first, as always.
        let undo = rewind(ws, &["undo"]);
        assert!(undo.status.success(), "{undo:?}");
        assert_eq!(std::fs::read(ws.join("a.txt")).unwrap(), b"two", "{stream}");
        assert_eq!(std::fs::read(new.join("b.txt")).unwrap(), b"b", "{stream}");
    }
    let verify = rewind(ws, &["verify"]);
    assert!(verify.status.success(), "{verify:?}");
}

/// D350: a command's output is its result. Written to a full disk
/// (`/dev/full`), `diff --patch`, `anchor` and `list --json` exited 0
/// with nothing or a cut patch written; now they fail naming stdout. A
/// reader that left (`| head -1`) is no failure.
#[test]
fn a_result_that_cannot_be_written_fails_the_command_unless_its_reader_left() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    workspace_with_checkpoint(ws);
    write(&ws.join("a.txt"), b"changed");
    let dev_full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full")
    };
    for args in [
        &["diff", "--patch"][..],
        &["anchor"],
        &["-q", "anchor"],
        &["--json", "list"],
        &["status"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(ws)
            .args(args)
            .stdout(dev_full())
            .output()
            .expect("run rewind");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("output could not be written to stdout") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // A reader that closed the pipe before the command wrote.
    for args in [&["diff", "--patch"][..], &["--json", "list"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(ws)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rewind");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait rewind");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
}
