//! The little-endian encoding both local sockets speak: the daemon's
//! control socket and the command server's. A value is fixed-width; a
//! byte string is `[len u32][bytes]`; a list is `[n u32]` strings.

/// Appends `b` as `[len u32][bytes]`.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends `[n u32]` and each item as [`put_bytes`] does.
pub fn put_list<'a>(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = &'a Vec<u8>>) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for i in items {
        put_bytes(out, i);
    }
}

/// Reads what the `put_*` functions wrote; `None` when the input ends
/// early (a truncated or foreign message), never a panic.
pub struct Cursor<'a>(pub &'a [u8]);

impl<'a> Cursor<'a> {
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(h)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    pub fn list(&mut self) -> Option<Vec<Vec<u8>>> {
        let n = self.u32()?;
        (0..n).map(|_| self.bytes().map(<[u8]>::to_vec)).collect()
    }

    /// Whether everything was read: a message with bytes left over is
    /// not the one its reader expects.
    pub fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_put_reads_back_and_a_short_input_is_none() {
        let mut out = Vec::new();
        put_bytes(&mut out, b"abc");
        put_list(&mut out, [b"x".to_vec(), Vec::new()].iter());
        out.extend_from_slice(&7u64.to_le_bytes());
        let mut c = Cursor(&out);
        assert_eq!(c.bytes(), Some(&b"abc"[..]));
        assert_eq!(c.list(), Some(vec![b"x".to_vec(), Vec::new()]));
        assert_eq!(c.u64(), Some(7));
        assert!(c.is_done());
        for cut in 0..out.len() {
            let mut c = Cursor(&out[..cut]);
            let whole = c.bytes().is_some() && c.list().is_some() && c.u64().is_some();
            assert!(!whole, "a message cut at {cut} read as whole");
        }
    }
}
