//! Server-sent events, both ways: an incremental reader of an upstream's event stream (any cut
//! of its bytes gives the same events) and the writer of a client's.

/// One event: its `event:` name, if any, and its `data:` lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub name: Option<String>,
    pub data: String,
}

pub use crate::config::listen::DEFAULT_MAX_EVENT_BYTES;

/// Reads events from chunks as they come.
#[derive(Debug)]
pub struct SseReader {
    /// The most bytes of one event held (see [`DEFAULT_MAX_EVENT_BYTES`]).
    max_event: usize,
    line: Vec<u8>,
    /// The last chunk ended with CR: an LF opening the next one ends nothing.
    after_cr: bool,
    name: Option<String>,
    data: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineTooLong;

impl Default for SseReader {
    fn default() -> Self {
        SseReader::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseReader {
    /// A reader that holds at most `max_event` bytes of one event.
    pub fn with_limit(max_event: usize) -> Self {
        SseReader { max_event, line: Vec::new(), after_cr: false, name: None, data: None }
    }

    /// Feed a chunk; complete events are pushed to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), LineTooLong> {
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(at) = memchr::memchr2(b'\n', b'\r', rest) {
            self.line.extend_from_slice(&rest[..at]);
            let line = std::mem::take(&mut self.line);
            self.line(&line, out);
            if rest[at] == b'\r' {
                match rest.get(at + 1) {
                    Some(b'\n') => rest = &rest[at + 2..],
                    Some(_) => rest = &rest[at + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[at + 1..];
            }
        }
        self.line.extend_from_slice(rest);
        // An event without its closing blank line grows by its data lines: bounded together.
        if self.line.len() + self.data.as_ref().map_or(0, String::len) > self.max_event {
            return Err(LineTooLong);
        }
        Ok(())
    }

    /// The stream ended: an event not closed by a blank line still counts.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line(&line, out);
        }
        self.dispatch(out);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.name = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let name = self.name.take();
        if let Some(data) = self.data.take() {
            out.push(SseEvent { name, data });
        }
    }
}

/// Append one event as a client reads it.
pub fn write(out: &mut Vec<u8>, name: Option<&str>, data: &str) {
    open(out, name);
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Append one event whose data is `value`, serialized in place.
pub fn write_json(out: &mut Vec<u8>, name: Option<&str>, value: &serde_json::Value) {
    open(out, name);
    serialized_into(out, value);
    out.extend_from_slice(b"\n\n");
}

fn open(out: &mut Vec<u8>, name: Option<&str>) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
}

/// Serialize `value` at the end of `out` (nothing is written if it somehow does not).
pub fn serialized_into(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    let mark = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(mark);
    }
}

/// Write `s` as a JSON string (quoted, escaped) at the end of `out`.
pub fn string_into(out: &mut Vec<u8>, s: &str) {
    // Writing into a `Vec` does not fail, nor does a string serialize with an error.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Write `n` as a JSON number at the end of `out`.
pub fn number_into(out: &mut Vec<u8>, n: u64) {
    let _ = serde_json::to_writer(&mut *out, &n);
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"event: a\ndata: {\"x\":1}\n\n: comment\r\ndata: one\r\ndata: two\r\n\r\ndata: [DONE]\n\n";

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut r = SseReader::default();
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, &mut out).expect("short lines");
        }
        r.finish(&mut out);
        out
    }

    #[test]
    fn events_are_the_same_at_every_cut_of_the_bytes() {
        let whole = all(&[STREAM]);
        assert_eq!(
            whole,
            vec![
                SseEvent { name: Some("a".into()), data: "{\"x\":1}".into() },
                SseEvent { name: None, data: "one\ntwo".into() },
                SseEvent { name: None, data: "[DONE]".into() },
            ]
        );
        for i in 0..STREAM.len() {
            for j in i..STREAM.len() {
                assert_eq!(all(&[&STREAM[..i], &STREAM[i..j], &STREAM[j..]]), whole, "cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn an_unterminated_last_event_counts_and_bare_cr_ends_lines() {
        assert_eq!(all(&[b"data: a\rdata: b"]), vec![SseEvent { name: None, data: "a\nb".into() }]);
    }

    #[test]
    fn written_events_read_back() {
        let mut out = Vec::new();
        write(&mut out, Some("message_start"), "{}");
        write(&mut out, None, "[DONE]");
        assert_eq!(
            all(&[&out]),
            vec![SseEvent { name: Some("message_start".into()), data: "{}".into() }, SseEvent { name: None, data: "[DONE]".into() }]
        );
    }

    #[test]
    fn an_event_without_its_blank_line_is_bounded_whatever_its_lines() {
        let mut r = SseReader::with_limit(1 << 16);
        let mut out = Vec::new();
        // Many short data lines, never a blank line: the event grows until the bound.
        let line = format!("data: {}\n", "x".repeat(1000));
        let mut fed = 0;
        let broke = loop {
            if r.feed(line.as_bytes(), &mut out).is_err() {
                break true;
            }
            fed += line.len();
            if fed > 1 << 20 {
                break false;
            }
        };
        assert!(broke && fed <= 1 << 16, "refused once the event passed its bound ({fed} bytes)");
        assert!(out.is_empty());
        // Events closed in time pass, however many.
        let mut r = SseReader::with_limit(1 << 16);
        for _ in 0..1000 {
            r.feed(format!("{line}\n").as_bytes(), &mut out).expect("each event is small");
        }
        assert_eq!(out.len(), 1000);
    }
}
