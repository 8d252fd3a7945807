//! The FUSE overlay (`rewind mount`, DESIGN §6) on real mounts over
//! workspaces on XFS: the dirty set is exact, real tools behave as they do
//! natively, rewinds are atomic for readers, a killed daemon loses
//! nothing, and `.rewind/` cannot be reached through the mount.

// Tests and benches may panic on a closed stream (D348).
#![allow(clippy::disallowed_macros)]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{
    Fs, LoopFs, MountGuard, chmod, rewind, rewind_env, rewind_json, set_xattr, snapshot, write,
};

/// A workspace with a small tree on a fresh XFS, initialized.
fn workspace(dirs: usize, files: usize) -> Option<(LoopFs, PathBuf)> {
    let lfs = LoopFs::new(Fs::Xfs, 512)?;
    let ws = lfs.subdir("ws");
    for d in 0..dirs {
        for f in 0..files {
            write(
                &ws.join(format!("d{d:02}/f{f:02}.txt")),
                format!("dir {d} file {f}\n").as_bytes(),
            );
        }
    }
    let out = rewind(&ws, &["init", "-q"]);
    assert!(
        out.status.success(),
        "init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((lfs, ws))
}

/// Checkpoint through the mount (a capture guided by the dirty set), then
/// check that a full walk of the same tree finds nothing the checkpoint
/// missed. Returns how many entries the checkpoint looked at.
fn checkpoint_matches_a_walk(mp: &Path, step: &str) -> u64 {
    let ck = rewind_json(mp, &["checkpoint", step]);
    assert_eq!(ck["engine"], "fuse", "{step}: engine");
    let out = rewind_env(mp, &["--json", "status"], &[("REWIND_ENGINE", "walk")]);
    assert!(
        out.status.success(),
        "{step}: status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(
        st["changes"],
        serde_json::json!([]),
        "{step}: the dirty-set checkpoint missed changes a walk sees"
    );
    ck["entries"].as_u64().expect("entries")
}

fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "script failed in {}:\n{script}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Swap `a` and `b` in one step (`renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) {
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("c");
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings; renameat2 does not keep the pointers.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        r,
        0,
        "renameat2 exchange of {} and {}: {}",
        a.display(),
        b.display(),
        std::io::Error::last_os_error()
    );
}

/// D235: what a directory's listing skipped is recorded by every
/// checkpoint the dirty set scopes, and kept by a rewind to it.
#[test]
fn a_skip_the_dirty_set_did_not_touch_is_still_recorded() {
    let Some((_lfs, ws)) = workspace(3, 3) else {
        return;
    };
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    rewind_json(&ws, &["checkpoint", "base"]);
    common::a_skip_the_scope_did_not_touch_is_still_recorded(&ws, &[], "dirty set");
}

/// An append that reaches the mount while a rewind holds it frozen runs
/// after the rewind: it waited at the gate in its open, on the inode of a
/// file the rewind removed, and then wrote into that file, which no name
/// and no checkpoint held (helper-34, D236). It now meets the rewound
/// tree: the file is made again and holds the appended line.
#[test]
fn an_append_that_waited_out_a_rewind_meets_the_rewound_tree() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let base = common::checkpoint_id(&ws, &["base"]);
    let log = ws.join("log.txt");
    sh(&ws, "echo 'line 1' >> log.txt; cat log.txt >/dev/null");
    let rewind = common::spawn_stopped_at(&ws, &["--json", "rewind", &base], "rewind:captured");
    let append = Command::new("sh")
        .arg("-c")
        .arg("echo 'line 2' >> log.txt")
        .current_dir(&ws)
        .spawn()
        .expect("spawn the append");
    std::thread::sleep(std::time::Duration::from_millis(300));
    common::resume_to_success(rewind);
    let appended = append.wait_with_output().expect("wait");
    assert!(appended.status.success(), "the append failed: {appended:?}");
    assert_eq!(
        std::fs::read_to_string(&log).ok().as_deref(),
        Some("line 2\n"),
        "the appended line is lost"
    );
}

/// A tool that opened a file just before a rewind wrote into it after the
/// rewind's safety capture (passthrough writes do not pass the gate), and
/// the rewind then replaced the file: the line was in no file and no
/// checkpoint (helper-34: 188 of 6,942 appended lines lost over 20 s of
/// rewinds). The freeze now closes the mount to opens first and lets the
/// files open for writing close (D241): the line is in the safety
/// checkpoint, and `undo` gives it back. The daemon's drain is made long
/// here so that the writer's pause, not the machine's speed, decides.
#[test]
fn a_write_through_a_file_opened_before_a_rewind_is_in_its_safety_checkpoint() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(_m) = MountGuard::with_env(&ws, &[("REWIND_MOUNT_DRAIN_MS", "5000")]) else {
        return;
    };
    let base = common::checkpoint_id(&ws, &["base"]);
    sh(&ws, "echo 'line 1' >> log.txt");
    // Open before the rewind starts, written and closed while it drains.
    let writer = Command::new("sh")
        .arg("-c")
        .arg("exec 3>>log.txt; echo open; sleep 1; echo 'line 2' >&3; exec 3>&-")
        .current_dir(&ws)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let mut writer = writer;
    let mut out = writer.stdout.take().expect("stdout");
    let mut open = [0u8; 5];
    std::io::Read::read_exact(&mut out, &mut open).expect("the writer opened log.txt");
    let r = rewind_json(&ws, &["rewind", &base]);
    assert!(writer.wait().expect("wait").success());
    assert!(!ws.join("log.txt").exists(), "{r}");
    rewind_json(&ws, &["undo"]);
    assert_eq!(
        std::fs::read_to_string(ws.join("log.txt")).ok().as_deref(),
        Some("line 1\nline 2\n"),
        "the line written through the open file is lost"
    );
}

/// D244: D220's warning through the mount. A file a tool keeps open for
/// writing (a server's log) through the mount was replaced by a rewind
/// without a word: the lease D220 asks natively is refused for every
/// file there (the daemon holds them open). The daemon now says which
/// files are still open for writing once its freeze's drain is over, and
/// the rewind names those it replaces, with their holders.
#[test]
fn a_file_held_open_for_writing_through_the_mount_is_named_when_a_rewind_replaces_it() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("server.log"), b"line 1\n");
    write(&ws.join("other.txt"), b"one\n");
    let base = common::checkpoint_id(&ws, &["base"]);
    write(&ws.join("other.txt"), b"two\n");
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg("exec 3>>server.log; echo 'line 2' >&3; echo open; exec sleep 60")
        .current_dir(&ws)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let mut out = writer.stdout.take().expect("stdout");
    let mut open = [0u8; 5];
    std::io::Read::read_exact(&mut out, &mut open).expect("the writer opened server.log");
    let v = rewind_json(&ws, &["rewind", &base]);
    let _ = writer.kill();
    let _ = writer.wait();
    let warning = common::assert_held_open_named(&v, "server.log", writer.id(), "other.txt");
    assert!(
        !warning.contains("(rewind)"),
        "the daemon is no holder: {warning}"
    );
    write(&ws.join("server.log"), b"line 3\n");
    let v = rewind_json(&ws, &["rewind", &base]);
    assert!(v.get("warning").is_none(), "no writer, no warning: {v}");
}

/// D247's case, through the mount at `mp` over workspace `ws` (the same
/// path, or a view): two writes through one shared mapping of a small
/// file, a checkpoint after each; the second checkpoint must hold the
/// second write, and a rewind and `undo` must give it back. `names`: how
/// many names the file has (each is a modified entry); `keep_fd`: the
/// program keeps its descriptor, or closes it right after `mmap`.
fn a_second_write_through_a_mapping_is_checkpointed(
    mp: &Path,
    file: &str,
    names: u64,
    keep_fd: bool,
) {
    write(&mp.join(file), &[0u8; 4096]);
    let base = common::checkpoint_id(mp, &["base"]);
    // Each write older than the capture's start, or the cache would not
    // vouch for the file anyway (racily clean).
    let settle = || std::thread::sleep(std::time::Duration::from_millis(100));
    let Some(mut map) = common::MappedWriter::spawn(&mp.join(file), keep_fd) else {
        return;
    };
    map.put(b"AAAAAAAA");
    settle();
    let a = rewind_json(mp, &["checkpoint", "cA"]);
    assert_eq!(a["changes"]["modified"], names, "{a}");
    map.put(b"BBBBBBBB");
    settle();
    let b = rewind_json(mp, &["checkpoint", "cB"]);
    map.put(b"CCCCCCCC");
    settle();
    let c = rewind_json(mp, &["checkpoint", "cC"]);
    assert_eq!(
        b["changes"]["modified"], names,
        "the second write was missed: {b}"
    );
    assert_eq!(
        c["changes"]["modified"], names,
        "the third write was missed: {c}"
    );
    // The writer still maps the file while the rewind saves the live tree
    // and replaces it; its end (unmapping what it wrote) must not reach
    // the restored file.
    map.put(b"DDDDDDDD");
    settle();
    rewind_json(mp, &["rewind", &base]);
    drop(map);
    let restored = std::fs::read(mp.join(file)).expect("read");
    assert_eq!(
        &restored[..8],
        &[0u8; 8],
        "the rewind's file was written over"
    );
    rewind_json(mp, &["undo"]);
    let now = std::fs::read(mp.join(file)).expect("read");
    assert_eq!(&now[..8], b"DDDDDDDD", "rewind and undo lost the write");
}

/// D247 (helper-36): a write through a shared mapping moves the file's
/// times only when its page first becomes writable. A second write to a
/// small file (read into the ledger, which leaves the page writable)
/// moved nothing, the stat cache vouched for the file, and the checkpoint
/// held the first write: a rewind and `undo` then lost the second. A
/// file the mount saw opened for writing is now read again by the next
/// capture, and one still open is written back before it is read, so
/// that the next write moves its times. Through a view and with the whole
/// tree dirty (a hard link whose other name the daemon never saw), where
/// no scope is used, the same holds (helper-38).
#[test]
fn a_write_through_a_shared_mapping_is_in_the_next_checkpoint() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    {
        let Some(_m) = MountGuard::new(&ws, &[]) else {
            return;
        };
        a_second_write_through_a_mapping_is_checkpointed(&ws, "f.bin", 1, true);
        // A second name made behind the daemon's back: opening the file
        // marks the whole tree dirty (D52), and the capture is unscoped.
        std::fs::hard_link(ws.join("f.bin"), ws.join("d00/other-name")).expect("link");
    }
    {
        let Some(_m) = MountGuard::new(&ws, &[]) else {
            return;
        };
        a_second_write_through_a_mapping_is_checkpointed(&ws, "f.bin", 2, true);
    }
    let view = ws.parent().expect("parent").join("view");
    std::fs::create_dir(&view).expect("mkdir view");
    let _v = mount_view(&ws, &view);
    a_second_write_through_a_mapping_is_checkpointed(&view, "g.bin", 1, true);
}

/// D255: without passthrough (every mount made without CAP_SYS_ADMIN)
/// the kernel keeps what a program writes through a shared mapping in the
/// mount's own page cache until it writes it back, up to 30 s later. The
/// daemon and the backing file had the old bytes, every checkpoint saved
/// those, and a rewind and `undo` lost the writes, whether the program
/// kept its descriptor or closed it right after `mmap`. Commands now
/// write such pages back through the mount before they take the dirty
/// set or freeze the mount.
#[test]
fn without_passthrough_writes_through_a_shared_mapping_are_checkpointed() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &["--no-passthrough"]) else {
        return;
    };
    assert!(!m.status().passthrough);
    a_second_write_through_a_mapping_is_checkpointed(&ws, "kept.bin", 1, true);
    a_second_write_through_a_mapping_is_checkpointed(&ws, "closed.bin", 1, false);
}

/// D299: `syncfs` on the mount starts the writes a mapping's pages need
/// but does not wait for them (fuser answers `FUSE_SYNCFS` with ENOSYS,
/// and the kernel then skips that wait): under load, 1 checkpoint in ~20
/// took the old bytes of a file written through a mapping whose
/// descriptor was closed. Commands now `fsync` the files open for writing
/// through the mount, which waits. 150 writes, each checkpointed.
#[test]
fn without_passthrough_every_write_through_a_closed_mapping_is_in_its_checkpoint() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &["--no-passthrough"]) else {
        return;
    };
    assert!(!m.status().passthrough);
    write(&ws.join("m.bin"), &[0u8; 4096]);
    common::checkpoint_id(&ws, &["base"]);
    let Some(mut map) = common::MappedWriter::spawn(&ws.join("m.bin"), false) else {
        return;
    };
    let mut missed = Vec::new();
    for round in 0..150u32 {
        let tag = format!("{round:08}");
        let bytes: [u8; 8] = tag.as_bytes().try_into().expect("8 bytes");
        map.put(&bytes);
        // Each write changes the file: a checkpoint that holds it says so.
        let c = rewind_json(&ws, &["checkpoint"]);
        if c["changes"]["modified"] != 1 {
            missed.push(round);
        }
    }
    assert!(
        missed.is_empty(),
        "checkpoints that missed the write: {missed:?}"
    );
}

/// D256: through passthrough, a program that closes its descriptor right
/// after `mmap` writes the backing file through the mapping with no
/// request the daemon sees. Once a capture had read the file nothing
/// named it again: later writes were in no checkpoint, and a rewind and
/// `undo` lost them. A file whose passthrough handle for writing was
/// released now counts as open for writing while its opener maps it.
#[test]
fn a_write_through_a_mapping_whose_descriptor_was_closed_is_checkpointed() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    assert!(m.status().passthrough, "a mount as root has passthrough");
    a_second_write_through_a_mapping_is_checkpointed(&ws, "closed.bin", 1, false);
    // helper-41: two processes that opened the file for writing after it
    // was mapped pushed the one that maps it out of the daemon's list,
    // and its next writes were in no checkpoint. And a rewind that
    // replaced the mapped file warned of nobody writing into it.
    let file = ws.join("shared.bin");
    write(&file, &[0u8; 4096]);
    let base = common::checkpoint_id(&ws, &["base"]);
    let settle = || std::thread::sleep(std::time::Duration::from_millis(100));
    let Some(mut map) = common::MappedWriter::spawn(&file, false) else {
        return;
    };
    map.put(b"BBBBBBBB");
    settle();
    assert_eq!(
        rewind_json(&ws, &["checkpoint", "B"])["changes"]["modified"],
        1
    );
    for _ in 0..3 {
        let st = Command::new("sh")
            .args(["-c", ": >> shared.bin"])
            .current_dir(&ws)
            .status()
            .expect("sh");
        assert!(st.success());
    }
    rewind_json(&ws, &["checkpoint", "openers"]);
    map.put(b"CCCCCCCC");
    settle();
    let c = rewind_json(&ws, &["checkpoint", "C"]);
    assert_eq!(
        c["changes"]["modified"], 1,
        "the process that maps the file was forgotten: {c}"
    );
    map.put(b"DDDDDDDD");
    settle();
    let v = rewind_json(&ws, &["rewind", &base]);
    common::assert_held_open_named(&v, "shared.bin", map.pid(), "closed.bin");
    drop(map);
    rewind_json(&ws, &["undo"]);
    let now = std::fs::read(&file).expect("read");
    assert_eq!(&now[..8], b"DDDDDDDD", "rewind and undo lost the write");
}

/// helper-38: D247 first read every file open for writing again at every
/// checkpoint, so a 400 MB file a process kept open cost each one 330 ms.
/// A file the store clones needs no second read (the clone writes its
/// pages back), and one opened once is read again once.
#[test]
fn a_big_file_held_open_for_writing_is_not_read_at_every_checkpoint() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("big.db"), &vec![7u8; 1 << 20]);
    // A file whose ctime is not behind the filesystem's (coarse) clock
    // when a capture begins is racy there, and read again wherever the
    // next capture visits it (the stat cache's rule): c0 then read big.db
    // whenever base came within a clock tick of the write (CI, session
    // 37), which is no second read of a file held open. The clock moves
    // past the write first.
    std::thread::sleep(std::time::Duration::from_millis(50));
    rewind_json(&ws, &["checkpoint", "base"]);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ws.join("big.db"))
        .expect("hold big.db open");
    for i in 0..3 {
        write(&ws.join("d00/f00.txt"), format!("edit {i}\n").as_bytes());
        let v = rewind_json(&ws, &["checkpoint", &format!("c{i}")]);
        assert_eq!(
            v["files_hashed"], 1,
            "checkpoint {i} read more than the edit: {v}"
        );
    }
    drop(held);
}

