//! History and addressing through the CLI: branches, replay, undo, notes,
//! dry runs with fingerprints, ids/prefixes/labels, restore of paths, diff,
//! and a shell whose cwd is inside the workspace surviving a rewind.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::{assert_same, checkpoint_id, git, rewind, rewind_json, snapshot, write};

#[test]
fn branch_replay_undo_are_exact_and_list_shows_the_branch_and_note() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("src/main.rs"), b"fn main() {}\n");
    write(&root.join("README"), b"v1\n");
    let a = checkpoint_id(root, &["A"]);
    let snap_a = snapshot(root);

    write(&root.join("src/main.rs"), b"fn main() { broken }\n");
    write(&root.join("src/lib.rs"), b"pub fn x() {}\n");
    let b = checkpoint_id(root, &["B"]);
    let snap_b = snapshot(root);

    let r = rewind_json(root, &["rewind", &a, "--report", "tests failed on B"]);
    assert_same("rewind to A", &snap_a, &snapshot(root));
    assert_eq!(r["rewound_to"], a.as_str());
    assert_eq!(
        r["safety_checkpoint"],
        b.as_str(),
        "the live tree equalled B, so B is the safety checkpoint"
    );
    assert!(r["effects_not_undone"].as_array().is_some());

    write(&root.join("README"), b"v2 on a branch\n");
    let c = rewind_json(root, &["checkpoint", "C"]);
    assert_eq!(
        c["parent"],
        a.as_str(),
        "a checkpoint after a rewind branches from the target"
    );
    let snap_c = snapshot(root);

    rewind_json(root, &["replay", &b]);
    assert_same("replay to B", &snap_b, &snapshot(root));
    rewind_json(root, &["undo"]);
    assert_same("undo of the replay", &snap_c, &snapshot(root));

    let list = rewind_json(root, &["list"]);
    let cks = list["checkpoints"].as_array().expect("checkpoints");
    let find = |id: &str| {
        cks.iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} not listed"))
    };
    assert_eq!(find(&b)["note"], "tests failed on B");
    assert_eq!(find(&b)["parent"], a.as_str());
    assert_eq!(list["head"], c["id"]);
    let human = String::from_utf8_lossy(&rewind(root, &["list"]).stdout).into_owned();
    assert!(
        human.contains("├─") && human.contains("note: tests failed on B"),
        "list shows branches and notes:\n{human}"
    );
    assert!(
        human.contains(&format!("@ {}", c["id"].as_str().expect("id"))),
        "HEAD is marked:\n{human}"
    );
}

/// A rewind or restore repeated (an agent's retry, the up-arrow) finds
/// nothing to do and records nothing. Recorded, it became the last
/// operation: `undo` led only back to the tree it already was, and the
/// safety checkpoint holding the agent's work lost gc's protection
/// (helper-19: `gc --keep-last 2` pruned it).
#[test]
fn a_repeated_rewind_leaves_undo_and_gc_with_the_work_it_saved() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"orig\n");
    write(&root.join("g"), b"g\n");
    let x = checkpoint_id(root, &["X"]);
    write(&root.join("f"), b"40 minutes of agent work\n");
    let first = rewind_json(root, &["rewind", &x]);
    let saved = first["safety_checkpoint"]
        .as_str()
        .expect("saved")
        .to_string();
    for again in [
        vec!["rewind", x.as_str()],
        vec!["restore", x.as_str(), "--", "f"],
    ] {
        let r = rewind_json(root, &again);
        assert_eq!(
            r["safety_checkpoint"],
            serde_json::Value::Null,
            "{again:?}: {r}"
        );
        assert_eq!(r["changes"]["written"], 0, "{again:?}");
        let human = String::from_utf8_lossy(&rewind(root, &again).stdout).into_owned();
        assert!(human.contains("already equals it; nothing done"), "{human}");
    }
    // gc keeps the work: it is still the last operation's safety checkpoint.
    for i in 0..3 {
        write(&root.join("g"), format!("n{i}\n").as_bytes());
        checkpoint_id(root, &[]);
    }
    let gc = rewind_json(root, &["gc", "--keep-last", "1", "--dry-run"]);
    let pruned = gc["pruned"].to_string();
    assert!(
        !pruned.contains(&saved),
        "gc would prune the saved work: {gc}"
    );
    rewind_json(root, &["undo"]);
    assert_eq!(
        std::fs::read(root.join("f")).expect("read"),
        b"40 minutes of agent work\n"
    );
}

/// D185: a rewind to another checkpoint whose tree the workspace already
/// is (the agent put the file back by hand) still moves HEAD there and
/// keeps its `--report` note, writing nothing; D155's no-op is for a
/// rewind to HEAD itself. Before, it answered "rewound to A" with HEAD
/// still at B, dropped the note, and `status` went on listing the
/// change against B.
#[test]
fn a_rewind_to_the_tree_the_workspace_already_is_moves_head_and_keeps_the_note() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"one\n");
    let a = checkpoint_id(root, &["A"]);
    write(&root.join("f"), b"two\n");
    let b = checkpoint_id(root, &["B"]);
    write(&root.join("f"), b"one\n");
    let r = rewind_json(root, &["rewind", &a, "--report", "went nowhere"]);
    assert_eq!(r["head"], a.as_str(), "{r}");
    assert_eq!(r["changes"]["written"], 0, "{r}");
    let saved = r["safety_checkpoint"]
        .as_str()
        .expect("a safety checkpoint")
        .to_string();
    assert_ne!(saved, b);
    let listed = listed(root, &saved);
    assert_eq!(listed["note"], "went nowhere", "{listed}");
    let status = rewind_json(root, &["status"]);
    assert_eq!(status["head"], a.as_str(), "{status}");
    assert_eq!(status["changes"], serde_json::json!([]), "{status}");
    // Once there, the same rewind is D155's no-op.
    let again = rewind_json(root, &["rewind", &a]);
    assert_eq!(
        again["safety_checkpoint"],
        serde_json::Value::Null,
        "{again}"
    );
    assert!(again.get("warning").is_none(), "{again}");
    assert_eq!(std::fs::read(root.join("f")).expect("read"), b"one\n");
    // D196: its report has no branch to go on, and says so instead of
    // vanishing.
    let noted = rewind_json(root, &["rewind", &a, "--report", "tried z"]);
    assert_eq!(noted["safety_checkpoint"], serde_json::Value::Null);
    assert!(
        noted["warning"]
            .as_str()
            .is_some_and(|w| w.contains("report was not stored")),
        "{noted}"
    );
    // D309: nor does a dry run's, which records nothing.
    std::fs::write(root.join("f"), b"changed\n").expect("write");
    let dry = rewind_json(
        root,
        &["rewind", &a, "--dry-run", "--report", "just looking"],
    );
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert!(
        dry["warning"]
            .as_str()
            .is_some_and(|w| w.contains("a dry run records nothing")),
        "{dry}"
    );
    assert_eq!(std::fs::read(root.join("f")).expect("read"), b"changed\n");
    std::fs::write(root.join("f"), b"one\n").expect("write");
    // On stderr, as `checkpoint`'s warnings, also under `-q` (helper-62).
    for args in [
        &["rewind", &a, "--report", "z"][..],
        &["-q", "rewind", &a, "--report", "z"],
    ] {
        let human = String::from_utf8_lossy(&rewind(root, args).stderr).into_owned();
        assert!(
            human.contains("rewind: warning: the report was not stored"),
            "{args:?}: {human}"
        );
    }
}

/// D189: a blank `--report` is no note, as over MCP; it was stored and
/// listed as `note:    `.
#[test]
fn a_blank_report_leaves_no_note() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"one\n");
    let a = checkpoint_id(root, &["A"]);
    write(&root.join("f"), b"two\n");
    let r = rewind_json(root, &["rewind", &a, "--report", "  \t "]);
    let saved = r["safety_checkpoint"].as_str().expect("saved").to_string();
    let c = listed(root, &saved);
    assert!(c.get("note").is_none_or(|n| n.is_null()), "{c}");
}

/// Checkpoint `id` as `list --json` shows it.
/// An automatic checkpoint with nothing changed reuses HEAD, and HEAD
/// keeps its own label: the label given was dropped with exit 0 and no
/// word, and a later `rewind LABEL` was UNKNOWN_ID (helper-33, D231). It
/// is still not recorded (a hook's label on every reuse would bury the
/// history), but the warning says so and how to record it.
#[test]
fn a_label_an_unchanged_automatic_checkpoint_cannot_keep_is_said() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"a\n");
    let head = checkpoint_id(root, &["first"]);
    let v = rewind_json(root, &["checkpoint", "before deploy", "--kind", "auto"]);
    assert_eq!(v["unchanged"], true, "{v}");
    assert_eq!(v["id"], head.as_str());
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("before deploy") && warnings.contains("was not recorded"),
        "{v}"
    );
    // The same label HEAD has: nothing to say.
    let v = rewind_json(root, &["checkpoint", "first", "--kind", "hook"]);
    assert!(v.get("warnings").is_none(), "{v}");
}

