//! Usage extraction from upstream responses, streaming and not (the per-protocol event
//! readers are in `protocol::{openai,anthropic,gemini}`). The scanner sees
//! each body chunk as it passes; it never copies the body (only an SSE line that spans two
//! chunks is joined, and a non-streamed body is kept as a bounded list of shared `Bytes`).

use crate::protocol::{anthropic, gemini, openai, Reading};
use bytes::Bytes;
use serde_json::Value;
use std::collections::VecDeque;

/// Token counts of one call. `input` excludes `cached` (cache reads) and `cache_write`
/// (cache writes); each is priced apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub cached: u64,
    pub cache_write: u64,
    pub output: u64,
}

/// Which response format is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Responses,
    Embeddings,
    Messages,
    Gemini,
}

/// Longest SSE line the scanner will join across chunks.
const MAX_LINE: usize = 1 << 20;
/// How much of a non-streamed body is kept for the final usage lookup.
const TAIL_WINDOW: usize = 256 * 1024;

pub struct UsageScanner {
    shape: Shape,
    sse: bool,
    /// Drop the chat stream's usage-only chunk (the client did not ask for it).
    withhold_usage: bool,
    carry: Vec<u8>,
    /// In withhold mode: a data line was dropped, so drop the blank line that ends its event.
    drop_next_blank: bool,
    /// Usage and text found so far (the per-protocol readers in `protocol` fill it).
    reading: Reading,
    tail: VecDeque<Bytes>,
    tail_len: usize,
    /// Bytes that reached the client.
    pub body_bytes: u64,
}

/// What the scanner found once the body ended (or stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanResult {
    /// Input tokens reported, if any.
    pub input: Option<u64>,
    pub cached: Option<u64>,
    pub cache_write: Option<u64>,
    /// Output tokens reported, if any.
    pub output: Option<u64>,
    /// Bytes of generated content seen in stream events (text, reasoning, tool-call arguments).
    pub text_bytes: u64,
    /// Bytes that reached the client.
    pub body_bytes: u64,
}

impl UsageScanner {
    pub fn new(shape: Shape, sse: bool, withhold_usage: bool) -> Self {
        UsageScanner {
            shape,
            sse,
            withhold_usage: withhold_usage && sse && shape == Shape::Chat,
            carry: Vec::new(),
            drop_next_blank: false,
            reading: Reading::default(),
            tail: VecDeque::new(),
            tail_len: 0,
            body_bytes: 0,
        }
    }

    /// Look at one chunk. Returns a replacement only when an event had to be withheld.
    pub fn feed(&mut self, chunk: &Bytes) -> Option<Bytes> {
        if !self.sse {
            self.tail.push_back(chunk.clone());
            self.tail_len += chunk.len();
            while self.tail_len - self.tail.front().map_or(0, Bytes::len) >= TAIL_WINDOW {
                if let Some(old) = self.tail.pop_front() {
                    self.tail_len -= old.len();
                }
            }
            self.body_bytes += chunk.len() as u64;
            return None;
        }
        if self.withhold_usage {
            let out = self.feed_filtering(chunk);
            self.body_bytes += out.as_ref().map_or(chunk.len(), Bytes::len) as u64;
            return out;
        }
        self.body_bytes += chunk.len() as u64;
        let mut start = 0;
        while let Some(pos) = chunk[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            if self.carry.is_empty() {
                self.line(&chunk[start..end]);
            } else {
                self.carry.extend_from_slice(&chunk[start..end]);
                let joined = std::mem::take(&mut self.carry);
                self.line(&joined);
            }
            start = end + 1;
        }
        self.keep_partial(&chunk[start..]);
        None
    }

    /// In withhold mode, bytes held back at the end of the body (an unterminated last line).
    pub fn take_pending(&mut self) -> Option<Bytes> {
        if self.withhold_usage && !self.carry.is_empty() {
            let rest = std::mem::take(&mut self.carry);
            self.line(&rest);
            self.body_bytes += rest.len() as u64;
            return Some(Bytes::from(rest));
        }
        None
    }

    fn keep_partial(&mut self, rest: &[u8]) {
        if self.carry.len() + rest.len() <= MAX_LINE {
            self.carry.extend_from_slice(rest);
        } else {
            self.carry.clear();
        }
    }

    /// Withhold mode: complete lines pass except the usage event; a partial line waits.
    fn feed_filtering(&mut self, chunk: &Bytes) -> Option<Bytes> {
        let mut out: Vec<u8> = Vec::with_capacity(chunk.len() + self.carry.len());
        let mut changed = !self.carry.is_empty();
        let mut start = 0;
        while let Some(pos) = chunk[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let line: Vec<u8> = if self.carry.is_empty() {
                chunk[start..end].to_vec()
            } else {
                let mut l = std::mem::take(&mut self.carry);
                l.extend_from_slice(&chunk[start..end]);
                l
            };
            let trimmed = trim_cr(&line);
            let dropped = if trimmed.is_empty() && self.drop_next_blank {
                self.drop_next_blank = false;
                true
            } else {
                let is_usage_only = self.line(&line);
                if is_usage_only {
                    self.drop_next_blank = true;
                }
                is_usage_only
            };
            if dropped {
                changed = true;
            } else {
                out.extend_from_slice(&line);
                out.push(b'\n');
            }
            start = end + 1;
        }
        if start < chunk.len() {
            changed = true;
            self.keep_partial(&chunk[start..]);
        }
        changed.then(|| Bytes::from(out))
    }

