//! An answer kept as it goes to the client, to be stored once it ended well: whole, or split
//! into the stream's events (an event ends at a blank line, `\n\n` or `\r\n\r\n`), at most
//! `max` bytes (past it nothing more is kept and the answer is not stored). The bytes kept are
//! the caller's to count against the process's budget of bytes held for clients
//! ([`Capture::held`]). Pure.

use super::entry::Body;

pub struct Capture {
    max: usize,
    sse: bool,
    /// Everything kept, in order.
    bytes: Vec<u8>,
    /// Where each whole event ends (a stream).
    ends: Vec<usize>,
    over: bool,
}

impl Capture {
    pub fn new(sse: bool, max: usize) -> Capture {
        Capture { max, sse, bytes: Vec::new(), ends: Vec::new(), over: false }
    }

    /// Keep `chunk` (nothing once past the bound).
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.over {
            return;
        }
        if self.bytes.len() + chunk.len() > self.max {
            self.over = true;
            self.bytes = Vec::new();
            self.ends = Vec::new();
            return;
        }
        self.bytes.extend_from_slice(chunk);
        if self.sse {
            // Every whole event since the last found (its boundary may straddle chunks).
            loop {
                let from = self.ends.last().copied().unwrap_or(0);
                match event_end(&self.bytes[from..]) {
                    Some(end) => self.ends.push(from + end),
                    None => break,
                }
            }
        }
    }

    /// Bytes kept so far.
    pub fn held(&self) -> usize {
        self.bytes.len()
    }

    /// What to store of an answer that ended well: None past the bound, or for a stream that
    /// ends inside an event, or is empty.
    pub fn finish(mut self) -> Option<Body> {
        if self.over || self.bytes.is_empty() {
            return None;
        }
        if !self.sse {
            return Some(Body::Whole(self.bytes));
        }
        let last = *self.ends.last()?;
        if !self.bytes[last..].iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        self.bytes.truncate(last);
        Some(Body::Events { bytes: self.bytes, ends: self.ends })
    }
}

/// Where the first event of `bytes` ends (after its blank line), if it is whole.
fn event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(bytes, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::find(bytes, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_kept_as_its_events_however_it_was_cut_into_chunks() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\nevent: x\ndata: [DONE]\n\n";
        for size in 1..stream.len() {
            let mut c = Capture::new(true, 1 << 10);
            for chunk in stream.chunks(size) {
                c.feed(chunk);
            }
            assert_eq!(c.held(), stream.len());
            assert_eq!(
                c.finish(),
                Some(Body::events_of([&b"data: {\"a\":1}\n\n"[..], b"data: {\"b\":2}\r\n\r\n", b"event: x\ndata: [DONE]\n\n"])),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn a_cut_stream_an_oversized_answer_and_nothing_are_not_kept() {
        let mut cut = Capture::new(true, 1 << 10);
        cut.feed(b"data: {}\n\ndata: {\"par");
        assert_eq!(cut.finish(), None, "it ended inside an event");
        let mut big = Capture::new(false, 8);
        big.feed(b"{\"id\":");
        big.feed(b"\"long\"}");
        assert_eq!((big.held(), big.finish()), (0, None), "past the bound nothing is held");
        assert_eq!(Capture::new(false, 8).finish(), None);
        assert_eq!(Capture::new(true, 8).finish(), None);
        let mut whole = Capture::new(false, 64);
        whole.feed(b"{\"id\":\"x\"}");
        assert_eq!(whole.finish(), Some(Body::Whole(b"{\"id\":\"x\"}".to_vec())));
    }
}
