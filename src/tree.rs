//! Merkle directory nodes: the stored format shared by every engine.
//!
//! A node is the sorted list of a directory's entries. Its name is the
//! SHA-256 of its canonical encoding (below), so equal subtrees have equal
//! hashes and a tree diff can skip them: that is what makes checkpoints and
//! rewinds O(changed). The encoding is versioned and byte-exact; never change
//! it without bumping the magic.
//!
//! ```text
//! node   = "RWT1" u32:count entry*            (entries sorted by name bytes)
//! entry  = u16:len name  u8:kind  u32:mode  u64:size  i64:mtime_ns  payload  xattrs
//! payload= kind 1 (file): 32 bytes object hash
//!          kind 2 (dir):  32 bytes node hash
//!          kind 3 (link): u32:len target bytes
//! xattrs = u16:count (u16:len name  u32:len value)*   (sorted by name)
//! ```
//! Integers are big-endian. Names are non-empty, contain no '/' or NUL and
//! are not "." or "..".
//!
//! That encoding names a node; the ledger stores a more compact one
//! ([`Node::encode_stored`], docs/DECISIONS.md D49) that decodes to the
//! same entries, so the canonical bytes (and the hash) are recomputed on
//! read. Rows written before it hold the canonical encoding and still read:
//!
//! ```text
//! stored = "RWTc" varint:count entry*        (entries sorted by name bytes)
//! entry  = varint:shared varint:len suffix   (name = previous name[..shared] ‖ suffix)
//!          u8:flags [varint:mode] varint:size varint:zigzag(mtime_ns − previous mtime_ns)
//!          payload [xattrs]
//! flags  = kind (bits 0–1: 1 file, 2 dir, 3 link) | 0x04 mode as the previous entry's
//!          | 0x08 has xattrs
//! payload= file, dir: 32 bytes hash; link: varint:len target bytes
//! xattrs = varint:count (varint:len name varint:len value)*
//! ```
//! Varints are LEB128 (7 bits a byte, low first); the "previous" values of
//! the first entry are the empty name, mode 0 and mtime 0.

use std::borrow::Cow;

use rewind_platform::Xattr;

use crate::hash::Hash;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
        }
    }
}

/// What an entry points at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Object(Hash),
    Tree(Hash),
    Link(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub target: Target,
    pub xattrs: Vec<Xattr>,
}

impl Entry {
    pub fn kind(&self) -> Kind {
        match self.target {
            Target::Object(_) => Kind::File,
            Target::Tree(_) => Kind::Dir,
            Target::Link(_) => Kind::Symlink,
        }
    }

    /// Same bytes, type, mode, symlink target and xattrs: what a rewind must
    /// restore. Times are deliberately left out (DESIGN §4 rule 9), and so is
    /// a directory's subtree (compared entry by entry).
    pub fn same_content(&self, other: &Entry) -> bool {
        let targets_equal = match (&self.target, &other.target) {
            (Target::Tree(_), Target::Tree(_)) => true,
            (a, b) => a == b,
        };
        targets_equal && self.mode == other.mode && self.xattrs == other.xattrs
    }

    pub fn subtree(&self) -> Option<Hash> {
        match self.target {
            Target::Tree(h) => Some(h),
            _ => None,
        }
    }

