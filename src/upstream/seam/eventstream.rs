//! AWS event-stream frames (Bedrock's `InvokeModelWithResponseStream`) to the messages
//! protocol's SSE: each `chunk` event's `bytes` (base64) is one Anthropic stream event's JSON,
//! sent on as `event: <type>` / `data: <json>`; an exception frame (a throttle, a model stream
//! error inside the stream) becomes the protocol's `error` event. Frames are read with the AWS
//! SDK's own decoder (prelude, headers, payload, both CRCs checked).

use super::Decode;
use crate::translate::sse;
use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// The frames of one answer, read as they come (a frame cut between chunks waits for the
/// rest), each handed to the caller with the SSE it writes: what `InvokeModel`'s and
/// `ConverseStream`'s decoders share.
#[derive(Default)]
pub struct Frames {
    decoder: MessageFrameDecoder,
    buffer: BytesMut,
    /// A frame failed its checks: the rest of the answer is not read (one error event was sent).
    broken: bool,
}

impl Frames {
    /// The SSE `each` writes for the whole frames `chunk` completes.
    pub fn read(&mut self, chunk: &[u8], mut each: impl FnMut(&Message, &mut Vec<u8>)) -> Bytes {
        if self.broken {
            return Bytes::new();
        }
        self.buffer.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            match self.decoder.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Complete(message)) => each(&message, &mut out),
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => {
                    log::warn!("bedrock: an event-stream frame failed its checks ({e}); the answer is cut there");
                    error_event("api_error", "The upstream service's stream could not be read.", &mut out);
                    self.broken = true;
                    self.buffer = BytesMut::new();
                    break;
                }
            }
        }
        Bytes::from(out)
    }
}

/// A decoded stream's header: SSE, its length unknown.
pub fn sse_header(header: &mut pingora_http::ResponseHeader) {
    header.remove_header(&http::header::CONTENT_LENGTH);
    if header.insert_header(http::header::CONTENT_TYPE, "text/event-stream").is_err() {
        log::debug!("content type not set");
    }
}

/// Decodes one streamed `InvokeModel` answer.
#[derive(Default)]
pub struct EventStreamToSse {
    frames: Frames,
}

impl Decode for EventStreamToSse {
    fn header(&self, header: &mut pingora_http::ResponseHeader) {
        sse_header(header);
    }

    fn decode(&mut self, chunk: &[u8]) -> Bytes {
        self.frames.read(chunk, sse_of)
    }

    fn finish(&mut self) -> Bytes {
        Bytes::new()
    }
}

/// A frame header's string value.
pub fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message.headers().iter().find(|h| h.name().as_str() == name).and_then(|h| match h.value() {
        HeaderValue::String(s) => Some(s.as_str()),
        _ => None,
    })
}

/// One frame as SSE: a chunk's event, or an exception's error event.
fn sse_of(message: &Message, out: &mut Vec<u8>) {
    if header(message, ":message-type") != Some("event") {
        exception_event(message, out);
        return;
    }
    if header(message, ":event-type") != Some("chunk") {
        return;
    }
    let payload: Value = serde_json::from_slice(message.payload()).unwrap_or_default();
    let Some(event) = payload.get("bytes").and_then(Value::as_str).and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
    else {
        return;
    };
    let kind = serde_json::from_slice::<Value>(&event)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .filter(|t| t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    // The JSON as sent, on one line (a newline inside would end the data line).
    let line: Vec<u8> = event.iter().map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }).collect();
    if let (Some(kind), Ok(data)) = (kind, std::str::from_utf8(&line)) {
        sse::write(out, Some(&kind), data);
    }
}

/// An exception frame (`:message-type` `exception` or `error`) as the messages protocol's error
/// event, its message scrubbed; any other frame writes nothing.
pub fn exception_event(message: &Message, out: &mut Vec<u8>) {
    if !matches!(header(message, ":message-type"), Some("exception" | "error")) {
        return;
    }
    let kind = header(message, ":exception-type").or(header(message, ":error-code")).unwrap_or("internalServerException");
    let payload: Value = serde_json::from_slice(message.payload()).unwrap_or_default();
    let said = payload
        .get("message")
        .or(payload.get("Message"))
        .and_then(Value::as_str)
        .unwrap_or("The upstream service failed during the answer.");
    error_event(error_type(kind), &crate::protocol::upstream_error::scrub(said), out);
}

/// The messages protocol's error type for a Bedrock exception.
pub fn error_type(exception: &str) -> &'static str {
    match exception.trim_end_matches("Exception").to_ascii_lowercase().as_str() {
        "throttling" | "toomanyrequests" => "rate_limit_error",
        "validation" => "invalid_request_error",
        "accessdenied" => "permission_error",
        "serviceunavailable" | "modelnotready" => "overloaded_error",
        _ => "api_error",
    }
}

fn error_event(kind: &str, message: &str, out: &mut Vec<u8>) {
    sse::write_json(out, Some("error"), &serde_json::json!({"type": "error", "error": {"type": kind, "message": message}}));
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_types::event_stream::Header;

    fn frame(message: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        aws_smithy_eventstream::frame::write_message_to(message, &mut out).unwrap();
        out
    }

    fn chunk(event: &str) -> Vec<u8> {
        let payload = serde_json::json!({"bytes": base64::engine::general_purpose::STANDARD.encode(event), "p": "abcd"}).to_string();
        frame(
            &Message::new(payload)
                .add_header(Header::new(":event-type", HeaderValue::String("chunk".into())))
                .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
                .add_header(Header::new(":message-type", HeaderValue::String("event".into()))),
        )
    }

    #[test]
    fn chunk_frames_become_sse_events_whatever_the_cuts_between_reads() {
        let mut wire = chunk(r#"{"type":"message_start","message":{"usage":{"input_tokens":12}}}"#);
        wire.extend(chunk(r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"hi\nthere"}}"#));
        let expected = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12}}}\n\n\
                        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\\nthere\"}}\n\n";
        for step in [1, 7, 64, wire.len()] {
            let mut decoder = EventStreamToSse::default();
            let mut out = Vec::new();
            for piece in wire.chunks(step) {
                out.extend_from_slice(&decoder.decode(piece));
            }
            assert_eq!(String::from_utf8(out).unwrap(), expected, "read {step} bytes at a time");
        }
    }

    #[test]
    fn an_exception_frame_is_an_error_event_and_a_corrupt_frame_ends_the_answer() {
        let exception = frame(
            &Message::new(r#"{"message":"Too many tokens, please wait"}"#)
                .add_header(Header::new(":exception-type", HeaderValue::String("throttlingException".into())))
                .add_header(Header::new(":message-type", HeaderValue::String("exception".into()))),
        );
        let out = EventStreamToSse::default().decode(&exception);
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(text.starts_with("event: error\ndata: "), "{text}");
        assert!(text.contains(r#""type":"rate_limit_error""#) && text.contains("Too many tokens"), "{text}");
        let mut corrupt = chunk(r#"{"type":"ping"}"#);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        let mut decoder = EventStreamToSse::default();
        let text = String::from_utf8(decoder.decode(&corrupt).to_vec()).unwrap();
        assert!(text.contains("could not be read"), "{text}");
        assert!(decoder.decode(&chunk(r#"{"type":"ping"}"#)).is_empty(), "nothing after a corrupt frame");
        assert_eq!(error_type("modelStreamErrorException"), "api_error");
        assert_eq!(error_type("validationException"), "invalid_request_error");
    }
}
