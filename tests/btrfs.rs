//! `rewind init --subvolume`: an ordinary directory on btrfs becomes a
//! subvolume in place, keeping everything, crash-safely; elsewhere it is
//! refused clearly.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::{Fs, LoopFs, rewind, rewind_env, rewind_json, snapshot, write};

/// A project with the things a conversion must keep: modes, symlinks,
/// hard links, xattrs, nested and empty directories, an existing history.
fn populate(ws: &Path) -> String {
    write(&ws.join("src/main.rs"), b"fn main() {}\n");
    write(&ws.join("src/deep/er/data.bin"), &vec![7u8; 300_000]);
    write(&ws.join("run.sh"), b"#!/bin/sh\n");
    common::chmod(&ws.join("run.sh"), 0o755);
    common::chmod(&ws.join("src/main.rs"), 0o600);
    std::os::unix::fs::symlink("src/main.rs", ws.join("main-link")).expect("symlink");
    std::os::unix::fs::symlink("/nowhere", ws.join("dangling")).expect("symlink");
    std::fs::hard_link(ws.join("run.sh"), ws.join("run-again.sh")).expect("hard link");
    std::fs::create_dir_all(ws.join("empty/dir")).expect("mkdir");
    common::chmod(&ws.join("empty"), 0o700);
    common::set_xattr(&ws.join("src/main.rs"), "user.origin", b"agent");
    common::set_xattr(&ws.join("src/deep"), "user.dir", b"yes");
    common::checkpoint_id(ws, &["before"])
}

fn inode(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).expect("stat").ino()
}

#[test]
fn a_populated_directory_becomes_a_subvolume_keeping_everything_and_its_history() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    let ws = lfs.subdir("proj");
    let before_id = populate(&ws);
    let before = snapshot(&ws);
    assert_ne!(inode(&ws), 256, "already a subvolume");
    let out = rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    assert_eq!(out["subvolume"]["already"], false, "{out}");
    assert_eq!(out["subvolume"]["hard_links"], 1, "{out}");
    assert_eq!(inode(&ws), 256, "not a subvolume root");
    assert_ne!(
        inode(&ws.join(".rewind")),
        256,
        ".rewind must stay in the subvolume (D45)"
    );
    common::assert_same("after init --subvolume", &before, &snapshot(&ws));
    assert_eq!(
        inode(&ws.join("run.sh")),
        inode(&ws.join("run-again.sh")),
        "hard link split"
    );
    assert!(
        !lfs.mnt.join(".proj.rewind-subvol").exists(),
        "temporary left behind"
    );
    // The history came along and still works.
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    write(&ws.join("src/main.rs"), b"broken\n");
    rewind_json(&ws, &["rewind", &before_id]);
    common::assert_same("rewind after conversion", &before, &snapshot(&ws));
    let doctor = rewind_json(&ws, &["doctor"]);
    assert_eq!(doctor["subvolume"], true, "{doctor}");
    // Twice is fine.
    let again = rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    assert_eq!(again["subvolume"]["already"], true, "{again}");
}

#[test]
fn a_sigkill_at_each_conversion_point_leaves_the_old_directory_or_the_new_subvolume() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    for (i, point) in [
        "subvol:created",
        "subvol:file-cloned:1",
        "subvol:file-cloned:4",
        "subvol:copied",
        "subvol:swapped",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("proj{i}");
        let ws = lfs.subdir(&name);
        populate(&ws);
        let before = snapshot(&ws);
        let out = rewind_env(
            &lfs.mnt,
            &["init", "--subvolume", &name],
            &[("REWIND_FAILPOINT", point)],
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "{point}: not killed there: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Right after the kill: complete, old or new.
        common::assert_same(
            &format!("{point}: right after the kill"),
            &before,
            &snapshot(&ws),
        );
        let swapped = inode(&ws) == 256;
        assert_eq!(
            swapped,
            *point == "subvol:swapped",
            "{point}: swapped = {swapped}"
        );
        // The next run cleans up and finishes.
        let done = rewind_json(&lfs.mnt, &["init", "--subvolume", &name]);
        assert!(
            done["subvolume"]["cleaned_up"].is_string(),
            "{point}: {done}"
        );
        assert_eq!(inode(&ws), 256, "{point}");
        common::assert_same(
            &format!("{point}: after the rerun"),
            &before,
            &snapshot(&ws),
        );
        assert!(
            !lfs.mnt.join(format!(".{name}.rewind-subvol")).exists(),
            "{point}: leftovers"
        );
        let v = rewind_json(&ws, &["verify", "--deep"]);
        assert_eq!(v["ok"], true, "{point}: {v}");
    }
}

#[test]
fn a_process_inside_the_directory_is_named_and_nothing_changes() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("busy");
    populate(&ws);
    let before = snapshot(&ws);
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(ws.join("src"))
        .spawn()
        .expect("spawn sleep");
    let out = rewind(&lfs.mnt, &["init", "--subvolume", "busy"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&sleeper.id().to_string()) && err.contains("sleep"),
        "{err}"
    );
    assert_ne!(inode(&ws), 256);
    common::assert_same("refused", &before, &snapshot(&ws));
}

#[test]
fn a_fifo_is_refused_before_the_swap_and_the_partial_copy_removed() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("fifo");
    populate(&ws);
    let st = Command::new("mkfifo")
        .arg(ws.join("src/pipe"))
        .status()
        .expect("mkfifo");
    assert!(st.success());
    let out = rewind(&lfs.mnt, &["init", "--subvolume", "fifo"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("pipe") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_ne!(inode(&ws), 256);
    assert!(
        !lfs.mnt.join(".fifo.rewind-subvol").exists(),
        "partial copy left behind"
    );
}

#[test]
fn off_btrfs_the_conversion_is_refused_clearly() {
    for fs in [Fs::Xfs, Fs::Ext4] {
        let Some(lfs) = LoopFs::new(fs, 512) else {
            return;
        };
        let ws = lfs.subdir("proj");
        write(&ws.join("a.txt"), b"a");
        let out = rewind(&lfs.mnt, &["init", "--subvolume", "proj"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", fs.name());
        assert!(err.contains("not on btrfs"), "{}: {err}", fs.name());
        assert!(
            !ws.join(".rewind").exists(),
            "{}: a refused init created a workspace",
            fs.name()
        );
    }
}

/// The snapshot ioctls the btrfs engine builds on: a read-only snapshot
/// has the same tree, refuses writes, and can be deleted.
#[test]
fn a_read_only_snapshot_holds_the_tree_and_refuses_writes() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("proj");
    populate(&ws);
    rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    let src = rewind_platform::Dir::open(&ws).expect("open");
    let parent = rewind_platform::Dir::open(&lfs.mnt).expect("open");
    rewind_platform::snapshot(&src, &parent, std::ffi::OsStr::new("snap"), true).expect("snapshot");
    let snap = lfs.mnt.join("snap");
    assert_eq!(inode(&snap), 256);
    let mut want = snapshot(&ws);
    let mut got = snapshot(&snap);
    // .rewind/ is excluded by the snapshot helper on both sides alike.
    want.retain(|k, _| !k.starts_with(b".rewind"));
    got.retain(|k, _| !k.starts_with(b".rewind"));
    common::assert_same("snapshot", &want, &got);
    let err =
        std::fs::write(snap.join("new.txt"), b"x").expect_err("a read-only snapshot took a write");
    assert_eq!(err.raw_os_error(), Some(30), "{err}"); // EROFS
    rewind_platform::delete_subvolume(&parent, std::ffi::OsStr::new("snap")).expect("delete");
    assert!(!snap.exists());
}
