//! Retention and garbage collection: gc keeps exactly what the policy says,
//! every kept checkpoint still rewinds exactly, a SIGKILL at each gc point
//! loses nothing, `du` agrees with `df`, and the size budget holds.

// Tests and benches may panic on a closed stream (D348).
#![allow(clippy::disallowed_macros)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use common::{Fs, LoopFs, Snap, rewind, rewind_env, rewind_json, snapshot, write};
use proptest::prelude::*;
use serde_json::Value;

/// xorshift64*: deterministic randomness from proptest's seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

type Tree = BTreeMap<Vec<u8>, Snap>;

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The checkpoints `gc --keep-last K [--keep-labeled]` must prune, computed
/// from the definition (DESIGN/issue: newest K, labeled, and the protected
/// set: HEAD and its 3 nearest ancestors, heads of unresolved effects, the
/// last rewind's target and safety checkpoint).
fn expected_pruned(
    ws: &Path,
    keep_last: usize,
    keep_labeled: bool,
    last_op: &[String],
) -> HashSet<String> {
    let list = rewind_json(ws, &["list"]);
    let cks = list["checkpoints"].as_array().cloned().unwrap_or_default();
    let live: Vec<&Value> = cks
        .iter()
        .filter(|c| c["pruned"] != Value::Bool(true))
        .collect();
    let parent: HashMap<String, String> = cks
        .iter()
        .filter_map(|c| {
            Some((
                c["id"].as_str()?.to_string(),
                c["parent"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mut keep: HashSet<String> = live
        .iter()
        .rev()
        .take(keep_last)
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    if keep_labeled {
        // Labels someone gave: not those hook and safety checkpoints give
        // themselves.
        keep.extend(
            live.iter()
                .filter(|c| c["label"].is_string() && c["kind"] == "manual")
                .filter_map(|c| c["id"].as_str().map(String::from)),
        );
    }
    if let Some(head) = list["head"].as_str() {
        let mut cur = Some(head.to_string());
        for _ in 0..4 {
            let Some(c) = cur else { break };
            cur = parent.get(&c).cloned();
            keep.insert(c);
        }
    }
    let effects = rewind_json(ws, &["effects"]);
    for e in effects["effects"].as_array().cloned().unwrap_or_default() {
        if e["status"] == "admitted"
            && let Some(h) = e["head"].as_str()
        {
            keep.insert(h.to_string());
        }
    }
    keep.extend(last_op.iter().cloned());
    live.iter()
        .filter_map(|c| c["id"].as_str().map(String::from))
        .filter(|id| !keep.contains(id))
        .collect()
}

fn big(rng: &mut Rng) -> Vec<u8> {
    let n = 64 * 1024 + rng.below(64 * 1024) as usize;
    (0..n).map(|_| rng.next() as u8).collect()
}

fn history_case(base: &Path, seed: u64) {
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir_in(base).expect("case dir");
    let ws = dir.path();
    let mut trees: HashMap<String, Tree> = HashMap::new();
    let mut last_op: Vec<String> = Vec::new();
    let mut effect_no = 0;
    write(&ws.join("keep.txt"), b"base\n");
    for step in 0..12 {
        match rng.below(10) {
            0..=5 => {
                let name = format!(
                    "f{}.{}",
                    rng.below(4),
                    if rng.below(3) == 0 { "bin" } else { "txt" }
                );
                if name.ends_with(".bin") {
                    write(&ws.join(&name), &big(&mut rng));
                } else {
                    write(
                        &ws.join(&name),
                        format!("step {step} {}\n", rng.next()).as_bytes(),
                    );
                }
                if rng.below(4) == 0 {
                    let _ = std::fs::remove_file(ws.join(format!("f{}.txt", rng.below(4))));
                }
                let mut args = vec!["checkpoint".to_string()];
                if rng.below(3) == 0 {
                    args.push(format!("label-{step}"));
                }
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                let id = rewind_json(ws, &a)["id"].as_str().expect("id").to_string();
                trees.insert(id, snapshot(ws));
            }
            6 | 7 if !trees.is_empty() => {
                let ids: Vec<&String> = trees.keys().collect();
                let target = ids[rng.below(ids.len() as u64) as usize].clone();
                let before = snapshot(ws);
                let r = rewind_json(ws, &["rewind", &target]);
                if let Some(s) = r["safety_checkpoint"].as_str() {
                    trees.entry(s.to_string()).or_insert(before);
                    last_op = vec![target, s.to_string()];
                }
            }
            8 if !trees.is_empty() => {
                effect_no += 1;
                rewind_json(ws, &["guard", "--key", &format!("effect-{effect_no}")]);
            }
            _ if effect_no > 0 => {
                let _ = rewind(
                    ws,
                    &[
                        "effects",
                        "resolve",
                        &format!("effect-{}", rng.below(effect_no) + 1),
                        "--outcome",
                        "succeeded",
                    ],
                );
            }
            _ => {}
        }
    }
    let keep_last = rng.below(4) as usize;
    let keep_labeled = rng.below(2) == 0;
    let want = expected_pruned(ws, keep_last, keep_labeled, &last_op);
    let k = keep_last.to_string();
    let mut args = vec!["gc", "--keep-last", &k];
    if keep_labeled {
        args.push("--keep-labeled");
    }
    let dry = {
        let mut a = args.clone();
        a.push("--dry-run");
        rewind_json(ws, &a)
    };
    let r = rewind_json(ws, &args);
    let got: HashSet<String> = strs(&r["pruned"]).into_iter().collect();
    assert_eq!(got, want, "seed {seed}: gc {args:?} pruned the wrong set");
    assert_eq!(
        strs(&dry["pruned"]).into_iter().collect::<HashSet<_>>(),
        want,
        "seed {seed}: dry run differs"
    );
    let v = rewind_json(ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "seed {seed}: {v}");
    assert_eq!(v["deep"]["bad"], serde_json::json!([]), "seed {seed}: {v}");
    assert_eq!(v["pruned_checkpoints"].as_u64(), Some(want.len() as u64));
    // Every kept checkpoint rewinds exactly; a pruned one is refused by name.
    for (id, tree) in &trees {
        if want.contains(id) {
            let out = rewind(ws, &["rewind", id]);
            assert_eq!(
                out.status.code(),
                Some(1),
                "seed {seed}: pruned {id} rewound"
            );
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("pruned"),
                "seed {seed}"
            );
        } else {
            rewind_json(ws, &["rewind", id]);
            common::assert_same(&format!("seed {seed}: kept {id}"), tree, &snapshot(ws));
        }
    }
}

#[test]
fn gc_keeps_exactly_what_the_policy_says_and_every_kept_checkpoint_rewinds_exactly() {
    let base = common::tmp();
    let cases = std::env::var("REWIND_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map(|n| (n / 10).max(4))
        .unwrap_or(16);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&any::<u64>(), |seed| {
            history_case(base.path(), seed);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn keep_within_keeps_young_checkpoints_and_protected_ones_need_force() {
    let dir = common::tmp();
    let ws = dir.path();
    let mut ids = Vec::new();
    for i in 0..6 {
        write(&ws.join("a.txt"), format!("{i}\n").as_bytes());
        ids.push(common::checkpoint_id(ws, &[]));
    }
    let r = rewind_json(ws, &["gc", "--keep-within", "1h"]);
    assert_eq!(
        r["pruned"],
        serde_json::json!([]),
        "young checkpoints pruned: {r}"
    );
    let r = rewind_json(ws, &["gc", "--keep-last", "0"]);
    assert_eq!(
        strs(&r["pruned"]),
        ids[..2].to_vec(),
        "HEAD and 3 ancestors are protected"
    );
    let r = rewind_json(ws, &["gc", "--keep-last", "0", "--force"]);
    assert_eq!(
        strs(&r["pruned"]),
        ids[2..5].to_vec(),
        "--force prunes all but HEAD"
    );
    let list = rewind_json(ws, &["list"]);
    assert_eq!(list["head"].as_str(), Some(ids[5].as_str()));
    let bad = rewind(ws, &["gc", "--keep-within", "soon"]);
    assert_eq!(bad.status.code(), Some(1));
}

/// `gc` printed every pruned id on one line, 499 of them in an agent's
/// context (helper-77): the human report lists the first ten and counts
/// the rest; `--json` still lists every one.
#[test]
fn a_human_gc_report_lists_ten_pruned_ids_and_counts_the_rest() {
    let dir = common::tmp();
    let ws = dir.path();
    let mut ids = Vec::new();
    for i in 0..17 {
        write(&ws.join("a.txt"), format!("{i}\n").as_bytes());
        ids.push(common::checkpoint_id(ws, &[]));
    }
    let dry = rewind_json(ws, &["gc", "--keep-last", "2", "--dry-run"]);
    let pruned = strs(&dry["pruned"]);
    // HEAD and its three parents are protected (the recent past).
    assert_eq!(pruned, ids[..13].to_vec(), "{dry}");
    let out = rewind(ws, &["gc", "--keep-last", "2"]);
    assert!(out.status.success(), "{out:?}");
    let human = String::from_utf8_lossy(&out.stdout);
    let first = human.lines().next().expect("a line");
    assert_eq!(
        first,
        format!(
            "pruned 13 checkpoints, kept 4 (4 protected): {} … and 3 more (`--json` lists every one)",
            pruned[..10].join(" ")
        ),
        "{human}"
    );
}

/// D190: content only a pruned checkpoint held is freed even when that
/// checkpoint was the last tree the stat cache described (a secret
/// checkpointed by mistake, then a rewind away from it): its cache rows
/// kept it alive, so `gc` said "freed 0 B" and the secret stayed in
/// `.rewind/` until some later checkpoint. The next checkpoint after the
/// sweep still captures exactly.
#[test]
fn a_pruned_checkpoint_leaves_no_content_behind_through_the_stat_cache() {
    let dir = common::tmp();
    let ws = dir.path();
    write(&ws.join("f"), b"base\n");
    let a = common::checkpoint_id(ws, &["a"]);
    let secret = b"AWS_SECRET=hunter2-supersecret\n";
    write(&ws.join(".env"), secret);
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    write(&ws.join("secret.bin"), &big);
    common::checkpoint_id(ws, &["oops"]);
    rewind_json(ws, &["rewind", &a]);
    let r = rewind_json(ws, &["gc", "--keep-last", "0", "--force"]);
    assert_eq!(strs(&r["pruned"]).len(), 1, "{r}");
    assert_eq!(r["freed"]["small_objects"], 1, "{r}");
    assert_eq!(r["freed"]["object_files"], 1, "{r}");
    // secret.bin was the one object file; the small files are in the ledger.
    let left = common::object_files(ws);
    assert!(left.is_empty(), "the pruned file is still stored: {left:?}");
    let db = rusqlite::Connection::open(ws.join(".rewind/ledger.db")).expect("ledger");
    let rows: i64 = db
        .query_row(
            "SELECT count(*) FROM blobs WHERE data = ?1",
            [&secret[..]],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(rows, 0, "the pruned secret is still a stored object");
    drop(db);
    write(&ws.join("g"), b"g\n");
    common::checkpoint_id(ws, &[]);
    let st = rewind_json(ws, &["status"]);
    assert_eq!(st["changes"], serde_json::json!([]), "{st}");
    let v = rewind_json(ws, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
}

/// Six checkpoints, each holding a different 100 KiB file (so gc has object
/// files to delete) and a small one.
fn objects_history(ws: &Path) -> Vec<(String, Tree)> {
    let mut rng = Rng(7);
    let mut out = Vec::new();
    for i in 0..6 {
        write(&ws.join("big.bin"), &big(&mut rng));
        write(&ws.join("small.txt"), format!("{i}\n").as_bytes());
        let id = common::checkpoint_id(ws, &[]);
        out.push((id, snapshot(ws)));
    }
    out
}

#[test]
fn a_sigkill_at_every_gc_point_loses_nothing_a_kept_checkpoint_needs() {
    for (point, nth) in [
        ("gc:pruned", 1),
        ("gc:rows-swept", 1),
        ("gc:object-removed", 1),
        ("gc:object-removed", 2),
    ] {
        let dir = common::tmp();
        let ws = dir.path();
        let history = objects_history(ws);
        let spec = format!("{point}:{nth}");
        let out = rewind_env(
            ws,
            &["gc", "--keep-last", "1"],
            &[("REWIND_FAILPOINT", &spec)],
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(9),
            "{spec}: gc was not killed there: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Whatever the crash left, every kept checkpoint is complete ...
        let v = rewind_json(ws, &["verify", "--deep"]);
        assert_eq!(v["deep"]["bad"], serde_json::json!([]), "{spec}: {v}");
        // ... and the next gc finishes the job.
        rewind_json(ws, &["gc", "--keep-last", "1"]);
        let du = rewind_json(ws, &["du"]);
        assert_eq!(
            du["total"]["object_files"].as_u64(),
            Some(4),
            "{spec}: orphans left: {du}"
        );
        for (id, tree) in &history[2..] {
            rewind_json(ws, &["rewind", id]);
            common::assert_same(&format!("{spec}: {id}"), tree, &snapshot(ws));
        }
        let v = rewind_json(ws, &["verify", "--deep"]);
        assert_eq!(v["ok"], true, "{spec}: {v}");
    }
}

/// `size` bytes of random content, on disk.
fn random_file(path: &Path, size: u64, rng: &mut Rng) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..(size >> 20) {
        block.iter_mut().for_each(|b| *b = rng.next() as u8);
        f.write_all(&block).expect("write");
    }
    f.sync_all().expect("sync");
}

/// 4 KiB of random bytes written in place at a random aligned offset.
fn random_block_write(path: &Path, size: u64, rng: &mut Rng) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let block: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
    f.write_all_at(&block, rng.below(size / 4096) * 4096)
        .expect("write");
}

/// 100 checkpoints, each after a 4 KiB write inside a 200 MiB file.
fn df_and_du_agree_on(fs: Fs) {
    let Some(lfs) = LoopFs::new(fs, 1024) else {
        return;
    };
    let ws = lfs.subdir("ws");
    df_and_du_agree_in(&lfs, &ws, fs.name(), 10);
}

/// `limit_mib`: the growth allowed for 100 checkpoints (issue 7: 10 MiB).
fn df_and_du_agree_in(lfs: &LoopFs, ws: &Path, name: &str, limit_mib: u64) {
    let fs = lfs.fs;
    let mut rng = Rng(99);
    let size: u64 = 200 << 20;
    random_file(&ws.join("big.bin"), size, &mut rng);
    let settle = || {
        // XFS holds speculative CoW preallocations (128 KiB per write into
        // a shared extent) until its background reclaim, and frees the
        // blocks of removed temp files in background inode inactivation;
        // on a loaded machine both lag. Free them until statfs stops
        // moving, so that it shows what is really in use.
        let mut used = lfs.used_bytes();
        for _ in 0..20 {
            // btrfs frees extents at its transaction commit.
            let _ = std::process::Command::new("sync")
                .arg("-f")
                .arg(&lfs.mnt)
                .output();
            if fs == Fs::Xfs {
                let _ = std::process::Command::new("xfs_spaceman")
                    .args(["-c", "prealloc -s"])
                    .arg(&lfs.mnt)
                    .output();
            }
            let now = lfs.used_bytes();
            if now == used {
                break;
            }
            used = now;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        used
    };
    let before = settle();
    // The btrfs engine builds manifests inline here: no detached builder
    // may still be writing the ledger (and its WAL) while statfs and du
    // measure.
    let checkpoint = || {
        let out = common::rewind_env(
            ws,
            &["--json", "checkpoint"],
            &[("REWIND_MANIFEST", "inline")],
        );
        assert!(
            out.status.success(),
            "checkpoint: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    checkpoint();
    for _ in 0..100 {
        random_block_write(&ws.join("big.bin"), size, &mut rng);
        checkpoint();
    }
    let grown = settle().saturating_sub(before);
    let du = rewind_json(ws, &["du"]);
    let physical = du["total"]["physical"].as_u64().expect("physical");
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "{name}: statfs grew {:.2} MiB, du says {:.2} MiB ({})",
        mib(grown),
        mib(physical),
        du["total"]
    );
    // The reserve made with the history (D274) is a fixed allocation, not
    // what the checkpoints cost; du shows it apart.
    let reserve = du["total"]["reserve"].as_u64().expect("reserve");
    assert!(
        grown.saturating_sub(reserve) <= limit_mib << 20,
        "{name}: the store grew {:.1} MiB for 100 x 4 KiB (and its reserve {:.1} MiB)",
        mib(grown.saturating_sub(reserve)),
        mib(reserve)
    );
    let diff = (physical as f64 - grown as f64).abs();
    assert!(
        diff <= 0.10 * grown as f64,
        "{name}: du says {:.2} MiB, statfs grew {:.2} MiB",
        mib(physical),
        mib(grown)
    );
    // What gc says it frees is what the filesystem frees: the allocated
    // bytes of clones that share nearly every extent are not (D157).
    let used = settle();
    let gc = rewind_json(ws, &["gc", "--keep-last", "1", "--force"]);
    let freed = &gc["freed"];
    let freed_on_disk = used.saturating_sub(settle());
    let unshared = freed["unshared"].as_u64().expect("unshared");
    eprintln!(
        "{name}: gc says {:.2} MiB not shared of {:.2} MiB allocated; statfs freed {:.2} MiB",
        mib(unshared),
        mib(freed["allocated"].as_u64().expect("allocated")),
        mib(freed_on_disk)
    );
    if freed["object_files"].as_u64().expect("object files") > 1 {
        assert!(
            unshared <= freed_on_disk + (1 << 20),
            "{name}: gc claims {:.2} MiB freed, statfs freed {:.2} MiB",
            mib(unshared),
            mib(freed_on_disk)
        );
        assert!(
            unshared * 10 < freed["allocated"].as_u64().expect("allocated"),
            "{name}: {freed}"
        );
    }
}

#[test]
fn du_agrees_with_statfs_and_100_small_changes_stay_small_on_xfs_reflink() {
    df_and_du_agree_on(Fs::Xfs);
}

#[test]
fn du_agrees_with_statfs_and_100_small_changes_stay_small_on_btrfs() {
    df_and_du_agree_on(Fs::Btrfs);
}

#[test]
fn du_agrees_with_statfs_and_100_small_changes_stay_small_with_the_btrfs_snapshot_engine() {
    let Some(lfs) = LoopFs::new(Fs::Btrfs, 1024) else {
        return;
    };
    let ws = lfs.subvolume("ws");
    df_and_du_agree_in(&lfs, &ws, "btrfs engine", 10);
}

#[test]
fn the_budget_prunes_unprotected_checkpoints_then_refuses_clearly() {
    let dir = common::tmp();
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nmax_store_bytes = \"3MiB\"\nkeep_last = 1000\n",
    );
    let mut rng = Rng(3);
    let mut pruned = Vec::new();
    for _ in 0..20 {
        let data: Vec<u8> = (0..300_000).map(|_| rng.next() as u8).collect();
        write(&ws.join("big.bin"), &data);
        let r = rewind_json(ws, &["checkpoint"]);
        pruned.extend(strs(&r["pruned"]));
        // The reserve gc is given on a full disk is not budgeted (D274).
        let du = rewind_json(ws, &["du"]);
        let total = &du["total"];
        let used = total["physical"].as_u64().expect("physical")
            - total["reserve"].as_u64().expect("reserve");
        assert!(used <= 3 << 20, "over budget after a checkpoint: {used}");
    }
    assert!(pruned.len() >= 8, "the budget pruned only {pruned:?}");
    // Only protected checkpoints left over a smaller budget: refuse, name the fix.
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nmax_store_bytes = \"600KiB\"\n",
    );
    let before = rewind_json(ws, &["list"]);
    write(&ws.join("big.bin"), b"changed");
    let out = rewind(ws, &["checkpoint"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("max_store_bytes") && err.contains("protected"),
        "{err}"
    );
    let after = rewind_json(ws, &["list"]);
    assert_eq!(
        before["checkpoints"].as_array().map(Vec::len),
        after["checkpoints"].as_array().map(Vec::len),
        "a refused checkpoint was taken"
    );
    // A budget the ledger alone exceeds, with no checkpoint at all: the
    // advice was `gc --force`, which frees nothing (D114).
    let fresh = common::tmp();
    write(&fresh.path().join("a.txt"), b"a");
    write(
        &fresh.path().join("rewind.toml"),
        b"[retention]\nmax_store_bytes = \"64KiB\"\n",
    );
    let out = rewind(fresh.path(), &["checkpoint"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the ledger alone") && !err.contains("gc --force"),
        "{err}"
    );
    // The budget as written, not "0.1 MiB" (a 1 KiB one read "0.0 MiB").
    assert!(err.contains("max_store_bytes = 64.0 KiB"), "{err}");
}

/// D203: over the budget because of what HEAD itself holds, the refusal
/// said to run `gc --force`, which freed nothing (helper-28); it now
/// says what `gc --force` would free and how high the budget must go,
/// and one raised exactly that high lets the checkpoint through.
#[test]
fn over_budget_by_heads_own_content_the_advice_is_the_budget_it_needs() {
    let dir = common::tmp();
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nkeep_last = 2\nkeep_within = \"0s\"\nkeep_labeled = false\nmax_store_bytes = \"1MiB\"\n",
    );
    let mut rng = Rng(7);
    let mut refused = None;
    for i in 1..=6 {
        let data: Vec<u8> = (0..300_000).map(|_| rng.next() as u8).collect();
        write(&ws.join(format!("f{i}")), &data);
        let out = rewind(ws, &["checkpoint"]);
        if !out.status.success() {
            refused = Some(String::from_utf8_lossy(&out.stderr).into_owned());
            break;
        }
    }
    let err = refused.expect("the budget refuses a checkpoint");
    assert!(err.contains("would free only"), "{err}");
    let needed = err
        .split("max_store_bytes in rewind.toml to ")
        .nth(1)
        .and_then(|r| r.split(" or more").next())
        .expect("the budget it needs")
        .to_string();
    assert!(!err.contains("run `rewind gc --force`"), "{err}");
    // The figure is the way out, as written: a budget of exactly it takes
    // the checkpoint (D206: "above 3.0 MiB" was rounded down, and 3 MiB
    // was refused again).
    write(
        &ws.join("rewind.toml"),
        format!(
            "[retention]\nkeep_last = 2\nkeep_within = \"0s\"\nkeep_labeled = false\nmax_store_bytes = \"{}\"\n",
            needed.replace(' ', "")
        )
        .as_bytes(),
    );
    let out = rewind(ws, &["checkpoint"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Hook and safety checkpoints label themselves ("before Bash: …"): with
/// the default `keep_labeled` they were all kept for ever, so a size budget
/// once reached stopped every hook checkpoint, with advice that freed
/// nothing. They are pruned like unlabeled ones; a label given is kept.
#[test]
fn automatic_labels_do_not_keep_hook_checkpoints_for_ever() {
    let tmp = common::tmp();
    let ws = tmp.path();
    rewind_json(ws, &["init"]);
    write(&ws.join("mine.txt"), b"0");
    let mine = common::checkpoint_id(ws, &["my label"]);
    for i in 0..6 {
        write(&ws.join(format!("f{i}")), format!("{i}").as_bytes());
        common::pre_bash_hook(ws, &format!("make step{i}"));
    }
    let hooks: Vec<String> = rewind_json(ws, &["list"])["checkpoints"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|c| c["kind"] == "hook")
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    assert_eq!(hooks.len(), 6, "one hook checkpoint per call");
    let g = rewind_json(ws, &["gc", "--keep-last", "2", "--keep-labeled"]);
    let pruned = strs(&g["pruned"]);
    assert!(!pruned.contains(&mine), "a label given is kept: {g}");
    assert!(
        pruned.contains(&hooks[0]),
        "the oldest hook checkpoint is pruned: {g}"
    );
}

#[test]
fn auto_gc_applies_the_policy_in_batches_after_checkpoints() {
    let dir = common::tmp();
    let ws = dir.path();
    write(
        &ws.join("rewind.toml"),
        b"[retention]\nkeep_last = 5\nkeep_within = 0\n",
    );
    let mut ids = Vec::new();
    for i in 0..30 {
        write(&ws.join("a.txt"), format!("{i}\n").as_bytes());
        ids.push(common::checkpoint_id(ws, &[]));
    }
    let list = rewind_json(ws, &["list"]);
    let live: Vec<String> = list["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter(|c| c["pruned"] != Value::Bool(true))
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    // Batches of 10 beyond keep_last: never more than 5 + 10 + 1 live.
    assert!(
        live.len() <= 16 && live.len() >= 5,
        "live after auto gc: {}",
        live.len()
    );
    assert_eq!(live.last(), ids.last(), "HEAD pruned");
    assert!(
        live.iter()
            .all(|id| ids[ids.len() - live.len()..].contains(id)),
        "not the oldest pruned"
    );
}

/// Where clones are impossible, a big file is stored in 1 MiB chunks: 100
/// checkpoints of 4 KiB changes in a 200 MiB file cost about one chunk
/// each, not a 200 MiB copy each; restores stay exact.
#[test]
fn big_files_are_chunked_on_ext4_so_small_changes_stay_small_and_exact() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 1024) else {
        return;
    };
    let ws = lfs.subdir("ws");
    let mut rng = Rng(5);
    let size: u64 = 200 << 20;
    random_file(&ws.join("big.bin"), size, &mut rng);
    let first = rewind_json(&ws, &["checkpoint"]);
    assert_eq!(first["copied"].as_u64(), Some(1), "{first}");
    let after_first = lfs.used_bytes();
    let mut kept: Vec<(String, Tree)> = Vec::new();
    for i in 0..100 {
        random_block_write(&ws.join("big.bin"), size, &mut rng);
        let id = common::checkpoint_id(&ws, &[]);
        if i % 33 == 0 {
            kept.push((id, snapshot(&ws)));
        }
    }
    let grown = lfs.used_bytes().saturating_sub(after_first);
    eprintln!(
        "ext4: 100 checkpoints of 4 KiB changes grew the filesystem by {:.1} MiB",
        grown as f64 / 1048576.0
    );
    assert!(
        grown <= 200 << 20,
        "ext4: grew {} MiB: big files are being copied whole",
        grown >> 20
    );
    for (id, tree) in &kept {
        rewind_json(&ws, &["rewind", id]);
        common::assert_same(&format!("chunked {id}"), tree, &snapshot(&ws));
    }
    // gc keeps the chunks live checkpoints need and frees the others.
    rewind_json(&ws, &["gc", "--keep-last", "2", "--force"]);
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["deep"]["bad"], serde_json::json!([]), "{v}");
    let du = rewind_json(&ws, &["du"]);
    assert!(
        du["total"]["object_logical"].as_u64().unwrap_or(u64::MAX) < 300 << 20,
        "{du}"
    );
}

/// gc and checkpoints racing: the workspace lock serializes them, so no
/// checkpoint ever references content a concurrent sweep deleted.
#[test]
fn gc_racing_checkpoints_never_loses_live_content() {
    let dir = common::tmp();
    let ws = dir.path().to_path_buf();
    common::checkpoint_id(&ws, &[]);
    let writer = {
        let ws = ws.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(11);
            let mut taken = Vec::new();
            for i in 0..25 {
                write(&ws.join("big.bin"), &big(&mut rng));
                write(&ws.join("n.txt"), format!("{i}\n").as_bytes());
                let out = rewind(&ws, &["--json", "checkpoint"]);
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let v: Value = serde_json::from_slice(&out.stdout).expect("json");
                taken.push(v["id"].as_str().expect("id").to_string());
            }
            taken
        })
    };
    for _ in 0..15 {
        let out = rewind(&ws, &["gc", "--keep-last", "2"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let taken = writer.join().expect("writer thread");
    let v = rewind_json(&ws, &["verify", "--deep"]);
    assert_eq!(v["deep"]["bad"], serde_json::json!([]), "{v}");
    let list = rewind_json(&ws, &["list"]);
    let live: Vec<String> = list["checkpoints"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|c| c["pruned"] != Value::Bool(true))
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    assert!(
        live.contains(taken.last().expect("one")),
        "the newest checkpoint was pruned"
    );
    for id in live {
        rewind_json(&ws, &["rewind", &id]);
    }
}

/// D117: on ext4 a big file is stored in 1 MiB chunks. Each version of an
/// 8 MiB file that differs from the next in one chunk holds that chunk
/// alone: `du` says 1 MiB unique, on disk, per checkpoint. It said 8 MiB
/// unique and 0 on disk for each, so the columns neither added up nor
/// told what gc would free.
#[test]
fn du_counts_a_chunked_files_unique_chunks_per_checkpoint() {
    let Some(lfs) = LoopFs::new(Fs::Ext4, 1024) else {
        return;
    };
    let ws = lfs.subdir("ws");
    let mut rng = Rng(7);
    let path = ws.join("big.bin");
    random_file(&path, 8 << 20, &mut rng);
    let mut ids = Vec::new();
    for v in 0..4u8 {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all_at(&[v; 16], 100).expect("write");
        drop(f);
        ids.push(
            rewind_json(&ws, &["checkpoint"])["id"]
                .as_str()
                .expect("id")
                .to_string(),
        );
    }
    let du = rewind_json(&ws, &["du"]);
    let rows = du["checkpoints"].as_array().expect("checkpoints");
    for id in &ids {
        let row = rows
            .iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} not in du: {du}"));
        assert_eq!(row["unique"], 1 << 20, "{id}: {row}");
        let physical = row["unique_physical"].as_u64().expect("physical");
        assert!(physical >= 1 << 20, "{id}: {row}");
    }
}

/// D338: `du` merges which checkpoints reach each distinct node along the
/// tree's edges instead of walking every checkpoint's tree (helper-85: 7.2 s
/// and 514 MiB at 1,807 checkpoints). Pinned: two identical directories
/// hold their bytes twice in `logical` (the per-checkpoint walk skipped the
/// second, as a node it had seen), content one checkpoint holds in two
/// directories is unique to it, and content two checkpoints hold is unique
/// to neither.
#[test]
fn du_counts_a_subtree_held_twice_twice_and_unique_content_by_who_reaches_it() {
    let dir = common::tmp();
    let ws = dir.path();
    let kib = |n: usize, b: u8| vec![b; n << 10];
    write(&ws.join("shared.bin"), &kib(3, b's'));
    // Same bytes and times: one node, named twice.
    for d in ["a", "b"] {
        let path = ws.join(d).join("same.bin");
        write(&path, &kib(5, b'x'));
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| {
                f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30))
            })
            .expect("set mtime");
    }
    write(&ws.join("c/one.bin"), &kib(7, b'1'));
    write(&ws.join("d/also.bin"), &kib(7, b'1'));
    let first = rewind_json(ws, &["checkpoint"])["id"]
        .as_str()
        .expect("id")
        .to_string();
    for d in ["c", "d"] {
        std::fs::remove_dir_all(ws.join(d)).expect("rm");
    }
    write(&ws.join("e/two.bin"), &kib(11, b'2'));
    let second = rewind_json(ws, &["checkpoint"])["id"]
        .as_str()
        .expect("id")
        .to_string();
    let du = rewind_json(ws, &["du"]);
    let row = |id: &str| {
        du["checkpoints"]
            .as_array()
            .expect("checkpoints")
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("{id} not in du: {du}"))
            .clone()
    };
    let (one, two) = (row(&first), row(&second));
    assert_eq!(one["logical"], (3 + 5 + 5 + 7 + 7) << 10, "{one}");
    assert_eq!(two["logical"], (3 + 5 + 5 + 11) << 10, "{two}");
    assert_eq!(one["unique"], 7 << 10, "{one}");
    assert_eq!(two["unique"], 11 << 10, "{two}");
    assert_eq!(du["total"]["content"], (3 + 5 + 7 + 11) << 10, "{du}");
}

/// A `rewind.toml` that does not parse silently turned the size budget and
/// automatic gc off for `checkpoint` (gc and the hooks refused it). The
/// checkpoint is still taken (a typo must not cost the agent its
/// checkpoints), and says in one line where the file is broken.
#[test]
fn a_broken_rewind_toml_is_reported_by_every_checkpoint() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a.txt"), b"a");
    rewind_json(root, &["checkpoint"]);
    for (text, at) in [
        (
            "[retention\nmax_store_bytes = \"1KiB\"\n",
            "line 1, column 11",
        ),
        (
            "[retention]\nmax_store_bytes = \"1KiB\"\nkeep_last = -5\n",
            "line 3, column 13",
        ),
    ] {
        write(&root.join("rewind.toml"), text.as_bytes());
        write(&root.join("a.txt"), at.as_bytes());
        let out = rewind(root, &["--json", "checkpoint"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let warned = v["warnings"]
            .as_array()
            .and_then(|w| w.first())
            .and_then(Value::as_str);
        assert!(
            warned.is_some_and(|w| w.contains("rewind.toml") && w.contains(at)),
            "{v}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("rewind: warning: ") && err.contains(at),
            "{err}"
        );
        let gc = rewind(root, &["gc", "--dry-run"]);
        let err = String::from_utf8_lossy(&gc.stderr);
        assert_eq!(gc.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

/// Summed stored sizes of the ledger's tree nodes.
fn tree_bytes(ws: &Path) -> u64 {
    let c = rusqlite::Connection::open(ws.join(".rewind/ledger.db")).expect("open ledger");
    c.query_row(
        "SELECT coalesce(sum(length(data)), 0) FROM trees",
        [],
        |r| r.get::<_, i64>(0),
    )
    .expect("sum") as u64
}

/// gc counts the tree nodes it deletes by their stored bytes: with a wide
/// directory, rewritten by each checkpoint, they are most of what it
/// frees, and it reported only the objects' bytes ("167 B").
#[test]
fn gc_reports_the_bytes_of_the_tree_nodes_it_deletes() {
    let dir = common::tmp();
    let ws = dir.path();
    for i in 0..2000 {
        write(&ws.join(format!("wide/entry-{i:05}")), b"x");
    }
    for n in 0..5 {
        write(&ws.join("wide/entry-00000"), format!("edit {n}").as_bytes());
        rewind_json(ws, &["checkpoint", &format!("c{n}")]);
    }
    let before = tree_bytes(ws);
    let dry = rewind_json(ws, &["gc", "--keep-last", "1", "--force", "--dry-run"]);
    // The ledger's size as SQLite sees it, its WAL included.
    let file = || {
        let c = rusqlite::Connection::open(ws.join(".rewind/ledger.db")).expect("open ledger");
        let q = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).expect(sql) as u64;
        q("PRAGMA page_count") * q("PRAGMA page_size")
    };
    let file_before = file();
    let r = rewind_json(ws, &["gc", "--keep-last", "1", "--force"]);
    let dropped = before - tree_bytes(ws);
    assert!(dropped > 4 * 2000 * 10, "four wide nodes went: {dropped} B");
    assert_eq!(r["freed"]["tree_bytes"].as_u64(), Some(dropped), "{r}");
    assert_eq!(
        dry["freed"]["tree_bytes"], r["freed"]["tree_bytes"],
        "{dry}"
    );
    // D297: what the ledger file gave back is what it shrank by.
    let released = r["freed"]["ledger_released"].as_u64().expect("released");
    assert!(released > 0, "{r}");
    assert_eq!(file_before - file(), released, "{r}");
    assert!(r["freed"]["ledger_free"].is_u64(), "{r}");
}

/// `status`, `diff` and a dry run take no lock. A `gc` that pruned the
/// checkpoint one of them was reading swept its tree nodes from under it,
/// and it answered LEDGER_CORRUPT, "restore it from a backup", on a whole
/// ledger (helper-34, D237). It now reads again, from the history as the
/// gc left it.
#[test]
fn a_read_whose_checkpoint_a_gc_pruned_reads_again() {
    for read in [&["status"][..], &["diff"], &["rewind", "--dry-run", "base"]] {
        let dir = common::tmp();
        let ws = dir.path();
        // 500 files in 37 × 11 directories; a round rewrites one in
        // twelve: most directories keep nodes only older checkpoints hold.
        let edit = |round: u64| {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ round);
            for i in 0..500u64 {
                if round == 0 || rng.below(12) == 0 {
                    write(
                        &ws.join(format!("d{:02}/e{:02}/f{i:05}.txt", i % 37, i % 11)),
                        format!("{round} {i}\n").as_bytes(),
                    );
                }
            }
        };
        edit(0);
        common::checkpoint_id(ws, &["base"]);
        edit(1);
        let one = common::checkpoint_id(ws, &["one"]);
        edit(2);
        let reader =
            common::spawn_stopped_at(ws, &[&["--json"][..], read].concat(), "capture:dir:200");
        for n in 3..7 {
            edit(n);
            common::checkpoint_id(ws, &[]);
        }
        rewind_json(ws, &["rewind", "base"]);
        let gc = rewind_json(ws, &["gc", "--keep-last", "1"]);
        common::resume(&reader);
        // The checkpoint the reader started from (HEAD then) is gone.
        assert!(strs(&gc["pruned"]).contains(&one), "{gc}");
        let out = reader.wait_with_output().expect("wait");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert!(
            out.status.success(),
            "{read:?} after a gc under it: {v} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deep = rewind_json(ws, &["verify", "--deep"]);
        assert_eq!(deep["ok"], true, "{deep}");
    }
}

/// D320: one `gc` gives the ledger's free pages back until none is left
/// (within seconds), not 8 MiB a run: after a first checkpoint the disk
/// stopped, ten runs were needed (helper-70). 30 MiB of small files,
/// pruned: the ledger file is small again after one `gc`.
#[test]
fn one_gc_gives_back_every_free_page_of_the_ledger() {
    let dir = common::tmp();
    let root = dir.path();
    for i in 0..640 {
        write(
            &root.join(format!("small/{i:03}.bin")),
            &common::pseudo_random(48 << 10, 0x9e37_79b9 + i),
        );
    }
    rewind_json(root, &["checkpoint", "with them"]);
    std::fs::remove_dir_all(root.join("small")).expect("rm -rf small");
    rewind_json(root, &["checkpoint", "without them"]);
    let gc = rewind_json(root, &["gc", "--keep-last", "0", "--force"]);
    assert_eq!(gc["freed"]["small_objects"], 640, "{gc}");
    let ledger = std::fs::metadata(root.join(".rewind/ledger.db"))
        .expect("ledger")
        .len();
    assert!(
        ledger < 4 << 20,
        "the ledger is {ledger} bytes after one gc"
    );
}

/// D341 (helper-89): with a million files, `doctor`'s ledger check ran
/// 93 s, `gc` 5–14 s, `du` on the btrfs engine 28 s, `verify --deep` 9 s
/// and a rewind's check of what it restores seconds, each without a word
/// on the terminal. Each now draws a progress line there, as captures and
/// restores did.
#[test]
fn long_maintenance_work_says_what_it_is_doing_on_a_terminal() {
    let dir = common::tmp();
    let root = dir.path();
    for i in 0..40 {
        write(
            &root.join(format!("d{}/f{i}.txt", i % 4)),
            format!("{i}\n").as_bytes(),
        );
    }
    let a = common::checkpoint_id(root, &["a"]);
    std::fs::remove_dir_all(root.join("d1")).expect("rm");
    common::checkpoint_id(root, &["b"]);
    for (args, line) in [
        (format!("rewind {a}"), "checking what it restores"),
        ("doctor".to_string(), "checking the ledger"),
        ("du".to_string(), "reading the checkpoints' trees"),
        (
            "gc --keep-last 1 --force".to_string(),
            "finding what is kept",
        ),
        ("gc".to_string(), "giving the ledger's free pages back"),
        ("verify --deep".to_string(), "re-hashing tree nodes"),
        (
            "verify --deep".to_string(),
            "checking that every object is stored",
        ),
    ] {
        if !common::has_script() {
            return;
        }
        let shown = common::in_a_terminal(root, &args);
        assert!(shown.contains(line), "{args}: no {line:?} in {shown:?}");
    }
}

/// D344 (helper-89): a directory's tree node is written whole again when
/// one of its entries changes, so each checkpoint of a one-byte edit in a
/// wide directory holds a node of its own (8.25 MiB each at 200,000
/// entries), which `gc` frees with it, while `du` said "on disk 3.0 KiB".
/// `du`'s on-disk column counts the nodes only that checkpoint reaches.
#[test]
fn du_counts_the_tree_nodes_a_checkpoint_alone_holds_on_disk() {
    let dir = common::tmp();
    let ws = dir.path();
    for i in 0..2000 {
        write(&ws.join(format!("wide/f{i:04}.txt")), b"x\n");
    }
    rewind_json(ws, &["checkpoint", "first"]);
    let mut ids = Vec::new();
    for v in 0..3 {
        write(&ws.join("wide/f0000.txt"), format!("{v}\n").as_bytes());
        let c = rewind_json(ws, &["checkpoint"]);
        ids.push(c["id"].as_str().expect("id").to_string());
    }
    let du = rewind_json(ws, &["du"]);
    let rows = du["checkpoints"].as_array().expect("checkpoints");
    // The middle one: its node of `wide` (2,000 entries) and its root are
    // its own; its content is 2 bytes.
    let row = rows
        .iter()
        .find(|r| r["id"] == ids[1].as_str())
        .unwrap_or_else(|| panic!("{} not in du: {du}", ids[1]));
    assert_eq!(row["unique"], 2, "{row}");
    let physical = row["unique_physical"].as_u64().expect("physical");
    assert!(
        physical > 20 << 10,
        "2,000 entries' node not counted: {row}"
    );
    let freed = rewind_json(ws, &["gc", "--dry-run", "--keep-last", "1", "--force"]);
    let tree_bytes = freed["freed"]["tree_bytes"].as_u64().expect("tree_bytes");
    assert!(tree_bytes >= physical, "{freed} vs {row}");
}