#[test]
fn the_dirty_set_checkpoint_equals_a_full_walk_after_every_kind_of_change() {
    let Some((_lfs, ws)) = workspace(40, 25) else {
        return;
    };
    // Hard-linked before the mount: the daemon will see only one name.
    write(&ws.join("hl/one"), b"linked\n");
    std::fs::hard_link(ws.join("hl/one"), ws.join("hl/two")).expect("hard link");
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let all = checkpoint_matches_a_walk(&ws, "first: everything");
    assert!(
        all >= 1000,
        "the first checkpoint walks everything ({all} entries)"
    );

    write(&ws.join("d01/new.txt"), b"new\n");
    let few = checkpoint_matches_a_walk(&ws, "create");
    assert!(
        few * 10 < all,
        "a checkpoint after one change looked at {few} of {all} entries"
    );

    std::fs::OpenOptions::new()
        .append(true)
        .open(ws.join("d02/f01.txt"))
        .and_then(|mut f| f.write_all(b"appended\n"))
        .expect("append");
    std::fs::OpenOptions::new()
        .write(true)
        .open(ws.join("d02/f02.txt"))
        .and_then(|f| f.set_len(3))
        .expect("truncate");
    checkpoint_matches_a_walk(&ws, "append + truncate");

    chmod(&ws.join("d03/f00.txt"), 0o755);
    chmod(&ws.join("d04"), 0o700);
    checkpoint_matches_a_walk(&ws, "chmod file + dir");

    std::fs::rename(ws.join("d05/f00.txt"), ws.join("d06/moved.txt")).expect("mv file");
    std::fs::create_dir_all(ws.join("deep/a/b")).expect("mkdir -p");
    std::fs::rename(ws.join("d07"), ws.join("deep/a/b/d07")).expect("mv dir");
    checkpoint_matches_a_walk(&ws, "renames");

    std::fs::remove_dir_all(ws.join("d08")).expect("rm -rf");
    std::fs::create_dir(ws.join("empty")).expect("mkdir");
    std::os::unix::fs::symlink("../d09/f00.txt", ws.join("d10/link")).expect("symlink");
    std::os::unix::fs::symlink("/outside/dangling", ws.join("dangling")).expect("symlink");
    checkpoint_matches_a_walk(&ws, "rm -rf, mkdir, symlinks");

    std::fs::remove_file(ws.join("d10/link")).expect("rm link");
    std::os::unix::fs::symlink("elsewhere", ws.join("d10/link")).expect("relink");
    std::fs::remove_dir(ws.join("empty")).expect("rmdir");
    checkpoint_matches_a_walk(&ws, "relink, rmdir");

    // A write through one name of a hard link changes the other.
    std::fs::OpenOptions::new()
        .append(true)
        .open(ws.join("hl/one"))
        .and_then(|mut f| f.write_all(b"via one\n"))
        .expect("write hard link");
    checkpoint_matches_a_walk(&ws, "hard link known by one name");
    std::fs::hard_link(ws.join("d11/f00.txt"), ws.join("d12/also.txt")).expect("link");
    std::fs::write(ws.join("d12/also.txt"), b"rewritten through the new name\n").expect("write");
    checkpoint_matches_a_walk(&ws, "hard link made through the mount");

    set_xattr(&ws.join("d13/f00.txt"), "user.k", b"v");
    set_xattr(&ws.join("d14"), "user.dir", b"1");
    checkpoint_matches_a_walk(&ws, "xattrs");

    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(ws.join("d15/f00.txt"))
        .and_then(|f| f.set_modified(t))
        .expect("utimens");
    checkpoint_matches_a_walk(&ws, "mtime");

    // An ignore file changes what is captured below it.
    write(&ws.join("d16/x.log"), b"log\n");
    checkpoint_matches_a_walk(&ws, "a log file");
    write(&ws.join("d16/.rewindignore"), b"*.log\n");
    checkpoint_matches_a_walk(&ws, "an ignore file");

    // RENAME_EXCHANGE swaps two entries in one step.
    exchange(&ws.join("d17/f00.txt"), &ws.join("d18"));
    checkpoint_matches_a_walk(&ws, "rename exchange");

    // A directory renamed over an empty one the last checkpoint held, and
    // two directories swapped: the entries below arrive with the
    // directory, and the tracker sees only the two names (D84).
    std::fs::create_dir(ws.join("was-empty")).expect("mkdir");
    checkpoint_matches_a_walk(&ws, "an empty directory");
    std::fs::remove_dir(ws.join("was-empty")).expect("rmdir");
    std::fs::rename(ws.join("d20"), ws.join("was-empty")).expect("mv over");
    checkpoint_matches_a_walk(&ws, "a directory renamed over an empty one");
    write(&ws.join("d22/only-in-22.txt"), b"22\n");
    checkpoint_matches_a_walk(&ws, "d22 differs from d21");
    exchange(&ws.join("d21"), &ws.join("d22"));
    checkpoint_matches_a_walk(&ws, "two directories exchanged");

    // A directory moved away and another made at its path: the stat-cache
    // rows there list the old one's entries, which the tracker never
    // names (D86). Then the same once the old one is deleted too, so its
    // inode number may be the new one's.
    std::fs::rename(ws.join("d23"), ws.join("d24/d23-moved")).expect("mv away");
    write(&ws.join("d23/fresh.txt"), b"fresh\n");
    checkpoint_matches_a_walk(&ws, "a directory made where one was moved away");
    std::fs::rename(ws.join("d25"), ws.join("d24/d25-moved")).expect("mv away");
    std::fs::remove_dir_all(ws.join("d24/d25-moved")).expect("rm -rf");
    write(&ws.join("d25/fresh.txt"), b"fresh\n");
    checkpoint_matches_a_walk(&ws, "a directory made where one was moved away and deleted");
    std::fs::rename(ws.join("d26"), ws.join("d24/d26-moved")).expect("mv away");
    std::fs::rename(ws.join("d27"), ws.join("d26")).expect("mv in");
    write(&ws.join("d26/fresh.txt"), b"fresh\n");
    checkpoint_matches_a_walk(
        &ws,
        "a directory moved to where one was moved away, then written in",
    );
    // A directory moved away, changed there, and moved back: the inode
    // at its path is the one the cache holds, but the changes were named
    // at a path that is gone; with a change named at its own path too,
    // the capture took its names from the row and missed the rest
    // (helper-27, D192).
    write(&ws.join("d28/named-here.txt"), b"named at d28\n");
    std::fs::rename(ws.join("d28"), ws.join("d24/d28-away")).expect("mv away");
    write(&ws.join("d24/d28-away/f00.txt"), b"changed while away\n");
    write(&ws.join("d24/d28-away/sub/deeper/x"), b"made while away\n");
    std::fs::rename(ws.join("d24/d28-away"), ws.join("d28")).expect("mv back");
    checkpoint_matches_a_walk(&ws, "a directory moved away, changed there, and moved back");
    write(&ws.join("d28/sub/deeper/x"), b"changed at home\n");
    std::fs::rename(ws.join("d28/sub"), ws.join("d29/sub-away")).expect("mv away");
    write(
        &ws.join("d29/sub-away/deeper/x"),
        b"changed away, one level down\n",
    );
    std::fs::rename(ws.join("d29/sub-away"), ws.join("d28/sub")).expect("mv back");
    checkpoint_matches_a_walk(
        &ws,
        "a subdirectory moved away, changed below, and moved back",
    );

    // A file open for writing across a checkpoint stays dirty: writes
    // after it (through kernel passthrough, unseen by the daemon) are in
    // the next one.
    let mut held = std::fs::OpenOptions::new()
        .write(true)
        .open(ws.join("d19/f00.txt"))
        .expect("open for write");
    held.write_all(b"before\n").expect("write");
    checkpoint_matches_a_walk(&ws, "open writer, first");
    held.write_all(b"after the checkpoint\n").expect("write");
    held.sync_all().expect("fsync");
    checkpoint_matches_a_walk(&ws, "open writer, second");
    drop(held);

    assert!(m.status().passthrough, "root mounts use kernel passthrough");
    m.unmount();
    // Unmounted, the walk engine agrees with the last checkpoint.
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "after unmount");
}

/// The daemon wants an fd for every inode the kernel knows, and may hold
/// only so many: a tree with several times more entries than its fd limit
/// still works through the mount (inodes give their fd back and are
/// reopened by name), for real tools, the dirty-set checkpoint and a
/// rewind. Before, `git add -A` failed with "Too many open files".
#[test]
fn a_tree_with_more_files_than_the_daemon_may_open_works_through_the_mount() {
    let Some((_lfs, ws)) = workspace(20, 60) else {
        return;
    };
    let base = rewind_json(&ws, &["checkpoint", "base"]);
    let base = base["id"].as_str().expect("id").to_string();
    let limit = 256;
    let Some(m) = MountGuard::with_fd_limit(&ws, limit) else {
        return;
    };
    let limited = m.status().fd_limit <= limit;
    if !limited {
        eprintln!("note: the daemon raised its fd limit (CAP_SYS_RESOURCE): nothing is evicted");
    }
    sh(
        &ws,
        r#"
        test "$(find . -type f | wc -l)" -eq 1200
        grep -r -c -e . d* > /dev/null
        cat d*/* > /dev/null
        for i in $(seq 300); do echo "$i" > "d00/new$i"; done
        git init -q && git add -A && git commit -qm all
        test -z "$(git status --porcelain)"
        "#,
    );
    let st = m.status();
    if limited {
        assert!(
            st.inodes > 4 * limit,
            "the kernel knows {} inodes: more than the daemon may hold fds",
            st.inodes
        );
    }
    checkpoint_matches_a_walk(&ws, "after the tools");
    rewind_json(&ws, &["rewind", &base]);
    sh(
        &ws,
        r#"
        test ! -e d00/new1 && test ! -e .git
        test "$(cat d07/f33.txt)" = "dir 7 file 33"
        test "$(cat d*/* | wc -l)" -eq 1200
        "#,
    );
    checkpoint_matches_a_walk(&ws, "after the rewind");
    m.unmount();
}

/// A file that loses its last name while open (unlinked, or replaced by a
/// rename) stays usable through its fd, as natively, even when the daemon
/// holds almost no inode fds (D65): it is held from the moment it loses
/// the name, and `fstat` asks the open file itself.
#[test]
fn an_open_file_that_loses_its_name_stays_usable_while_inodes_are_evicted() {
    let Some((_lfs, ws)) = workspace(2, 40) else {
        return;
    };
    let Some(m) = MountGuard::with_env(&ws, &[("REWIND_MOUNT_INODE_FDS", "2")]) else {
        return;
    };
    sh(
        &ws,
        r#"
        python3 - <<'EOF'
import os
def churn():
    for d in ("d00", "d01"):
        for i in range(1, 40):
            os.stat(f"{d}/f{i:02}.txt")
for victim, replace in (("d00/f00.txt", False), ("d01/f00.txt", True)):
    fd = os.open(victim, os.O_RDWR)
    churn()
    if replace:
        open("d01/new.txt", "w").write("new\n")
        os.rename("d01/new.txt", victim)
    else:
        os.unlink(victim)
    churn()
    assert os.fstat(fd).st_nlink == 0, os.fstat(fd)
    os.fchmod(fd, 0o600)
    assert os.fstat(fd).st_mode & 0o777 == 0o600
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"still here", 0)
    assert os.pread(fd, 64, 0) == b"still here"
    os.close(fd)
assert open("d01/f00.txt").read() == "new\n"
assert not os.path.exists("d00/f00.txt")
EOF
        "#,
    );
    checkpoint_matches_a_walk(&ws, "after the unlinks");
    m.unmount();
}

#[test]
fn real_tools_give_the_same_results_through_the_mount_as_natively() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 1024) else {
        return;
    };
    let native = lfs.subdir("native");
    let ws = lfs.subdir("ws");
    let src = lfs.subdir("src");
    for i in 0..50 {
        write(
            &src.join(format!("pkg/m{}/file{i}.c", i % 5)),
            format!("int f{i};\n").as_bytes(),
        );
    }
    let tarball = lfs.mnt.join("src.tar");
    sh(
        &lfs.mnt,
        &format!("tar -cf {} -C {} pkg", tarball.display(), src.display()),
    );
    assert!(rewind(&ws, &["init", "-q"]).status.success());
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let script = format!(
        r#"
        git init -q repo && cd repo
        echo one > a.txt && mkdir -p sub && echo two > sub/b.txt
        git add -A && git commit -qm first
        echo changed > a.txt && rm sub/b.txt && echo new > c.txt
        git status --porcelain > ../status.txt
        git reset -q --hard && git clean -qfd
        git checkout -qb topic && echo topic > t.txt && git add t.txt && git commit -qm topic
        git checkout -q master 2>/dev/null || git checkout -q main
        git log --all --format=%s | sort > ../log.txt
        cd ..
        tar -xf {tar}
        mkdir -p moved && mv pkg/m1 moved/ && mv pkg/m2/file2.c moved/
        chmod 0700 moved && chmod 0755 pkg/m3/file3.c
        ln -s ../pkg/m4 moved/m4link && ln -s /nowhere dangling
        ln pkg/m0/file0.c hard.c && echo more >> hard.c
        mkdir churn
        i=0; while [ $i -lt 10000 ]; do : > churn/f$i; i=$((i+1)); done
        i=0; while [ $i -lt 10000 ]; do [ $((i % 10)) -eq 0 ] || rm churn/f$i; i=$((i+1)); done
        "#,
        tar = tarball.display()
    );
    sh(&native, &script);
    sh(&ws, &script);
    // Same bytes, types, modes, links, xattrs. Git's own files record
    // times and inode numbers: its history is compared by `git log`.
    let strip = |mut t: std::collections::BTreeMap<Vec<u8>, common::Snap>| {
        t.retain(|k, _| !k.starts_with(b"repo/.git/"));
        t
    };
    common::assert_same(
        "tools through the mount",
        &strip(snapshot(&native)),
        &strip(snapshot(&ws)),
    );
    let st = std::fs::read_to_string(ws.join("status.txt")).expect("git status output");
    assert_eq!(
        st,
        std::fs::read_to_string(native.join("status.txt")).expect("native")
    );
    assert!(
        st.contains(" M a.txt") && st.contains(" D sub/b.txt"),
        "git status: {st}"
    );
    let log = std::fs::read_to_string(ws.join("log.txt")).expect("git log output");
    assert_eq!(log, "first\ntopic\n");
    checkpoint_matches_a_walk(&ws, "after the tools");

    // cargo new + cargo build of a small crate, through the mount.
    if Command::new("cargo")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        sh(
            &ws,
            "cargo new -q --vcs none hello && cd hello && cargo build -q --offline && ./target/debug/hello > ../hello.out",
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("hello.out")).expect("hello output"),
            "Hello, world!\n"
        );
        checkpoint_matches_a_walk(&ws, "after cargo build");
    }
    m.unmount();
}

