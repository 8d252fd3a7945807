//! The btrfs engine (issue 6): a workspace whose root is a btrfs subvolume
//! is checkpointed by read-only snapshots, acknowledged before their
//! manifest, which any later command finishes; rewinds clone from the
//! snapshots; gc deletes them; crashes anywhere lose nothing acknowledged.

mod common;

use std::path::Path;

use common::{Fs, LoopFs, rewind, rewind_env, rewind_json, snapshot, write};

fn engine(ws: &Path) -> String {
    rewind_json(ws, &["doctor"])["engine"]
        .as_str()
        .expect("engine")
        .to_string()
}

fn snapshot_names(ws: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(ws.join(".rewind/state/snapshots"))
        .map(|r| {
            r.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Run `args[0]` with the rest; whether it ran and exited 0.
fn succeeds(args: &[&str]) -> bool {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Ids and roots of the listed checkpoints (this finishes pending ones).
fn listed(ws: &Path) -> Vec<(String, String, bool)> {
    let l = rewind_json(ws, &["list"]);
    l["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().expect("id").to_string(),
                c["root"].as_str().expect("root").to_string(),
                c["pruned"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// D268: a manifest that cannot be built (here a tree deeper than the
/// open-file limit lets the walk go, helper-46) stopped every reader that
/// finished pending manifests first: `list`, `verify` (exit 2) and more
/// failed for as long as the checkpoint stayed pending. They now go on
/// with a warning, the pending checkpoint listed as HEAD, and the first
/// command that can build it does.
#[test]
fn a_manifest_that_cannot_be_built_stops_no_reader() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a.txt"), b"a");
    common::checkpoint_id(&ws, &["base"]);
    common::nest(&ws, 1000, b"leaf");
    let out = rewind_env(
        &ws,
        &["--json", "checkpoint", "chain"],
        &[("REWIND_MANIFEST", "deferred")],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let chain = v["id"].as_str().expect("id").to_string();
    let list = common::rewind_under_ulimit(&ws, "-n 900", "--json list");
    let err = String::from_utf8_lossy(&list.stderr);
    assert_eq!(list.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&chain) && err.contains("open-file limit"),
        "{err}"
    );
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    assert_eq!(list["head"], chain.as_str(), "{list}");
    assert_eq!(list["pending"][0]["id"], chain.as_str(), "{list}");
    let verify = common::rewind_under_ulimit(&ws, "-n 900", "verify");
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let list = rewind_json(&ws, &["list"]);
    assert_eq!(list["pending"], serde_json::Value::Null, "built: {list}");
    assert_eq!(list["checkpoints"][1]["id"], chain.as_str(), "{list}");
}

#[test]
fn the_engine_is_btrfs_exactly_when_the_root_is_a_subvolume() {
    let Some(btrfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let sub = btrfs.subvolume("sub");
    common::populate_src_tree(&sub);
    rewind_json(&sub, &["init"]);
    assert_eq!(engine(&sub), "btrfs");
    let c = rewind_json(&sub, &["checkpoint"]);
    assert_eq!(c["engine"], "btrfs", "{c}");
    let plain = btrfs.subdir("plain");
    common::populate_src_tree(&plain);
    rewind_json(&plain, &["init"]);
    assert_eq!(engine(&plain), "walk", "a plain directory on btrfs");
    let c = rewind_json(&plain, &["checkpoint"]);
    assert_eq!(c["engine"], "walk", "{c}");
    assert_eq!(c["reflink"], true, "walk engine with reflinks on btrfs");
    for fs in [Fs::Xfs, Fs::Ext4] {
        let Some(lfs) = LoopFs::new(fs, 300) else {
            return;
        };
        let ws = lfs.subdir("ws");
        common::populate_src_tree(&ws);
        rewind_json(&ws, &["init"]);
        assert_eq!(engine(&ws), "walk", "{}", fs.name());
    }
    // Forced off: the same subvolume checkpoints by walking.
    let out = rewind_env(
        &sub,
        &["--json", "checkpoint"],
        &[("REWIND_ENGINE", "walk")],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["engine"], "walk", "{v}");
}

#[test]
fn a_checkpoint_is_acknowledged_from_its_snapshot_and_its_manifest_equals_a_walk() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let c = rewind_json(&ws, &["checkpoint", "first"]);
    assert_eq!(c["manifest_pending"], true, "{c}");
    assert!(c.get("root").is_none(), "no root before the manifest: {c}");
    let id = c["id"].as_str().expect("id").to_string();
    assert_eq!(snapshot_names(&ws), vec![id.clone()]);
    // The snapshot is read-only: nothing can change a checkpoint.
    assert!(
        std::fs::write(
            ws.join(".rewind/state/snapshots")
                .join(&id)
                .join("src/d0/f0.rs"),
            b"x"
        )
        .is_err(),
        "snapshot writable"
    );
    // The manifest (built by the detached finisher or by `list` itself)
    // equals what the walk engine captures of the same tree.
    let l = listed(&ws);
    assert_eq!(l.len(), 1, "{l:?}");
    let walk = rewind_env(&ws, &["--json", "checkpoint"], &[("REWIND_ENGINE", "walk")]);
    let walk: serde_json::Value = serde_json::from_slice(&walk.stdout).expect("json");
    assert_eq!(walk["root"].as_str(), Some(l[0].1.as_str()), "{walk}");
    // An edit is seen, and only it changed.
    write(&ws.join("src/d3/f3.rs"), b"edited\n");
    let second = rewind_json(&ws, &["checkpoint"]);
    let d = rewind_json(
        &ws,
        &["diff", &id, second["id"].as_str().expect("id"), "--patch"],
    );
    assert_eq!(d["changes"].as_array().map(Vec::len), Some(1), "{d}");
    assert_eq!(d["changes"][0]["path"], "src/d3/f3.rs", "{d}");
    assert!(
        d["patch"].as_str().is_some_and(|p| p.contains("+edited")),
        "patch read from the snapshots: {d}"
    );
}

/// D198: a checkpoint acknowledged before its manifest does not know
/// what it skipped. It said `"entries": 0, "skipped": []` of a tree with a
/// nested subvolume that `status` lists as skipped (helper-28); both are
/// now absent until the manifest is built, as `root` is. The subvolume
/// is skipped by the manifest, and a rewind leaves its content alone.
#[test]
fn a_pending_checkpoint_claims_no_skips_and_a_nested_subvolume_is_kept() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a.txt"), b"a\n");
    common::subvolume_in(&ws, "inner");
    write(&ws.join("inner/precious"), b"p\n");
    let c = rewind_json(&ws, &["checkpoint", "one"]);
    assert_eq!(c["manifest_pending"], true, "{c}");
    assert!(
        c.get("skipped").is_none() && c.get("entries").is_none(),
        "{c}"
    );
    let id = c["id"].as_str().expect("id").to_string();
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
    assert_eq!(st["skipped"][0]["path"], "inner", "{st}");
    // The walk engine knows at once.
    let walked = rewind_env(
        &ws,
        &["--json", "checkpoint", "walked"],
        &[("REWIND_ENGINE", "walk")],
    );
    let walked: serde_json::Value = serde_json::from_slice(&walked.stdout).expect("json");
    assert_eq!(walked["skipped"][0]["path"], "inner", "{walked}");
    assert!(walked["entries"].as_u64().is_some(), "{walked}");
    write(&ws.join("a.txt"), b"damaged\n");
    write(&ws.join("inner/precious"), b"changed inside\n");
    rewind_json(&ws, &["rewind", &id]);
    assert_eq!(std::fs::read(ws.join("a.txt")).expect("a"), b"a\n");
    assert_eq!(
        std::fs::read(ws.join("inner/precious")).expect("inner"),
        b"changed inside\n",
        "not part of the workspace: left alone"
    );
}

/// D201: a workspace subvolume with btrfs's `ro` property, on a
/// filesystem mounted read-write, was told to `mount -o remount,rw`,
/// which changes nothing (helper-28). The error names the subvolume and
/// `btrfs property set … ro false`; nothing is changed.
#[test]
fn a_read_only_subvolume_is_named_with_its_own_fix() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a"), b"one\n");
    let one = common::checkpoint_id(&ws, &["one"]);
    write(&ws.join("a"), b"two\n");
    common::checkpoint_id(&ws, &["two"]);
    let w = ws.to_string_lossy().into_owned();
    let property = |value: &str| succeeds(&["btrfs", "property", "set", &w, "ro", value]);
    if !property("true") {
        common::skip_or_fail(
            "btrfs-progs is needed to set the ro property (apt-get install btrfs-progs)",
        );
        return;
    }
    let out = rewind(&ws, &["--json", "rewind", &one]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    property("false");
    assert_eq!(v["error"]["code"], "READ_ONLY", "{v}");
    let msg = v["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("btrfs property set") && msg.contains(&*ws.to_string_lossy()),
        "{msg}"
    );
    assert!(!msg.contains("remount"), "{msg}");
    assert_eq!(std::fs::read(ws.join("a")).expect("a"), b"two\n");
    // Refused before anything was recorded: no safety checkpoint.
    let list = rewind_json(&ws, &["list"]);
    assert_eq!(
        list["checkpoints"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
}

#[test]
fn rewind_clones_from_the_snapshot_and_undo_returns_exactly() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let good = rewind_json(&ws, &["checkpoint", "good"]);
    let good_id = good["id"].as_str().expect("id").to_string();
    let before = snapshot(&ws);
    // Damage: delete a directory, rewrite a file, add junk.
    std::fs::remove_dir_all(ws.join("src/d1")).expect("rm");
    write(&ws.join("src/d0/f0.rs"), b"broken\n");
    write(&ws.join("junk.txt"), b"junk\n");
    let damaged = snapshot(&ws);
    let cwd = ws.join("src/d0");
    let r = rewind_json(&cwd, &["rewind", &good_id]);
    assert_eq!(r["rewound_to"], good_id.as_str(), "{r}");
    common::assert_same("rewind to good", &before, &snapshot(&ws));
    // The safety checkpoint is a snapshot too.
    let safety = r["safety_checkpoint"].as_str().expect("safety").to_string();
    assert!(snapshot_names(&ws).contains(&safety), "{safety}");
    rewind_json(&ws, &["undo"]);
    common::assert_same("undo", &damaged, &snapshot(&ws));
    assert!(common::temp_leftovers(&ws).is_empty());
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    // Every snapshot is walked, and the report says so (helper-70).
    assert_eq!(
        v["deep"]["snapshots"].as_u64(),
        Some(snapshot_names(&ws).len() as u64),
        "{v}"
    );
}

/// D173: the btrfs engine's safety snapshot holds every file it saw, so a
/// rewind stores none of them (D154's check is for the walk engine) and
/// does not read them again from the live tree. Reading them again, a
/// file another program changed after the snapshot no longer hashed to
/// what it held: the rewind failed with a false `OBJECT_MISSING` ("the
/// history is incomplete") while `verify --deep` found nothing wrong.
/// Now the file written during the rewind is kept (D116) and the rest
/// rewinds.
#[test]
fn a_file_changed_during_a_btrfs_rewind_is_kept_not_a_false_object_missing() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("big.bin"), &[b'a'; 100 << 10]);
    write(&ws.join("g"), b"v1");
    let a = common::checkpoint_id(&ws, &["a"]);
    write(&ws.join("big.bin"), &[b'b'; 100 << 10]);
    write(&ws.join("g"), b"v2");
    let objects = common::object_files(&ws);
    let v = common::rewind_json_stopped_at(&ws, &["rewind", &a], "rewind:captured", || {
        write(&ws.join("big.bin"), b"written during the rewind");
    });
    assert_eq!(common::paths_in(&v, "kept"), ["big.bin"], "{v}");
    assert_eq!(
        std::fs::read(ws.join("big.bin")).expect("big"),
        b"written during the rewind"
    );
    assert_eq!(std::fs::read(ws.join("g")).expect("g"), b"v1");
    assert_eq!(
        common::object_files(&ws),
        objects,
        "the rewind stored what its snapshot holds"
    );
}

#[test]
fn identical_automatic_checkpoints_fold_into_their_parent_and_keep_their_id() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let a = rewind_json(&ws, &["checkpoint", "--kind", "hook"]);
    let b = rewind_json(&ws, &["checkpoint", "--kind", "hook"]);
    let (a, b) = (
        a["id"].as_str().expect("id").to_string(),
        b["id"].as_str().expect("id").to_string(),
    );
    let l = listed(&ws);
    assert_eq!(l.len(), 1, "the identical one was folded: {l:?}");
    assert_eq!(l[0].0, a);
    assert_eq!(snapshot_names(&ws), vec![a.clone()], "its snapshot went");
    // Its id still names the checkpoint it was folded into.
    write(&ws.join("src/d0/f0.rs"), b"changed\n");
    let r = rewind_json(&ws, &["rewind", &b]);
    assert_eq!(r["rewound_to"], a.as_str(), "{r}");
    let head = rewind_json(&ws, &["list"])["head"].clone();
    assert_eq!(head, a.as_str());
}

#[test]
fn gc_deletes_the_snapshots_of_pruned_checkpoints_and_verify_deep_catches_a_changed_one() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let mut ids = Vec::new();
    for i in 0..8 {
        write(&ws.join(format!("src/d4/gen{i}.rs")), b"x\n");
        // Content only this checkpoint holds, for gc to count.
        write(&ws.join("src/d4/unique.bin"), &[i as u8; 100 << 10]);
        ids.push(common::checkpoint_id(&ws, &[]));
    }
    let dry = rewind_json(
        &ws,
        &["gc", "--keep-last", "2", "--keep-within", "0s", "--dry-run"],
    );
    let g = rewind_json(&ws, &["gc", "--keep-last", "2", "--keep-within", "0s"]);
    // What the deleted snapshots alone held: each pruned checkpoint's
    // unique.bin. It was reported as 0 B freed (helper-13).
    let n = g["pruned"].as_array().map_or(0, Vec::len) as u64;
    assert_eq!(g["freed"]["snapshot_bytes"], n * (100 << 10), "{g}");
    assert_eq!(
        dry["freed"]["snapshot_bytes"], g["freed"]["snapshot_bytes"],
        "{dry}"
    );
    let pruned: Vec<&str> = g["pruned"]
        .as_array()
        .expect("pruned")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(!pruned.is_empty(), "{g}");
    assert_eq!(g["freed"]["snapshots"], pruned.len(), "{g}");
    let left = snapshot_names(&ws);
    for p in &pruned {
        assert!(!left.contains(&p.to_string()), "snapshot of {p} kept");
    }
    let live: Vec<String> = listed(&ws)
        .into_iter()
        .filter(|c| !c.2)
        .map(|c| c.0)
        .collect();
    assert_eq!(left, {
        let mut l = live.clone();
        l.sort();
        l
    });
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    // Every kept checkpoint still rewinds exactly (the newest two).
    for id in ids.iter().rev().take(2) {
        rewind_json(&ws, &["rewind", id]);
    }
    // Someone flips a snapshot writable: verify --deep says so (exit 1).
    let victim = ws
        .join(".rewind/state/snapshots")
        .join(&live[live.len() - 1]);
    let set_ro = |ro: &str| {
        let st = std::process::Command::new("btrfs")
            .args(["property", "set", "-ts"])
            .arg(&victim)
            .args(["ro", ro])
            .status()
            .expect("btrfs property");
        assert!(st.success());
    };
    let deep_bad = || {
        let out = rewind(&ws, &["--json", "verify", "--deep"]);
        assert_eq!(out.status.code(), Some(1), "verify --deep must fail");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v["deep"]["bad"]
            .as_array()
            .expect("bad")
            .iter()
            .filter_map(|b| b.as_str().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    set_ro("false");
    assert!(
        deep_bad().iter().any(|b| b.contains("no longer read-only")),
        "writable snapshot not reported"
    );
    // ...edits it and makes it read-only again: the content is compared.
    write(&victim.join("src/d0/f0.rs"), b"tampered\n");
    set_ro("true");
    assert!(
        deep_bad()
            .iter()
            .any(|b| b.contains("does not match its manifest")
                && b.contains(": src/d0/f0.rs modified")),
        "edited snapshot not reported with the path that changed: {:?}",
        deep_bad()
    );
    // A rewind to it refuses before changing anything: its clones would
    // restore the edit, not the checkpoint.
    let victim_id = &live[live.len() - 1];
    write(&ws.join("src/d0/f0.rs"), b"live edit\n");
    let before = common::snapshot(&ws);
    // Its dry run says so too: it offered a plan to apply (helper-76).
    let dry = rewind(&ws, &["--json", "rewind", victim_id, "--dry-run"]);
    assert_eq!(dry.status.code(), Some(1), "{dry:?}");
    let out = rewind(&ws, &["--json", "rewind", victim_id]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "rewind from a tampered snapshot"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "BTRFS", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("changed after it was taken")),
        "{v}"
    );
    common::assert_same("refused rewind", &before, &common::snapshot(&ws));
    let st = rewind_json(&ws, &["status"]);
    assert!(
        st["changes"].as_array().is_some_and(|c| !c.is_empty()),
        "{st}"
    );
    // Deleted outside rewind: the refusal names the snapshot, not a
    // "stored object" the user never heard of.
    let st = std::process::Command::new("btrfs")
        .args(["-q", "subvolume", "delete"])
        .arg(&victim)
        .status()
        .expect("btrfs subvolume delete");
    assert!(st.success());
    let out = rewind(&ws, &["--json", "rewind", victim_id]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "BTRFS", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("snapshot of checkpoint") && m.contains("is missing")),
        "{v}"
    );
    common::assert_same("refused rewind", &before, &common::snapshot(&ws));
}

#[test]
fn a_sigkill_at_each_btrfs_point_loses_nothing_acknowledged() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    for (i, point) in [
        "btrfs:snapshotted",
        "btrfs:acknowledged",
        "btrfs:manifest-built",
        "btrfs:manifest-committed",
    ]
    .iter()
    .enumerate()
    {
        let ws = lfs.subvolume(&format!("ws{i}"));
        common::populate_src_tree(&ws);
        // Built here, not by a detached builder, which may start late
        // enough to find the killed checkpoint pending and build it
        // first.
        let base = rewind_env(
            &ws,
            &["checkpoint", "base"],
            &[("REWIND_MANIFEST", "deferred")],
        );
        assert!(base.status.success(), "{base:?}");
        assert!(rewind(&ws, &["finish-manifests"]).status.success());
        write(&ws.join("src/d2/f7.rs"), b"edited before the kill\n");
        let at_kill = snapshot(&ws);
        let out = rewind_env(
            &ws,
            &["--json", "checkpoint", "killed"],
            &[("REWIND_FAILPOINT", point), ("REWIND_MANIFEST", "inline")],
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "{point}: not killed there: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The next command finishes whatever was acknowledged.
        let l = rewind_json(&ws, &["list"]);
        let labels: Vec<&str> = l["checkpoints"]
            .as_array()
            .expect("checkpoints")
            .iter()
            .filter_map(|c| c["label"].as_str())
            .collect();
        // Killed before its row was committed, the snapshot holds the
        // row's copy and is adopted (D324): a checkpoint no one was told
        // of, but whole.
        assert_eq!(labels, vec!["base", "killed"], "{point}: {l}");
        let doctor = rewind_json(&ws, &["doctor"]);
        assert_eq!(doctor["ledger"]["integrity"], "ok", "{point}: {doctor}");
        assert_eq!(
            doctor["ledger"]["pending_manifests"], 0,
            "{point}: {doctor}"
        );
        let v = rewind_json(&ws, &["verify", "--deep"]);
        assert_eq!(v["ok"], true, "{point}: {v}");
        // Restorable exactly, from its snapshot.
        write(&ws.join("src/d2/f7.rs"), b"damage\n");
        rewind_json(&ws, &["rewind", "killed"]);
        common::assert_same(point, &at_kill, &snapshot(&ws));
        assert!(common::temp_leftovers(&ws).is_empty(), "{point}");
    }
}

/// A rewind killed after its safety snapshot leaves an orphan that holds
/// the record of the checkpoint before it, not its own: never adopted as
/// a checkpoint, even when the live record sends the next command looking
/// (D324); gc removes it.
#[test]
fn a_killed_rewinds_safety_snapshot_is_never_adopted_as_a_checkpoint() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let base = common::checkpoint_id(&ws, &["base"]);
    rewind_json(&ws, &["list"]);
    write(&ws.join("src/d2/f7.rs"), b"edited\n");
    let killed = rewind_env(
        &ws,
        &["rewind", &base],
        &[("REWIND_FAILPOINT", "rewind:captured")],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&killed.status),
        Some(9),
        "not killed: {}",
        String::from_utf8_lossy(&killed.stderr)
    );
    assert_eq!(snapshot_names(&ws).len(), 2, "base and the orphan");
    // A record no ledger row names sends the next command through every
    // snapshot no row names.
    write(&ws.join(".rewind/acknowledged"), b"not a record");
    let l = rewind(&ws, &["--json", "list"]);
    assert!(l.status.success(), "{l:?}");
    let stderr = String::from_utf8_lossy(&l.stderr);
    assert!(!stderr.contains("is back"), "adopted: {stderr}");
    let l: serde_json::Value = serde_json::from_slice(&l.stdout).expect("json");
    assert_eq!(l["checkpoints"].as_array().map(Vec::len), Some(1), "{l}");
    assert!(
        !ws.join(".rewind/acknowledged").exists(),
        "the record that was looked into is retired"
    );
    let g = rewind_json(&ws, &["gc"]);
    assert_eq!(g["freed"]["snapshots"], 1, "{g}");
    assert_eq!(snapshot_names(&ws), vec![base]);
    // Not a file at all (made by hand): every command failed on it
    // (helper-75); it is looked past and removed.
    std::fs::create_dir_all(ws.join(".rewind/acknowledged/x")).expect("mkdir");
    let l = rewind(&ws, &["list"]);
    assert!(l.status.success(), "{l:?}");
    assert!(!ws.join(".rewind/acknowledged").exists());
}

