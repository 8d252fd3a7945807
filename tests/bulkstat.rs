//! D60: the walk engine on XFS, as root, learns what changed from one bulk
//! stat of the filesystem instead of a stat per path. Every kind of change
//! must show in it, or a checkpoint would silently keep old content: after
//! each one, a full walk (`REWIND_BULKSTAT=0 status`) must find the tree
//! equal to the checkpoint just taken, and a rewind to every round must
//! give back exactly that round's tree.

mod common;

use common::{Fs, LoopFs, rewind_env, rewind_json, snapshot, write};

#[test]
fn a_checkpoint_scoped_by_a_bulk_stat_misses_no_kind_of_change() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.subdir("ws");
    common::populate_src_tree(&ws);
    rewind_json(&ws, &["init"]);
    // The first checkpoint walks and writes the stat cache.
    rewind_json(&ws, &["checkpoint", "base"]);
    let mut rounds = Vec::new();
    for (what, change) in common::every_kind_of_change() {
        change(&ws);
        let out = rewind_env(
            &ws,
            &["--json", "checkpoint", what],
            &[("REWIND_TRACE", "1")],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {err}");
        assert!(
            err.contains("bulk stat: the capture is scoped"),
            "{what}: the checkpoint did not use the bulk stat: {err}"
        );
        let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let walk = rewind_env(&ws, &["--json", "status"], &[("REWIND_BULKSTAT", "0")]);
        let walk: serde_json::Value = serde_json::from_slice(&walk.stdout).expect("json");
        assert_eq!(
            walk["changes"].as_array().map(Vec::len),
            Some(0),
            "{what}: a full walk sees what the checkpoint missed: {walk}"
        );
        rounds.push((
            what,
            c["id"].as_str().expect("id").to_string(),
            snapshot(&ws),
        ));
    }
    for (what, id, state) in rounds.iter().rev() {
        rewind_json(&ws, &["rewind", id]);
        common::assert_same(&format!("rewind to \"{what}\""), state, &snapshot(&ws));
    }
    // An ignore file changes what is captured below it: all of it is walked.
    write(&ws.join("src/d0/.rewindignore"), b"f4.rs\n");
    let c = rewind_json(&ws, &["checkpoint", "ignore"]);
    let d = rewind_json(&ws, &["diff", &rounds[0].1, c["id"].as_str().expect("id")]);
    assert!(
        d["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .any(|c| c["path"] == "src/d0/f4.rs"),
        "the newly ignored file is still in the checkpoint: {d}"
    );
}

/// The bulk stat is not used where it would not say the same as a walk or
/// would cost more: the ignore rules kept outside the tree changed since
/// the cache was written, or a filesystem is mounted inside the tree.
#[test]
fn the_bulk_stat_steps_aside_for_new_ignore_rules_and_nested_mounts() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.subdir("ws");
    common::populate_src_tree(&ws);
    rewind_json(&ws, &["init"]);
    rewind_json(&ws, &["checkpoint", "base"]);
    let note = |label: &str| -> String {
        let out = rewind_env(
            &ws,
            &["--json", "checkpoint", label],
            &[("REWIND_TRACE", "1")],
        );
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .find(|l| l.contains("note: bulk stat:"))
            .unwrap_or_default()
            .to_string()
    };
    std::fs::write(ws.join(".rewind/ignore"), "src/d2/\n").expect("write rules");
    write(&ws.join("src/d2/f0.rs"), b"edited under new rules\n");
    let n = note("new rules");
    assert!(n.contains("other ignore rules"), "{n}");
    // The walk under the new rules dropped src/d2; the next one may scope.
    write(&ws.join("src/d3/f0.rs"), b"edited\n");
    let n = note("same rules");
    assert!(n.contains("scoped"), "{n}");
    let inner = ws.join("src/mnt");
    std::fs::create_dir(&inner).expect("mkdir");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&inner)
        .status()
        .expect("mount");
    assert!(st.success());
    write(&ws.join("src/d3/f1.rs"), b"edited\n");
    let n = note("nested mount");
    let _ = std::process::Command::new("umount").arg(&inner).status();
    assert!(n.contains("mounted inside the tree"), "{n}");
}
