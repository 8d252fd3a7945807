//! The event chain (DESIGN §9, docs/CHAIN.md): every single-byte mutation
//! of a stored entry is caught at exactly that entry; deletion, insertion,
//! reordering and duplication each get their code; truncation is caught
//! only with an anchor; and an independent verifier written from
//! docs/CHAIN.md agrees with `rewind verify` on tampered and clean logs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{checkpoint_id, rewind, rewind_json, write};
use rewind::chain::{Entry, leaf_hash};
use rusqlite::{Connection, params};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A workspace with a history of checkpoints, a rewind with a note, an
/// undo and a restore: every kind of entry.
fn history(root: &Path, rounds: usize) -> PathBuf {
    write(&root.join("a.txt"), b"0");
    let first = checkpoint_id(root, &["first"]);
    for i in 0..rounds {
        write(&root.join(format!("f{i}.txt")), format!("{i}").as_bytes());
        rewind_json(root, &["checkpoint"]);
    }
    // Something for each to do: one with nothing to do records nothing
    // (D155).
    write(&root.join("a.txt"), b"1");
    rewind_json(root, &["rewind", &first, "--report", "did not work"]);
    rewind_json(root, &["undo"]);
    rewind_json(root, &["restore", &first, "--", "a.txt"]);
    root.join(".rewind/ledger.db")
}

