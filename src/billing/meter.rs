//! Usage extraction from upstream responses, streaming and not (the per-protocol event
//! readers are in `protocol::{openai,anthropic,gemini}`). The scanner sees
//! each body chunk as it passes; it never copies the body (only an SSE line that spans two
//! chunks is joined, and a non-streamed body is kept as a bounded list of shared `Bytes`).

use crate::protocol::{anthropic, gemini, openai, Reading};
use bytes::Bytes;
use serde_json::Value;
use std::collections::VecDeque;

/// Which response format is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Responses,
    Embeddings,
    Messages,
    Gemini,
    /// Images: usage with image tokens, images counted (see `protocol::media`).
    Images,
    /// Speech: an audio body (nothing to read), or its events' usage.
    Speech,
    /// Transcriptions and translations: usage in tokens or seconds.
    Transcription,
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
    /// The start of a line not ended yet (in withhold mode, not yet passed on).
    carry: Vec<u8>,
    /// The last chunk ended with CR: an LF starting the next one belongs to that line.
    after_cr: bool,
    /// The last line ended was withheld (so is the LF of its CRLF, if cut off).
    last_dropped: bool,
    /// The current line outgrew [`MAX_LINE`]: passed on unread until it ends.
    overlong: bool,
    /// In withhold mode: a data line was dropped, so drop the blank line that ends its event.
    drop_next_blank: bool,
    /// Usage and text found so far (the per-protocol readers in `protocol` fill it).
    reading: Reading,
    tail: VecDeque<Bytes>,
    tail_len: usize,
    /// A non-streamed response object's first bytes, where its id is (the tail may not reach back to it).
    head: Vec<u8>,
    /// Bytes that reached the client.
    pub body_bytes: u64,
    /// What the answer says of itself, read only for a traced request (see [`Self::read_answer`]).
    answer: Option<Box<crate::base::usage::Answer>>,
    /// Images: the images of a whole answer, counted as it passes.
    images: Option<Box<crate::protocol::media::ImageCounter>>,
    /// Images: the start and end of a streamed event too long to read whole (an image's
    /// `b64_json`), where its type and usage are.
    long_line: Option<Box<LongLine>>,
}

/// The start and the end of an SSE line longer than [`MAX_LINE`].
#[derive(Debug, Default)]
struct LongLine {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl LongLine {
    const HEAD: usize = 512;
    const TAIL: usize = 64 * 1024;

    fn see(&mut self, bytes: &[u8]) {
        if self.head.len() < Self::HEAD {
            let room = Self::HEAD - self.head.len();
            self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * Self::TAIL {
            self.tail.drain(..self.tail.len() - Self::TAIL);
        }
    }
}

/// How much of a non-streamed response object is kept to read its id.
const HEAD_WINDOW: usize = 16 * 1024;

/// What the scanner found once the body ended (or stopped).
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// What a media answer reported beyond its tokens.
    pub media: crate::protocol::media::MediaSeen,
}

impl UsageScanner {
    pub fn new(shape: Shape, sse: bool, withhold_usage: bool) -> Self {
        UsageScanner {
            shape,
            sse,
            withhold_usage: withhold_usage && sse && shape == Shape::Chat,
            carry: Vec::new(),
            after_cr: false,
            last_dropped: false,
            overlong: false,
            drop_next_blank: false,
            reading: Reading::default(),
            tail: VecDeque::new(),
            tail_len: 0,
            head: Vec::new(),
            body_bytes: 0,
            answer: None,
            images: (shape == Shape::Images && !sse).then(Box::default),
            long_line: None,
        }
    }

