//! The OpenAI API's media endpoints, as the mock answers them:
//!
//! * `…/v1/images/generations` (JSON), `…/images/edits` and `…/images/variations` (multipart):
//!   `n` images as `b64_json` (a PNG of `x-mock-image-bytes`, default 1 KiB) or `url`, with
//!   `usage` (`input_tokens` with image tokens for each uploaded image, `output_tokens` 1000 an
//!   image) unless the model's name holds `dall-e` (billed per image: no usage); `stream: true`
//!   sends `partial_images` (default 1) `*.partial_image` events then one `*.completed` event per
//!   image, each with its usage.
//! * `…/v1/audio/speech`: the audio (`audio/mpeg`, `x-mock-speech-bytes`, default 16 KiB) in 8
//!   chunks, holding after the first with `x-mock-hold: T`, cut after N with
//!   `x-mock-cut-after: N`; `stream_format: sse` sends `speech.audio.delta` events and a
//!   `speech.audio.done` with usage.
//! * `…/v1/audio/transcriptions` and `…/translations` (multipart, `file`): the text, with usage
//!   in seconds (16000 bytes a second) for models whose name holds `whisper`, else in tokens;
//!   `verbose_json` adds `duration`, `text`/`srt`/`vtt` are plain text without usage;
//!   `stream: true` sends `transcript.text.delta` events and a `transcript.text.done` with usage.
//! * `…/v1/moderations`: one result per input (one holding `[[flag]]` flagged for violence).
//!
//! The mock records each request with `Fields::recorded`: a form's fields and files (names, file
//! names, types, sizes).

use crate::wire::*;
use base64::Engine;
use bytes::Bytes;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The endpoint a path is for, when it is one of these.
pub(crate) fn endpoint(path: &str) -> Option<&'static str> {
    [
        "/v1/images/generations",
        "/images/edits",
        "/images/variations",
        "/audio/speech",
        "/audio/transcriptions",
        "/audio/translations",
        "/v1/moderations",
    ]
    .into_iter()
    .find(|e| path.ends_with(e))
}

/// A request's fields: the JSON body's members, or a form's text fields (and its files).
pub(crate) struct Fields {
    values: Map<String, Value>,
    files: Vec<Value>,
}

impl Fields {
    pub(crate) fn model(&self) -> Option<&str> {
        self.str("model")
    }

    /// What the upstream received, as recorded: the fields, and each file's name, type and size.
    pub(crate) fn recorded(&self) -> Value {
        json!({"fields": self.values, "files": self.files})
    }

    pub(crate) fn streamed(&self) -> bool {
        self.flag("stream")
    }

    fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).and_then(Value::as_str)
    }

    fn num(&self, name: &str) -> Option<u64> {
        match self.values.get(name)? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }

    fn flag(&self, name: &str) -> bool {
        match self.values.get(name) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true",
            _ => false,
        }
    }

    fn file_bytes(&self) -> u64 {
        self.files.iter().filter_map(|f| f.get("len").and_then(Value::as_u64)).sum()
    }
}

/// A multipart body's text fields and files (each file's bytes only counted).
async fn form(req: &RequestHeader, body: Bytes) -> Option<Fields> {
    let boundary = header(req, "content-type").and_then(|t| multer::parse_boundary(t).ok())?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut parts = multer::Multipart::new(stream, boundary);
    let (mut values, mut files) = (Map::new(), Vec::new());
    while let Ok(Some(field)) = parts.next_field().await {
        let name = field.name().unwrap_or_default().to_string();
        match field.file_name().map(str::to_string) {
            Some(filename) => {
                let content_type = field.content_type().map(ToString::to_string);
                let len = field.bytes().await.ok()?.len();
                files.push(json!({"name": name, "filename": filename, "content_type": content_type, "len": len}));
            }
            None => {
                values.insert(name, Value::String(field.text().await.ok()?));
            }
        }
    }
    Some(Fields { values, files })
}

fn png(bytes: usize) -> String {
    let mut image = b"\x89PNG\r\n\x1a\n".to_vec();
    image.resize(bytes.max(8), b'm');
    base64::engine::general_purpose::STANDARD.encode(image)
}