/// Manifests built in one run, oldest first, where an automatic checkpoint
/// identical to its parent is folded while a later one is still pending:
/// the later one's parent moved, and the run committed it under the
/// folded one (FOREIGN KEY constraint failed, helper-75). After a power
/// cut that lost their rows, D324's adoption makes exactly this.
#[test]
fn a_fold_in_the_middle_of_pending_manifests_gives_the_next_its_new_parent() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a"), b"a");
    common::checkpoint_id(&ws, &["A"]);
    assert!(rewind(&ws, &["finish-manifests"]).status.success());
    let deferred = [("REWIND_MANIFEST", "deferred")];
    write(&ws.join("b"), b"b");
    assert!(
        rewind_env(&ws, &["checkpoint", "B"], &deferred)
            .status
            .success()
    );
    let auto = rewind_env(&ws, &["checkpoint", "--kind", "auto", "B again"], &deferred);
    assert!(auto.status.success(), "{auto:?}");
    write(&ws.join("c"), b"c");
    assert!(
        rewind_env(&ws, &["checkpoint", "C"], &deferred)
            .status
            .success()
    );
    let out = rewind(&ws, &["finish-manifests"]);
    assert!(out.status.success(), "{out:?}");
    let l = rewind_json(&ws, &["list"]);
    let rows = l["checkpoints"].as_array().expect("checkpoints");
    let labels: Vec<&str> = rows.iter().filter_map(|c| c["label"].as_str()).collect();
    assert_eq!(
        labels,
        ["A", "B", "C"],
        "the automatic one folded into B: {l}"
    );
    assert_eq!(rows[2]["parent"], rows[1]["id"], "C's parent is B: {l}");
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
}