    /// Handle one SSE line; returns true when it is the chat usage-only chunk.
    fn line(&mut self, line: &[u8]) -> bool {
        let line = trim_cr(line);
        let Some(data) = line.strip_prefix(b"data:") else { return false };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" || data.is_empty() {
            return false;
        }
        match serde_json::from_slice::<Value>(data) {
            Ok(event) => self.event(&event),
            Err(_) => false,
        }
    }

    /// Read one JSON event (a stream event or a whole body) with the protocol's reader.
    /// Returns true for the chat usage-only chunk.
    fn event(&mut self, v: &Value) -> bool {
        let r = &mut self.reading;
        match self.shape {
            Shape::Chat | Shape::Embeddings => openai::read_chat_event(v, r),
            Shape::Responses => {
                openai::read_responses_event(v, r);
                false
            }
            Shape::Messages => {
                anthropic::read_event(v, r);
                false
            }
            Shape::Gemini => {
                gemini::read_event(v, r);
                false
            }
        }
    }

    /// The body ended (or was cut): what was found.
    pub fn finish(&mut self) -> ScanResult {
        if self.sse {
            if !self.carry.is_empty() {
                let rest = std::mem::take(&mut self.carry);
                self.line(&rest);
            }
        } else {
            self.scan_tail();
        }
        let seen = &self.reading.seen;
        ScanResult {
            input: seen.input,
            cached: seen.cached,
            cache_write: seen.cache_write,
            output: seen.output,
            text_bytes: self.reading.text_bytes,
            body_bytes: self.body_bytes,
        }
    }

    /// A non-streamed body: parse it whole when it fits the window, else read the last usage
    /// object in the tail (also how a generate-content JSON-array stream is read).
    fn scan_tail(&mut self) {
        let mut tail = Vec::with_capacity(self.tail_len);
        for b in &self.tail {
            tail.extend_from_slice(b);
        }
        // The usage object alone is parsed; the whole body only when there is none (to count
        // its text for an estimate).
        let key: &[u8] = if self.shape == Shape::Gemini { b"\"usageMetadata\"" } else { b"\"usage\"" };
        if let Some(obj) = last_object_after(&tail, key) {
            let wrapped = match self.shape {
                Shape::Gemini => serde_json::json!({ "usageMetadata": obj }),
                _ => serde_json::json!({ "usage": obj }),
            };
            self.event(&wrapped);
            if self.reading.seen.output.is_some() {
                return;
            }
        }
        if self.tail_len as u64 == self.body_bytes {
            if let Ok(v) = serde_json::from_slice::<Value>(&tail) {
                match v {
                    Value::Array(items) => {
                        for item in &items {
                            self.event(item);
                        }
                    }
                    other => {
                        self.event(&other);
                    }
                }
            }
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The JSON object that follows the last `key:` in `buf`.
fn last_object_after(buf: &[u8], key: &[u8]) -> Option<Value> {
    let mut search_end = buf.len();
    while let Some(pos) = buf[..search_end].windows(key.len()).rposition(|w| w == key) {
        let rest = &buf[pos + key.len()..];
        let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len())..];
        if let Some(after_colon) = rest.strip_prefix(b":") {
            let mut de = serde_json::Deserializer::from_slice(after_colon).into_iter::<Value>();
            if let Some(Ok(v)) = de.next() {
                if v.is_object() {
                    return Some(v);
                }
            }
        }
        search_end = pos;
    }
    None
}

