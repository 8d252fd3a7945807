//! Containment (DESIGN §4 rule 5, §2 ignore rules): a rewind never writes
//! outside the workspace, even when a directory on a target path is swapped
//! for a symlink before or during the rewind; FIFOs, sockets and devices are
//! skipped, never opened; nested mount points are not crossed.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_same, checkpoint_id, rewind, rewind_env, rewind_json, snapshot, write};

fn outside_fixture(base: &Path) -> std::path::PathBuf {
    let outside = base.join("outside");
    write(&outside.join("f.txt"), b"outside, must not change\n");
    outside
}

#[test]
fn a_directory_swapped_for_a_symlink_before_the_rewind_is_replaced_not_followed() {
    let dir = common::tmp();
    let root = dir.path().join("ws");
    let outside = outside_fixture(dir.path());
    write(&root.join("d/f.txt"), b"inside\n");
    write(&root.join("d/sub/g.txt"), b"inside too\n");
    let a = checkpoint_id(&root, &[]);
    let snap_a = snapshot(&root);
    let outside_before = snapshot(&outside);
    std::fs::remove_dir_all(root.join("d")).expect("rm");
    std::os::unix::fs::symlink(&outside, root.join("d")).expect("symlink");
    rewind_json(&root, &["rewind", &a]);
    assert_same("workspace", &snap_a, &snapshot(&root));
    assert_same("outside", &outside_before, &snapshot(&outside));
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_rewind_never_redirects_a_write() {
    let dir = common::tmp();
    let root = dir.path().join("ws");
    let outside = outside_fixture(dir.path());
    for i in 0..20 {
        write(
            &root.join(format!("d/f{i}.txt")),
            format!("version A {i}\n").as_bytes(),
        );
    }
    let a = checkpoint_id(&root, &[]);
    let snap_a = snapshot(&root);
    for i in 0..20 {
        write(
            &root.join(format!("d/f{i}.txt")),
            format!("version B {i}\n").as_bytes(),
        );
    }
    let outside_before = snapshot(&outside);
    // Stop the rewind after its plan is fixed and its intent persisted...
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(&root)
        .args(["rewind", &a, "-q"])
        .env("REWIND_FAILPOINT", "rewind:after-intent")
        .env("REWIND_FAILPOINT_ACTION", "stop")
        .spawn()
        .expect("spawn");
    common::wait_stopped(child.id());
    // ...swap the directory it is about to write into for a symlink out...
    std::fs::rename(root.join("d"), dir.path().join("d.moved")).expect("move d away");
    std::os::unix::fs::symlink(&outside, root.join("d")).expect("symlink");
    // ...and let it go on.
    Command::new("kill")
        .arg("-CONT")
        .arg(child.id().to_string())
        .status()
        .expect("kill -CONT");
    let status = child.wait().expect("wait");
    assert!(status.success(), "the rewind finishes from a fresh capture");
    assert_same("outside is untouched", &outside_before, &snapshot(&outside));
    assert_same(
        "the workspace reaches the target",
        &snap_a,
        &snapshot(&root),
    );
}

#[test]
fn fifos_and_sockets_are_skipped_and_reported_never_opened() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("file"), b"x");
    let st = Command::new("mkfifo")
        .arg(root.join("pipe"))
        .status()
        .expect("mkfifo");
    assert!(st.success());
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).expect("bind");
    // A FIFO that got opened would block forever: run with a deadline.
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(root)
        .args(["--json", "checkpoint"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("checkpoint hung on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let skipped: Vec<(String, String)> = v["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap_or("").into(),
                s["reason"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(
        skipped[0].0 == "pipe" && skipped[0].1.starts_with("fifo"),
        "{skipped:?}"
    );
    assert!(
        skipped[1].0 == "sock" && skipped[1].1.starts_with("socket"),
        "{skipped:?}"
    );
    assert_eq!(
        v["changes"]["added"], 1,
        "only the regular file is captured"
    );
}

#[test]
fn nested_mount_points_are_not_crossed() {
    if !common::is_root() {
        common::skip_or_fail("mounting a tmpfs needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("top.txt"), b"top");
    std::fs::create_dir(root.join("mnt")).expect("mkdir");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(root.join("mnt"))
        .status()
        .expect("mount");
    assert!(st.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(root.join("mnt"));
    write(&root.join("mnt/inside.txt"), b"another filesystem");
    let v = rewind_json(root, &["checkpoint"]);
    let a = v["id"].as_str().expect("id").to_string();
    assert!(
        v["skipped"]
            .as_array()
            .expect("skipped")
            .iter()
            .any(|s| s["path"] == "mnt"
                && s["reason"].as_str().unwrap_or("").contains("mount point")),
        "{v}"
    );
    write(&root.join("mnt/inside.txt"), b"changed inside the mount");
    write(&root.join("top.txt"), b"changed");
    rewind_json(root, &["rewind", &a]);
    assert_eq!(std::fs::read(root.join("top.txt")).expect("top"), b"top");
    assert_eq!(
        std::fs::read(root.join("mnt/inside.txt")).expect("inside"),
        b"changed inside the mount",
        "the mount is left alone"
    );
}

/// A directory bind-mounted from the same filesystem has the root's
/// device: walked as part of the tree, a rewind to a checkpoint from
/// before the mount deleted everything it held, outside the workspace
/// (D137).
#[test]
fn a_bind_mount_from_the_same_filesystem_is_not_crossed() {
    if !common::is_root() {
        common::skip_or_fail("bind mounts need root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path().join("ws");
    let outside = outside_fixture(dir.path());
    write(&outside.join("sub/g.txt"), b"outside too");
    write(&root.join("top.txt"), b"top");
    let a = checkpoint_id(&root, &[]);
    let outside_before = snapshot(&outside);
    let _guard = bind_mount(&outside, &root.join("shared"));
    let v = rewind_json(&root, &["checkpoint"]);
    assert!(
        v["skipped"]
            .as_array()
            .expect("skipped")
            .iter()
            .any(|s| s["path"] == "shared"
                && s["reason"].as_str().unwrap_or("").contains("mount point")),
        "{v}"
    );
    write(&root.join("top.txt"), b"changed");
    rewind_json(&root, &["rewind", &a]);
    assert_eq!(std::fs::read(root.join("top.txt")).expect("top"), b"top");
    assert_same(
        "outside, through the bind mount",
        &outside_before,
        &snapshot(&outside),
    );
    assert!(
        root.join("shared/f.txt").exists(),
        "the mount is left alone"
    );
}

/// `from` bind-mounted on `to` (made here) until the guard drops.
fn bind_mount(from: &Path, to: &Path) -> Unmount {
    std::fs::create_dir(to).expect("mkdir");
    let st = Command::new("mount")
        .arg("--bind")
        .arg(from)
        .arg(to)
        .status()
        .expect("mount");
    assert!(
        st.success(),
        "mount --bind {} {}",
        from.display(),
        to.display()
    );
    Unmount(to.to_path_buf())
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status();
        assert!(
            std::thread::panicking() || ok.is_ok_and(|s| s.success()),
            "umount {}",
            self.0.display()
        );
    }
}

/// D323 (helper-73): a directory bind-mounted right inside `.rewind/`
/// was emptied by `deinit`, which removed `.rewind/`'s entries one by
/// one: the mount check looked only below each. It is refused, naming
/// it, and nothing outside is touched; once unmounted, `deinit` finishes.
#[test]
fn deinit_never_deletes_through_a_mount_inside_the_history() {
    if !common::is_root() {
        common::skip_or_fail("bind mounts need root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path().join("ws");
    let outside = outside_fixture(dir.path());
    write(&root.join("top.txt"), b"top");
    checkpoint_id(&root, &[]);
    let outside_before = snapshot(&outside);
    let mounted = bind_mount(&outside, &root.join(".rewind/mnt"));
    let out = common::rewind(&root, &["deinit", "--yes"]);
    drop(mounted);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not crossed"), "{err}");
    assert_same(
        "outside, mounted in .rewind/",
        &outside_before,
        &snapshot(&outside),
    );
    let out = common::rewind(&root, &["deinit", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!root.join(".rewind").exists());
    assert_same(
        "outside, after deinit",
        &outside_before,
        &snapshot(&outside),
    );
    assert_eq!(std::fs::read(root.join("top.txt")).expect("top"), b"top");
}

/// `.rewind/` holds a copy of every file, a 0600 `.env` included, in
/// objects of mode 0444 and a WAL of 0644: it is made 0700, and one made
/// 0755 by an older build is tightened by the next command (D140).
#[test]
fn the_history_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::tmp();
    let root = dir.path().join("ws");
    write(&root.join(".env"), b"API_KEY=hunter2\n");
    common::chmod(&root.join(".env"), 0o600);
    write(&root.join("big.key"), &vec![b'k'; 1 << 20]);
    common::chmod(&root.join("big.key"), 0o600);
    checkpoint_id(&root, &[]);
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode(&root.join(".rewind")), 0o700);
    std::fs::set_permissions(root.join(".rewind"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    rewind_json(&root, &["status"]);
    assert_eq!(
        mode(&root.join(".rewind")),
        0o700,
        "tightened by the next command"
    );
    if common::is_root() {
        std::os::unix::fs::chown(dir.path(), Some(0), Some(0)).expect("chown");
        common::chmod(dir.path(), 0o755);
        let out = Command::new("su")
            .args([
                "-s",
                "/bin/sh",
                "nobody",
                "-c",
                "grep -r -l -e hunter2 -e kkkk .",
            ])
            .current_dir(&root)
            .output()
            .expect("su");
        let found = String::from_utf8_lossy(&out.stdout);
        assert!(
            !found.contains(".rewind"),
            "another user read the history: {found}"
        );
    }
}

/// A history that a command run as root left in a user's workspace
/// (before D148, or by a `chown`): the user's next command says whose it
/// is and how to give it back, instead of a bare "Permission denied"
/// (D142).
#[test]
fn a_history_left_by_root_names_its_owner_and_the_fix() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("a.txt"), b"a");
    common::give_to_nobody(&root);
    checkpoint_id(&root, &[]);
    let chown = |owner: &str, args: &[&str], path: &Path| {
        let st = Command::new("chown")
            .args(args)
            .arg(owner)
            .arg(path)
            .status()
            .expect("chown");
        assert!(st.success(), "chown {owner} {}", path.display());
    };
    let checkpoint_as_nobody = || -> serde_json::Value {
        let out = Command::new("su")
            .args(["-s", "/bin/sh", "nobody", "-c"])
            .arg(format!(
                "exec '{}' --json checkpoint",
                env!("CARGO_BIN_EXE_rewind")
            ))
            .current_dir(&root)
            .output()
            .expect("su");
        assert_eq!(out.status.code(), Some(1));
        serde_json::from_slice(&out.stdout).expect("json")
    };
    // Root's history as rewind left it before D148 (which now gives a
    // history root makes in a user's directory to that user).
    chown("root:", &["-R"], &root.join(".rewind"));
    let v = checkpoint_as_nobody();
    assert_eq!(v["error"]["code"], "NOT_OWNER", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("belongs to root")
            && msg.contains(&format!(
                "chown -R 65534: {}",
                root.join(".rewind").display()
            )),
        "{msg}"
    );

    // Only the ledger and its side files root's: SQLite says "readonly",
    // which was `READ_ONLY` with a fix for a read-only filesystem
    // (helper-62, D306).
    chown("65534:65534", &["-R"], &root.join(".rewind"));
    for f in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
        let p = root.join(".rewind").join(f);
        if p.exists() {
            chown("root:", &[], &p);
        }
    }
    let v = checkpoint_as_nobody();
    assert_eq!(v["error"]["code"], "NOT_OWNER", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("belongs to root")),
        "{v}"
    );

    // Another user's workspace and history: the `chown` told the intruder
    // to take it (helper-79). Now: run rewind as its owner.
    chown("daemon:", &["-R"], &root);
    let st = Command::new("chmod").arg("a+rx").arg(&root).status();
    assert!(st.is_ok_and(|s| s.success()));
    let v = checkpoint_as_nobody();
    assert_eq!(v["error"]["code"], "NOT_OWNER", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("it belongs to uid 1") && msg.contains("another user's history"),
        "{msg}"
    );
    assert!(!msg.contains("chown"), "{msg}");
}

/// A rewind run as root in a user's workspace (`sudo rewind`, or the
/// daemon of `sudo rewind mount`) gives what it makes to the owner and
/// group of the directory it goes into. Made root's, the user's restored
/// files, directories and symlinks were theirs no more, and their next
/// edit failed (D147). What goes into a directory of root's stays root's.
#[test]
fn a_rewind_run_as_root_gives_the_user_back_their_files() {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("a.txt"), b"a\n");
    write(&root.join("d/e/x.txt"), b"x\n");
    write(&root.join("sys/r.txt"), b"r\n");
    std::os::unix::fs::symlink("a.txt", root.join("l")).expect("symlink");
    common::give_to_nobody(&root);
    std::os::unix::fs::chown(root.join("sys"), Some(0), Some(0)).expect("chown");
    std::os::unix::fs::chown(root.join("sys/r.txt"), Some(0), Some(0)).expect("chown");
    let nobody = std::fs::metadata(&root).expect("stat");
    let base = checkpoint_id(&root, &["base"]);
    let st = Command::new("rm")
        .args(["-rf", "a.txt", "d", "l", "sys/r.txt"])
        .current_dir(&root)
        .status()
        .expect("rm");
    assert!(st.success());
    let out = rewind(&root, &["rewind", &base, "-q"]);
    assert!(out.status.success(), "{out:?}");
    for p in ["a.txt", "d", "d/e", "d/e/x.txt", "l"] {
        let m = std::fs::symlink_metadata(root.join(p)).expect("stat");
        assert_eq!(
            (m.uid(), m.gid()),
            (nobody.uid(), nobody.gid()),
            "{p} is its directory's owner's again"
        );
    }
    let m = std::fs::metadata(root.join("sys/r.txt")).expect("stat");
    assert_eq!((m.uid(), m.gid()), (0, 0), "in root's directory, root's");
    assert_eq!(
        std::fs::metadata(root.join("a.txt")).expect("stat").mode() & 0o7777,
        0o644
    );
    as_nobody(&root, "echo more >> a.txt && echo y > d/e/new.txt");
    assert_eq!(
        std::fs::read(root.join("a.txt")).expect("read"),
        b"a\nmore\n"
    );
}

/// D216: a ledger its user may not write, on a filesystem mounted
/// read-write, was `READ_ONLY` "on a read-only filesystem: remount it
/// read-write", which fixes nothing (helper-31). It now says the user
/// may not write it, and how to fix that; nothing changes.
#[test]
fn a_ledger_its_user_may_not_write_is_named_as_such_not_as_a_read_only_filesystem() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("a"), b"one\n");
    common::give_to_nobody(&root);
    let bin = env!("CARGO_BIN_EXE_rewind");
    as_nobody(&root, &format!("{bin} checkpoint -q one && echo two > a"));
    let out = Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c"])
        .arg(format!(
            "chmod a-w .rewind/ledger.db* && {bin} --json checkpoint two"
        ))
        .current_dir(&root)
        .output()
        .expect("su");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "READ_ONLY", "{v}");
    let msg = v["error"]["message"].as_str().expect("message");
    assert!(msg.contains("not writable by this user"), "{msg}");
    assert!(!msg.contains("remount"), "{msg}");
    as_nobody(&root, "chmod u+w .rewind/ledger.db*");
    let list = rewind_json(&root, &["list"]);
    assert_eq!(
        list["checkpoints"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
}

/// Root's commands in a user's workspace leave the history the user's:
/// one made by root's first checkpoint there (every later command of the
/// user's was `NOT_OWNER`), and the object shard directories and lock
/// root adds to the user's own (the user's next object in one, and their
/// gc of it, failed). D148.
#[test]
fn a_history_root_makes_or_adds_to_in_a_users_workspace_stays_theirs() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    // Over 64 KiB: an object file in a shard directory, not a ledger row.
    write(&root.join("big-a"), &vec![b'a'; 100_000]);
    common::give_to_nobody(&root);
    let not_nobodys = |root: &Path| common::not_owned_by(&root.join(".rewind"), 65534);
    let bin = env!("CARGO_BIN_EXE_rewind");
    checkpoint_id(&root, &["by root"]);
    assert_eq!(not_nobodys(&root), Vec::<String>::new(), "made by root");
    as_nobody(
        &root,
        &format!("head -c 100000 /dev/urandom > big-b && {bin} checkpoint -q"),
    );
    write(&root.join("big-c"), &vec![b'c'; 100_000]);
    checkpoint_id(&root, &["added to by root"]);
    assert_eq!(not_nobodys(&root), Vec::<String>::new(), "added to by root");
    as_nobody(
        &root,
        &format!(
            "rm big-a big-c && {bin} checkpoint -q && {bin} gc --keep-last 1 -q && {bin} verify --deep"
        ),
    );
}

/// Root's checkpoint of a user's workspace leaves out what the user could
/// not read: root's 0600 file and 0700 directory went into the history
/// D148 gives the user, and their `diff --patch` printed the secret
/// (helper-19). What the user can read by its owner's, group's or
/// others' bits is captured as before, and a rewind keeps what was left
/// out (D111). D152.
#[test]
fn root_keeps_out_of_a_users_history_what_the_user_could_not_read() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("mine.txt"), b"mine\n");
    write(&root.join("notes.txt"), b"the user's own, 0400\n");
    common::give_to_nobody(&root);
    common::chmod(&root.join("notes.txt"), 0o400);
    let bin = env!("CARGO_BIN_EXE_rewind");
    as_nobody(&root, &format!("{bin} checkpoint -q 'by nobody'"));
    let token = "ROOT-SECRET-TOKEN-7c1";
    write(&root.join("secret.env"), format!("{token}\n").as_bytes());
    common::chmod(&root.join("secret.env"), 0o600);
    write(
        &root.join("private/key"),
        format!("{token} in a dir\n").as_bytes(),
    );
    common::chmod(&root.join("private"), 0o700);
    // Root's, but readable by nobody's group, or by everyone.
    write(&root.join("team.txt"), b"for the group\n");
    std::os::unix::fs::chown(root.join("team.txt"), Some(0), Some(65534)).expect("chown");
    common::chmod(&root.join("team.txt"), 0o640);
    write(&root.join("public.txt"), b"for everyone\n");
    let ck = common::rewind_json(&root, &["checkpoint", "by root"]);
    let skipped: Vec<&str> = ck["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .filter_map(|k| k["path"].as_str())
        .collect();
    assert!(
        skipped.contains(&"secret.env") && skipped.contains(&"private"),
        "{ck}"
    );
    for kept in ["mine.txt", "notes.txt", "team.txt", "public.txt"] {
        assert!(!skipped.contains(&kept), "{kept}: {ck}");
    }
    let out = as_nobody(&root, &format!("{bin} diff --patch 'by nobody' 'by root'"));
    let patch = String::from_utf8_lossy(&out.stdout);
    assert!(
        patch.contains("+for the group") && !patch.contains(token),
        "{patch}"
    );
    // Nowhere in the history: not in an object, not in the ledger.
    let mut todo = vec![root.join(".rewind")];
    while let Some(p) = todo.pop() {
        for e in std::fs::read_dir(&p).expect("read_dir").flatten() {
            let path = e.path();
            if e.file_type().expect("type").is_dir() {
                todo.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                assert!(
                    !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                    "{} holds root's secret",
                    path.display()
                );
            }
        }
    }
    // A rewind keeps what was left out.
    let out = as_nobody(
        &root,
        &format!("echo changed > mine.txt && {bin} rewind 'by root' -q && cat mine.txt"),
    );
    assert_eq!(out.stdout, b"mine\n");
    assert_eq!(
        std::fs::read(root.join("secret.env")).expect("read"),
        format!("{token}\n").as_bytes()
    );
}

/// Root's rewind for a workspace's owner (their command through root's
/// door, or their `rewind mcp`, confined to the workspace, D151) changes
/// only what the user could have changed themselves (helper-20 #7, D164):
/// before, it reverted, created and deleted root's entries in root's
/// directory inside the user's tree, and root's file in a sticky
/// directory. Those are kept and reported; the user's own entries, in
/// the sticky directory too, are rewound. Root's own `sudo rewind` still
/// restores root's files (D147, the test above).
#[test]
fn root_rewinds_for_a_user_only_what_the_user_could_change() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("mine.txt"), b"mine v1\n");
    common::give_to_nobody(&root);
    write(&root.join("system/conf"), b"root's conf v1\n");
    common::chmod(&root.join("system"), 0o755);
    write(&root.join("drop/roots.txt"), b"root's v1\n");
    common::chmod(&root.join("drop"), 0o1777);
    as_nobody(&root, "echo 'nobody v1' > drop/nobodys.txt");
    common::rewind_json(&root, &["checkpoint", "A"]);
    write(&root.join("system/conf"), b"root's conf v2\n");
    write(&root.join("system/new"), b"root's new file\n");
    write(&root.join("drop/roots.txt"), b"root's v2\n");
    // helper-45: root's directories made since, one holding root's file
    // and one sticky holding root's file: the rewind would delete them,
    // so it had to empty them, which the owner could not (reported kept,
    // yet deleted).
    write(&root.join("later/f"), b"root's later\n");
    common::chmod(&root.join("later"), 0o755);
    write(&root.join("tmp/f"), b"root's in sticky\n");
    common::chmod(&root.join("tmp"), 0o1777);
    as_nobody(
        &root,
        "echo 'mine v2' > mine.txt && echo 'nobody v2' > drop/nobodys.txt",
    );
    // Confined as root's server confines the owner's `rewind mcp`.
    let canonical = root.canonicalize().expect("canonical");
    let confined = [("REWIND_CONFINE", canonical.to_str().expect("utf8"))];
    let for_owner = |args: &[&str]| -> serde_json::Value {
        let out = common::rewind_env(&root, &[&["--json"][..], args].concat(), &confined);
        assert!(out.status.success(), "{args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let plan = for_owner(&["rewind", "A", "--dry-run"]);
    let out = for_owner(&["rewind", "A"]);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    assert_eq!(read("mine.txt"), "mine v1\n", "{out}");
    assert_eq!(read("drop/nobodys.txt"), "nobody v1\n", "{out}");
    assert_eq!(read("system/conf"), "root's conf v2\n", "{out}");
    assert_eq!(read("system/new"), "root's new file\n", "{out}");
    assert_eq!(read("drop/roots.txt"), "root's v2\n", "{out}");
    assert_eq!(read("later/f"), "root's later\n", "{out}");
    assert_eq!(read("tmp/f"), "root's in sticky\n", "{out}");
    for report in [&plan, &out] {
        let kept = common::paths_in(report, "kept");
        for p in [
            "system/conf",
            "system/new",
            "drop/roots.txt",
            "later",
            "tmp",
        ] {
            assert!(kept.contains(&p), "{p} not reported kept: {report}");
        }
        assert!(!kept.contains(&"mine.txt"), "{report}");
    }
}

/// Root's commands in a user's workspace never follow the user's
/// symlinks in `.rewind/` (helper-20, D160): `.rewind/lock` linked to a
/// file of root's made root's checkpoint chown that file to the user and
/// write its pid into it (`/etc/ld.so.preload` would have given the user
/// root); `.rewind/ledger.db` linked to another workspace's ledger made
/// root's commands read, append to and prune that one.
#[test]
fn root_never_follows_a_users_symlinks_in_the_history() {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("a.txt"), b"a\n");
    common::give_to_nobody(&root);
    let bin = env!("CARGO_BIN_EXE_rewind");
    as_nobody(&root, &format!("{bin} checkpoint -q"));
    let victim = dir.path().join("victim");
    write(&victim, b"root's own\n");
    as_nobody(
        &root,
        &format!("rm .rewind/lock; ln -s {} .rewind/lock", victim.display()),
    );
    let out = common::rewind(&root, &["checkpoint", "-q"]);
    assert!(!out.status.success(), "{out:?}");
    let md = std::fs::metadata(&victim).expect("stat");
    assert_eq!((md.uid(), md.gid()), (0, 0), "the victim was given away");
    assert_eq!(std::fs::read(&victim).expect("read"), b"root's own\n");

    // Another workspace's ledger behind the user's.
    let other = dir.path().join("other");
    write(&other.join("o.txt"), b"o\n");
    common::checkpoint_id(&other, &["other's"]);
    let before = std::fs::read(other.join(".rewind/ledger.db")).expect("read");
    as_nobody(
        &root,
        &format!(
            "rm .rewind/lock && mv .rewind/ledger.db .rewind/mine.db && ln -s {} .rewind/ledger.db",
            other.join(".rewind/ledger.db").display()
        ),
    );
    let out = common::rewind(&root, &["--json", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && !text.contains("other's"), "{text}");
    let out = common::rewind(&root, &["checkpoint", "-q"]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(other.join(".rewind/ledger.db")).expect("read"),
        before,
        "the other ledger was written"
    );
}

/// What a checkpoint skipped (a root-owned 0600 file, a root-owned 0700
/// directory) is not in it; once it became readable (`sudo chown -R`), a
/// rewind to that checkpoint deleted it, as if it had not existed then
/// (helper-18). It is kept, and the report says why (D143).
#[test]
fn what_a_checkpoint_could_not_read_is_kept_by_a_rewind_to_it() {
    if !common::is_root() {
        common::skip_or_fail("switching to another user needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    let nobody = |cmd: &str| as_nobody(root, cmd);
    std::os::unix::fs::chown(root, Some(65534), Some(65534)).expect("chown");
    let bin = env!("CARGO_BIN_EXE_rewind");
    write(&root.join("secret.js"), b"root's\n");
    common::chmod(&root.join("secret.js"), 0o600);
    write(&root.join("dist/app.js"), b"built as root\n");
    common::chmod(&root.join("dist"), 0o700);
    let out = nobody(&format!("echo a > a.txt && {bin} --json checkpoint a"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let skipped: Vec<&str> = v["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .filter_map(|k| k["path"].as_str())
        .collect();
    assert!(
        skipped.contains(&"secret.js") && skipped.contains(&"dist"),
        "{v}"
    );
    common::give_to_nobody(root);
    nobody("echo b > a.txt");
    let out = nobody(&format!("{bin} --json rewind a"));
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(std::fs::read(root.join("a.txt")).expect("a"), b"a\n");
    assert_eq!(
        std::fs::read(root.join("secret.js")).expect("kept"),
        b"root's\n",
        "{v}"
    );
    assert_eq!(
        std::fs::read(root.join("dist/app.js")).expect("kept"),
        b"built as root\n",
        "{v}"
    );
    let kept = common::paths_in(&v, "kept");
    assert!(kept.contains(&"secret.js") && kept.contains(&"dist"), "{v}");
    // The same plan for a dry run and for a rewind finished after a crash.
    let out = nobody(&format!("{bin} --json rewind a --dry-run"));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(d["changes"]["deleted"], 0, "{d}");
}

/// POSIX ACLs are restored with the file (D145): without them a 0600
/// file with `u:nobody:rw` came back 0660, its group bits being the
/// ACL's mask, and its group could read it. A directory's default ACL
/// comes back too, and a changed ACL is a change `status` shows.
#[test]
fn a_rewind_restores_posix_acls_and_never_widens_access() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("secret"), b"salary\n");
    common::chmod(&root.join("secret"), 0o600);
    std::fs::create_dir(root.join("d")).expect("mkdir");
    let sh = |cmd: &str| {
        let out = Command::new("sh")
            .args(["-c", cmd])
            .current_dir(root)
            .output()
            .expect("sh");
        assert!(out.status.success(), "{cmd}: {out:?}");
        out.stdout
    };
    match Command::new("setfacl").arg("--version").output() {
        Ok(_) => {}
        Err(e) => {
            common::skip_or_fail(&format!("setfacl: {e} (apt-get install acl)"));
            return;
        }
    }
    sh("setfacl -m u:nobody:rw,g::--- secret && setfacl -d -m u:nobody:rx d");
    let acls = || sh("getfacl -p secret d");
    let before = acls();
    let a = checkpoint_id(root, &[]);
    sh("echo leaked > secret && setfacl -b secret && setfacl -k d");
    let st = rewind_json(root, &["status"]);
    let changed = common::changed_paths(&st);
    assert!(
        changed.contains(&"secret") && changed.contains(&"d"),
        "{st}"
    );
    rewind_json(root, &["rewind", &a]);
    assert_eq!(
        std::fs::read(root.join("secret")).expect("read"),
        b"salary\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&acls()),
        String::from_utf8_lossy(&before),
        "the ACLs as they were"
    );
}

/// A rewind stopped by an immutable file says which and how to free it,
/// not only "Operation not permitted ... fix the cause" (D146); it is
/// rolled back, the file as it was.
#[test]
fn an_immutable_file_in_the_way_is_named_with_the_chattr_that_frees_it() {
    if !common::is_root() {
        common::skip_or_fail("chattr +i needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"a\n");
    let a = checkpoint_id(root, &[]);
    write(&root.join("f"), b"b\n");
    let chattr = |flag: &str| {
        Command::new("chattr")
            .arg(flag)
            .arg(root.join("f"))
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        common::skip_or_fail("chattr +i is not supported on the temp dir's filesystem");
        return;
    }
    struct Unlock<F: Fn(&str) -> bool>(F);
    impl<F: Fn(&str) -> bool> Drop for Unlock<F> {
        fn drop(&mut self) {
            (self.0)("-i");
        }
    }
    let _unlock = Unlock(chattr);
    let out = rewind(root, &["--json", "rewind", &a]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert_eq!(v["error"]["code"], "ROLLED_BACK", "{v}");
    assert!(
        msg.contains(&format!("sudo chattr -i -a {}", root.join("f").display())),
        "{msg}"
    );
    assert_eq!(std::fs::read(root.join("f")).expect("f"), b"b\n");
}

#[test]
fn rewindignore_excludes_paths_and_ignored_files_survive_rewinds() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join(".rewindignore"), b"*.log\nbuild/\n");
    write(&root.join("src.rs"), b"1");
    write(
        &root.join("node_modules/pkg/index.js"),
        b"captured by default",
    );
    write(&root.join(".gitignore"), b"node_modules\n");
    let a = checkpoint_id(root, &[]);
    write(&root.join("run.log"), b"ignored");
    write(&root.join("build/out.o"), b"ignored too");
    write(&root.join("src.rs"), b"2");
    std::fs::remove_dir_all(root.join("node_modules")).expect("rm");
    let st = rewind_json(root, &["status"]);
    let paths = common::changed_paths(&st);
    assert!(
        !paths
            .iter()
            .any(|p| p.contains("log") || p.starts_with("build")),
        "{paths:?}"
    );
    rewind_json(root, &["rewind", &a]);
    assert_eq!(
        std::fs::read(root.join("node_modules/pkg/index.js")).expect("nm"),
        b"captured by default"
    );
    assert_eq!(
        std::fs::read(root.join("run.log")).expect("log"),
        b"ignored",
        "ignored files are never touched"
    );
    assert!(root.join("build/out.o").exists());
}

/// D111: a path a checkpoint holds that is now ignored (`.rewind/ignore`
/// or `.rewindignore`) keeps its live content through a rewind to that
/// checkpoint, and so does a file the capture could not read; they are
/// reported as kept. Before, the old content was renamed over them (lost
/// for good: no checkpoint holds what was there), or, where a directory
/// stood, the rewind failed with ROLLED_BACK "Is a directory".
#[test]
fn a_rewind_never_replaces_what_no_checkpoint_captured() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("data/model.bin"), b"old data");
    write(&root.join("out"), b"out was a file");
    write(&root.join("main.py"), b"v1");
    let a = checkpoint_id(root, &["a"]);
    write(&root.join(".rewind/ignore"), b"data/\nout\nmore/\n");
    write(&root.join("data/model.bin"), b"NEW precious data");
    std::fs::remove_file(root.join("out")).expect("rm out");
    write(&root.join("out/inside"), b"out is an ignored directory now");
    write(&root.join("main.py"), b"v2");
    let out = rewind(root, &["--json", "rewind", &a]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(std::fs::read(root.join("main.py")).expect("main"), b"v1");
    assert_eq!(
        std::fs::read(root.join("data/model.bin")).expect("data"),
        b"NEW precious data",
        "an ignored file was overwritten"
    );
    assert_eq!(
        std::fs::read(root.join("out/inside")).expect("out"),
        b"out is an ignored directory now"
    );
    let kept = common::paths_in(&v, "kept");
    assert!(kept.contains(&"out"), "{v}");
    assert!(kept.iter().any(|k| k.starts_with("data")), "{v}");
}

/// D167: a rewind deletes nothing its target's own `.rewindignore`
/// excludes. A rewind to a checkpoint taken before `data/` and `*.csv`
/// were ignored brings the older, empty rule file back and leaves both
/// alone (no side holds them); `undo` then captured under the empty rules
/// and deleted them, though the tree it goes back to had set them aside.
/// A directory the target lacks that holds such a file stays, emptied of
/// the rest.
#[test]
fn an_undo_keeps_what_its_target_ignores_though_the_live_rules_do_not() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join(".rewindignore"), b"");
    write(&root.join("main.c"), b"v1");
    write(&root.join("src/lib.c"), b"lib");
    let c1 = checkpoint_id(root, &["c1"]);
    write(&root.join(".rewindignore"), b"data/\n*.csv\n");
    write(&root.join("data/big.bin"), b"a data set");
    write(&root.join("src/table.csv"), b"generated");
    write(&root.join("main.c"), b"v2");
    rewind_json(root, &["rewind", &c1]);
    assert_eq!(std::fs::read(root.join("main.c")).expect("main"), b"v1");
    assert_eq!(
        std::fs::read(root.join(".rewindignore")).expect("rules"),
        b""
    );
    // Made under c1's rules, which ignore nothing.
    write(&root.join("out/report.csv"), b"a report");
    write(&root.join("out/notes.txt"), b"notes");

    let plan = rewind_json(root, &["undo", "--dry-run"]);
    let planned = common::paths_in(&plan, "plan");
    assert!(planned.contains(&"main.c"), "{plan}");
    assert!(
        !planned
            .iter()
            .any(|p| p.starts_with("data") || p.ends_with(".csv") || *p == "out"),
        "{plan}"
    );
    let v = rewind_json(root, &["undo"]);
    assert_eq!(std::fs::read(root.join("main.c")).expect("main"), b"v2");
    assert_eq!(
        std::fs::read(root.join(".rewindignore")).expect("rules"),
        b"data/\n*.csv\n"
    );
    assert_eq!(
        std::fs::read(root.join("data/big.bin")).expect("data was deleted"),
        b"a data set"
    );
    assert_eq!(
        std::fs::read(root.join("src/table.csv")).expect("csv was deleted"),
        b"generated"
    );
    assert_eq!(
        std::fs::read(root.join("out/report.csv")).expect("report was deleted"),
        b"a report"
    );
    assert!(
        !root.join("out/notes.txt").exists(),
        "what the target does not ignore still goes"
    );
    let kept = common::paths_in(&v, "kept");
    for p in ["data", "src/table.csv", "out/report.csv"] {
        assert!(kept.contains(&p), "{p} not reported kept: {v}");
    }
    assert_eq!(std::fs::read(root.join("src/lib.c")).expect("lib"), b"lib");
}

/// A file the capture cannot read (another user's output in the
/// workspace, mode 000) is skipped by the checkpoint; a rewind to a
/// checkpoint that holds an older version of it keeps it, instead of
/// renaming the old one over it (D111).
#[test]
fn a_file_the_capture_could_not_read_is_kept_by_a_rewind() {
    if !common::is_root() {
        common::skip_or_fail("switching to another user needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    let nobody = |cmd: &str| as_nobody(root, cmd);
    std::os::unix::fs::chown(root, Some(65534), Some(65534)).expect("chown");
    let bin = env!("CARGO_BIN_EXE_rewind");
    nobody(&format!(
        "echo v1 > db.sqlite && echo a > a.txt && {bin} checkpoint a -q"
    ));
    std::fs::remove_file(root.join("db.sqlite")).expect("rm");
    write(&root.join("db.sqlite"), b"root-owned container output\n");
    common::chmod(&root.join("db.sqlite"), 0o600);
    nobody("echo b > a.txt");
    // `status` says what the next checkpoint records (it will not hold
    // the file: deleted) and that the file is still there (D121).
    let st = nobody(&format!("{bin} --json status"));
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).expect("json");
    assert!(
        st["changes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["path"] == "db.sqlite"
                && c["status"] == "deleted"
                && c["uncaptured"].as_str().is_some())),
        "{st}"
    );
    assert!(
        st["skipped"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k["path"] == "db.sqlite")),
        "{st}"
    );
    let out = nobody(&format!("{bin} --json rewind a"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(std::fs::read(root.join("a.txt")).expect("a"), b"a\n");
    assert_eq!(
        std::fs::read(root.join("db.sqlite")).expect("db"),
        b"root-owned container output\n",
        "an unreadable file was overwritten: {v}"
    );
    assert!(
        v["kept"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k["path"] == "db.sqlite")),
        "{v}"
    );
}

/// D121: `status` agrees with `diff` and with what `checkpoint` records
/// when a captured file becomes something the capture skips (a FIFO):
/// deleted from the next checkpoint's tree, marked as still there. It
/// said "no changes" while the checkpoint counted a deletion.
#[test]
fn status_counts_a_path_the_capture_skips_as_the_checkpoint_does() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("x"), b"data");
    write(&root.join("keep.txt"), b"k");
    let a = common::checkpoint_id(root, &["a"]);
    std::fs::remove_file(root.join("x")).expect("rm");
    let st = Command::new("mkfifo")
        .arg(root.join("x"))
        .status()
        .expect("mkfifo");
    assert!(st.success());
    let status = common::rewind_json(root, &["status"]);
    let diff = common::rewind_json(root, &["diff", &a]);
    assert_eq!(common::changed_paths(&status), ["x"], "{status}");
    assert_eq!(common::changed_paths(&diff), ["x"], "{diff}");
    assert_eq!(status["changes"][0]["status"], "deleted", "{status}");
    assert!(
        status["changes"][0]["uncaptured"].as_str().is_some(),
        "{status}"
    );
    let human = common::rewind(root, &["status"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("D x (still there, but not captured: "),
        "{human}"
    );
    let ck = common::rewind_json(root, &["checkpoint"]);
    assert_eq!(ck["changes"]["deleted"], 1, "{ck}");
}

/// D309: a path HEAD holds that a rule just added to `.rewindignore`
/// leaves out is still on disk: `status` says so once per subtree, where
/// it printed `D build` and `D build/o.o` like a deletion. A path really
/// deleted keeps its plain `D`.
#[test]
fn status_marks_a_newly_ignored_path_as_still_there_not_deleted() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("build/o.o"), b"object");
    write(&root.join("build/sub/p"), b"p");
    write(&root.join("x.log"), b"log");
    write(&root.join("gone/g"), b"g");
    common::checkpoint_id(root, &["a"]);
    write(&root.join(".rewindignore"), b"build/\n*.log\n");
    std::fs::remove_dir_all(root.join("gone")).expect("rm gone");
    let status = common::rewind_json(root, &["status"]);
    let uncaptured = |p: &str| {
        let c = status["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .find(|c| c["path"] == p)
            .unwrap_or_else(|| panic!("{p} not listed: {status}"));
        assert_eq!(c["status"], "deleted", "{status}");
        c["uncaptured"].as_str().map(str::to_string)
    };
    for p in ["build", "build/o.o", "build/sub", "build/sub/p", "x.log"] {
        let why = uncaptured(p).unwrap_or_else(|| panic!("{p} shown as deleted: {status}"));
        assert!(why.contains("ignore rules"), "{why}");
    }
    for p in ["gone", "gone/g"] {
        assert_eq!(uncaptured(p), None, "{p} was deleted: {status}");
    }
    let human = common::rewind(root, &["status"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("D build (still there, but not captured: the ignore rules"),
        "{human}"
    );
    assert!(human.contains("D build/o.o (still there)\n"), "{human}");
    assert!(human.contains("D gone\n"), "{human}");
}

/// D115: as a user who owns the workspace, a change inside a directory
/// its owner may not write (mode 555 or 500: `chmod -R a-w`, a Go module
/// cache) is rewound, and the directory keeps its mode. Before, every
/// rewind of such a change failed with ROLLED_BACK ("Permission denied").
#[test]
fn a_non_root_rewind_changes_files_inside_read_only_directories() {
    if !common::is_root() {
        common::skip_or_fail("switching to another user needs root");
        return;
    }
    let dir = common::tmp();
    read_only_directories_in(dir.path());
    // On btrfs a rewind after the first makes its few entries durable by
    // fsync, opening their parents again: those must keep their modes too.
    if let Some(lfs) = common::LoopFs::new(common::Fs::Btrfs, 256) {
        read_only_directories_in(&lfs.subdir("ws"));
    }
}

fn read_only_directories_in(root: &Path) {
    std::os::unix::fs::chown(root, Some(65534), Some(65534)).expect("chown");
    let bin = env!("CARGO_BIN_EXE_rewind");
    let nobody = |cmd: &str| as_nobody(root, cmd);
    nobody(&format!(
        "mkdir -p d/sub e && echo v1 > d/f && echo s1 > d/sub/g && echo keep > e/k && chmod 500 d/sub && chmod 555 d && {bin} checkpoint a -q"
    ));
    nobody(
        "chmod 755 d d/sub && echo v3 > d/f && echo s3 > d/sub/g && echo extra > d/x && chmod 555 d && chmod 500 d/sub && echo extra > e/y && chmod 555 e",
    );
    let before = snapshot(root);
    nobody(&format!("{bin} rewind a -q"));
    let mode = |p: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.join(p)).expect("stat").permissions(),
        ) & 0o777
    };
    assert_eq!(std::fs::read(root.join("d/f")).expect("f"), b"v1\n");
    assert_eq!(std::fs::read(root.join("d/sub/g")).expect("g"), b"s1\n");
    assert!(!root.join("d/x").exists() && !root.join("e/y").exists());
    assert_eq!((mode("d"), mode("d/sub"), mode("e")), (0o555, 0o500, 0o755));
    // And back: undo restores the read-only directories' contents too.
    nobody(&format!("{bin} undo -q"));
    assert_same("after undo", &before, &snapshot(root));
    nobody(&format!("{bin} undo -q"));
    assert_eq!((mode("d"), mode("d/sub"), mode("e")), (0o555, 0o500, 0o755));
}

