//! An answer as the cache keeps it: only a complete, successful one (a cut stream, an error, a
//! refusal and a guardrail's block are never kept — the caller only offers what ended well),
//! whole or as the stream's events in order (their timing folded away), with the model that
//! served it and the usage it was billed for, and when it was made and stops being served.
//! Stored in a compact binary form (a version byte, then the fields; see [`Entry::encode`]).

use crate::base::codec::{put_str, put_varint, Reader};
use crate::base::usage::Usage;

/// Version of the stored form.
const STORED_V1: u8 = 1;

/// The answer's body: whole, or a stream's events (each one event's bytes, `data: …\n\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Whole(Vec<u8>),
    Events(Vec<Vec<u8>>),
}

impl Body {
    /// Bytes held.
    pub fn len(&self) -> usize {
        match self {
            Body::Whole(b) => b.len(),
            Body::Events(events) => events.iter().map(Vec::len).sum(),
        }
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
            Body::Events(events) => {
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
                Body::Events((0..n).map(|_| bytes(&mut r)).collect::<Option<_>>()?)
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
        for e in [
            entry(Body::Whole(br#"{"id":"x"}"#.to_vec())),
            entry(Body::Events(vec![b"data: {}\n\n".to_vec(), b"data: [DONE]\n\n".to_vec()])),
        ] {
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
        assert_eq!(entry(Body::Events(vec![b"ab".to_vec(), b"c".to_vec()])).body.len(), 3);
        // An event count no body could hold.
        let mut forged = entry(Body::Events(Vec::new())).encode();
        forged.pop();
        put_varint(&mut forged, u64::MAX);
        assert_eq!(Entry::decode(&forged), None);
    }
}
