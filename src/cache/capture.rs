//! An answer kept as it goes to the client, to be stored once it ended well: whole, or split
//! into the stream's events (an event ends at a blank line, `\n\n` or `\r\n\r\n`), at most
//! `max` bytes (past it nothing more is kept and the answer is not stored). The bytes kept are
//! the caller's to count against the process's budget of bytes held for clients
//! ([`Capture::held`]). Pure.

use super::entry::Body;

pub struct Capture {
    max: usize,
    sse: bool,
    /// The whole answer, or the stream's bytes not yet split into events.
    pending: Vec<u8>,
    events: Vec<Vec<u8>>,
    held: usize,
    over: bool,
}

impl Capture {
    pub fn new(sse: bool, max: usize) -> Capture {
        Capture { max, sse, pending: Vec::new(), events: Vec::new(), held: 0, over: false }
    }

    /// Keep `chunk` (nothing once past the bound).
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.over {
            return;
        }
        if self.held + chunk.len() > self.max {
            self.over = true;
            self.pending = Vec::new();
            self.events = Vec::new();
            self.held = 0;
            return;
        }
        self.held += chunk.len();
        self.pending.extend_from_slice(chunk);
        if self.sse {
            while let Some(end) = event_end(&self.pending) {
                let rest = self.pending.split_off(end);
                self.events.push(std::mem::replace(&mut self.pending, rest));
            }
        }
    }

    /// Bytes kept so far.
    pub fn held(&self) -> usize {
        self.held
    }

    /// What to store of an answer that ended well: None past the bound, or for a stream that
    /// ends inside an event, or is empty.
    pub fn finish(self) -> Option<Body> {
        if self.over {
            return None;
        }
        match self.sse {
            false if !self.pending.is_empty() => Some(Body::Whole(self.pending)),
            true if self.pending.iter().all(u8::is_ascii_whitespace) && !self.events.is_empty() => Some(Body::Events(self.events)),
            _ => None,
        }
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
                Some(Body::Events(vec![
                    b"data: {\"a\":1}\n\n".to_vec(),
                    b"data: {\"b\":2}\r\n\r\n".to_vec(),
                    b"event: x\ndata: [DONE]\n\n".to_vec()
                ])),
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