fn verify(root: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["--json", "verify"];
    args.extend_from_slice(extra);
    let out = rewind(root, &args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn bad(v: &serde_json::Value) -> (u64, String) {
    (
        v["first_bad"]["seq"].as_u64().unwrap_or(0),
        v["first_bad"]["code"].as_str().unwrap_or("").to_string(),
    )
}

fn rows(db: &Path) -> Vec<(i64, Vec<u8>, Vec<u8>)> {
    let c = Connection::open(db).expect("open");
    let mut s = c
        .prepare("SELECT seq, data, hash FROM chain ORDER BY seq")
        .expect("prepare");
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

fn set_row(c: &Connection, seq: i64, data: &[u8], hash: &[u8]) {
    c.execute(
        "INSERT OR REPLACE INTO chain(seq, data, hash) VALUES (?1, ?2, ?3)",
        params![seq, data, hash],
    )
    .expect("write row");
}

/// Fold the WAL into the database file so that copying the file copies
/// the whole ledger.
fn settle(db: &Path) {
    Connection::open(db)
        .expect("open")
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .expect("checkpoint");
}

#[test]
fn the_chain_records_every_operation_and_verifies() {
    let dir = common::tmp();
    let db = history(dir.path(), 2);
    let kinds: Vec<String> = rows(&db)
        .iter()
        .map(|(_, d, _)| Entry::decode(d).expect("decode").kind)
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("genesis"));
    for k in ["checkpoint", "note", "rewind", "rewind-done"] {
        assert!(kinds.iter().any(|x| x == k), "no {k} entry in {kinds:?}");
    }
    let ops: Vec<String> = rows(&db)
        .iter()
        .filter_map(|(_, d, _)| {
            let e = Entry::decode(d).ok()?;
            (e.kind == "rewind-done")
                .then(|| String::from_utf8_lossy(e.field("op").unwrap_or_default()).into_owned())
        })
        .collect();
    assert_eq!(ops, vec!["rewind", "undo", "restore"]);
    let (code, v) = verify(dir.path(), &["--deep"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["ok"], true);
    assert_eq!(v["entries"].as_u64(), Some(kinds.len() as u64));
}

#[test]
fn every_single_byte_mutation_is_caught_at_its_entry() {
    let dir = common::tmp();
    let root = dir.path();
    let db = history(root, 3);
    settle(&db);
    let pristine = std::fs::read(&db).expect("read ledger");
    let n = rows(&db).len() as i64;
    let mut rng = Rng(0x5eed);
    for round in 0..1000 {
        std::fs::write(&db, &pristine).expect("restore ledger");
        let seq = 1 + rng.below(n as u64) as i64;
        let c = Connection::open(&db).expect("open");
        let (data, hash): (Vec<u8>, Vec<u8>) = c
            .query_row("SELECT data, hash FROM chain WHERE seq = ?1", [seq], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("row");
        let (mut data, mut hash) = (data, hash);
        let flip = 1 + rng.below(255) as u8;
        if rng.below(4) == 0 {
            let i = rng.below(hash.len() as u64) as usize;
            hash[i] ^= flip;
        } else {
            let i = rng.below(data.len() as u64) as usize;
            data[i] ^= flip;
        }
        set_row(&c, seq, &data, &hash);
        drop(c);
        let (code, v) = verify(root, &[]);
        assert_eq!(
            code, 1,
            "round {round}: mutation at entry {seq} not detected: {v}"
        );
        let (at, why) = bad(&v);
        assert_eq!(
            at, seq as u64,
            "round {round}: named entry {at}, mutated {seq}: {v}"
        );
        assert!(
            why == "HASH_MISMATCH" || why == "DECODE_ERROR",
            "round {round}: {why}"
        );
    }
}

#[test]
fn deletion_insertion_reordering_duplication_and_truncation_get_their_codes() {
    let dir = common::tmp();
    let root = dir.path();
    let db = history(root, 3);
    settle(&db);
    let pristine = std::fs::read(&db).expect("read");
    let all = rows(&db);
    let n = all.len() as i64;
    let k = 4i64;
    let reset = || std::fs::write(&db, &pristine).expect("reset");
    let shift_up_from = |c: &Connection, from: i64| {
        for (seq, data, hash) in all.iter().rev().filter(|r| r.0 >= from) {
            set_row(c, seq + 1, data, hash);
        }
    };
    let forged = |seq: i64, prev: &[u8]| {
        let e = Entry {
            seq: seq as u64,
            prev: rewind::hash::Hash::from_slice(prev).expect("hash"),
            time_ms: 0,
            kind: "checkpoint".into(),
            fields: vec![("id".into(), b"forged00".to_vec())],
        };
        let d = e.encode();
        let h = leaf_hash(&d).0.to_vec();
        (d, h)
    };

    // Deletion.
    reset();
    Connection::open(&db)
        .expect("open")
        .execute("DELETE FROM chain WHERE seq = ?1", [k])
        .expect("delete");
    assert_eq!(bad(&verify(root, &[]).1), (k as u64, "SEQ_GAP".into()));

    // Reordering: entries k and k+1 swap places.
    reset();
    let c = Connection::open(&db).expect("open");
    set_row(&c, k, &all[k as usize].1, &all[k as usize].2);
    set_row(&c, k + 1, &all[k as usize - 1].1, &all[k as usize - 1].2);
    drop(c);
    assert_eq!(bad(&verify(root, &[]).1), (k as u64, "OUT_OF_ORDER".into()));

    // Duplication: entry k appears twice, the rest shifted.
    reset();
    let c = Connection::open(&db).expect("open");
    shift_up_from(&c, k + 1);
    set_row(&c, k + 1, &all[k as usize - 1].1, &all[k as usize - 1].2);
    drop(c);
    assert_eq!(
        bad(&verify(root, &[]).1),
        ((k + 1) as u64, "OUT_OF_ORDER".into())
    );

    // Insertion of a well-formed forged entry, the rest shifted.
    reset();
    let c = Connection::open(&db).expect("open");
    shift_up_from(&c, k);
    let (d, h) = forged(k, &all[k as usize - 2].2);
    set_row(&c, k, &d, &h);
    drop(c);
    assert_eq!(
        bad(&verify(root, &[]).1),
        ((k + 1) as u64, "OUT_OF_ORDER".into())
    );

    // Replacing an entry with a forged one that has the right seq and prev:
    // its successor's link breaks.
    reset();
    let c = Connection::open(&db).expect("open");
    let (d, h) = forged(k, &all[k as usize - 2].2);
    set_row(&c, k, &d, &h);
    drop(c);
    assert_eq!(
        bad(&verify(root, &[]).1),
        ((k + 1) as u64, "BROKEN_LINK".into())
    );

    // Truncation: undetectable without an anchor, caught with one: the
    // one exported, and the one rewind keeps outside the workspace (D313).
    reset();
    let anchor = dir.path().join("anchor.json");
    rewind_json(root, &["anchor", anchor.to_str().expect("utf8")]);
    Connection::open(&db)
        .expect("open")
        .execute("DELETE FROM chain WHERE seq >= ?1", [n - 1])
        .expect("truncate");
    let (code, v) = verify_without_kept_anchor(root);
    assert_eq!(code, 0, "truncation is undetectable without an anchor: {v}");
    let (code, v) = verify(root, &["--anchor", anchor.to_str().expect("utf8")]);
    assert_eq!(code, 1);
    assert_eq!(bad(&v), ((n - 1) as u64, "TRUNCATED_BELOW_ANCHOR".into()));
    let (code, v) = verify(root, &[]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(bad(&v), ((n - 1) as u64, "TRUNCATED_BELOW_ANCHOR".into()));
    assert!(v["kept_anchor"]["path"].is_string(), "{v}");

    // Rewriting the last entry with a recomputed hash: only an anchor
    // sees it.
    reset();
    let c = Connection::open(&db).expect("open");
    let (d, h) = forged(n, &all[n as usize - 2].2);
    set_row(&c, n, &d, &h);
    drop(c);
    assert_eq!(verify_without_kept_anchor(root).0, 0);
    assert_eq!(
        bad(&verify(root, &["--anchor", anchor.to_str().expect("utf8")]).1),
        (n as u64, "ANCHOR_MISMATCH".into())
    );
    assert_eq!(
        bad(&verify(root, &[]).1),
        (n as u64, "ANCHOR_MISMATCH".into())
    );
}

/// Before session 40 the kept anchor's file was keyed by the root's
/// `st_dev` (D325 keys it by the statfs filesystem id): one kept under
/// the old key is moved to the new one and still catches a cut chain,
/// rather than being left behind while `verify` checks against nothing.
#[test]
fn an_anchor_kept_under_the_device_number_is_moved_and_still_anchors() {
    use std::os::unix::fs::MetadataExt;
    let dir = common::tmp();
    let root = dir.path();
    let state = common::tmp();
    let env = [("XDG_STATE_HOME", state.path().to_str().expect("utf8"))];
    let verify_here = || {
        let out = common::rewind_env(root, &["--json", "verify"], &env);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("verify JSON");
        (out.status.code().unwrap_or(-1), v)
    };
    let checkpoint = |n: u32| {
        write(&root.join("a"), format!("{n}").as_bytes());
        assert!(
            common::rewind_env(root, &["checkpoint"], &env)
                .status
                .success()
        );
    };
    checkpoint(1);
    checkpoint(2);
    // A backup of the ledger, put back after one more checkpoint: a
    // history cut at its tail, which only an anchor tells (D313).
    let ledger = root.join(".rewind/ledger.db");
    let files = ["", "-wal", "-shm"].map(|s| PathBuf::from(format!("{}{s}", ledger.display())));
    let backup: Vec<Option<Vec<u8>>> = files.iter().map(|f| std::fs::read(f).ok()).collect();
    checkpoint(3);
    let (code, v) = verify_here();
    assert_eq!(code, 0, "{v}");
    let kept = PathBuf::from(v["kept_anchor"]["path"].as_str().expect("a kept anchor"));
    let anchor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).expect("read anchor")).expect("anchor JSON");
    let id = anchor["workspace"].as_str().expect("workspace id");
    let meta = std::fs::metadata(root).expect("stat root");
    let key = format!("{id}\0{}:{}", meta.dev(), meta.ino());
    let name = rewind::hash::hex(&rewind::hash::Hash::of(key.as_bytes()).0[..16]);
    let legacy = kept.with_file_name(format!("{name}.json"));
    assert_ne!(
        legacy, kept,
        "this filesystem's id is its device number: this tests nothing"
    );
    std::fs::rename(&kept, &legacy).expect("move the anchor to the old key");
    for (f, b) in files.iter().zip(&backup) {
        match b {
            Some(b) => std::fs::write(f, b).expect("restore ledger"),
            None => {
                let _ = std::fs::remove_file(f);
            }
        }
    }
    assert_eq!(
        verify_without_kept_anchor(root).0,
        0,
        "the cut is undetectable without the anchor"
    );
    let (code, v) = verify_here();
    assert_eq!(code, 1, "{v}");
    assert_eq!(bad(&v).1, "TRUNCATED_BELOW_ANCHOR", "{v}");
    assert_eq!(
        v["kept_anchor"]["path"],
        kept.to_str().expect("utf8"),
        "{v}"
    );
    assert!(kept.exists() && !legacy.exists(), "moved, not copied");
}

/// `verify` with no anchor at all: rewind's own kept in an empty state
/// directory.
fn verify_without_kept_anchor(root: &Path) -> (i32, serde_json::Value) {
    let elsewhere = common::tmp();
    let out = common::rewind_env(
        root,
        &["--json", "verify"],
        &[("XDG_STATE_HOME", elsewhere.path().to_str().expect("utf8"))],
    );
    let v = serde_json::from_slice(&out.stdout).expect("verify JSON");
    (out.status.code().unwrap_or(-1), v)
}

#[test]
fn an_unreadable_ledger_exits_2() {
    let dir = common::tmp();
    let db = history(dir.path(), 1);
    std::fs::write(
        &db,
        b"not a database at all, not even close, definitely not sqlite",
    )
    .expect("clobber");
    let _ = std::fs::remove_file(db.with_extension("db-wal"));
    let _ = std::fs::remove_file(db.with_extension("db-shm"));
    let out = rewind(dir.path(), &["verify"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_independent_verifier_agrees_on_100_logs() {
    let dir = common::tmp();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/verify_chain.py");
    let mut rng = Rng(0xc0ffee);
    let mut tampered_seen = 0;
    for i in 0..100 {
        let root = dir.path().join(format!("log{i}"));
        std::fs::create_dir_all(&root).expect("mkdir");
        let db = history(&root, rng.below(4) as usize);
        let n = rows(&db).len() as u64;
        let c = Connection::open(&db).expect("open");
        match rng.below(5) {
            0 => {} // clean
            1 => {
                let seq = 1 + rng.below(n);
                c.execute(
                    "UPDATE chain SET data = CAST(data || x'00' AS BLOB) WHERE seq = ?1",
                    [seq as i64],
                )
                .expect("grow");
            }
            2 => {
                let seq = 1 + rng.below(n);
                c.execute("DELETE FROM chain WHERE seq = ?1", [seq as i64])
                    .expect("delete");
            }
            3 => {
                let seq = 1 + rng.below(n);
                let (mut d, h): (Vec<u8>, Vec<u8>) = c
                    .query_row(
                        "SELECT data, hash FROM chain WHERE seq = ?1",
                        [seq as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .expect("row");
                let at = rng.below(d.len() as u64) as usize;
                d[at] ^= 0x40;
                set_row(&c, seq as i64, &d, &h);
            }
            _ => {
                c.execute("UPDATE meta SET value = 'someoneelsesworkspace0000' WHERE key = 'workspace_id'", []).expect("meta");
            }
        }
        drop(c);
        // The chain alone, as the independent verifier sees it: not
        // against the anchor rewind keeps (D313).
        let (_, ours) = verify_without_kept_anchor(&root);
        let out = Command::new("python3")
            .arg(&script)
            .arg(&db)
            .output()
            .expect("python3");
        let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "verifier output ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert_eq!(ours["ok"], theirs["ok"], "log {i}: {ours} vs {theirs}");
        assert_eq!(
            ours["first_bad"]["seq"], theirs["first_bad"]["seq"],
            "log {i}: {ours} vs {theirs}"
        );
        assert_eq!(
            ours["first_bad"]["code"], theirs["first_bad"]["code"],
            "log {i}: {ours} vs {theirs}"
        );
        if ours["ok"] == false {
            tampered_seen += 1;
        }
    }
    assert!(
        tampered_seen >= 50,
        "the corpus must be mostly tampered: {tampered_seen}"
    );
}

#[test]
fn verify_deep_finds_a_damaged_object_the_chain_cannot_see() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("small.txt"), b"small object in the ledger");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    write(&root.join("big.bin"), &big);
    rewind_json(root, &["checkpoint"]);
    assert_eq!(verify(root, &["--deep"]).0, 0);
    // Damage the object file of big.bin (read-only, so make it writable).
    let objects = root.join(".rewind/objects");
    let shard = std::fs::read_dir(&objects)
        .expect("objects")
        .next()
        .expect("a shard")
        .expect("entry")
        .path();
    let obj = std::fs::read_dir(&shard)
        .expect("shard")
        .next()
        .expect("an object")
        .expect("entry")
        .path();
    common::chmod(&obj, 0o644);
    let mut bytes = std::fs::read(&obj).expect("read object");
    bytes[1000] ^= 1;
    std::fs::write(&obj, &bytes).expect("damage");
    let (code, v) = verify(root, &[]);
    assert_eq!(code, 0, "the chain itself is intact: {v}");
    let (code, v) = verify(root, &["--deep"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["ok"], false, "ok must answer for the content too: {v}");
    let bad = v["deep"]["bad"].as_array().expect("bad list");
    assert_eq!(bad.len(), 1, "{v}");
    assert!(
        bad[0].as_str().unwrap_or("").starts_with("object file"),
        "{v}"
    );
    // Named with the file that holds it (D325).
    assert!(
        bad[0]
            .as_str()
            .unwrap_or("")
            .contains(": big.bin in checkpoint"),
        "{v}"
    );
    // And a damaged small object.
    let c = Connection::open(root.join(".rewind/ledger.db")).expect("open");
    c.execute("UPDATE blobs SET data = CAST('tampered' AS BLOB)", [])
        .expect("tamper blob");
    drop(c);
    let (_, v) = verify(root, &["--deep"]);
    assert_eq!(v["deep"]["bad"].as_array().expect("bad").len(), 2, "{v}");
}

#[test]
fn a_ledger_from_before_the_chain_gets_a_genesis_and_keeps_working() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"1");
    let first = checkpoint_id(root, &[]);
    // What an earlier build left: no chain, no effects, no blobs tables,
    // and no migration stamp (D79); nor the anchor kept since D313.
    let kept = verify(root, &[]).1["kept_anchor"]["path"]
        .as_str()
        .expect("a kept anchor")
        .to_string();
    std::fs::remove_file(kept).expect("rm kept anchor");
    let c = Connection::open(root.join(".rewind/ledger.db")).expect("open");
    c.execute_batch("DROP TABLE chain; DROP TABLE effects; PRAGMA user_version = 0;")
        .expect("drop");
    drop(c);
    write(&root.join("a"), b"2");
    rewind_json(root, &["checkpoint"]);
    rewind_json(root, &["rewind", &first]);
    let (code, v) = verify(root, &[]);
    assert_eq!(code, 0, "{v}");
    let kinds: Vec<String> = rows(&root.join(".rewind/ledger.db"))
        .iter()
        .map(|(_, d, _)| Entry::decode(d).expect("decode").kind)
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("genesis"));
    assert_eq!(
        rewind(root, &["guard", "--key", "after-migration"])
            .status
            .code(),
        Some(0)
    );
}

/// The chain proves its entries; `verify --deep` carries that proof to
/// the checkpoints table a rewind reads. A row pointed at another
/// checkpoint's content (SQL, no chain entry touched) passed, and a
/// rewind to it restored the other tree.
#[test]
fn verify_deep_finds_a_checkpoint_row_changed_behind_the_chain() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a.txt"), b"one");
    let first = common::checkpoint_id(root, &["first"]);
    write(&root.join("a.txt"), b"two");
    let second = common::checkpoint_id(root, &["second"]);
    let v = rewind_json(root, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
    let c = Connection::open(root.join(".rewind/ledger.db")).expect("open");
    c.execute(
        "UPDATE checkpoints SET root = (SELECT root FROM checkpoints WHERE id = ?2) WHERE id = ?1",
        rusqlite::params![first, second],
    )
    .expect("tamper");
    c.execute(
        "UPDATE checkpoints SET label = 'renamed' WHERE id = ?1",
        [&second],
    )
    .expect("tamper label");
    drop(c);
    let (code, v) = verify(root, &["--deep"]);
    assert_eq!(code, 1, "{v}");
    let bad: Vec<String> = v["deep"]["bad"]
        .as_array()
        .expect("bad")
        .iter()
        .filter_map(|b| b.as_str().map(String::from))
        .collect();
    assert!(
        bad.iter().any(|b| b.contains(&first) && b.contains("root")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b.contains(&second) && b.contains("label")),
        "{bad:?}"
    );
}

/// D305: plain `verify` holds the checkpoints' rows to the chain too. A
/// root pointed at another checkpoint's content passed it while a rewind
/// refused that checkpoint as tampered (helper-62), and a checkpoint
/// marked pruned by SQL, which `list` then hid, passed even `--deep`
/// (helper-63): each `gc` records what it pruned, and the rows must say
/// the same. A real `gc` still verifies.
#[test]
fn plain_verify_finds_checkpoint_rows_and_prunes_changed_behind_the_chain() {
    let dir = common::tmp();
    let root = dir.path();
    let mut ids = Vec::new();
    for i in 0..7 {
        write(&root.join("a.txt"), format!("v{i}").as_bytes());
        ids.push(common::checkpoint_id(root, &[]));
    }
    // HEAD and its three parents stay (the recent past).
    let gc = rewind_json(root, &["gc", "--keep-last", "2", "--keep-within", "0s"]);
    assert!(
        gc["pruned"]
            .as_array()
            .is_some_and(|p| p.contains(&ids[0].clone().into())),
        "{gc}"
    );
    for args in [&[][..], &["--deep"]] {
        let (code, v) = verify(root, args);
        assert_eq!(code, 0, "after a real gc {args:?}: {v}");
    }
    let db = root.join(".rewind/ledger.db");
    for (tamper, what) in [
        (
            format!(
                "UPDATE checkpoints SET root = (SELECT root FROM checkpoints WHERE id = '{}') WHERE id = '{}'",
                ids[5], ids[6]
            ),
            "root",
        ),
        (
            format!(
                "UPDATE checkpoints SET pruned_at = 1 WHERE id = '{}'",
                ids[6]
            ),
            "pruned in the table",
        ),
        (
            format!(
                "UPDATE checkpoints SET pruned_at = NULL WHERE id = '{}'",
                ids[0]
            ),
            "kept in the table",
        ),
    ] {
        let before = std::fs::read(&db).expect("ledger");
        let wal = std::fs::read(root.join(".rewind/ledger.db-wal")).ok();
        let c = Connection::open(&db).expect("open");
        c.execute_batch(&tamper).expect("tamper");
        drop(c);
        for args in [&[][..], &["--deep"]] {
            let (code, v) = verify(root, args);
            assert_eq!(code, 1, "{tamper} {args:?}: {v}");
            let text = v.to_string();
            assert!(text.contains(what), "{tamper} {args:?}: {v}");
        }
        let (_, v) = verify(root, &[]);
        assert_eq!(v["first_bad"]["code"], "ROW_MISMATCH", "{v}");
        // Put the ledger back as it was for the next tamper.
        std::fs::write(&db, before).expect("restore");
        match &wal {
            Some(w) => std::fs::write(root.join(".rewind/ledger.db-wal"), w).expect("wal"),
            None => {
                let _ = std::fs::remove_file(root.join(".rewind/ledger.db-wal"));
            }
        }
        let _ = std::fs::remove_file(root.join(".rewind/ledger.db-shm"));
        let (code, v) = verify(root, &[]);
        assert_eq!(code, 0, "restored after {tamper}: {v}");
    }
}

/// `rewind anchor FILE` run routinely (cron, a CI step) after a truncation
/// overwrote the one anchor that proved it; and a file name shared by two
/// workspaces overwrote the other's anchor. An anchor is now replaced only
/// by a newer one of the same workspace whose chain verifies against it.
#[test]
fn anchoring_again_never_overwrites_the_evidence_of_a_truncation() {
    let dir = common::tmp();
    let root = &dir.path().join("ws");
    let db = history(root, 3);
    let anchor = dir.path().join("anchor.json");
    let a = anchor.to_str().expect("utf8");
    let first = rewind_json(root, &["anchor", a]);
    // A newer anchor of the same, intact chain replaces it.
    write(&root.join("more.txt"), b"more");
    rewind_json(root, &["checkpoint"]);
    let second = rewind_json(root, &["anchor", a]);
    assert!(second["seq"].as_u64() > first["seq"].as_u64(), "{second}");
    let kept = std::fs::read(&anchor).expect("read anchor");

    // Truncated below the anchor: refused, and the file kept as it was.
    let seq = second["seq"].as_i64().expect("seq");
    Connection::open(&db)
        .expect("open")
        .execute("DELETE FROM chain WHERE seq >= ?1", [seq - 1])
        .expect("truncate");
    let out = rewind(root, &["--json", "anchor", a]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "TAMPERED", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("TRUNCATED_BELOW_ANCHOR") && m.contains("kept as it was")),
        "{v}"
    );
    assert_eq!(std::fs::read(&anchor).expect("read anchor"), kept);

    // Another workspace's anchor, and a file that is no anchor, are kept.
    let other = &dir.path().join("other");
    write(&other.join("x.txt"), b"x");
    rewind_json(other, &["checkpoint"]);
    let notes = dir.path().join("notes.txt");
    write(&notes, b"my notes\n");
    for (file, why) in [
        (a, "holds the anchor of workspace"),
        (notes.to_str().expect("utf8"), "is not an anchor file"),
    ] {
        let before = std::fs::read(file).expect("read");
        let out = rewind(other, &["--json", "anchor", file]);
        assert_eq!(out.status.code(), Some(1), "{file}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["error"]["code"], "INVALID_PATH", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(why)),
            "{v}"
        );
        assert_eq!(
            std::fs::read(file).expect("read"),
            before,
            "{file} was overwritten"
        );
    }
    // `verify` reads an anchor file the way `anchor` does.
    let (code, v) = verify(other, &["--anchor", notes.to_str().expect("utf8")]);
    assert_eq!(code, 2, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("is not an anchor file")),
        "{v}"
    );
    // Verified against another workspace's anchor: a mismatch (exit 1 with
    // a code), not a usage error (exit 2 reads as "unreadable").
    let (code, v) = verify(other, &["--anchor", a]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(bad(&v), (1, "GENESIS_MISMATCH".into()), "{v}");
}

/// D112: a rewind reads the `checkpoints` table, and a row whose root was
/// pointed at another checkpoint's content restored that other tree with
/// `verify` (not `--deep`) still ok. The rewind now checks the target's
/// row against the chain entry that recorded it and refuses with
/// TAMPERED, changing nothing; `verify --deep` also names a changed
/// parent (which moves `HEAD~N` and gc's protection of HEAD's ancestors).
#[test]
fn a_rewind_refuses_a_checkpoint_row_the_chain_does_not_back() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a.txt"), b"first");
    let first = checkpoint_id(root, &["first"]);
    write(&root.join("a.txt"), b"second");
    let second = checkpoint_id(root, &["second"]);
    write(&root.join("a.txt"), b"live");
    let db = root.join(".rewind/ledger.db");
    let sql = |q: &str| {
        Connection::open(&db)
            .expect("open")
            .execute_batch(q)
            .expect(q)
    };
    sql(&format!(
        "UPDATE checkpoints SET root = (SELECT root FROM checkpoints WHERE id = '{first}') WHERE id = '{second}'"
    ));
    let out = rewind(root, &["--json", "rewind", &second]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "TAMPERED", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&second)
                && m.contains("root in its row")
                && m.contains("nothing was changed")),
        "{v}"
    );
    assert_eq!(std::fs::read(root.join("a.txt")).expect("read"), b"live");
    // An intact checkpoint still rewinds.
    rewind_json(root, &["rewind", &first]);
    assert_eq!(std::fs::read(root.join("a.txt")).expect("read"), b"first");
    // A parent pointed elsewhere: verify --deep names it.
    sql(&format!(
        "UPDATE checkpoints SET parent = NULL WHERE id = '{second}'"
    ));
    let (code, v) = verify(root, &["--deep"]);
    assert_eq!(code, 1, "{v}");
    assert!(
        v["deep"]["bad"]
            .as_array()
            .is_some_and(|b| b.iter().any(|x| x
                .as_str()
                .is_some_and(|s| s.contains(&second) && s.contains("parent")))),
        "{v}"
    );
}