/// A media request's fields, from its JSON body or its form; None when neither can be read.
pub(crate) async fn read(req: &RequestHeader, body: Vec<u8>) -> Option<Fields> {
    if header(req, "content-type").is_some_and(|t| t.starts_with("multipart/")) {
        return form(req, Bytes::from(body)).await;
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(values)) => Some(Fields { values, files: Vec::new() }),
        _ => None,
    }
}

/// Answer a media endpoint (`endpoint`, see [`endpoint`]); `hold`: the speech waits on it after
/// its first chunk (`x-mock-hold`).
pub(crate) async fn answer(
    session: &mut Session,
    req: &RequestHeader,
    endpoint: &str,
    fields: &Fields,
    hold: Option<Arc<Notify>>,
) -> Result<()> {
    match endpoint {
        "/audio/speech" => speech(session, req, fields, hold).await,
        "/audio/transcriptions" | "/audio/translations" => transcription(session, fields).await,
        "/v1/moderations" => {
            // One result per input; an input holding `[[flag]]` is flagged for violence.
            let inputs: Vec<Value> = match fields.values.get("input") {
                Some(Value::Array(items)) => items.clone(),
                Some(one) => vec![one.clone()],
                None => vec![Value::Null],
            };
            let results: Vec<Value> = inputs
                .iter()
                .map(|i| {
                    let flagged = i.to_string().contains("[[flag]]");
                    let score = if flagged { 0.97 } else { 0.001 };
                    json!({"flagged": flagged, "categories": {"violence": flagged}, "category_scores": {"violence": score}})
                })
                .collect();
            let b = json!({"id": "modr-mock", "model": fields.str("model"), "results": results});
            send(session, 200, "application/json", b.to_string().into(), &[]).await
        }
        _ => images(session, req, endpoint, fields).await,
    }
}

/// Speech: audio in chunks as it is "made" (or its SSE events).
async fn speech(session: &mut Session, req: &RequestHeader, fields: &Fields, hold: Option<Arc<Notify>>) -> Result<()> {
    let characters = fields.str("input").map_or(0, |t| t.chars().count() as u64);
    if fields.str("stream_format") == Some("sse") {
        let mut events = String::new();
        for i in 0..4 {
            events.push_str(&format!("data: {}\n\n", json!({"type": "speech.audio.delta", "audio": png(64 + i)})));
        }
        let usage = json!({"input_tokens": characters.div_ceil(4), "output_tokens": 400, "total_tokens": characters.div_ceil(4) + 400});
        events.push_str(&format!("data: {}\n\n", json!({"type": "speech.audio.done", "usage": usage})));
        return send(session, 200, "text/event-stream", events.into(), &[]).await;
    }
    let total = num(req, "x-mock-speech-bytes").unwrap_or(16 << 10) as usize;
    let mut h = ResponseHeader::build(200, Some(4))?;
    h.insert_header("content-type", "audio/mpeg")?;
    h.insert_header("transfer-encoding", "chunked")?;
    service_headers(&mut h)?;
    session.write_response_header(Box::new(h), false).await?;
    let chunk = total.div_ceil(8).max(1);
    let mut sent = 0;
    let mut i = 0;
    while sent < total {
        let n = chunk.min(total - sent);
        session.write_response_body(Some(Bytes::from(vec![b'a' + (i % 26) as u8; n])), false).await?;
        sent += n;
        i += 1;
        if num(req, "x-mock-cut-after").is_some_and(|c| i as u64 >= c) {
            return Err(pingora_error::Error::explain(pingora_error::ErrorType::ConnectionClosed, "mock: cut"));
        }
        if let (1, Some(notify)) = (i, &hold) {
            let _ = tokio::time::timeout(Duration::from_secs(30), notify.notified()).await;
        }
    }
    session.write_response_body(None, true).await
}