/// `checkpoint -m LABEL` is `checkpoint LABEL`, as `git commit -m` puts
/// it; both at once is a usage error that records nothing.
#[test]
fn checkpoint_takes_its_label_as_git_commit_takes_a_message() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"a\n");
    let v = rewind_json(root, &["checkpoint", "-m", "before refactor"]);
    assert_eq!(v["label"], "before refactor", "{v}");
    write(&root.join("a"), b"b\n");
    rewind_json(root, &["rewind", "before refactor"]);
    assert_eq!(std::fs::read(root.join("a")).unwrap(), b"a\n");
    let out = common::rewind(root, &["checkpoint", "x", "--message", "y"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    assert_eq!(
        listed_count(root),
        2,
        "only the first and the rewind's safety checkpoint"
    );
}

fn listed_count(root: &std::path::Path) -> usize {
    rewind_json(root, &["list"])["checkpoints"]
        .as_array()
        .map_or(0, Vec::len)
}

/// An entry whose type changes between the capture's stat and its read
/// (an editor's atomic save of a symlinked config, a tool rewriting a
/// link) is captured as what it is then: a symlink turned file failed
/// checkpoint, status and rewind with "readlink: Invalid argument", and a
/// file turned symlink was left out of the capture (helper-34, D238).
#[test]
fn an_entry_that_changes_type_while_captured_is_captured_as_it_is_then() {
    use std::os::unix::fs::symlink;
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("target.txt"), b"target\n");
    write(&root.join("file.txt"), b"a file\n");
    symlink("target.txt", root.join("cfg")).expect("symlink");
    let base = rewind_json(root, &["checkpoint", "base"]);
    // Changed, so the next capture reads both again.
    std::fs::remove_file(root.join("cfg")).expect("rm");
    symlink("./target.txt", root.join("cfg")).expect("symlink");
    write(&root.join("file.txt"), b"a file, edited\n");
    let v =
        common::rewind_json_stopped_at(root, &["checkpoint", "swapped"], "capture:stated", || {
            // Both swapped by rename, as an atomic save does.
            write(&root.join("cfg.new"), b"cfg is a file now\n");
            std::fs::rename(root.join("cfg.new"), root.join("cfg")).expect("rename");
            symlink("target.txt", root.join("file.new")).expect("symlink");
            std::fs::rename(root.join("file.new"), root.join("file.txt")).expect("rename");
        });
    let want = snapshot(root);
    // Each looked at once, though two were read twice.
    assert_eq!(v["entries"], base["entries"], "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    std::fs::remove_file(root.join("cfg")).expect("rm");
    std::fs::remove_file(root.join("file.txt")).expect("rm");
    rewind_json(root, &["rewind", &id]);
    assert_same(
        "the checkpoint holds each as it was when read",
        &want,
        &snapshot(root),
    );
}

/// D254: a write through a shared mapping moves a file's times only when
/// its page becomes writable, and a capture that read the page while an
/// earlier write was still dirty left it writable: later writes moved
/// nothing, and the walk engine's stat cache vouched for the file (each
/// checkpoint after the first held the first write alone). A file the
/// store copies is now written back before it is read, which
/// write-protects its pages, so the next write moves its times. Mapped
/// the usual C way: the descriptor closed once mapped.
#[test]
fn every_write_through_a_shared_mapping_is_in_the_next_walk_checkpoint() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f.bin"), &[0u8; 4096]);
    let base = checkpoint_id(root, &["base"]);
    let map = common::SharedMap::of(&root.join("f.bin"), false);
    for (i, bytes) in [b"AAAAAAAA", b"BBBBBBBB", b"CCCCCCCC"].iter().enumerate() {
        map.put(bytes);
        // Older than the capture's start, or the cache would not vouch
        // for the file anyway (racily clean).
        std::thread::sleep(std::time::Duration::from_millis(100));
        let v = rewind_json(root, &["checkpoint", &format!("c{i}")]);
        assert_eq!(v["changes"]["modified"], 1, "write {i} was missed: {v}");
    }
    drop(map);
    rewind_json(root, &["rewind", &base]);
    rewind_json(root, &["undo"]);
    let now = std::fs::read(root.join("f.bin")).expect("read f.bin");
    assert_eq!(
        &now[..8],
        b"CCCCCCCC",
        "rewind and undo lost the last write"
    );
}

fn listed(root: &std::path::Path, id: &str) -> serde_json::Value {
    let list = rewind_json(root, &["list"]);
    list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .find(|c| c["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not listed: {list}"))
}

/// D168: what the live capture did not see is kept at planning, not only
/// when the apply finds it (D111). A checkpoint holds the user's own
/// `.claude/settings.json`; `integrate` then puts `.claude/` in
/// `.rewind/ignore`, so every rewind to that checkpoint plans to write it
/// and keeps it. A repeated rewind (or a restore of just that file) was
/// a plan of only that: it recorded a safety checkpoint and an operation
/// though it wrote nothing, `undo` led to the same tree, and gc could
/// prune the first rewind's saved work.
#[test]
fn a_rewind_that_only_meets_what_no_capture_saw_records_nothing() {
    let dir = common::tmp();
    let root = dir.path();
    write(
        &root.join(".claude/settings.json"),
        b"{\"permissions\":{}}\n",
    );
    write(&root.join("f"), b"1\n");
    let a = checkpoint_id(root, &["A"]);
    write(&root.join(".rewind/ignore"), b".claude/\n");
    write(&root.join(".claude/settings.json"), b"{\"hooks\":{}}\n");
    write(&root.join("f"), b"the agent's unsaved work\n");
    let first = rewind_json(root, &["rewind", &a]);
    assert_eq!(first["changes"]["written"], 1, "{first}");
    // The capture saw no `.claude` at all: the directory is what is kept.
    assert_eq!(common::paths_in(&first, "kept"), [".claude"]);
    for again in [
        vec!["rewind", a.as_str(), "--dry-run"],
        vec!["rewind", a.as_str()],
        vec!["restore", a.as_str(), "--", ".claude/settings.json"],
    ] {
        let r = rewind_json(root, &again);
        assert_eq!(
            r["safety_checkpoint"],
            serde_json::Value::Null,
            "{again:?}: {r}"
        );
        assert_eq!(common::paths_in(&r, "plan"), Vec::<&str>::new(), "{r}");
        assert_eq!(common::paths_in(&r, "kept"), [".claude"], "{r}");
    }
    assert_eq!(
        std::fs::read(root.join(".claude/settings.json")).expect("read"),
        b"{\"hooks\":{}}\n"
    );
    rewind_json(root, &["undo"]);
    assert_eq!(
        std::fs::read(root.join("f")).expect("read"),
        b"the agent's unsaved work\n"
    );
}

#[test]
fn dry_run_prints_a_fingerprint_and_expect_refuses_a_changed_plan() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"1");
    write(&root.join("elsewhere/keep"), b"untouched by the plan");
    let a = checkpoint_id(root, &[]);
    write(&root.join("a"), b"2");
    write(&root.join("b"), b"new");
    let before = snapshot(root);
    let plan = rewind_json(root, &["rewind", &a, "--dry-run"]);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["changes"]["written"], 1);
    assert_eq!(plan["changes"]["deleted"], 1);
    let fp = plan["plan_fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    assert_same("dry run changes nothing", &before, &snapshot(root));

    write(&root.join("c"), b"appeared after the dry run");
    let changed = snapshot(root);
    let out = rewind(root, &["rewind", &a, "--expect", &fp]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("plan changed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same("a refused plan changes nothing", &changed, &snapshot(root));

    let fp2 = rewind_json(root, &["rewind", &a, "--dry-run"])["plan_fingerprint"]
        .as_str()
        .expect("fp")
        .to_string();
    // What the plan does not touch may change meanwhile (D156): a new
    // mtime on a file elsewhere, a file written outside the plan's paths
    // of a restore.
    std::fs::File::options()
        .write(true)
        .open(root.join("elsewhere/keep"))
        .and_then(|f| f.set_modified(std::time::SystemTime::UNIX_EPOCH))
        .expect("touch");
    rewind_json(root, &["rewind", &a, "--expect", &fp2]);
    assert_eq!(std::fs::read(root.join("a")).expect("read"), b"1");
    assert!(!root.join("c").exists());
    write(&root.join("a"), b"3");
    let rfp = rewind_json(root, &["restore", &a, "--dry-run", "--", "a"])["plan_fingerprint"]
        .as_str()
        .expect("fp")
        .to_string();
    write(&root.join("elsewhere/new"), b"outside the restore");
    let out = rewind(
        root,
        &["restore", &a, "--expect", "0000000000000000", "--", "a"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("run the same command with --dry-run again"),
        "{err}"
    );
    rewind_json(root, &["restore", &a, "--expect", &rfp, "--", "a"]);
    assert_eq!(std::fs::read(root.join("a")).expect("read"), b"1");
}

#[test]
fn ids_prefixes_labels_and_head_relative_names_resolve() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"1");
    let first = checkpoint_id(root, &["first"]);
    write(&root.join("f"), b"2");
    rewind_json(root, &["checkpoint", "second"]);
    for name in [&first[..5], "first", "HEAD~1", "@~1", &first] {
        let plan = rewind_json(root, &["rewind", name, "--dry-run"]);
        assert_eq!(
            plan["rewound_to"],
            first.as_str(),
            "{name} names the first checkpoint"
        );
    }
}

#[test]
fn restore_brings_back_only_the_named_paths() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("keep/a.txt"), b"a1");
    write(&root.join("keep/b.txt"), b"b1");
    write(&root.join("nested/deep/c.txt"), b"c1");
    let a = checkpoint_id(root, &[]);
    write(&root.join("keep/a.txt"), b"a2");
    write(&root.join("keep/b.txt"), b"b2");
    std::fs::remove_dir_all(root.join("nested")).expect("rm");
    let r = rewind_json(
        root,
        &["restore", &a, "--", "keep/a.txt", "nested/deep/c.txt"],
    );
    assert_eq!(r["op"], "restore");
    assert_eq!(std::fs::read(root.join("keep/a.txt")).expect("a"), b"a1");
    assert_eq!(
        std::fs::read(root.join("keep/b.txt")).expect("b"),
        b"b2",
        "unnamed paths are left alone"
    );
    assert_eq!(
        std::fs::read(root.join("nested/deep/c.txt")).expect("c"),
        b"c1",
        "missing parents are recreated"
    );
    // restore is undoable like a rewind
    rewind_json(root, &["undo"]);
    assert_eq!(std::fs::read(root.join("keep/a.txt")).expect("a"), b"a2");
    assert!(!root.join("nested").exists());
    // a path named through a symlink to the workspace resolves too
    write(&root.join("keep/b.txt"), b"b3");
    let elsewhere = common::tmp();
    let alias = elsewhere.path().join("alias");
    std::os::unix::fs::symlink(root, &alias).expect("symlink");
    let arg = alias.join("keep/b.txt");
    rewind_json(root, &["restore", &a, "--", arg.to_str().expect("utf8")]);
    assert_eq!(std::fs::read(root.join("keep/b.txt")).expect("b"), b"b1");
    // rewind.toml is never captured (D38): said so, not "exists neither".
    write(&root.join("rewind.toml"), b"");
    let out = rewind(root, &["restore", &a, "--", "rewind.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is never captured"), "{err}");
    // An ignored file that is there: said so, not "exists neither" (D178).
    write(&root.join(".rewind/ignore"), b"*.log\n");
    write(&root.join("keep/run.log"), b"log");
    let out = rewind(root, &["restore", &a, "--", "keep/run.log"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("ignore rules exclude it"),
        "{err}"
    );
}

