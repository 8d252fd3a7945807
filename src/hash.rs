//! SHA-256 digests: object names, tree node names, plan fingerprints.

use std::fmt;

use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub fn of(bytes: &[u8]) -> Hash {
        Hash(Sha256::digest(bytes).into())
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Hash> {
        Some(Hash(bytes.try_into().ok()?))
    }

    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<Hash> {
        Hash::from_slice(&unhex(s)?)
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", &self.to_hex()[..12])
    }
}

/// Incremental hashing, for content streamed from a file.
#[derive(Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Hash {
        Hash(self.0.finalize().into())
    }
}

/// SHA-256 whose state can be taken at a 64-byte boundary and resumed
/// from there: a big file's digest after an append is computed from the
/// state saved at its old end, not from its first byte again (D314). The
/// digest is the standard one (`sha256sum` agrees).
#[derive(Clone)]
pub struct ResumableHasher {
    state: [u32; 8],
    /// Bytes taken so far.
    len: u64,
    buf: [u8; 64],
    filled: usize,
}

/// SHA-256's state after the first `offset` bytes of some content
/// (`offset` a multiple of 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Midstate {
    pub offset: u64,
    pub state: [u32; 8],
}

const SHA256_H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

impl Default for ResumableHasher {
    fn default() -> Self {
        ResumableHasher {
            state: SHA256_H0,
            len: 0,
            buf: [0; 64],
            filled: 0,
        }
    }
}

impl ResumableHasher {
    /// Go on from `m`: the next byte taken is content byte `m.offset`.
    pub fn resume(m: &Midstate) -> Self {
        ResumableHasher {
            state: m.state,
            len: m.offset,
            ..Self::default()
        }
    }

    /// Bytes taken so far (resumed ones included).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The state here, when at a 64-byte boundary.
    pub fn midstate(&self) -> Option<Midstate> {
        (self.filled == 0).then_some(Midstate {
            offset: self.len,
            state: self.state,
        })
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.filled > 0 {
            let take = (64 - self.filled).min(data.len());
            self.buf[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled < 64 {
                return;
            }
            let block = self.buf;
            compress(&mut self.state, &block);
            self.filled = 0;
        }
        let whole = data.len() / 64 * 64;
        compress(&mut self.state, &data[..whole]);
        let rest = &data[whole..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }

    pub fn finish(mut self) -> Hash {
        let bits = self.len.wrapping_mul(8);
        let mut tail = [0u8; 128];
        tail[..self.filled].copy_from_slice(&self.buf[..self.filled]);
        tail[self.filled] = 0x80;
        let n = if self.filled < 56 { 64 } else { 128 };
        tail[n - 8..n].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &tail[..n]);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        Hash(out)
    }
}

/// SHA-256's compression over whole 64-byte blocks.
fn compress(state: &mut [u32; 8], blocks: &[u8]) {
    use sha2::digest::generic_array::GenericArray;
    use sha2::digest::typenum::U64;
    debug_assert_eq!(blocks.len() % 64, 0);
    // SAFETY: `GenericArray<u8, U64>` is a `[u8; 64]` (size 64, alignment
    // 1), and `blocks` holds `blocks.len() / 64` of them back to back.
    let blocks: &[GenericArray<u8, U64>] =
        unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast(), blocks.len() / 64) };
    sha2::compress256(state, blocks);
}

/// Lowercase hex of arbitrary bytes.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    s.as_bytes()
        .chunks(2)
        .map(|c| Some(((c[0] as char).to_digit(16)? * 16 + (c[1] as char).to_digit(16)?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resumable digest is SHA-256's, whatever the lengths fed, and a
    /// state taken at a boundary and resumed gives the same digest.
    #[test]
    fn a_resumed_digest_is_sha256_of_the_whole() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 4096, 5000] {
            let whole = &data[..len];
            let want = Hash::of(whole);
            for split in [1usize, 3, 64, 100, 4096] {
                let mut h = ResumableHasher::default();
                for piece in whole.chunks(split) {
                    h.update(piece);
                }
                assert_eq!(h.finish(), want, "len {len} in pieces of {split}");
            }
            for at in (0..=len).step_by(64) {
                let mut h = ResumableHasher::default();
                h.update(&whole[..at]);
                let m = h.midstate().expect("at a boundary");
                assert_eq!(m.offset, at as u64);
                let mut r = ResumableHasher::resume(&m);
                r.update(&whole[at..]);
                assert_eq!(r.finish(), want, "len {len} resumed at {at}");
            }
        }
        let mut h = ResumableHasher::default();
        h.update(b"abc");
        assert_eq!(h.midstate(), None);
    }
}
