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
        |what| a_full_walk_finds_no_change(&ws, what),
    );
    common::rewind_to_every_round(&ws, &rounds);
    // An ignore file changes what is captured below it: all of it is walked.
    common::a_new_ignore_file_drops_what_it_names(&ws, &rounds[0].id, &[]);
}

/// D235: what a directory's listing skipped is recorded by every
/// checkpoint the bulk stat scopes, and kept by a rewind to it.
#[test]
fn a_skip_the_bulk_stat_did_not_touch_is_still_recorded() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    common::a_skip_the_scope_did_not_touch_is_still_recorded(
        &ws,
        &[],
        "bulk stat: the capture is scoped",
    );
}

/// The bulk stat is not used where it would not say the same as a walk or
/// would cost more: the ignore rules kept outside the tree changed since
/// the cache was written, or a filesystem is mounted inside the tree.
#[test]
fn the_bulk_stat_steps_aside_for_new_ignore_rules_and_nested_mounts() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    let note = |label: &str| scope_note(&ws, label);
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

/// D76: on a filesystem holding many more inodes than the tree, the bulk
/// stat reads only the inode chunks the tree's entries live in, and still
/// misses no kind of change.
#[test]
fn on_a_crowded_filesystem_the_bulk_stat_reads_only_the_trees_chunks() {
    let Some((lfs, ws)) = alone_on_xfs() else {
        return;
    };
    // Three thousand files beside the workspace: before D76 a filesystem
    // holding over twice the tree's inodes was never bulk stated.
    let other = lfs.subdir("other");
    for i in 0..3000 {
        write(&other.join(format!("d{}/f{i}", i % 30)), b"x");
    }
    rewind_json(&ws, &["checkpoint", "crowded"]);
    let doctor = rewind_json(&ws, &["doctor"]);
    assert!(
        doctor["engine_why"]
            .as_str()
            .is_some_and(|w| w.contains("as root, a bulk stat of the tree's inode chunks")),
        "doctor says how changes are found: {doctor}"
    );
    // ... and that it does not when told not to (helper-55).
    let off = common::rewind_env(&ws, &["--json", "doctor"], &[("REWIND_BULKSTAT", "0")]);
    let off: serde_json::Value = serde_json::from_slice(&off.stdout).expect("doctor json");
    assert!(
        off["engine_why"]
            .as_str()
            .is_some_and(|w| w.contains("a stat per path (REWIND_BULKSTAT=0")),
        "{off}"
    );
    let rounds = common::checkpoint_every_kind_of_change(
        &ws,
        &[],
        "bulk stat: the capture is scoped",
        |what| a_full_walk_finds_no_change(&ws, what),
    );
    common::rewind_to_every_round(&ws, &rounds);
    let note = scope_note(&ws, "read");
    let read: u64 = note
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no inode count in: {note}"));
    assert!(
        read < 1500,
        "read {read} inodes: more than the tree's chunks ({note})"
    );
}

/// A full walk (`REWIND_BULKSTAT=0 status`) finds the tree equal to the
/// last checkpoint: the bulk stat's scope missed nothing.
fn a_full_walk_finds_no_change(ws: &std::path::Path, what: &str) {
    let walk = rewind_env(ws, &["--json", "status"], &[("REWIND_BULKSTAT", "0")]);
    let walk: serde_json::Value = serde_json::from_slice(&walk.stdout).expect("json");
    assert_eq!(
        walk["changes"].as_array().map(Vec::len),
        Some(0),
        "{what}: a full walk sees what the checkpoint missed: {walk}"
    );
}

/// The trace notes about the bulk stat of a checkpoint labelled `label`.
fn bulk_stat_notes(ws: &std::path::Path, label: &str) -> Vec<String> {
    let out = rewind_env(
        ws,
        &["--json", "checkpoint", label],
        &[("REWIND_TRACE", "1")],
    );
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("note: bulk stat:"))
        .map(str::to_string)
        .collect()
}

/// The first of them: how the capture was scoped.
fn scope_note(ws: &std::path::Path, label: &str) -> String {
    bulk_stat_notes(ws, label)
        .into_iter()
        .next()
        .unwrap_or_default()
}

/// A bulk stat reports a file's size on disk, which lags a write until
/// writeback: a file written seconds ago must not look changed at every
/// checkpoint until then (it is compared by its times), and one that did
/// change is still looked at.
#[test]
fn files_written_before_the_last_checkpoint_are_not_looked_at_again() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    // Past the racy window of the cache written by `base`.
    std::thread::sleep(std::time::Duration::from_millis(50));
    for f in 0..3 {
        let p = ws.join(format!("src/d3/f{f}.rs"));
        let mut text = std::fs::read(&p).expect("read");
        text.extend_from_slice(b"// grown, not yet written back\n");
        std::fs::write(&p, text).expect("write");
    }
    let first = scope_note(&ws, "three");
    assert!(first.contains("for 3 entries"), "{first}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    write(&ws.join("src/d4/f0.rs"), b"edited\n");
    let second = scope_note(&ws, "one more");
    assert!(
        second.contains("for 1 entries"),
        "only the new edit is looked at: {second}"
    );
    a_full_walk_finds_no_change(&ws, "after the second checkpoint");
}