#[test]
fn readers_never_see_a_mix_of_two_checkpoints_during_rewinds() {
    let Some((_lfs, ws)) = workspace(0, 0) else {
        return;
    };
    let names: Vec<String> = (0..40).map(|i| format!("d{}/f{i:02}", i % 4)).collect();
    for n in &names {
        write(&ws.join(n), b"A");
    }
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let a = common::checkpoint_id(&ws, &["A"]);
    for n in &names {
        std::fs::write(ws.join(n), b"BB").expect("write B");
    }
    write(&ws.join("only-in-b"), b"BB");
    let b = common::checkpoint_id(&ws, &["B"]);

    let stop = Arc::new(AtomicBool::new(false));
    let consistent = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (ws, names, stop, consistent) = (
                ws.clone(),
                names.clone(),
                Arc::clone(&stop),
                Arc::clone(&consistent),
            );
            std::thread::spawn(move || {
                let mut client = rewind_fuse::Client::connect(&ws)
                    .expect("connect")
                    .expect("daemon");
                while !stop.load(Ordering::Relaxed) {
                    let g1 = client.status().expect("status").generation;
                    let mut seen = BTreeSet::new();
                    for n in &names {
                        // Every file exists in both checkpoints: a reader
                        // never finds one missing, rewind or not.
                        let c =
                            std::fs::read(ws.join(n)).unwrap_or_else(|e| panic!("read {n}: {e}"));
                        seen.insert(c);
                    }
                    let extra = ws.join("only-in-b").exists();
                    let g2 = client.status().expect("status").generation;
                    if g1 == g2 && g1 % 2 == 0 {
                        assert_eq!(seen.len(), 1, "one tree has one content: saw {seen:?}");
                        let b = seen.contains(b"BB".as_slice());
                        assert_eq!(extra, b, "only-in-b exists exactly in B");
                        consistent.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for i in 0..60 {
        let to = if i % 2 == 0 { &a } else { &b };
        // Gaps of 0-15 ms between rewinds, as between an agent's commands:
        // back to back, a reader's 40 cold reads (each a lookup and an
        // open through the daemon after the invalidation) may never fit
        // between two of them, and the check below would have nothing
        // to count.
        std::thread::sleep(std::time::Duration::from_millis((i % 4) * 5));
        let out = rewind(
            Path::new("/"),
            &["-C", &ws.display().to_string(), "rewind", to, "-q"],
        );
        assert!(
            out.status.success(),
            "rewind {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader thread");
    }
    assert!(
        consistent.load(Ordering::Relaxed) > 0,
        "the readers completed no read between rewinds"
    );
    assert_eq!(std::fs::read(ws.join("d0/f00")).expect("read"), b"BB");
    m.unmount();
}

#[test]
fn a_killed_daemon_loses_nothing_and_the_next_command_walks() {
    let Some((_lfs, ws)) = workspace(10, 10) else {
        return;
    };
    let m = MountGuard::new(&ws, &[]);
    let Some(m) = m else {
        return;
    };
    common::checkpoint_id(&ws, &["base"]);
    write(&ws.join("d03/edited-through-the-mount"), b"keep me\n");
    std::fs::remove_file(ws.join("d04/f04.txt")).expect("rm");
    let pid = m.status().pid;
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    std::thread::sleep(std::time::Duration::from_millis(200));

    // The next command detaches the dead mount and walks the tree.
    let ck = rewind_json(
        Path::new("/"),
        &["-C", &ws.display().to_string(), "checkpoint", "after"],
    );
    assert_eq!(ck["engine"], "walk");
    assert_eq!(ck["changes"]["added"], 1);
    assert_eq!(ck["changes"]["deleted"], 1);
    assert_eq!(
        std::fs::read(ws.join("d03/edited-through-the-mount")).expect("read"),
        b"keep me\n"
    );
    assert!(
        ws.join(".rewind").is_dir(),
        "the workspace is no longer mounted"
    );
    let v = rewind(&ws, &["verify"]);
    assert!(
        v.status.success(),
        "verify: {}",
        String::from_utf8_lossy(&v.stdout)
    );
    std::mem::forget(m); // nothing left to unmount
    // Mounting again works, and the first capture walks everything.
    let m = MountGuard::new(&ws, &[]).expect("mount again");
    checkpoint_matches_a_walk(&ws, "after a remount");
    m.unmount();
}

/// A `rewind mcp` session over stdio: one `tools/call` at a time.
struct McpSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    id: u64,
}

impl McpSession {
    fn start(dir: &Path) -> McpSession {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
            .arg("mcp")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rewind mcp");
        let mut s = McpSession {
            stdin: child.stdin.take().expect("stdin"),
            lines: std::io::BufRead::lines(std::io::BufReader::new(
                child.stdout.take().expect("stdout"),
            )),
            child,
            id: 0,
        };
        s.request(
            "initialize",
            serde_json::json!({"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"0"}}),
        );
        let note = serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        writeln!(s.stdin, "{note}").expect("write");
        s
    }

    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.id += 1;
        let id = self.id;
        let msg = serde_json::json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        writeln!(self.stdin, "{msg}").expect("write");
        self.lines
            .by_ref()
            .map(|l| serde_json::from_str::<serde_json::Value>(&l.expect("line")).expect("json"))
            .find(|v| v["id"] == id)
            .expect("an answer")
    }

    /// A tool's result; a tool error fails the test.
    fn call(&mut self, name: &str, arguments: serde_json::Value) -> serde_json::Value {
        let r = self.request(
            "tools/call",
            serde_json::json!({"name":name,"arguments":arguments}),
        );
        assert_eq!(
            r["result"]["isError"],
            serde_json::json!(false),
            "{name}: {r}"
        );
        r["result"]["structuredContent"].clone()
    }
}

impl Drop for McpSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// D251 (helper-39): a `rewind mcp` started inside the mount, after its
/// daemon was killed. The dead mount answers ENOTCONN, which the server
/// took for its directory being gone (D174): it climbed to the directory
/// above the workspace, `status` called that no workspace, `checkpoint`
/// made it one, and a rewind there changed files outside the workspace.
/// It now detaches the dead mount and walks the same workspace, as every
/// command does.
#[test]
fn an_mcp_server_inside_a_mount_whose_daemon_died_stays_in_its_workspace() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let mut mcp = McpSession::start(&ws);
    mcp.call("checkpoint", serde_json::json!({"label":"base"}));
    // Written at the root: the kernel no longer has its attributes cached.
    write(&ws.join("new.txt"), b"new\n");
    kill_and_reap(m.status().pid);
    std::mem::forget(m); // its dead mount is the server's to detach
    let st = mcp.call("status", serde_json::json!({}));
    assert_eq!(st["changes"][0]["path"], "new.txt", "{st}");
    let ck = mcp.call("checkpoint", serde_json::json!({"label":"after"}));
    assert_eq!(ck["added"], 1, "{ck}");
    let above = ws.parent().expect("parent").join(".rewind");
    assert!(!above.exists(), "a workspace was made above this one");
    assert_eq!(
        std::fs::read(ws.join("new.txt")).expect("new.txt"),
        b"new\n"
    );
    drop(mcp);

    // D253 (helper-40): the same in a `--at` view. Detached, the view is
    // an empty directory: a `checkpoint` made an empty workspace there
    // and answered as if it had checkpointed the agent's work.
    let view = ws.parent().expect("parent").join("view");
    std::fs::create_dir(&view).expect("mkdir view");
    let v = mount_view(&ws, &view);
    let mut mcp = McpSession::start(&view);
    mcp.call("checkpoint", serde_json::json!({"label":"in the view"}));
    write(&view.join("newer.txt"), b"newer\n");
    kill_and_reap(v.status().pid);
    std::mem::forget(v);
    for tool in ["status", "checkpoint"] {
        let r = mcp.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": {}}),
        );
        assert_eq!(r["result"]["isError"], true, "{tool}: {r}");
        let text = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(
            text.contains("view of a workspace elsewhere"),
            "{tool}: {r}"
        );
    }
    assert!(
        !view.join(".rewind").exists(),
        "a workspace was made in the view"
    );
    assert!(!above.exists(), "a workspace was made above the view");
    assert_eq!(
        std::fs::read(ws.join("newer.txt")).expect("newer.txt"),
        b"newer\n"
    );
}

/// D192: the command right after a SIGKILL of a daemon that holds many
/// inodes (it takes a moment to die) connected to its socket, was reset,
/// and failed with "Connection reset by peer" (helper-27: 4 runs of 4);
/// it now sees the daemon gone, detaches the mount and walks.
#[test]
fn a_command_right_after_a_busy_daemon_is_killed_walks() {
    let Some((_lfs, ws)) = workspace(20, 500) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    common::checkpoint_id(&ws, &["base"]);
    for d in 0..20 {
        for f in 0..500 {
            let _ = std::fs::read(ws.join(format!("d{d:02}/f{f:02}.txt")));
        }
    }
    let pid = m.status().pid;
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let out = rewind(
        ws.parent().expect("parent"),
        &["-C", &ws.display().to_string(), "--json", "status"],
    );
    assert!(
        out.status.success(),
        "status right after the kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("had died"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::mem::forget(m); // nothing left to unmount
}

/// A request marks its entry dirty before its syscall. A checkpoint that
/// took the dirty set between the two captured the old entry and cleared
/// the mark: the change (an `rm` waiting for the inode lock behind a long
/// read, in helper-12's run) was in no checkpoint until `unmount`. The
/// request now marks again when it ends if a checkpoint took the set
/// meanwhile. The failpoint holds an unlink between its mark and its
/// syscall while a checkpoint runs.
#[test]
fn a_change_in_flight_while_a_checkpoint_takes_the_dirty_set_reaches_the_next_one() {
    let Some((_lfs, ws)) = workspace(3, 3) else {
        return;
    };
    let Some(m) = MountGuard::with_env(
        &ws,
        &[
            ("REWIND_FAILPOINT", "fuse:remove-marked"),
            ("REWIND_FAILPOINT_ACTION", "pause:1500"),
        ],
    ) else {
        return;
    };
    common::checkpoint_id(&ws, &["base"]);
    let victim = ws.join("d01/f01.txt");
    let rm = std::thread::spawn(move || std::fs::remove_file(&victim));
    std::thread::sleep(std::time::Duration::from_millis(400));
    let during = rewind_json(&ws, &["checkpoint", "during"]);
    assert_eq!(during["engine"], "fuse", "{during}");
    rm.join().expect("join").expect("rm through the mount");
    assert!(!ws.join("d01/f01.txt").exists());
    checkpoint_matches_a_walk(&ws, "after the remove finished");
    m.unmount();
}

/// Names in `dir`, sorted, duplicates kept (a listing that repeats an
/// entry must not compare equal).
fn listing(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    v.sort();
    v
}

/// `readdir` resumes at the backing directory's own offsets, and the
/// kernel opens directories without asking the daemon (D66): a directory
/// far too big for one reply lists every entry exactly once through the
/// mount, as the backing tree has it, before and after changes through
/// the mount; `.rewind` stays hidden wherever it falls in the root's
/// order.
#[test]
fn a_big_directory_lists_every_entry_once_through_the_mount() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let long = "n".repeat(80);
    for i in 0..2000 {
        write(&ws.join(format!("big/{long}-{i:05}")), b"x");
    }
    for i in 0..300 {
        write(&ws.join(format!("top-{i:04}")), b"y");
    }
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let backing = m.backing();
    let big = listing(&ws.join("big"));
    assert_eq!(big.len(), 2000, "every entry once");
    assert_eq!(big, listing(&backing.join("big")));
    for i in (0..2000).step_by(4) {
        std::fs::remove_file(ws.join(format!("big/{long}-{i:05}"))).expect("rm");
    }
    for i in 0..500 {
        write(&ws.join(format!("big/new-{i:04}")), b"z");
    }
    let big = listing(&ws.join("big"));
    assert_eq!(big.len(), 2000, "after 500 removed and 500 added");
    assert_eq!(big, listing(&backing.join("big")));
    let top = listing(&ws);
    let mut expected = listing(&backing);
    expected.retain(|n| n != ".rewind");
    assert_eq!(top.len(), 302, "300 files, d00 and big");
    assert_eq!(
        top, expected,
        "the root as the backing tree has it, minus .rewind"
    );
    checkpoint_matches_a_walk(&ws, "after the changes");
    m.unmount();
}

#[test]
fn the_state_directory_cannot_be_reached_through_the_mount() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    assert_eq!(
        m.status().ttl_s,
        300,
        "over itself nothing writes beside the mount: entries trusted 5 min (D77)"
    );
    let names: Vec<_> = std::fs::read_dir(&ws)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(!names.iter().any(|n| n == ".rewind"), "listed: {names:?}");
    let st = ws.join(".rewind");
    assert_eq!(
        std::fs::metadata(&st).map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::NotFound)
    );
    assert!(std::fs::remove_dir_all(&st).is_err());
    assert!(
        std::fs::create_dir(&st).is_err(),
        "mkdir .rewind through the mount"
    );
    assert!(
        std::fs::write(&st, b"x").is_err(),
        "create .rewind through the mount"
    );
    assert!(
        std::fs::rename(ws.join("d00"), &st).is_err(),
        "rename onto .rewind"
    );
    assert!(
        m.backing().join(".rewind/ledger.db").is_file(),
        "the ledger is intact"
    );
    let v = rewind(&ws, &["verify"]);
    assert!(
        v.status.success(),
        "verify: {}",
        String::from_utf8_lossy(&v.stdout)
    );
    m.unmount();
}