    /// Look at one chunk. Returns a replacement only when an event had to be withheld.
    pub fn feed(&mut self, chunk: &Bytes) -> Option<Bytes> {
        if !self.sse {
            if self.shape == Shape::Speech {
                // Audio: nothing in it to read.
                self.body_bytes += chunk.len() as u64;
                return None;
            }
            if let Some(counter) = self.images.as_deref_mut() {
                counter.feed(chunk);
            }
            if self.shape == Shape::Responses && self.head.len() < HEAD_WINDOW {
                let room = HEAD_WINDOW - self.head.len();
                self.head.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
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
            let mut out = Vec::with_capacity(chunk.len() + self.carry.len());
            self.sse_lines(chunk, Some(&mut out));
            self.body_bytes += out.len() as u64;
            return (out != chunk[..]).then(|| Bytes::from(out));
        }
        self.body_bytes += chunk.len() as u64;
        self.sse_lines(chunk, None);
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

    /// Split a chunk into SSE lines (ended by LF, CRLF or a lone CR, as the SSE format allows;
    /// a CRLF may be cut between two chunks) and read each. In withhold mode `out` receives
    /// every byte the client is to get: each line with its own terminator, less the usage
    /// event (its data line and the blank line after it); a partial line waits in `carry`.
    fn sse_lines(&mut self, chunk: &[u8], mut out: Option<&mut Vec<u8>>) {
        if chunk.is_empty() {
            return;
        }
        let mut start = 0;
        if std::mem::take(&mut self.after_cr) && chunk[0] == b'\n' {
            // The LF of a CRLF cut between chunks: part of the line that already ended.
            if let Some(o) = out.as_deref_mut() {
                if !self.last_dropped {
                    o.push(b'\n');
                }
            }
            start = 1;
        }
        while let Some(pos) = chunk[start..].iter().position(|&b| b == b'\n' || b == b'\r') {
            let end = start + pos;
            let mut next = end + 1;
            if chunk[end] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let dropped = self.end_line(&chunk[start..end], out.as_deref_mut());
            self.last_dropped = dropped;
            if let (Some(o), false) = (out.as_deref_mut(), dropped) {
                o.extend_from_slice(&chunk[end..next]);
            }
            start = next;
        }
        self.keep_partial(&chunk[start..], out);
    }

    /// A line ends with `tail` (after any carried bytes): read it; in withhold mode write it
    /// to `out` unless it is withheld (the caller writes the terminator). Returns "withheld".
    fn end_line(&mut self, tail: &[u8], out: Option<&mut Vec<u8>>) -> bool {
        if std::mem::take(&mut self.overlong) {
            // Its start already went on unread.
            if let Some(o) = out {
                o.extend_from_slice(tail);
            }
            if let Some(mut long) = self.long_line.take() {
                long.see(tail);
                self.long_event(&long);
            }
            return false;
        }
        let joined = if self.carry.is_empty() {
            None
        } else {
            let mut l = std::mem::take(&mut self.carry);
            l.extend_from_slice(tail);
            Some(l)
        };
        let line = joined.as_deref().unwrap_or(tail);
        let withheld = if !self.withhold_usage {
            self.line(line);
            false
        } else if line.is_empty() && self.drop_next_blank {
            self.drop_next_blank = false;
            true
        } else {
            let usage_only = self.line(line);
            self.drop_next_blank = usage_only;
            usage_only
        };
        if let (Some(o), false) = (out, withheld) {
            o.extend_from_slice(line);
        }
        withheld
    }

    /// The unterminated end of a chunk waits for the rest of its line, up to [`MAX_LINE`]
    /// bytes; a longer line is not read and its bytes go on at once.
    fn keep_partial(&mut self, rest: &[u8], out: Option<&mut Vec<u8>>) {
        if rest.is_empty() {
            return;
        }
        if !self.overlong && self.carry.len() + rest.len() <= MAX_LINE {
            self.carry.extend_from_slice(rest);
            return;
        }
        if self.shape == Shape::Images {
            let long = self.long_line.get_or_insert_with(Box::default);
            long.see(&self.carry);
            long.see(rest);
        }
        self.overlong = true;
        let held = std::mem::take(&mut self.carry);
        if let Some(o) = out {
            o.extend_from_slice(&held);
            o.extend_from_slice(rest);
        }
    }

    /// An images event too long to read whole (an image inline): a `*.completed` event is an
    /// image, and the usage at its end is read.
    fn long_event(&mut self, long: &LongLine) {
        let completed = memchr::memmem::find(&long.head, b".completed\"").is_some();
        let mut event = serde_json::Map::new();
        if completed {
            event.insert("type".into(), Value::String("image_generation.completed".into()));
        }
        if let Some(usage) = last_object_after(&long.tail, b"\"usage\"") {
            event.insert("usage".into(), usage);
        }
        if !event.is_empty() {
            if !completed {
                // Usage outside a completed event: an event of its own, added like one.
                event.insert("type".into(), Value::String("image_generation.usage".into()));
            }
            self.event(&Value::Object(event));
        }
    }

    /// Handle one SSE line (without its terminator); returns true when it is the chat usage-only chunk.
    fn line(&mut self, line: &[u8]) -> bool {
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
    /// Also read the answering model and the finish reasons (for a traced request's spans).
    pub fn read_answer(&mut self) {
        self.answer = Some(Box::default());
    }

    /// What [`Self::read_answer`] found, once the body ended.
    pub fn take_answer(&mut self) -> Option<crate::base::usage::Answer> {
        self.answer.take().map(|a| *a)
    }

    fn event(&mut self, v: &Value) -> bool {
        if let Some(a) = self.answer.as_deref_mut() {
            match self.shape {
                Shape::Chat | Shape::Embeddings => openai::read_chat_answer(v, a),
                Shape::Responses => openai::read_responses_answer(v, a),
                Shape::Messages => anthropic::read_answer(v, a),
                Shape::Gemini => gemini::read_answer(v, a),
                Shape::Images | Shape::Speech | Shape::Transcription => {}
            }
        }
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
            Shape::Images => {
                crate::protocol::media::read_images_event(v, r);
                false
            }
            Shape::Speech => {
                crate::protocol::media::read_speech_event(v, r);
                false
            }
            Shape::Transcription => {
                crate::protocol::media::read_transcription_event(v, r);
                false
            }
        }
    }

    /// The id of the response being relayed (responses API), once seen: a stream names it in
    /// its first event, a response object when its body ended ([`UsageScanner::finish`]).
    pub fn response_id(&self) -> Option<&str> {
        self.reading.response_id.as_deref()
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
            if self.shape == Shape::Responses && self.reading.response_id.is_none() {
                self.reading.response_id = openai::response_id_in_head(&self.head);
            }
        }
        let seen = &self.reading.seen;
        let mut media = self.reading.media;
        if let Some(counter) = &self.images {
            media.images = media.images.max(counter.images);
        }
        ScanResult {
            media,
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
        // One chunk (a usual body) is read where it is; several are joined.
        let tail: Bytes = match (self.tail.len(), self.tail.front()) {
            (1, Some(only)) => only.clone(),
            _ => {
                let mut all = Vec::with_capacity(self.tail_len);
                for b in &self.tail {
                    all.extend_from_slice(b);
                }
                Bytes::from(all)
            }
        };
        // The usage object alone is parsed; the whole body only when there is none (to count
        // its text for an estimate).
        let key: &[u8] = if self.shape == Shape::Gemini { b"\"usageMetadata\"" } else { b"\"usage\"" };
        if let Some(obj) = last_object_after(&tail, key) {
            // Moved into its wrapper, not copied (`json!` would serialize it again).
            let name = if self.shape == Shape::Gemini { "usageMetadata" } else { "usage" };
            let wrapped = Value::Object(serde_json::Map::from_iter([(name.to_string(), obj)]));
            self.event(&wrapped);
            if self.reading.seen.output.is_some() {
                // A traced answer's model and finish reasons, from the whole body when it is here.
                if let (Some(a), true) = (self.answer.as_deref_mut(), self.tail_len as u64 == self.body_bytes) {
                    match self.shape {
                        Shape::Chat | Shape::Embeddings => openai::read_chat_answer_body(&tail, a),
                        Shape::Responses => openai::read_responses_answer_body(&tail, a),
                        Shape::Messages => anthropic::read_answer_body(&tail, a),
                        Shape::Gemini => gemini::read_answer_body(&tail, a),
                        Shape::Images | Shape::Speech | Shape::Transcription => {}
                    }
                }
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

/// The JSON object that follows the last `key:` in `buf`.
fn last_object_after(buf: &[u8], key: &[u8]) -> Option<Value> {
    let mut search_end = buf.len();
    while let Some(pos) = memchr::memmem::rfind(&buf[..search_end], key) {
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
    use serde_json::json;

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
    fn the_response_id_is_found_in_a_stream_and_in_a_body_larger_than_the_tail() {
        let stream = "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s\"}}\n\n";
        let mut s = UsageScanner::new(Shape::Responses, true, false);
        s.feed(&Bytes::from(stream));
        assert_eq!(s.response_id(), Some("resp_s"), "known once the first event passed");
        let filler = "x".repeat(TAIL_WINDOW * 2);
        let body = format!(
            r#"{{"id":"resp_b","object":"response","output":[{{"text":"{filler}"}}],"usage":{{"input_tokens":2,"output_tokens":1}}}}"#
        );
        let mut s = UsageScanner::new(Shape::Responses, false, false);
        for piece in body.as_bytes().chunks(1000) {
            s.feed(&Bytes::copy_from_slice(piece));
        }
        let r = s.finish();
        assert_eq!((r.input, r.output), (Some(2), Some(1)));
        assert_eq!(s.response_id(), Some("resp_b"));
    }

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

    /// One SSE event of a chat stream: a content delta, a comment, or the usage-only chunk.
    #[derive(Debug, Clone)]
    enum Event {
        Delta(String),
        Comment(String),
        Usage(u64, u64),
    }

    fn event_strategy() -> impl proptest::strategy::Strategy<Value = Event> {
        use proptest::prelude::*;
        prop_oneof![
            6 => any::<String>().prop_map(Event::Delta),
            1 => "[a-z ,:{}\\[\\]]{0,20}".prop_map(Event::Comment),
        ]
    }

    /// A chat stream from `events` (the usage chunk inserted at `usage_at`), each line ended by
    /// `ends[i % ends.len()]`: (the stream, the stream without its usage event, usage).
    fn chat_stream(events: &[Event], usage_at: usize, ends: &[&str]) -> (Vec<u8>, Vec<u8>) {
        let mut events = events.to_vec();
        events.insert(usage_at.min(events.len()), Event::Usage(17, 5));
        let (mut all, mut without) = (Vec::new(), Vec::new());
        let mut line_no = 0;
        let mut line = |text: &str, into_both: bool, all: &mut Vec<u8>, without: &mut Vec<u8>| {
            let end = ends[line_no % ends.len()];
            line_no += 1;
            for (out, yes) in [(all, true), (without, into_both)] {
                if yes {
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(end.as_bytes());
                }
            }
        };
        for e in &events {
            let (text, kept) = match e {
                Event::Delta(t) => (format!("data: {}", json!({"choices": [{"index": 0, "delta": {"content": t}}]})), true),
                Event::Comment(c) => (format!(": {}", c.replace(['\r', '\n'], " ")), true),
                Event::Usage(i, o) => {
                    (format!("data: {}", json!({"choices": [], "usage": {"prompt_tokens": i, "completion_tokens": o}})), false)
                }
            };
            line(&text, kept, &mut all, &mut without);
            line("", kept, &mut all, &mut without);
        }
        line("data: [DONE]", true, &mut all, &mut without);
        line("", true, &mut all, &mut without);
        (all, without)
    }

    /// Feed `body` cut at `cuts`; (what the client receives, the result).
    fn relay_through(body: &[u8], cuts: &[usize], withhold: bool) -> (Vec<u8>, ScanResult) {
        let mut s = UsageScanner::new(Shape::Chat, true, withhold);
        let mut out = Vec::new();
        let mut last = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        for c in cuts.into_iter().chain(std::iter::once(body.len())) {
            let chunk = Bytes::copy_from_slice(&body[last..c]);
            match s.feed(&chunk) {
                Some(replaced) => out.extend_from_slice(&replaced),
                None => out.extend_from_slice(&chunk),
            }
            last = c;
        }
        if let Some(rest) = s.take_pending() {
            out.extend_from_slice(&rest);
        }
        let r = s.finish();
        (out, r)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Any events, any mix of LF / CRLF / CR line endings, any chunking: with the usage
        /// chunk withheld the client gets exactly the upstream's bytes less that event; without,
        /// exactly the upstream's bytes; the usage is read either way.
        #[test]
        fn the_client_gets_the_upstream_bytes_less_only_a_withheld_usage_event(
            events in proptest::collection::vec(event_strategy(), 0..12),
            usage_at in 0usize..13,
            ends in proptest::sample::subsequence(vec!["\n", "\r\n", "\r"], 1..=3),
            cuts in proptest::collection::vec(0usize..100_000, 0..20),
        ) {
            let (all, without) = chat_stream(&events, usage_at, &ends);
            let (out, r) = relay_through(&all, &cuts, true);
            proptest::prop_assert_eq!(&out, &without);
            proptest::prop_assert_eq!((r.input, r.output), (Some(17), Some(5)));
            proptest::prop_assert_eq!(r.body_bytes, out.len() as u64);
            let (out, r) = relay_through(&all, &cuts, false);
            proptest::prop_assert_eq!(&out, &all);
            proptest::prop_assert_eq!((r.input, r.output), (Some(17), Some(5)));
        }

        /// Arbitrary bytes never panic the scanner, and pass through unchanged unless a
        /// usage-only chat chunk is withheld.
        #[test]
        fn arbitrary_bytes_pass_through(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
                                        cuts in proptest::collection::vec(0usize..4096, 0..8)) {
            let (out, _) = relay_through(&body, &cuts, false);
            proptest::prop_assert_eq!(&out, &body);
            let _ = relay_through(&body, &cuts, true);
        }
    }

    /// A line longer than the scanner joins (1 MiB) is passed on whole, in withhold mode too,
    /// and the stream after it is still read.
    #[test]
    fn an_overlong_line_is_passed_on_unread() {
        let long = format!("data: {{\"pad\":\"{}\"}}", "x".repeat(2 * MAX_LINE));
        let (all, without) = chat_stream(&[Event::Delta("a".into())], 1, &["\n"]);
        let mut body = format!("{long}\r\n\r\n").into_bytes();
        body.extend_from_slice(&all);
        let mut expected = format!("{long}\r\n\r\n").into_bytes();
        expected.extend_from_slice(&without);
        let cuts: Vec<usize> = (1..body.len()).step_by(300_000).collect();
        let (out, r) = relay_through(&body, &cuts, true);
        assert!(out == expected, "the long line reached the client whole, the usage event did not");
        assert_eq!(r.output, Some(5));
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