/// D313: a chain cut at its tail verified, so a history that lost its
/// newest checkpoints looked whole. helper-67 saw it happen: `grep -rl
/// old . | xargs sed -i` rewrote the ledger's WAL, SQLite stopped reading
/// at the first frame whose checksum failed, and `list` showed one
/// checkpoint of four while `verify` said ok. The anchor rewind keeps
/// outside the workspace names it: every command warns, `verify` fails,
/// and a checkpoint on top does not move the anchor; deleting the kept
/// file accepts the ledger as it is. A copy of the workspace keeps its
/// own anchor, and both verify.
#[test]
fn a_history_that_lost_its_newest_entries_is_named_by_the_anchor_rewind_keeps() {
    let dir = common::tmp();
    let ws = dir.path().join("proj");
    for i in 0..4 {
        write(
            &ws.join(format!("m{i}.py")),
            format!("def oldname_{i}():\n    return 'oldname'\n").as_bytes(),
        );
    }
    rewind_json(&ws, &["checkpoint", "one"]);
    settle(&ws.join(".rewind/ledger.db"));
    for label in ["two", "three", "four"] {
        write(&ws.join("m0.py"), format!("# {label} oldname\n").as_bytes());
        rewind_json(&ws, &["checkpoint", label]);
    }
    // A copy of the workspace, history and all, goes its own way.
    let copy = dir.path().join("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&ws)
        .arg(&copy)
        .status()
        .expect("cp");
    assert!(cp.success());
    write(&copy.join("m1.py"), b"copied\n");
    rewind_json(&copy, &["checkpoint", "in the copy"]);
    write(&ws.join("m2.py"), b"original\n");
    rewind_json(&ws, &["checkpoint", "five"]);
    for root in [&ws, &copy] {
        let (code, v) = verify(root, &[]);
        assert_eq!(code, 0, "{}: {v}", root.display());
        assert!(v["kept_anchor"]["path"].is_string(), "{v}");
    }
    let entries = verify(&ws, &[]).1["entries"].as_u64().expect("entries");

    // The everyday rename, run straight (not through the hook, D312).
    let sed = Command::new("sh")
        .current_dir(&ws)
        .args([
            "-c",
            "grep -rl oldname . | xargs sed -i 's/oldname/newname/g'",
        ])
        .status()
        .expect("sh");
    assert!(sed.success());
    // Every command says it, `checkpoint` and the hooks too (helper-68),
    // and `doctor` fails.
    for args in [&["list"][..], &["status"], &["checkpoint", "-q", "during"]] {
        let out = rewind(&ws, args);
        let warning = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            warning.contains("rewind: warning: this workspace's history reached entry")
                && warning.contains("rewind verify"),
            "{args:?}: {warning}"
        );
    }
    // Said once per process on stderr, the checkpoint's own included.
    let out = rewind(&ws, &["checkpoint", "-q", "said once"]);
    let said = String::from_utf8_lossy(&out.stderr)
        .matches("history reached entry")
        .count();
    assert_eq!(said, 1, "{}", String::from_utf8_lossy(&out.stderr));
    // D354: in the checkpoint's result, where an agent reads it: its
    // JSON, and the MCP tool's answer (whose stderr no agent sees).
    let v = rewind_json(&ws, &["checkpoint", "in json"]);
    assert!(
        v["history_lost"]
            .as_str()
            .is_some_and(|w| w.contains("history reached entry")),
        "{v}"
    );
    write(&ws.join("m1.py"), b"by the agent\n");
    let answers = common::raw_mcp_answers(
        &ws,
        &[
            common::INITIALIZE,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"checkpoint","arguments":{}}}"#,
        ],
    );
    let got = &answers[1]["result"]["structuredContent"];
    assert!(
        got["warning"]
            .as_str()
            .is_some_and(|w| w.contains("rewind verify")),
        "{got}"
    );
    let doctor = rewind(&ws, &["doctor"]);
    assert_eq!(doctor.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains("\nLOST: "),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let (code, v) = verify(&ws, &[]);
    assert_eq!(code, 1, "{v}");
    let (_, why) = bad(&v);
    assert!(
        why == "TRUNCATED_BELOW_ANCHOR" || why == "ANCHOR_MISMATCH",
        "{v}"
    );
    assert!(
        v["first_bad"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the anchor rewind keeps")),
        "{v}"
    );
    // New entries on top do not bury the loss.
    write(&ws.join("m3.py"), b"after\n");
    rewind_json(&ws, &["checkpoint", "after"]);
    assert_eq!(verify(&ws, &[]).0, 1, "the kept anchor moved past a loss");
    let kept = v["kept_anchor"]["path"].as_str().expect("path").to_string();
    let seq = v["kept_anchor"]["seq"].as_u64().expect("seq");
    assert_eq!(seq, entries, "{v}");
    // Accepted by deleting it: the next command keeps a new one.
    std::fs::remove_file(&kept).expect("rm kept anchor");
    let (code, v) = verify(&ws, &[]);
    assert_eq!(code, 0, "{v}");
    assert!(v.get("kept_anchor").is_none(), "{v}");
    let accepted = rewind_json(&ws, &["checkpoint", "accepted"]);
    assert!(accepted.get("history_lost").is_none(), "{accepted}");
    assert_eq!(verify(&ws, &[]).1["kept_anchor"]["path"], kept.as_str());
    // The copy never noticed.
    assert_eq!(verify(&copy, &[]).0, 0);
}

/// D315: `verify` read the chain and the checkpoints' rows apart, so a
/// checkpoint another process committed between the two was "in the table
/// but not on the chain": TAMPERED (ROW_MISMATCH) while nothing was wrong
/// (helper-68: 187 false alarms in 15 s beside six checkpoint loops).
/// Both come from one snapshot now: every `verify` during four writers'
/// checkpoints passes.
#[test]
fn verify_during_other_processes_checkpoints_never_says_tampered() {
    let dir = common::tmp();
    let root = dir.path().to_path_buf();
    write(&root.join("seed.txt"), b"0");
    rewind_json(&root, &["checkpoint"]);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let root = root.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    write(&root.join(format!("w{w}.txt")), format!("{i}").as_bytes());
                    let out = rewind(&root, &["checkpoint", "-q"]);
                    assert!(
                        out.status.success()
                            || String::from_utf8_lossy(&out.stderr).contains("LOCKED"),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    let verifier = {
        let (root, done) = (root.clone(), done.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let (code, v) = verify(&root, &[]);
                assert_eq!(code, 0, "verify run {runs} during checkpoints: {v}");
                runs += 1;
            }
            runs
        })
    };
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = verifier.join().expect("verifier");
    assert!(runs > 5, "only {runs} verify runs overlapped the writers");
}