#[test]
fn unmount_of_a_busy_mount_names_the_holder_and_keeps_the_mount() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let server = server_pid_after_a_checkpoint(&m, &ws);
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(ws.join("d00"))
        .spawn()
        .expect("spawn sleep");
    let out = rewind(Path::new("/"), &["unmount", &ws.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "busy unmount fails: {err}");
    assert!(
        err.contains(&format!("pid {} (sleep)", sleeper.id())),
        "names the holder: {err}"
    );
    assert!(
        !err.contains(&format!("pid {server} ")),
        "not the command server, whose log is the backing file: {err}"
    );
    assert!(m.status().pid > 0, "still mounted");
    // D323: its daemon holds the history open: `deinit` says to unmount
    // first and deletes nothing.
    let out = rewind(
        Path::new("/"),
        &["-C", &ws.display().to_string(), "deinit", "--yes"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("rewind unmount"), "{err}");
    assert!(m.status().pid > 0, "still mounted");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    m.unmount();
    assert!(
        ws.join(".rewind/ledger.db").exists(),
        "deinit deleted nothing"
    );
}

/// `rewind mount WS --at VIEW`, which must succeed; the guard is keyed
/// by the view.
fn mount_view(ws: &Path, view: &Path) -> MountGuard {
    let out = rewind(
        Path::new("/"),
        &[
            "mount",
            &ws.display().to_string(),
            "--at",
            &view.display().to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "mount --at: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    MountGuard {
        dir: view.to_path_buf(),
    }
}

#[test]
fn a_view_mount_serves_the_workspace_elsewhere() {
    let Some((lfs, ws)) = workspace(3, 3) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let m = mount_view(&ws, &view);
    assert!(view.join("d01/f01.txt").is_file());
    assert_eq!(
        m.backing(),
        ws,
        "a view's backing tree is the workspace itself"
    );
    // The workspace may be written beside a view: its entries are trusted
    // for a minute, not the five minutes of a mount over itself (D77).
    assert_eq!(m.status().ttl_s, 60, "a view's TTL");
    let base = common::checkpoint_id(&view, &["base"]);
    std::fs::write(view.join("d01/f01.txt"), b"edited in the view\n").expect("write");
    checkpoint_matches_a_walk(&view, "edit in the view");
    let out = rewind(&view.join("d02"), &["rewind", &base, "-q"]);
    assert!(
        out.status.success(),
        "rewind from inside the view: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(view.join("d01/f01.txt")).expect("read"),
        b"dir 1 file 1\n"
    );
    assert_eq!(
        std::fs::read(ws.join("d01/f01.txt")).expect("read"),
        b"dir 1 file 1\n"
    );
    // D123: written beside the view, in the workspace directory (an
    // editor): the daemon never sees it, and a checkpoint through the view
    // captured nothing of it. Captures through a view walk.
    std::fs::write(ws.join("d00/f00.txt"), b"edited beside the view\n").expect("write");
    write(&ws.join("d02/new-beside"), b"new\n");
    let ck = rewind_json(&view, &["checkpoint", "beside"]);
    assert_eq!(ck["changes"]["added"], 1, "{ck}");
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");
    checkpoint_matches_a_walk(&view, "after writes beside the view");
    let out = rewind(&view, &["rewind", &base, "-q"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(ws.join("d00/f00.txt")).expect("read"),
        b"dir 0 file 0\n"
    );
    assert!(!ws.join("d02/new-beside").exists());
    // D323: `deinit` in the workspace directory or in the view names the
    // view to unmount first, and deletes nothing (helper-72).
    for dir in [&ws, &view] {
        let out = rewind(dir, &["deinit", "--yes"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("rewind unmount {}", view.display())),
            "{err}"
        );
    }
    assert!(ws.join(".rewind/ledger.db").exists());
    m.unmount();
}

/// A view's stopped daemon, met by `doctor` run in the workspace
/// directory, is reported and gone around as one over the workspace
/// itself is (D99): opening the workspace there asks the view's daemon
/// (D141), and its silence had been wrapped into an error doctor ended on.
#[test]
fn a_stopped_view_daemon_is_reported_from_the_workspace_directory() {
    let Some((lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let m = mount_view(&ws, &view);
    let ws_arg = ws.display().to_string();
    let pid = m.status().pid;
    let resume = Resume::after_stopping(pid);
    let limit = rewind_fuse::ANSWER_TIMEOUT * 4;
    doctor_reports_stopped(&ws_arg, pid, limit);
    let out = rewind_within(&["-C", &ws_arg, "status"], limit).expect("status did not hang");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "status cannot go around it: {err}");
    assert!(
        err.contains(&format!("kill -CONT {pid}")),
        "names the stopped daemon and the way out: {err}"
    );
    drop(resume);
    m.unmount();
}

/// A rewind run in the workspace directory while a view of it is mounted
/// goes through the view's daemon, which freezes the view and drops the
/// kernel's cached entries: made without it, the view kept naming the
/// replaced file for its 60 s TTL, and a write through the view went to
/// that file, in no checkpoint and gone at unmount (D141; helper-18).
#[test]
fn a_rewind_run_beside_a_view_goes_through_its_daemon() {
    let Some((lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let m = mount_view(&ws, &view);
    let base = common::checkpoint_id(&ws, &["base"]);
    std::fs::write(view.join("d01/f01.txt"), b"edited in the view\n").expect("write");
    assert_eq!(
        std::fs::read(view.join("d01/f01.txt")).expect("read"),
        b"edited in the view\n",
        "the view has the file's entry cached"
    );
    let out = rewind(&ws, &["rewind", &base, "-q"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(view.join("d01/f01.txt"))
        .expect("open through the view");
    std::io::Write::write_all(&mut f, b"IMPORTANT\n").expect("append");
    drop(f);
    assert_eq!(
        std::fs::read(ws.join("d01/f01.txt")).expect("read"),
        b"dir 1 file 1\nIMPORTANT\n",
        "the write through the view reached the rewound file"
    );
    let st = rewind_json(&view, &["status"]);
    assert!(
        common::changed_paths(&st).contains(&"d01/f01.txt"),
        "the next checkpoint sees the write: {st}"
    );
    m.unmount();
}

/// A view whose daemon was killed left its dead mount: mounting the view
/// again failed with ENOTCONN, since only the workspace's own commands
/// detached dead mounts and they never look at the view's path. `mount`
/// now detaches it first.
#[test]
fn a_view_whose_daemon_was_killed_mounts_again() {
    let Some((lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let mount = || {
        rewind(
            Path::new("/"),
            &[
                "mount",
                &ws.display().to_string(),
                "--at",
                &view.display().to_string(),
            ],
        )
    };
    let out = mount();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = MountGuard { dir: view.clone() };
    // SAFETY: plain kill(2).
    assert_eq!(
        unsafe { libc::kill(m.status().pid as i32, libc::SIGKILL) },
        0
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        std::fs::read_dir(&view).is_err(),
        "the dead mount is still there"
    );
    let out = mount();
    assert!(
        out.status.success(),
        "mount again: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(view.join("d00/f00.txt").is_file());
    m.unmount();
}

/// A view whose daemon was killed stayed a dead mount (every program in
/// it failing ENOTCONN) until a command ran in the view itself; commands
/// in the workspace said nothing (helper-79). The next one there detaches
/// it and says how to serve it again.
#[test]
fn a_command_in_the_workspace_detaches_its_dead_view() {
    let Some((lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let m = mount_view(&ws, &view);
    // SAFETY: plain kill(2).
    assert_eq!(
        unsafe { libc::kill(m.status().pid as i32, libc::SIGKILL) },
        0
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(std::fs::read_dir(&view).is_err(), "a dead mount to detach");
    std::mem::forget(m);
    let out = rewind(&ws, &["status"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("had lost its daemon") && err.contains("--at"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(&view).is_ok_and(|mut d| d.next().is_none()),
        "the view is an empty directory again"
    );
    let out = rewind(&ws, &["status"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("lost its daemon"));
}

/// A command in a view whose daemon died said it would walk the tree,
/// then that the view was no workspace: there was nothing to walk. It
/// now says the view was one, and how to mount it again (helper-29,
/// D207).
#[test]
fn a_command_in_a_view_whose_daemon_died_says_it_was_a_view() {
    let Some((lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let view = lfs.mnt.join("view");
    let m = mount_view(&ws, &view);
    kill_and_reap(m.status().pid);
    let out = rewind(&view, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("was a view of a workspace elsewhere") && err.contains("--at"),
        "{err}"
    );
    assert!(!err.contains("walks the tree"), "{err}");
    // One message, not the view note and then "run `rewind init` there"
    // (helper-42, D263).
    assert!(!err.contains("rewind init"), "{err}");
    assert!(
        std::fs::read_dir(&view).is_ok(),
        "the dead mount is detached"
    );
    // The workspace itself is untouched and still answers.
    let st = rewind_json(&ws, &["status"]);
    assert!(st["changes"].to_string().contains("d00/f00.txt"), "{st}");
    drop(m);
}

/// A mount point whose path holds a newline or is not UTF-8 could not
/// be mounted: the client read the daemon's greeting as text split at
/// newlines, so the mount point it named never matched (helper-29,
/// D207). Both now mount, checkpoint through the dirty set, and unmount.
#[test]
fn a_workspace_whose_path_holds_a_newline_or_no_utf8_mounts() {
    use std::os::unix::ffi::OsStrExt;
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    if !common::is_root() || !Path::new("/dev/fuse").exists() {
        return;
    }
    let run = |dir: &Path, args: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(dir)
            .args(args)
            .output()
            .expect("run rewind")
    };
    for name in [&b"a\nb"[..], b"caf\xe9"] {
        let ws = lfs.mnt.join(std::ffi::OsStr::from_bytes(name));
        write(&ws.join("d/f.txt"), b"one\n");
        let init = run(&ws, &["init".as_ref(), "-q".as_ref()]);
        assert!(init.status.success(), "{init:?}");
        let out = run(Path::new("/"), &["mount".as_ref(), ws.as_os_str()]);
        assert!(out.status.success(), "mount {ws:?}: {out:?}");
        let m = MountGuard { dir: ws.clone() };
        write(&ws.join("d/f.txt"), b"two\n");
        let ck = run(
            &ws,
            &["--json".as_ref(), "checkpoint".as_ref(), "two".as_ref()],
        );
        let ck: serde_json::Value = serde_json::from_slice(&ck.stdout).expect("checkpoint json");
        assert_eq!(ck["engine"], "fuse", "{ws:?}: {ck}");
        assert!(
            ck["entries"].as_u64().is_some_and(|n| n < 4),
            "{ws:?}: {ck}"
        );
        let out = run(Path::new("/"), &["unmount".as_ref(), ws.as_os_str()]);
        assert!(out.status.success(), "unmount {ws:?}: {out:?}");
        std::mem::forget(m);
        // The mount hides `.rewind/`: seen again, it is gone.
        assert!(ws.join(".rewind").is_dir(), "{ws:?} is unmounted");
    }
}

/// helper-79: without `XDG_RUNTIME_DIR` a user's sockets live in
/// `/tmp/rewind-UID`, which anyone can make first; its maker then put a
/// listener at a workspace's command socket and received the user's
/// command, cwd and terminal. A client now sends nothing to a listener
/// that is neither this user nor root, and says why.
#[test]
fn a_command_is_never_handed_to_another_users_listener() {
    use std::os::unix::fs::PermissionsExt;
    let Some((lfs, ws)) = workspace(1, 2) else {
        return;
    };
    common::give_to_nobody(&ws);
    let bin = env!("CARGO_BIN_EXE_rewind");
    // The runtime directory, made by `daemon` (uid 1) and open to all.
    let xdg = lfs.subdir("xdg");
    let rt = xdg.join("rewind");
    std::fs::create_dir(&rt).expect("mkdir");
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let st = Command::new("chown").args(["daemon:"]).arg(&rt).status();
    assert!(st.is_ok_and(|s| s.success()), "chown daemon");
    // The command socket's name: FNV-1a of the workspace's path.
    let root = ws.canonicalize().expect("canonical");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in root.as_os_str().as_encoded_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let sock = rt.join(format!("{h:016x}.cmd"));
    let got = lfs.mnt.join("got");
    let listener = r#"import socket, os, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(1)
s.settimeout(20); c, _ = s.accept(); c.settimeout(2)
n = 0
try:
    while True:
        b = c.recv(65536)
        if not b: break
        n += len(b)
except Exception: pass
open(sys.argv[2], "w").write(str(n))"#;
    let mut evil = Command::new("runuser")
        .args(["-u", "daemon", "--", "python3", "-c", listener])
        .arg(&sock)
        .arg(&got)
        .spawn()
        .expect("listener");
    std::fs::set_permissions(&lfs.mnt, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let t = std::time::Instant::now();
    while !sock.exists() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = as_user(
        "nobody",
        &ws,
        &format!("XDG_RUNTIME_DIR='{}' '{bin}' status", xdg.display()),
    );
    let _ = evil.wait();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is served by uid 1, neither this user nor root"),
        "{err}"
    );
    let received = std::fs::read_to_string(&got).expect("the listener's count");
    assert_eq!(received, "0", "the listener received the command");
}

/// The README's `sudo rewind mount .` on a project with no history was
/// refused with "not a rewind workspace" (helper-77): a mount makes the
/// directory a workspace, as a first checkpoint does, and says so; one
/// too broad to be a workspace on its own is still refused.
#[test]
fn a_mount_makes_a_fresh_project_a_workspace_as_a_first_checkpoint_does() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.subdir("fresh");
    write(&ws.join("src/main.rs"), b"fn main() {}\n");
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("src/main.rs"), b"fn main() { broken }\n");
    let ck = rewind_json(&ws, &["checkpoint", "after"]);
    assert_eq!(ck["engine"], "fuse", "{ck}");
    let listed = rewind_json(&ws, &["list"]);
    assert_eq!(listed["total"], 1, "{listed}");
    drop(m);
    assert!(ws.join(".rewind/ledger.db").is_file());
    // Said, in both forms.
    let other = lfs.subdir("other");
    write(&other.join("a"), b"a");
    let out = rewind(
        Path::new("/"),
        &["--json", "mount", other.to_str().expect("utf8")],
    );
    assert!(out.status.success(), "{out:?}");
    let _m = MountGuard { dir: other.clone() };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("mount JSON");
    assert_eq!(v["initialized"], true, "{v}");
    // A sticky world-writable directory is not made one by a mount.
    let tmpish = lfs.subdir("shared");
    chmod(&tmpish, 0o1777);
    let out = rewind(Path::new("/"), &["mount", tmpish.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a mount does not make it a workspace"),
        "{err}"
    );
    assert!(!tmpish.join(".rewind").exists());
}

/// `sudo rewind mount .` over a user's workspace locked that user out:
/// without `allow_other` only root could reach the mount point. The mount
/// over the workspace itself now lets everyone in under the usual
/// permission checks, and that user's rewind commands, which cannot reach
/// root's daemon, say so instead of "not a workspace". What root's
/// rewind restores is the user's again (D147).
#[test]
fn a_mount_made_by_root_leaves_the_workspace_usable_by_its_owner() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    common::give_to_nobody(&ws);
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let nobody = |cmd: &str| {
        Command::new("su")
            .args(["-s", "/bin/sh", "nobody", "-c", cmd])
            .current_dir("/")
            .output()
            .expect("su")
    };
    let file = ws.join("d00/f00.txt");
    let out = nobody(&format!(
        "echo more >> '{f}' && cat '{f}'",
        f = file.display()
    ));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"dir 0 file 0\nmore\n");
    // Root's rewind, run by the daemon, gives the user their files back
    // (D147): the restored file was root's, and the user's next `>>`
    // failed.
    let base = common::checkpoint_id(&ws, &["base"]);
    let out = nobody(&format!("rm -r '{}'", ws.join("d00").display()));
    assert!(out.status.success(), "{out:?}");
    let out = rewind(&ws, &["rewind", &base, "-q"]);
    assert!(out.status.success(), "{out:?}");
    let out = nobody(&format!(
        "echo again >> '{f}' && cat '{f}'",
        f = file.display()
    ));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"dir 0 file 0\nmore\nagain\n");
    m.unmount();
    // The claim, the log and the lock root's mount made in the user's
    // history are the user's (D148): their own mount later could not
    // open them.
    for name in ["mount", "mount.log", "lock"] {
        let m = std::fs::metadata(ws.join(".rewind").join(name)).expect("stat");
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&m),
            65534,
            ".rewind/{name}"
        );
    }
    let out = nobody(&format!(
        "cd '{}' && exec '{}' checkpoint -q",
        ws.display(),
        env!("CARGO_BIN_EXE_rewind")
    ));
    assert!(out.status.success(), "{out:?}");
}

/// As `user` (with `su`), run the shell `script` in `dir`.
fn as_user(user: &str, dir: &Path, script: &str) -> std::process::Output {
    Command::new("su")
        .args(["-s", "/bin/sh", user, "-c"])
        .arg(format!("cd '{}' && {script}", dir.display()))
        .current_dir("/")
        .output()
        .expect("su")
}

/// Root's `rewind mcp` processes started for an owner confined to `ws`.
fn confined_mcp_servers(ws: &Path) -> Vec<u32> {
    let want = format!("REWIND_CONFINE={}", ws.display()).into_bytes();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want))
        })
        .collect()
}

/// The owner of a workspace in root's mount runs rewind as usual, their
/// agent's `rewind mcp` included: through a door only they may open,
/// into root's command server, confined to that workspace (D151). Before,
/// every command of theirs said "mounted by another user", so an agent
/// running as the user could not checkpoint or rewind at all. Root does
/// not write a file elsewhere, open another workspace or restore setuid
/// bits for them; another user still gets the old answer.
#[test]
fn the_owner_runs_rewind_in_roots_mount_through_its_door() {
    let Some((lfs, ws)) = workspace(1, 2) else {
        return;
    };
    common::give_to_nobody(&ws);
    // A workspace of root's beside it, which the owner's commands must not
    // reach through root's server.
    let other = lfs.subdir("roots");
    write(&other.join("secret.txt"), b"root's\n");
    let before = common::checkpoint_id(&other, &["root-base"]);
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_rewind");
    let nobody = |script: &str| as_user("nobody", &ws, script);

    let out = nobody(&format!(
        "'{bin}' checkpoint base -q && echo broken > d00/f00.txt && rm d00/f01.txt && '{bin}' status"
    ));
    assert!(out.status.success(), "{out:?}");
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("M d00/f00.txt") && status.contains("D d00/f01.txt"),
        "{status}"
    );
    let out = nobody(&format!(
        "'{bin}' rewind base -q && cat d00/f00.txt d00/f01.txt && '{bin}' undo -q && cat d00/f00.txt"
    ));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"dir 0 file 0\ndir 0 file 1\nbroken\n");
    // What root restored for them is theirs (D147).
    let out = nobody(&format!(
        "'{bin}' rewind base -q && echo more >> d00/f01.txt"
    ));
    assert!(out.status.success(), "{out:?}");

    // Refused, naming the workspace and the fix, nothing written.
    for (cmd, says) in [
        (
            "anchor /tmp/rewind-owner-anchor",
            "`anchor FILE` would write FILE as root",
        ),
        ("verify --anchor /etc/shadow", "would read FILE as root"),
        ("rewind base --allow-setuid", "setuid"),
    ] {
        let out = nobody(&format!("'{bin}' --json {cmd}"));
        assert_eq!(out.status.code(), Some(1), "{cmd}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "ROOT_ONLY", "{cmd}");
        let msg = v["error"]["message"].as_str().expect("message");
        assert!(
            msg.contains(says) && msg.contains(&*ws.to_string_lossy()),
            "{cmd}: {msg}"
        );
    }
    assert!(!Path::new("/tmp/rewind-owner-anchor").exists());
    // A hook whose payload names root's other workspace: root's server
    // would have checkpointed it.
    let payload =
        serde_json::json!({"tool_name": "Bash", "tool_input": {"command": "ls"}, "cwd": other});
    let out = nobody(&format!(
        "echo '{payload}' | '{bin}' --json hook pre-tool-use"
    ));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("hook json");
    assert!(v["checkpoint"].is_null(), "{v}");
    assert!(
        v["warning"].as_str().is_some_and(
            |w| w.contains("the only one root's mount there runs commands in for its owner")
        ),
        "{v}"
    );
    let list = rewind_json(&other, &["list"]);
    assert_eq!(
        list["checkpoints"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
    assert_eq!(list["head"], before);

    // Their agent's MCP server: a real session over stdio.
    let mut mcp = Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c"])
        .arg(format!("cd '{}' && exec '{bin}' mcp", ws.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mcp");
    let mut stdin = mcp.stdin.take().expect("stdin");
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(mcp.stdout.take().expect("stdout")));
    for msg in [
        serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}),
        serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        serde_json::json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"checkpoint","arguments":{"label":"by-the-agent"}}}),
    ] {
        writeln!(stdin, "{msg}").expect("write");
    }
    let answer = lines
        .by_ref()
        .map(|l| serde_json::from_str::<serde_json::Value>(&l.expect("line")).expect("json"))
        .find(|v| v["id"] == 2)
        .expect("an answer to the checkpoint call");
    assert_eq!(
        answer["result"]["isError"],
        serde_json::json!(false),
        "{answer}"
    );
    assert_eq!(
        answer["result"]["structuredContent"]["label"], "by-the-agent",
        "{answer}"
    );
    let servers = confined_mcp_servers(&ws);
    assert_eq!(servers.len(), 1, "root's MCP server for the owner");
    // The agent goes away without closing stdin: root's server goes too.
    let client = Command::new("pgrep")
        .args(["-u", "nobody", "-f", &format!("{bin} mcp")])
        .output()
        .expect("pgrep");
    let pid = String::from_utf8_lossy(&client.stdout).trim().to_string();
    assert!(!pid.is_empty(), "the owner's client");
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let _ = mcp.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !confined_mcp_servers(&ws).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        confined_mcp_servers(&ws),
        Vec::<u32>::new(),
        "killed with its client"
    );
    drop(stdin);
    let list = rewind_json(&ws, &["list"]);
    assert!(
        list["checkpoints"]
            .as_array()
            .expect("list")
            .iter()
            .any(|c| c["label"] == "by-the-agent"),
        "{list}"
    );

    // A client that connects and says nothing does not hold root's server
    // (D160): every later command hung behind it.
    let silent = std::os::unix::net::UnixStream::connect(rewind_fuse::command_socket_path(&ws))
        .expect("connect");
    let out = Command::new("timeout")
        .args(["20", "su", "-s", "/bin/sh", "nobody", "-c"])
        .arg(format!("cd '{}' && exec '{bin}' status", ws.display()))
        .output()
        .expect("su");
    assert!(out.status.success(), "{out:?}");
    drop(silent);
    // The owner's command kept in its own process says why.
    let out = nobody(&format!("REWIND_TRACE=1 '{bin}' status"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("could not be handed to its command server"),
        "{err}"
    );
    // Anyone else: no door for them.
    let out = as_user("daemon", &ws, &format!("exec '{bin}' status"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("mounted with `rewind mount` by another user"),
        "{err}"
    );
    m.unmount();
    assert!(
        !rewind_fuse::door_path(&ws).exists(),
        "the door goes with the mount"
    );
}

/// In root's mount over a user's workspace, what the user makes is
/// theirs, with the mode their umask gives: the daemon made everything
/// as root (the user's `mkdir -p` failed one level down, their `>>` to a
/// file they had just made failed) and its own umask cut the mode again.
/// In a setgid directory the group is the directory's, and a new
/// directory inherits the setgid bit (D139).
#[test]
fn entries_a_user_makes_in_roots_mount_are_theirs_with_their_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    common::give_to_nobody(&ws);
    std::fs::create_dir(ws.join("shared")).expect("mkdir");
    std::os::unix::fs::chown(ws.join("shared"), Some(65534), Some(100)).expect("chown");
    std::fs::set_permissions(ws.join("shared"), std::fs::Permissions::from_mode(0o2775))
        .expect("chmod");
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let script = "umask 002 && mkdir -p new/a/b && echo hi > new/a/b/f && echo more >> new/a/b/f \
         && ln -s f new/a/b/l && mkfifo new/p && mkdir shared/d && echo x > shared/g";
    let out = Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c", script])
        .current_dir(&ws)
        .output()
        .expect("su");
    assert!(out.status.success(), "{out:?}");
    let nobody = std::fs::metadata(&ws).expect("stat").uid();
    let nogroup = std::fs::metadata(&ws).expect("stat").gid();
    for (path, mode, gid) in [
        ("new", 0o775, nogroup),
        ("new/a/b", 0o775, nogroup),
        ("new/a/b/f", 0o664, nogroup),
        ("new/a/b/l", 0o777, nogroup),
        ("new/p", 0o664, nogroup),
        ("shared/d", 0o2775, 100),
        ("shared/g", 0o664, 100),
    ] {
        let md = std::fs::symlink_metadata(ws.join(path)).expect("stat");
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (nobody, gid, mode),
            "{path}: owner, group, mode"
        );
    }
    assert_eq!(
        std::fs::read(ws.join("new/a/b/f")).expect("read"),
        b"hi\nmore\n"
    );
    m.unmount();
    let md = std::fs::metadata(ws.join("new/a/b/f")).expect("stat");
    assert_eq!(md.uid(), nobody, "still the user's after unmount");
}

#[test]
fn a_rewind_killed_while_the_mount_is_frozen_leaves_it_usable_and_is_finished() {
    let Some((_lfs, ws)) = workspace(5, 5) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let a = common::checkpoint_id(&ws, &["A"]);
    let want = snapshot(&ws);
    for point in [
        "rewind:captured",
        "rewind:after-intent",
        "apply:file-written:2",
        "rewind:before-commit",
    ] {
        for d in 0..5 {
            std::fs::write(
                ws.join(format!("d{d:02}/f00.txt")),
                format!("diverged {point}\n"),
            )
            .expect("write");
        }
        write(&ws.join("new-file"), b"new\n");
        let out = rewind_env(&ws, &["rewind", &a], &[("REWIND_FAILPOINT", point)]);
        assert_eq!(out.status.code(), None, "{point}: the rewind was killed");
        // The daemon sees the connection drop and thaws the mount.
        let t = std::time::Instant::now();
        while m.status().frozen {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "{point}: the mount stayed frozen"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = std::fs::read_dir(&ws).expect("the mount answers").count();
        // The next command finishes (or redoes) the rewind.
        let st = rewind_json(&ws, &["status"]);
        let recovered = st["changes"] == serde_json::json!([]);
        if !recovered {
            // Killed before the intent: nothing happened; rewind again.
            assert!(point == "rewind:captured", "{point}: not recovered: {st}");
            rewind_json(&ws, &["rewind", &a]);
        }
        common::assert_same(point, &want, &snapshot(&ws));
        checkpoint_matches_a_walk(&ws, point);
    }
    m.unmount();
}

#[test]
fn a_terminated_daemon_unmounts_instead_of_leaving_a_dead_mount() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("d00/through-the-mount"), b"x\n");
    let pid = m.status().pid;
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let t = std::time::Instant::now();
    // Unmounted, then the daemon removes its socket and exits.
    while !ws.join(".rewind").is_dir() || rewind_fuse::socket_path(&ws).exists() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "still mounted after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        std::fs::read(ws.join("d00/through-the-mount")).expect("read"),
        b"x\n"
    );
    let ck = rewind_json(&ws, &["checkpoint", "after"]);
    assert_eq!(ck["engine"], "walk");
    std::mem::forget(m);
}

/// The dirty set says what changed in the tree, not in the ignore rules
/// kept outside it (`.rewind/ignore`, written by `integrate`): the first
/// checkpoint under new rules walks everything, so it equals a walk.
#[test]
fn new_ignore_rules_reach_the_next_checkpoint_through_the_mount() {
    let Some((_lfs, ws)) = workspace(3, 3) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    checkpoint_matches_a_walk(&ws, "before the rules");
    std::fs::write(m.backing().join(".rewind/ignore"), "d01/\n").expect("write the rules");
    write(&ws.join("d00/f00.txt"), b"one change the daemon saw\n");
    checkpoint_matches_a_walk(&ws, "under new rules");
    let head = rewind_json(&ws, &["diff", "HEAD~1", "HEAD"]);
    assert!(
        head["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .any(|c| c["path"] == "d01/f00.txt" && c["status"] == "deleted"),
        "the newly ignored directory is still in the checkpoint: {head}"
    );
    m.unmount();
}

/// A workspace that is a btrfs subvolume keeps its ledger in
/// `.rewind/state/` (D50): the daemon finds it there, and checkpoints
/// through the mount use the dirty set.
#[test]
fn a_subvolume_workspace_mounts_and_checkpoints_through_the_mount() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 512) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    write(&ws.join("d00/f00.txt"), b"first\n");
    rewind_json(&ws, &["init"]);
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("d00/f00.txt"), b"edited through the mount\n");
    checkpoint_matches_a_walk(&ws, "subvolume");
    m.unmount();
}