/// Images: generated, edited or varied; whole or streamed.
async fn images(session: &mut Session, req: &RequestHeader, endpoint: &str, fields: &Fields) -> Result<()> {
    let n = fields.num("n").unwrap_or(1);
    let model = fields.str("model").unwrap_or("gpt-image-1");
    let per_image = model.contains("dall-e");
    let image_bytes = num(req, "x-mock-image-bytes").unwrap_or(1024) as usize;
    let prompt_tokens = fields.str("prompt").map_or(0, |p| p.len() as u64).div_ceil(4);
    let image_tokens = 100 * fields.files.len() as u64;
    let usage = |images: u64| {
        json!({
            "input_tokens": prompt_tokens + image_tokens,
            "input_tokens_details": {"text_tokens": prompt_tokens, "image_tokens": image_tokens},
            "output_tokens": 1000 * images,
            "total_tokens": prompt_tokens + image_tokens + 1000 * images,
        })
    };
    let kind = if endpoint.ends_with("/generations") { "image_generation" } else { "image_edit" };
    if fields.flag("stream") {
        let mut events = String::new();
        for i in 0..fields.num("partial_images").unwrap_or(1) {
            let e = json!({"type": format!("{kind}.partial_image"), "partial_image_index": i, "b64_json": png(image_bytes / 2)});
            events.push_str(&format!("event: {kind}.partial_image\ndata: {e}\n\n"));
        }
        for _ in 0..n {
            let e = json!({"type": format!("{kind}.completed"), "b64_json": png(image_bytes), "created_at": now(), "size": "1024x1024", "quality": "high", "background": "opaque", "output_format": "png", "usage": usage(1)});
            events.push_str(&format!("event: {kind}.completed\ndata: {e}\n\n"));
        }
        return send(session, 200, "text/event-stream", events.into(), &[]).await;
    }
    let url = fields.str("response_format") == Some("url");
    let data: Vec<Value> = (0..n)
        .map(|i| if url { json!({"url": format!("https://images.mock.invalid/{i}.png")}) } else { json!({"b64_json": png(image_bytes)}) })
        .collect();
    let mut b = json!({"created": now(), "data": data});
    if !per_image {
        b["usage"] = usage(n);
        b["size"] = json!("1024x1024");
        b["quality"] = json!("high");
    }
    send(session, 200, "application/json", b.to_string().into(), &[]).await
}

/// Transcriptions and translations.
async fn transcription(session: &mut Session, fields: &Fields) -> Result<()> {
    let Some(audio) = fields.files.iter().find(|f| f.get("name").and_then(Value::as_str) == Some("file")) else {
        let b = json!({"error": {"message": "mock: no 'file' part", "type": "invalid_request_error"}});
        return send(session, 400, "application/json", b.to_string().into(), &[]).await;
    };
    let bytes = audio.get("len").and_then(Value::as_u64).unwrap_or(0).max(fields.file_bytes().min(1));
    let seconds = bytes.div_ceil(16_000);
    let text = "The mock heard every word.";
    let model = fields.str("model").unwrap_or("whisper-1");
    let usage = if model.contains("whisper") {
        json!({"type": "duration", "seconds": seconds})
    } else {
        let audio_tokens = seconds * 10;
        json!({"type": "tokens", "input_tokens": audio_tokens + 5, "input_token_details": {"text_tokens": 5, "audio_tokens": audio_tokens}, "output_tokens": 7, "total_tokens": audio_tokens + 12})
    };
    if fields.flag("stream") {
        let mut events = String::new();
        for word in text.split_inclusive(' ') {
            events.push_str(&format!("data: {}\n\n", json!({"type": "transcript.text.delta", "delta": word})));
        }
        events.push_str(&format!("data: {}\n\n", json!({"type": "transcript.text.done", "text": text, "usage": usage})));
        return send(session, 200, "text/event-stream", events.into(), &[]).await;
    }
    match fields.str("response_format").unwrap_or("json") {
        "text" | "srt" | "vtt" => send(session, 200, "text/plain", Bytes::from(text), &[]).await,
        "verbose_json" => {
            let b = json!({"task": "transcribe", "language": "english", "duration": seconds as f64, "text": text, "segments": [], "usage": usage});
            send(session, 200, "application/json", b.to_string().into(), &[]).await
        }
        _ => send(session, 200, "application/json", json!({"text": text, "usage": usage}).to_string().into(), &[]).await,
    }
}
