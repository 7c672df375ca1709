//! An answer as the cache keeps it: only a complete, successful one (a cut stream, an error, a
//! refusal and a guardrail's block are never kept — the caller only offers what ended well),
//! whole or as the stream's events in order (their timing folded away), with the model that
//! served it and the usage it was billed for, and when it was made and stops being served.
//! Stored in a compact binary form (a version byte, then the fields; see [`Entry::encode`]).

use crate::base::codec::{put_str, put_varint, Reader};
use crate::base::usage::Usage;

/// Version of the stored form.
const STORED_V1: u8 = 1;

/// The answer's body: whole, or a stream's events (`data: …\n\n` each), kept one after
/// another in one buffer with where each ends (a hit of a long stream is one copy, not one
/// allocation per event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Whole(Vec<u8>),
    Events { bytes: Vec<u8>, ends: Vec<usize> },
}

impl Body {
    /// A stream's body from its events.
    pub fn events_of<'a>(events: impl IntoIterator<Item = &'a [u8]>) -> Body {
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        for e in events {
            bytes.extend_from_slice(e);
            ends.push(bytes.len());
        }
        Body::Events { bytes, ends }
    }

    /// Its bytes, all of them.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Body::Whole(b) | Body::Events { bytes: b, .. } => b,
        }
    }

    /// A stream's events in order (a whole answer: itself).
    pub fn events(&self) -> Vec<&[u8]> {
        match self {
            Body::Whole(b) => vec![b.as_slice()],
            Body::Events { bytes, ends } => {
                let mut start = 0;
                ends.iter().filter_map(|&end| bytes.get(start..end).inspect(|_| start = end)).collect()
            }
        }
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The answer's content type (`application/json`, `text/event-stream`).
    pub content_type: String,
    /// The model that served it (its client's name).
    pub model: String,
    /// What the original call was billed for.
    pub usage: Usage,
    pub created_ms: u64,
    /// When it stops being served (unix milliseconds).
    pub expires_ms: u64,
    pub body: Body,
}

impl Entry {
    /// Its stored form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 64);
        out.push(STORED_V1);
        put_str(&mut out, Some(&self.content_type));
        put_str(&mut out, Some(&self.model));
        for n in [self.usage.input, self.usage.cached, self.usage.cache_write, self.usage.output, self.created_ms, self.expires_ms] {
            put_varint(&mut out, n);
        }
        match &self.body {
            Body::Whole(bytes) => {
                out.push(b'w');
                put_bytes(&mut out, bytes);
            }
            Body::Events { .. } => {
                let events = self.body.events();
                out.push(b'e');
                put_varint(&mut out, events.len() as u64);
                for event in events {
                    put_bytes(&mut out, event);
                }
            }
        }
        out
    }

    /// An entry from its stored form; None if it is not one (or not whole).
    pub fn decode(stored: &[u8]) -> Option<Entry> {
        let (&version, rest) = stored.split_first()?;
        if version != STORED_V1 {
            return None;
        }
        let mut r = Reader(rest);
        let (content_type, model) = (r.string()??, r.string()??);
        let usage = Usage { input: r.varint()?, cached: r.varint()?, cache_write: r.varint()?, output: r.varint()? };
        let (created_ms, expires_ms) = (r.varint()?, r.varint()?);
        let body = match r.byte()? {
            b'w' => Body::Whole(bytes(&mut r)?),
            b'e' => {
                let n = r.varint()?;
                // Each event takes at least a byte: a count beyond what is left is not an entry.
                if n > r.0.len() as u64 {
                    return None;
                }
                let (mut all, mut ends) = (Vec::with_capacity(r.0.len()), Vec::with_capacity(usize::try_from(n).ok()?));
                for _ in 0..n {
                    let len = usize::try_from(r.varint()?).ok()?;
                    let (taken, rest) = (r.0.get(..len)?, r.0.get(len..)?);
                    r.0 = rest;
                    all.extend_from_slice(taken);
                    ends.push(all.len());
                }
                Body::Events { bytes: all, ends }
            }
            _ => return None,
        };
        r.0.is_empty().then_some(Entry { content_type, model, usage, created_ms, expires_ms, body })
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn bytes(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let len = usize::try_from(r.varint()?).ok()?;
    let (taken, rest) = (r.0.get(..len)?, r.0.get(len..)?);
    r.0 = rest;
    Some(taken.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: Body) -> Entry {
        Entry {
            content_type: "text/event-stream".into(),
            model: "alpha-5.5".into(),
            usage: Usage { input: 120, cached: 30, cache_write: 0, output: 17 },
            created_ms: 1_795_000_000_000,
            expires_ms: 1_795_000_060_000,
            body,
        }
    }

    #[test]
    fn an_entry_reads_back_whole_or_as_events_and_nothing_else_reads_as_one() {
        for e in [entry(Body::Whole(br#"{"id":"x"}"#.to_vec())), entry(Body::events_of([&b"data: {}\n\n"[..], b"data: [DONE]\n\n"]))] {
            let stored = e.encode();
            assert_eq!(Entry::decode(&stored), Some(e.clone()));
            // Cut anywhere, or with a byte more: not an entry.
            for cut in 0..stored.len() {
                assert_eq!(Entry::decode(&stored[..cut]), None, "cut at {cut}");
            }
            let mut longer = stored.clone();
            longer.push(0);
            assert_eq!(Entry::decode(&longer), None);
        }
        let two = Body::events_of([&b"ab"[..], b"c"]);
        assert_eq!((two.len(), two.events()), (3, vec![&b"ab"[..], b"c"]));
        // An event count no body could hold.
        let mut forged = entry(Body::events_of([])).encode();
        forged.pop();
        put_varint(&mut forged, u64::MAX);
        assert_eq!(Entry::decode(&forged), None);
    }
}
