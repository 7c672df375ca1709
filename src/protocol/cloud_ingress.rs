//! Bedrock- and Vertex-format ingress: clients that speak to tollgate as they would to AWS
//! Bedrock's `InvokeModel` (`POST /model/{id}/invoke`, `/invoke-with-response-stream`) or to
//! Vertex AI's Anthropic publisher (`…/publishers/anthropic/models/{m}:rawPredict`,
//! `:streamRawPredict`) — Claude Code with `CLAUDE_CODE_USE_BEDROCK` / `CLAUDE_CODE_USE_VERTEX`,
//! boto3's `bedrock-runtime`, the Anthropic Bedrock and Vertex SDKs. Their bodies are the
//! messages protocol's with the model in the path and `anthropic_version` in the body
//! ([`to_messages`]); a Bedrock stream is answered in AWS event-stream frames, each `chunk`
//! carrying one messages stream event as base64 JSON ([`Frames`]). Pure.

use super::{ApiError, ErrorKind};
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;

/// Which ingress a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    /// `POST /model/{id}/invoke` (`stream: false`) and `/invoke-with-response-stream`.
    BedrockInvoke { stream: bool },
    /// `…:rawPredict` (`stream: false`) and `…:streamRawPredict`.
    VertexRaw { stream: bool },
    /// `…/publishers/anthropic/models/count-tokens:rawPredict`.
    VertexCountTokens,
    /// `POST /model/{id}/converse` (`stream: false`) and `/converse-stream`.
    BedrockConverse { stream: bool },
    /// `…/publishers/google/models/{m}:generateContent` (`stream: false`) and
    /// `:streamGenerateContent`: a generate-content call as it is.
    VertexGemini { stream: bool },
}

/// How an ingress's answer is reshaped on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reshape {
    /// A messages stream as `InvokeModelWithResponseStream`'s `chunk` frames.
    InvokeFrames,
    /// A messages stream as `ConverseStream`'s frames.
    ConverseFrames,
    /// A whole messages answer as a `ConverseResponse`.
    ConverseJson,
}

impl Ingress {
    pub fn label(self) -> &'static str {
        match self {
            Ingress::BedrockInvoke { stream: false } => "bedrock_invoke",
            Ingress::BedrockInvoke { stream: true } => "bedrock_invoke_stream",
            Ingress::VertexRaw { stream: false } => "vertex_raw_predict",
            Ingress::VertexRaw { stream: true } => "vertex_stream_raw_predict",
            Ingress::VertexCountTokens => "vertex_count_tokens",
            Ingress::BedrockConverse { stream: false } => "bedrock_converse",
            Ingress::BedrockConverse { stream: true } => "bedrock_converse_stream",
            Ingress::VertexGemini { stream: false } => "vertex_generate_content",
            Ingress::VertexGemini { stream: true } => "vertex_stream_generate_content",
        }
    }

    /// Whether it is one of Bedrock's (its refusals in Bedrock's error shape).
    pub fn bedrock(self) -> bool {
        matches!(self, Ingress::BedrockInvoke { .. } | Ingress::BedrockConverse { .. })
    }

    /// How its answer is reshaped (None: it goes out as the messages protocol's).
    pub fn reshape(self) -> Option<Reshape> {
        match self {
            Ingress::BedrockInvoke { stream: true } => Some(Reshape::InvokeFrames),
            Ingress::BedrockConverse { stream: true } => Some(Reshape::ConverseFrames),
            Ingress::BedrockConverse { stream: false } => Some(Reshape::ConverseJson),
            _ => None,
        }
    }
}

/// The longest body field name list kept from the client's `anthropic_beta`.
const MAX_BETAS: usize = 32;

/// The messages request an ingress body stands for: `model` set to `model` (the path's;
/// None: the body's own, as count-tokens names it), `anthropic_version` taken out (the
/// provider's own version header is sent), `anthropic_beta` (Bedrock's body form of the beta
/// header) returned apart, and `stream` set when the path says it streams.
pub fn to_messages(body: &[u8], model: Option<&str>, stream: Option<bool>) -> Result<(Bytes, Vec<String>), ApiError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body is not JSON: {e}.")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."));
    };
    obj.remove("anthropic_version");
    let betas: Vec<String> = match obj.remove("anthropic_beta") {
        Some(Value::Array(items)) => {
            items.iter().filter_map(Value::as_str).take(MAX_BETAS).map(|s| crate::base::text::clip(s, 100).into_owned()).collect()
        }
        _ => Vec::new(),
    };
    if let Some(model) = model {
        obj.insert("model".into(), Value::from(model));
    }
    match stream {
        Some(true) => {
            obj.insert("stream".into(), Value::Bool(true));
        }
        Some(false) => {
            obj.remove("stream");
        }
        None => {}
    }
    Ok((Bytes::from(serde_json::to_vec(&v).unwrap_or_default()), betas))
}

