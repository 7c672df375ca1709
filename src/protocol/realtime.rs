//! The realtime API on the wire: WebSocket frames split whole out of a byte stream (their
//! headers read by `tungstenite`), the events tollgate reads from them (a turn asked for or
//! started, and the usage of `response.done`), and the frames it writes itself (an `error`
//! event, a close). Pure.

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::io::Cursor;
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

/// The subprotocol prefix the SDKs carry a key in when a browser cannot set a header.
pub const KEY_SUBPROTOCOL: &str = "openai-insecure-api-key.";

/// One frame, whole, as it arrived.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The frame's bytes, header included: what is relayed.
    pub bytes: Bytes,
    pub opcode: OpCode,
    pub fin: bool,
    mask: Option<[u8; 4]>,
    payload_at: usize,
}

impl Frame {
    /// The payload, unmasked.
    pub fn payload(&self) -> std::borrow::Cow<'_, [u8]> {
        self.head(usize::MAX)
    }

    /// A whole text message (not a fragment).
    pub fn is_text(&self) -> bool {
        self.fin && self.opcode == OpCode::Data(Data::Text)
    }

    /// The first frame of a text message in fragments (more follow).
    pub fn starts_text_fragments(&self) -> bool {
        !self.fin && self.opcode == OpCode::Data(Data::Text)
    }

    /// The first frame of a binary message in fragments.
    pub fn starts_binary_fragments(&self) -> bool {
        !self.fin && self.opcode == OpCode::Data(Data::Binary)
    }

    /// A later fragment of a message.
    pub fn is_continuation(&self) -> bool {
        self.opcode == OpCode::Data(Data::Continue)
    }

    pub fn is_close(&self) -> bool {
        self.opcode == OpCode::Control(Control::Close)
    }

    /// The first bytes of the payload, unmasked (enough to read an event's `type`).
    /// Borrowed from the frame as it came when it is not masked (a server's).
    pub fn head(&self, n: usize) -> std::borrow::Cow<'_, [u8]> {
        let raw = &self.bytes[self.payload_at..];
        let raw = &raw[..raw.len().min(n)];
        match self.mask {
            None => std::borrow::Cow::Borrowed(raw),
            Some(key) => std::borrow::Cow::Owned(raw.iter().enumerate().map(|(i, b)| b ^ key[i % 4]).collect()),
        }
    }
}

/// Why a stream of frames cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A frame longer than the bound.
    TooLarge(u64),
    /// Not a WebSocket frame.
    Malformed(String),
}

/// Splits a byte stream into whole frames, holding at most one incomplete frame.
#[derive(Debug)]
pub struct Splitter {
    buf: BytesMut,
    max_frame: u64,
}

impl Splitter {
    pub fn new(max_frame: u64) -> Splitter {
        Splitter { buf: BytesMut::new(), max_frame }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The bytes held: at most one incomplete frame (and whole ones not yet taken).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let mut cursor = Cursor::new(&self.buf[..]);
        let (header, length) = match FrameHeader::parse(&mut cursor) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => return Ok(None),
            Err(e) => return Err(FrameError::Malformed(e.to_string())),
        };
        if length > self.max_frame {
            return Err(FrameError::TooLarge(length));
        }
        let payload_at = cursor.position() as usize;
        let total = payload_at + length as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let bytes = self.buf.split_to(total).freeze();
        Ok(Some(Frame { bytes, opcode: header.opcode, fin: header.is_final, mask: header.mask, payload_at }))
    }
}

/// What a realtime event means for billing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The client asks for a turn (`response.create`).
    ResponseCreate,
    /// The client changes the session (`session.update`): where its turns' output ends.
    SessionUpdate,
    /// The client sends audio (`input_audio_buffer.append`): a turn the server may start.
    AudioAppend,
    /// The server started a turn (`response.created`: also by its own voice activity
    /// detection), with the response's id.
    ResponseCreated(Option<String>),
    /// A turn ended with its usage (`response.done`), with the response's id.
    ResponseDone(TurnUsage, Option<String>),
    /// The session began (`session.created`): its `session` object, to tell where turns the
    /// server starts on its own must end.
    SessionCreated(Value),
    /// The session changed (`session.updated`).
    SessionUpdated,
    Other,
}