/// D351: the anchor rewind keeps is the user's alone, whatever the umask
/// (under `umask 000` it was 0666 in 0777 directories, so any local user
/// could delete it, which accepts a cut ledger), an earlier build's open
/// directories are closed, a HOME that does not exist is never made, and
/// `doctor` says where the anchor is kept or why none is.
#[test]
fn the_kept_anchor_is_private_under_any_umask_and_no_missing_home_is_made() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let dir = common::tmp();
    let root = dir.path();
    let state = common::tmp();
    let st = state.path().to_str().expect("utf8").to_string();
    write(&root.join("a.txt"), b"a");
    let under_umask_000 = |args: &str| {
        let out = Command::new("sh")
            .args([
                "-c",
                &format!("umask 000; exec \"$0\" {args}"),
                env!("CARGO_BIN_EXE_rewind"),
            ])
            .current_dir(root)
            .env("XDG_STATE_HOME", &st)
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}");
        out
    };
    under_umask_000("-q checkpoint one");
    let anchors = state.path().join("rewind/anchors");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    let files: Vec<PathBuf> = std::fs::read_dir(&anchors)
        .expect("anchors")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(mode(&files[0]), 0o600, "the anchor file");
    assert_eq!(mode(&anchors), 0o700, "anchors/");
    assert_eq!(mode(&state.path().join("rewind")), 0o700, "rewind/");

    // Left open by an earlier build: closed at the next commit.
    for (p, m) in [
        (&files[0], 0o666),
        (&anchors, 0o777),
        (&state.path().join("rewind"), 0o777),
    ] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    write(&root.join("a.txt"), b"b");
    under_umask_000("-q checkpoint two");
    assert_eq!(mode(&files[0]), 0o600, "the anchor file, closed");
    assert_eq!(mode(&anchors), 0o700, "anchors/, closed");
    assert_eq!(mode(&state.path().join("rewind")), 0o700, "rewind/, closed");

    let doctor = |env: &[(&str, &str)]| {
        let v = common::rewind_env(root, &["--json", "doctor"], env);
        let v: serde_json::Value = serde_json::from_slice(&v.stdout).expect("doctor JSON");
        v["ledger"]["anchor"].as_str().expect("anchor").to_string()
    };
    let said = doctor(&[("XDG_STATE_HOME", &st)]);
    assert!(
        said.starts_with("kept at") && said.contains("(entry "),
        "{said}"
    );

    // A HOME that does not exist is not made; doctor says none is kept.
    let missing = state.path().join("no-such-home");
    let missing_s = missing.to_str().expect("utf8");
    write(&root.join("a.txt"), b"c");
    let out = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["-q", "checkpoint", "three"])
        .current_dir(root)
        .env_remove("XDG_STATE_HOME")
        .env("HOME", missing_s)
        .output()
        .expect("rewind");
    assert!(out.status.success(), "{out:?}");
    assert!(!missing.exists(), "a missing HOME was made");
    let said = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(["--json", "doctor"])
        .current_dir(root)
        .env_remove("XDG_STATE_HOME")
        .env("HOME", missing_s)
        .output()
        .expect("doctor");
    let v: serde_json::Value = serde_json::from_slice(&said.stdout).expect("doctor JSON");
    let said = v["ledger"]["anchor"].as_str().expect("anchor");
    assert!(said.starts_with("none kept:"), "{said}");

    // A state directory that cannot be written is named as such.
    let file = state.path().join("a-file");
    write(&file, b"x");
    let link = state.path().join("state-under-a-file");
    symlink(file.join("sub"), &link).expect("symlink");
    let said = doctor(&[("XDG_STATE_HOME", link.to_str().expect("utf8"))]);
    assert!(
        said.starts_with("none kept:") && said.contains("cannot be written"),
        "{said}"
    );
    let said = doctor(&[("XDG_STATE_HOME", file.to_str().expect("utf8"))]);
    assert!(said.contains("cannot be written"), "{said}");
}

