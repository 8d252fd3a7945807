//! Checkpoint ids: 8 characters of lowercase Crockford base32 (no i, l, o,
//! u), derived from a hash so they are short, typable and unguessable enough
//! to never collide in practice; a collision is retried with a nonce.

use crate::hash::Hash;

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
pub const ID_LEN: usize = 8;

pub fn make_id(workspace_id: &str, seq: i64, root: &Hash, nonce: u64) -> String {
    let mut seed = Vec::new();
    seed.extend_from_slice(workspace_id.as_bytes());
    seed.extend_from_slice(&seq.to_be_bytes());
    seed.extend_from_slice(&root.0);
    seed.extend_from_slice(&nonce.to_be_bytes());
    add_time_and_pid(&mut seed);
    let h = Hash::of(&seed);
    encode(&h.0)[..ID_LEN].to_string()
}

/// A fresh workspace id (26 characters).
pub fn make_workspace_id() -> String {
    let mut seed = Vec::new();
    add_time_and_pid(&mut seed);
    if let Ok(cwd) = std::env::current_dir() {
        seed.extend_from_slice(cwd.as_os_str().as_encoded_bytes());
    }
    encode(&Hash::of(&seed).0)[..26].to_string()
}

/// Make two ids made in the same instant by different processes differ.
fn add_time_and_pid(seed: &mut Vec<u8>) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    seed.extend_from_slice(&nanos.to_be_bytes());
    seed.extend_from_slice(&std::process::id().to_be_bytes());
}

fn encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    out
}

/// Whether `s` is a whole checkpoint id: ids name snapshot directories,
/// and one forged in a user's ledger as `lnk/ID` or `../x` led root's
/// rewind to another user's snapshot (helper-20, D160).
pub fn is_id(s: &str) -> bool {
    s.len() == ID_LEN && looks_like_id_prefix(s)
}

/// Could `s` be (a prefix of) an id? Used to decide between id and label.
pub fn looks_like_id_prefix(s: &str) -> bool {
    !s.is_empty() && s.len() <= ID_LEN && s.bytes().all(|b| ALPHABET.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_id_names_a_snapshot() {
        assert!(is_id("k3mz8qpa"));
        for bad in [
            "k3mz8qp",
            "k3mz8qpaa",
            "../k3mz8",
            "lnk/k3mz",
            "K3MZ8QPA",
            "k3mz8qp/",
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn ids_are_short_and_typable() {
        let id = super::make_id("ws", 1, &crate::hash::Hash::of(b"x"), 0);
        assert_eq!(id.len(), 8);
        assert!(super::looks_like_id_prefix(&id));
        assert!(!super::looks_like_id_prefix("HEAD"));
    }
}