/// A turn's token counts, split as the realtime API reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnUsage {
    /// Input not read from the cache.
    pub text_in: u64,
    pub audio_in: u64,
    /// Input read from the cache (text and audio).
    pub cached_in: u64,
    pub text_out: u64,
    pub audio_out: u64,
}

impl TurnUsage {
    pub fn input(&self) -> u64 {
        self.text_in.saturating_add(self.audio_in).saturating_add(self.cached_in)
    }

    pub fn output(&self) -> u64 {
        self.text_out.saturating_add(self.audio_out)
    }
}

/// How far into an event its `type` is looked for before the whole event is parsed.
const TYPE_WINDOW: usize = 256;

/// The `type` of an event, read from its first bytes (`head`) when it is a member of the event
/// itself there (the usual case: the services write it first, and events are long only for
/// their audio, which follows), else from the whole event.
fn event_type<'a>(head: &[u8], whole: impl FnOnce() -> std::borrow::Cow<'a, [u8]>) -> Option<String> {
    if let Some(at) = top_level_type(head) {
        let rest = &head[at + 6..];
        let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace() && *b != b':')?..];
        if let Some(inner) = rest.strip_prefix(b"\"") {
            if let Some(end) = inner.iter().position(|b| *b == b'"' || *b == b'\\') {
                if inner[end] == b'"' {
                    return std::str::from_utf8(&inner[..end]).ok().map(str::to_string);
                }
            }
        }
    }
    let v: Value = serde_json::from_slice(&whole()).ok()?;
    v.get("type").and_then(Value::as_str).map(str::to_string)
}

/// Where a `"type"` member of the outermost object starts in `head`, if one does (one nested in
/// another value does not count).
fn top_level_type(head: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in head.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' if depth == 1 && head[i..].starts_with(b"\"type\"") => return Some(i),
            b'"' => in_string = true,
            _ => {}
        }
    }
    None
}

fn client_type(name: Option<&str>) -> Event {
    match name {
        Some("response.create") => Event::ResponseCreate,
        Some("session.update") => Event::SessionUpdate,
        Some("input_audio_buffer.append") => Event::AudioAppend,
        _ => Event::Other,
    }
}

/// A client frame, read: only whole text messages are events (a message in fragments is read
/// once whole, with [`client_message`]).
pub fn client_event(frame: &Frame) -> Event {
    if !frame.is_text() {
        return Event::Other;
    }
    client_type(event_type(&frame.head(TYPE_WINDOW), || frame.payload()).as_deref())
}

/// A client's whole text message (its fragments joined), read.
pub fn client_message(payload: &[u8]) -> Event {
    client_type(event_type(&payload[..payload.len().min(TYPE_WINDOW)], || std::borrow::Cow::Borrowed(payload)).as_deref())
}

/// The id of the response an event is about (`response.id`).
fn response_id(v: &Value) -> Option<String> {
    v.pointer("/response/id").and_then(Value::as_str).map(|s| s.chars().take(128).collect())
}

/// A server frame, read: `response.created` and `response.done` are parsed whole (for the
/// response's id and the usage).
pub fn server_event(frame: &Frame) -> Event {
    if !frame.is_text() {
        return Event::Other;
    }
    match event_type(&frame.head(TYPE_WINDOW), || frame.payload()).as_deref() {
        Some("response.created") => match serde_json::from_slice::<Value>(&frame.payload()) {
            Ok(v) => Event::ResponseCreated(response_id(&v)),
            Err(_) => Event::ResponseCreated(None),
        },
        Some("response.done") => match serde_json::from_slice::<Value>(&frame.payload()) {
            Ok(v) => Event::ResponseDone(turn_usage(v.pointer("/response/usage").unwrap_or(&Value::Null)), response_id(&v)),
            Err(_) => Event::ResponseDone(TurnUsage::default(), None),
        },
        Some("session.created") => match serde_json::from_slice::<Value>(&frame.payload()) {
            Ok(mut v) => Event::SessionCreated(v.get_mut("session").map(Value::take).unwrap_or(Value::Null)),
            Err(_) => Event::SessionCreated(Value::Null),
        },
        Some("session.updated") => Event::SessionUpdated,
        _ => Event::Other,
    }
}