/// D356: a rewind's intent commit leaves the kept anchor where it was,
/// and its HEAD commit moves it. Killed between the two, the anchor is
/// behind the ledger, never ahead of it, so nothing says the history lost
/// entries; the command that finishes the rewind brings it to the head.
/// The anchor is one file, rewritten in place: no temporary names left.
#[test]
fn a_rewind_killed_after_its_intent_leaves_the_kept_anchor_behind_and_says_no_loss() {
    let dir = common::tmp();
    let root = dir.path();
    let state = common::tmp();
    let st = state.path().to_str().expect("utf8");
    let env = [("XDG_STATE_HOME", st)];
    let anchors = state.path().join("rewind/anchors");
    let kept = || {
        let files: Vec<PathBuf> = std::fs::read_dir(&anchors)
            .expect("anchors")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(
            files.len(),
            1,
            "one anchor file, no temporary ones: {files:?}"
        );
        let text = std::fs::read_to_string(&files[0]).expect("read anchor");
        let v: serde_json::Value = serde_json::from_str(text.trim()).expect("anchor JSON");
        v["seq"].as_u64().expect("seq")
    };
    let head = || {
        let out = common::rewind_env(root, &["--json", "verify"], &env);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("verify JSON");
        v["head"]["seq"].as_u64().expect("head seq")
    };
    write(&root.join("a.txt"), b"one");
    let out = common::rewind_env(root, &["--json", "checkpoint", "A"], &env);
    assert!(out.status.success(), "{out:?}");
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let a = a["id"].as_str().expect("id").to_string();
    let before = head();
    assert_eq!(kept(), before, "a checkpoint keeps its head");

    write(&root.join("a.txt"), b"two");
    let out = common::rewind_env(
        root,
        &["rewind", &a],
        &[
            ("XDG_STATE_HOME", st),
            ("REWIND_FAILPOINT", "rewind:after-intent"),
        ],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "killed at the failpoint: {out:?}"
    );
    // The intent and its safety checkpoint are in the ledger, not in the
    // anchor.
    let mid = root.join(".rewind/ledger.db");
    let c = Connection::open(&mid).expect("open");
    let ledger_head: i64 = c
        .query_row("SELECT MAX(seq) FROM chain", [], |r| r.get(0))
        .expect("head");
    drop(c);
    assert!(ledger_head as u64 > before, "the intent was committed");
    assert_eq!(kept(), before, "the intent commit left the anchor");

    let out = common::rewind_env(root, &["--json", "status"], &env);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("lost"), "no loss is said: {said}");
    assert_eq!(std::fs::read(root.join("a.txt")).expect("read"), b"one");
    let after = head();
    assert!(after > ledger_head as u64, "the rewind was finished");
    assert_eq!(kept(), after, "the finishing commit kept the head");
}
