//! The OpenAI batch API, as the mock answers it (under any path prefix):
//!
//! * `POST …/v1/files` (multipart `purpose`, `file`): the file kept in memory; its object.
//! * `GET …/v1/files/{id}/content`: its bytes.
//! * `POST …/v1/batches`: a batch of a kept file, `validating`. Its `metadata` steers it:
//!   `mock_seconds` (default 0) it stays `in_progress` at least that long; `mock_expire: "true"`
//!   it expires instead of completing, half of its lines done.
//! * `GET …/v1/batches/{id}`: the first retrieve finds it `in_progress`; a later one after
//!   `mock_seconds` finds it `completed` with an output file (a line per request, with `usage`:
//!   `prompt_tokens` 10 + the body's length / 10, `completion_tokens` 20 + the line's index,
//!   never above its `max_completion_tokens`/`max_tokens`/`max_output_tokens`; the responses
//!   API's names for a `/v1/responses` batch; embeddings without output) and, for lines whose
//!   body holds `"mock_fail": true`, an error file (status 400).
//! * `POST …/v1/batches/{id}/cancel`: `cancelling`; the next retrieve finds it `cancelled`
//!   with the first half of its lines done.

use crate::wire::*;
use bytes::Bytes;
use pingora_error::Result;
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A batch-API path: the operation and its id.
pub(crate) enum Op {
    Upload,
    Content(String),
    Create,
    Retrieve(String),
    Cancel(String),
}

pub(crate) fn op(method: &str, path: &str) -> Option<Op> {
    let (_, tail) = path.split_once("/v1/")?;
    match (method, tail) {
        ("POST", "files") => Some(Op::Upload),
        ("POST", "batches") => Some(Op::Create),
        ("GET", t) if t.starts_with("files/") && t.ends_with("/content") => {
            Some(Op::Content(t.trim_start_matches("files/").trim_end_matches("/content").to_string()))
        }
        ("GET", t) if t.starts_with("batches/") => Some(Op::Retrieve(t.trim_start_matches("batches/").to_string())),
        ("POST", t) if t.starts_with("batches/") && t.ends_with("/cancel") => {
            Some(Op::Cancel(t.trim_start_matches("batches/").trim_end_matches("/cancel").to_string()))
        }
        _ => None,
    }
}

struct MockBatch {
    object: Value,
    input: Vec<u8>,
    created: std::time::Instant,
    retrieves: u32,
    cancel_asked: bool,
}

#[derive(Default)]
pub(crate) struct BatchMock {
    files: Mutex<HashMap<String, Vec<u8>>>,
    batches: Mutex<HashMap<String, MockBatch>>,
    next: AtomicU64,
}

fn error(status: u16, message: &str) -> (u16, Value) {
    (status, json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}))
}

/// The multipart form's `file` bytes and `purpose`.
async fn upload_form(req: &RequestHeader, body: Vec<u8>) -> Option<(Vec<u8>, String, String)> {
    let boundary = header(req, "content-type").and_then(|t| multer::parse_boundary(t).ok())?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(Bytes::from(body)) });
    let mut parts = multer::Multipart::new(stream, boundary);
    let (mut file, mut purpose, mut name) = (None, String::new(), String::new());
    while let Ok(Some(field)) = parts.next_field().await {
        match field.name() {
            Some("file") => {
                name = field.file_name().unwrap_or("file").to_string();
                file = Some(field.bytes().await.ok()?.to_vec());
            }
            Some("purpose") => purpose = field.text().await.ok()?,
            _ => {}
        }
    }
    Some((file?, purpose, name))
}

impl BatchMock {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-mock-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    pub(crate) async fn answer(&self, session: &mut Session, req: &RequestHeader, op: Op, body: Vec<u8>) -> Result<()> {
        let (status, answer) = match op {
            Op::Upload => match upload_form(req, body).await {
                Some((bytes, purpose, filename)) => {
                    let id = self.id("file");
                    let object = json!({"id": id, "object": "file", "bytes": bytes.len(), "created_at": now(), "filename": filename, "purpose": purpose});
                    self.files.lock().unwrap().insert(id, bytes);
                    (200, object)
                }
                None => error(400, "mock: a file upload is a form with 'purpose' and 'file'"),
            },
            Op::Content(id) => {
                let bytes = self.files.lock().unwrap().get(&id).cloned();
                return match bytes {
                    Some(b) => send(session, 200, "application/octet-stream", Bytes::from(b), &[]).await,
                    None => {
                        let (s, b) = error(404, "mock: no such file");
                        send(session, s, "application/json", b.to_string().into(), &[]).await
                    }
                };
            }
            Op::Create => self.create(&body),
            Op::Retrieve(id) => self.retrieve(&id),
            Op::Cancel(id) => self.cancel(&id),
        };
        send(session, status, "application/json", answer.to_string().into(), &[]).await
    }