/// `verify` and `anchor` right after a checkpoint whose manifest is still
/// pending left it out: the chain had no entry for it yet, so an anchor
/// taken "after my checkpoint" did not commit to it. Both finish pending
/// manifests first, as `list` does.
#[test]
fn verify_and_anchor_right_after_a_checkpoint_include_it() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a.txt"), b"a");
    rewind_json(&ws, &["checkpoint"]);
    let deferred = [("REWIND_MANIFEST", "deferred")];
    for verb in ["anchor", "verify"] {
        write(&ws.join("a.txt"), verb.as_bytes());
        let out = rewind_env(&ws, &["--json", "checkpoint", verb], &deferred);
        assert!(out.status.success(), "{out:?}");
        let first = rewind_json(&ws, &[verb]);
        listed(&ws);
        let again = rewind_json(&ws, &[verb]);
        assert_eq!(
            first, again,
            "{verb} before the manifest was built: {first}"
        );
    }
}

#[test]
fn a_manifest_built_after_the_tree_moved_on_is_the_snapshots_not_the_live_trees() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    // A first manifest fills the stat cache the second one will consult.
    rewind_json(&ws, &["checkpoint", "warm"]);
    listed(&ws);
    write(&ws.join("src/d0/f3.rs"), b"in the snapshot\n");
    let at_ack = snapshot(&ws);
    let out = rewind_env(
        &ws,
        &["--json", "checkpoint", "acked"],
        &[("REWIND_MANIFEST", "deferred")],
    );
    assert!(out.status.success());
    // The live tree moves on before the manifest is built: edits, a file
    // renamed away and back, a deletion, a type change, an mtime set back.
    write(&ws.join("src/d0/f3.rs"), b"after the snapshot\n");
    write(&ws.join("src/d1/f2.rs"), b"changed too\n");
    std::fs::rename(ws.join("src/d2/f1.rs"), ws.join("src/d2/tmp")).expect("mv");
    std::fs::rename(ws.join("src/d2/tmp"), ws.join("src/d2/f1.rs")).expect("mv back");
    std::fs::remove_file(ws.join("src/d3/f4.rs")).expect("rm");
    std::fs::remove_dir_all(ws.join("src/d4")).expect("rm -r");
    write(&ws.join("src/d4"), b"now a file\n");
    let st = std::process::Command::new("touch")
        .args(["-d", "2001-01-01"])
        .arg(ws.join("src/d1/f2.rs"))
        .status()
        .expect("touch");
    assert!(st.success());
    // `list` builds it (mirrored by the live tree where the cache vouches);
    // `verify --deep` rebuilds it from the snapshot alone: same root.
    let l = listed(&ws);
    assert_eq!(l.len(), 2, "{l:?}");
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        v["deep"]["bad"].as_array().is_some_and(Vec::is_empty),
        "manifest differs from its snapshot: {v}"
    );
    rewind_json(&ws, &["rewind", "acked"]);
    common::assert_same("rewind to the snapshot's state", &at_ack, &snapshot(&ws));
}