#[test]
fn status_and_diff_report_changes_and_patches() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("x.txt"), b"one\ntwo\n");
    write(&root.join("gone.txt"), b"bye\n");
    let a = checkpoint_id(root, &[]);
    write(&root.join("x.txt"), b"one\nthree\n");
    std::fs::remove_file(root.join("gone.txt")).expect("rm");
    write(&root.join("new.txt"), b"hi\n");
    let st = rewind_json(root, &["status"]);
    let changes: Vec<(String, String)> = st["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap_or("").to_string(),
                c["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            ("gone.txt".into(), "deleted".into()),
            ("new.txt".into(), "added".into()),
            ("x.txt".into(), "modified".into())
        ]
    );
    let d = rewind_json(root, &["diff", &a, "--patch", "--", "x.txt"]);
    assert_eq!(d["changes"].as_array().expect("changes").len(), 1);
    let patch = d["patch"].as_str().expect("patch");
    assert!(
        patch.contains("-two") && patch.contains("+three"),
        "{patch}"
    );
    let b = checkpoint_id(root, &[]);
    let d = rewind_json(root, &["diff", &a, &b]);
    assert_eq!(d["changes"].as_array().expect("changes").len(), 3);
}

/// helper-70: after `rm -rf node_modules`, `status` printed 12,000 lines
/// and no count. A deleted or added directory with 10 or more entries
/// below is one line with their number, unless `--all`; the list ends with
/// a count of each kind; `--json` still lists every path; `diff` shows the
/// same lines. A directory with fewer entries lists them.
#[test]
fn status_folds_a_deleted_directory_into_one_line_and_counts_each_kind() {
    let dir = common::tmp();
    let root = dir.path();
    for f in 0..12 {
        write(&root.join(format!("deps/p{}/f{f}.js", f % 3)), b"x\n");
    }
    write(&root.join("few/a"), b"a");
    write(&root.join("few/b"), b"b");
    write(&root.join("x.txt"), b"one\n");
    let a = checkpoint_id(root, &["-m", "before the damage"]);
    std::fs::remove_dir_all(root.join("deps")).expect("rm deps");
    std::fs::remove_dir_all(root.join("few")).expect("rm few");
    write(&root.join("x.txt"), b"two\n");
    write(&root.join("new.txt"), b"hi\n");
    let human = |args: &[&str]| {
        let out = common::rewind(root, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let st = human(&["status"]);
    assert!(
        st.starts_with(&format!("HEAD {a}  \"before the damage\"\n")),
        "{st}"
    );
    assert!(
        st.contains("D deps/ (15 entries; --all lists them)\n"),
        "{st}"
    );
    assert!(
        !st.contains("deps/p0"),
        "a folded directory's entries: {st}"
    );
    for line in [
        "D few\n",
        "D few/a\n",
        "D few/b\n",
        "A new.txt\n",
        "M x.txt\n",
    ] {
        assert!(st.contains(line), "{line:?} missing: {st}");
    }
    assert!(st.ends_with("1 added, 1 modified, 19 deleted\n"), "{st}");
    let all = human(&["status", "--all"]);
    assert!(
        all.contains("D deps\n") && all.contains("D deps/p0/f0.js\n"),
        "{all}"
    );
    assert_eq!(
        all.lines().filter(|l| l.starts_with("D ")).count(),
        19,
        "{all}"
    );
    let json = rewind_json(root, &["status"]);
    assert_eq!(json["changes"].as_array().map(Vec::len), Some(21), "{json}");
    let diff = human(&["diff", &a]);
    assert!(
        diff.contains("D deps/ (15 entries; --all lists them)\n"),
        "{diff}"
    );
    assert!(human(&["diff", "--all", &a]).contains("D deps/p1/f4.js\n"));
    // A name that is not UTF-8 is quoted whole, slash included, as the
    // paths `--all` lists below it (helper-72).
    use std::os::unix::ffi::OsStrExt;
    let odd = root.join(std::ffi::OsStr::from_bytes(b"bad\xffdir"));
    for f in 0..10 {
        write(&odd.join(format!("f{f}")), b"x");
    }
    checkpoint_id(root, &[]);
    std::fs::remove_dir_all(&odd).expect("rm");
    let st = human(&["status"]);
    assert!(
        st.contains("D \"bad\\xffdir/\" (10 entries; --all lists them)\n"),
        "{st}"
    );
    assert!(human(&["status", "--all"]).contains("D \"bad\\xffdir/f0\"\n"));
    // One change is counted too (helper-74: the line was left out).
    checkpoint_id(root, &[]);
    write(&root.join("x.txt"), b"three\n");
    let st = human(&["status"]);
    assert!(st.ends_with("M x.txt\n1 modified\n"), "{st}");
}

/// helper-70: after `npm install` rewrote files with the same bytes, a
/// checkpoint said `0 B new (168 cloned, 10525 small in the ledger)`, as
/// if it had stored them. It says they were read again and were stored
/// already.
#[test]
fn a_checkpoint_of_files_rewritten_with_the_same_bytes_says_nothing_was_stored() {
    let dir = common::tmp();
    let root = dir.path();
    for f in 0..5 {
        write(&root.join(format!("m/f{f}.js")), b"same\n");
    }
    checkpoint_id(root, &[]);
    for f in 0..5 {
        write(&root.join(format!("m/f{f}.js")), b"same\n");
    }
    let out = common::rewind(root, &["checkpoint", "again"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("0 B new (5 files read again, all already stored)"),
        "{text}"
    );
    write(&root.join("m/new.js"), b"new\n");
    let out = common::rewind(root, &["checkpoint"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(1 small in the ledger)"), "{text}");
}

/// `status PATH...` lists only the changes at or below those paths, named
/// from the current directory as `git status` takes them; a path outside
/// the workspace is refused and changes nothing.
#[test]
fn status_takes_paths_and_refuses_one_outside_the_workspace() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("src/a.rs"), b"a");
    write(&root.join("src/b.rs"), b"b");
    write(&root.join("docs/r.md"), b"r");
    let head = checkpoint_id(root, &[]);
    write(&root.join("src/a.rs"), b"a2");
    write(&root.join("docs/r.md"), b"r2");
    let paths = |cwd: &std::path::Path, args: &[&str]| {
        let mut all = vec!["status"];
        all.extend_from_slice(args);
        let out = rewind_json(cwd, &all);
        common::changed_paths(&out)
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(paths(root, &["src"]), ["src/a.rs"]);
    assert_eq!(
        paths(root, &["docs/r.md", "src/a.rs"]),
        ["docs/r.md", "src/a.rs"]
    );
    assert_eq!(paths(&root.join("src"), &["."]), ["src/a.rs"]);
    assert_eq!(paths(&root.join("src"), &["../docs"]), ["docs/r.md"]);
    assert_eq!(paths(root, &["src/b.rs"]), Vec::<String>::new());
    let out = common::rewind(root, &["status", "src/b.rs"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no changes under these paths"),
        "{out:?}"
    );
    assert!(out.stderr.is_empty(), "{out:?}");
    // A typo is said, not taken for "no changes" (helper-72).
    let out = common::rewind(root, &["status", "scr"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("scr is neither in the tree nor in HEAD"),
        "{out:?}"
    );
    let outside = common::rewind(root, &["status", "/etc"]);
    assert_eq!(outside.status.code(), Some(1), "{outside:?}");
    let err = String::from_utf8_lossy(&outside.stderr);
    assert!(err.contains("/etc is outside the workspace"), "{err}");
    let status = rewind_json(root, &["status"]);
    assert_eq!(status["head"], head.as_str(), "{status}");
    assert_eq!(common::changed_paths(&status), ["docs/r.md", "src/a.rs"]);
}

/// D323: `rewind deinit --yes` deletes the whole history and its kept
/// anchor, and leaves every file as it was; without `--yes` it deletes
/// nothing. It names an agent configuration that would start a new
/// history, and the next checkpoint does.
#[test]
fn deinit_deletes_the_history_and_its_anchor_and_leaves_the_files() {
    let dir = common::tmp();
    let root = dir.path();
    let state = common::tmp();
    let env = [("XDG_STATE_HOME", state.path().to_str().expect("utf8"))];
    write(&root.join("src/a.rs"), b"a");
    write(&root.join("big.bin"), &vec![7u8; 300 << 10]);
    let run = |args: &[&str]| common::rewind_env(root, args, &env);
    assert!(run(&["checkpoint", "one"]).status.success());
    write(&root.join("src/a.rs"), b"a2");
    assert!(run(&["checkpoint", "two"]).status.success());
    assert!(run(&["integrate", "claude"]).status.success());
    let anchors = || {
        std::fs::read_dir(state.path().join("rewind/anchors"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(anchors(), 1);
    let want = common::snapshot(root);

    let refused = run(&["deinit"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(root.join(".rewind/ledger.db").exists());
    let out = run(&["--json", "deinit", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["deleted"], true, "{v}");
    assert_eq!(v["checkpoints"], 2, "{v}");
    let configured = v["still_configured"].to_string();
    assert!(configured.contains(".claude/settings.json"), "{v}");
    assert!(!root.join(".rewind").exists());
    assert_eq!(anchors(), 0, "the kept anchor of a deleted history");
    common::assert_same("the files after deinit", &want, &common::snapshot(root));
    let again = run(&["deinit", "--yes"]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("not a rewind workspace"));
    assert!(run(&["checkpoint", "new"]).status.success());
    assert_eq!(
        rewind_json(root, &["list"])["checkpoints"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

/// helper-74: `deinit --yes` run again in a nested workspace it had just
/// deleted (or in any subdirectory) deleted the history of the workspace
/// above, which no one named. It deletes only the history of the
/// directory it runs at, and names the `-C` that deletes the one above.
#[test]
fn deinit_never_deletes_the_history_of_a_workspace_above_it() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("o"), b"outer");
    assert!(
        common::rewind(root, &["checkpoint", "outer"])
            .status
            .success()
    );
    let inner = root.join("in");
    write(&inner.join("i"), b"inner");
    // Said, not silent: commands run there use the new history.
    let init = common::rewind(&inner, &["init"]);
    assert!(init.status.success(), "{init:?}");
    assert!(
        String::from_utf8_lossy(&init.stderr).contains("is inside the workspace"),
        "{init:?}"
    );
    assert!(
        common::rewind(&inner, &["checkpoint", "inner"])
            .status
            .success()
    );
    assert!(
        common::rewind(&inner, &["deinit", "--yes"])
            .status
            .success()
    );
    assert!(!inner.join(".rewind").exists());
    for args in [&["deinit", "--yes"][..], &["deinit", "--dry-run"]] {
        let out = common::rewind(&inner, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        // The flag given: a dry run is not sent to `--yes` (helper-75).
        let fix = format!("rewind -C {} {} {}", root.display(), args[0], args[1]);
        assert!(
            err.contains("is not a workspace root") && err.contains(&fix),
            "{err}"
        );
    }
    assert_eq!(
        rewind_json(root, &["list"])["checkpoints"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "the outer history"
    );
    let out = common::rewind(
        &inner,
        &["-C", root.to_str().expect("utf8"), "deinit", "--yes"],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(!root.join(".rewind").exists());
}

/// helper-75: a ledger that opens but whose pages do not read sent the
/// user in a circle: `doctor` said `deinit --yes && init`, and `deinit`
/// failed with "rewind doctor shows more". It is deleted as it is, with a
/// warning, as one that does not open.
#[test]
fn deinit_deletes_a_ledger_whose_pages_do_not_read() {
    let dir = common::tmp();
    let root = dir.path();
    for i in 0..5 {
        write(&root.join(format!("f{i}")), format!("{i}").as_bytes());
        checkpoint_id(root, &[]);
    }
    let db = root.join(".rewind/ledger.db");
    {
        let conn = rusqlite::Connection::open(&db).expect("open the ledger");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("fold");
    }
    // The WAL holds a frame again: the ledger opens from it.
    write(&root.join("f5"), b"5");
    checkpoint_id(root, &[]);
    let mut bytes = std::fs::read(&db).expect("read");
    for page in (4096..bytes.len()).step_by(4096) {
        bytes[page..page + 100].fill(0xde);
    }
    std::fs::write(&db, &bytes).expect("damage");
    let want = common::snapshot(root);
    let out = common::rewind(root, &["deinit", "--yes"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("could not be read"), "{err}");
    assert!(!root.join(".rewind").exists());
    common::assert_same("the files", &want, &common::snapshot(root));
}

/// D323 (helper-72): `deinit` never changes the tree. After a rewind
/// killed half-way and edits made since, it finished the rewind first,
/// which kept those edits only in a checkpoint, and then deleted that
/// checkpoint. It now refuses, deletes nothing and names the way on.
#[test]
fn deinit_after_an_interrupted_rewind_deletes_nothing_and_keeps_later_edits() {
    let dir = common::tmp();
    let root = dir.path();
    for f in 0..4 {
        write(&root.join(format!("f{f}")), b"v1");
    }
    let a = checkpoint_id(root, &["a"]);
    for f in 0..4 {
        write(&root.join(format!("f{f}")), b"v2");
    }
    let killed = common::rewind_env(
        root,
        &["rewind", &a],
        &[("REWIND_FAILPOINT", "apply:file-written:2")],
    );
    assert!(!killed.status.success());
    write(&root.join("f3"), b"written after the crash");
    write(&root.join("new"), b"new after the crash");
    let want = common::snapshot(root);
    for args in [&["deinit", "--yes"][..], &["deinit", "--dry-run"]] {
        let out = common::rewind(root, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("was interrupted") && err.contains("nothing was deleted"),
            "{err}"
        );
    }
    common::assert_same(
        "the tree after a refused deinit",
        &want,
        &common::snapshot(root),
    );
    assert!(root.join(".rewind/ledger.db").exists());
}

/// D323 (helper-72): a `deinit` stopped half-way (an immutable file in
/// `.rewind/`) left a history that passed `status` and `verify` while
/// its rewinds failed on missing objects. The ledger goes first now:
/// what is left says it is gone and names `deinit`, which finishes once
/// the cause is fixed.
#[test]
fn a_deinit_stopped_half_way_leaves_no_history_that_looks_whole() {
    if !common::is_root() {
        common::skip_or_fail("chattr +i needs root");
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("big.bin"), &vec![3u8; 300 << 10]);
    write(&root.join("small"), b"s");
    checkpoint_id(root, &["one"]);
    let objects = root.join(".rewind/objects");
    let stuck = common::files_below(&objects)
        .into_iter()
        .next()
        .expect("an object file");
    let chattr = |flag: &str| {
        let ok = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&stuck)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chattr {flag}");
    };
    chattr("+i");
    let out = common::rewind(root, &["deinit", "--yes"]);
    chattr("-i");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let status = common::rewind(root, &["status"]);
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(
        !status.status.success(),
        "a half-deleted history answered status"
    );
    // Said as what it is, with what stopped it (helper-73).
    assert!(
        err.contains("is being deleted") && err.contains("rewind deinit --yes"),
        "{err}"
    );
    assert!(err.contains("Operation not permitted"), "{err}");
    let out = common::rewind(root, &["deinit", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!root.join(".rewind").exists());
    assert_eq!(std::fs::read(root.join("small")).expect("read"), b"s");
}

/// D323 (helper-73): a command waiting on the lock while the history
/// was deleted took the lock of the deleted history and went on: a
/// checkpoint answered with an id no history held, a rewind overwrote
/// work with a safety checkpoint `undo` could not reach. It now finds
/// the lock's file gone and does nothing.
#[test]
fn a_command_that_waited_while_the_history_was_deleted_does_nothing() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("work"), b"v1");
    let a = checkpoint_id(root, &["a"]);
    write(&root.join("work"), b"unsaved work");
    // Another process holds the lock; the deletion happens under it.
    let mut holder = std::process::Command::new("flock")
        .arg(root.join(".rewind/lock"))
        .args(["sleep", "1.5"])
        .spawn()
        .expect("flock");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let waiter = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rewind"))
            .current_dir(root)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("rewind")
    };
    let rewinding = waiter(&["rewind", &a]);
    let checkpointing = waiter(&["checkpoint", "late"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::remove_dir_all(root.join(".rewind")).expect("rm");
    let _ = holder.wait();
    for child in [rewinding, checkpointing] {
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("was deleted"), "{err}");
    }
    assert_eq!(
        std::fs::read(root.join("work")).expect("read"),
        b"unsaved work"
    );
    assert!(!root.join(".rewind").exists());
}

/// A patch shows the content of a file that replaced a directory (or was
/// replaced by one) against /dev/null, and a mode change as git does.
/// Before, the new file's content was missing and a chmod printed a bare
/// header.
#[test]
fn a_patch_shows_type_changes_and_mode_changes() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("d/x"), b"inside\n");
    write(&root.join("mode.sh"), b"echo hi\n");
    common::chmod(&root.join("mode.sh"), 0o644);
    write(&root.join("becomes-link"), b"a file\n");
    common::chmod(&root.join("becomes-link"), 0o644);
    let a = checkpoint_id(root, &[]);
    std::fs::remove_dir_all(root.join("d")).expect("rm");
    write(&root.join("d"), b"nowfile\n");
    common::chmod(&root.join("mode.sh"), 0o755);
    std::fs::remove_file(root.join("becomes-link")).expect("rm");
    std::os::unix::fs::symlink("mode.sh", root.join("becomes-link")).expect("symlink");
    let b = checkpoint_id(root, &[]);
    let d = rewind_json(root, &["diff", &a, &b, "--patch"]);
    let patch = d["patch"].as_str().expect("patch");
    assert!(patch.contains("+nowfile"), "{patch}");
    assert!(
        patch.contains("old mode 100644") && patch.contains("new mode 100755"),
        "{patch}"
    );
    // git's mode for a symlink (D158): it was printed as 120777; a file
    // that became one is a deletion and an addition, as git writes it (D176).
    assert!(
        patch.contains("deleted file mode 100644") && patch.contains("new file mode 120000"),
        "{patch}"
    );
    let back = rewind_json(root, &["diff", &b, &a, "--patch"]);
    let patch = back["patch"].as_str().expect("patch");
    assert!(
        patch.contains("-nowfile") && patch.contains("+inside"),
        "{patch}"
    );
}

/// A patch names a path holding a newline, a quote or a byte that is not
/// UTF-8 the way git does (C-style quotes), so `git apply` takes it:
/// unquoted, the newline split the header and the whole patch was
/// rejected (helper-19, D158).
#[test]
fn a_patch_with_strange_names_applies_with_git() {
    use std::os::unix::ffi::OsStrExt;
    let dir = common::tmp();
    let root = dir.path();
    let names: [&[u8]; 4] = [b"plain.txt", b"new\nline", b"say \"hi\"", b"caf\xe9"];
    for n in names {
        write(&root.join(std::ffi::OsStr::from_bytes(n)), b"one\ntwo\n");
    }
    let c1 = checkpoint_id(root, &["c1"]);
    let before = snapshot(root);
    for n in names {
        write(&root.join(std::ffi::OsStr::from_bytes(n)), b"one\nthree\n");
    }
    let out = rewind(root, &["diff", "--patch", &c1]);
    assert!(out.status.success(), "{out:?}");
    let patch = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(patch.contains("--- \"a/new\\nline\""), "{patch}");
    assert!(patch.contains("+++ \"b/caf\\351\""), "{patch}");
    let (after, want) = (
        git_apply_reverse(root, &out.stdout, &[]),
        outside_history(before),
    );
    for n in names {
        assert_eq!(after.get(n), want.get(n), "{}", String::from_utf8_lossy(n));
    }
}

/// D176: a patch `git apply` takes whole, symlinks and empty files
/// included: a retargeted link (was a text hunk `-> d1`, which failed),
/// a new link (was made a regular file holding `-> d1`), a new empty file
/// (was dropped), a deleted one, a file that became a link, and a mode
/// change. `git apply -R` of the patch from the old tree to the new one
/// gives the old tree back, exactly.
#[test]
fn a_patch_of_links_empty_files_and_modes_applies_with_git() {
    use std::os::unix::fs::symlink;
    let dir = common::tmp();
    let root = dir.path();
    std::fs::create_dir_all(root.join("d1")).expect("d1");
    std::fs::create_dir_all(root.join("d2")).expect("d2");
    symlink("d1", root.join("lnk")).expect("lnk");
    write(&root.join("gone"), b"");
    write(&root.join("becomes-link"), b"text\n");
    write(&root.join("run.sh"), b"echo hi\n");
    common::chmod(&root.join("run.sh"), 0o644);
    common::chmod(&root.join("becomes-link"), 0o644);
    common::chmod(&root.join("gone"), 0o644);
    let old = checkpoint_id(root, &["old"]);
    let before = snapshot(root);
    std::fs::remove_file(root.join("lnk")).expect("rm");
    symlink("d2", root.join("lnk")).expect("lnk");
    symlink("d1", root.join("newlink")).expect("newlink");
    write(&root.join("newempty"), b"");
    std::fs::remove_file(root.join("gone")).expect("rm");
    std::fs::remove_file(root.join("becomes-link")).expect("rm");
    symlink("run.sh", root.join("becomes-link")).expect("link");
    common::chmod(&root.join("run.sh"), 0o755);
    let out = rewind(root, &["diff", "--patch", &old]);
    assert!(out.status.success(), "{out:?}");
    let patch = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(patch.contains("new file mode 120000"), "{patch}");
    let after = git_apply_reverse(root, &out.stdout, &[]);
    common::assert_same(
        "git apply -R of the patch",
        &outside_history(before),
        &after,
    );
}

/// Git knows the file modes `100644` and `100755` only: a patch that
/// printed a secrets file's `100600`, a group-writable `100775` or a
/// deleted `100600` was rejected whole by `git apply` as garbage
/// (helper-52). Each file's bytes and owner-execute bit come back.
#[test]
fn a_patch_of_files_with_any_permissions_applies_with_git() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("secret.env"), b"TOKEN=1\n");
    write(&root.join("tool.sh"), b"echo hi\n");
    write(&root.join("private"), b"gone soon\n");
    write(&root.join("group.sh"), b"echo g\n");
    write(&root.join("app.txt"), b"v1\n");
    common::chmod(&root.join("group.sh"), 0o670);
    common::chmod(&root.join("secret.env"), 0o644);
    common::chmod(&root.join("tool.sh"), 0o644);
    common::chmod(&root.join("private"), 0o600);
    let old = checkpoint_id(root, &["old"]);
    let before = snapshot(root);
    common::chmod(&root.join("secret.env"), 0o600);
    write(&root.join("secret.env"), b"TOKEN=2\n");
    // Changes git cannot say, with nothing else: no section at all (a
    // bare `diff --git` line made git reject the patch, helper-54).
    common::chmod(&root.join("group.sh"), 0o677);
    write(&root.join("app.txt"), b"v2\n");
    common::chmod(&root.join("tool.sh"), 0o775);
    std::fs::remove_file(root.join("private")).expect("rm");
    write(&root.join("made.sh"), b"echo new\n");
    common::chmod(&root.join("made.sh"), 0o700);
    let out = rewind(root, &["diff", "--patch", &old]);
    assert!(out.status.success(), "{out:?}");
    let patch = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in patch.lines().filter(|l| l.contains(" mode ")) {
        let mode = line.rsplit(' ').next().unwrap_or_default();
        assert!(
            ["100644", "100755", "120000"].contains(&mode),
            "{line}\n{patch}"
        );
    }
    assert!(
        patch.contains("old mode 100644\nnew mode 100755"),
        "{patch}"
    );
    assert!(patch.contains("new file mode 100755"), "{patch}");
    assert!(!patch.contains("group.sh"), "{patch}");
    let after = git_apply_reverse(root, &out.stdout, &[]);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        outside_history(before).keys().collect::<Vec<_>>()
    );
    for name in ["secret.env", "tool.sh", "private", "app.txt"] {
        let got = std::fs::read(root.join(name)).expect(name);
        let want: &[u8] = match name {
            "secret.env" => b"TOKEN=1\n",
            "tool.sh" => b"echo hi\n",
            "app.txt" => b"v1\n",
            _ => b"gone soon\n",
        };
        assert_eq!(got, want, "{name}");
        let exec = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.join(name))
                .expect(name)
                .permissions(),
        ) & 0o100;
        assert_eq!(exec, 0, "{name}: git apply -R left it executable");
    }
}

/// `HEAD~N` past the first checkpoint says how far back history goes, and
/// an empty `diff` says so on stderr (stdout stays empty for scripts): a
/// typo in a path read as "nothing changed" (helper-52).
#[test]
fn head_before_history_and_an_empty_diff_are_said() {
    let dir = common::tmp();
    let root = dir.path();
    for n in 0..3 {
        write(&root.join("a.txt"), format!("{n}").as_bytes());
        checkpoint_id(root, &[]);
    }
    let out = rewind(root, &["--json", "rewind", "HEAD~5"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "UNKNOWN_ID", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("HEAD has 2 ancestors") && msg.contains("`HEAD~2` is the oldest"),
        "{msg}"
    );
    assert_eq!(
        rewind_json(root, &["diff", "HEAD~2", "HEAD"])["changes"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let out = rewind(root, &["diff", "--", "no-such-path"]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no changes under no-such-path between"),
        "{err}"
    );
    let out = rewind(root, &["diff", "--", "two\nlines"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(r#"under "two\nlines""#), "{err}");
    let out = rewind(root, &["--json", "diff", "--", "no-such-path"]);
    assert!(out.stderr.is_empty(), "{out:?}");
}

/// A directory whose mode the rewind puts back counted in its dry run
/// but not in the rewind (helper-55): the two counts now agree.
#[test]
fn a_rewind_counts_what_its_dry_run_counts() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f"), b"a");
    write(&root.join("d/g"), b"b");
    common::chmod(&root.join("f"), 0o644);
    common::chmod(&root.join("d"), 0o755);
    let a = checkpoint_id(root, &["a"]);
    common::chmod(&root.join("f"), 0o600);
    common::chmod(&root.join("d"), 0o700);
    let plan = rewind_json(root, &["rewind", &a, "--dry-run"]);
    let done = rewind_json(root, &["rewind", &a]);
    assert_eq!(plan["changes"]["written"], 2, "{plan}");
    assert_eq!(done["changes"], plan["changes"], "{done}\n{plan}");
    // A type change, file to directory and back, counted one deletion
    // too many in the rewind (helper-58, D295).
    std::fs::remove_file(root.join("f")).expect("rm");
    write(&root.join("f/inner"), b"c");
    let b = checkpoint_id(root, &["b"]);
    for to in [&a, &b] {
        let plan = rewind_json(root, &["rewind", to, "--dry-run"]);
        let done = rewind_json(root, &["rewind", to]);
        assert_eq!(done["changes"], plan["changes"], "{done}\n{plan}");
    }
}

/// A directory the plan deletes but the rewind keeps, because it holds
/// what its capture left out (a nested workspace's history, an ignored
/// file), was listed by the dry run as deleted (helper-76): the dry run
/// now keeps it, with the rewind's reason, and counts what the rewind
/// does; its fingerprint still names the plan the rewind applies.
#[test]
fn a_dry_run_keeps_the_directories_its_rewind_keeps() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join(".rewindignore"), b"*.o\n");
    write(&root.join("src/main.c"), b"int main;\n");
    let base = checkpoint_id(root, &["base"]);
    write(&root.join("vendor/lib/x.c"), b"x\n");
    let nested = rewind(&root.join("vendor/lib"), &["init"]);
    assert!(nested.status.success(), "{nested:?}");
    write(&root.join("build/obj/a.c"), b"a\n");
    write(&root.join("build/obj/a.o"), b"\x7fELF\n");
    write(&root.join("gone/g"), b"g\n");
    let plan = rewind_json(root, &["rewind", &base, "--dry-run"]);
    let listed: Vec<&str> = plan["plan"]
        .as_array()
        .expect("plan")
        .iter()
        .map(|c| c["path"].as_str().expect("path"))
        .collect();
    for still_there in ["vendor", "vendor/lib", "build", "build/obj"] {
        assert!(!listed.contains(&still_there), "{still_there}: {plan}");
    }
    for gone in ["vendor/lib/x.c", "build/obj/a.c", "gone", "gone/g"] {
        assert!(listed.contains(&gone), "{gone}: {plan}");
    }
    let kept: Vec<&str> = plan["kept"]
        .as_array()
        .expect("kept")
        .iter()
        .map(|k| k["path"].as_str().expect("path"))
        .collect();
    assert_eq!(kept, ["build/obj", "vendor/lib"], "{plan}");
    let human = rewind(root, &["rewind", &base, "--dry-run"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("  build/obj: kept: holds files that were not captured\n"),
        "{human}"
    );
    assert!(!human.contains("D build/obj\n"), "{human}");
    let fp = plan["plan_fingerprint"].as_str().expect("fingerprint");
    let done = rewind_json(root, &["rewind", &base, "--expect", fp]);
    assert_eq!(done["changes"], plan["changes"], "{done}\n{plan}");
    assert_eq!(done["kept"], plan["kept"], "{done}\n{plan}");
    assert!(root.join("vendor/lib/.rewind").is_dir());
    assert!(root.join("build/obj/a.o").is_file());
    assert!(!root.join("gone").exists());
}

/// What the target's capture skipped (a FIFO then, a file now) is kept
/// by the rewind and said; its dry run said nothing (helper-78).
#[test]
fn a_dry_run_names_what_the_target_skipped_as_its_rewind_does() {
    let dir = common::tmp();
    let root = dir.path();
    let fifo = Command::new("mkfifo").arg(root.join("c")).status();
    assert!(fifo.is_ok_and(|s| s.success()));
    let c0 = checkpoint_id(root, &["c0"]);
    std::fs::remove_file(root.join("c")).expect("rm fifo");
    write(&root.join("c"), b"hi\n");
    checkpoint_id(root, &["c1"]);
    let plan = rewind_json(root, &["rewind", &c0, "--dry-run"]);
    let done = rewind_json(root, &["rewind", &c0]);
    assert_eq!(plan["kept"], done["kept"], "{plan}\n{done}");
    assert_eq!(plan["kept"][0]["path"], "c", "{plan}");
    assert_eq!(std::fs::read(root.join("c")).expect("read"), b"hi\n");
}

/// A directory where the target has a file, kept because it holds what is
/// kept (an ignored file), was named nowhere: the file silently was not
/// restored; and a dry run left out the type change its rewind reported
/// (helper-78). Both now name it, the same way.
#[test]
fn a_directory_kept_where_the_target_has_a_file_is_named_by_dry_run_and_rewind() {
    for (rules_then, rules_now, ignored) in [
        (&b"cache\n"[..], None, "cache"),
        (&b"*.log\n"[..], Some(&b"*.log\n"[..]), "a/x.log"),
    ] {
        let dir = common::tmp();
        let root = dir.path();
        write(&root.join(".rewindignore"), rules_then);
        write(&root.join("src"), b"content\n");
        let c1 = checkpoint_id(root, &["c1"]);
        std::fs::remove_file(root.join("src")).expect("rm");
        match rules_now {
            Some(r) => write(&root.join(".rewindignore"), r),
            None => std::fs::remove_file(root.join(".rewindignore")).expect("rm rules"),
        }
        write(&root.join("src").join(ignored), b"ignored\n");
        write(&root.join("src/g"), b"other\n");
        checkpoint_id(root, &["c2"]);
        let plan = rewind_json(root, &["rewind", &c1, "--dry-run"]);
        let done = rewind_json(root, &["rewind", &c1]);
        assert_eq!(plan["kept"], done["kept"], "{plan}\n{done}");
        assert_eq!(plan["changes"], done["changes"], "{plan}\n{done}");
        assert!(
            done["kept"]
                .as_array()
                .expect("kept")
                .iter()
                .any(|k| k["path"] == "src"),
            "{done}"
        );
        assert!(root.join("src").join(ignored).is_file());
    }
}

/// A dry run dropped the mode the rewind puts back on the parent of a
/// directory it keeps (0 written against the rewind's 1, helper-78).
#[test]
fn a_dry_run_counts_the_mode_put_back_above_a_kept_directory() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join(".rewindignore"), b"x.log\n");
    std::fs::create_dir(root.join("p")).expect("mkdir");
    common::chmod(&root.join("p"), 0o755);
    let c1 = checkpoint_id(root, &["c1"]);
    common::chmod(&root.join("p"), 0o700);
    write(&root.join("p/q/x.log"), b"ignored\n");
    write(&root.join("p/q/f"), b"f\n");
    checkpoint_id(root, &["c2"]);
    let plan = rewind_json(root, &["rewind", &c1, "--dry-run"]);
    let done = rewind_json(root, &["rewind", &c1]);
    assert_eq!(plan["changes"], done["changes"], "{plan}\n{done}");
    assert_eq!(plan["changes"]["written"], 1, "{plan}");
    assert_eq!(plan["kept"], done["kept"], "{plan}\n{done}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(root.join("p"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

/// Apply `patch` in reverse to the tree at `root` with `git apply -R`
/// (which must take it whole, but the `excluded` files); the tree after,
/// outside `.rewind/`.
fn git_apply_reverse(root: &std::path::Path, patch: &[u8], excluded: &[&str]) -> Tree {
    let file = root.with_extension("diff");
    std::fs::write(&file, patch).expect("write patch");
    let apply = Command::new("git")
        .args(["apply", "-R"])
        .args(excluded.iter().map(|e| format!("--exclude={e}")))
        .arg(&file)
        .current_dir(root)
        .output()
        .expect("git apply");
    let _ = std::fs::remove_file(&file);
    assert!(
        apply.status.success(),
        "git apply -R: {}\n{}",
        String::from_utf8_lossy(&apply.stderr),
        String::from_utf8_lossy(patch)
    );
    outside_history(snapshot(root))
}

type Tree = std::collections::BTreeMap<Vec<u8>, common::Snap>;

/// A tree snapshot without the history in `.rewind/`.
fn outside_history(mut tree: Tree) -> Tree {
    tree.retain(|k, _| !k.starts_with(b".rewind"));
    tree
}

#[test]
fn a_shell_whose_cwd_is_inside_reads_the_restored_content() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("sub/dir/f.txt"), b"original\n");
    let a = checkpoint_id(root, &[]);
    write(&root.join("sub/dir/f.txt"), b"damaged\n");
    write(&root.join("sub/dir/extra"), b"x");
    // A shell sitting in sub/dir, like an agent's terminal.
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg("while read line; do cat f.txt; ls; echo END; done")
        .current_dir(root.join("sub/dir"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut stdin = sh.stdin.take().expect("stdin");
    let mut out = BufReader::new(sh.stdout.take().expect("stdout"));
    let mut read_block = || {
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            out.read_line(&mut l).expect("read");
            if l.trim() == "END" || l.is_empty() {
                return lines;
            }
            lines.push(l.trim().to_string());
        }
    };
    writeln!(stdin, "go").expect("write");
    assert_eq!(read_block(), vec!["damaged", "extra", "f.txt"]);
    rewind_json(root, &["rewind", &a]);
    writeln!(stdin, "go").expect("write");
    assert_eq!(
        read_block(),
        vec!["original", "f.txt"],
        "the shell's cwd still works and shows the restored tree"
    );
    drop(stdin);
    let _ = sh.wait();
}

/// The stat cache must never hide a change: same size, mtime put back with
/// `touch -d`, written within the same clock tick as the last checkpoint.
#[test]
fn the_stat_cache_never_hides_a_same_size_change() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("f.txt"), b"aaaa");
    let mtime = std::fs::metadata(root.join("f.txt"))
        .expect("stat")
        .modified()
        .expect("mtime");
    rewind_json(root, &["checkpoint"]);
    // Same tick, same size: only the racy check can see this.
    write(&root.join("f.txt"), b"bbbb");
    let f = std::fs::File::options()
        .write(true)
        .open(root.join("f.txt"))
        .expect("open");
    f.set_modified(mtime).expect("set mtime back");
    drop(f);
    let ck = rewind_json(root, &["checkpoint"]);
    assert_eq!(ck["changes"]["modified"], 1, "{ck}");
    // Later, long after the tick: same size, mtime put back again.
    std::thread::sleep(std::time::Duration::from_millis(50));
    write(&root.join("f.txt"), b"cccc");
    let f = std::fs::File::options()
        .write(true)
        .open(root.join("f.txt"))
        .expect("open");
    f.set_modified(mtime).expect("set mtime back");
    drop(f);
    let ck = rewind_json(root, &["checkpoint"]);
    assert_eq!(
        ck["changes"]["modified"], 1,
        "ctime moved even though mtime and size did not: {ck}"
    );
    let st = rewind_json(root, &["status"]);
    assert_eq!(st["changes"].as_array().expect("changes").len(), 0);
}

/// Writers from many processes are serialized by the workspace lock: every
/// checkpoint lands, HEAD is one of them, the ledger stays consistent.
#[test]
fn concurrent_checkpoints_are_serialized_and_all_recorded() {
    let dir = common::tmp();
    let root = dir.path();
    for i in 0..50 {
        write(&root.join(format!("f{i}")), format!("{i}").as_bytes());
    }
    rewind_json(root, &["checkpoint", "base"]);
    let children: Vec<_> = (0..6)
        .map(|i| {
            write(&root.join(format!("w{i}")), b"new");
            Command::new(env!("CARGO_BIN_EXE_rewind"))
                .current_dir(root)
                .args(["--json", "checkpoint", &format!("c{i}")])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut ids = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("wait");
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        ids.push(v["id"].as_str().expect("id").to_string());
    }
    let list = rewind_json(root, &["list"]);
    let listed: Vec<&str> = list["checkpoints"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    for id in &ids {
        assert!(listed.contains(&id.as_str()), "{id} missing");
    }
    assert_eq!(listed.len(), 7);
    assert!(ids.iter().any(|id| list["head"] == id.as_str()));
    assert_eq!(rewind_json(root, &["doctor"])["ledger"]["integrity"], "ok");
}

fn mtime_ns(p: &std::path::Path) -> i128 {
    let m = std::fs::symlink_metadata(p).expect("stat");
    std::os::unix::fs::MetadataExt::mtime(&m) as i128 * 1_000_000_000
        + std::os::unix::fs::MetadataExt::mtime_nsec(&m) as i128
}

#[test]
fn exact_times_restores_recorded_mtimes_and_the_default_uses_now() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("d/f.txt"), b"one");
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
    std::fs::File::options()
        .write(true)
        .open(root.join("d/f.txt"))
        .expect("open")
        .set_modified(old)
        .expect("mtime");
    let a = checkpoint_id(root, &[]);
    let recorded = mtime_ns(&root.join("d/f.txt"));
    let recorded_dir = mtime_ns(&root.join("d"));

    write(&root.join("d/f.txt"), b"two");
    rewind_json(root, &["rewind", &a]);
    assert_eq!(std::fs::read(root.join("d/f.txt")).expect("read"), b"one");
    assert!(
        mtime_ns(&root.join("d/f.txt")) > recorded,
        "by default a restored file gets the current time (builds rebuild it)"
    );

    write(&root.join("d/f.txt"), b"three");
    write(&root.join("d/extra"), b"x");
    let r = rewind_json(root, &["rewind", &a, "--exact-times"]);
    assert_eq!(r["rewound_to"], a.as_str());
    assert_eq!(
        mtime_ns(&root.join("d/f.txt")),
        recorded,
        "file mtime restored"
    );
    assert_eq!(
        mtime_ns(&root.join("d")),
        recorded_dir,
        "directory mtime restored after its children changed"
    );

    // A symlink's own mtime too (D177): it was left at "now", so every
    // repeat of the rewind found it changed and recorded an operation.
    std::os::unix::fs::symlink("f.txt", root.join("d/l")).expect("link");
    let t = std::process::Command::new("touch")
        .args(["-h", "-d", "2001-01-01"])
        .arg(root.join("d/l"))
        .status()
        .expect("touch -h");
    assert!(t.success());
    let link_mtime = || {
        std::fs::symlink_metadata(root.join("d/l"))
            .expect("lstat")
            .modified()
            .expect("mtime")
    };
    let recorded_link = link_mtime();
    let b = checkpoint_id(root, &[]);
    std::fs::remove_file(root.join("d/l")).expect("rm");
    std::os::unix::fs::symlink("f.txt", root.join("d/l")).expect("link");
    let first = rewind_json(root, &["rewind", &b, "--exact-times"]);
    assert!(first["safety_checkpoint"].is_string(), "{first}");
    assert_eq!(link_mtime(), recorded_link, "symlink mtime restored");
    let again = rewind_json(root, &["rewind", &b, "--exact-times"]);
    assert_eq!(
        again["safety_checkpoint"],
        serde_json::Value::Null,
        "{again}"
    );
}

#[test]
fn setuid_bits_are_restored_only_when_allowed() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("tool"), b"#!/bin/sh\n");
    common::chmod(&root.join("tool"), 0o4755);
    let a = checkpoint_id(root, &[]);
    std::fs::remove_file(root.join("tool")).expect("rm");
    let r = rewind_json(root, &["rewind", &a]);
    assert_eq!(r["setuid_stripped"], serde_json::json!(["tool"]));
    let mode = |p: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).expect("stat").permissions())
            & 0o7777
    };
    assert_eq!(mode(&root.join("tool")), 0o755);
    std::fs::remove_file(root.join("tool")).expect("rm");
    rewind_json(root, &["rewind", &a, "--allow-setuid"]);
    assert_eq!(mode(&root.join("tool")), 0o4755);
}

/// A directory's setgid bit gives no one any right: it makes what is
/// created in it take its group, as a shared project needs. A rewind
/// stripped it from each directory it made, even where the kernel had
/// set it (helper-79), and new files then took the user's own group.
/// Only a file's setuid and setgid bits wait for `--allow-setuid`.
#[test]
fn a_directorys_setgid_bit_is_restored_and_a_files_is_not() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("shared/lib/tool"), b"#!/bin/sh\n");
    common::chmod(&root.join("shared/lib/tool"), 0o2755);
    common::chmod(&root.join("shared/lib"), 0o2775);
    common::chmod(&root.join("shared"), 0o3775);
    let a = checkpoint_id(root, &[]);
    std::fs::remove_dir_all(root.join("shared")).expect("rm");
    let r = rewind_json(root, &["rewind", &a]);
    assert_eq!(
        r["setuid_stripped"],
        serde_json::json!(["shared/lib/tool"]),
        "{r}"
    );
    let mode = |p: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.join(p)).expect("stat").permissions(),
        ) & 0o7777
    };
    assert_eq!(mode("shared"), 0o3775, "setgid and sticky kept");
    assert_eq!(mode("shared/lib"), 0o2775);
    assert_eq!(mode("shared/lib/tool"), 0o755);
}

