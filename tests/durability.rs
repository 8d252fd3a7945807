//! Durability under a power cut (DESIGN §4 rule 6): what a rewind or a
//! checkpoint acknowledged is on disk when it returns. The SIGKILL tests
//! (tests/crash.rs) cannot see this: the page cache survives a killed
//! process. Here the filesystem image is copied right after the command
//! returns and the copy is mounted, as a machine would find its disk after
//! losing power (see `LoopFs::power_cut_copy`).

mod common;

use std::path::Path;

use common::*;

fn traced(ws: &Path, args: &[&str]) -> String {
    let out = rewind_env(ws, args, &[("REWIND_TRACE", "1")]);
    assert!(
        out.status.success(),
        "rewind {args:?} in {}: {}",
        ws.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Cut the power now: the copy's workspace `name` opens cleanly at
/// `head` and holds exactly `want`.
fn survives_a_cut(
    fs: &LoopFs,
    name: &str,
    label: &str,
    head: &str,
    want: &std::collections::BTreeMap<Vec<u8>, Snap>,
) {
    let copy = fs.power_cut_copy();
    assert_survived(label, &copy, name, head, want);
}

/// After the cut, the copy's workspace opens cleanly at `head` and holds
/// exactly `want`.
fn assert_survived(
    label: &str,
    copy: &LoopFs,
    name: &str,
    head: &str,
    want: &std::collections::BTreeMap<Vec<u8>, Snap>,
) {
    let ws = copy.mnt.join(name);
    let status = rewind_json(&ws, &["status"]);
    assert_eq!(
        status["head"], head,
        "{label}: HEAD after the cut: {status}"
    );
    assert_eq!(
        status["changes"].as_array().map(Vec::len),
        Some(0),
        "{label}: the tree after the cut is not HEAD's: {status}"
    );
    assert_same(label, want, &snapshot(&ws));
}

#[test]
fn an_acknowledged_rewind_or_checkpoint_survives_a_power_cut_on_btrfs() {
    let Some(fs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    // No periodic transaction commit between a command and the cut: what
    // the copy holds is what the command itself made durable.
    fs.remount("commit=300");
    // The btrfs engine (a subvolume) and the walk engine with reflinks (a
    // plain directory) share the rewind's durability step.
    fs.subvolume("sub");
    fs.subdir("plain");
    for name in ["sub", "plain"] {
        let ws = fs.mnt.join(name);
        populate_src_tree(&ws);
        assert!(rewind(&ws, &["init"]).status.success());
        let a = checkpoint_id(&ws, &["A"]);
        assert!(rewind(&ws, &["finish-manifests"]).status.success());
        let want_a = snapshot(&ws);

        // A few changed entries: each is fsynced (btrfs), the parent of
        // the removed file too.
        write(&ws.join("src/d0/f1.rs"), b"edited\n");
        write(&ws.join("src/d3/f4.rs"), b"edited\n");
        write(&ws.join("src/d4/new.rs"), b"new\n");
        std::fs::remove_file(ws.join("src/d2/f5.rs")).expect("remove");
        // The edits are on disk: the cut can only lose what the rewind wrote.
        fs.sync();
        let trace = traced(&ws, &["rewind", &a]);
        // The btrfs engine's safety snapshot makes the tree before the
        // rewind durable, which per-entry fsyncs rely on. The walk engine
        // has no mark yet to say what may not be durable (D85).
        let (expected, how) = if name == "sub" {
            ("fsync (changed entries)", "fsync each entry")
        } else {
            ("syncfs (workspace)", "syncfs")
        };
        assert!(
            trace.contains(expected),
            "{name}: a 4-entry rewind should {how}:\n{trace}"
        );
        survives_a_cut(
            &fs,
            name,
            &format!("{name}: rewind of 4 entries, then a power cut"),
            &a,
            &want_a,
        );

        // An edit the agent made without an fsync that already equals the
        // target: the apply does not touch it, yet it must survive too.
        let f = ws.join("src/d3/f3.rs");
        let original = std::fs::read(&f).expect("read");
        write(&f, b"durable but not the target\n");
        fs.sync();
        write(&f, &original);
        write(&ws.join("src/d1/f2.rs"), b"edited\n");
        let trace = traced(&ws, &["rewind", &a]);
        // The walk engine now has a mark, and the edit is in its set of
        // unsynced entries (D85).
        assert!(
            trace.contains("fsync (changed entries)"),
            "{name}: a 1-entry rewind should fsync each entry:\n{trace}"
        );
        survives_a_cut(
            &fs,
            name,
            &format!(
                "{name}: rewind next to an unsynced edit that equals the target, then a power cut"
            ),
            &a,
            &want_a,
        );

        // A rewind killed after its second file, finished by the next
        // command: the files the killed process wrote are no longer in the
        // plan that finishes it, yet they must be durable too.
        for f in 0..4 {
            write(&ws.join(format!("src/d2/f{f}.rs")), b"killed\n");
        }
        fs.sync();
        let killed = rewind_env(
            &ws,
            &["rewind", &a],
            &[("REWIND_FAILPOINT", "apply:file-written:2")],
        );
        assert!(
            !killed.status.success(),
            "{name}: the failpoint did not kill the rewind"
        );
        let finished = traced(&ws, &["status"]);
        assert!(
            finished.contains("finished an interrupted rewind"),
            "{name}: status should finish the interrupted rewind:\n{finished}"
        );
        survives_a_cut(
            &fs,
            name,
            &format!("{name}: rewind killed, finished by the next command, then a power cut"),
            &a,
            &want_a,
        );

        // Many changed entries and a symlink: one syncfs.
        for d in 0..5 {
            for f in 0..8 {
                write(&ws.join(format!("src/d{d}/f{f}.rs")), b"many\n");
            }
        }
        std::fs::remove_file(ws.join("link")).expect("remove link");
        std::os::unix::fs::symlink("src/d1/f1.rs", ws.join("link")).expect("symlink");
        fs.sync();
        let trace = traced(&ws, &["rewind", &a]);
        assert!(
            trace.contains("syncfs (workspace)"),
            "{name}: a 41-entry rewind should syncfs:\n{trace}"
        );
        survives_a_cut(
            &fs,
            name,
            &format!("{name}: rewind of 41 entries, then a power cut"),
            &a,
            &want_a,
        );

        // A deleted directory of 300 small files (a `node_modules` in
        // little): past 64 entries their writeback starts on a thread of
        // its own (D321), and one syncfs covers them.
        for f in 0..300 {
            write(
                &ws.join(format!("deps/p{}/f{f}.js", f % 7)),
                format!("module.exports = {f};\n").as_bytes(),
            );
        }
        let b = checkpoint_id(&ws, &["B"]);
        let want_b = snapshot(&ws);
        std::fs::remove_dir_all(ws.join("deps")).expect("remove deps");
        fs.sync();
        let trace = traced(&ws, &["rewind", &b]);
        assert!(
            trace.contains("syncfs (workspace)"),
            "{name}: a 307-entry rewind should syncfs:\n{trace}"
        );
        survives_a_cut(
            &fs,
            name,
            &format!("{name}: a deleted 300-file directory restored, then a power cut"),
            &b,
            &want_b,
        );
        std::fs::remove_dir_all(ws.join("deps")).expect("remove deps");
        assert!(rewind(&ws, &["checkpoint", "no deps"]).status.success());

        // An acknowledged checkpoint is there after the cut, and restores.
        write(&ws.join("src/d1/f3.rs"), b"checkpointed\n");
        // 400 KB: the walk engine stores it as an object file, and fsyncs
        // that file rather than the filesystem (D87); btrfs's log tree
        // persists only what is fsynced, so a missing fsync loses it.
        let big: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
        write(&ws.join("src/big.bin"), &big);
        let trace = traced(&ws, &["checkpoint", "C"]);
        if name == "plain" {
            assert!(
                trace.contains("fsync (objects)") && !trace.contains("syncfs (store)"),
                "{name}: a checkpoint storing one object should fsync it:\n{trace}"
            );
        }
        let c = head_after(&ws, "C");
        let want_c = snapshot(&ws);
        let copy = fs.power_cut_copy();
        let copied = copy.mnt.join(name);
        assert!(rewind(&copied, &["rewind", &a]).status.success());
        assert!(rewind(&copied, &["rewind", &c]).status.success());
        assert_survived(
            &format!("{name}: checkpoint, then a power cut, then rewinds"),
            &copy,
            name,
            &c,
            &want_c,
        );
    }
}

/// A btrfs checkpoint's ledger row is committed without waiting for the
/// disk: the snapshot just made holds a copy of it (D324). Two such rows,
/// whose manifests nothing has built yet, are lost to a power cut; the
/// copy's first command adopts both from their snapshots, in order, and
/// both restore exactly.
#[test]
fn checkpoints_whose_rows_a_power_cut_lost_come_back_from_their_snapshots() {
    let Some(fs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    fs.remount("commit=300");
    fs.subvolume("ws");
    let ws = fs.mnt.join("ws");
    populate_src_tree(&ws);
    let a = checkpoint_id(&ws, &["A"]);
    assert!(rewind(&ws, &["finish-manifests"]).status.success());
    fs.sync();
    // No manifest builder: its synced commit would make the rows durable.
    let deferred = ("REWIND_MANIFEST", "deferred");
    let mut acked = Vec::new();
    for label in ["B", "C"] {
        write(&ws.join(format!("src/d1/{label}.rs")), label.as_bytes());
        // Its id from its own answer: another command would build the
        // manifests.
        let out = rewind_env(
            &ws,
            &["--json", "checkpoint", label],
            &[deferred, ("REWIND_TRACE", "1")],
        );
        assert!(out.status.success(), "{out:?}");
        let trace = String::from_utf8_lossy(&out.stderr);
        assert!(
            trace.contains("commit pending checkpoint"),
            "{label}: not a btrfs acknowledgement:\n{trace}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let id = v["id"].as_str().expect("id").to_string();
        acked.push((id, snapshot(&ws)));
    }
    let copy = fs.power_cut_copy();
    let copied = copy.mnt.join("ws");
    // Read-only, nothing can be adopted: said, not left out silently
    // (helper-75).
    copy.remount("ro");
    let out = rewind(&copied, &["--json", "list"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("may be missing from the ledger"),
        "{out:?}"
    );
    copy.remount("rw");
    let out = rewind(&copied, &["--json", "list"]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (id, _) in &acked {
        assert!(
            stderr.contains(&format!("checkpoint {id}")) && stderr.contains("is back"),
            "{id}: its row was not lost, or not adopted: {stderr}"
        );
    }
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let labels: Vec<&str> = list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["label"].as_str())
        .collect();
    assert_eq!(labels, ["A", "B", "C"], "{list}");
    assert_survived(
        "two lost rows adopted",
        &copy,
        "ws",
        &acked[1].0,
        &acked[1].1,
    );
    let v = rewind_json(&copied, &["verify"]);
    assert_eq!(v["ok"], true, "{v}");
    assert!(rewind(&copied, &["rewind", &acked[0].0]).status.success());
    assert_same("B after the cut", &acked[0].1, &snapshot(&copied));
    assert!(rewind(&copied, &["rewind", &a]).status.success());
}

/// Change a file in place, without truncating it: XFS writes a file
/// back as soon as it is closed after a truncation (so that a crash does
/// not leave it empty), which would make the edit durable by itself.
fn write_in_place(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for writing");
    f.write_all_at(bytes, offset).expect("write in place");
}

/// How much another program writes, pending, beside the workspace.
const PENDING: usize = 64 << 20;

/// Another program's writes, pending on `fs` (in `other/NAME`).
fn pending_writes(fs: &LoopFs, name: &str) {
    write(&fs.subdir("other").join(name), &vec![b'x'; PENDING]);
}

/// Cut the power now; the copy has lost the pending `other/big`, or no
/// cut was simulated.
fn power_cut_losing_pending(fs: &LoopFs) -> LoopFs {
    let copy = fs.power_cut_copy();
    let pending = std::fs::metadata(copy.mnt.join("other/big")).map_or(0, |m| m.len());
    assert!(
        pending < PENDING as u64,
        "the copy holds the other program's unsynced writes: no power cut was simulated"
    );
    copy
}

/// `ws` (with whatever the caller put there) plus the source tree,
/// checkpointed as A, and the durability marks set by a first rewind:
/// with no mark to go by it calls `syncfs`, which sets them (D85, D90).
/// A's id and tree.
fn checkpointed_and_marked(ws: &Path) -> (String, std::collections::BTreeMap<Vec<u8>, Snap>) {
    populate_src_tree(ws);
    assert!(rewind(ws, &["init"]).status.success());
    let a = checkpoint_id(ws, &["A"]);
    let want_a = snapshot(ws);
    let doctor = rewind_json(ws, &["doctor"]);
    assert_eq!(doctor["durability"]["mark"], false, "{doctor}");
    write(&ws.join("src/d0/f0.rs"), b"edited\n");
    let trace = traced(ws, &["rewind", &a]);
    assert!(
        trace.contains("syncfs (workspace)"),
        "without a mark the rewind should syncfs:\n{trace}"
    );
    let doctor = rewind_json(ws, &["doctor"]);
    assert_eq!(doctor["durability"]["mark"], true, "{doctor}");
    assert_eq!(doctor["durability"]["store_mark"], true, "{doctor}");
    assert!(doctor["durability"]["unsynced"].is_u64(), "{doctor}");
    (a, want_a)
}

/// HEAD's id, after the checkpoint `label`.
fn head_after(ws: &Path, label: &str) -> String {
    rewind_json(ws, &["status"])["head"]
        .as_str()
        .unwrap_or_else(|| panic!("HEAD after checkpoint {label}"))
        .to_string()
}

/// The walk engine on XFS, with another program's writes pending on the
/// same filesystem: the rewind fsyncs what it wrote and what may not be
/// durable (D85) instead of waiting for a `syncfs` to write all of it back,
/// and what it acknowledged survives a power cut. XFS writes its log
/// lazily (every 30 s), and ext4 is mounted with `commit=300`, so the
/// copy holds what was fsynced or synced.
#[test]
fn a_rewind_behind_another_programs_writes_fsyncs_what_it_must_and_survives_a_power_cut_on_xfs() {
    let Some(fs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    behind_pending_writes(&fs);
}

/// The same on ext4, where every capture walks (no bulk stat).
#[test]
fn a_rewind_behind_another_programs_writes_fsyncs_what_it_must_and_survives_a_power_cut_on_ext4() {
    let Some(fs) = LoopFs::new(Fs::Ext4, 512) else {
        return;
    };
    fs.remount("commit=300");
    behind_pending_writes(&fs);
}

fn behind_pending_writes(fs: &LoopFs) {
    let ws = fs.subdir("ws");
    let (a, want_a) = checkpointed_and_marked(&ws);
    pending_writes(fs, "big");

    // An edit checkpointed without an fsync: the rewind's capture (an XFS
    // bulk stat) does not look at it again; the set committed with the
    // checkpoint names it.
    write_in_place(&ws.join("src/d4/f4.rs"), 0, b"checkpointed, not synced\n");
    let b = checkpoint_id(&ws, &["B"]);
    let want_b = snapshot(&ws);
    write(&ws.join("src/d1/f2.rs"), b"edited\n");
    write(&ws.join("src/d2/new.rs"), b"new\n");
    std::fs::remove_file(ws.join("src/d0/f5.rs")).expect("remove");
    let trace = traced(&ws, &["rewind", &b]);
    assert!(
        trace.contains("fsync (changed entries)") && !trace.contains("syncfs (workspace)"),
        "with 64 MiB pending elsewhere the rewind should fsync each entry:\n{trace}"
    );
    let copy = power_cut_losing_pending(fs);
    assert_survived(
        &format!(
            "{}: rewind behind pending writes, then a power cut",
            fs.fs.name()
        ),
        &copy,
        "ws",
        &b,
        &want_b,
    );
    drop(copy);

    // An edit the agent made without an fsync that equals the target: the
    // apply leaves it alone, the rewind's capture saw it change.
    let f = ws.join("src/d3/f3.rs");
    let original = std::fs::read(&f).expect("read");
    write_in_place(&f, 0, b"#");
    fs.sync();
    write_in_place(&f, 0, &original[..1]);
    write(&ws.join("src/d1/f3.rs"), b"edited\n");
    pending_writes(fs, "big2");
    let trace = traced(&ws, &["rewind", &a]);
    assert!(
        trace.contains("fsync (changed entries)") && !trace.contains("syncfs (workspace)"),
        "the second rewind behind pending writes should fsync each entry:\n{trace}"
    );
    survives_a_cut(
        fs,
        "ws",
        &format!(
            "{}: rewind next to an unsynced edit that equals the target, then a power cut",
            fs.fs.name()
        ),
        &a,
        &want_a,
    );
}

/// On ext4 a file of 4 MiB or more is stored as 1 MiB chunk files (no
/// clones, D83). Behind another program's pending writes, a checkpoint
/// of an in-place edit fsyncs the one chunk file it wrote instead of
/// calling `syncfs` (D90); a chunk file found stored, left by a
/// checkpoint killed before its sync, is fsynced too (its ctime is past
/// the store mark); and both checkpoints survive a power cut.
#[test]
fn a_big_file_edited_in_place_is_checkpointed_with_fsyncs_of_its_chunks_and_survives_a_power_cut_on_ext4()
 {
    let Some(fs) = LoopFs::new(Fs::Ext4, 512) else {
        return;
    };
    fs.remount("commit=300");
    let ws = fs.subdir("ws");
    // 8 MiB of distinct words: 8 distinct chunks.
    let big: Vec<u8> = (0..(2u32 << 20)).flat_map(|i| i.to_le_bytes()).collect();
    write(&ws.join("data.bin"), &big);
    let (a, want_a) = checkpointed_and_marked(&ws);
    pending_writes(&fs, "big");
    write_in_place(&ws.join("data.bin"), 5 << 20, b"edited in place");
    let trace = traced(&ws, &["checkpoint", "B"]);
    assert!(
        trace.contains("fsync (objects)") && !trace.contains("syncfs (store)"),
        "one new chunk behind pending writes should be fsynced:\n{trace}"
    );
    let b = head_after(&ws, "B");
    let want_b = snapshot(&ws);
    let copy = power_cut_losing_pending(&fs);
    for (id, want, label) in [(&a, &want_a, "A"), (&b, &want_b, "B")] {
        rewind_after_the_cut(&copy, id, want, label);
    }
    drop(copy);

    // Killed after storing the edit's chunk, before syncing it.
    write_in_place(&ws.join("data.bin"), 6 << 20, b"stored, never synced");
    let killed = rewind_env(
        &ws,
        &["checkpoint", "killed"],
        &[("REWIND_FAILPOINT", "checkpoint:before-sync")],
    );
    assert!(!killed.status.success(), "the failpoint did not kill");
    let trace = traced(&ws, &["checkpoint", "C"]);
    assert!(
        trace.contains("fsync (objects)") && !trace.contains("syncfs (store)"),
        "the chunk found stored should be fsynced:\n{trace}"
    );
    let c = head_after(&ws, "C");
    let want_c = snapshot(&ws);

    let copy = fs.power_cut_copy();
    for (id, want, label) in [(&a, &want_a, "A"), (&c, &want_c, "C")] {
        rewind_after_the_cut(&copy, id, want, label);
    }
}

/// In the power-cut copy, a rewind to `id` succeeds and leaves `want`.
fn rewind_after_the_cut(
    copy: &LoopFs,
    id: &str,
    want: &std::collections::BTreeMap<Vec<u8>, Snap>,
    label: &str,
) {
    let out = rewind(&copy.mnt.join("ws"), &["rewind", id]);
    assert!(
        out.status.success(),
        "rewind to {label} after the cut: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_survived(
        &format!("ext4: chunked checkpoint {label}, a power cut, then a rewind to it"),
        copy,
        "ws",
        id,
        want,
    );
}

/// A run of rewinds behind another program's pending writes, each after
/// the agent's edits, on the walk engine: every one fsyncs its entries,
/// none falls back to `syncfs`. Each rewind records what it fsynced with
/// the ctime it had (D92); without that, the next capture counted the
/// rewind's own writes as unsynced, the set passed its 64 entries at the
/// second rewind, and a `syncfs` waited for all of the other program's
/// writes. The result survives a power cut.
#[test]
fn a_run_of_rewinds_behind_pending_writes_never_falls_back_to_syncfs_on_xfs() {
    let Some(fs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    run_of_rewinds(&fs);
}

/// The same on ext4 (`commit=300`), where every capture walks the whole
/// tree and reports every entry changed since the mark.
#[test]
fn a_run_of_rewinds_behind_pending_writes_never_falls_back_to_syncfs_on_ext4() {
    let Some(fs) = LoopFs::new(Fs::Ext4, 512) else {
        return;
    };
    fs.remount("commit=300");
    run_of_rewinds(&fs);
}

fn run_of_rewinds(fs: &LoopFs) {
    let ws = fs.subdir("ws");
    let (a, want_a) = checkpointed_and_marked(&ws);
    pending_writes(fs, "big");
    for round in 0..8 {
        // 20 files edited and 6 new: with the rewind before's own writes
        // counted again, past the set's 64 entries.
        for i in 0..24 {
            let (d, f) = ((round + i) % 5, (3 * round + i) % 20);
            write_in_place(&ws.join(format!("src/d{d}/f{f}.rs")), 0, b"//");
        }
        for i in 0..6 {
            write(
                &ws.join(format!("src/d{}/new{round}-{i}.rs", i % 5)),
                b"new\n",
            );
        }
        let trace = traced(&ws, &["rewind", &a]);
        assert!(
            trace.contains("fsync (changed entries)") && !trace.contains("syncfs (workspace)"),
            "rewind {round} behind pending writes fell back to syncfs:\n{trace}"
        );
    }
    assert_survived(
        &format!(
            "{}: eight rewinds behind pending writes, then a power cut",
            fs.fs.name()
        ),
        &power_cut_losing_pending(fs),
        "ws",
        &a,
        &want_a,
    );
}

/// A database a program commits to while checkpoints are taken, as a dev
/// server's SQLite in the workspace: every checkpoint opens intact after a
/// rewind to it (what a power cut would leave), or says which files it may
/// hold from different moments. On ext4 (copies) 6 of 40 such checkpoints
/// were silently malformed before the capture checked that nothing it read
/// had moved (helper-84).
#[test]
fn a_database_written_during_checkpoints_is_whole_after_a_rewind_or_named_as_unsettled() {
    for fs in [Fs::Ext4, Fs::Xfs] {
        let Some(lfs) = LoopFs::new(fs, 1024) else {
            return;
        };
        let ws = lfs.mnt.join("ws");
        std::fs::create_dir(&ws).expect("mkdir ws");
        std::fs::write(ws.join("main.py"), "print(1)\n").expect("write");
        rewind_json(&ws, &["init"]);
        let db = ws.join("app.db");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (db, stop) = (db.clone(), stop.clone());
            std::thread::spawn(move || commit_until(&db, &stop))
        };
        std::thread::sleep(std::time::Duration::from_secs(2));
        let mut taken = Vec::new();
        for i in 0..30 {
            std::thread::sleep(std::time::Duration::from_millis(40));
            let r = rewind_json(&ws, &["checkpoint", "-m", &format!("c{i}")]);
            let warned = r["warnings"].as_array().is_some_and(|w| {
                w.iter()
                    .any(|w| w.as_str().is_some_and(|w| w.contains("app.db")))
            });
            taken.push((r["id"].as_str().expect("id").to_string(), warned));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let commits = writer.join().expect("writer");
        assert!(
            commits > 50,
            "{}: the writer committed {commits} times",
            fs.name()
        );
        // What the reads it discarded stored is gone, and nothing the
        // checkpoints name went with it (helper-86: chunk lists of
        // discarded reads committed, their chunks removed, `DAMAGED`).
        let deep = rewind(&ws, &["verify", "--deep"]);
        assert!(
            deep.status.success(),
            "{}: verify --deep after checkpoints under a writer: {}{}",
            fs.name(),
            String::from_utf8_lossy(&deep.stdout),
            String::from_utf8_lossy(&deep.stderr)
        );
        let mut silent = Vec::new();
        let mut whole = 0;
        for (id, warned) in &taken {
            rewind_json(&ws, &["rewind", id]);
            match database_problem(&db) {
                None => whole += 1,
                Some(p) if !warned => silent.push(format!("{id}: {p}")),
                Some(_) => {}
            }
        }
        assert!(
            silent.is_empty(),
            "{}: checkpoints taken while the database was written are not what any moment held, and said nothing:\n{}",
            fs.name(),
            silent.join("\n")
        );
        assert!(
            whole >= taken.len() / 2,
            "{}: only {whole} of {} checkpoints hold a whole database",
            fs.name(),
            taken.len()
        );
    }
}

/// Fill the WAL database at `db`, then commit every ~40 ms until `stop`: rows
/// inserted and deleted, with a counter kept in the same transaction.
/// Checkpoints of the WAL into the database every 20 pages. The number of
/// commits.
fn commit_until(db: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let c = rusqlite::Connection::open(db).expect("open app.db");
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=20; PRAGMA synchronous=NORMAL;
         CREATE TABLE items(id INTEGER PRIMARY KEY, data BLOB);
         CREATE TABLE meta(k TEXT PRIMARY KEY, v INT); INSERT INTO meta VALUES('count', 0);",
    )
    .expect("schema");
    // 16 MiB to start with: a copy of it takes long enough for commits
    // and WAL checkpoints to land in the middle of a capture.
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4096)
         INSERT INTO items(data) SELECT randomblob(4096) FROM n",
        [],
    )
    .expect("fill");
    c.execute("UPDATE meta SET v = 4096", []).expect("count");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut commits = 0;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let tx = c.unchecked_transaction().expect("begin");
        let mut n: i64 = 0;
        for _ in 0..1 + next() % 4 {
            let blob: Vec<u8> = (0..1024 + next() % 7168).map(|_| next() as u8).collect();
            tx.execute("INSERT INTO items(data) VALUES (?1)", [blob])
                .expect("insert");
            n += 1;
        }
        if next() % 3 == 0 {
            n -= tx
                .execute(
                    "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY random() LIMIT 3)",
                    [],
                )
                .expect("delete") as i64;
        }
        tx.execute("UPDATE meta SET v = v + ?1 WHERE k = 'count'", [n])
            .expect("count");
        tx.commit().expect("commit");
        commits += 1;
        std::thread::sleep(std::time::Duration::from_millis(25 + next() % 25));
    }
    commits
}

/// What is wrong with the database at `db`, if anything: SQLite's own
/// check, and the counter against the rows.
fn database_problem(db: &Path) -> Option<String> {
    let c = match rusqlite::Connection::open(db) {
        Ok(c) => c,
        Err(e) => return Some(format!("open: {e}")),
    };
    let check: String = match c.query_row("PRAGMA integrity_check", [], |r| r.get(0)) {
        Ok(v) => v,
        Err(e) => return Some(format!("integrity_check: {e}")),
    };
    if check != "ok" {
        return Some(check);
    }
    let counted = c.query_row(
        "SELECT (SELECT v FROM meta WHERE k = 'count'), (SELECT count(*) FROM items)",
        [],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
    );
    match counted {
        Ok((a, b)) if a == b => None,
        Ok((a, b)) => Some(format!("counter {a}, rows {b}")),
        Err(e) => Some(format!("count: {e}")),
    }
}
