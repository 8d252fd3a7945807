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
    // D126: the history made before moved into the nested subvolume that
    // snapshots skip; left in `.rewind/`, every snapshot copied it.
    assert_eq!(out["subvolume"]["history_moved"], true, "{out}");
    assert_eq!(inode(&ws.join(".rewind/state")), 256, "{out}");
    assert!(ws.join(".rewind/state/ledger.db").is_file());
    assert!(!ws.join(".rewind/ledger.db").exists());
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
    let snap = rewind_env(
        &ws,
        &["--json", "checkpoint"],
        &[("REWIND_MANIFEST", "inline")],
    );
    let snap: serde_json::Value = serde_json::from_slice(&snap.stdout).expect("json");
    let id = snap["id"].as_str().expect("id");
    let copy = ws.join(".rewind/state/snapshots").join(id);
    assert!(copy.join("src").is_dir(), "{snap}");
    assert!(
        !copy.join(".rewind/ledger.db").exists(),
        "a snapshot holds a copy of the ledger"
    );
    // Twice is fine.
    let again = rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    assert_eq!(again["subvolume"]["already"], true, "{again}");
}

/// `init --subvolume NAME` under `lfs.mnt`, SIGKILLed at `point`.
fn convert_killed_at(lfs: &LoopFs, name: &str, point: &str) {
    let out = rewind_env(
        &lfs.mnt,
        &["init", "--subvolume", name],
        &[("REWIND_FAILPOINT", point)],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "{point}: not killed there: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// D352: a conversion stopped after its swap leaves the old tree under
/// its temporary name beside the workspace, which only a rerun removes:
/// every checkpoint and `doctor` say so, and the rerun's fix, until it
/// is gone.
#[test]
fn a_conversion_stopped_after_its_swap_is_named_until_the_rerun_removes_what_it_left() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("proj");
    populate(&ws);
    convert_killed_at(&lfs, "proj", "subvol:swapped");
    let left = lfs.mnt.join(".proj.rewind-subvol");
    assert!(
        left.exists(),
        "the old tree is left under its temporary name"
    );
    let said = |v: &serde_json::Value| {
        v["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str())
            .any(|w| w.contains(".proj.rewind-subvol") && w.contains("init --subvolume"))
    };
    let v = rewind_json(&ws, &["checkpoint", "after-the-kill"]);
    assert!(said(&v), "{v}");
    let d = rewind_json(&ws, &["doctor"]);
    assert!(
        d["interrupted_conversion"]
            .as_str()
            .is_some_and(|w| w.contains(".proj.rewind-subvol")),
        "{d}"
    );
    rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    assert!(!left.exists(), "the rerun removes it");
    write(&ws.join("after.txt"), b"after");
    let v = rewind_json(&ws, &["checkpoint", "after-the-rerun"]);
    assert!(!said(&v), "{v}");
    let d = rewind_json(&ws, &["doctor"]);
    assert!(d["interrupted_conversion"].is_null(), "{d}");
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
        "subvol:ledger-moved",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("proj{i}");
        let ws = lfs.subdir(&name);
        populate(&ws);
        let before = snapshot(&ws);
        convert_killed_at(&lfs, &name, point);
        // Right after the kill: complete, old or new.
        common::assert_same(
            &format!("{point}: right after the kill"),
            &before,
            &snapshot(&ws),
        );
        let swapped = inode(&ws) == 256;
        let after_swap = *point == "subvol:swapped" || *point == "subvol:ledger-moved";
        assert_eq!(swapped, after_swap, "{point}: swapped = {swapped}");
        // The next run cleans up and finishes (after the ledger moved,
        // only the stale copy in `.rewind/` is left to remove).
        let done = rewind_json(&lfs.mnt, &["init", "--subvolume", &name]);
        assert!(
            done["subvolume"]["cleaned_up"].is_string()
                || (*point == "subvol:ledger-moved" && done["subvolume"]["history_moved"] == true),
            "{point}: {done}"
        );
        assert!(ws.join(".rewind/state/ledger.db").is_file(), "{point}");
        assert!(!ws.join(".rewind/ledger.db").exists(), "{point}");
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
    let out = rewind(&lfs.mnt, &["--json", "init", "--subvolume", "busy"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let err = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&sleeper.id().to_string()) && err.contains("sleep"),
        "{err}"
    );
    // BUSY, as for a busy unmount, not INVALID_PATH (helper-42, D262).
    assert!(err.contains("\"code\":\"BUSY\""), "{err}");
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

/// D269: the conversion's survey and copy recurse a level per directory;
/// on the main thread's stack a tree ~5,800 levels deep aborted it (exit
/// 134, helper-46), leaving the half-made copy for the next try, which
/// aborted again. It now runs on a thread with room for the depth it
/// carries, and the tree comes across whole.
#[test]
fn a_tree_thousands_of_levels_deep_converts_without_a_stack_overflow() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("deep");
    write(&ws.join("top.txt"), b"top");
    common::nest(&ws, 6000, b"bottom");
    let out = rewind(&lfs.mnt, &["init", "--subvolume", "deep"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(inode(&ws), 256, "a subvolume now");
    assert_eq!(
        common::depth_and_leaf(&ws),
        (6000, Some(b"bottom".to_vec()))
    );
    assert!(!lfs.mnt.join(".deep.rewind-subvol").exists());
}

/// A tree deeper than a conversion carries is refused before anything is
/// made, naming the directory that holds the chain: the refusal named the
/// deepest path, 33 KB of `d/d/d/...` on the terminal (helper-46).
#[test]
fn a_tree_too_deep_to_convert_is_refused_naming_its_top() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("deeper");
    write(&ws.join("top.txt"), b"top");
    std::fs::create_dir(ws.join("chain")).expect("mkdir");
    common::nest(&ws.join("chain"), 16 * 1024 + 2, b"bottom");
    let out = rewind(&lfs.mnt, &["--json", "init", "--subvolume", "deeper"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.len() < 2048, "{} bytes: {stderr}", stderr.len());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "INVALID_PATH", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("deeper/chain:"), "{v}");
    assert_ne!(inode(&ws), 256, "still a plain directory");
    assert!(!ws.join(".rewind").exists());
}

/// Owner, group, mode, every xattr and mtime of each entry below `root`
/// (symlinks' own, not their targets'), and of `root` but its mtime,
/// which `init` moves when it makes `.rewind/`.
fn ownership(root: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(".")
        .args([
            "-path",
            "./.rewind",
            "-prune",
            "-o",
            "-path",
            ".",
            "-printf",
            "%p %U:%G %m\n",
        ])
        .args(["-o", "-printf", "%p %U:%G %m %T@\n"])
        .current_dir(root)
        .output()
        .expect("find");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let path = l.split(' ').next().unwrap_or("");
            let x = Command::new("getfattr")
                .args(["-h", "-d", "-m", "-", "--absolute-names", path])
                .current_dir(root)
                .output()
                .expect("getfattr");
            let xattrs = String::from_utf8_lossy(&x.stdout)
                .lines()
                .filter(|l| l.contains('='))
                .collect::<Vec<_>>()
                .join(",");
            format!("{l} [{xattrs}]")
        })
        .collect();
    lines.sort();
    lines
}

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().expect("sh");
    assert!(st.success(), "{cmd}");
}