    fn create(&self, body: &[u8]) -> (u16, Value) {
        let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let Some(file) = asked.get("input_file_id").and_then(Value::as_str) else { return error(400, "mock: input_file_id is required") };
        let Some(input) = self.files.lock().unwrap().get(file).cloned() else { return error(404, "mock: no such input file") };
        let total = input.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
        let id = self.id("batch");
        let object = json!({
            "id": id, "object": "batch", "endpoint": asked["endpoint"], "errors": null, "input_file_id": file,
            "completion_window": asked["completion_window"], "status": "validating", "output_file_id": null, "error_file_id": null,
            "created_at": now(), "expires_at": now() + 86400,
            "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": asked.get("metadata").cloned().unwrap_or(Value::Null),
        });
        let batch = MockBatch { object: object.clone(), input, created: std::time::Instant::now(), retrieves: 0, cancel_asked: false };
        self.batches.lock().unwrap().insert(id, batch);
        (200, object)
    }

    fn cancel(&self, id: &str) -> (u16, Value) {
        let mut batches = self.batches.lock().unwrap();
        let Some(b) = batches.get_mut(id) else { return error(404, "mock: no such batch") };
        b.cancel_asked = true;
        b.object["status"] = json!("cancelling");
        b.object["cancelling_at"] = json!(now());
        (200, b.object.clone())
    }

    fn retrieve(&self, id: &str) -> (u16, Value) {
        let mut batches = self.batches.lock().unwrap();
        let Some(b) = batches.get_mut(id) else { return error(404, "mock: no such batch") };
        b.retrieves += 1;
        let status = b.object["status"].as_str().unwrap_or_default().to_string();
        if matches!(status.as_str(), "completed" | "cancelled" | "expired" | "failed") {
            return (200, b.object.clone());
        }
        let meta = |name: &str| b.object["metadata"].get(name).and_then(Value::as_str).map(str::to_string);
        let wait = meta("mock_seconds").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let due = b.retrieves >= 2 && b.created.elapsed().as_secs() >= wait;
        let lines: Vec<Vec<u8>> = b.input.split(|c| *c == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
        let (end, done) = if b.cancel_asked {
            ("cancelled", lines.len() / 2)
        } else if due && meta("mock_expire").as_deref() == Some("true") {
            ("expired", lines.len() / 2)
        } else if due {
            ("completed", lines.len())
        } else {
            b.object["status"] = json!("in_progress");
            b.object["in_progress_at"] = json!(now());
            return (200, b.object.clone());
        };
        let endpoint = b.object["endpoint"].as_str().unwrap_or_default().to_string();
        let (mut output, mut errors, mut failed) = (Vec::new(), Vec::new(), 0);
        for (i, raw) in lines.iter().take(done).enumerate() {
            let line: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
            let (out, ok) = answer_line(i, &line, &endpoint);
            let target = if ok { &mut output } else { &mut errors };
            failed += usize::from(!ok);
            target.extend_from_slice(out.to_string().as_bytes());
            target.push(b'\n');
        }
        let mut files = self.files.lock().unwrap();
        let mut keep = |bytes: Vec<u8>| {
            (!bytes.is_empty()).then(|| {
                let id = format!("file-mock-out-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                files.insert(id.clone(), bytes);
                id
            })
        };
        b.object["output_file_id"] = json!(keep(output));
        b.object["error_file_id"] = json!(keep(errors));
        b.object["status"] = json!(end);
        b.object[format!("{end}_at")] = json!(now());
        b.object["request_counts"] = json!({"total": lines.len(), "completed": done - failed, "failed": failed});
        (200, b.object.clone())
    }
}

/// The output (or error) line of request `i`, and whether it succeeded.
fn answer_line(i: usize, line: &Value, endpoint: &str) -> (Value, bool) {
    let body = &line["body"];
    let custom_id = line["custom_id"].clone();
    let request_id = format!("req_mock_{i}");
    if body.get("mock_fail").and_then(Value::as_bool) == Some(true) {
        let answer = json!({"error": {"message": "mock: this request failed", "type": "invalid_request_error"}});
        return (
            json!({"id": format!("batch_req_{i}"), "custom_id": custom_id, "response": {"status_code": 400, "request_id": request_id, "body": answer}, "error": null}),
            false,
        );
    }
    let model = body["model"].clone();
    let prompt = 10 + body.to_string().len() as u64 / 10;
    let most =
        ["max_completion_tokens", "max_tokens", "max_output_tokens"].iter().filter_map(|f| body.get(*f).and_then(Value::as_u64)).min();
    let completion = (20 + i as u64).min(most.unwrap_or(u64::MAX));
    let answer = match endpoint {
        "/v1/embeddings" => {
            json!({"object": "list", "model": model, "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt}})
        }
        "/v1/responses" => json!({"id": format!("resp_mock_{i}"), "object": "response", "model": model, "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": format!("batch answer {i}")}]}],
            "usage": {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}}),
        _ => json!({"id": format!("chatcmpl-mock-{i}"), "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("batch answer {i}")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    };
    (
        json!({"id": format!("batch_req_{i}"), "custom_id": custom_id, "response": {"status_code": 200, "request_id": request_id, "body": answer}, "error": null}),
        true,
    )
}
