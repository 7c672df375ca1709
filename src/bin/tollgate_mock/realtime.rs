//! The realtime API, as the mock answers it: `…/v1/realtime?model=M` upgraded to a WebSocket
//! (the upstream key checked first), `session.created` at once, then a scripted session:
//! `session.update` → `session.updated`, `conversation.item.create` → `conversation.item.created`,
//! `input_audio_buffer.commit` → `input_audio_buffer.committed` (and a turn of its own when the
//! session's `turn_detection` is `server_vad`), and each `response.create` a
//! turn — `response.created`, three text deltas (or audio and transcript deltas when the session
//! or the response asks for audio), or a `get_weather` function call when tools are offered and
//! the user asked about the weather — ended by `response.done` with its usage: input growing
//! with each turn (half of it cached after the first), audio input for audio appended, output
//! split into text and audio, never past the response's or the session's `max_output_tokens`.
//! Responses asked with `metadata.mock: together` are each announced (`response.created`) at
//! once and run once the client sends an item whose text is `[go]`, as the service runs
//! responses out of band beside each other. Markers in the user's text: `[big]` makes the turn's usage a
//! million tokens each way, `[hold]` stops the turn after its first delta (until the client
//! leaves), `[cut]` closes the connection after the first delta without `response.done`.

use bytes::Bytes;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use serde_json::{json, Value};
use tollgate::protocol::realtime::{close_frame, text_frame, Splitter};