/// A subvolume `ws` on `lfs` holding a source tree, all nobody's, that
/// nobody can reach: the directories on the way that do not let others
/// traverse them (the test's temp dir) now do, every other mode bit kept
/// (/tmp keeps its sticky bit). `None`, skipped, without `setpriv`.
fn nobodys_subvolume(lfs: &LoopFs) -> Option<std::path::PathBuf> {
    if std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip_or_fail("setpriv (util-linux) is needed to run as another user");
        return None;
    }
    lfs.open_to_others();
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    common::give_to_nobody(&ws);
    Some(ws)
}

/// A gc that prunes every checkpoint but HEAD.
const GC_ALL_BUT_HEAD: &[&str] = &[
    "--json",
    "gc",
    "--keep-last",
    "1",
    "--keep-within",
    "0s",
    "--force",
];

/// `rewind -C WS ARGS` run as nobody: its exit code, its stdout as JSON
/// (null when it is not), its stderr.
fn as_nobody(ws: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_rewind"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .output()
        .expect("setpriv");
    (
        out.status.code(),
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_non_root_owner_checkpoints_and_rewinds_and_gc_explains_what_it_cannot_delete() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let Some(ws) = nobodys_subvolume(&lfs) else {
        return;
    };
    let as_nobody = |args: &[&str]| as_nobody(&ws, args);
    let (code, c, err) = as_nobody(&["--json", "checkpoint", "mine"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(c["engine"], "btrfs", "{c}");
    let before = snapshot(&ws);
    let (code, _, err) = as_nobody(&["--json", "checkpoint", "second"]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_file(ws.join("src/d0/f0.rs")).expect("rm");
    let (code, r, err) = as_nobody(&["--json", "rewind", "mine"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(r["changes"]["written"], 1, "{r}");
    common::assert_same("non-root rewind", &before, &snapshot(&ws));
    // Deleting snapshots needs user_subvol_rm_allowed, which this mount
    // lacks: doctor says so, and gc frees everything else and names it.
    let (_, d, _) = as_nobody(&["--json", "doctor"]);
    assert_eq!(d["snapshot_delete"], false, "{d}");
    let (code, g, err) = as_nobody(GC_ALL_BUT_HEAD);
    assert_eq!(code, Some(0), "{err}");
    let left = g["freed"]["snapshots_left"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!left.is_empty(), "{g}");
    assert!(
        err.contains("user_subvol_rm_allowed"),
        "the warning must name the mount option: {err}"
    );
    // Root can finish the job.
    let g = rewind_json(&ws, &["gc"]);
    assert_eq!(g["freed"]["snapshots"], left.len(), "{g}");
}

/// D257 (helper-42): with `user_subvol_rm_allowed`, btrfs lets a non-root
/// owner delete a subvolume only with write access to its root, which a
/// read-only snapshot refuses (EROFS): every gc failed after pruning,
/// said nothing was changed, and no snapshot was ever freed. The owner's
/// gc now clears the read-only flag of each snapshot it deletes.
#[test]
fn a_non_root_owners_gc_deletes_snapshots_where_user_subvol_rm_allowed() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let Some(ws) = nobodys_subvolume(&lfs) else {
        return;
    };
    let remount = std::process::Command::new("mount")
        .args(["-o", "remount,user_subvol_rm_allowed"])
        .arg(&lfs.mnt)
        .status()
        .expect("mount");
    assert!(remount.success(), "remount with user_subvol_rm_allowed");
    let as_nobody = |args: &[&str]| as_nobody(&ws, args);
    for (i, label) in ["one", "two", "three"].into_iter().enumerate() {
        std::fs::write(ws.join("src/d0/f0.rs"), format!("edit {i}\n")).expect("edit");
        let (code, _, err) = as_nobody(&["--json", "checkpoint", label]);
        assert_eq!(code, Some(0), "{err}");
    }
    let snapshots = || {
        std::fs::read_dir(ws.join(".rewind/state/snapshots"))
            .expect("snapshots")
            .count()
    };
    assert_eq!(snapshots(), 3);
    let (_, d, _) = as_nobody(&["--json", "doctor"]);
    assert_eq!(d["snapshot_delete"], true, "{d}");
    let (code, g, err) = as_nobody(GC_ALL_BUT_HEAD);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(g["freed"]["snapshots"], 2, "{g}");
    assert!(
        g["freed"]["snapshots_left"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "{g}"
    );
    assert_eq!(snapshots(), 1, "only HEAD's snapshot is left");
    let (code, v, err) = as_nobody(&["--json", "verify", "--deep"]);
    assert_eq!(code, Some(0), "{err} {v}");
    // helper-43: a snapshot taken while the workspace root was mode 555
    // keeps even its owner out: gc cannot delete it, and left it
    // writable, blaming the mount option. It stays read-only, and gc says
    // what keeps it.
    common::chmod(&ws, 0o555);
    let (code, _, err) = as_nobody(&["--json", "checkpoint", "locked"]);
    assert_eq!(code, Some(0), "{err}");
    common::chmod(&ws, 0o755);
    std::fs::write(ws.join("src/d0/f0.rs"), "after\n").expect("edit");
    let (code, _, err) = as_nobody(&["--json", "checkpoint", "open"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, g, err) = as_nobody(GC_ALL_BUT_HEAD);
    assert_eq!(code, Some(0), "{err}");
    let left = g["freed"]["snapshots_left"].to_string();
    assert!(
        left.contains("mode") && !left.contains("user_subvol_rm_allowed"),
        "{g}"
    );
    for snap in std::fs::read_dir(ws.join(".rewind/state/snapshots")).expect("snapshots") {
        let out = std::process::Command::new("btrfs")
            .args(["property", "get"])
            .arg(snap.expect("entry").path())
            .arg("ro")
            .output()
            .expect("btrfs property get");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ro=true");
    }
}

/// D202: root's gc, refused the deletion of a snapshot someone made
/// immutable, blamed missing root rights (`user_subvol_rm_allowed`, "run
/// as root"); it names the flag and the commands that clear it on a
/// read-only snapshot, and the next gc deletes it.
#[test]
fn gc_names_an_immutable_snapshot_not_missing_rights() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    if !common::is_root() {
        return;
    }
    let ws = lfs.subvolume("ws");
    write(&ws.join("f"), b"1\n");
    let first = common::checkpoint_id(&ws, &["one"]);
    for i in 2..5 {
        write(&ws.join("f"), format!("{i}\n").as_bytes());
        common::checkpoint_id(&ws, &[]);
    }
    listed(&ws); // every manifest built
    let snap = ws.join(".rewind/state/snapshots").join(&first);
    let s = snap.to_string_lossy().into_owned();
    if !(succeeds(&["btrfs", "property", "set", &s, "ro", "false"])
        && succeeds(&["chattr", "+i", &s])
        && succeeds(&["btrfs", "property", "set", &s, "ro", "true"]))
    {
        common::skip_or_fail(
            "btrfs-progs and chattr are needed (apt-get install btrfs-progs e2fsprogs)",
        );
        return;
    }
    let out = rewind(&ws, GC_ALL_BUT_HEAD);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // Undone before any assertion, so the loop filesystem unmounts.
    succeeds(&["btrfs", "property", "set", &s, "ro", "false"]);
    succeeds(&["chattr", "-i", &s]);
    succeeds(&["btrfs", "property", "set", &s, "ro", "true"]);
    let text = format!("{g}{err}");
    assert!(
        text.contains("immutable") && text.contains("chattr -i"),
        "{text}"
    );
    assert!(!text.contains("user_subvol_rm_allowed"), "{text}");
    let g = rewind_json(&ws, &["gc"]);
    assert!(!snap.exists(), "the next gc deletes it: {g}");
}

/// Root's first checkpoint in a user's subvolume makes a history that is
/// the user's, its state subvolume and ledger, snapshot directory and
/// snapshots included: made root's, every later command of the user's
/// was `NOT_OWNER` (D148).
#[test]
fn a_history_root_makes_on_a_users_subvolume_is_theirs() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let Some(ws) = nobodys_subvolume(&lfs) else {
        return;
    };
    let c = rewind_json(&ws, &["checkpoint", "by root"]);
    assert_eq!(c["engine"], "btrfs", "{c}");
    rewind_json(&ws, &["finish-manifests"]);
    assert_eq!(
        common::not_owned_by(&ws.join(".rewind"), 65534),
        Vec::<String>::new()
    );
    std::fs::remove_file(ws.join("src/d0/f0.rs")).expect("rm");
    let (code, _, err) = as_nobody(&ws, &["rewind", "by root", "-q"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(ws.join("src/d0/f0.rs").is_file());
}

#[test]
fn over_budget_with_only_protected_checkpoints_the_next_snapshot_is_refused() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    write(&ws.join("big.bin"), &vec![5u8; 2 << 20]);
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nmax_store_bytes = \"100KiB\"\n",
    );
    // The first checkpoint is acknowledged (nothing measured yet); its
    // manifest's retention run finds the store over budget, all protected.
    let first = rewind_env(
        &ws,
        &["--json", "checkpoint"],
        &[("REWIND_MANIFEST", "inline")],
    );
    assert!(first.status.success());
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("max_store_bytes"),
        "warned: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let before = snapshot_names(&ws);
    let second = rewind(&ws, &["--json", "checkpoint"]);
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("max_store_bytes") && err.contains("protected"),
        "{err}"
    );
    assert_eq!(
        snapshot_names(&ws),
        before,
        "refused, yet a snapshot was taken"
    );
    // Raising the budget lifts the refusal.
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nmax_store_bytes = \"1GiB\"\n",
    );
    rewind_json(&ws, &["gc"]);
    rewind_json(&ws, &["checkpoint"]);
}

#[test]
fn the_effect_barrier_decides_against_a_finished_head_not_a_pending_one() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let a = common::checkpoint_id(&ws, &["A"]);
    listed(&ws);
    // An identical hook checkpoint, still pending: it will fold into A.
    let out = rewind_env(
        &ws,
        &["--json", "checkpoint", "--kind", "hook"],
        &[("REWIND_MANIFEST", "deferred")],
    );
    assert!(out.status.success());
    let guard = |key: &str| {
        let out = rewind(&ws, &["--json", "guard", "--key", key]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let first = guard("deploy-1");
    assert_eq!(first["code"], "FIRST_FIRING", "{first}");
    let effects = rewind_json(&ws, &["effects"]);
    assert_eq!(effects["effects"][0]["head"], a.as_str(), "{effects}");
    let again = guard("deploy-1");
    assert_eq!(again["code"], "SPENT", "{again}");
}

/// Manifests built in line, so that each checkpoint's capture is the one
/// under test.
const INLINE: [(&str, &str); 1] = [("REWIND_MANIFEST", "inline")];

/// A source tree in a btrfs subvolume whose first manifest filled the
/// stat cache and said which snapshot it describes: the next capture is
/// scoped by btrfs's changes.
fn scoped_by_btrfs_changes() -> Option<(LoopFs, std::path::PathBuf)> {
    let lfs = LoopFs::new(Fs::Btrfs, 512)?;
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let out = rewind_env(&ws, &["--json", "checkpoint", "base"], &INLINE);
    assert!(out.status.success());
    Some((lfs, ws))
}

/// D59: after a snapshot's manifest, btrfs names what changed since, and
/// the next manifest looks only there. Every kind of change must be
/// among what it names, or a checkpoint would silently keep old content:
/// each round is checked against a capture of the snapshot alone
/// (`verify --deep`) and, at the end, by rewinding to every round.
#[test]
fn a_manifest_scoped_by_btrfs_changes_misses_no_kind_of_change() {
    let Some((_lfs, ws)) = scoped_by_btrfs_changes() else {
        return;
    };
    let rounds = common::checkpoint_every_kind_of_change(
        &ws,
        &INLINE,
        "btrfs changes: the capture is scoped",
        |_| {},
    );
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(
        v["ok"], true,
        "a scoped manifest differs from its snapshot: {v}"
    );
    common::rewind_to_every_round(&ws, &rounds);
    // An ignore file changes what is captured below it: all of it is walked.
    common::a_new_ignore_file_drops_what_it_names(&ws, &rounds[0].id, &INLINE);
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
}

/// D235: what a directory's listing skipped is recorded by every
/// manifest btrfs's changes scope, and kept by a rewind to it.
#[test]
fn a_skip_btrfs_changes_did_not_touch_is_still_recorded() {
    let Some((_lfs, ws)) = scoped_by_btrfs_changes() else {
        return;
    };
    common::a_skip_the_scope_did_not_touch_is_still_recorded(
        &ws,
        &INLINE,
        "btrfs changes: the capture is scoped",
    );
}

/// D74: the manifest builder, off the agent's path, folds the WAL and
/// starts a new one with one commit, so the next command indexes one
/// frame on open instead of everything since the last fold; the ledger
/// still holds everything.
#[test]
fn the_manifest_builder_leaves_a_wal_of_one_commit() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let deferred = [("REWIND_MANIFEST", "deferred")];
    let wal = ws.join(".rewind/state/ledger.db-wal");
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    let mut ids = Vec::new();
    for n in 0..3 {
        write(&ws.join(format!("src/d{n}/f{n}.rs")), b"edited\n");
        let c = rewind_env(&ws, &["--json", "checkpoint"], &deferred);
        assert!(c.status.success(), "checkpoint {n}");
        let c: serde_json::Value = serde_json::from_slice(&c.stdout).expect("json");
        ids.push(c["id"].as_str().expect("id").to_string());
        let f = rewind_json(&ws, &["finish-manifests"]);
        assert_eq!(f["finished"], 1, "{f}");
        // One 16 KiB page and its 24-byte frame header, after the
        // 32-byte WAL header.
        assert!(
            wal_len() <= 32 + 16 * 1024 + 24,
            "after the builder the WAL holds more than one commit: {} bytes",
            wal_len()
        );
    }
    let l = listed(&ws);
    assert_eq!(
        l.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        ids,
        "every checkpoint is listed with its manifest: {l:?}"
    );
    assert!(l.iter().all(|c| !c.1.is_empty()), "{l:?}");
    let v = rewind(&ws, &["verify"]);
    assert!(v.status.success(), "verify after folds");
}

/// An active swap file at `path` (btrfs wants it NOCOW and preallocated),
/// switched off when dropped; `None` where the kernel refuses swap.
struct Swap(std::path::PathBuf);

impl Swap {
    fn on(path: &Path) -> Option<Swap> {
        let p = path.to_str().expect("utf-8 path");
        let made = succeeds(&["truncate", "-s", "0", p])
            && succeeds(&["chattr", "+C", p])
            && succeeds(&["fallocate", "-l", "16M", p])
            && succeeds(&["chmod", "600", p])
            && succeeds(&["mkswap", p]);
        assert!(made, "could not make a swap file at {p}");
        if !succeeds(&["swapon", p]) {
            common::skip_or_fail("swapon refused a swap file on btrfs");
            return None;
        }
        Some(Swap(path.to_path_buf()))
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let _ = std::process::Command::new("swapoff").arg(&self.0).status();
    }
}

/// D246 (helper-37): btrfs refuses to snapshot a subvolume holding an
/// active swap file (ETXTBSY). Every checkpoint failed with "snapshot
/// …/snapshots/<id>: Text file busy", a path that never existed, and
/// `init --subvolume` found it only after the swap, when the old tree
/// could not be removed: the swap file was left at a hidden name. Both
/// now name the swap file and `swapoff`, before anything changes.
#[test]
fn an_active_swap_file_is_named_with_its_fix_and_nothing_changes() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let conv = lfs.subdir("conv");
    write(&conv.join("a"), b"work\n");
    let Some(swap) = Swap::on(&conv.join("swapf")) else {
        return;
    };
    let out = rewind(&lfs.mnt, &["init", "--subvolume", "conv"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("conv/swapf: is an active swap file")
            && err.contains("swapoff")
            && err.contains("nothing was changed"),
        "{err}"
    );
    assert!(!lfs.mnt.join(".conv.rewind-subvol").exists(), "{err}");
    assert!(!conv.join(".rewind").exists(), "{err}");
    drop(swap);

    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    rewind_json(&ws, &["checkpoint", "base"]);
    let Some(swap) = Swap::on(&ws.join("swapf")) else {
        return;
    };
    let before = snapshot(&ws);
    let out = rewind(&ws, &["--json", "checkpoint", "refused"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "BTRFS", "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("active swap file") && m.contains("swapoff") && m.contains("swapf"),
        "{v}"
    );
    let labels: Vec<String> = rewind_json(&ws, &["list"])["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["label"].as_str().map(String::from))
        .collect();
    assert_eq!(labels, ["base"]);
    assert_eq!(snapshot_names(&ws).len(), 1);
    common::assert_same("refused checkpoint", &before, &snapshot(&ws));
    drop(swap);
    rewind_json(&ws, &["checkpoint", "after swapoff"]);
}

/// helper-37: a btrfs snapshot of a workspace (a fork for a second agent)
/// holds an empty directory where the history's nested subvolume was.
/// Every command said the ledger `.rewind/ledger.db` was missing, a path
/// where it never lived, and to restore it from a backup. It now says
/// what the tree is, where its history is, and how to start one here.
#[test]
fn a_snapshot_of_a_workspace_says_its_history_stayed_with_the_original() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a"), b"a\n");
    rewind_json(&ws, &["checkpoint", "A"]);
    let fork = lfs.mnt.join("fork");
    assert!(succeeds(&[
        "btrfs",
        "-q",
        "subvolume",
        "snapshot",
        ws.to_str().expect("utf-8"),
        fork.to_str().expect("utf-8"),
    ]));
    let before = snapshot(&fork);
    for verb in [&["status"][..], &["list"], &["checkpoint", "C"]] {
        let args: Vec<&str> = ["--json"].iter().chain(verb).copied().collect();
        let out = rewind(&fork, &args);
        assert_eq!(out.status.code(), Some(1), "{verb:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "LEDGER_MISSING", "{verb:?}: {v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("snapshot (or copy) of a workspace")
                && m.contains("stayed with the original")
                && m.contains("rewind init")
                && !m.contains("backup"),
            "{verb:?}: {v}"
        );
    }
    common::assert_same("refused in the fork", &before, &snapshot(&fork));
    // The original is untouched.
    assert_eq!(listed(&ws).len(), 1);
}

/// D252 (helper-39): `verify --deep` in a btrfs-engine workspace mounted
/// with `rewind mount` hashed each snapshot with the mount's dirty set
/// and the live tree's stat cache, and called every intact snapshot
/// damaged (all with the same "actual" root). What the daemon says is
/// about the live tree alone now.
#[test]
fn verify_deep_through_a_mount_finds_intact_snapshots_intact() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    // Past the cache's racy window between steps, as an agent's are.
    let pause = || std::thread::sleep(std::time::Duration::from_millis(1100));
    write(&ws.join("a.txt"), b"a\n");
    rewind_json(&ws, &["checkpoint", "one"]);
    pause();
    write(&ws.join("b.txt"), b"b\n");
    rewind_json(&ws, &["checkpoint", "two"]);
    pause();
    assert_eq!(rewind_json(&ws, &["verify", "--deep"])["ok"], true);
    let Some(_m) = common::MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("c.txt"), b"c\n");
    rewind_json(&ws, &["checkpoint", "three"]);
    write(&ws.join("d/e"), b"e\n");
    rewind_json(&ws, &["rewind", "one"]);
    write(&ws.join("f.txt"), b"f\n");
    rewind_json(&ws, &["checkpoint", "four"]);
    std::fs::OpenOptions::new()
        .append(true)
        .open(ws.join("a.txt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"g\n"))
        .expect("append");
    let out = rewind(&ws, &["--json", "verify", "--deep"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], true, "{v}");
    assert!(out.status.success(), "{v}");
}

/// D275 with the btrfs engine: the rewind clones from the snapshot, and
/// the manifest of the next checkpoint is built from the next one.
#[test]
fn a_restored_file_is_not_read_again_until_it_changes() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    assert_eq!(engine(&ws), "btrfs");
    common::a_restored_file_is_not_read_again_until_it_changes(
        &ws,
        &[("REWIND_MANIFEST", "inline")],
    );
}

/// The subvolumes on `lfs`, as `btrfs subvolume list` prints them.
fn subvolumes(lfs: &LoopFs) -> Vec<String> {
    let out = std::process::Command::new("btrfs")
        .args(["subvolume", "list"])
        .arg(&lfs.mnt)
        .output()
        .expect("btrfs subvolume list");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// D323 (helper-70): `rm -rf .rewind` in a btrfs-engine workspace
/// deleted the ledger, then stopped on the first read-only snapshot,
/// leaving snapshots no command named. `rewind deinit --yes` deletes
/// every snapshot, the state subvolume and the rest, and leaves the files
/// exactly as they were; without `--yes` it deletes nothing. It also
/// finishes what a failed `rm -rf` left.
#[test]
fn deinit_deletes_every_snapshot_and_the_history_and_leaves_the_files() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    common::populate_src_tree(&ws);
    let checkpoint = |label: &str| {
        write(&ws.join("src/d0/f0.rs"), format!("{label}\n").as_bytes());
        assert!(rewind(&ws, &["checkpoint", label]).status.success());
    };
    for label in ["one", "two", "three"] {
        checkpoint(label);
    }
    assert_eq!(engine(&ws), "btrfs");
    assert_eq!(snapshot_names(&ws).len(), 3);
    let want = snapshot(&ws);

    let out = rewind(&ws, &["deinit"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3 checkpoints and 3 btrfs snapshots") && err.contains("--yes"),
        "{err}"
    );
    let dry = rewind_json(&ws, &["deinit", "--dry-run"]);
    assert_eq!(
        (&dry["checkpoints"], &dry["snapshots"], &dry["deleted"]),
        (&3.into(), &3.into(), &false.into()),
        "{dry}"
    );
    assert_eq!(
        snapshot_names(&ws).len(),
        3,
        "nothing is deleted without --yes"
    );
    assert_eq!(listed(&ws).len(), 3);

    let done = rewind_json(&ws, &["deinit", "--yes"]);
    assert_eq!(done["deleted"], true, "{done}");
    assert_eq!(done["snapshots"], 3, "{done}");
    assert!(!ws.join(".rewind").exists());
    common::assert_same("the files after deinit", &want, &snapshot(&ws));
    assert_eq!(subvolumes(&lfs).len(), 1, "{:?}", subvolumes(&lfs));
    // A new history starts from the tree as it is.
    checkpoint("again");
    assert_eq!(engine(&ws), "btrfs");
    assert_eq!(listed(&ws).len(), 1);

    // What `rm -rf` leaves: the ledger gone, the snapshots there.
    checkpoint("before rm");
    let rm = std::process::Command::new("rm")
        .arg("-rf")
        .arg(ws.join(".rewind"))
        .output()
        .expect("rm");
    assert!(!rm.status.success(), "rm -rf deleted read-only snapshots");
    assert!(!ws.join(".rewind/state/ledger.db").exists());
    // Named with -C: `deinit` runs only at the root (helper-74); and the
    // ledger named where it lived, not `.rewind/ledger.db`, where a
    // backup put back opened as a walk engine's history (helper-75).
    let missing = rewind(&ws.join("src"), &["status"]);
    let fix = format!("rewind -C {} deinit --yes", ws.display());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains(&fix), "{missing:?}");
    assert!(err.contains(".rewind/state/ledger.db is missing"), "{err}");
    let want = snapshot(&ws);
    let done = rewind_json(&ws, &["deinit", "--yes"]);
    assert_eq!(done["deleted"], true, "{done}");
    assert_eq!(done["snapshots"], 2, "{done}");
    assert!(!ws.join(".rewind").exists());
    common::assert_same("the files after rm -rf and deinit", &want, &snapshot(&ws));
    assert_eq!(subvolumes(&lfs).len(), 1, "{:?}", subvolumes(&lfs));
}

/// D323: a non-root owner deletes their btrfs history where btrfs lets
/// them delete subvolumes (`user_subvol_rm_allowed`); elsewhere `deinit`
/// names the option and deletes nothing, so no half history is left.
#[test]
fn a_non_root_owners_deinit_deletes_all_or_nothing() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let Some(ws) = nobodys_subvolume(&lfs) else {
        return;
    };
    let as_nobody = |args: &[&str]| as_nobody(&ws, args);
    for label in ["one", "two"] {
        std::fs::write(ws.join("src/d0/f0.rs"), format!("{label}\n")).expect("edit");
        let (code, _, err) = as_nobody(&["--json", "checkpoint", label]);
        assert_eq!(code, Some(0), "{err}");
    }
    // The dry run says so too, before anything (helper-73).
    let (code, _, err) = as_nobody(&["deinit", "--dry-run"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("user_subvol_rm_allowed"), "{err}");
    let (code, _, err) = as_nobody(&["deinit", "--yes"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("user_subvol_rm_allowed") && err.contains("nothing was deleted"),
        "{err}"
    );
    assert_eq!(snapshot_names(&ws).len(), 2);
    let (code, l, err) = as_nobody(&["--json", "list"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(l["checkpoints"].as_array().map(Vec::len), Some(2), "{l}");

    let remount = std::process::Command::new("mount")
        .args(["-o", "remount,user_subvol_rm_allowed"])
        .arg(&lfs.mnt)
        .status()
        .expect("mount");
    assert!(remount.success(), "remount with user_subvol_rm_allowed");
    let want = snapshot(&ws);
    let (code, v, err) = as_nobody(&["--json", "deinit", "--yes"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["snapshots"], 2, "{v}");
    assert!(!ws.join(".rewind").exists());
    common::assert_same("nobody's files after deinit", &want, &snapshot(&ws));
    assert_eq!(subvolumes(&lfs).len(), 1, "{:?}", subvolumes(&lfs));
}

/// The anchor rewind keeps outside the workspace (D313) is found again
/// after the filesystem is mounted again. It was keyed by the root's
/// `st_dev`, which btrfs hands a subvolume anew at each mount: after a
/// reboot `verify` checked against nothing, and a stale anchor of an
/// earlier mount could come back (helper-76). It is keyed by the statfs
/// filesystem id, which btrfs derives from its UUID and the subvolume.
#[test]
fn the_kept_anchor_outlives_a_remount_of_btrfs() {
    use std::os::unix::fs::MetadataExt;
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 256) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    let state = common::tmp();
    let env = [("XDG_STATE_HOME", state.path().to_str().expect("utf8"))];
    write(&ws.join("a"), b"a");
    assert!(
        rewind_env(&ws, &["checkpoint", "one"], &env)
            .status
            .success()
    );
    let kept = |ws: &Path| {
        let out = rewind_env(ws, &["--json", "verify"], &env);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["ok"], true, "{v}");
        v["kept_anchor"].clone()
    };
    // The checkpoint goes on the chain with its manifest (the
    // acknowledgement's pending row moves no anchor), and no manifest
    // builder is then left holding the filesystem.
    assert!(
        rewind_env(&ws, &["finish-manifests"], &env)
            .status
            .success()
    );
    let before = kept(&ws);
    assert!(before.is_object(), "anchored before: {before}");
    let dev = std::fs::metadata(&ws).expect("stat").dev();
    // Another btrfs mounted meanwhile takes the device numbers this one
    // let go, as at a reboot (tests running beside this one take and
    // give back numbers too: tried again until the number moved).
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(lfs.remount_after(|| {
            let other = LoopFs::new(Fs::Btrfs, 256).expect("a second btrfs");
            std::fs::metadata(other.subvolume("x")).expect("stat");
            other
        }));
        if std::fs::metadata(&ws).expect("stat").dev() != dev {
            break;
        }
    }
    assert_ne!(
        std::fs::metadata(&ws).expect("stat").dev(),
        dev,
        "the subvolume's st_dev did not change: this tests nothing"
    );
    assert_eq!(kept(&ws), before, "the same anchor, found again");
    drop(others);
}

/// A snapshot no kept checkpoint has (one `gc` could not delete without
/// `user_subvol_rm_allowed`, here one made by hand) was left out of `du`
/// without a word, while `doctor` counted it (helper-79): `du` counts it
/// and says its space is not measured; `gc` deletes it.
#[test]
fn du_counts_the_snapshots_no_kept_checkpoint_has() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 256) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("a"), b"a");
    assert!(rewind(&ws, &["checkpoint", "-q", "one"]).status.success());
    assert!(rewind(&ws, &["finish-manifests"]).status.success());
    let left = |ws: &Path| rewind_json(ws, &["du"])["total"]["snapshots_left"].clone();
    assert_eq!(left(&ws), 0);
    let st = std::process::Command::new("btrfs")
        .args(["subvolume", "snapshot", "-r"])
        .arg(&ws)
        .arg(ws.join(".rewind/state/snapshots/zzzzzzzz"))
        .output()
        .expect("btrfs");
    assert!(st.status.success(), "{st:?}");
    assert_eq!(left(&ws), 1);
    let human = rewind(&ws, &["du"]);
    assert!(
        String::from_utf8_lossy(&human.stdout)
            .contains("1 btrfs snapshot that no kept checkpoint has is still on disk"),
        "{human:?}"
    );
    assert!(rewind(&ws, &["gc"]).status.success());
    assert_eq!(left(&ws), 0);
}

/// helper-82: the changed-inode scope took a changed inode's names from
/// the INODE_REF items in leaves written since the last snapshot, and
/// looked the rest up only when it found none. A write through one of
/// 1,000 hard links (each in its own directory) found 322 names: the
/// checkpoint's manifest held the old content for the other 678 while
/// its snapshot held the new, `verify --deep` said DAMAGED, and a rewind
/// to it restored the old bytes. An inode with fewer names found than
/// links is looked up whole.
#[test]
fn a_write_through_one_of_many_hard_links_reaches_every_name() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    // No atime updates: reading the directories would rewrite their
    // leaves and hide the names' old ones.
    lfs.remount("noatime");
    let ws = lfs.subvolume("ws");
    let first = ws.join("d0000/f");
    write(&first, b"version-1\n");
    for i in 1..1000 {
        let d = ws.join(format!("d{i:04}"));
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::hard_link(&first, d.join("f")).expect("link");
    }
    lfs.sync();
    let c1 = common::checkpoint_id(&ws, &["c1"]);
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&first)
            .expect("open");
        f.seek(std::io::SeekFrom::Start(8)).expect("seek");
        f.write_all(b"2").expect("write");
    }
    let c2 = common::checkpoint_id(&ws, &["c2"]);
    let diff = rewind_json(&ws, &["diff", &c1, &c2]);
    assert_eq!(
        diff["changes"].as_array().map(Vec::len),
        Some(1000),
        "every name changed"
    );
    let deep = rewind(&ws, &["verify", "--deep"]);
    assert!(
        deep.status.success(),
        "{}",
        String::from_utf8_lossy(&deep.stdout)
    );
    for i in 0..1000 {
        let p = ws.join(format!("d{i:04}/f"));
        std::fs::remove_file(&p).expect("rm");
        write(&p, b"version-1\n");
    }
    common::checkpoint_id(&ws, &["c3"]);
    rewind_json(&ws, &["rewind", &c2]);
    let restored = (0..1000)
        .filter(|i| std::fs::read(ws.join(format!("d{i:04}/f"))).expect("read") == b"version-2\n")
        .count();
    assert_eq!(restored, 1000, "every name holds what c2 holds");
}