    /// Append this entry's canonical encoding (see the module docs).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.name.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.name);
        out.push(match self.kind() {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
        });
        out.extend_from_slice(&self.mode.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.mtime_ns.to_be_bytes());
        match &self.target {
            Target::Object(h) | Target::Tree(h) => out.extend_from_slice(&h.0),
            Target::Link(t) => {
                out.extend_from_slice(&(t.len() as u32).to_be_bytes());
                out.extend_from_slice(t);
            }
        }
        out.extend_from_slice(&(self.xattrs.len() as u16).to_be_bytes());
        for x in &self.xattrs {
            out.extend_from_slice(&(x.name.len() as u16).to_be_bytes());
            out.extend_from_slice(&x.name);
            out.extend_from_slice(&(x.value.len() as u32).to_be_bytes());
            out.extend_from_slice(&x.value);
        }
    }

    /// Read one entry written by [`Entry::encode_into`], validating its name.
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Entry, DecodeError> {
        let nlen = r.u16()? as usize;
        let name = r.take(nlen)?.to_vec();
        check_name(&name)?;
        let kind = r.u8()?;
        let mode = r.u32()?;
        let size = r.u64()?;
        let mtime_ns = r.u64()? as i64;
        let target = match kind {
            1 => Target::Object(r.hash()?),
            2 => Target::Tree(r.hash()?),
            3 => {
                let len = r.u32()? as usize;
                Target::Link(r.take(len)?.to_vec())
            }
            _ => return Err(DecodeError("unknown entry kind")),
        };
        let nx = r.u16()? as usize;
        let mut xattrs = Vec::with_capacity(nx);
        for _ in 0..nx {
            let l = r.u16()? as usize;
            let name = r.take(l)?.to_vec();
            let l = r.u32()? as usize;
            let value = r.take(l)?.to_vec();
            xattrs.push(Xattr { name, value });
        }
        Ok(Entry {
            name,
            mode,
            size,
            mtime_ns,
            target,
            xattrs,
        })
    }
}

fn check_name(name: &[u8]) -> Result<(), DecodeError> {
    if name.is_empty()
        || name == b"."
        || name == b".."
        || name.len() > u16::MAX as usize
        || name.iter().any(|&c| c == b'/' || c == 0)
    {
        return Err(DecodeError("invalid entry name"));
    }
    Ok(())
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub entries: Vec<Entry>,
}

/// A decoded node as the ledger's cache, a capture and a diff pass it
/// between them: one decode or build per node, shared, never copied entry
/// by entry (a copy of 100 entries is 200 allocations).
pub type SharedNode = std::sync::Arc<Node>;

/// Nodes that are in no ledger (yet): a capture's, read beside the ledger's.
pub type Overlay = std::collections::HashMap<crate::hash::Hash, SharedNode>;

const MAGIC: &[u8; 4] = b"RWT1";
const STORED_MAGIC: &[u8; 4] = b"RWTc";

const KIND_MASK: u8 = 0x03;
const SAME_MODE: u8 = 0x04;
const HAS_XATTRS: u8 = 0x08;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

pub(crate) fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

pub(crate) fn unzigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