/// D73: small files opened read-only are served from the kernel's page
/// cache, everything else by passthrough. Pins what keeps that correct:
/// no read serves pages that a write (through passthrough, through the
/// page cache from another handle) or a rewind made old, and an inode
/// with handles open in one mode gives every new handle that mode (the
/// kernel fails an open that would mix them with EIO).
#[test]
fn small_files_read_through_the_page_cache_never_serve_stale_pages_or_mix_modes() {
    page_cache_stays_current(true);
}

/// Without passthrough every open uses the page cache, kept across opens
/// (D73): writes from other handles and rewinds are still seen.
#[test]
fn without_passthrough_the_page_cache_kept_across_opens_stays_current() {
    page_cache_stays_current(false);
}

fn page_cache_stays_current(passthrough: bool) {
    use std::os::unix::fs::FileExt;
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let big = ws.join("big.bin");
    write(&big, &vec![7u8; 2 << 20]);
    let args: &[&str] = if passthrough {
        &[]
    } else {
        &["--no-passthrough"]
    };
    let Some(m) = MountGuard::new(&ws, args) else {
        return;
    };
    assert_eq!(m.status().passthrough, passthrough);
    let f = ws.join("d00/f00.txt");
    let page = |c: u8| vec![c; 4096];
    let read = |p: &Path| std::fs::read(p).expect("read through the mount");
    let open_rw = |p: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .expect("open for writing through the mount")
    };
    // How many opens of each mode `step` made: (passthrough, page cache).
    let opens = |step: &dyn Fn()| {
        let before = m.status();
        step();
        let after = m.status();
        (
            after.passthrough_opens - before.passthrough_opens,
            after.cached_opens - before.cached_opens,
        )
    };
    std::fs::write(&f, page(b'a')).expect("write");
    let ck = rewind_json(&ws, &["checkpoint", "a"]);
    let read_twice = || {
        assert_eq!(read(&f), page(b'a'));
        assert_eq!(read(&f), page(b'a'), "second read, from the page cache");
    };
    assert_eq!(
        opens(&read_twice),
        (0, 2),
        "a small file opened read-only uses the page cache"
    );

    // Written through another handle (passthrough when nothing else is
    // open and passthrough is on): the next read-only open must not serve
    // the pages cached above.
    let w = open_rw(&f);
    w.write_all_at(&page(b'b'), 0).expect("pwrite");
    drop(w);
    assert_eq!(
        read(&f),
        page(b'b'),
        "read after a write from another handle"
    );

    // A reader holds the file in page-cache mode: a writer opened now gets
    // that mode too (passthrough would fail with EIO), and the held reader
    // sees its write.
    let held = std::fs::File::open(&f).expect("open read-only");
    let mut got = vec![0u8; 4096];
    held.read_exact_at(&mut got, 0).expect("pread");
    assert_eq!(got, page(b'b'));
    let w = open_rw(&f);
    w.write_all_at(&page(b'c'), 0)
        .expect("pwrite beside a cached reader");
    held.read_exact_at(&mut got, 0).expect("pread");
    assert_eq!(got, page(b'c'), "the held reader sees the write");
    drop(w);
    drop(held);
    assert_eq!(read(&f), page(b'c'));

    // A writer holds the file (in passthrough mode if on): a reader opened
    // now takes the same mode, and sees what the writer wrote.
    let w = open_rw(&f);
    w.write_all_at(&page(b'd'), 0).expect("pwrite");
    let read_d = || assert_eq!(read(&f), page(b'd'), "reader beside a writer");
    let expected = if passthrough { (1, 0) } else { (0, 1) };
    assert_eq!(opens(&read_d), expected, "a reader beside a writer");
    drop(w);
    assert_eq!(read(&f), page(b'd'));

    // A file over the limit keeps passthrough for reading.
    let read_big = || assert_eq!(read(&big).len(), 2 << 20);
    let expected = if passthrough { (1, 0) } else { (0, 1) };
    assert_eq!(opens(&read_big), expected, "a 2 MiB file read-only");

    // A rewind replaces the file under the cached pages.
    let id = ck["id"].as_str().expect("checkpoint id");
    let out = rewind(&ws, &["rewind", id]);
    assert!(
        out.status.success(),
        "rewind: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&f), page(b'a'), "read after the rewind");
    m.unmount();
    assert_eq!(std::fs::read(&f).expect("read natively"), page(b'a'));
}

/// D73 under concurrency: readers (page cache) and writers (passthrough,
/// or the page cache beside readers) of one small file open, use and
/// close it at once from several threads. The daemon's per-mode counts
/// run ahead of the kernel's (a handle is counted from the answer to its
/// open until its release arrives), so no open may fail with EIO for
/// mixing modes; every read returns bytes some write wrote (a read during
/// a write may see part of it, as natively on ext4 and btrfs); and once
/// the writers are done, a new read sees the last write whole.
#[test]
fn concurrent_readers_and_writers_of_a_small_file_never_see_eio_or_stale_pages() {
    use std::os::unix::fs::FileExt;
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let f = ws.join("d00/f00.txt");
    std::fs::write(&f, vec![b'a'; 4096]).expect("write");
    let stop = Arc::new(AtomicBool::new(false));
    let opens = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..6u8 {
        let (f, stop, opens) = (f.clone(), Arc::clone(&stop), Arc::clone(&opens));
        threads.push(std::thread::spawn(move || -> Result<(), String> {
            let writer = t < 2;
            let mut page = vec![0u8; 4096];
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Short, uneven pauses between opens leave moments when
                // only readers or only writers hold the file, so both
                // modes come into use (without them one mode can hold the
                // inode for the whole run).
                round += 1;
                std::thread::sleep(std::time::Duration::from_micros(
                    50 * ((round + u64::from(t)) % 5),
                ));
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(writer)
                    .open(&f)
                    .map_err(|e| format!("thread {t}: open (writer: {writer}): {e}"))?;
                opens.fetch_add(1, Ordering::Relaxed);
                if writer {
                    file.write_all_at(&vec![b'b' + t; 4096], 0)
                        .map_err(|e| format!("thread {t}: write: {e}"))?;
                } else {
                    file.read_exact_at(&mut page, 0)
                        .map_err(|e| format!("thread {t}: read: {e}"))?;
                    if let Some(c) = page.iter().find(|&&c| !(b'a'..=b'c').contains(&c)) {
                        return Err(format!("thread {t}: read a byte nobody wrote: {c}"));
                    }
                }
            }
            Ok(())
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let st = m.status();
        if st.cached_opens > 0 && st.passthrough_opens > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .expect("thread")
            .expect("no open, read or write failed");
    }
    let st = m.status();
    assert!(
        opens.load(Ordering::Relaxed) > 100,
        "the threads ran: {} opens",
        opens.load(Ordering::Relaxed)
    );
    assert!(
        st.cached_opens > 0 && st.passthrough_opens > 0,
        "both modes were used: {st:?}"
    );
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .expect("open for the last write");
    w.write_all_at(&[b'z'; 4096], 0).expect("last write");
    drop(w);
    assert_eq!(
        std::fs::read(&f).expect("read after the writers"),
        vec![b'z'; 4096],
        "a read after the last write"
    );
    m.unmount();
}

/// The pid written into `.rewind/lock` by the last command that locked
/// the workspace.
fn lock_holder(m: &MountGuard) -> u32 {
    let text = std::fs::read_to_string(m.backing().join(".rewind/lock")).expect("read the lock");
    text.trim().parse().expect("a pid in the lock file")
}

/// SIGKILL process `pid` and wait (10 s at most) until it is gone,
/// reaped by whoever is its parent.
fn kill_and_reap(pid: u32) {
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while proc.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!proc.exists(), "process {pid} is gone");
}

fn is_command_server(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"serve-commands"))
}

const IN_PROCESS: &[(&str, &str)] = &[("REWIND_IN_PROCESS", "1")];

/// Waits for the command server to take a command again (it comes back
/// after a kill, D93), running checkpoints meanwhile.
fn server_pid_after_a_checkpoint(m: &MountGuard, ws: &Path) -> u32 {
    for _ in 0..100 {
        common::checkpoint_id(ws, &[]);
        let pid = lock_holder(m);
        if is_command_server(pid) {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no command server took a checkpoint within 5 s");
}

/// A command server killed between binding its socket under a temporary
/// name and renaming it into place left that name in the runtime
/// directory for good. The next server sweeps those of dead processes,
/// and leaves a live one's alone (D208).
#[test]
fn a_dead_servers_temporary_socket_is_swept_by_the_next_one() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    let sock = rewind_fuse::command_socket_path(&ws);
    std::fs::create_dir_all(sock.parent().expect("runtime dir")).expect("runtime dir");
    // Above any pid_max: no process has it.
    let dead = sock.with_extension("cmd.4194399");
    let live = sock.with_extension("cmd.1");
    for p in [&dead, &live] {
        std::fs::write(p, b"").expect("plant a temporary name");
    }
    // D223: an idle lock file, at a mount point no command came back to.
    let rt = sock.parent().expect("runtime dir");
    let idle_lock = rt.join("0000000000000000.lock");
    std::fs::write(&idle_lock, b"").expect("plant a lock file");
    let Some(m) = MountGuard::new(&ws, &[]) else {
        for p in [&dead, &live, &idle_lock] {
            let _ = std::fs::remove_file(p);
        }
        return;
    };
    server_pid_after_a_checkpoint(&m, &ws);
    assert!(!dead.exists(), "a dead server's name is swept");
    assert!(live.exists(), "a live process's name is left");
    assert!(!idle_lock.exists(), "an idle lock file is swept");
    std::fs::remove_file(&live).expect("remove the planted name");
    m.unmount();
    // The daemon removes it as it exits, which may be just after its
    // answer; another test's daemon sweeping the runtime directory may
    // hold it a moment too.
    let lock = sock.with_extension("lock");
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        !lock.exists()
    });
    assert!(gone, "the mount point's lock file goes with it");
}

#[test]
fn commands_inside_a_mount_run_in_its_server_with_the_callers_streams_cwd_and_exit_code() {
    let Some((_lfs, ws)) = workspace(4, 4) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    // The server ran it: its pid took the lock, and it is still running.
    let base = common::checkpoint_id(&ws, &["base"]);
    let server = server_pid_after_a_checkpoint(&m, &ws);
    common::checkpoint_id(&ws, &["again"]);
    assert_eq!(lock_holder(&m), server, "the same server took the next one");
    let doctor = rewind_json(&ws, &["doctor"]);
    assert_eq!(
        doctor["fuse"]["command_server_pid"], server,
        "doctor names it"
    );
    // `REWIND_IN_PROCESS=1` (or any REWIND_* a verb reads) runs it here.
    let out = common::rewind_fed(&ws, &["checkpoint", "-q"], b"", IN_PROCESS);
    assert!(out.status.success());
    assert_ne!(lock_holder(&m), server, "run in its own process");

    // Output, errors and exit codes are the same either way.
    for args in [
        &["rewind", "nope", "--json"][..],
        &["diff", "nope"][..],
        &["list", "--json"][..],
        &["checkpoint", "--kind", "bogus"][..],
    ] {
        let served = common::rewind_fed(&ws, args, b"", &[]);
        let here = common::rewind_fed(&ws, args, b"", IN_PROCESS);
        assert_eq!(
            served.status.code(),
            here.status.code(),
            "{args:?}: exit code"
        );
        assert_eq!(served.stdout, here.stdout, "{args:?}: stdout");
        assert_eq!(served.stderr, here.stderr, "{args:?}: stderr");
    }

    // The working directory: a relative path names the caller's file.
    write(&ws.join("d01/f01.txt"), b"damaged\n");
    let out = common::rewind_fed(
        &ws.join("d01"),
        &["restore", &base, "--", "f01.txt"],
        b"",
        &[],
    );
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(ws.join("d01/f01.txt")).expect("read"),
        b"dir 1 file 1\n"
    );
    assert_eq!(lock_holder(&m), server, "the server restored it");

    // Standard input: a hook's payload reaches the verb, whose checkpoint
    // takes the edit made before it.
    write(&ws.join("d02/new.txt"), b"before the tool call\n");
    let payload = serde_json::json!({
        "session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": "rm -rf d02"}, "cwd": ws.display().to_string(),
    });
    let out = common::rewind_fed(
        &ws,
        &["hook", "pre-tool-use"],
        payload.to_string().as_bytes(),
        &[],
    );
    assert!(
        out.status.success(),
        "hook: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lock_holder(&m), server, "the server ran the hook");
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(
        st["changes"],
        serde_json::json!([]),
        "the hook checkpointed"
    );
    m.unmount();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while is_command_server(server) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!is_command_server(server), "the server ends with the mount");
}