#[test]
fn init_subvolume_keeps_owners_setuid_bits_trusted_xattrs_and_symlink_times() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subdir("owned");
    write(&ws.join("bin/tool"), b"#!/bin/sh\n");
    write(&ws.join("bin/plain"), b"x");
    std::os::unix::fs::symlink("tool", ws.join("bin/link")).expect("symlink");
    let d = ws.display();
    // A setuid file of another user: a conversion that made it root's
    // would hand that user's program root's privileges.
    sh(&format!(
        "chown -R 1234:2345 {d} && chown -h 1234:2345 {d}/bin/link && chmod 4755 {d}/bin/tool && chmod 2750 {d}/bin \
         && setfattr -n trusted.kept -v yes {d}/bin/tool && setfattr -n user.kept -v yes {d}/bin \
         && touch -h -d 2019-01-01 {d}/bin/link"
    ));
    let before = ownership(&ws);
    assert!(
        before
            .iter()
            .any(|l| l.starts_with("./bin/tool 1234:2345 4755 ") && l.contains("trusted.kept")),
        "{before:?}"
    );
    rewind_json(&lfs.mnt, &["init", "--subvolume", "owned"]);
    assert_eq!(inode(&ws), 256, "not a subvolume root");
    assert_eq!(
        before,
        ownership(&ws),
        "owners, modes, xattrs or times changed"
    );
}