#[derive(Debug, thiserror::Error)]
#[error("malformed tree node: {0}")]
pub struct DecodeError(&'static str);

impl Node {
    /// About how much memory the decoded node holds: what a cache of nodes
    /// is bounded by (a 5,000-entry directory is ~0.6 MiB; counting nodes
    /// let a server's cache grow by that per checkpoint, helper-85).
    pub fn approx_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<Entry>();
        self.entries
            .iter()
            .map(|e| {
                let target = match &e.target {
                    Target::Link(t) => t.len(),
                    _ => 0,
                };
                let xattrs: usize = e
                    .xattrs
                    .iter()
                    .map(|x| x.name.len() + x.value.len() + std::mem::size_of::<Xattr>())
                    .sum();
                per_entry + e.name.len() + target + xattrs
            })
            .sum::<usize>()
            + std::mem::size_of::<Node>()
    }

    /// The hash of the empty directory: the "before" of a first checkpoint.
    pub fn empty_hash() -> Hash {
        static EMPTY: std::sync::OnceLock<Hash> = std::sync::OnceLock::new();
        *EMPTY.get_or_init(|| Node::hash_of_encoding(&Node::default().encode()))
    }

    pub fn get(&self, name: &[u8]) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }

    pub fn encode(&self) -> Vec<u8> {
        Node::encode_entries(self.entries.iter())
    }

    /// Encode a node from sorted entries without building a `Node`.
    pub fn encode_entries<'a>(entries: impl ExactSizeIterator<Item = &'a Entry>) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + entries.len() * 80);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
        for e in entries {
            e.encode_into(&mut out);
        }
        out
    }

    /// The node's name: SHA-256 over a domain tag and the encoding, so a tree
    /// node can never collide with a file object of the same bytes.
    pub fn hash_of_encoding(encoded: &[u8]) -> Hash {
        let mut h = crate::hash::Hasher::default();
        h.update(b"rewind-tree\0");
        h.update(encoded);
        h.finish()
    }

    /// The compact form the ledger stores (module docs): shared name
    /// prefixes, varints, mtimes as deltas. About 70% of the canonical size
    /// for a directory of small files (the 32-byte hashes stay).
    pub fn encode_stored(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.entries.len() * 56);
        out.extend_from_slice(STORED_MAGIC);
        put_varint(&mut out, self.entries.len() as u64);
        let (mut name, mut mode, mut mtime): (&[u8], u32, i64) = (b"", 0, 0);
        for e in &self.entries {
            let shared = name.iter().zip(&e.name).take_while(|(a, b)| a == b).count();
            put_varint(&mut out, shared as u64);
            put_varint(&mut out, (e.name.len() - shared) as u64);
            out.extend_from_slice(&e.name[shared..]);
            let mut flags = match e.kind() {
                Kind::File => 1,
                Kind::Dir => 2,
                Kind::Symlink => 3,
            };
            if e.mode == mode {
                flags |= SAME_MODE;
            }
            if !e.xattrs.is_empty() {
                flags |= HAS_XATTRS;
            }
            out.push(flags);
            if e.mode != mode {
                put_varint(&mut out, e.mode.into());
            }
            put_varint(&mut out, e.size);
            put_varint(&mut out, zigzag(e.mtime_ns.wrapping_sub(mtime)));
            match &e.target {
                Target::Object(h) | Target::Tree(h) => out.extend_from_slice(&h.0),
                Target::Link(t) => {
                    put_varint(&mut out, t.len() as u64);
                    out.extend_from_slice(t);
                }
            }
            if !e.xattrs.is_empty() {
                put_varint(&mut out, e.xattrs.len() as u64);
                for x in &e.xattrs {
                    put_varint(&mut out, x.name.len() as u64);
                    out.extend_from_slice(&x.name);
                    put_varint(&mut out, x.value.len() as u64);
                    out.extend_from_slice(&x.value);
                }
            }
            (name, mode, mtime) = (e.name.as_slice(), e.mode, e.mtime_ns);
        }
        out
    }

    /// The stored form of a canonical encoding (what the ledger writes).
    pub fn stored_from_canonical(canonical: &[u8]) -> Result<Vec<u8>, DecodeError> {
        Ok(Node::decode(canonical)?.encode_stored())
    }

    /// The canonical encoding of a ledger row, which holds the compact
    /// stored form or (rows written before it) the canonical one. Checks
    /// only what a faithful translation needs (lengths that fit the
    /// canonical fields, known flags, no trailing bytes); the canonical
    /// bytes are then hashed and validated as always ([`Node::decode`]).
    pub fn canonical_from_stored(bytes: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
        if !bytes.starts_with(STORED_MAGIC) {
            return Ok(Cow::Borrowed(bytes));
        }
        let mut r = Reader { b: &bytes[4..] };
        let count = u32::try_from(r.varint()?).map_err(|_| DecodeError("too many entries"))?;
        // Canonical entries are ~20 bytes longer than stored ones.
        let mut out = Vec::with_capacity(8 + bytes.len() + 24 * (count as usize).min(1 << 16));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&count.to_be_bytes());
        let (mut name, mut mode, mut mtime) = (Vec::<u8>::new(), 0u32, 0i64);
        for _ in 0..count {
            let shared = r.len_at_most(name.len())?;
            let len = r.len_at_most(u16::MAX as usize - shared)?;
            name.truncate(shared);
            name.extend_from_slice(r.take(len)?);
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(&name);
            let flags = r.u8()?;
            if flags & !(KIND_MASK | SAME_MODE | HAS_XATTRS) != 0 || flags & KIND_MASK == 0 {
                return Err(DecodeError("unknown entry flags"));
            }
            out.push(flags & KIND_MASK);
            if flags & SAME_MODE == 0 {
                mode = u32::try_from(r.varint()?).map_err(|_| DecodeError("mode too large"))?;
            }
            out.extend_from_slice(&mode.to_be_bytes());
            out.extend_from_slice(&r.varint()?.to_be_bytes());
            mtime = mtime.wrapping_add(unzigzag(r.varint()?));
            out.extend_from_slice(&mtime.to_be_bytes());
            if flags & KIND_MASK == 3 {
                let len = r.len_at_most(u32::MAX as usize)?;
                out.extend_from_slice(&(len as u32).to_be_bytes());
                out.extend_from_slice(r.take(len)?);
            } else {
                out.extend_from_slice(r.take(32)?);
            }
            if flags & HAS_XATTRS == 0 {
                out.extend_from_slice(&0u16.to_be_bytes());
                continue;
            }
            let n = r.len_at_most(u16::MAX as usize)?;
            if n == 0 {
                return Err(DecodeError("bad xattr count"));
            }
            out.extend_from_slice(&(n as u16).to_be_bytes());
            for _ in 0..n {
                let l = r.len_at_most(u16::MAX as usize)?;
                out.extend_from_slice(&(l as u16).to_be_bytes());
                out.extend_from_slice(r.take(l)?);
                let l = r.len_at_most(u32::MAX as usize)?;
                out.extend_from_slice(&(l as u32).to_be_bytes());
                out.extend_from_slice(r.take(l)?);
            }
        }
        if !r.b.is_empty() {
            return Err(DecodeError("trailing bytes"));
        }
        Ok(Cow::Owned(out))
    }

    /// Decode and validate a ledger row (see [`Node::canonical_from_stored`]).
    pub fn decode_stored(bytes: &[u8]) -> Result<Node, DecodeError> {
        Node::decode(&Node::canonical_from_stored(bytes)?)
    }

    /// The name of a stored row's node: its canonical encoding's hash. A row
    /// that does not translate gets the hash of its raw bytes, which names
    /// no node it could claim to be (what `verify --deep` needs).
    pub fn hash_of_stored(bytes: &[u8]) -> Hash {
        match Node::canonical_from_stored(bytes) {
            Ok(c) => Node::hash_of_encoding(&c),
            Err(_) => Node::hash_of_encoding(bytes),
        }
    }

    /// Decode and validate: sorted unique names, valid kinds, no trailing
    /// bytes. A node that fails here is never applied to a workspace.
    pub fn decode(bytes: &[u8]) -> Result<Node, DecodeError> {
        let mut r = Reader { b: bytes };
        if r.take(4)? != MAGIC {
            return Err(DecodeError("bad magic"));
        }
        let count = r.u32()? as usize;
        let mut entries: Vec<Entry> = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            let e = Entry::decode_from(&mut r)?;
            if let Some(prev) = entries.last()
                && prev.name >= e.name
            {
                return Err(DecodeError("entries not sorted or duplicated"));
            }
            entries.push(e);
        }
        if !r.b.is_empty() {
            return Err(DecodeError("trailing bytes"));
        }
        Ok(Node { entries })
    }
}

