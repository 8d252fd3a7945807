//! The tamper-evident event chain (DESIGN §9; the byte format is specified
//! in docs/CHAIN.md, which is the contract for independent verifiers).
//!
//! Every state change appends an entry in the same SQLite transaction as
//! the change itself, so the chain and the state can never disagree. An
//! entry is a canonical, length-prefixed binary encoding; its hash is
//! `SHA-256(0x00 ‖ encoding)` (the RFC 6962 leaf hash) and the next entry
//! carries it as `prev`. Rows are `chain(seq, data, hash)`.

use crate::ledger::CachedRow;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::error::{Result, db_err};
use crate::hash::{Hash, Hasher};

pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS chain(seq INTEGER PRIMARY KEY, data BLOB NOT NULL, hash BLOB NOT NULL);";

const MAGIC: &[u8; 4] = b"RWC1";

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub prev: Hash,
    pub time_ms: u64,
    pub kind: String,
    /// Sorted by name, unique.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            64 + self
                .fields
                .iter()
                .map(|(n, v)| n.len() + v.len() + 6)
                .sum::<usize>(),
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.prev.0);
        out.extend_from_slice(&self.time_ms.to_be_bytes());
        out.extend_from_slice(&(self.kind.len() as u16).to_be_bytes());
        out.extend_from_slice(self.kind.as_bytes());
        out.extend_from_slice(&(self.fields.len() as u32).to_be_bytes());
        for (name, value) in &self.fields {
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }

    /// Strict decoding: any deviation from the canonical form is an error,
    /// so two encodings of one entry cannot both verify.
    pub fn decode(b: &[u8]) -> std::result::Result<Entry, &'static str> {
        let mut r = crate::tree::Reader { b };
        let err = |_| "truncated";
        if r.take(4).map_err(err)? != MAGIC {
            return Err("bad magic");
        }
        let seq = r.u64().map_err(err)?;
        let prev = r.hash().map_err(err)?;
        let time_ms = r.u64().map_err(err)?;
        let klen = r.u16().map_err(err)? as usize;
        let kind = std::str::from_utf8(r.take(klen).map_err(err)?)
            .map_err(|_| "kind is not UTF-8")?
            .to_string();
        if kind.is_empty() || !kind.bytes().all(|c| c.is_ascii_lowercase() || c == b'-') {
            return Err("bad kind");
        }
        let n = r.u32().map_err(err)? as usize;
        let mut fields: Vec<(String, Vec<u8>)> = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let nlen = r.u16().map_err(err)? as usize;
            let name = std::str::from_utf8(r.take(nlen).map_err(err)?)
                .map_err(|_| "field name is not UTF-8")?
                .to_string();
            if fields
                .last()
                .is_some_and(|(p, _)| p.as_bytes() >= name.as_bytes())
            {
                return Err("fields not sorted or duplicated");
            }
            let vlen = r.u32().map_err(err)? as usize;
            let value = r.take(vlen).map_err(err)?.to_vec();
            fields.push((name, value));
        }
        if !r.b.is_empty() {
            return Err("trailing bytes");
        }
        Ok(Entry {
            seq,
            prev,
            time_ms,
            kind,
            fields,
        })
    }

    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// `SHA-256(0x00 ‖ data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Hasher::default();
    h.update(&[0]);
    h.update(data);
    h.finish()
}

/// Fields of an event, built in any order and sorted on append.
#[derive(Default)]
pub struct Fields(Vec<(String, Vec<u8>)>);

impl Fields {
    pub fn new() -> Fields {
        Fields(Vec::new())
    }

    pub fn str(mut self, name: &str, value: &str) -> Fields {
        self.0.push((name.to_string(), value.as_bytes().to_vec()));
        self
    }

    pub fn bytes(mut self, name: &str, value: &[u8]) -> Fields {
        self.0.push((name.to_string(), value.to_vec()));
        self
    }

    pub fn num(self, name: &str, value: u64) -> Fields {
        self.str(name, &value.to_string())
    }
}

/// Append an event inside an open write transaction. Returns its seq.
pub fn append(conn: &Connection, kind: &str, fields: Fields) -> rusqlite::Result<u64> {
    let last: Option<(i64, Vec<u8>)> = conn
        .cached_row(
            "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (seq, prev) = match last {
        Some((s, h)) => (s as u64 + 1, Hash::from_slice(&h).unwrap_or(Hash([0; 32]))),
        None => (1, Hash([0; 32])),
    };
    let mut fields = fields.0;
    fields.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    fields.dedup_by(|a, b| a.0 == b.0);
    let entry = Entry {
        seq,
        prev,
        time_ms: crate::time::now_ms().max(0) as u64,
        kind: kind.to_string(),
        fields,
    };
    let data = entry.encode();
    let hash = leaf_hash(&data);
    conn.prepare_cached("INSERT INTO chain(seq, data, hash) VALUES (?1, ?2, ?3)")?
        .execute(params![seq as i64, data, &hash.0[..]])?;
    Ok(seq)
}

