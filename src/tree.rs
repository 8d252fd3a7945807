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
        if name.is_empty()
            || name == b"."
            || name == b".."
            || name.iter().any(|&c| c == b'/' || c == 0)
        {
            return Err(DecodeError("invalid entry name"));
        }
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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub entries: Vec<Entry>,
}

const MAGIC: &[u8; 4] = b"RWT1";

#[derive(Debug, thiserror::Error)]
#[error("malformed tree node: {0}")]
pub struct DecodeError(&'static str);

impl Node {
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

    #[test]
    fn decode_rejects_unsorted_duplicate_and_dotdot_names() {
        let mut n = sample();
        n.entries.swap(0, 1);
        assert!(Node::decode(&n.encode()).is_err());
        let mut n = sample();
        n.entries[1].name = b"a".to_vec();
        assert!(Node::decode(&n.encode()).is_err());
        let mut n = sample();
        n.entries[0].name = b"..".to_vec();
        assert!(Node::decode(&n.encode()).is_err());
        let mut bytes = sample().encode();
        bytes.push(0);
        assert!(Node::decode(&bytes).is_err());
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Node::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