#[test]
fn a_command_whose_client_is_killed_dies_with_it_and_the_server_comes_back() {
    let Some((_lfs, ws)) = workspace(4, 4) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let server = server_pid_after_a_checkpoint(&m, &ws);
    // A hook waiting for its payload keeps the server busy.
    let mut client = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["hook", "pre-tool-use"])
        .current_dir(&ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the hook");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(client.try_wait().expect("poll").is_none(), "the hook waits");
    // Busy: the next command runs in its own process at once, not queued.
    write(&ws.join("d00/while-busy.txt"), b"x\n");
    let started = std::time::Instant::now();
    common::checkpoint_id(&ws, &["while-busy"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let holder = lock_holder(&m);
    assert!(
        holder != server && !is_command_server(holder),
        "the busy server did not take it"
    );

    // Held open past the kill: `wait` would close it, and a payload's
    // end would let the command finish first.
    let payload = client.stdin.take();
    client.kill().expect("kill the client");
    let _ = client.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while is_command_server(server) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !is_command_server(server),
        "the server died with its client's command"
    );
    drop(payload);
    let next = server_pid_after_a_checkpoint(&m, &ws);
    assert_ne!(next, server, "a new server");
    let v = common::rewind(&ws, &["verify"]);
    assert!(v.status.success(), "verify after the kill");
    m.unmount();
}

/// D204: `rewind unmount` answered by the daemon's exit (EOF) now reads
/// as a daemon gone (D194), and a connect refused by a daemon's stale
/// socket always did; either detached "its dead mount". With the FUSE
/// mount already gone, that lazily unmounted what was under it: here the
/// workspace's own filesystem. Only rewind's own mount is detached.
#[test]
fn unmounting_a_workspace_that_is_a_mount_point_keeps_its_filesystem() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.mnt.clone();
    write(&ws.join("kept.txt"), b"kept\n");
    let out = rewind(&ws, &["init", "-q"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for round in 0..5 {
        let Some(m) = MountGuard::new(&ws, &[]) else {
            return;
        };
        write(&ws.join(format!("r{round}.txt")), b"x\n");
        m.unmount();
        let top = rewind_platform::mount_at(&ws).map(|(kind, _)| kind);
        assert_eq!(
            top.as_deref(),
            Some(b"xfs".as_slice()),
            "round {round}: the filesystem was detached"
        );
        assert_eq!(std::fs::read(ws.join("kept.txt")).expect("kept"), b"kept\n");
    }
    // A daemon that unmounted and died before removing its socket: the
    // next command's connect is refused, which means "gone, detach it".
    let sock = rewind_fuse::socket_path(&ws);
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("a stale socket"));
    let out = rewind(&ws, &["--json", "status"]);
    let top = rewind_platform::mount_at(&ws).map(|(kind, _)| kind);
    assert_eq!(
        top.as_deref(),
        Some(b"xfs".as_slice()),
        "a stale socket detached the filesystem"
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sock.exists(), "the stale socket is cleared");
}

/// D194: a command the server accepted runs to its end when the daemon
/// dies under it. The server died with its daemon (SIGKILL by
/// `PR_SET_PDEATHSIG`) and the command failed as "stopped while running
/// this command", though nothing had stopped it (CI, stop 33). It now
/// finishes, walking the tree, and the server exits after it.
#[test]
fn a_command_the_server_accepted_finishes_when_the_daemon_dies() {
    let Some((_lfs, ws)) = workspace(4, 4) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let server = server_pid_after_a_checkpoint(&m, &ws);
    let backing = m.backing();
    write(&ws.join("d01/before-the-tool.txt"), b"kept\n");
    // A hook waiting for its payload: accepted, and running.
    let mut client = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["--json", "hook", "pre-tool-use"])
        .current_dir(&ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the hook");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(client.try_wait().expect("poll").is_none(), "the hook waits");
    assert_eq!(lock_holder(&m), server, "the server runs the hook");
    kill_and_reap(m.status().pid);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(is_command_server(server), "the server still runs the hook");

    let payload = serde_json::json!({
        "session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": "rm -rf d01"}, "cwd": ws.display().to_string(),
    });
    let mut stdin = client.stdin.take().expect("stdin");
    stdin
        .write_all(payload.to_string().as_bytes())
        .expect("send the payload");
    drop(stdin);
    let out = client.wait_with_output().expect("the hook ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hook: {stderr}");
    assert!(stderr.contains("had died"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("hook json");
    let id = v["checkpoint"]
        .as_str()
        .expect("the hook checkpointed")
        .to_string();

    // The server ends after the command, releasing what the daemon left.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while is_command_server(server) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!is_command_server(server), "the server exits after it");
    assert!(
        !backing.exists(),
        "the bind of the backing tree is released"
    );
    // And its socket, which the command clearing the dead mount saw
    // still listening, and left (D223).
    assert!(
        !rewind_fuse::command_socket_path(&ws).exists(),
        "the server's socket goes with it"
    );
    std::mem::forget(m); // nothing left to unmount

    // HEAD is the hook's checkpoint and equals the tree, which holds the
    // edit made before the hook.
    assert_eq!(rewind_json(&ws, &["list"])["head"], id.as_str());
    assert_eq!(
        rewind_json(&ws, &["status"])["changes"],
        serde_json::json!([])
    );
    assert_eq!(
        std::fs::read(ws.join("d01/before-the-tool.txt")).expect("the edit"),
        b"kept\n"
    );
    let v = common::rewind(&ws, &["verify"]);
    assert!(v.status.success(), "verify");
}

/// D206: a request already in flight when the daemon dies fails
/// ECONNABORTED, not ENOTCONN. A hook whose read of `rewind.toml` was
/// caught so failed closed and refused the agent's call (helper-29, every
/// time); it now detaches the dead mount and goes on.
#[test]
fn a_hook_caught_in_flight_by_a_daemon_kill_goes_on() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    common::checkpoint_id(&ws, &["base"]);
    write(&ws.join("d00/edit.txt"), b"before the tool\n");
    let daemon = m.status().pid;
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(daemon as i32, libc::SIGSTOP) }, 0);
    let payload = serde_json::json!({
        "session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": "ls"}, "cwd": ws.display().to_string(),
    });
    // Started outside the mount: its working directory would wait too.
    let mut hook = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["--json", "hook", "pre-tool-use"])
        .current_dir(ws.parent().expect("parent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the hook");
    hook.stdin
        .take()
        .expect("stdin")
        .write_all(payload.to_string().as_bytes())
        .expect("payload");
    std::thread::sleep(std::time::Duration::from_millis(800));
    // SAFETY: plain kill(2).
    unsafe {
        libc::kill(daemon as i32, libc::SIGKILL);
        libc::kill(daemon as i32, libc::SIGCONT);
    }
    let out = hook.wait_with_output().expect("the hook ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the call was refused: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("hook json");
    assert!(v["checkpoint"].is_string(), "{v}");
    std::mem::forget(m); // nothing left to unmount
    assert_eq!(
        rewind_json(&ws, &["status"])["changes"],
        serde_json::json!([])
    );
    assert!(common::rewind(&ws, &["verify"]).status.success());
}

/// D205: a command that finds its daemon dead after a new `rewind mount`
/// of the same path leaves the new mount alone. It detached "the dead
/// mount" at the path, which was the new one, and released the new
/// daemon's bind of the backing tree when it ended. The failpoint stops
/// the command right after it connected to the first daemon.
#[test]
fn a_command_whose_daemon_died_leaves_a_new_mount_alone() {
    let Some((_lfs, ws)) = workspace(4, 4) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    write(&ws.join("d00/before.txt"), b"before the kill\n");
    let child =
        common::spawn_stopped_at(&ws, &["--json", "checkpoint", "across"], "mount:connected");
    let daemon = m.status().pid;
    kill_and_reap(daemon);
    std::mem::forget(m);
    let again = MountGuard::new(&ws, &[]).expect("mount again over the dead one");
    let new_daemon = again.status().pid;
    assert_ne!(new_daemon, daemon);
    common::resume(&child);
    let out = child.wait_with_output().expect("the checkpoint ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "checkpoint: {stderr}");
    assert!(stderr.contains("another one serves it now"), "{stderr}");
    // The new mount still serves, through its own daemon and backing.
    assert_eq!(again.status().pid, new_daemon, "the new daemon serves");
    write(&ws.join("d00/after.txt"), b"through the new mount\n");
    let ck = rewind_json(&ws, &["checkpoint", "after"]);
    assert_eq!(ck["engine"], "fuse", "{ck}");
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
    again.unmount();
    assert_eq!(
        std::fs::read(ws.join("d00/before.txt")).expect("before"),
        b"before the kill\n"
    );
}

/// D205 checked for a new daemon before detaching a dead one, but a
/// `rewind mount` of the path between that check and the detach had its
/// live mount detached and its sockets removed. D209 detached only a
/// dead mount (`statfs`) and removed only dead sockets, which left the
/// moment between that check and the detach (helper-32). Now a command
/// holds the mount point's lock from the check to the detach, and a
/// daemon holds it from its own check to its mount (D222): a `rewind
/// mount` made while a command clears the dead mount waits for it, then
/// mounts. The command stops inside the lock (failpoint
/// `mount:found-dead`); the mount must not happen until it goes on.
#[test]
fn a_mount_made_while_a_command_clears_the_dead_one_waits_and_survives() {
    let Some((_lfs, ws)) = workspace(4, 4) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let daemon = m.status().pid;
    kill_and_reap(daemon);
    std::mem::forget(m);
    let child =
        common::spawn_stopped_at(&ws, &["--json", "checkpoint", "across"], "mount:found-dead");
    let mut mount = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["mount", &ws.display().to_string()])
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the mount");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let waited = mount.try_wait().expect("poll the mount").is_none();
    common::resume(&child);
    let out = child.wait_with_output().expect("the checkpoint ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "checkpoint: {stderr}");
    let mounted = mount.wait_with_output().expect("the mount ends");
    assert!(
        mounted.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&mounted.stderr)
    );
    let again = MountGuard { dir: ws.clone() };
    assert!(
        waited,
        "the mount waited for the command clearing the dead one"
    );
    let new_daemon = again.status().pid;
    assert_ne!(new_daemon, daemon);
    assert!(
        !ws.join(".rewind").exists(),
        "the new mount is there and hides the history"
    );
    write(&ws.join("d00/after.txt"), b"through the new mount\n");
    let ck = rewind_json(&ws, &["checkpoint", "after"]);
    assert_eq!(ck["engine"], "fuse", "{ck}");
    assert_eq!(again.status().pid, new_daemon, "the new daemon serves");
    again.unmount();
}

/// D221: through a mount, a rewind whose apply failed was "rolled back"
/// by a capture scoped by the daemon's dirty set, which never sees the
/// apply's writes (they go to the backing tree): it planned nothing, and
/// the tree stayed half rewound under a message saying it was as before
/// (helper-32). Its captures now walk the whole tree.
#[test]
fn a_rewind_rolled_back_through_the_mount_leaves_the_tree_as_it_was() {
    let Some((_lfs, ws)) = workspace(0, 0) else {
        return;
    };
    for i in 1..=10 {
        write(&ws.join(format!("d/f{i}")), format!("a{i}\n").as_bytes());
        write(&ws.join(format!("e/f{i}")), format!("a{i}\n").as_bytes());
    }
    let a = common::checkpoint_id(&ws, &["A"]);
    for i in 1..=10 {
        write(&ws.join(format!("d/f{i}")), format!("b{i}\n").as_bytes());
        write(&ws.join(format!("e/f{i}")), format!("b{i}\n").as_bytes());
    }
    write(&ws.join("notes.txt"), b"mine\n");
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let blocked = rewind_fuse::backing_path(&ws).join("e/f5");
    let chattr = |flag: &str| {
        let ok = Command::new("chattr")
            .arg(flag)
            .arg(&blocked)
            .status()
            .expect("chattr");
        assert!(ok.success(), "chattr {flag}");
    };
    chattr("+i");
    let out = rewind(&ws, &["--json", "rewind", &a]);
    chattr("-i");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "ROLLED_BACK", "{v}");
    // D272: the file is named where the user knows it, not under the
    // daemon's private path to the backing tree (helper-47).
    let message = v["error"]["message"].as_str().unwrap_or_default();
    let named = ws.join("e/f5");
    assert!(
        message.contains(&*named.to_string_lossy()) && !message.contains("/run/rewind/"),
        "{v}"
    );
    assert_eq!(std::fs::read(ws.join("d/f1")).expect("d/f1"), b"b1\n");
    assert_eq!(
        std::fs::read(ws.join("notes.txt")).expect("notes"),
        b"mine\n"
    );
    let st = rewind_env(&ws, &["--json", "status"], &[("REWIND_ENGINE", "walk")]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
    m.unmount();
}

#[test]
fn a_replaced_binary_takes_over_from_the_server_it_replaced() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    if !common::is_root() {
        return;
    }
    let dir = common::tmp();
    let bin = dir.path().join("rewind");
    // Copied by `cp`: a file this process held open for writing would be
    // inherited by whatever another test forks meanwhile, and running it
    // would fail ETXTBSY while that child lives.
    let cp = Command::new("cp")
        .arg(env!("CARGO_BIN_EXE_rewind"))
        .arg(&bin)
        .status()
        .expect("run cp");
    assert!(cp.success(), "copy the binary");
    let run = |args: &[&str], cwd: &Path| {
        let out = Command::new(&bin)
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("run the copy");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ws_arg = ws.display().to_string();
    run(&["mount", &ws_arg], Path::new("/"));
    let m = MountGuard { dir: ws.clone() };
    // The pid of a server running the binary now at `bin`.
    let served = || {
        for _ in 0..100 {
            run(&["checkpoint", "-q"], &ws);
            let pid = lock_holder(&m);
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let deleted = exe.to_string_lossy().ends_with("(deleted)");
            if is_command_server(pid) && !deleted {
                return pid;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no command server took the checkpoint");
    };
    let old = served();
    // An upgrade: a new file at the same path.
    let staged = dir.path().join("rewind.new");
    std::fs::copy(&bin, &staged).expect("stage the new binary");
    std::fs::rename(&staged, &bin).expect("replace the binary");
    let new = served();
    assert_ne!(new, old, "the old server made way for the new binary");
    assert!(!is_command_server(old), "the old server is gone");
    run(&["unmount", &ws_arg], Path::new("/"));
    std::mem::forget(m);
}

/// A refused `rewind --json ARGS`: its error code and message.
fn refused(args: &[&str]) -> (String, String) {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = rewind(Path::new("/"), &a);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} is refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("error json");
    (
        v["error"]["code"].as_str().unwrap_or_default().to_string(),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// A daemon serves its workspace only while it holds the workspace's
/// claim (D98): a second mount is refused whatever path it names (a
/// second view, or the workspace itself beside a view), nothing changes,
/// and two mounts started at once end with exactly one. Before, each got
/// its own daemon, and changes through one were invisible to the other.
#[test]
fn a_workspace_is_mounted_once_whatever_the_path() {
    let Some((lfs, ws)) = workspace(2, 2) else {
        return;
    };
    if !common::is_root() || !Path::new("/dev/fuse").exists() {
        common::skip_or_fail("FUSE mounts need root and /dev/fuse");
        return;
    }
    let (view, view2) = (lfs.mnt.join("view"), lfs.mnt.join("view2"));
    let (ws_arg, view_arg, view2_arg) = (
        ws.display().to_string(),
        view.display().to_string(),
        view2.display().to_string(),
    );
    let out = rewind(Path::new("/"), &["mount", &ws_arg, "--at", &view_arg]);
    assert!(
        out.status.success(),
        "mount --at: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = MountGuard { dir: view.clone() };
    let pid = m.status().pid;
    for args in [
        vec!["mount", &ws_arg, "--at", &view2_arg],
        vec!["mount", &ws_arg],
    ] {
        let (code, msg) = refused(&args);
        assert_eq!(code, "ALREADY_MOUNTED", "{args:?}: {msg}");
        assert!(
            msg.contains(&view_arg) && msg.contains(&format!("pid {pid}")),
            "{args:?} names the mount and its daemon: {msg}"
        );
    }
    assert!(!view2.exists(), "the refused view was not even created");
    assert!(
        ws.join(".rewind").is_dir(),
        "nothing mounted over the workspace"
    );
    // The workspace knows its one mount.
    let doc = rewind_json(Path::new("/"), &["-C", &ws_arg, "doctor"]);
    assert_eq!(doc["fuse"]["mount_point"], view_arg.as_str(), "{doc}");
    assert_eq!(doc["fuse"]["daemon_pid"], pid, "{doc}");
    let out = rewind(Path::new("/"), &["unmount", &ws_arg]);
    assert!(
        out.status.success(),
        "unmount the workspace mounted as a view: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !rewind_fuse::socket_path(&view).exists(),
        "the view is gone"
    );
    std::mem::forget(m);

    // Started at once, by path and by view: one mount, one refusal.
    for round in 0..4 {
        let at: Vec<&str> = match round % 2 {
            0 => vec!["--at", &view_arg],
            _ => vec!["--at", &view2_arg],
        };
        let runs: Vec<_> = [vec![], at]
            .into_iter()
            .map(|extra| {
                let mut a = vec!["--json".to_string(), "mount".into(), ws_arg.clone()];
                a.extend(extra.iter().map(|s| s.to_string()));
                std::thread::spawn(move || {
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    rewind(Path::new("/"), &a)
                })
            })
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|t| t.join().expect("mount")).collect();
        let won: Vec<_> = outs.iter().filter(|o| o.status.success()).collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one mount: {:?}",
            outs.iter()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .collect::<Vec<_>>()
        );
        let lost = outs.iter().find(|o| !o.status.success()).expect("a loser");
        let v: serde_json::Value = serde_json::from_slice(&lost.stdout).expect("error json");
        assert_eq!(v["error"]["code"], "ALREADY_MOUNTED", "round {round}: {v}");
        let mounted: serde_json::Value = serde_json::from_slice(&won[0].stdout).expect("json");
        let mp = PathBuf::from(mounted["mounted"].as_str().expect("mount point"));
        let served = [&ws, &view, &view2]
            .iter()
            .filter(|p| rewind_fuse::socket_path(p).exists())
            .count();
        assert_eq!(served, 1, "round {round}: one daemon");
        MountGuard { dir: mp }.unmount();
    }
}

/// Runs `rewind ARGS` from `/`, killed if it has not finished within
/// `limit`: `None` then.
fn rewind_within(args: &[&str], limit: std::time::Duration) -> Option<std::process::Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(args)
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rewind");
    let t = std::time::Instant::now();
    while child.try_wait().expect("poll").is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(child.wait_with_output().expect("output"))
}

/// Sends SIGCONT to a stopped daemon when dropped, so that a failed
/// assertion leaves nothing stopped behind.
struct Resume(u32);

impl Resume {
    /// Stop the daemon `pid` (SIGSTOP) until the guard drops.
    fn after_stopping(pid: u32) -> Resume {
        // SAFETY: plain kill(2).
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Resume(pid)
    }
}

/// `doctor` run on `ws_arg` while its daemon `pid` is stopped answers
/// within `limit`, reports the silent daemon and goes on to check the
/// ledger beside it (D99).
fn doctor_reports_stopped(ws_arg: &str, pid: u32, limit: std::time::Duration) {
    let out =
        rewind_within(&["--json", "-C", ws_arg, "doctor"], limit).expect("doctor did not hang");
    assert!(
        out.status.success(),
        "doctor reports: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor json");
    assert_eq!(doc["fuse"]["daemon_answers"], false, "{doc}");
    assert_eq!(doc["fuse"]["daemon_pid"], pid, "{doc}");
    assert_eq!(doc["ledger"]["integrity"], "ok", "and goes on: {doc}");
}

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// A stopped daemon makes `unmount` fail within a few seconds, naming
/// its pid and the way out, and `doctor` report it and go on; both hung
/// for ever before (the control socket was read without a timeout).
#[test]
fn a_stopped_daemon_is_reported_not_waited_for() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let ws_arg = ws.display().to_string();
    let pid = m.status().pid;
    let resume = Resume::after_stopping(pid);
    let limit = rewind_fuse::ANSWER_TIMEOUT * 4;
    let out = rewind_within(&["unmount", &ws_arg], limit).expect("unmount did not hang");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "unmount fails: {err}");
    assert!(
        err.contains(&format!("pid {pid}")) && err.contains(&format!("kill -9 {pid}")),
        "names the daemon and the fix: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    doctor_reports_stopped(&ws_arg, pid, limit);
    drop(resume);
    m.unmount();
}

/// Run as root in a private mount namespace (`unshare -m`): makes
/// /dev/fuse usable by nobody there, then, as nobody with a PATH that
/// holds nothing, mounts the workspace `$1` at `$2` with `$3` (rewind),
/// checkpoints through it and unmounts; then hides every directory
/// `fusermount3` could be in and mounts again. Prints `FAIL: …` lines
/// and, last, `NOFM <the JSON answer>`.
const USER_MOUNT_SCRIPT: &str = r#"
set -u
ws=$1; view=$2; rw=$3; aux=$4
for b in setpriv env mount sh; do cp "$(command -v $b)" "$aux/" || { echo "FAIL: copy $b"; exit 2; }; done
# Its runtime directory its own, not /tmp/rewind-65534: /tmp may not be
# open to every user where the test runs.
mkdir -p "$aux/run" && chown 65534:65534 "$aux/run" && chmod 700 "$aux/run" || { echo "FAIL: runtime dir"; exit 2; }
user() { "$aux/setpriv" --reuid=65534 --regid=65534 --clear-groups "$aux/env" -i HOME=/nonexistent PATH=/nonexistent XDG_RUNTIME_DIR="$aux/run" "$rw" "$@"; }
echo "OVER $(user --json -C "$ws" mount 2>/dev/null)"
mknod "$aux/fuse" c 10 229 && chmod 666 "$aux/fuse" && mount --bind "$aux/fuse" /dev/fuse || { echo "FAIL: /dev/fuse"; exit 2; }
mounted() { while read -r _ _ _ _ mp _; do [ "$mp" = "$view" ] && return 0; done < /proc/self/mountinfo; return 1; }
trap 'user unmount "$view" >/dev/null 2>&1' EXIT
user -C "$ws" mount --at "$view" >/dev/null 2>&1 || echo "FAIL: mount: $(user -C "$ws" mount --at "$view" 2>&1)"
mounted || echo "FAIL: not mounted"
"$aux/setpriv" --reuid=65534 --regid=65534 --clear-groups "$aux/sh" -c "echo edited > '$view/d00/f00.txt'" || echo "FAIL: write through the view"
c=$(user --json -C "$view" checkpoint through-view 2>&1) || echo "FAIL: checkpoint: $c"
case $c in *'"modified":1'*) ;; *) echo "FAIL: checkpoint saw no edit: $c";; esac
u=$(user unmount "$view" 2>&1) || echo "FAIL: unmount: $u"
mounted && echo "FAIL: still mounted after unmount"
for d in /usr/bin /usr/sbin /usr/local/bin /bin /sbin; do
    [ -L "$d" ] || [ ! -d "$d" ] || "$aux/mount" -t tmpfs none "$d" || echo "FAIL: hide $d"