/// D116: a file written after the rewind captured it (a log a test runner
/// still appends to) is neither replaced nor deleted: that write is in no
/// checkpoint. It is left as it is and listed as kept; the other files
/// reach the target.
#[test]
fn a_file_written_during_the_rewind_is_kept_not_lost() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("F"), b"v1");
    write(&root.join("G"), b"v1");
    write(&root.join("H"), b"h");
    let a = checkpoint_id(root, &[]);
    write(&root.join("F"), b"v2 agent work");
    write(&root.join("G"), b"v2");
    write(&root.join("new.log"), b"created after a");
    let v = common::rewind_json_stopped_at(root, &["rewind", &a], "rewind:after-intent", || {
        // Written after the capture: one to be replaced, one to be deleted.
        write(&root.join("F"), b"v3 IMPORTANT, written during the rewind");
        write(&root.join("new.log"), b"appended during the rewind");
    });
    assert_eq!(
        std::fs::read(root.join("F")).expect("F"),
        b"v3 IMPORTANT, written during the rewind"
    );
    assert_eq!(
        std::fs::read(root.join("new.log")).expect("log"),
        b"appended during the rewind"
    );
    assert_eq!(std::fs::read(root.join("G")).expect("G"), b"v1");
    let kept = common::paths_in(&v, "kept");
    assert!(kept.contains(&"F") && kept.contains(&"new.log"), "{v}");
}