/// Counts a list of `{path, status}` changes the way a checkpoint counts
/// them (a type change is a modification).
fn counted(changes: &serde_json::Value) -> (u64, u64, u64) {
    let mut c = (0, 0, 0);
    for ch in changes.as_array().expect("changes") {
        match ch["status"].as_str() {
            Some("added") => c.0 += 1,
            Some("deleted") => c.2 += 1,
            _ => c.1 += 1,
        }
    }
    c
}

/// A checkpoint and `status` diff the live tree against HEAD with the
/// nodes their capture replaced, rebuilt from the stat cache instead of
/// read from the ledger. Their counts must equal a diff of the two stored
/// trees (`rewind diff A B`, a fresh process reading both from the ledger)
/// for every kind of change.
#[test]
fn a_checkpoints_change_counts_equal_a_diff_of_the_stored_trees() {
    let dir = common::tmp();
    let root = dir.path();
    common::populate_src_tree(root);
    let mut prev = checkpoint_id(root, &["base"]);
    for (what, change) in common::every_kind_of_change() {
        change(root);
        let live = counted(&rewind_json(root, &["status"])["changes"]);
        let ck = rewind_json(root, &["checkpoint", what]);
        let id = ck["id"].as_str().expect("id").to_string();
        let c = &ck["changes"];
        let reported = (
            c["added"].as_u64().expect("added"),
            c["modified"].as_u64().expect("modified"),
            c["deleted"].as_u64().expect("deleted"),
        );
        let stored = counted(&rewind_json(root, &["diff", &prev, &id])["changes"]);
        assert_ne!(stored, (0, 0, 0), "{what}: not a change");
        assert_eq!(reported, stored, "{what}: checkpoint {ck}");
        assert_eq!(live, stored, "{what}: status before the checkpoint");
        prev = id;
    }
}