/// D340 (helper-89): gc drops the stat-cache row of each directory whose
/// tree it pruned (D190), the root's among them. A capture scoped by
/// btrfs's changes then listed the root in full and read every file below
/// it, the rows of its untouched subdirectories left unread: after
/// `rewind`, `undo` and `gc --keep-last 1 --force`, a 10-edit checkpoint
/// of a million files re-hashed all of them (29.8 s). The rows below a
/// directory without one are read too: only the directories whose rows
/// went are read again.
#[test]
fn a_capture_after_gc_dropped_the_roots_cache_row_reads_only_what_lost_its_row() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    for d in 0..8 {
        for f in 0..20 {
            let text = format!("{d} {f}\n").repeat(40);
            write(&ws.join(format!("d{d}/f{f}.txt")), text.as_bytes());
        }
    }
    let run = |args: &[&str]| {
        let out = rewind_env(&ws, &[&["--json"], args].concat(), &INLINE);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let edit = |tag: &str| {
        for d in [1, 3] {
            let path = ws.join(format!("d{d}/f7.txt"));
            let mut text = std::fs::read(&path).expect("read");
            text.extend_from_slice(tag.as_bytes());
            write(&path, &text);
        }
    };
    run(&["checkpoint", "r0"]);
    edit("r1");
    run(&["rewind", "HEAD"]);
    run(&["undo"]);
    run(&["gc", "--keep-last", "1", "--force"]);
    edit("r2");
    // d1 and d3 lost their rows with r0's tree: 2 × 20 files.
    assert_eq!(
        common::capture_notes(&ws, &["checkpoint", "r2"], &INLINE),
        [(40, 0)],
        "read more than the two directories whose rows gc dropped"
    );
    let st = rewind_json(&ws, &["status"]);
    assert!(common::changed_paths(&st).is_empty(), "{st}");
}