/// D213: a rewind whose apply met a directory swapped for a symlink
/// finished from a fresh capture that stored nothing, and its plan
/// deleted what had been made in the tree meanwhile: a log written
/// during the rewind and the moved directory's new file were in no
/// checkpoint (helper-30). They are now saved in a checkpoint before
/// the plan is made again, and the report says which.
#[test]
fn what_is_made_during_a_retried_rewind_is_saved_first() {
    let dir = common::tmp();
    let root = dir.path();
    for i in 1..=5 {
        write(&root.join(format!("a/{i}")), format!("a{i}\n").as_bytes());
        write(&root.join(format!("b/{i}")), format!("b{i}\n").as_bytes());
    }
    let a = checkpoint_id(root, &[]);
    for i in 1..=5 {
        write(&root.join(format!("a/{i}")), b"edited\n");
        write(&root.join(format!("b/{i}")), b"edited\n");
    }
    let v = common::rewind_json_stopped_at(root, &["rewind", &a], "apply:file-written:1", || {
        write(&root.join("logs/server.log"), b"PRECIOUS log line\n");
        std::fs::rename(root.join("b"), root.join("b.moved")).expect("move b");
        std::os::unix::fs::symlink("b.moved", root.join("b")).expect("symlink b");
        write(&root.join("b.moved/new"), b"PRECIOUS new file\n");
    });
    let warning = v["warning"].as_str().unwrap_or_else(|| panic!("{v}"));
    let saved = warning
        .rsplit("checkpoint ")
        .next()
        .expect("the saved checkpoint")
        .to_string();
    assert_eq!(std::fs::read(root.join("b/1")).expect("b/1"), b"b1\n");
    // Everything made during the rewind comes back from that checkpoint.
    rewind_json(root, &["rewind", &saved]);
    assert_eq!(
        std::fs::read(root.join("logs/server.log")).expect("the log"),
        b"PRECIOUS log line\n"
    );
    assert_eq!(
        std::fs::read(root.join("b.moved/new")).expect("the new file"),
        b"PRECIOUS new file\n"
    );
    assert!(root.join("b").is_symlink());
}