/// A label is a name someone gave; an id prefix is a shortcut. A label
/// that is also the start of another checkpoint's id names its own
/// checkpoint (it used to lose to the id: a rewind to the wrong
/// checkpoint, silently), and the full id still names the other.
#[test]
fn a_label_names_its_checkpoint_even_when_another_id_starts_with_it() {
    let dir = common::tmp();
    let root = dir.path();
    let f = root.join("f");
    write(&f, b"by id\n");
    let id = checkpoint_id(root, &[]);
    let short = id[..2].to_string();
    write(&f, b"labelled\n");
    let labelled = checkpoint_id(root, &[&short]);
    write(&f, b"later\n");
    checkpoint_id(root, &[]);
    let r = rewind_json(root, &["rewind", &short]);
    assert_eq!(r["rewound_to"], labelled.as_str(), "{r}");
    assert_eq!(std::fs::read(&f).expect("read"), b"labelled\n");
    let r = rewind_json(root, &["rewind", &id]);
    assert_eq!(r["rewound_to"], id.as_str(), "{r}");
    assert_eq!(std::fs::read(&f).expect("read"), b"by id\n");
}

/// D80: an agent's git commands leave the history alone. `git status`
/// does not list `.rewind/`, `git add -A` does not stage it, `git stash
/// -u` does not take it and `git clean -fd` does not delete it (before,
/// the clean deleted every checkpoint); after all of them the checkpoint
/// still brings the work back. A workspace made before the guard gets it
/// on its next command.
#[test]
fn the_agents_git_add_stash_and_clean_leave_the_history_alone() {
    let dir = common::tmp();
    let root = dir.path();
    git(root, &["init", "-q"]);
    write(&root.join("src/a.rs"), b"committed\n");
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "init"]);
    write(&root.join("src/a.rs"), b"work in progress\n");
    write(&root.join("src/new.rs"), b"new\n");
    let wip = checkpoint_id(root, &["wip"]);
    let snap_wip = snapshot(root);
    let status = git(root, &["status", "--porcelain", "--untracked-files=all"]);
    assert!(!status.contains(".rewind"), "{status}");
    git(root, &["add", "-A"]);
    let staged = git(root, &["diff", "--cached", "--name-only"]);
    assert!(!staged.contains(".rewind"), "{staged}");
    git(root, &["stash", "-u"]);
    git(root, &["stash", "drop"]);
    git(root, &["clean", "-fd"]);
    assert!(
        root.join(".rewind/ledger.db").exists(),
        "the history is gone"
    );
    rewind_json(root, &["rewind", &wip]);
    assert_same(
        "rewind after the agent's git commands",
        &snap_wip,
        &snapshot(root),
    );

    assert_eq!(rewind_json(root, &["doctor"])["git_ignored"], true);
    std::fs::remove_file(root.join(".rewind/.gitignore")).expect("rm the guard");
    rewind_json(root, &["status"]);
    assert!(root.join(".rewind/.gitignore").exists(), "not put back");
}

