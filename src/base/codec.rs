//! The compact binary form of what every request writes to the embedded store (its usage
//! record, its request-log entry): numbers as LEB128 varints (signed ones zigzagged), strings
//! and options as a length (0: none, n + 1: n bytes). A few hundred instructions per value
//! where JSON took thousands. Each format's field order is in its own module; reading is
//! total: a short or malformed value reads as `None`, never a panic.

use std::borrow::Cow;

pub fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A signed number, zigzagged (small magnitudes of either sign stay short).
pub fn put_signed(out: &mut Vec<u8>, n: i64) {
    put_varint(out, ((n << 1) ^ (n >> 63)) as u64);
}

pub fn put_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            put_varint(out, s.len() as u64 + 1);
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// A key's stored hash (SHA-256, 64 hex digits) as bytes; None if it is not one.
pub fn parse_key_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Reads what the `put_*` functions wrote, in the same order.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first()?;
            self.0 = rest;
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(n);
            }
        }
        None
    }

    pub fn signed(&mut self) -> Option<i64> {
        let zz = self.varint()?;
        Some(((zz >> 1) as i64) ^ -((zz & 1) as i64))
    }

    pub fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// Step over an optional string without reading it.
    pub fn skip_str(&mut self) -> Option<()> {
        let len = self.varint()?;
        let len = usize::try_from(len.saturating_sub(1)).ok()?;
        self.0 = self.0.get(len..)?;
        Some(())
    }

    /// An optional string (invalid UTF-8 is replaced, not refused: a stored value is read).
    pub fn string(&mut self) -> Option<Option<String>> {
        Some(self.text()?.map(Cow::into_owned))
    }

    /// An optional string, borrowed from the value where it is valid UTF-8 (checked by the
    /// standard library's fast path; `from_utf8_lossy` walked it in chunks), else replaced.
    pub fn text(&mut self) -> Option<Option<Cow<'a, str>>> {
        let len = self.varint()?;
        if len == 0 {
            return Some(None);
        }
        let len = usize::try_from(len - 1).ok()?;
        if self.0.len() < len {
            return None;
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(Some(match std::str::from_utf8(s) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => String::from_utf8_lossy(s),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_and_a_cut_value_reads_as_none() {
        let mut out = Vec::new();
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_varint(&mut out, n);
        }
        for n in [0i64, -1, 1, i64::MIN, i64::MAX] {
            put_signed(&mut out, n);
        }
        put_str(&mut out, None);
        put_str(&mut out, Some(""));
        put_str(&mut out, Some("é-model"));
        let mut r = Reader(&out);
        for n in [0u64, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(r.varint(), Some(n));
        }
        for n in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(r.signed(), Some(n));
        }
        assert_eq!(r.string(), Some(None));
        assert_eq!(r.string(), Some(Some(String::new())));
        assert_eq!(r.string(), Some(Some("é-model".into())));
        assert!(r.0.is_empty());
        // Cut anywhere inside the last string: it does not read.
        let mut cut = Reader(&out[out.len() - 3..]);
        assert_eq!(cut.string(), None);
        assert_eq!(Reader(&[0x80]).varint(), None);
    }

    #[test]
    fn a_valid_string_is_borrowed_and_invalid_utf8_is_replaced() {
        let mut out = Vec::new();
        put_str(&mut out, Some("ok"));
        out.extend_from_slice(&[3, b'a', 0xff]);
        let mut r = Reader(&out);
        assert!(matches!(r.text(), Some(Some(Cow::Borrowed("ok")))));
        assert_eq!((Reader(&out).skip_str(), Reader(&out[..2]).skip_str(), Reader(&[0]).skip_str()), (Some(()), None, Some(())));
        assert_eq!(r.string(), Some(Some("a\u{fffd}".into())));
    }
}