done
out=$(user --json -C "$ws" mount --at "$view.2" 2>/dev/null)
[ -e "$view.2" ] && echo "FAIL: the view a failed mount made was left"
echo "NOFM $out"
"#;

/// D258 (helper-42): an ordinary user's mount goes through `fusermount3`.
/// fuser finds it by absolute path, but unmounting ran the bare name from
/// the daemon's PATH: a mount made with a PATH that lacked it could not be
/// unmounted ("No such file or directory", the mount stayed). Without any
/// `fusermount3`, the mount failed "Permission denied" under USAGE, not
/// naming it. Now both find it where distributions put it, and its
/// absence is a MOUNT error that says what to install.
#[test]
fn a_users_mount_unmounts_without_fusermount3_on_path_and_names_it_when_missing() {
    if !common::is_root() || !Path::new("/dev/fuse").exists() {
        common::skip_or_fail("a user's mount is set up by root, with /dev/fuse");
        return;
    }
    let Some((lfs, ws)) = workspace(1, 1) else {
        return;
    };
    lfs.open_to_others();
    rewind_json(&ws, &["checkpoint", "base"]);
    common::give_to_nobody(&ws);
    let home = lfs.subdir("nobody");
    common::give_to_nobody(&home);
    let aux = lfs.subdir("aux");
    common::chmod(&aux, 0o755);
    let rw = aux.join("rewind");
    std::fs::copy(env!("CARGO_BIN_EXE_rewind"), &rw).expect("copy rewind");
    common::chmod(&rw, 0o755);
    let out = Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "bash",
            "-c",
            USER_MOUNT_SCRIPT,
            "script",
        ])
        .arg(&ws)
        .arg(home.join("view"))
        .arg(&rw)
        .arg(&aux)
        .output()
        .expect("unshare");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("FAIL"), "{text}");
    let answer = text
        .lines()
        .find_map(|l| l.strip_prefix("NOFM "))
        .unwrap_or_else(|| panic!("no answer: {text}"));
    let v: serde_json::Value =
        serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["error"]["code"], "MOUNT", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("fusermount3") && message.contains("fuse3"),
        "{message}"
    );
    assert!(
        !message.contains("rewind: error: "),
        "one prefix: {message}"
    );
    // D261: over the workspace itself, a user is told first that it
    // needs root (and a view does not), not to chmod /dev/fuse.
    let over = text
        .lines()
        .find_map(|l| l.strip_prefix("OVER "))
        .unwrap_or_else(|| panic!("no answer: {text}"));
    assert!(
        over.contains("needs root") && over.contains("--at VIEW") && !over.contains("/dev/fuse"),
        "{over}"
    );
}

/// D261 (helper-42): `mount --at` on a directory with files in it hid
/// them under the mount without a word. It is refused, and nothing is
/// made or mounted.
#[test]
fn a_view_that_is_not_empty_is_refused_and_nothing_is_mounted() {
    let Some((lfs, ws)) = workspace(1, 1) else {
        return;
    };
    if !common::is_root() || !Path::new("/dev/fuse").exists() {
        common::skip_or_fail("FUSE mounts need root and /dev/fuse");
        return;
    }
    let view = lfs.subdir("busy-view");
    write(&view.join("notes.txt"), b"mine\n");
    let out = rewind(
        Path::new("/"),
        &[
            "--json",
            "mount",
            &ws.display().to_string(),
            "--at",
            &view.display().to_string(),
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "INVALID_PATH", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not empty")),
        "{v}"
    );
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let view_text = view.display().to_string();
    assert!(
        !table
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(view_text.as_str())),
        "nothing was mounted"
    );
    assert_eq!(
        std::fs::read(view.join("notes.txt")).expect("read"),
        b"mine\n"
    ); // helper-43: `lost+found` alone (the top of a filesystem) hides
    // nothing, and is no reason to refuse.
    let top = lfs.subdir("top-view");
    std::fs::create_dir(top.join("lost+found")).expect("mkdir");
    let m = mount_view(&ws, &top);
    // A view that is another workspace's mount is ALREADY_MOUNTED, not
    // a daemon that did not start (MOUNT).
    let other = lfs.subdir("other");
    write(&other.join("o.txt"), b"o\n");
    assert!(rewind(&other, &["init", "-q"]).status.success());
    let out = rewind(
        Path::new("/"),
        &[
            "--json",
            "mount",
            &other.display().to_string(),
            "--at",
            &top.display().to_string(),
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "ALREADY_MOUNTED", "{v}");
    drop(m);
}

/// D259 (helper-41): a descriptor open for writing or a shared writable
/// mapping made before the mount (or before a daemon that was killed,
/// and a new mount) reaches the backing file directly: its writes bypass
/// the dirty set, and checkpoints through the mount missed them with no
/// word. `mount` warned only of working directories; it names these too.
#[test]
fn mount_names_the_processes_that_write_the_tree_through_what_they_held_before_it() {
    let Some((_lfs, ws)) = workspace(1, 1) else {
        return;
    };
    if !common::is_root() || !Path::new("/dev/fuse").exists() {
        common::skip_or_fail("a FUSE mount over the workspace needs root and /dev/fuse");
        return;
    }
    write(&ws.join("mapped.bin"), &[0u8; 4096]);
    let Some(map) = common::MappedWriter::spawn(&ws.join("mapped.bin"), false) else {
        return;
    };
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg("exec 3>>held.log 4>>gone.log; rm gone.log; echo open; exec sleep 60")
        .current_dir(&ws)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut out = holder.stdout.take().expect("stdout");
    let mut open = [0u8; 5];
    std::io::Read::read_exact(&mut out, &mut open).expect("the holder opened held.log");
    let mounted = common::rewind(Path::new("/"), &["mount", &ws.display().to_string()]);
    let _m = MountGuard { dir: ws.clone() };
    let _ = holder.kill();
    let _ = holder.wait();
    let err = String::from_utf8_lossy(&mounted.stderr);
    assert!(mounted.status.success(), "{err}");
    assert!(
        err.contains(&format!("pid {} ", holder.id())) && err.contains("held.log open for writing"),
        "{err}"
    );
    assert!(
        err.contains(&format!("pid {} ", map.pid()))
            && err.contains("mapped.bin mapped shared and writable"),
        "{err}"
    );
    assert!(err.contains("bypass the dirty set"), "{err}");
    assert!(
        !err.contains("gone.log"),
        "an unlinked file is no one's: {err}"
    );
}

/// D319 (helper-70): a shell that was in the workspace before the mount
/// keeps the directory under it, and what it (or a program it starts)
/// writes there reaches no dirty set: `status` said "no changes" and the
/// checkpoint kept the old file while it grew. While such a process
/// lives, every capture through the mount walks the whole tree; once it
/// is gone, captures are scoped by the dirty set again.
#[test]
fn a_shell_from_before_the_mount_is_seen_by_every_checkpoint_while_it_lives() {
    let Some((_lfs, ws)) = workspace(4, 25) else {
        return;
    };
    write(&ws.join("grow.txt"), b"1\n");
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg("read x; echo 2 >> grow.txt; echo done; read y; echo 3 >> grow.txt; echo done; read z")
        .current_dir(&ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the shell");
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        let _ = shell.kill();
        let _ = shell.wait();
        return;
    };
    let base = common::checkpoint_id(&ws, &["base"]);
    let mut stdin = shell.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(shell.stdout.take().expect("stdout"));
    let mut step = |what: &str| {
        writeln!(stdin, "go").expect("tell the shell");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).expect("the shell wrote");
        assert_eq!(line.trim(), "done", "{what}");
    };

    step("the first append, under the mount");
    let st = rewind_json(&ws, &["status"]);
    assert!(
        st["changes"].to_string().contains("grow.txt"),
        "status: {st}"
    );
    let ck = rewind_json(&ws, &["checkpoint", "grown"]);
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");
    step("the second append");
    let ck = rewind_json(&ws, &["checkpoint", "grown again"]);
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");

    drop(stdin);
    let _ = shell.wait();
    write(&ws.join("d00/f00.txt"), b"edited through the mount\n");
    let ck = rewind_json(&ws, &["checkpoint", "scoped again"]);
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");
    rewind_json(&ws, &["rewind", &base]);
    assert_eq!(std::fs::read(ws.join("grow.txt")).expect("read"), b"1\n");
}

/// D319 (helper-71): a descriptor opened for reading before the mount,
/// by a process whose directory is elsewhere, is opened again for writing
/// through `/proc/PID/fd/N`: that write too is under the mount, and is in
/// the next checkpoint.
#[test]
fn a_file_held_open_for_reading_from_before_the_mount_is_watched_too() {
    let Some((_lfs, ws)) = workspace(2, 5) else {
        return;
    };
    let file = ws.join("held.txt");
    write(&file, b"1\n");
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg("exec 3< \"$1\"; read x; echo 2 >> /proc/self/fd/3; echo done; read y")
        .arg("sh")
        .arg(&file)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        let _ = holder.kill();
        let _ = holder.wait();
        return;
    };
    common::checkpoint_id(&ws, &["base"]);
    let mut stdin = holder.stdin.take().expect("stdin");
    writeln!(stdin, "go").expect("tell the holder");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the holder wrote");
    let ck = rewind_json(&ws, &["checkpoint", "after"]);
    drop(stdin);
    let _ = holder.wait();
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");
}

/// D264 (helper-44): a rewind SIGKILLed while the mount is frozen is
/// thawed once the daemon sees its connection close. The next command,
/// there in that moment to finish the rewind, was refused ("another
/// rewind holds the mount frozen": 3 in 140 random kills), and the mount
/// showed a half-rewound tree until a later one. It now waits for the
/// thaw; the daemon's `fuse:holder-gone` failpoint widens the moment to
/// 700 ms.
#[test]
fn the_command_after_a_rewind_killed_while_frozen_waits_for_the_thaw() {
    let Some((_lfs, ws)) = workspace(3, 3) else {
        return;
    };
    let Some(_m) = MountGuard::with_env(
        &ws,
        &[
            ("REWIND_FAILPOINT", "fuse:holder-gone"),
            ("REWIND_FAILPOINT_ACTION", "pause:700"),
        ],
    ) else {
        return;
    };
    let a = common::checkpoint_id(&ws, &["A"]);
    let want = snapshot(&ws);
    for d in 0..3 {
        std::fs::write(ws.join(format!("d{d:02}/f00.txt")), "diverged\n").expect("write");
    }
    write(&ws.join("new-file"), b"new\n");
    let out = rewind_env(
        &ws,
        &["rewind", &a],
        &[("REWIND_FAILPOINT", "rewind:after-intent")],
    );
    assert_eq!(out.status.code(), None, "the rewind was killed");
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
    common::assert_same("finished", &want, &snapshot(&ws));
}

/// D275 through the mount: the daemon's rewind records what it restored,
/// and its next capture, scoped to the dirty set, takes it as written.
#[test]
fn a_restored_file_is_not_read_again_until_it_changes() {
    let Some((lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let trace = lfs.subdir("trace").join("trace.log");
    let trace = trace.display().to_string();
    let env = [("REWIND_TRACE", trace.as_str())];
    let Some(_m) = MountGuard::with_env(&ws, &env) else {
        return;
    };
    common::a_restored_file_is_not_read_again_until_it_changes(&ws, &env);
}

/// A bind mount of `dir` at `at` (not `--rbind`: no mount below `dir`
/// comes along), detached lazily when dropped.
struct Unbind(PathBuf);

impl Drop for Unbind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn bind(dir: &Path, at: &Path) -> Unbind {
    let bound = Command::new("mount")
        .arg("--bind")
        .arg(dir)
        .arg(at)
        .status()
        .expect("mount --bind");
    assert!(
        bound.success(),
        "mount --bind {} {}",
        dir.display(),
        at.display()
    );
    Unbind(at.to_path_buf())
}

/// helper-82: a bind mount of the workspace made before `rewind mount`
/// (as a container's `-v` is) reaches the tree under the mount without
/// passing it: what was written there was in no checkpoint, `status`
/// said "no changes", and after `rm` and a rewind it was gone. The mount
/// now says where else the tree is reached, and while it is, every
/// capture walks.
#[test]
fn a_write_through_a_bind_mount_made_before_the_mount_is_checkpointed() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.subdir("ws");
    write(&ws.join("f"), b"v1\n");
    let alias = lfs.mnt.join("alias");
    std::fs::create_dir(&alias).expect("mkdir alias");
    let _unbind = bind(&ws, &alias);
    let out = rewind(
        Path::new("/"),
        &["--json", "mount", &ws.display().to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mounted = MountGuard { dir: ws.clone() };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let named = v["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w.as_str())
        .any(|w| w.contains(&format!("is also reached at {}", alias.display())));
    assert!(named, "{v}");
    let c1 = common::checkpoint_id(&ws, &["c1"]);
    write(&alias.join("f"), b"v2 beside\n");
    let c2 = common::checkpoint_id(&ws, &["c2"]);
    let diff = rewind_json(&ws, &["diff", &c1, &c2]);
    assert_eq!(diff["changes"][0]["path"], "f", "{diff}");
    std::fs::remove_file(ws.join("f")).expect("rm");
    common::checkpoint_id(&ws, &["c3"]);
    rewind_json(&ws, &["rewind", &c2]);
    assert_eq!(std::fs::read(ws.join("f")).expect("read"), b"v2 beside\n");
}

/// The daemon reads the mount table again only when the kernel says it
/// changed (`MountWatch`). A bind of the workspace's parent made while
/// mounted shows the directory under the mount (a bind without `--rbind`
/// carries no mounts below it), and what is written there must be in the
/// next checkpoint, though the captures before it were scoped by the
/// dirty set; once it is gone, the dirty set scopes them again. On ext4,
/// where a capture that is not scoped looks at every entry (XFS's bulk
/// stat would scope it too, and hide whether it walked).
#[test]
fn a_bind_of_the_parent_made_while_mounted_is_seen_by_the_next_checkpoint() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 512) else {
        return;
    };
    let ws = lfs.subdir("ws");
    write(&ws.join("f"), b"v1\n");
    for i in 0..200 {
        write(&ws.join(format!("d/{i:03}")), b"x\n");
    }
    // Entries a checkpoint looked at.
    let looked = |label: &str| {
        let v = rewind_json(&ws, &["checkpoint", label]);
        let id = v["id"].as_str().expect("checkpoint id").to_string();
        (id, v["entries"].as_u64().expect("entries"))
    };
    let out = rewind(Path::new("/"), &["mount", &ws.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mounted = MountGuard { dir: ws.clone() };
    rewind_json(&ws, &["checkpoint", "c0"]);
    write(&ws.join("g"), b"through the mount\n");
    let (c1, few) = looked("c1");
    assert!(few < 20, "scoped by the dirty set: {few} entries");
    let alias = lfs.subdir("alias");
    let unbind = bind(&lfs.mnt, &alias);
    let beneath = alias.join("ws");
    assert!(
        beneath.join(".rewind").symlink_metadata().is_ok(),
        "the bind shows the directory under the mount, .rewind/ and all"
    );
    write(&beneath.join("f"), b"v2 beneath\n");
    let (c2, all) = looked("c2");
    assert!(
        all > 200,
        "walked while the bind shows the tree: {all} entries"
    );
    let diff = rewind_json(&ws, &["diff", &c1, &c2]);
    assert_eq!(diff["changes"][0]["path"], "f", "{diff}");
    drop(unbind);
    std::fs::remove_file(ws.join("f")).expect("rm");
    let (_, few) = looked("c3");
    assert!(
        few < 20,
        "scoped again once the bind is gone: {few} entries"
    );
    rewind_json(&ws, &["rewind", &c2]);
    assert_eq!(std::fs::read(ws.join("f")).expect("read"), b"v2 beneath\n");
}

/// A `.rewindignore` that is not a regular file holds no rules, before
/// and after: an edit elsewhere must not make the capture walk the whole
/// tree below it. The rule-file comparison (D330) read a cached entry of
/// that name that was no file as rules that had changed, and walked in
/// full at every checkpoint (ext4: a walk looks at every entry).
#[test]
fn a_rule_file_name_that_is_a_directory_does_not_make_every_checkpoint_walk() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 256) else {
        return;
    };
    let ws = lfs.subdir("ws");
    std::fs::create_dir_all(ws.join(".rewindignore")).expect("mkdir .rewindignore");
    write(&ws.join(".rewindignore/inside"), b"not rules\n");
    for i in 0..200 {
        write(&ws.join(format!("d/{i:03}")), b"x\n");
    }
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    rewind_json(&ws, &["checkpoint", "c0"]);
    // An edit outside `d/`: a directory the dirty set lists counts all
    // its entries, looked at or not.
    for round in 0..2 {
        write(&ws.join("top"), format!("edit {round}\n").as_bytes());
        let v = rewind_json(&ws, &["checkpoint"]);
        let changed = v["changes"]["added"].as_u64().unwrap_or(0)
            + v["changes"]["modified"].as_u64().unwrap_or(0);
        assert_eq!(changed, 1, "{v}");
        let entries = v["entries"].as_u64().expect("entries");
        assert!(
            entries < 50,
            "round {round}: looked at {entries} entries: {v}"
        );
    }
}

/// An inotify instance watching some directories (libc, as a dev
/// server's reloader does through its library).
struct Watch {
    fd: std::os::fd::OwnedFd,
    dirs: Vec<(i32, PathBuf)>,
}

impl Watch {
    fn new(dirs: &[PathBuf]) -> Watch {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscalls; the fd is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut watched = Vec::new();
        for d in dirs {
            let c = std::ffi::CString::new(d.as_os_str().as_bytes()).expect("path");
            let mask = libc::IN_MODIFY
                | libc::IN_ATTRIB
                | libc::IN_CLOSE_WRITE
                | libc::IN_CREATE
                | libc::IN_DELETE
                | libc::IN_MOVED_FROM
                | libc::IN_MOVED_TO;
            use std::os::fd::AsRawFd;
            // SAFETY: a valid fd and a NUL-terminated path.
            let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), mask) };
            assert!(
                wd >= 0,
                "watch {}: {}",
                d.display(),
                std::io::Error::last_os_error()
            );
            watched.push((wd, d.clone()));
        }
        Watch { fd, dirs: watched }
    }

    /// Events read within `wait`, as (watched directory, name, mask),
    /// until `enough` says so.
    fn events(
        &self,
        wait: std::time::Duration,
        enough: impl Fn(&[(PathBuf, String, u32)]) -> bool,
    ) -> Vec<(PathBuf, String, u32)> {
        use std::os::fd::AsRawFd;
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        while started.elapsed() < wait && !enough(&out) {
            // SAFETY: reads into a buffer of its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            let mut at = 0;
            while at + 16 <= n as usize {
                let wd = i32::from_ne_bytes(buf[at..at + 4].try_into().expect("wd"));
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().expect("mask"));
                let len =
                    u32::from_ne_bytes(buf[at + 12..at + 16].try_into().expect("len")) as usize;
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_string();
                if let Some((_, d)) = self.dirs.iter().find(|(w, _)| *w == wd) {
                    out.push((d.clone(), name, mask));
                }
                at += 16 + len;
            }
        }
        out
    }
}