/// Tell the upstream where a turn's hold ends: a `response.create`'s `response.max_output_tokens`
/// or a `session.update`'s session bound (`max_output_tokens`; the beta protocol's
/// `max_response_output_tokens` where the session names no `type`) set to `allowance` when the
/// client asked for more (or for `"inf"`, or named none). The event rewritten, or None when it
/// is left as it is (not JSON, or already within the allowance).
pub fn cap_output(payload: &[u8], event: &Event, allowance: u64) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(payload).ok()?;
    let target = match event {
        Event::ResponseCreate => {
            let obj = v.as_object_mut()?;
            let response = obj.entry("response").or_insert_with(|| Value::Object(Default::default()));
            (response.as_object_mut()?, "max_output_tokens")
        }
        Event::SessionUpdate => {
            let session = v.get_mut("session")?.as_object_mut()?;
            let name = session_bound(session)?;
            (session, name)
        }
        _ => return None,
    };
    let (obj, name) = target;
    if within(obj, name, allowance) {
        return None;
    }
    obj.insert(name.to_string(), Value::from(allowance));
    serde_json::to_vec(&v).ok()
}

/// The member that bounds a session's turns: `max_output_tokens`, or the beta protocol's
/// `max_response_output_tokens` where the session names no `type` (and no such member); None
/// for a session without turns (a transcription session).
fn session_bound(session: &serde_json::Map<String, Value>) -> Option<&'static str> {
    match session.get("type").and_then(Value::as_str) {
        Some("transcription") => None,
        Some(_) => Some("max_output_tokens"),
        None if session.contains_key("max_output_tokens") => Some("max_output_tokens"),
        None => Some("max_response_output_tokens"),
    }
}

/// Whether `obj`'s `name` bounds the output at `allowance` or less already.
fn within(obj: &serde_json::Map<String, Value>, name: &str, allowance: u64) -> bool {
    obj.get(name).and_then(Value::as_u64).is_some_and(|asked| asked <= allowance)
}

/// The `session.update` that bounds every turn of a session that began as `session` (its
/// `session.created`) at `allowance` output tokens — `max_output_tokens`, or the beta protocol's
/// `max_response_output_tokens` where the session names no `type` —, as a client frame; None
/// when the session is bounded that far already or has no turns (a transcription session).
pub fn session_cap(session: &Value, allowance: u64) -> Option<Bytes> {
    let session = session.as_object()?;
    let name = session_bound(session)?;
    if within(session, name, allowance) {
        return None;
    }
    let mut update = serde_json::json!({name: allowance});
    if session.contains_key("type") {
        update["type"] = Value::from("realtime");
    }
    Some(text_frame(&serde_json::json!({"type": "session.update", "event_id": "event_tollgate_cap", "session": update}), true))
}

/// A client's text message as one masked frame (a message tollgate reassembled or rewrote).
pub fn client_text_frame(payload: &[u8]) -> Bytes {
    frame(OpCode::Data(Data::Text), payload, true)
}

/// A `response.done`'s usage: cached tokens split out of the input; text and audio apart
/// (input not split by kind is text).
pub fn turn_usage(u: &Value) -> TurnUsage {
    let n = |path: &str| u.pointer(path).and_then(Value::as_u64);
    let input = n("/input_tokens").unwrap_or(0);
    let output = n("/output_tokens").unwrap_or(0);
    let cached = n("/input_token_details/cached_tokens").unwrap_or(0).min(input);
    let cached_audio = n("/input_token_details/cached_tokens_details/audio_tokens").unwrap_or(0).min(cached);
    let audio_in = n("/input_token_details/audio_tokens").unwrap_or(0).min(input).saturating_sub(cached_audio);
    let audio_out = n("/output_token_details/audio_tokens").unwrap_or(0).min(output);
    TurnUsage {
        text_in: (input - cached).saturating_sub(audio_in),
        audio_in: audio_in.min(input - cached),
        cached_in: cached,
        text_out: output - audio_out,
        audio_out,
    }
}

