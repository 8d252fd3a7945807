//! D60: the walk engine on XFS, as root, learns what changed from one bulk
//! stat of the filesystem instead of a stat per path. Every kind of change
//! must show in it, or a checkpoint would silently keep old content: after
//! each one, a full walk (`REWIND_BULKSTAT=0 status`) must find the tree
//! equal to the checkpoint just taken, and a rewind to every round must
//! give back exactly that round's tree.

mod common;

use std::path::PathBuf;

use common::{Fs, LoopFs, rewind_env, rewind_json, write};

/// A tree from `populate_src_tree` alone on an XFS of its own, with a first
/// checkpoint (a walk, which writes the stat cache).
fn alone_on_xfs() -> Option<(LoopFs, PathBuf)> {
    let lfs = LoopFs::new(Fs::Xfs, 512)?;
    let ws = lfs.subdir("ws");
    common::populate_src_tree(&ws);
    rewind_json(&ws, &["init"]);
    rewind_json(&ws, &["checkpoint", "base"]);
    Some((lfs, ws))
}

#[test]
fn a_checkpoint_scoped_by_a_bulk_stat_misses_no_kind_of_change() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    let rounds = common::checkpoint_every_kind_of_change(
        &ws,
        &[],
        "bulk stat: the capture is scoped",
        |what| {
            let walk = rewind_env(&ws, &["--json", "status"], &[("REWIND_BULKSTAT", "0")]);
            let walk: serde_json::Value = serde_json::from_slice(&walk.stdout).expect("json");
            assert_eq!(
                walk["changes"].as_array().map(Vec::len),
                Some(0),
                "{what}: a full walk sees what the checkpoint missed: {walk}"
            );
        },
    );
    common::rewind_to_every_round(&ws, &rounds);
    // An ignore file changes what is captured below it: all of it is walked.
    common::a_new_ignore_file_drops_what_it_names(&ws, &rounds[0].id, &[]);
}

/// The bulk stat is not used where it would not say the same as a walk or
/// would cost more: the ignore rules kept outside the tree changed since
/// the cache was written, or a filesystem is mounted inside the tree.
#[test]
fn the_bulk_stat_steps_aside_for_new_ignore_rules_and_nested_mounts() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
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