/// Why verification stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    /// A row is missing: the next row's seq is not the expected one.
    SeqGap,
    /// The entry does not decode in the canonical form.
    DecodeError,
    /// The stored hash is not SHA-256(0x00 ‖ data).
    HashMismatch,
    /// The entry was written for another position (moved, duplicated).
    OutOfOrder,
    /// `prev` is not the hash of the entry before it.
    BrokenLink,
    /// Entry 1 is not a genesis naming this workspace.
    GenesisMismatch,
    /// The chain is shorter than an anchor says it was.
    TruncatedBelowAnchor,
    /// The entry at the anchor's seq has another hash.
    AnchorMismatch,
    /// A checkpoint's row (root, label, kind, parent, pruned) is not what
    /// the chain recorded (D305).
    RowMismatch,
}

impl Code {
    /// The code as it appears in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::SeqGap => "SEQ_GAP",
            Code::DecodeError => "DECODE_ERROR",
            Code::HashMismatch => "HASH_MISMATCH",
            Code::OutOfOrder => "OUT_OF_ORDER",
            Code::BrokenLink => "BROKEN_LINK",
            Code::GenesisMismatch => "GENESIS_MISMATCH",
            Code::TruncatedBelowAnchor => "TRUNCATED_BELOW_ANCHOR",
            Code::AnchorMismatch => "ANCHOR_MISMATCH",
            Code::RowMismatch => "ROW_MISMATCH",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FirstBad {
    pub seq: u64,
    pub code: Code,
    pub reason: String,
}

impl FirstBad {
    /// `entry N: CODE (reason)`, for people and models alike.
    pub fn summary(&self) -> String {
        format!(
            "entry {}: {} ({})",
            self.seq,
            self.code.as_str(),
            self.reason
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub ok: bool,
    pub entries: u64,
    pub head: Option<Head>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<FirstBad>,
}

/// An exported chain head, to keep elsewhere (`rewind anchor`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Anchor {
    pub workspace: String,
    pub seq: u64,
    pub head: String,
}

impl Anchor {
    /// The anchor kept in `path`, or `None` when there is no such file; a
    /// file that does not parse as one is `InvalidPath`, naming it.
    pub fn read(path: &std::path::Path) -> crate::error::Result<Option<Anchor>> {
        use crate::error::Error;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                return Err(Error::InvalidPath {
                    path: path.to_path_buf(),
                    reason: "is a directory: name a file in it, e.g. anchor.json".into(),
                });
            }
            Err(e) => {
                return Err(Error::os(rewind_platform::Error::new(
                    "read anchor",
                    path,
                    e,
                )));
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::InvalidPath {
                path: path.to_path_buf(),
                reason: format!("is not an anchor file ({e})"),
            })
    }
}

/// Walk the whole chain (streaming: memory does not grow with its length).
pub fn verify(
    conn: &Connection,
    path: &std::path::Path,
    workspace_id: &str,
    anchor: Option<&Anchor>,
) -> Result<Verdict> {
    verify_with(conn, path, workspace_id, anchor, &mut |_| {})
}

/// [`verify`], showing `visit` each entry that checks out, in order: a
/// caller that needs what the chain says (the barrier, D109) reads it in
/// the same walk.
pub fn verify_with(
    conn: &Connection,
    path: &std::path::Path,
    workspace_id: &str,
    anchor: Option<&Anchor>,
    visit: &mut dyn FnMut(&Entry),
) -> Result<Verdict> {
    let mut stmt = conn
        .prepare("SELECT seq, data, hash FROM chain ORDER BY seq")
        .map_err(db_err(path))?;
    let mut rows = stmt.query([]).map_err(db_err(path))?;
    let mut expected = 1u64;
    let mut prev = Hash([0; 32]);
    let mut anchored: Option<Hash> = None;
    let bad = |seq: u64, code: Code, reason: String, entries: u64| Verdict {
        ok: false,
        entries,
        head: None,
        first_bad: Some(FirstBad { seq, code, reason }),
    };
    while let Some(row) = rows.next().map_err(db_err(path))? {
        let seq: i64 = row.get(0).map_err(db_err(path))?;
        let entries = expected - 1;
        // A value stored as another type (TEXT where a BLOB belongs) is an
        // edited row, not an unreadable ledger.
        let blob = |i: usize| match row.get_ref(i) {
            Ok(rusqlite::types::ValueRef::Blob(b)) => Some(b.to_vec()),
            _ => None,
        };
        let (Some(data), Some(stored)) = (blob(1), blob(2)) else {
            return Ok(bad(
                expected,
                Code::DecodeError,
                "its data or hash is not stored as bytes".into(),
                entries,
            ));
        };
        if seq as u64 != expected {
            return Ok(bad(
                expected,
                Code::SeqGap,
                format!("entry {expected} is missing (next stored entry is {seq})"),
                entries,
            ));
        }
        let entry = match Entry::decode(&data) {
            Ok(e) => e,
            Err(why) => return Ok(bad(expected, Code::DecodeError, why.into(), entries)),
        };
        let hash = leaf_hash(&data);
        if stored != hash.0 {
            return Ok(bad(
                expected,
                Code::HashMismatch,
                "stored hash differs from SHA-256(0x00 || data)".into(),
                entries,
            ));
        }
        if entry.seq != expected {
            return Ok(bad(
                expected,
                Code::OutOfOrder,
                format!("entry written as {} found at {expected}", entry.seq),
                entries,
            ));
        }
        if entry.prev != prev {
            return Ok(bad(
                expected,
                Code::BrokenLink,
                "prev is not the hash of the entry before".into(),
                entries,
            ));
        }
        if expected == 1
            && (entry.kind != "genesis"
                || entry.field("workspace") != Some(workspace_id.as_bytes()))
        {
            return Ok(bad(
                1,
                Code::GenesisMismatch,
                "entry 1 is not this workspace's genesis".into(),
                entries,
            ));
        }
        if anchor.is_some_and(|a| a.seq == expected) {
            anchored = Some(hash);
        }
        visit(&entry);
        prev = hash;
        expected += 1;
    }
    let entries = expected - 1;
    if let Some(a) = anchor {
        if a.seq > entries {
            return Ok(bad(
                entries + 1,
                Code::TruncatedBelowAnchor,
                format!("the anchor saw {} entries, the chain has {entries}", a.seq),
                entries,
            ));
        }
        if anchored.map(|h| h.to_hex()) != Some(a.head.clone()) {
            return Ok(bad(
                a.seq,
                Code::AnchorMismatch,
                "the entry at the anchor's seq has another hash".into(),
                entries,
            ));
        }
    }
    Ok(Verdict {
        ok: true,
        entries,
        head: (entries > 0).then(|| Head {
            seq: entries,
            hash: prev.to_hex(),
        }),
        first_bad: None,
    })
}

/// The last entry's hash (inside a transaction).
pub fn head_hash(conn: &Connection) -> rusqlite::Result<Option<Hash>> {
    let h: Option<Vec<u8>> = conn
        .cached_row(
            "SELECT hash FROM chain ORDER BY seq DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(h.and_then(|h| Hash::from_slice(&h)))
}

/// A constant-time check of the newest end of the chain: the last two
/// entries decode, hash to their stored hashes, are numbered in sequence
/// and linked. `guard` runs this before deciding (a full walk is `verify`).
pub fn check_tail(conn: &Connection) -> rusqlite::Result<std::result::Result<(), String>> {
    let mut stmt = conn.prepare("SELECT seq, data, hash FROM chain ORDER BY seq DESC LIMIT 2")?;
    let rows: Vec<(i64, Vec<u8>, Vec<u8>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut newer: Option<Entry> = None;
    for (seq, data, stored) in &rows {
        let Ok(e) = Entry::decode(data) else {
            return Ok(Err(format!("chain entry {seq} does not decode")));
        };
        if leaf_hash(data).0[..] != stored[..] || e.seq != *seq as u64 {
            return Ok(Err(format!("chain entry {seq} does not match its hash")));
        }
        if let Some(n) = &newer
            && (n.prev.0[..] != stored[..] || n.seq != e.seq + 1)
        {
            return Ok(Err(format!("chain entry {} is not linked to {seq}", n.seq)));
        }
        newer = Some(e);
    }
    if rows.is_empty() {
        return Ok(Err("the chain is empty (no genesis)".into()));
    }
    Ok(Ok(()))
}

/// The current head, for `anchor`.
pub fn head(conn: &Connection, path: &std::path::Path) -> Result<Option<(u64, Hash)>> {
    let row: Option<(i64, Vec<u8>)> = conn
        .cached_row(
            "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(db_err(path))?;
    Ok(row.map(|(s, h)| (s as u64, Hash::from_slice(&h).unwrap_or(Hash([0; 32])))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_are_the_json_names() {
        use super::Code::*;
        for c in [
            SeqGap,
            DecodeError,
            HashMismatch,
            OutOfOrder,
            BrokenLink,
            GenesisMismatch,
            TruncatedBelowAnchor,
            AnchorMismatch,
        ] {
            assert_eq!(
                serde_json::to_value(c).ok(),
                Some(serde_json::Value::from(c.as_str()))
            );
        }
    }

    #[test]
    fn encoding_round_trips_and_rejects_non_canonical_forms() {
        let e = Entry {
            seq: 7,
            prev: Hash([9; 32]),
            time_ms: 1,
            kind: "checkpoint".into(),
            fields: vec![("a".into(), b"1".to_vec()), ("b".into(), vec![])],
        };
        let data = e.encode();
        assert_eq!(Entry::decode(&data).unwrap(), e);
        let mut swapped = e.clone();
        swapped.fields.reverse();
        assert!(Entry::decode(&swapped.encode()).is_err());
        let mut long = data.clone();
        long.push(0);
        assert!(Entry::decode(&long).is_err());
        for cut in 0..data.len() {
            assert!(Entry::decode(&data[..cut]).is_err());
        }
    }
}