/// A frame of `opcode` with `payload`, masked (as a client sends) or not (as a server does).
fn frame(opcode: OpCode, payload: &[u8], masked: bool) -> Bytes {
    let mask = masked.then(rand::random::<[u8; 4]>);
    let header = FrameHeader { is_final: true, opcode, mask, ..FrameHeader::default() };
    let mut out = Vec::with_capacity(payload.len() + 14);
    // Formatting into a Vec cannot fail.
    let _ = header.format(payload.len() as u64, &mut out);
    match mask {
        Some(key) => out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4])),
        None => out.extend_from_slice(payload),
    }
    Bytes::from(out)
}

/// A text frame (an event of tollgate's own).
pub fn text_frame(event: &Value, masked: bool) -> Bytes {
    frame(OpCode::Data(Data::Text), event.to_string().as_bytes(), masked)
}

/// The realtime API's `error` event, as a server frame.
pub fn error_event(code: &str, message: &str) -> Bytes {
    let event = serde_json::json!({
        "type": "error",
        "event_id": format!("event_tollgate_{:016x}", rand::random::<u64>()),
        "error": {"type": "invalid_request_error", "code": code, "message": message, "param": null, "event_id": null},
    });
    text_frame(&event, false)
}

/// A close frame with `code` and `reason` (at most 123 bytes, cut at a character boundary).
pub fn close_frame(code: u16, reason: &str, masked: bool) -> Bytes {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(&reason.as_bytes()[..cut]);
    frame(OpCode::Control(Control::Close), &payload, masked)
}

/// The server's answer to a client's close frame whose payload is `payload`: its status code
/// echoed (RFC 6455 §5.5.1), or a close without one when it sent none.
pub fn close_answer(payload: &[u8]) -> Bytes {
    match payload.get(..2) {
        Some(code) => frame(OpCode::Control(Control::Close), code, false),
        None => frame(OpCode::Control(Control::Close), &[], false),
    }
}