/// D217: a `.rewindignore` written after checkpoint A (by the agent being
/// rewound) hid what A holds from the rewind's capture, so `rewind A`
/// kept the wrecked file, saying only "ignored, unreadable, or made
/// since"; with `*`, the rule file hid itself too, was never removed,
/// and no rewind restored anything. A rule file is now always captured,
/// so the first rewind removes it and says why it kept the rest, and the
/// same rewind again restores it; the wrecked file stays in a safety
/// checkpoint.
#[test]
fn a_rewindignore_written_after_the_target_cannot_stop_its_rewind() {
    // D223: one that is not UTF-8 stopped every rewind (and checkpoint).
    for rule in [&b"src/\n"[..], b"*\n", b"src/\n\xff\n"] {
        let dir = common::tmp();
        let root = dir.path();
        write(&root.join("src/main.c"), b"int main() { return 0; }\n");
        let a = checkpoint_id(root, &[]);
        write(&root.join(".rewindignore"), rule);
        write(&root.join("src/main.c"), b"WRECKED\n");
        let first = rewind_json(root, &["rewind", &a]);
        assert!(!root.join(".rewindignore").exists(), "{rule:?}: {first}");
        assert!(
            first["kept"]
                .to_string()
                .contains("a .rewindignore in the tree now excludes it"),
            "{rule:?}: {first}"
        );
        let second = rewind_json(root, &["rewind", &a]);
        assert_eq!(
            std::fs::read(root.join("src/main.c")).expect("main.c"),
            b"int main() { return 0; }\n",
            "{rule:?}: {second}"
        );
        // The wrecked file is the second rewind's safety checkpoint's.
        rewind_json(root, &["undo"]);
        assert_eq!(
            std::fs::read(root.join("src/main.c")).expect("main.c"),
            b"WRECKED\n",
            "{rule:?}"
        );
    }
    // Rules kept outside the tree still decide for a rule file: one named
    // in `.rewind/ignore` is never captured, so no rewind touches it.
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("src/main.c"), b"v1\n");
    let a = checkpoint_id(root, &[]);
    std::fs::write(root.join(".rewind/ignore"), b".rewindignore\n").expect("state rules");
    write(&root.join(".rewindignore"), b"build/\n");
    let r = rewind_json(root, &["rewind", &a]);
    assert_eq!(
        std::fs::read(root.join(".rewindignore")).expect("kept"),
        b"build/\n",
        "{r}"
    );
}