/// Whether a request opens a realtime session.
pub(crate) fn is_upgrade(req: &RequestHeader, path: &str) -> bool {
    path.ends_with("/v1/realtime")
        && req.headers.get("upgrade").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The scripted session.
struct Script {
    session: Value,
    turns: u64,
    last_text: String,
    tools: bool,
    audio_bytes: u64,
    /// Responses announced together, waiting for `[go]`.
    together: Vec<(String, Value)>,
}

fn send(event: Value) -> Bytes {
    text_frame(&event, false)
}

/// Run one session on an upgraded connection.
pub(crate) async fn session(session: &mut Session, req: &RequestHeader) -> Result<()> {
    let key = req.headers.get("sec-websocket-key").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut h = ResponseHeader::build(101, Some(4))?;
    h.insert_header("upgrade", "websocket")?;
    h.insert_header("connection", "Upgrade")?;
    h.insert_header("sec-websocket-accept", accept)?;
    if let Some(p) = req.headers.get("sec-websocket-protocol").and_then(|v| v.to_str().ok()) {
        if let Some(first) = p.split(',').map(str::trim).find(|p| !p.is_empty()) {
            h.insert_header("sec-websocket-protocol", first)?;
        }
    }
    session.write_response_header(Box::new(h), false).await?;
    let model = req.uri.query().and_then(|q| q.split('&').find_map(|p| p.strip_prefix("model="))).unwrap_or("mock-realtime").to_string();
    let mut session_state =
        json!({"id": "sess_mock", "object": "realtime.session", "type": "realtime", "model": model, "output_modalities": ["text"]});
    // A test's session that starts with server voice activity detection on (the SDK's
    // `x-stainless-*` headers are the ones a gateway passes on).
    if req.headers.get("x-stainless-mock-vad").is_some() {
        session_state["turn_detection"] = json!({"type": "server_vad"});
    }
    let mut script =
        Script { session: session_state, turns: 0, last_text: String::new(), tools: false, audio_bytes: 0, together: Vec::new() };
    session
        .write_response_body(Some(send(json!({"type": "session.created", "event_id": "event_0", "session": script.session}))), false)
        .await?;
    let mut frames = Splitter::new(64 << 20);
    while let Some(chunk) = session.read_request_body().await? {
        frames.push(&chunk);
        while let Some(frame) =
            frames.next_frame().map_err(|e| pingora_error::Error::explain(pingora_error::ErrorType::ReadError, format!("{e:?}")))?
        {
            if frame.is_close() {
                let _ = session.write_response_body(Some(close_frame(1000, "bye", false)), true).await;
                return Ok(());
            }
            if !frame.is_text() {
                continue;
            }
            let Ok(event) = serde_json::from_slice::<Value>(&frame.payload()) else { continue };
            match event.get("type").and_then(Value::as_str).unwrap_or_default() {
                "session.update" => {
                    if let (Some(mine), Some(theirs)) = (script.session.as_object_mut(), event.get("session").and_then(Value::as_object)) {
                        for (k, v) in theirs {
                            mine.insert(k.clone(), v.clone());
                        }
                    }
                    script.tools = script.session.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
                    session.write_response_body(Some(send(json!({"type": "session.updated", "session": script.session}))), false).await?;
                }
                "conversation.item.create" if event.pointer("/item/content/0/text").and_then(Value::as_str) == Some("[go]") => {
                    for (id, create) in std::mem::take(&mut script.together) {
                        if !run_turn(session, &mut script, &create, id).await? {
                            return Ok(());
                        }
                    }
                }
                "conversation.item.create" => {
                    let item = event.get("item").cloned().unwrap_or(Value::Null);
                    if let Some(text) = item.pointer("/content/0/text").and_then(Value::as_str) {
                        script.last_text = text.to_string();
                    }
                    if item.get("type").and_then(Value::as_str) == Some("function_call_output") {
                        script.last_text = format!("The tool said: {}", item.get("output").and_then(Value::as_str).unwrap_or_default());
                    }
                    session.write_response_body(Some(send(json!({"type": "conversation.item.created", "item": item}))), false).await?;
                }
                "input_audio_buffer.append" => {
                    script.audio_bytes += event.get("audio").and_then(Value::as_str).map_or(0, |a| a.len() as u64);
                }
                "input_audio_buffer.commit" => {
                    session.write_response_body(Some(send(json!({"type": "input_audio_buffer.committed"}))), false).await?;
                    // With server voice activity detection the service answers the audio itself
                    // (and, as it does, runs the turn out although a client cancels it).
                    if script.session.pointer("/turn_detection/type").and_then(Value::as_str) == Some("server_vad")
                        && !turn(session, &mut script, &json!({})).await?
                    {
                        return Ok(());
                    }
                }
                // Responses out of band asked to run together (`metadata.mock: together`): each
                // is announced at once and runs once the client says `[go]` — as the service runs
                // them beside each other, deterministically.
                "response.create" if event.pointer("/response/metadata/mock").and_then(Value::as_str) == Some("together") => {
                    let id = announce(session, &mut script).await?;
                    script.together.push((id, event.clone()));
                }
                "response.create" if !turn(session, &mut script, &event).await? => return Ok(()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// One turn; false when the session is to end (a `[cut]` or `[hold]` turn).
async fn turn(session: &mut Session, script: &mut Script, create: &Value) -> Result<bool> {
    let id = announce(session, script).await?;
    run_turn(session, script, create, id).await
}

/// A turn's `response.created`; its id.
async fn announce(session: &mut Session, script: &mut Script) -> Result<String> {
    script.turns += 1;
    let id = format!("resp_mock_{}", script.turns);
    session
        .write_response_body(Some(send(json!({"type": "response.created", "response": {"id": id, "status": "in_progress"}}))), false)
        .await?;
    Ok(id)
}

/// A turn announced as `id`, run to its `response.done`; false when the session is to end.
async fn run_turn(session: &mut Session, script: &mut Script, create: &Value, id: String) -> Result<bool> {
    let modalities = create
        .pointer("/response/output_modalities")
        .or_else(|| script.session.get("output_modalities"))
        .cloned()
        .unwrap_or(json!(["text"]));
    let audio = modalities.as_array().is_some_and(|m| m.iter().any(|x| x == "audio"));
    let text = std::mem::take(&mut script.last_text);
    let output = if script.tools && text.contains("weather") {
        let args = ["{\"city\":", " \"Paris\"}"];
        for delta in args {
            session.write_response_body(Some(send(json!({"type": "response.function_call_arguments.delta", "response_id": id, "call_id": "call_mock_1", "delta": delta}))), false).await?;
        }
        json!([{"type": "function_call", "name": "get_weather", "call_id": "call_mock_1", "arguments": args.concat()}])
    } else {
        // `[[echo]] text` in the last item: the text again, in pieces of 4 characters.
        let words: Vec<String> = match text.find("[[echo]]") {
            Some(at) => text[at + 8..].trim_start().chars().collect::<Vec<_>>().chunks(4).map(|c| c.iter().collect()).collect(),
            None => ["Hello", " from", " realtime"].iter().map(|w| w.to_string()).collect(),
        };
        for (i, word) in words.iter().enumerate() {
            if audio {
                let chunk = base64_audio(i);
                session
                    .write_response_body(
                        Some(send(json!({"type": "response.output_audio.delta", "response_id": id, "delta": chunk}))),
                        false,
                    )
                    .await?;
                session
                    .write_response_body(
                        Some(send(json!({"type": "response.output_audio_transcript.delta", "response_id": id, "delta": word}))),
                        false,
                    )
                    .await?;
            } else {
                session
                    .write_response_body(Some(send(json!({"type": "response.output_text.delta", "response_id": id, "delta": word}))), false)
                    .await?;
            }
            if i == 0 && text.contains("[cut]") {
                return Ok(false);
            }
            if i == 0 && text.contains("[hold]") {
                // Until the client leaves: nothing more comes.
                while session.read_request_body().await?.is_some() {}
                return Ok(false);
            }
        }
        json!([{"type": "message", "role": "assistant", "content": [{"type": if audio { "output_audio" } else { "output_text" }, "text": words.concat()}]}])
    };
    let n = script.turns;
    let big = text.contains("[big]");
    let (input, cached) = if big { (1_000_000, 0) } else { (100 + 60 * n, if n > 1 { 50 * (n - 1) } else { 0 }) };
    let audio_in = (script.audio_bytes / 100).min(input - cached);
    script.audio_bytes = 0;
    // The output stops where the response or the session says (`max_output_tokens`, or the
    // beta protocol's session `max_response_output_tokens`), as the service's does.
    let cap = create
        .pointer("/response/max_output_tokens")
        .or_else(|| script.session.get("max_output_tokens"))
        .or_else(|| script.session.get("max_response_output_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX);
    let (text_out, audio_out) = if big {
        (1_000_000u64.min(cap), 0)
    } else if audio {
        (12, 90)
    } else {
        (12, 0)
    };
    let usage = json!({
        "total_tokens": input + text_out + audio_out,
        "input_tokens": input,
        "output_tokens": text_out + audio_out,
        "input_token_details": {"text_tokens": input - audio_in, "audio_tokens": audio_in, "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0}},
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    });
    let done = json!({"type": "response.done", "response": {"id": id, "object": "realtime.response", "status": "completed", "output": output, "usage": usage}});
    session.write_response_body(Some(send(done)), false).await?;
    Ok(true)
}

/// A few bytes of "audio", base64.
fn base64_audio(i: usize) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(vec![i as u8; 480])
}