/// A `response.cancel` event as a client frame (sent upstream when a turn the server started
/// cannot be paid for).
pub fn cancel_frame() -> Bytes {
    text_frame(&serde_json::json!({"type": "response.cancel"}), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_clients_close_is_answered_with_its_code_or_without_one() {
        assert_eq!(&close_answer(&[0x0f, 0xa1, b'b', b'y', b'e'])[..], &[0x88, 2, 0x0f, 0xa1], "4001 echoed, unmasked");
        assert_eq!(&close_answer(&[])[..], &[0x88, 0]);
    }

    /// The close code and reason a close frame carries.
    fn close_reason(frame: &Frame) -> Option<(u16, String)> {
        let payload = frame.payload();
        let code = u16::from_be_bytes([*payload.first()?, *payload.get(1)?]);
        Some((code, String::from_utf8_lossy(&payload[2..]).into_owned()))
    }

    fn split_all(bytes: &[u8], cut: usize) -> Vec<Frame> {
        let mut s = Splitter::new(1 << 20);
        let mut out = Vec::new();
        for part in [&bytes[..cut], &bytes[cut..]] {
            s.push(part);
            while let Some(f) = s.next_frame().unwrap() {
                out.push(f);
            }
        }
        out
    }

    #[test]
    fn frames_are_split_whole_across_any_cut_and_read_masked_or_not() {
        let create = text_frame(&json!({"type": "response.create", "response": {"modalities": ["text"]}}), true);
        let done = text_frame(
            &json!({"type": "response.done", "response": {"usage": {"input_tokens": 100, "output_tokens": 50,
                "input_token_details": {"cached_tokens": 20, "audio_tokens": 30, "cached_tokens_details": {"audio_tokens": 5}},
                "output_token_details": {"audio_tokens": 40}}}}),
            false,
        );
        let mut both = create.to_vec();
        both.extend_from_slice(&done);
        for cut in 0..both.len() {
            let frames = split_all(&both, cut);
            assert_eq!(frames.len(), 2, "cut at {cut}");
            assert_eq!(client_event(&frames[0]), Event::ResponseCreate);
            let expect = TurnUsage { text_in: 55, audio_in: 25, cached_in: 20, text_out: 10, audio_out: 40 };
            assert_eq!(server_event(&frames[1]), Event::ResponseDone(expect, None));
            assert_eq!(frames[0].bytes, create, "relayed as it came");
        }
        assert_eq!(expect_input(), 100);
    }

    fn expect_input() -> u64 {
        TurnUsage { text_in: 55, audio_in: 25, cached_in: 20, text_out: 10, audio_out: 40 }.input()
    }

    #[test]
    fn a_type_far_into_an_event_is_still_read_and_a_big_frame_is_refused() {
        let late = text_frame(&json!({"event_id": "x".repeat(400), "type": "response.created"}), false);
        assert_eq!(server_event(&split_all(&late, 3)[0]), Event::ResponseCreated(None));
        // A nested "type" before the event's own is not the event's.
        let nested = br#"{"response":{"output":[{"type":"message"}],"usage":{"input_tokens":7}},"type":"response.done"}"#;
        let f = split_all(&frame(OpCode::Data(Data::Text), nested, false), 0);
        assert_eq!(server_event(&f[0]), Event::ResponseDone(TurnUsage { text_in: 7, ..TurnUsage::default() }, None));
        let escaped = br#"{"event_id":"a\"type\":\"x","type":"response.create"}"#;
        assert_eq!(client_event(&split_all(&frame(OpCode::Data(Data::Text), escaped, true), 0)[0]), Event::ResponseCreate);
        let mut s = Splitter::new(10);
        s.push(&text_frame(&json!({"type": "input_audio_buffer.append", "audio": "AAAA"}), true));
        assert!(matches!(s.next_frame(), Err(FrameError::TooLarge(_))));
    }

    proptest::proptest! {
        /// Any bytes, cut anywhere: the splitter never panics, and the frames it gives are the
        /// stream's bytes in order, whole.
        #[test]
        fn any_bytes_cut_anywhere_split_into_their_own_frames(data in proptest::collection::vec(proptest::num::u8::ANY, 0..600), step in 1usize..64) {
            let mut s = Splitter::new(1 << 16);
            let mut out = Vec::new();
            'feed: for chunk in data.chunks(step) {
                s.push(chunk);
                loop {
                    match s.next_frame() {
                        Ok(Some(f)) => {
                            let _ = (client_event(&f), server_event(&f), close_reason(&f));
                            out.extend_from_slice(&f.bytes);
                        }
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
            }
            proptest::prop_assert!(data.starts_with(&out));
        }
    }

    #[test]
    fn a_turn_is_capped_in_the_protocol_the_session_speaks() {
        let read = |b: Bytes| -> Value { serde_json::from_slice(&split_all(&b, 0)[0].payload()).unwrap() };
        let ga = read(session_cap(&json!({"type": "realtime", "max_output_tokens": "inf"}), 4096).unwrap());
        assert_eq!(ga["session"], json!({"type": "realtime", "max_output_tokens": 4096}));
        let beta = read(session_cap(&json!({"object": "realtime.session"}), 4096).unwrap());
        assert_eq!(beta["session"], json!({"max_response_output_tokens": 4096}));
        assert!(session_cap(&json!({"type": "realtime", "max_output_tokens": 100}), 4096).is_none(), "bounded already");
        assert!(session_cap(&json!({"type": "transcription"}), 4096).is_none());
        let create = br#"{"type":"response.create","response":{"max_output_tokens":"inf"}}"#;
        let capped: Value = serde_json::from_slice(&cap_output(create, &Event::ResponseCreate, 10).unwrap()).unwrap();
        assert_eq!(capped["response"]["max_output_tokens"], 10);
        assert!(cap_output(br#"{"type":"response.create","response":{"max_output_tokens":5}}"#, &Event::ResponseCreate, 10).is_none());
    }

    #[test]
    fn close_frames_carry_their_code_and_reason() {
        let frames = split_all(&close_frame(1008, "balance exhausted", false), 1);
        assert!(frames[0].is_close());
        assert_eq!(close_reason(&frames[0]), Some((1008, "balance exhausted".into())));
        let long = "é".repeat(100);
        let f = split_all(&close_frame(1000, &long, true), 0);
        assert!(close_reason(&f[0]).unwrap().1.len() <= 123);
    }
}