/// D219: a FIFO where the target has a file or directory is never
/// replaced (it is never captured), but the rewind said the tree
/// "already equals it" and the reason read "ignored, unreadable, or made
/// since the capture" (helper-30). It now names the FIFO and what to do,
/// and the headline says the tree differs where it keeps things.
#[test]
fn a_fifo_in_the_way_is_named_and_the_tree_is_not_said_to_equal_the_target() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("data/table.csv"), b"a,b\n");
    let a = checkpoint_id(root, &[]);
    std::fs::remove_dir_all(root.join("data")).expect("rm data");
    let made = Command::new("mkfifo")
        .arg(root.join("data"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let v = rewind_json(root, &["rewind", &a]);
    assert!(v["kept"].to_string().contains("a fifo is there now"), "{v}");
    let out = rewind(root, &["rewind", &a]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("already equals"), "{text}");
    assert!(
        text.contains("differs from it only where it keeps"),
        "{text}"
    );
    std::fs::remove_file(root.join("data")).expect("rm the fifo");
    rewind_json(root, &["rewind", &a]);
    assert_eq!(
        std::fs::read(root.join("data/table.csv")).expect("table"),
        b"a,b\n"
    );
}

/// D220: a file another process held open for writing was replaced by
/// the rewind without a word; that process went on writing into the
/// replaced file, which no checkpoint holds (helper-30: a server's log
/// lost every line after the rewind). The rewind now says which files
/// and which process, and says nothing when no writer holds one.
#[test]
fn a_file_held_open_for_writing_is_named_when_a_rewind_replaces_it() {
    let Some(lfs) = common::LoopFs::new(common::Fs::Xfs, 512) else {
        return;
    };
    let root = lfs.subdir("held");
    write(&root.join("server.log"), b"line 1\n");
    write(&root.join("other.txt"), b"one\n");
    let a = checkpoint_id(&root, &[]);
    write(&root.join("other.txt"), b"two\n");
    let mut writer = Command::new("sh")
        .args(["-c", "exec 3>>server.log; echo line 2 >&3; exec sleep 60"])
        .current_dir(&root)
        .spawn()
        .expect("start the writer");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(root.join("server.log")).expect("log") == b"line 1\n" {
        assert!(Instant::now() < deadline, "the writer never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = rewind_json(&root, &["rewind", &a]);
    common::assert_held_open_named(&v, "server.log", writer.id(), "other.txt");
    let _ = writer.kill();
    let _ = writer.wait();
    write(&root.join("server.log"), b"line 3\n");
    let v = rewind_json(&root, &["rewind", &a]);
    assert!(v.get("warning").is_none(), "no writer, no warning: {v}");
}

/// D172: a directory the rewind just made, removed by another program
/// before the rewind wrote into it (a watcher, a build, `npm install`
/// churning the tree), is left removed and listed as kept; the rest of the
/// plan reaches the target and nothing is left pending. Before, the write
/// failed with a bare IO error, the retry and the roll-back met the same
/// ENOENT, and the next command, even `status`, finished the rewind.
#[test]
fn a_directory_removed_during_the_rewind_is_kept_removed_and_the_rest_rewinds() {
    let dir = common::tmp();
    let root = dir.path();
    for d in ["d1", "d2", "d3"] {
        write(&root.join(d).join("x"), d.as_bytes());
    }
    write(&root.join("F"), b"v1");
    let a = checkpoint_id(root, &[]);
    for d in ["d1", "d2", "d3"] {
        std::fs::remove_dir_all(root.join(d)).expect("rm");
    }
    write(&root.join("F"), b"v2");
    let v = common::rewind_json_stopped_at(root, &["rewind", &a], "apply:dir-created", || {
        // The first directory made (plans are in path order): d1, still empty.
        std::fs::remove_dir(root.join("d1")).expect("another program removes d1");
    });
    assert_eq!(common::paths_in(&v, "kept"), ["d1"], "{v}");
    assert!(!root.join("d1").exists());
    assert_eq!(std::fs::read(root.join("d2/x")).expect("d2"), b"d2");
    assert_eq!(std::fs::read(root.join("d3/x")).expect("d3"), b"d3");
    assert_eq!(std::fs::read(root.join("F")).expect("F"), b"v1");
    // Nothing pending: the next command finishes no rewind.
    let st = rewind(root, &["status"]);
    let said =
        String::from_utf8_lossy(&st.stderr).into_owned() + &String::from_utf8_lossy(&st.stdout);
    assert!(!said.contains("interrupted"), "{said}");
    assert_eq!(std::fs::read(root.join("F")).expect("F"), b"v1");
}

/// A directory its owner can open but not search (mode 400: read without
/// execute) stopped every checkpoint and rewind with "read directory:
/// Permission denied" and no remedy (listing it reopens "." inside it). It is skipped and reported, like a file that cannot be read,
/// and a rewind keeps it (D111) while restoring the rest.
#[test]
fn an_unlistable_directory_is_skipped_not_fatal() {
    if !common::is_root() {
        common::skip_or_fail("switching to another user needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    std::os::unix::fs::chown(root, Some(65534), Some(65534)).expect("chown");
    let bin = env!("CARGO_BIN_EXE_rewind");
    let nobody = |cmd: &str| as_nobody(root, cmd);
    nobody(&format!(
        "mkdir secret && echo s > secret/x && echo a1 > a.txt && {bin} checkpoint a -q"
    ));
    nobody("chmod 400 secret && echo a2 > a.txt");
    let out = nobody(&format!("{bin} --json checkpoint b"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v["skipped"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k["path"] == "secret")),
        "{v}"
    );
    nobody(&format!("{bin} rewind a -q"));
    assert_eq!(std::fs::read(root.join("a.txt")).expect("a"), b"a1\n");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(root.join("secret"))
            .expect("stat")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o400, "the unlistable directory was changed");
}

#[test]
fn the_failpoint_stop_action_is_inert_without_the_env() {
    // Guard against a failpoint leaking into normal runs.
    let dir = common::tmp();
    write(&dir.path().join("f"), b"1");
    let out = rewind_env(
        dir.path(),
        &["checkpoint", "-q"],
        &[("REWIND_FAILPOINT", "no-such-point")],
    );
    assert!(out.status.success());
    assert!(rewind(dir.path(), &["list"]).status.success());
}

/// A temp directory that other users may enter, for a workspace the
/// test gives to `nobody`; `None`, skipped, unless running as root.
fn tmp_others_can_enter() -> Option<tempfile::TempDir> {
    if !common::is_root() {
        common::skip_or_fail("running as another user needs root");
        return None;
    }
    let dir = common::tmp();
    common::chmod(dir.path(), 0o755);
    Some(dir)
}

/// Run `cmd` with `sh` as the user `nobody` in `root`; it must succeed.
fn as_nobody(root: &Path, cmd: &str) -> std::process::Output {
    let out = Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c", cmd])
        .current_dir(root)
        .output()
        .expect("su");
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// D260 (helper-42): a user's rewind that had to replace their own file
/// in root's directory (`cfg/`, mode 755) failed whole and rolled back
/// ("rename …: Permission denied"), and `--dry-run` showed nothing
/// wrong. It now rewinds the rest and keeps that entry, naming whose
/// directory it is, in the dry run too.
#[test]
fn a_users_rewind_keeps_what_they_cannot_change_and_rewinds_the_rest() {
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    write(&root.join("mine.txt"), b"one\n");
    write(&root.join("cfg/app.conf"), b"v1\n");
    common::give_to_nobody(&root);
    std::os::unix::fs::chown(root.join("cfg"), Some(0), Some(0)).expect("chown");
    common::chmod(&root.join("cfg"), 0o755);
    let bin = env!("CARGO_BIN_EXE_rewind");
    as_nobody(
        &root,
        &format!("{bin} checkpoint -q one && echo two > mine.txt && echo v2 > cfg/app.conf"),
    );
    let kept_conf = |v: &serde_json::Value| {
        v["kept"].as_array().is_some_and(|k| {
            k.iter().any(|e| {
                e["path"] == "cfg/app.conf"
                    && e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("uid 0") && r.contains("mode 755"))
            })
        })
    };
    // helper-43: root's directory made since, with a file in it, which
    // the rewind must delete (its own parent is nobody's); and root's
    // directory an ACL lets nobody write, whose file nobody changed.
    write(&root.join("r/f"), b"root's\n");
    common::chmod(&root.join("r"), 0o755);
    let st = Command::new("sh")
        .arg("-c")
        .arg("mkdir acl && echo a1 > acl/f && chown nobody: acl/f && setfacl -m u:65534:rwx acl")
        .current_dir(&root)
        .status()
        .expect("sh");
    assert!(st.success(), "setfacl (package acl) is needed");
    as_nobody(
        &root,
        &format!("{bin} checkpoint -q two && echo a2 > acl/f"),
    );
    // helper-45: a sticky directory of root's holding root's file (it
    // cannot be emptied: kept, while nobody's file in it goes), and an
    // empty directory of root's in nobody's own (it can go: an empty
    // directory needs no write access of its own).
    write(&root.join("s/f"), b"root's\n");
    common::chmod(&root.join("s"), 0o1777);
    std::fs::create_dir_all(root.join("d/e")).expect("mkdir");
    std::os::unix::fs::chown(root.join("d"), Some(65534), Some(65534)).expect("chown");
    as_nobody(&root, "echo u > s/u");
    as_nobody(&root, &format!("{bin} rewind -q two"));
    assert_eq!(std::fs::read(root.join("acl/f")).expect("read"), b"a1\n");
    assert!(root.join("s/f").exists() && !root.join("s/u").exists());
    assert!(
        !root.join("d").exists(),
        "nobody's d, root's empty d/e in it"
    );
    let kept_r = |v: &serde_json::Value| {
        v["kept"].as_array().is_some_and(|k| {
            k.iter().any(|e| {
                e["path"] == "r"
                    && e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("a directory in it belongs to uid 0"))
            })
        })
    };
    let dry = as_nobody(&root, &format!("{bin} --json rewind one --dry-run"));
    let v: serde_json::Value = serde_json::from_slice(&dry.stdout).expect("json");
    assert!(kept_conf(&v) && kept_r(&v), "{v}");
    // The human dry run lists them too.
    let human = as_nobody(&root, &format!("{bin} rewind one --dry-run"));
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("  cfg/app.conf: kept: "), "{human}");
    let done = as_nobody(&root, &format!("{bin} --json rewind one"));
    let v: serde_json::Value = serde_json::from_slice(&done.stdout).expect("json");
    assert!(kept_conf(&v) && kept_r(&v), "{v}");
    assert_eq!(
        std::fs::read(root.join("mine.txt")).expect("read"),
        b"one\n"
    );
    assert_eq!(
        std::fs::read(root.join("cfg/app.conf")).expect("read"),
        b"v2\n"
    );
    assert_eq!(std::fs::read(root.join("r/f")).expect("read"), b"root's\n");
}

/// `-C` into a directory behind one this user may not enter said "does
/// not exist" (helper-79): it says the user cannot reach it.
#[test]
fn a_directory_this_user_cannot_reach_is_named_as_such() {
    if !common::is_root() {
        return;
    }
    let dir = common::tmp();
    let closed = dir.path().join("closed");
    std::fs::create_dir_all(closed.join("ws")).expect("mkdir");
    common::chmod(dir.path(), 0o755);
    common::chmod(&closed, 0o700);
    let out = Command::new("su")
        .args(["-s", "/bin/sh", "nobody", "-c"])
        .arg(format!(
            "exec '{}' -C '{}' status",
            env!("CARGO_BIN_EXE_rewind"),
            closed.join("ws").display()
        ))
        .current_dir("/")
        .output()
        .expect("su");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be reached by this user"), "{err}");
    assert!(!err.contains("does not exist"), "{err}");
}

/// D346: a checkpoint reads files without setting their access time.
/// Under the default `relatime`, the first read of a file written since
/// its last access set it: a checkpoint told mail readers new mail had
/// been read, and `find -atime` that every edited file had been used. A
/// user cannot ask that of a file they do not own (`O_NOATIME` is
/// refused): it is read all the same.
#[test]
fn a_checkpoint_leaves_access_times_alone_and_still_reads_what_it_does_not_own() {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = tmp_others_can_enter() else {
        return;
    };
    let root = dir.path().join("ws");
    for f in ["mbox", "probe", "roots.txt"] {
        write(&root.join(f), format!("{f}\n").as_bytes());
    }
    common::give_to_nobody(&root);
    std::os::unix::fs::chown(root.join("roots.txt"), Some(0), Some(0)).expect("chown");
    // Read since last written: older than the mtime, as new mail is.
    let long_ago = |f: &str| {
        let st = Command::new("touch")
            .args(["-a", "-d", "@1000000000"])
            .arg(root.join(f))
            .status()
            .expect("touch");
        assert!(st.success());
    };
    let atime = |f: &str| std::fs::metadata(root.join(f)).expect("stat").atime();
    long_ago("probe");
    as_nobody(&root, "cat probe > /dev/null");
    if atime("probe") == 1_000_000_000 {
        common::skip_or_fail("this filesystem sets no access time on a read (noatime)");
        return;
    }
    long_ago("mbox");
    long_ago("roots.txt");
    let bin = env!("CARGO_BIN_EXE_rewind");
    as_nobody(&root, &format!("{bin} checkpoint -q first"));
    assert_eq!(
        atime("mbox"),
        1_000_000_000,
        "the checkpoint set mbox's atime"
    );
    // Read all the same: the checkpoint holds its bytes.
    std::fs::remove_file(root.join("roots.txt")).expect("rm");
    as_nobody(&root, &format!("{bin} restore -q first -- roots.txt"));
    assert_eq!(
        std::fs::read(root.join("roots.txt")).expect("read"),
        b"roots.txt\n"
    );
}
