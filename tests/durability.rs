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
        // Only the btrfs engine's safety snapshot makes the tree before the
        // rewind durable, which per-entry fsyncs rely on.
        let (expected, how) = if name == "sub" {
            ("fsync (applied entries)", "fsync each entry")
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
        traced(&ws, &["rewind", &a]);
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

        // An acknowledged checkpoint is there after the cut, and restores.
        write(&ws.join("src/d1/f3.rs"), b"checkpointed\n");
        let c = checkpoint_id(&ws, &["C"]);
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