/// A cursor over encoded bytes; every read fails cleanly on truncation.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes([self.u8()?, self.u8()?]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    /// An unsigned LEB128 varint of at most 10 bytes that fits a u64.
    pub(crate) fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut n = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err(DecodeError("varint overflows"));
            }
            n |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(DecodeError("varint overflows"))
    }

    /// A varint length no larger than `max`.
    pub(crate) fn len_at_most(&mut self, max: usize) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= max)
            .ok_or(DecodeError("length out of range"))
    }

    pub(crate) fn hash(&mut self) -> Result<Hash, DecodeError> {
        Hash::from_slice(self.take(32)?).ok_or(DecodeError("short hash"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Node {
        Node {
            entries: vec![
                Entry {
                    name: b"a".to_vec(),
                    mode: 0o644,
                    size: 3,
                    mtime_ns: -5,
                    target: Target::Object(Hash::of(b"x")),
                    xattrs: vec![Xattr {
                        name: b"user.k".to_vec(),
                        value: b"v".to_vec(),
                    }],
                },
                Entry {
                    name: b"b\n\xff".to_vec(),
                    mode: 0o755,
                    size: 0,
                    mtime_ns: 7,
                    target: Target::Tree(Hash::of(b"y")),
                    xattrs: vec![],
                },
                Entry {
                    name: b"c".to_vec(),
                    mode: 0o777,
                    size: 4,
                    mtime_ns: 1,
                    target: Target::Link(b"../x".to_vec()),
                    xattrs: vec![],
                },
            ],
        }
    }

    #[test]
    fn encoding_round_trips_exactly() {
        let n = sample();
        assert_eq!(Node::decode(&n.encode()).unwrap(), n);
    }

    /// `decode` refuses what `encode` wrote of a node with unsorted,
    /// duplicated or dot-dot names.
    fn assert_rejects_bad_names(
        encode: fn(&Node) -> Vec<u8>,
        decode: fn(&[u8]) -> Result<Node, DecodeError>,
    ) {
        let mut n = sample();
        n.entries.swap(0, 1);
        assert!(decode(&encode(&n)).is_err(), "unsorted");
        let mut n = sample();
        n.entries[1].name = b"a".to_vec();
        assert!(decode(&encode(&n)).is_err(), "duplicated");
        let mut n = sample();
        n.entries[0].name = b"..".to_vec();
        assert!(decode(&encode(&n)).is_err(), "dot-dot");
    }

    #[test]
    fn decode_rejects_unsorted_duplicate_and_dotdot_names() {
        assert_rejects_bad_names(Node::encode, Node::decode);
        let mut bytes = sample().encode();
        bytes.push(0);
        assert!(Node::decode(&bytes).is_err());
    }

    /// A directory like benchmark tree T1's: 100 files of 1–4 KiB with
    /// sequential names and close mtimes.
    fn t1_dir() -> Node {
        Node {
            entries: (0..100u64)
                .map(|i| Entry {
                    name: format!("f{:06}.bin", i * 100 + 42).into_bytes(),
                    mode: 0o100644,
                    size: 1024 + (i * 2654435761) % 3073,
                    mtime_ns: 1_764_000_000_000_000_000 + (i as i64) * 9_876_543,
                    target: Target::Object(Hash::of(&i.to_be_bytes())),
                    xattrs: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn stored_form_round_trips_to_the_same_canonical_bytes() {
        let mut odd = sample();
        odd.entries[0].mtime_ns = i64::MIN;
        odd.entries[1].mtime_ns = i64::MAX;
        odd.entries[2].mode = u32::MAX;
        odd.entries[2].size = u64::MAX;
        for n in [sample(), odd, t1_dir(), Node::default()] {
            let stored = n.encode_stored();
            assert!(stored.starts_with(STORED_MAGIC));
            let back = Node::decode_stored(&stored).unwrap();
            assert_eq!(back, n);
            assert_eq!(back.encode(), n.encode());
            assert_eq!(
                Node::hash_of_stored(&stored),
                Node::hash_of_encoding(&n.encode())
            );
            assert_eq!(Node::stored_from_canonical(&n.encode()).unwrap(), stored);
        }
    }

    /// Random nodes (shared prefixes, every kind, xattrs, extreme
    /// integers): the stored form always translates back to the exact
    /// canonical bytes.
    #[test]
    fn random_nodes_round_trip_through_the_stored_form() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let n = next() % 40;
            let mut names: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = 1 + next() % if next() % 8 == 0 { 300 } else { 6 };
                    (0..len)
                        .map(|_| b"ab.\xff"[(next() % 4) as usize])
                        .collect()
                })
                .collect();
            names.sort();
            names.dedup();
            names.retain(|n| n != b"." && n != b"..");
            let pick = |v: u64, r: u64| match r % 4 {
                0 => v,
                1 => v % 1000,
                2 => u64::MAX - v % 3,
                _ => 0,
            };
            let entries = names
                .into_iter()
                .map(|name| Entry {
                    name,
                    mode: pick(next(), next()) as u32,
                    size: pick(next(), next()),
                    mtime_ns: pick(next(), next()) as i64,
                    target: match next() % 3 {
                        0 => Target::Object(Hash::of(&next().to_le_bytes())),
                        1 => Target::Tree(Hash::of(&next().to_le_bytes())),
                        _ => Target::Link(vec![b'x'; (next() % 200) as usize]),
                    },
                    xattrs: (0..next() % 3)
                        .map(|i| Xattr {
                            name: format!("user.{i}").into_bytes(),
                            value: vec![i as u8; (next() % 70) as usize],
                        })
                        .collect(),
                })
                .collect();
            let node = Node { entries };
            let stored = node.encode_stored();
            assert_eq!(
                Node::canonical_from_stored(&stored).unwrap().as_ref(),
                node.encode().as_slice()
            );
            assert_eq!(Node::decode_stored(&stored).unwrap(), node);
        }
    }

    #[test]
    fn canonical_rows_of_older_ledgers_still_decode_and_hash() {
        let n = t1_dir();
        let canonical = n.encode();
        assert_eq!(Node::decode_stored(&canonical).unwrap(), n);
        assert_eq!(
            Node::hash_of_stored(&canonical),
            Node::hash_of_encoding(&canonical)
        );
    }

    /// The ledger's metadata per checkpoint is mostly changed directories'
    /// nodes (D49): a T1 directory must store in at most 72% of its
    /// canonical size: one 4 KiB page and one overflow page (D165); in a
    /// ledger made before D165, three share a 16 KiB page.
    #[test]
    fn a_t1_directory_stores_in_under_three_quarters_of_its_canonical_size() {
        let n = t1_dir();
        let (canonical, stored) = (n.encode().len(), n.encode_stored().len());
        assert!(
            stored * 100 <= canonical * 72,
            "stored {stored} bytes, canonical {canonical}"
        );
        assert!(stored * 3 < 16384 - 100, "stored {stored} bytes");
    }

    #[test]
    fn every_truncation_and_bad_stored_form_is_rejected() {
        for n in [sample(), t1_dir()] {
            let bytes = n.encode_stored();
            for cut in 4..bytes.len() {
                assert!(Node::decode_stored(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(Node::decode_stored(&long).is_err());
        }
        assert_rejects_bad_names(Node::encode_stored, Node::decode_stored);
        // Unknown flags, a shared prefix longer than the previous name, and
        // a varint that does not fit 64 bits.
        let one = Node {
            entries: vec![sample().entries[2].clone()],
        };
        let stored = one.encode_stored();
        // magic, count, shared, len, "c", flags
        assert_eq!(stored[5..8], [0, 1, b'c']);
        let mut bad = stored.clone();
        bad[8] |= 0x40;
        assert!(Node::decode_stored(&bad).is_err());
        let mut bad = stored.clone();
        bad[5] = 1;
        assert!(Node::decode_stored(&bad).is_err());
        let mut bad = STORED_MAGIC.to_vec();
        bad.extend_from_slice(&[0xff; 10]);
        bad.push(0x01);
        assert!(Node::decode_stored(&bad).is_err());
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Node::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