/// Whether `path` has btrfs's NOCOW flag (`lsattr -d` shows `C`).
fn nocow(path: &Path) -> bool {
    let out = Command::new("lsattr")
        .arg("-d")
        .arg(path)
        .output()
        .expect("lsattr");
    assert!(out.status.success(), "lsattr {}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .is_some_and(|flags| flags.contains('C'))
}

/// D248 (helper-37): btrfs refuses a clone between a NOCOW (`chattr +C`)
/// file and a copy-on-write one, so a database or VM image kept NOCOW
/// was copied byte for byte (with twice its space while it ran), lost
/// its flag, and the output still said "by reflink". The new file now
/// takes its source's flag before the clone, a directory after its
/// entries, and what was copied is counted.
#[test]
fn a_nocow_file_keeps_its_flag_and_is_cloned_not_copied() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let dir = lfs.subdir("db");
    let data = dir.join("data.img");
    sh(&format!(
        "touch {d} && chattr +C {d} && head -c 8388608 /dev/urandom > {d}",
        d = data.display()
    ));
    std::fs::create_dir(dir.join("vm")).expect("mkdir");
    sh(&format!("chattr +C {}", dir.join("vm").display()));
    write(&dir.join("vm/disk"), b"inherits +C from vm\n");
    write(&dir.join("plain.txt"), b"copy-on-write\n");
    // DIR itself too (what is made in it later inherits the flag), set
    // after plain.txt was made, which stays copy-on-write.
    sh(&format!("chattr +C {}", dir.display()));
    assert!(nocow(&data) && nocow(&dir.join("vm")) && nocow(&dir.join("vm/disk")));
    let before = snapshot(&dir);
    let v = rewind_json(&lfs.mnt, &["init", "--subvolume", "db"]);
    assert_eq!(inode(&dir), 256, "not a subvolume root");
    assert_eq!(v["subvolume"]["copied"], 0, "copied, not cloned: {v}");
    assert_eq!(before, snapshot(&dir), "contents changed");
    assert!(nocow(&data), "data.img lost +C");
    assert!(nocow(&dir.join("vm")), "vm lost +C");
    assert!(nocow(&dir.join("vm/disk")), "vm/disk lost +C");
    assert!(!nocow(&dir.join("plain.txt")), "plain.txt gained +C");
    assert!(nocow(&dir), "the converted directory lost +C");
}