/// Tokens guessed from text length when no usage was reported (about four bytes a token).
pub fn tokens_from_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn scan(shape: Shape, sse: bool, body: &[u8], cuts: &[usize]) -> ScanResult {
        let mut s = UsageScanner::new(shape, sse, false);
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&body.len())) {
            s.feed(&Bytes::copy_from_slice(&body[last..c]));
            last = c;
        }
        s.finish()
    }

    const CHAT_STREAM: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
        "data: [DONE]\n\n"
    );

    #[test]
    fn chat_stream_usage_and_text() {
        let r = scan(Shape::Chat, true, CHAT_STREAM.as_bytes(), &[]);
        assert_eq!((r.input, r.cached, r.output, r.text_bytes), (Some(8), Some(4), Some(2), 11));
    }

    #[test]
    fn withheld_usage_chunk_is_removed_and_still_counted() {
        let body = CHAT_STREAM.as_bytes();
        for cut in 1..body.len() {
            let mut s = UsageScanner::new(Shape::Chat, true, true);
            let mut out = Vec::new();
            for part in [&body[..cut], &body[cut..]] {
                let b = Bytes::copy_from_slice(part);
                match s.feed(&b) {
                    Some(replaced) => out.extend_from_slice(&replaced),
                    None => out.extend_from_slice(&b),
                }
            }
            let r = s.finish();
            assert_eq!(r.output, Some(2), "cut {cut}");
            let text = String::from_utf8(out).expect("utf8");
            assert!(!text.contains("usage"), "cut {cut}: {text}");
            assert!(text.contains("[DONE]") && text.contains(" world"), "cut {cut}: {text}");
            assert!(!text.contains("\n\n\n"), "cut {cut}: no stray blank line");
        }
        // An unterminated last line is released at the end and counted as received.
        let body = &CHAT_STREAM.as_bytes()[..CHAT_STREAM.len() - 2];
        let mut s = UsageScanner::new(Shape::Chat, true, true);
        let mut out = s.feed(&Bytes::copy_from_slice(body)).map_or_else(|| body.to_vec(), |b| b.to_vec());
        out.extend_from_slice(&s.take_pending().expect("the held-back [DONE] line"));
        assert!(out.ends_with(b"data: [DONE]"));
        assert_eq!(s.finish().body_bytes, out.len() as u64, "every byte the client got is counted");
    }

    const MESSAGES_STREAM: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":5,\"cache_creation_input_tokens\":2,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"abc\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    const GEMINI_STREAM: &str = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"A\"}]}}],\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":1}}\r\n\r\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"BC\"}]}}],\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":3,\"thoughtsTokenCount\":2}}\r\n\r\n"
    );

    #[test]
    fn responses_messages_gemini_streams() {
        let responses = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":3,\"input_tokens_details\":{\"cached_tokens\":1}}}}\n\n"
        );
        let r = scan(Shape::Responses, true, responses.as_bytes(), &[]);
        assert_eq!((r.input, r.cached, r.output, r.text_bytes), (Some(8), Some(1), Some(3), 2));

        let r = scan(Shape::Messages, true, MESSAGES_STREAM.as_bytes(), &[]);
        assert_eq!((r.input, r.cached, r.cache_write, r.output, r.text_bytes), (Some(20), Some(5), Some(2), Some(7), 3));

        let r = scan(Shape::Gemini, true, GEMINI_STREAM.as_bytes(), &[]);
        assert_eq!((r.input, r.output, r.text_bytes), (Some(4), Some(5), 3), "last chunk wins");
    }

    #[test]
    fn whole_bodies_and_large_bodies() {
        let chat = br#"{"id":"x","choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\": 999}"}}],"usage":{"prompt_tokens":10,"completion_tokens":5}}"#;
        let r = scan(Shape::Chat, false, chat, &[7, 30]);
        assert_eq!((r.input, r.output), (Some(10), Some(5)));
        let msg = br#"{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        let r = scan(Shape::Messages, false, msg, &[]);
        assert_eq!((r.input, r.output), (Some(3), Some(4)));
        let emb = format!(
            r#"{{"data":[{{"embedding":[{}]}}],"usage":{{"prompt_tokens":6,"total_tokens":6}}}}"#,
            vec!["0.125"; 200_000].join(",")
        );
        let cuts: Vec<usize> = (1..emb.len()).step_by(16_384).collect();
        let r = scan(Shape::Embeddings, false, emb.as_bytes(), &cuts);
        assert_eq!((r.input, r.output), (Some(6), Some(0)), "usage found in the tail of a body larger than the window");
        let array = br#"[{"candidates":[],"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":1}}
,{"candidates":[],"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":9}}]"#;
        let r = scan(Shape::Gemini, false, array, &[]);
        assert_eq!(r.output, Some(9));
    }

    /// Property: however a stream is cut into chunks, the scanner finds the same result.
    #[test]
    fn any_chunking_gives_the_same_result() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let bodies = [(Shape::Chat, CHAT_STREAM), (Shape::Messages, MESSAGES_STREAM), (Shape::Gemini, GEMINI_STREAM)];
        for (shape, body) in bodies {
            let whole = scan(shape, true, body.as_bytes(), &[]);
            for _ in 0..500 {
                let n = rng.gen_range(0..12);
                let mut cuts: Vec<usize> = (0..n).map(|_| rng.gen_range(0..body.len())).collect();
                cuts.sort_unstable();
                assert_eq!(scan(shape, true, body.as_bytes(), &cuts), whole, "{cuts:?}");
            }
        }
    }

    #[test]
    fn estimates_and_garbage() {
        assert_eq!(tokens_from_bytes(0), 0);
        assert_eq!(tokens_from_bytes(1), 1);
        assert_eq!(tokens_from_bytes(9), 3);
        let r = scan(Shape::Chat, true, b"data: {not json\n\ndata: [DONE]\n\n", &[3]);
        assert_eq!(r.output, None);
        let r = scan(Shape::Chat, false, b"<html>oops</html>", &[]);
        assert_eq!(r.output, None);
    }
}
