//! What the ledger stores per checkpoint (docs/DECISIONS.md D49): tree
//! nodes are stored in a compact form that decodes to the canonical
//! encoding their hashes name; ledgers whose rows hold the canonical
//! encoding (written before, format 1) still read, verify and rewind
//! exactly and are marked format 2; a damaged compact row is found by
//! `verify --deep`.

mod common;

use std::path::Path;

use common::{assert_same, checkpoint_id, rewind, rewind_json, snapshot, write};
use rewind::hash::Hash;
use rewind::tree::Node;
use rusqlite::{Connection, params};

/// 3 directories of 100 small files, a symlink and a nested directory.
fn populate(root: &Path) {
    for d in 0..3 {
        for i in 0..100 {
            write(
                &root.join(format!("d{d}/f{:06}.bin", i * 100 + d)),
                format!("file {d}/{i}").repeat(20).as_bytes(),
            );
        }
    }
    write(&root.join("d0/sub/deep.txt"), b"deep");
    std::os::unix::fs::symlink("d0/sub/deep.txt", root.join("link")).expect("symlink");
}

fn tree_rows(db: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = Connection::open(db).expect("open");
    let mut s = c.prepare("SELECT hash, data FROM trees").expect("prepare");
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

fn format_version(db: &Path) -> String {
    Connection::open(db)
        .expect("open")
        .query_row(
            "SELECT value FROM meta WHERE key = 'format_version'",
            [],
            |r| r.get(0),
        )
        .expect("format_version")
}

fn deep_ok(root: &Path) {
    let v = rewind_json(root, &["verify", "--deep"]);
    assert_eq!(v["ok"], true, "{v}");
}

#[test]
fn tree_nodes_are_stored_compact_and_name_their_canonical_encoding() {
    let dir = common::tmp();
    let root = dir.path();
    populate(root);
    rewind_json(root, &["checkpoint"]);
    let db = root.join(".rewind/ledger.db");
    let rows = tree_rows(&db);
    assert_eq!(rows.len(), 5, "root, d0, d0/sub, d1, d2");
    let mut big = 0;
    for (hash, data) in &rows {
        assert!(data.starts_with(b"RWTc"), "a row not in the stored form");
        let node = Node::decode_stored(data).expect("decodes");
        let canonical = node.encode();
        assert_eq!(
            Node::hash_of_encoding(&canonical).0.as_slice(),
            hash.as_slice()
        );
        if node.entries.len() >= 100 {
            big += 1;
            assert!(
                data.len() * 100 <= canonical.len() * 75,
                "a 100-file directory stored in {} bytes, canonical {}",
                data.len(),
                canonical.len()
            );
        }
    }
    assert_eq!(big, 3);
    deep_ok(root);
}

#[test]
fn a_ledger_with_canonical_rows_still_reads_verifies_and_rewinds_exactly() {
    let dir = common::tmp();
    let root = dir.path();
    populate(root);
    let first = checkpoint_id(root, &["first"]);
    let want = snapshot(root);
    // What a ledger written before the stored form holds: every row in the
    // canonical encoding.
    let db = root.join(".rewind/ledger.db");
    let c = Connection::open(&db).expect("open");
    c.execute(
        "UPDATE meta SET value = '1' WHERE key = 'format_version'",
        [],
    )
    .expect("format 1");
    for (hash, data) in tree_rows(&db) {
        let canonical = Node::decode_stored(&data).expect("decodes").encode();
        c.execute(
            "UPDATE trees SET data = ?1 WHERE hash = ?2",
            params![canonical, hash],
        )
        .expect("rewrite row");
    }
    drop(c);
    assert!(tree_rows(&db).iter().all(|(_, d)| d.starts_with(b"RWT1")));
    deep_ok(root);
    // Opened once, the ledger says it may hold compact nodes: a format-1
    // rewind refuses it by its version rather than calling a node corrupt
    // (and it is marked as this build's, D334).
    assert_eq!(format_version(&db), "3");
    let v = rewind_json(root, &["status"]);
    assert_eq!(v["changes"].as_array().map(Vec::len), Some(0), "{v}");
    // New nodes go in compact, beside the old ones; both read back.
    write(&root.join("d1/f000001.bin"), b"changed");
    std::fs::remove_file(root.join("d2/f000002.bin")).expect("rm");
    write(&root.join("d0/sub/new.txt"), b"new");
    rewind_json(root, &["checkpoint"]);
    let rows = tree_rows(&db);
    assert!(rows.iter().any(|(_, d)| d.starts_with(b"RWT1")));
    assert!(rows.iter().any(|(_, d)| d.starts_with(b"RWTc")));
    deep_ok(root);
    let after = snapshot(root);
    rewind_json(root, &["rewind", &first]);
    assert_same(
        "rewound to the canonical-row checkpoint",
        &want,
        &snapshot(root),
    );
    rewind_json(root, &["undo"]);
    assert_same(
        "undo onto the compact-row checkpoint",
        &after,
        &snapshot(root),
    );
    deep_ok(root);
}

/// D334: builds before format 3 wrote a ledger this one had migrated,
/// leaving out the rows and keys they did not know (helper-83), and every
/// one of them refuses a ledger whose format it does not read. A format-2
/// ledger is marked 3 when opened, and its stat cache, which such a build
/// may have written, is dropped with the mark. A later build's format or
/// schema is refused by name, with nothing changed.
#[test]
fn new_ledgers_are_format_3_and_a_later_format_or_schema_is_refused_by_name() {
    let dir = common::tmp();
    let root = dir.path();
    write(&root.join("a"), b"a");
    rewind_json(root, &["checkpoint"]);
    let db = root.join(".rewind/ledger.db");
    assert_eq!(format_version(&db), "3");
    let sql = |q: &str| {
        Connection::open(&db)
            .expect("open")
            .execute_batch(q)
            .expect("sql");
    };
    let cached = || -> i64 {
        Connection::open(&db)
            .expect("open")
            .query_row("SELECT count(*) FROM stat_cache", [], |r| r.get(0))
            .expect("count")
    };
    assert!(cached() > 0, "a checkpoint keeps a stat cache");
    sql("UPDATE meta SET value = '2' WHERE key = 'format_version'");
    let v = rewind_json(root, &["status"]);
    assert_eq!(v["changes"], serde_json::json!([]), "{v}");
    assert_eq!(format_version(&db), "3");
    assert_eq!(cached(), 0, "the stat cache goes with the mark");
    write(&root.join("b"), b"b");
    let v = rewind_json(root, &["checkpoint"]);
    assert_eq!(v["changes"]["added"], 1, "{v}");
    assert!(cached() > 0, "and is written again");

    let refused = |field: &str| {
        let before = std::fs::read(&db).expect("ledger bytes");
        for args in [&["--json", "status"][..], &["--json", "checkpoint"][..]] {
            let out = rewind(root, args);
            assert_eq!(out.status.code(), Some(1));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            assert_eq!(v["error"]["code"], "LEDGER_NEWER", "{v}");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(
                msg.contains(&format!("written by a later build of rewind ({field};"))
                    && msg.contains("this build, 0.1.0+")
                    && msg.contains("nothing was changed"),
                "{v}"
            );
        }
        assert_eq!(std::fs::read(&db).expect("ledger bytes"), before);
    };
    sql("UPDATE meta SET value = '4' WHERE key = 'format_version'");
    refused("ledger format 4");
    sql("UPDATE meta SET value = '3' WHERE key = 'format_version'; PRAGMA user_version = 6;");
    refused("ledger schema 6");
    // Not a number: damage, not a later build.
    sql("UPDATE meta SET value = 'x' WHERE key = 'format_version'; PRAGMA user_version = 5;");
    let out = rewind(root, &["--json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "LEDGER_CORRUPT", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("format version x, this rewind reads 1 to 3"),
        "{v}"
    );
}

#[test]
fn a_damaged_compact_node_is_found_and_named() {
    let dir = common::tmp();
    let root = dir.path();
    populate(root);
    rewind_json(root, &["checkpoint"]);
    let db = root.join(".rewind/ledger.db");
    let (hash, mut data) = tree_rows(&db)
        .into_iter()
        .max_by_key(|(_, d)| d.len())
        .expect("a row");
    // One bit of the last entry's object hash: still decodes, no longer
    // hashes to its name.
    let at = data.len() - 10;
    data[at] ^= 1;
    let c = Connection::open(&db).expect("open");
    c.execute(
        "UPDATE trees SET data = ?1 WHERE hash = ?2",
        params![data, hash],
    )
    .expect("damage");
    drop(c);
    let name = Hash::from_slice(&hash).expect("hash").to_string();
    let ledger = rewind::ledger::Ledger::open(&db).expect("open ledger");
    let (checked, bad) = ledger.bad_tree_nodes().expect("check nodes");
    assert_eq!((checked, bad.len()), (5, 1));
    assert_eq!(bad[0].to_string(), name);
    drop(ledger);
    // As before the stored form: the deep check stops at the damaged node
    // (reading it for the content check) and names it.
    let out = rewind(root, &["--json", "verify", "--deep"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "LEDGER_CORRUPT", "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!("tree node {name} does not match its hash")),
        "{v}"
    );
}