/// One AWS event-stream frame: the `chunk` event of a Bedrock stream holding `json`.
fn chunk_frame(json: &[u8], out: &mut Vec<u8>) {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let payload = serde_json::json!({"bytes": base64::engine::general_purpose::STANDARD.encode(json)}).to_string();
    let message = Message::new(Bytes::from(payload))
        .add_header(Header::new(":event-type", HeaderValue::String("chunk".into())))
        .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
        .add_header(Header::new(":message-type", HeaderValue::String("event".into())));
    if let Err(e) = aws_smithy_eventstream::frame::write_message_to(&message, out) {
        log::warn!("bedrock ingress: a frame could not be written: {e}");
    }
}

/// A messages SSE stream rewritten as Bedrock's event-stream frames, as it arrives: for
/// `InvokeModelWithResponseStream` each event's `data` JSON one `chunk` frame (`ping` events
/// are not sent: Bedrock has none); for `ConverseStream`, Converse's events.
pub struct Frames {
    pending: Vec<u8>,
    max_event: usize,
    converse: Option<super::converse::StreamFrames>,
}

impl Frames {
    pub fn new(max_event: usize) -> Frames {
        Frames { pending: Vec::new(), max_event, converse: None }
    }

    /// Frames of `ConverseStream`.
    pub fn converse(max_event: usize) -> Frames {
        Frames { pending: Vec::new(), max_event, converse: Some(super::converse::StreamFrames::default()) }
    }

    /// The frames of the events `chunk` completes (an event cut between chunks waits).
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end.1).collect();
            self.write_event(&event[..end.0], &mut out);
        }
        if self.pending.len() > self.max_event {
            log::warn!("bedrock ingress: a stream event over {} bytes was dropped", self.max_event);
            self.pending.clear();
        }
        Bytes::from(out)
    }

    /// What is left at the end (an event without its blank line).
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        if !rest.iter().all(u8::is_ascii_whitespace) {
            self.write_event(&rest, &mut out);
        }
        Bytes::from(out)
    }

    fn write_event(&mut self, event: &[u8], out: &mut Vec<u8>) {
        let Some(data) = event_data(event) else { return };
        match &mut self.converse {
            Some(c) => {
                if let Ok(v) = serde_json::from_str::<Value>(&data) {
                    c.event(&v, out);
                }
            }
            None => chunk_frame(data.as_bytes(), out),
        }
    }
}

/// The end of the first whole event: (its length without the blank line, with it).
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    let lf = memchr::memmem::find(b, b"\n\n").map(|i| (i, i + 2));
    let crlf = memchr::memmem::find(b, b"\r\n\r\n").map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 < c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

/// An SSE event's `data`, unless it is empty or a `ping`.
fn event_data(event: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(event);
    let mut name = "";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim();
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if data.is_empty() || name == "ping" || data.contains("\"type\":\"ping\"") {
        return None;
    }
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};

    #[test]
    fn an_ingress_body_becomes_a_messages_request() {
        let body = br#"{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["context-1m"],"max_tokens":5,"messages":[]}"#;
        let (out, betas) = to_messages(body, Some("beta-haiku-4-5"), Some(true)).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, serde_json::json!({"model": "beta-haiku-4-5", "max_tokens": 5, "messages": [], "stream": true}));
        assert_eq!(betas, ["context-1m"]);
        let (out, _) = to_messages(br#"{"model":"m","stream":true}"#, None, Some(false)).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), serde_json::json!({"model": "m"}));
        assert_eq!(to_messages(b"[1]", None, None).unwrap_err().kind, ErrorKind::BadRequest);
        assert_eq!(to_messages(b"nope", None, None).unwrap_err().kind, ErrorKind::BadRequest);
    }

    #[test]
    fn a_messages_stream_becomes_chunk_frames_whatever_the_chunking() {
        let sse = "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hé\"}}\r\n\r\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for cut in [1, 7, 50, sse.len()] {
            let mut frames = Frames::new(1 << 20);
            let mut bytes = Vec::new();
            for piece in sse.as_bytes().chunks(cut) {
                bytes.extend_from_slice(&frames.feed(piece));
            }
            bytes.extend_from_slice(&frames.finish());
            let mut buf = bytes::BytesMut::from(&bytes[..]);
            let mut decoder = MessageFrameDecoder::new();
            let mut events = Vec::new();
            while let Ok(DecodedFrame::Complete(m)) = decoder.decode_frame(&mut buf) {
                assert!(m
                    .headers()
                    .iter()
                    .any(|h| h.name().as_str() == ":event-type" && h.value().as_string().map(|s| s.as_str()) == Ok("chunk")));
                let payload: Value = serde_json::from_slice(m.payload()).unwrap();
                let json = base64::engine::general_purpose::STANDARD.decode(payload["bytes"].as_str().unwrap()).unwrap();
                events.push(serde_json::from_slice::<Value>(&json).unwrap());
            }
            let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
            assert_eq!(types, ["message_start", "content_block_delta", "message_stop"], "cut {cut}");
            assert_eq!(events[1]["delta"]["text"], "hé");
        }
    }
}