#[test]
fn what_a_conversion_cannot_carry_over_is_refused_before_anything_is_made() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let refused = |name: &str, want: &str| {
        let ws = lfs.mnt.join(name);
        let before = snapshot(&ws);
        let out = rewind(&lfs.mnt, &["init", "--subvolume", name]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(want) && err.contains("nothing was changed"),
            "{name}: {err}"
        );
        assert_ne!(inode(&ws), 256, "{name}: converted");
        assert!(
            !lfs.mnt.join(format!(".{name}.rewind-subvol")).exists(),
            "{name}: temporary left behind"
        );
        assert_eq!(before, snapshot(&ws), "{name}: changed");
    };

    // A mount inside: removing the old tree after the swap emptied it.
    let ws = lfs.subdir("mounted");
    write(&ws.join("keep"), b"k");
    std::fs::create_dir(ws.join("m")).expect("mkdir");
    sh(&format!("mount -t tmpfs tmpfs {}", ws.join("m").display()));
    write(&ws.join("m/precious"), b"p");
    refused(
        "mounted",
        "mounted/m: is a mount point or a nested subvolume",
    );
    assert_eq!(
        std::fs::read(ws.join("m/precious")).ok(),
        Some(b"p".to_vec())
    );
    sh(&format!("umount {}", ws.join("m").display()));

    // A directory bind-mounted from the same filesystem: the same device,
    // so it was copied, and then emptied with the old tree, deleting files
    // outside DIR (helper-37, D245). Its mount id tells it.
    let shared = lfs.subdir("shared");
    write(&shared.join("keep.txt"), b"precious, outside DIR");
    write(&shared.join("sub/x"), b"deep");
    let ws = lfs.subdir("bound");
    write(&ws.join("a"), b"work");
    std::fs::create_dir(ws.join("bm")).expect("mkdir");
    sh(&format!(
        "mount --bind {} {}",
        shared.display(),
        ws.join("bm").display()
    ));
    refused("bound", "bound/bm: is a mount point or a nested subvolume");
    sh(&format!("umount {}", ws.join("bm").display()));
    assert_eq!(
        std::fs::read(shared.join("keep.txt")).ok(),
        Some(b"precious, outside DIR".to_vec())
    );
    assert_eq!(
        std::fs::read(shared.join("sub/x")).ok(),
        Some(b"deep".to_vec())
    );

    // A nested subvolume: the same, and its snapshots are read-only.
    let ws = lfs.subdir("nested");
    sh(&format!(
        "btrfs -q subvolume create {}",
        ws.join("inner").display()
    ));
    write(&ws.join("inner/f"), b"f");
    refused(
        "nested",
        "nested/inner: is a mount point or a nested subvolume",
    );

    // An immutable file: the old tree could not be removed, on any retry.
    let ws = lfs.subdir("immutable");
    write(&ws.join("d/imm"), b"i");
    sh(&format!("chattr +i {}", ws.join("d/imm").display()));
    refused("immutable", "imm: is immutable or append-only");
    sh(&format!("chattr -i {}", ws.join("d/imm").display()));

    // A file held open: its later writes would go to the old tree.
    let ws = lfs.subdir("held");
    write(&ws.join("log"), b"l");
    let mut holder = Command::new("sh")
        .args([
            "-c",
            &format!("exec 5>>{}; sleep 30", ws.join("log").display()),
        ])
        .spawn()
        .expect("spawn");
    std::thread::sleep(std::time::Duration::from_millis(200));
    refused("held", &format!("pid {}", holder.id()));
    let _ = holder.kill();
    let _ = holder.wait();

    // Inside another workspace: its checkpoints would skip the subvolume.
    let outer = lfs.subdir("outer");
    write(&outer.join("pkg/p"), b"p");
    rewind_json(&outer, &["init"]);
    refused("outer/pkg", "is inside the workspace");

    // Without root, an entry another user owns (here: root's own).
    let ws = lfs.subdir("foreign");
    write(&ws.join("f"), b"f");
    sh(&format!("chmod 777 {} {}", lfs.mnt.display(), ws.display()));
    let err = nobodys_conversion_refused(&ws);
    assert!(
        err.contains("belongs to uid 0") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_ne!(inode(&ws), 256);

    // Without root, nobody's own directory in root's 755 one: the new
    // subvolume is made beside it, so that parent must be writable; it
    // said only "Permission denied" (helper-42, D262).
    let parent = lfs.subdir("roots");
    let ws = parent.join("mine");
    write(&ws.join("f"), b"f");
    sh(&format!(
        "chmod 755 {} && chown -R nobody: {}",
        parent.display(),
        ws.display()
    ));
    let err = nobodys_conversion_refused(&ws);
    assert!(
        err.contains("parent directory must be writable") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_ne!(inode(&ws), 256);
}

/// `init --subvolume WS` run as nobody, which must fail: its stderr.
fn nobodys_conversion_refused(ws: &Path) -> String {
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_rewind"))
        .args(["init", "--subvolume"])
        .arg(ws)
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
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

/// D135: killed after the swap, before its history moved, `init
/// --subvolume` left a subvolume whose history is still in `.rewind/`.
/// The next checkpoint took a btrfs snapshot there, which the rerun could
/// not move (btrfs refuses to rename a read-only snapshot into another
/// subvolume): the checkpoint was lost to `verify --deep` and to rewinds.
/// Now such a workspace checkpoints with the walk engine, and the rerun
/// moves a history that every checkpoint of which restores.
#[test]
fn checkpoints_between_an_interrupted_conversion_and_its_rerun_stay_restorable() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    let ws = lfs.subdir("proj");
    let before_id = populate(&ws);
    convert_killed_at(&lfs, "proj", "subvol:swapped");
    assert_eq!(inode(&ws), 256, "the swap happened");
    let doctor = rewind_json(&ws, &["doctor"]);
    assert_eq!(doctor["engine"], "walk", "{doctor}");
    assert!(
        doctor["engine_why"]
            .as_str()
            .is_some_and(|w| w.contains("init --subvolume")),
        "{doctor}"
    );
    write(&ws.join("src/main.rs"), b"fn main() { between(); }\n");
    let between = snapshot(&ws);
    let between_id = rewind_json(&ws, &["checkpoint", "between"])["id"]
        .as_str()
        .expect("id")
        .to_string();
    assert!(
        !ws.join(".rewind/snapshots").exists(),
        "no snapshot in the flat history"
    );
    let done = rewind_json(&lfs.mnt, &["init", "--subvolume", "proj"]);
    assert_eq!(done["subvolume"]["history_moved"], true, "{done}");
    assert_eq!(rewind_json(&ws, &["doctor"])["engine"], "btrfs");
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    write(&ws.join("src/main.rs"), b"damage");
    rewind_json(&ws, &["rewind", &between_id]);
    common::assert_same("the checkpoint between", &between, &snapshot(&ws));
    rewind_json(&ws, &["rewind", &before_id]);
    assert_eq!(
        std::fs::read(ws.join("src/main.rs")).expect("read"),
        b"fn main() {}\n"
    );
}

/// What is written into DIR while `init --subvolume` copies it was
/// removed with the old tree, and the conversion said it succeeded
/// (helper-34, D240). A write the copy may have missed now makes it start
/// over; one that lands in the old tree after the last check (the instant
/// before the swap, or a file held open) keeps the old tree, named.
#[test]
fn work_written_during_a_conversion_is_never_removed_with_the_old_tree() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    let ws = lfs.subdir("proj");
    populate(&ws);
    // Written while the copy ran: in the subvolume afterwards.
    let mut want = None;
    let v = common::rewind_json_stopped_at(
        &lfs.mnt,
        &["init", "--subvolume", "proj"],
        "subvol:copied",
        || {
            write(&ws.join("new-during-init.txt"), b"new\n");
            write(&ws.join("src/main.rs"), b"fn main() { edited(); }\n");
            want = Some(snapshot(&ws));
        },
    );
    assert_eq!(inode(&ws), 256, "proj is a subvolume");
    let want = want.expect("written");
    common::assert_same("the writes made during the copy", &want, &snapshot(&ws));
    assert!(v["subvolume"].get("kept_old_tree").is_none(), "{v}");

    // Written into the old tree after the swap (a file held open there):
    // the old tree is kept where the output says.
    let ws2 = lfs.subdir("other");
    populate(&ws2);
    let conv = common::spawn_stopped_at(
        &lfs.mnt,
        &["--json", "init", "--subvolume", "other"],
        "subvol:swapped",
    );
    write(&lfs.mnt.join(".other.rewind-subvol/late.txt"), b"late\n");
    let out = common::resume_to_success(conv);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let kept = v["subvolume"]["kept_old_tree"]
        .as_str()
        .expect("kept_old_tree");
    assert_eq!(
        std::fs::read(Path::new(kept).join("late.txt"))
            .ok()
            .as_deref(),
        Some(&b"late\n"[..]),
        "{v}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(kept));
}