/// D339: a rewind changes the tree under the mount, and the kernel raises
/// inotify events only for changes made through it: a dev server's
/// reloader or an editor watching the mount heard nothing and kept
/// serving what the rewind had replaced (D333). The daemon now sets the
/// modification time of each changed path and its directory through the
/// mount, and answers those requests without changing or marking
/// anything: the watcher hears of the rewritten file, the restored one
/// and the directory a file was deleted from, and the next capture reads
/// nothing (D275 holds).
#[test]
fn watchers_of_the_mount_hear_of_what_a_rewind_changed_and_nothing_is_read_again() {
    let Some((lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let trace = lfs.subdir("trace").join("trace.log");
    let trace = trace.display().to_string();
    let env = [("REWIND_TRACE", trace.as_str())];
    let Some(_m) = MountGuard::with_env(&ws, &env) else {
        return;
    };
    // Of 64 KiB or more: recorded as restored, not read again (D275).
    for (i, f) in ["d00/f00.txt", "d00/f01.txt"].iter().enumerate() {
        write(&ws.join(f), &common::pseudo_random(128 << 10, i as u64));
    }
    rewind_json(&ws, &["checkpoint", "A"]);
    write(&ws.join("d00/f00.txt"), b"edited\n");
    std::fs::remove_file(ws.join("d00/f01.txt")).expect("rm");
    write(&ws.join("d01/new.txt"), b"new\n");
    rewind_json(&ws, &["checkpoint", "B"]);
    let (d00, d01) = (ws.join("d00"), ws.join("d01"));
    let watch = Watch::new(&[ws.clone(), d00.clone(), d01.clone()]);
    let before = watch.events(std::time::Duration::from_millis(200), |_| false);
    assert_eq!(before, [], "events before the rewind");
    rewind_json(&ws, &["rewind", "A"]);
    let heard = |seen: &[(PathBuf, String, u32)], dir: &Path, name: &str| {
        seen.iter()
            .any(|(d, n, m)| d == dir && n == name && m & libc::IN_MODIFY != 0)
    };
    let all = |seen: &[(PathBuf, String, u32)]| {
        heard(seen, &d00, "f00.txt")
            && heard(seen, &d00, "f01.txt")
            && (heard(seen, &d01, "") || heard(seen, &ws, "d01"))
    };
    let seen = watch.events(std::time::Duration::from_secs(10), all);
    assert!(
        all(&seen),
        "the watcher did not hear of the rewritten file, the restored one and the directory a file left: {seen:?}"
    );
    assert!(!ws.join("d01/new.txt").exists());
    assert_eq!(
        common::capture_notes(&ws, &["status"], &env),
        [(0, 2)],
        "status read what the rewind restored: an announcement marked it"
    );
    assert_eq!(
        common::capture_notes(
            &ws,
            &["status"],
            &[&env[..], &[("REWIND_ENGINE", "walk")]].concat()
        ),
        [(0, 2)],
        "a walk read what the rewind restored: an announcement changed its stat"
    );
    let st = rewind_json(&ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
}

/// helper-87 on D339's first version: an announcement set the time of
/// files outside the mount. `utimensat`'s no-follow covers only the last
/// name, so a directory the rewind turned into a symlink led it out of the
/// tree, and a filesystem mounted on a directory of the mount was touched
/// in its own right. Directories are now opened beneath the mount's root
/// with no symlink followed and no mount crossed, and a name something is
/// mounted on is left.
#[test]
fn an_announcement_touches_nothing_outside_the_mount() {
    let Some(lfs) = LoopFs::new(Fs::Xfs, 512) else {
        return;
    };
    let ws = lfs.subdir("ws");
    let (outside, nested) = (lfs.subdir("outside"), lfs.subdir("nested"));
    write(&outside.join("x"), b"outside\n");
    write(&nested.join("y"), b"nested\n");
    write(&ws.join("sub/y"), b"one\n");
    std::os::unix::fs::symlink(&outside, ws.join("a")).expect("symlink");
    let out = rewind(&ws, &["init", "-q"]);
    assert!(out.status.success(), "init");
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    rewind_json(&ws, &["checkpoint", "T"]);
    std::fs::remove_file(ws.join("a")).expect("rm link");
    write(&ws.join("a/x"), b"live\n");
    write(&ws.join("sub/y"), b"two\n");
    rewind_json(&ws, &["checkpoint", "L"]);
    let _bound = bind(&nested, &ws.join("sub"));
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
    let mtime = |p: &Path| {
        std::fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
    };
    let outside_files = [
        outside.join("x"),
        outside.clone(),
        nested.join("y"),
        nested.clone(),
    ];
    for p in &outside_files {
        let f = std::fs::File::open(p).expect("open");
        f.set_modified(old).expect("set mtime");
    }
    // Heard once the rewind's own files are announced: the rest is done.
    let watch = Watch::new(std::slice::from_ref(&ws));
    rewind_json(&ws, &["rewind", "T"]);
    let seen = watch.events(std::time::Duration::from_secs(10), |seen| {
        seen.iter()
            .any(|(_, n, m)| n == "a" && m & libc::IN_MODIFY != 0)
    });
    assert!(
        seen.iter().any(|(_, n, _)| n == "a"),
        "the rewind was not announced: {seen:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    for p in &outside_files {
        assert_eq!(
            mtime(p),
            old,
            "{} was touched by an announcement",
            p.display()
        );
    }
}

/// helper-87: `rewind unmount` right after a rewind of 990 files said the
/// mount was busy, 20 times out of 20: the announcing thread held the
/// mount's root open for the 60–90 ms it took. An unmount now pauses it
/// first (D339).
#[test]
fn an_unmount_right_after_a_big_rewind_is_not_kept_busy_by_its_announcements() {
    let Some((_lfs, ws)) = workspace(990, 1) else {
        return;
    };
    for round in 0..3 {
        let Some(m) = MountGuard::new(&ws, &[]) else {
            return;
        };
        rewind_json(&ws, &["checkpoint", &format!("A{round}")]);
        for i in 0..990 {
            write(
                &ws.join(format!("d{i:02}/f00.txt")),
                format!("{round}\n").as_bytes(),
            );
        }
        rewind_json(&ws, &["checkpoint", &format!("B{round}")]);
        rewind_json(&ws, &["rewind", &format!("A{round}")]);
        m.unmount();
    }
}

/// helper-87: a rewind with nothing to do (the tree already is its
/// target) thawed the mount as if anything could have changed: the daemon
/// forgot every cached entry, marked the whole tree dirty (the next
/// checkpoint unscoped) and announced the root to watchers. So did a
/// refused one. Until its apply a rewind changes nothing, and says so at
/// the thaw.
#[test]
fn a_rewind_with_nothing_to_do_leaves_the_mount_as_it_was() {
    let Some((_lfs, ws)) = workspace(20, 5) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    rewind_json(&ws, &["checkpoint", "A"]);
    let watch = Watch::new(&[ws.clone(), ws.join("d00")]);
    let r = rewind_json(&ws, &["rewind", "A"]);
    assert_eq!(r["safety_checkpoint"], serde_json::Value::Null, "{r}");
    let refused = rewind(&ws, &["rewind", "A", "--expect", "0000000000000000"]);
    assert!(!refused.status.success(), "a wrong --expect is refused");
    let seen = watch.events(std::time::Duration::from_millis(500), |_| false);
    assert_eq!(seen, [], "a rewind that changed nothing was announced");
    assert!(
        m.status().dirty.is_some(),
        "a rewind that changed nothing marked the whole tree dirty"
    );
    // An edit elsewhere, then a restore of a file that already is as it
    // was: the restore's capture took the dirty set and committed nothing.
    // The count still shows the edit's directory (helper-88: it said 0),
    // and the next checkpoint has the edit.
    write(&ws.join("d01/f01.txt"), b"edited\n");
    let r = rewind_json(&ws, &["restore", "A", "--", "d00/f00.txt"]);
    assert_eq!(r["safety_checkpoint"], serde_json::Value::Null, "{r}");
    let dirty = m.status().dirty;
    assert!(
        dirty.is_some_and(|n| n >= 1),
        "the edit waiting for the next checkpoint is not counted: {dirty:?}"
    );
    write(&ws.join("d00/f00.txt"), b"edited\n");
    checkpoint_matches_a_walk(&ws, "after");
}

/// helper-88: an unmount refused as busy (a dev server working inside)
/// paused the announcer and it dropped what it had left: the mount kept
/// serving, and vite heard 30 of 999 changes and served the old page. What
/// is left now waits for the unmount, and goes on when the mount stays.
#[test]
fn an_unmount_refused_as_busy_does_not_cut_a_rewinds_announcements_short() {
    let Some((_lfs, ws)) = workspace(10, 100) else {
        return;
    };
    let Some(_m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    rewind_json(&ws, &["checkpoint", "A"]);
    for d in 0..10 {
        for f in 0..100 {
            write(&ws.join(format!("d{d:02}/f{f:02}.txt")), b"edited\n");
        }
    }
    rewind_json(&ws, &["checkpoint", "B"]);
    let dirs: Vec<PathBuf> = (0..10).map(|d| ws.join(format!("d{d:02}"))).collect();
    let watch = Watch::new(&dirs);
    let mut sleeper = Command::new("sleep")
        .arg("60")
        .current_dir(ws.join("d00"))
        .spawn()
        .expect("spawn sleep");
    rewind_json(&ws, &["rewind", "A"]);
    let out = rewind(Path::new("/"), &["unmount", &ws.display().to_string()]);
    assert!(!out.status.success(), "the unmount is refused: busy");
    let heard = |seen: &[(PathBuf, String, u32)]| {
        seen.iter()
            .filter(|(_, n, m)| n.starts_with('f') && m & libc::IN_MODIFY != 0)
            .map(|(d, n, _)| (d.clone(), n.clone()))
            .collect::<BTreeSet<_>>()
            .len()
    };
    let seen = watch.events(std::time::Duration::from_secs(20), |s| heard(s) == 1000);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(
        heard(&seen),
        1000,
        "files heard of after the refused unmount"
    );
}

/// helper-88: the announcer checked only that the mountpoint led to some
/// FUSE filesystem. With another workspace's view bound over it, its
/// touches reached that daemon, which set the times for real. The root it
/// opens must be on the device its own mount had.
#[test]
fn announcements_never_reach_another_mount_bound_over_the_view() {
    let Some((lfs, ws)) = workspace(1, 2) else {
        return;
    };
    let other = lfs.subdir("other");
    write(&other.join("d00/f00.txt"), b"other\n");
    write(&other.join("d00/f01.txt"), b"other\n");
    assert!(rewind(&other, &["init", "-q"]).status.success());
    let (view, view2) = (lfs.mnt.join("view"), lfs.mnt.join("view2"));
    let _m1 = mount_view(&ws, &view);
    let _m2 = mount_view(&other, &view2);
    rewind_json(&ws, &["checkpoint", "A"]);
    std::fs::write(view.join("d00/f00.txt"), b"edited\n").expect("edit");
    rewind_json(&ws, &["checkpoint", "B"]);
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
    for f in ["d00/f00.txt", "d00/f01.txt"] {
        let file = std::fs::File::options()
            .write(true)
            .open(other.join(f))
            .expect("open");
        file.set_modified(old).expect("set mtime");
    }
    let _bound = bind(&view2, &view);
    let watch = Watch::new(&[other.join("d00")]);
    rewind_json(&ws, &["rewind", "A"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let seen = watch.events(std::time::Duration::from_millis(200), |_| false);
    assert_eq!(seen, [], "the other workspace's files were touched");
    let mtime = std::fs::metadata(other.join("d00/f00.txt"))
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(mtime, old, "the other workspace's file got a new time");
}

/// D353: through a mount the command server runs a rewind and ends with
/// its client (D93 rule 1). A Ctrl-C at the waiting client would have
/// ended the server mid-rewind, silently; now it lets the rewind finish
/// (the server lives on), says so, and then ends the client by that
/// SIGINT.
#[test]
fn a_ctrl_c_at_a_client_waiting_on_the_servers_rewind_lets_it_finish() {
    let Some((_lfs, ws)) = workspace(40, 50) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    let a = common::checkpoint_id(&ws, &["a"]);
    let snap_a = snapshot(&ws);
    let server = server_pid_after_a_checkpoint(&m, &ws);
    for d in 0..40 {
        for f in 0..50 {
            write(&ws.join(format!("d{d:02}/f{f:02}.txt")), b"edited\n");
        }
    }
    let child = common::spawn_with_default_signals(&ws, &["--json", "rewind", &a], &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !common::catches(child.id(), libc::SIGINT) {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never took SIGINT over"
        );
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    common::signal(child.id(), libc::SIGINT);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("finishing the rewind first"), "{stderr}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGINT),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the server's JSON");
    assert_eq!(v["rewound_to"], a.as_str());
    assert_eq!(snap_a, snapshot(&ws), "the rewind reached its target");
    common::checkpoint_id(&ws, &[]);
    assert_eq!(lock_holder(&m), server, "the server was not ended with it");
}

/// A command whose reader left before it wrote (`rewind verify | head
/// -1`) left its unsent lines in the command server's stdout buffer, and
/// the next command's stdout got them before its own JSON (helper-93:
/// 11 of 30 `--json checkpoint` outputs did not parse). They are dropped
/// with the command that wrote them.
#[test]
fn the_output_a_reader_left_unread_never_reaches_the_next_commands_stdout() {
    let Some((_lfs, ws)) = workspace(2, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    server_pid_after_a_checkpoint(&m, &ws);
    // `verify` writes its lines apart: `head` takes the first and leaves.
    let verify_into_head = format!(
        "'{}' verify | head -1 >/dev/null",
        env!("CARGO_BIN_EXE_rewind")
    );
    for round in 0..30 {
        sh(&ws, &verify_into_head);
        write(
            &ws.join("d00/f00.txt"),
            format!("round {round}\n").as_bytes(),
        );
        let out = common::rewind(&ws, &["--json", "checkpoint"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{round}: not JSON ({e}): {stdout}"));
        assert!(v["id"].is_string(), "{v}");
    }
}

/// D313 says on stderr, once per command, that the history lost entries
/// its kept anchor recorded. In a mount's command server, which runs
/// many commands in one process, only its first command said it
/// (helper-93); each says it now.
#[test]
fn every_command_the_server_runs_says_the_history_lost_entries() {
    let Some((_lfs, ws)) = workspace(1, 2) else {
        return;
    };
    let Some(m) = MountGuard::new(&ws, &[]) else {
        return;
    };
    server_pid_after_a_checkpoint(&m, &ws);
    let v = rewind_json(&ws, &["verify"]);
    let kept = PathBuf::from(v["kept_anchor"]["path"].as_str().expect("kept anchor"));
    // An anchor ahead of this ledger: as if its newest entries were lost.
    let mut anchor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).expect("read anchor")).expect("anchor json");
    anchor["seq"] = serde_json::json!(anchor["seq"].as_u64().expect("seq") + 100);
    std::fs::write(&kept, anchor.to_string()).expect("write anchor");
    for round in 0..3 {
        write(
            &ws.join("d00/f00.txt"),
            format!("round {round}\n").as_bytes(),
        );
        let out = rewind(&ws, &["checkpoint"]);
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches("history reached entry").count(),
            1,
            "{round}: {stderr}"
        );
        let out = rewind(&ws, &["list"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("history reached entry"),
            "{round}: {stderr}"
        );
        write(
            &ws.join("d00/f01.txt"),
            format!("round {round}\n").as_bytes(),
        );
        let v = rewind_json(&ws, &["checkpoint"]);
        assert!(v["history_lost"].is_string(), "{round}: {v}");
    }
    std::fs::remove_file(&kept).expect("accept the ledger");
    m.unmount();
}