/// D82: a workspace inside another (`rewind init` in a subdirectory) keeps
/// its history to itself. The outer workspace never captures the inner
/// `.rewind/` (its `status` does not list it), and an outer rewind to
/// before the subdirectory existed removes the subdirectory's files but
/// keeps the inner history, which then brings them back. A file named
/// `.rewind` is captured and restored like any other.
#[test]
fn a_nested_workspaces_history_is_never_captured_or_rewound_by_the_outer_one() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("top.txt"), b"top\n");
    // A file of that name is an ordinary file.
    write(&root.join("notes/.rewind"), b"just a file\n");
    let before_pkg = checkpoint_id(root, &["outer"]);
    let pkg = root.join("pkg");
    write(&pkg.join("p.txt"), b"package\n");
    rewind_json(&pkg, &["init"]);
    let inner = checkpoint_id(&pkg, &["inner"]);
    let st = rewind_json(root, &["status"]);
    let paths = common::changed_paths(&st);
    assert_eq!(paths, ["pkg", "pkg/p.txt"], "{st}");
    checkpoint_id(root, &[]);
    std::fs::remove_file(root.join("notes/.rewind")).expect("rm");
    let r = rewind_json(root, &["rewind", &before_pkg]);
    assert_eq!(r["kept"][0]["path"], "pkg", "{r}");
    assert!(!pkg.join("p.txt").exists());
    assert_eq!(
        std::fs::read(root.join("notes/.rewind")).expect("read"),
        b"just a file\n"
    );
    let list = rewind_json(&pkg, &["list"]);
    assert_eq!(list["head"], inner.as_str(), "{list}");
    rewind_json(&pkg, &["rewind", &inner]);
    assert_eq!(
        std::fs::read(pkg.join("p.txt")).expect("read"),
        b"package\n"
    );
}