/// Where the tree's entries share their chunks with many inodes it does
/// not hold (here files its ignore rules leave out), reading the chunks
/// costs more than a walk: the walk is used.
#[test]
fn a_tree_spread_thin_over_its_chunks_is_walked() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    write(&ws.join("src/mix/.rewindignore"), b"*.tmp\n");
    for i in 0..80 {
        write(&ws.join(format!("src/mix/f{i}.rs")), b"kept\n");
        for j in 0..30 {
            write(&ws.join(format!("src/mix/x{i}-{j}.tmp")), b"ignored\n");
        }
    }
    rewind_json(&ws, &["checkpoint", "mixed"]);
    write(&ws.join("src/mix/f0.rs"), b"edited\n");
    let n = scope_note(&ws, "spread");
    assert!(n.contains("spread over chunks"), "{n}");
}

/// D336 stats the tree again once a capture has read what changed, with
/// a second bulk stat here, to see whether anything moved meanwhile. A
/// capture that read and listed nothing holds the tree as it was before
/// it began, which nothing can tear: it is spared the second (D338). So
/// is one that read only what had changed before it began (D345): it too
/// holds the tree as it was then, and a change made after is the next
/// checkpoint's (the second bulk stat was 130 ms of 320 at 300,000 files).
#[test]
fn a_capture_that_read_only_what_changed_before_it_began_is_spared_the_second_bulk_stat() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    let bulk_stats = |label: &str| {
        bulk_stat_notes(&ws, label)
            .iter()
            .filter(|l| l.contains("the capture is scoped"))
            .count()
    };
    // Past the same coarse clock tick as the edits before each.
    let settle = || std::thread::sleep(std::time::Duration::from_millis(50));
    settle();
    assert_eq!(bulk_stats("nothing changed"), 1);
    write(&ws.join("src/d4/f0.rs"), b"edited\n");
    settle();
    assert_eq!(bulk_stats("one edit"), 1);
    a_full_walk_finds_no_change(&ws, "after the edit");
}

/// The other side of D345: a capture that reads a file changed after it
/// began pays the second bulk stat, which sees what else changed meanwhile
/// where it did not look, and captures again: the checkpoint holds both
/// changes, not one of two writes made together (a ref and the object it
/// names, helper-84). A change made meanwhile where it did not look, with
/// nothing it read changed, is left whole to the next checkpoint.
#[test]
fn a_capture_that_read_a_file_changed_after_it_began_takes_what_changed_beside_it() {
    let Some((_lfs, ws)) = alone_on_xfs() else {
        return;
    };
    let (read, beside) = (ws.join("src/d4/f0.rs"), ws.join("src/d1/f3.rs"));
    let checkpoint_while = |label: &str, during: &dyn Fn()| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let child = common::spawn_stopped_at_with(
            &ws,
            &["--json", "checkpoint", label],
            "capture:stated",
            &[("REWIND_TRACE", "1")],
        );
        during();
        let out = common::resume_to_success(child);
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("note: bulk stat: the capture is scoped"))
            .count()
    };
    // Edited before; while the capture waits, only a file it will not
    // read changes: one bulk stat, and that change waits for the next.
    write(&read, b"edited before\n");
    let n = checkpoint_while("before", &|| write(&beside, b"edited meanwhile\n"));
    assert_eq!(n, 1, "the second bulk stat was not spared");
    let status = rewind_env(&ws, &["--json", "status"], &[("REWIND_BULKSTAT", "0")]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    let changed: Vec<&str> = status["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert_eq!(changed, ["src/d1/f3.rs"], "{status}");
    rewind_json(&ws, &["checkpoint", "caught up"]);
    // Edited before and again while the capture waits, beside another
    // edit: the file read is newer than the capture, so the second bulk
    // stat runs, sees the other, and the checkpoint holds both.
    write(&read, b"edited before, again\n");
    let n = checkpoint_while("meanwhile", &|| {
        write(&read, b"edited while the capture waited\n");
        write(&beside, b"edited beside it meanwhile\n");
    });
    assert!(n >= 2, "no second bulk stat: {n}");
    a_full_walk_finds_no_change(&ws, "after edits made while the capture waited");
}
