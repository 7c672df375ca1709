//! The mock video service: TC3-signed calls (the signature checked with tollgate's own
//! signer), its jobs and their progress, and the video downloads.

use crate::video_bytes::*;
use crate::wire::*;
use bytes::Bytes;
use pingora_error::Result;
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;

/// The Tencent-Cloud-API-3.0-style video service.
///
/// `POST /` with `X-TC-Action`: every call's TC3 signature is checked against the mock's
/// secret. A job advances one step per describe: WAIT, RUN (Progress 50), DONE. Markers in the
/// Prompt steer it: `[submit-error]` refuses the submission, `[throttle-once]` answers
/// RequestLimitExceeded to the first submission, `[slow-submit]` creates the job but answers
/// the submission 3 s late, `[fail]` ends in FAIL, `[expired]` gives a
/// result URL that answers 403, `[big]` makes the result 20 MiB, `[hold:T]` stays RUN until `POST /__mock/release?token=T`.
/// `GET /__mock/tc_calls` lists the calls (action, payload); `GET /__mock/video/{job}.mp4`
/// serves the result (Range supported).
pub(crate) struct TcMock {
    pub secret_id: String,
    pub secret_key: String,
    pub(crate) jobs: Mutex<HashMap<String, TcJob>>,
    pub(crate) calls: Mutex<Vec<Value>>,
    pub(crate) throttled: Mutex<std::collections::HashSet<String>>,
}

#[derive(Clone)]
pub(crate) struct TcJob {
    pub(crate) prompt: String,
    pub(crate) describes: u32,
    pub(crate) released: bool,
}

impl TcMock {
    pub(crate) fn release(&self, token: &str) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs.values_mut() {
            if job.prompt.contains(&format!("[hold:{token}]")) {
                job.released = true;
            }
        }
    }

    pub(crate) fn error(code: &str, message: &str) -> Value {
        json!({"Response": {"Error": {"Code": code, "Message": message}, "RequestId": "mock-req"}})
    }

    /// Check the TC3 headers and signature exactly as the real service would.
    pub(crate) fn check_signature(&self, req: &RequestHeader, action: &str, body: &[u8]) -> Result<(), Value> {
        let host = header(req, "host").unwrap_or_default();
        let auth = header(req, "authorization").unwrap_or_default();
        let timestamp: u64 = header(req, "x-tc-timestamp").and_then(|t| t.parse().ok()).unwrap_or(0);
        if header(req, "x-tc-version").is_none() || header(req, "x-tc-region").is_none() {
            return Err(Self::error("MissingParameter", "X-TC-Version and X-TC-Region are required"));
        }
        if header(req, "content-type") != Some(tollgate::video::tc3::CONTENT_TYPE) {
            return Err(Self::error("InvalidParameter", "wrong content type"));
        }
        if now().abs_diff(timestamp) > 300 {
            return Err(Self::error("AuthFailure.SignatureExpire", "timestamp too far off"));
        }
        let service = host.split(['.', ':']).next().unwrap_or_default();
        let expected = tollgate::video::tc3::authorization(&tollgate::video::tc3::SignInput {
            secret_id: &self.secret_id,
            secret_key: &self.secret_key,
            host,
            service,
            timestamp,
            payload: body,
            action: Some(action),
        });
        if auth != expected {
            return Err(Self::error("AuthFailure.SignatureFailure", "signature mismatch"));
        }
        Ok(())
    }

    pub(crate) fn call(&self, req: &RequestHeader, action: &str, body: &[u8]) -> Value {
        let payload: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(json!({"action": action, "payload": payload}));
        if let Err(e) = self.check_signature(req, action, body) {
            return e;
        }
        let host = header(req, "host").unwrap_or("127.0.0.1").to_string();
        if action.starts_with("Submit") && action.ends_with("Job") {
            let prompt = payload.get("Prompt").and_then(Value::as_str).unwrap_or_default().to_string();
            if prompt.contains("[submit-error]") {
                return Self::error("InvalidParameterValue.Prompt", "mock: the prompt was rejected");
            }
            if prompt.contains("[throttle-once]") {
                let mut throttled = self.throttled.lock().unwrap_or_else(|p| p.into_inner());
                if throttled.insert(prompt.clone()) {
                    return Self::error("RequestLimitExceeded", "mock: slow down");
                }
            }
            let job_id = format!("job-{:x}", rand::random::<u64>());
            let job = TcJob { prompt, describes: 0, released: false };
            self.jobs.lock().unwrap_or_else(|p| p.into_inner()).insert(job_id.clone(), job);
            return json!({"Response": {"JobId": job_id, "RequestId": "mock-req"}});
        }
        if action.starts_with("Describe") && action.ends_with("Job") {
            let job_id = payload.get("JobId").and_then(Value::as_str).unwrap_or_default().to_string();
            let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let Some(job) = jobs.get_mut(&job_id) else {
                return Self::error("ResourceNotFound.JobNotExist", "mock: no such job");
            };
            job.describes += 1;
            let held = job.prompt.contains("[hold:") && !job.released;
            let response = match job.describes {
                1 => json!({"Status": "WAIT"}),
                2 => json!({"Status": "RUN", "Progress": 50}),
                _ if held => json!({"Status": "RUN", "Progress": 60}),
                _ if job.prompt.contains("[fail]") => {
                    json!({"Status": "FAIL", "ErrorCode": "FailedOperation.Moderation", "ErrorMessage": "mock: content rejected"})
                }
                _ => {
                    let dir = if job.prompt.contains("[expired]") { "expired" } else { "video" };
                    json!({"Status": "DONE", "ResultVideoUrl": format!("http://{host}/__mock/{dir}/{job_id}.mp4")})
                }
            };
            let mut response = response;
            response["RequestId"] = json!("mock-req");
            return json!({ "Response": response });
        }
        Self::error("InvalidAction", "mock: unknown action")
    }

    pub(crate) async fn serve_video(&self, session: &mut Session, req: &RequestHeader, file: &str, expired: bool) -> Result<()> {
        let prompt = file
            .strip_suffix(".mp4")
            .and_then(|job| self.jobs.lock().unwrap_or_else(|p| p.into_inner()).get(job).map(|j| j.prompt.clone()));
        let Some(prompt) = prompt.filter(|_| !expired) else {
            let status = if expired { 403 } else { 404 };
            return send(session, status, "application/xml", Bytes::from_static(b"<Error>AccessDenied</Error>"), &[]).await;
        };
        let video = mock_video_of(if prompt.contains("[big]") { MOCK_BIG_VIDEO_LEN } else { MOCK_VIDEO_LEN });
        let range = header(req, "range").and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-'));
        let Some((start, end)) = range else {
            return send(session, 200, "video/mp4", video.into(), &[]).await;
        };
        let len = video.len();
        let start: usize = start.parse().unwrap_or(0);
        let end: usize = end.parse().map_or(len - 1, |e: usize| e.min(len - 1));
        if start > end {
            return send(session, 416, "text/plain", Bytes::new(), &[]).await;
        }
        let content_range = format!("bytes {start}-{end}/{len}");
        send(session, 206, "video/mp4", Bytes::copy_from_slice(&video[start..=end]), &[("content-range", &content_range)]).await
    }
}