/// D214: a subdirectory's `.rewind/` is never captured (D82), but that
/// was silent: one holding someone's files, no ledger, was in no
/// checkpoint and nothing said so (helper-30). Each is now listed under
/// `skipped`, a nested workspace's history as such, any other with the
/// advice to rename it.
#[test]
fn a_nested_rewind_directory_is_reported_as_skipped() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("tools/.rewind/cache.bin"), b"someone's files\n");
    write(&root.join("pkg/p.txt"), b"package\n");
    rewind_json(&root.join("pkg"), &["init"]);
    let ck = rewind_json(root, &["checkpoint"]);
    let skipped = |path: &str| {
        ck["skipped"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["path"] == path))
            .and_then(|s| s["reason"].as_str())
            .unwrap_or_else(|| panic!("{path} not skipped: {ck}"))
            .to_string()
    };
    assert!(skipped("tools/.rewind").contains("rename it"), "{ck}");
    assert!(skipped("pkg/.rewind").contains("own checkpoints"), "{ck}");
}

/// `list` shows the newest 50 checkpoints and says how many it left out
/// (hooks make one per tool call: thousands buried the recent ones and
/// flooded an agent's shell); HEAD is always shown, however old; `--all`
/// and JSON list every one, and JSON gives the total.
#[test]
fn list_shows_the_newest_fifty_and_head_and_says_what_it_left_out() {
    let dir = common::tmp();
    let root = dir.path();
    let mut ids = Vec::new();
    for n in 0..56 {
        write(&root.join("a.txt"), format!("{n}").as_bytes());
        ids.push(checkpoint_id(root, &[&format!("c{n}")]));
    }
    let text = |args: &[&str]| {
        let out = rewind(root, args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf8")
    };
    let shown = text(&["list"]);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 51, "{shown}");
    assert!(
        lines[0].contains("6 older checkpoints not shown"),
        "{shown}"
    );
    assert!(
        !shown.contains(&ids[5]) && shown.contains(&ids[6]),
        "{shown}"
    );
    assert!(lines[50].starts_with(&format!("@ {}", ids[55])), "{shown}");
    let only_head = text(&["list", "-n", "0"]);
    assert!(
        only_head.starts_with("⋮ 55 older checkpoints not shown"),
        "{only_head}"
    );

    // HEAD on an old checkpoint: shown beside the newest, apart from them
    // (not as two branches of one fork), and not all those left out are
    // older (helper-52).
    rewind_json(root, &["rewind", &ids[1]]);
    let shown = text(&["list", "-n", "2"]);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 5, "{shown}");
    assert!(lines[0].contains("⋮ 53 checkpoints not shown"), "{shown}");
    assert_eq!(lines[1], format!("@ {}", &lines[1][2..]), "{shown}");
    assert!(lines[1].contains(&ids[1]), "{shown}");
    assert_eq!(lines[2], "⋮", "{shown}");
    assert!(lines[3].starts_with(&format!("○ {}", ids[54])), "{shown}");
    assert!(lines[4].starts_with(&format!("○ {}", ids[55])), "{shown}");
    assert!(!shown.contains('├') && !shown.contains('└'), "{shown}");

    let all = text(&["list", "--all"]);
    assert_eq!(all.lines().count(), 56, "{all}");
    assert!(!all.contains("not shown"), "{all}");
    let v = rewind_json(root, &["list"]);
    assert_eq!(v["total"], 56, "{v}");
    assert_eq!(v["checkpoints"].as_array().map(Vec::len), Some(56));
    let v = rewind_json(root, &["list", "-n", "5"]);
    assert_eq!(
        v["checkpoints"].as_array().map(Vec::len),
        Some(6),
        "five and HEAD"
    );
}

/// D136: the progress line counts the bytes read to hash, so a capture
/// of one big file shows life: counted in entries alone it stayed at 0
/// (or never appeared) through 20 s of hashing a 3 GB file. Run under
/// `script`, so that stderr is a terminal.
#[test]
fn a_long_capture_of_one_big_file_shows_the_bytes_it_has_read() {
    if !common::has_script() {
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    let mib: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    {
        let mut f = std::fs::File::create(root.join("big.bin")).expect("create");
        for _ in 0..512 {
            f.write_all(&mib).expect("write");
        }
    }
    let shown = common::in_a_terminal(root, "checkpoint big");
    assert!(
        shown.contains("checkpoint") && shown.contains("\"big\""),
        "{shown}"
    );
    assert!(
        shown.contains("MiB read"),
        "no bytes in the progress line: {shown}"
    );
}

/// A rewind's progress total is what its final line counts: every entry
/// deleted, those below a deleted directory included, and every file and
/// directory written. It showed `0/1` for a deleted directory of 60,000
/// entries (helper-74), and counted files alone against a "written" that
/// counts directories too (helper-76).
#[test]
fn a_rewinds_progress_total_is_what_it_deletes_and_writes() {
    if !common::has_script() {
        return;
    }
    let dir = common::tmp();
    let root = dir.path();
    for f in 0..5 {
        write(&root.join(format!("back/f{f}")), b"back");
    }
    checkpoint_id(root, &["A"]);
    std::fs::remove_dir_all(root.join("back")).expect("rm");
    for d in 0..3 {
        for f in 0..100 {
            write(&root.join(format!("gone/d{d}/f{f}")), b"x");
        }
    }
    let shown = common::in_a_terminal(root, "rewind A");
    // 1 + 3 + 300 deleted; the directory and its 5 files written.
    assert!(shown.contains("6 written, 304 deleted"), "{shown}");
    assert!(
        shown.contains("restoring: ") && shown.contains("/310 "),
        "{shown}"
    );
    assert!(!shown.contains("/1 "), "{shown}");
}

/// D295: `diff --patch` left out a file over the patch limit whose size
/// changed, as if unchanged (helper-58): its content was read from
/// neither side, and two empty sides compared equal. It is shown as git
/// shows a binary change, with an `index` line, without which `git apply`
/// rejected the whole patch (helper-60); a big file only chmodded gets
/// its mode lines alone, and the rest of the patch applies.
#[test]
fn a_patch_names_every_big_file_that_changed() {
    let dir = common::tmp();
    let root = dir.path();
    let big = common::pseudo_random(6 << 20, 7);
    write(&root.join("grown.bin"), &big);
    write(&root.join("moded.bin"), &big[..2 << 20]);
    common::chmod(&root.join("moded.bin"), 0o644);
    write(&root.join("t.txt"), b"one\n");
    let a = checkpoint_id(root, &["a"]);
    write(&root.join("t.txt"), b"one\ntwo\n");
    let mut more = big.clone();
    more.extend_from_slice(b"tail");
    write(&root.join("grown.bin"), &more);
    common::chmod(&root.join("moded.bin"), 0o755);
    let b = checkpoint_id(root, &["b"]);
    for args in [
        &["diff", &a, &b, "--patch"][..],
        &["diff", &a, "live", "--patch"],
    ] {
        let out = rewind(root, args);
        let patch = String::from_utf8_lossy(&out.stdout);
        assert!(
            patch.contains(
                "diff --git a/grown.bin b/grown.bin\nindex 0000000..0000000\nBinary files a/grown.bin and b/grown.bin differ\n"
            ),
            "{args:?}: {patch}"
        );
        assert!(
            patch
                .contains("diff --git a/moded.bin b/moded.bin\nold mode 100644\nnew mode 100755\n"),
            "{args:?}: {patch}"
        );
        assert!(!patch.contains("moded.bin\nindex"), "{args:?}: {patch}");
    }
    // The rest of the patch applies.
    let patch = rewind(root, &["diff", &a, &b, "--patch"]).stdout;
    git_apply_reverse(root, &patch, &["grown.bin", "moded.bin"]);
    assert_eq!(std::fs::read(root.join("t.txt")).expect("read"), b"one\n");
    let only = rewind(root, &["diff", &a, &b, "--patch", "--", "grown.bin"]);
    assert!(
        String::from_utf8_lossy(&only.stdout)
            .contains("Binary files a/grown.bin and b/grown.bin differ"),
        "{}",
        String::from_utf8_lossy(&only.stdout)
    );
}

/// A human dry run lists the first 50 entries of its plan and counts the
/// rest; its last line repeats what it writes and deletes. A plan of
/// 6,392 entries scrolled its summary away (helper-58, D295).
#[test]
fn a_long_dry_run_lists_its_start_and_counts_the_rest() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("keep"), b"k");
    let a = checkpoint_id(root, &["a"]);
    for i in 0..120 {
        write(&root.join(format!("made/f{i:03}")), b"x");
    }
    let out = rewind(root, &["rewind", &a, "--dry-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let listed = text.lines().filter(|l| l.starts_with("  D ")).count();
    assert_eq!(listed, 50, "{text}");
    assert!(
        text.contains("  … and 71 more (`--json` lists every one)"),
        "{text}"
    );
    let last = text.lines().last().unwrap_or_default();
    assert!(last.contains("0 to write, 121 to delete"), "{last}");
    let json = rewind_json(root, &["rewind", &a, "--dry-run"]);
    assert_eq!(json["plan"].as_array().map(Vec::len), Some(121), "{json}");
}

/// `make TARGET` in `dir`, which must succeed.
fn make(dir: &std::path::Path, target: &str) {
    let built = Command::new("make")
        .arg(target)
        .current_dir(dir)
        .output()
        .expect("make");
    assert!(built.status.success(), "{built:?}");
}

/// Whether `make -q` (in `dir`) finds `target` up to date; `None`
/// without `make`, outside CI.
fn make_up_to_date(dir: &std::path::Path, target: &str) -> Option<bool> {
    match Command::new("make")
        .args(["-q", target])
        .current_dir(dir)
        .status()
    {
        Ok(s) => Some(s.success()),
        Err(e) => {
            common::skip_or_fail(&format!("make: {e}"));
            None
        }
    }
}

/// D318: without `--exact-times`, the files a rewind writes get mtimes
/// just below the clock in the order the checkpoint recorded: newer than
/// anything the rewind left alone, so what depends on a restored source
/// is rebuilt (DESIGN §4.9), and among themselves as they were, so build
/// outputs restored with their sources are as fresh as they were. Given
/// in the order they were written, `out/app` (written before `out/z.o`,
/// which it is built from) came back older than its input, and `make`
/// rebuilt it; `cargo clean` and a rewind rebuilt every crate.
#[test]
fn restored_files_keep_their_recorded_order_above_what_the_rewind_left_alone() {
    let dir = common::tmp();
    let root = dir.path();
    write(
        &root.join("Makefile"),
        b"out/app: out/z.o\n\tcat out/z.o > out/app\nout/z.o: src/z.c\n\tmkdir -p out && cp src/z.c out/z.o\n",
    );
    write(&root.join("src/z.c"), b"int z;\n");
    let Some(_) = make_up_to_date(root, "out/app") else {
        return;
    };
    make(root, "out/app");
    // A big file takes D275's path, the small ones the plain one.
    write(&root.join("out/big.bin"), &vec![7u8; 200 << 10]);
    let c = checkpoint_id(root, &["built"]);
    let recorded: Vec<i128> = ["src/z.c", "out/z.o", "out/app"]
        .iter()
        .map(|p| mtime_ns(&root.join(p)))
        .collect();
    assert!(recorded.windows(2).all(|w| w[0] < w[1]), "{recorded:?}");

    // `make clean`, as an agent runs it, then the rewind.
    std::fs::remove_dir_all(root.join("out")).expect("rm -rf out");
    let left_alone = mtime_ns(&root.join("Makefile"));
    rewind_json(root, &["rewind", &c]);
    assert_eq!(
        make_up_to_date(root, "out/app"),
        Some(true),
        "make rebuilds"
    );
    let now: Vec<i128> = ["out/z.o", "out/app", "out/big.bin"]
        .iter()
        .map(|p| mtime_ns(&root.join(p)))
        .collect();
    assert!(now[0] < now[1], "z.o then app: {now:?}");
    assert!(
        now.iter().all(|m| *m > left_alone),
        "{now:?} vs {left_alone}"
    );
    assert!(
        now[1] > recorded[2],
        "the clock's time, not the recorded one"
    );

    // A source restored alone is newer than the outputs left alone: they
    // are rebuilt.
    let c2 = checkpoint_id(root, &["before the edit"]);
    write(&root.join("src/z.c"), b"int z = 2;\n");
    make(root, "out/app");
    rewind_json(root, &["restore", &c2, "--", "src/z.c"]);
    assert_eq!(
        make_up_to_date(root, "out/app"),
        Some(false),
        "stale outputs"
    );
}

/// helper-81: a file dated past 2262-04-11 (XFS's bigtime, ext4's
/// extra time bits) came back from `--exact-times` dated 1901: its time
/// in nanoseconds wrapped, and the filesystem clamped what it was given;
/// a debug build panicked on the product. Such a time is kept at the last
/// one nanoseconds hold; the times before it, 1960's too, exactly.
#[test]
fn a_time_past_2262_is_restored_as_the_last_one_nanoseconds_hold() {
    // 256-byte inodes hold times past 2038 (a small ext4 has 128).
    let Some(lfs) = common::LoopFs::made_with(common::Fs::Ext4, 64, &["-I", "256"]) else {
        return;
    };
    let root = lfs.subdir("ws");
    for (name, when) in [
        ("far", "2300-06-01 12:00:00"),
        ("near", "2262-04-11 00:00:00"),
        ("old", "1960-01-01 00:00:00"),
    ] {
        write(&root.join(name), name.as_bytes());
        let t = Command::new("touch")
            .args(["-d", when])
            .arg(root.join(name))
            .status()
            .expect("touch -d");
        assert!(t.success());
    }
    let recorded = |n: &str| mtime_ns(&root.join(n));
    let (near, old) = (recorded("near"), recorded("old"));
    assert!(recorded("far") > i64::MAX as i128, "ext4 holds 2300");
    let a = checkpoint_id(&root, &[]);
    for n in ["far", "near", "old"] {
        write(&root.join(n), b"changed");
    }
    rewind_json(&root, &["rewind", &a, "--exact-times"]);
    assert_eq!(recorded("far"), i64::MAX as i128, "2262-04-11 23:47:16");
    assert_eq!(recorded("near"), near);
    assert_eq!(recorded("old"), old);
    assert_eq!(std::fs::read(root.join("far")).expect("read"), b"far");
}
