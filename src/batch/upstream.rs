//! The provider's batch API as tollgate calls it with the provider's own key: upload the input
//! file (`POST /v1/files`, `purpose: batch`), create, retrieve and cancel the batch
//! (`/v1/batches`), download its output and error files (`/v1/files/{id}/content`, streamed to
//! an unnamed temporary file). Control calls, a few a minute: `reqwest`, not the relay's pool.

use crate::config::ProviderConfig;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use std::time::Duration;

/// A failed call: the upstream's status and message, or none when it was not reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub status: Option<u16>,
    pub message: String,
}

impl CallError {
    /// Worth trying again later: not reached, throttled, or a server error.
    pub fn is_transient(&self) -> bool {
        self.status.is_none_or(|s| s == 408 || s == 429 || s >= 500)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "the provider answered {s}: {}", self.message),
            None => write!(f, "the provider could not be reached: {}", self.message),
        }
    }
}

fn unreached(e: reqwest::Error) -> CallError {
    CallError { status: None, message: e.to_string() }
}

/// One provider, as its batch calls address it.
pub struct Provider {
    base: String,
    auth: String,
    client: reqwest::Client,
}

impl Provider {
    /// The provider's address and its key `key_index` (the first when there is no such key).
    pub fn new(config: &ProviderConfig, key_index: usize) -> Result<Provider, CallError> {
        let unusable = |message: String| CallError { status: None, message };
        let url = &config.base_url;
        let scheme = if url.tls { "https" } else { "http" };
        let base = format!("{scheme}://{}{}", url.host_header(), url.prefix);
        let key = config.api_keys.get(key_index).or(config.api_keys.first()).ok_or_else(|| unusable("the provider has no key".into()))?;
        let roots = config
            .ca
            .iter()
            .flat_map(|c| c.iter())
            .map(|cert| reqwest::Certificate::from_der(cert.borrow_raw_cert()).map_err(|e| unusable(format!("the provider's CA: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let client = crate::base::outbound::Outbound {
            connect: Some(Duration::from_millis(config.connect_timeout_ms.max(1))),
            total: Some(Duration::from_secs(config.read_timeout_secs.max(60))),
            roots,
            ..Default::default()
        }
        .client()
        .map_err(|e| unusable(format!("batch client: {e}")))?;
        Ok(Provider { base, auth: format!("Bearer {key}"), client })
    }

    async fn json(&self, req: reqwest::RequestBuilder) -> Result<Value, CallError> {
        let resp = req.header(http::header::AUTHORIZATION, &self.auth).send().await.map_err(unreached)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(unreached)?;
        if !(200..300).contains(&status) {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned());
            return Err(CallError { status: Some(status), message });
        }
        serde_json::from_slice(&body).map_err(|e| CallError { status: Some(status), message: format!("not JSON: {e}") })
    }

    /// Upload a batch input file (the first `len` bytes of `file`, streamed from disk); the
    /// provider's file id.
    pub async fn upload(&self, filename: &str, file: std::sync::Arc<std::fs::File>, len: u64) -> Result<String, CallError> {
        let body = reqwest::Body::wrap_stream(crate::base::spool::chunks(file, len, 256 << 10));
        let part = reqwest::multipart::Part::stream_with_length(body, len)
            .file_name(filename.to_string())
            .mime_str("application/jsonl")
            .map_err(unreached)?;
        let form = reqwest::multipart::Form::new().text("purpose", "batch").part("file", part);
        let v = self.json(self.client.post(format!("{}/v1/files", self.base)).multipart(form)).await?;
        v.get("id").and_then(Value::as_str).map(str::to_string).ok_or(CallError { status: Some(200), message: "the file has no id".into() })
    }

    /// Create the batch; the provider's batch object.
    pub async fn create(&self, input_file: &str, endpoint: &str, window: &str, metadata: Option<&Value>) -> Result<Value, CallError> {
        let mut body = serde_json::json!({"input_file_id": input_file, "endpoint": endpoint, "completion_window": window});
        if let Some(m) = metadata {
            body["metadata"] = m.clone();
        }
        self.json(self.client.post(format!("{}/v1/batches", self.base)).json(&body)).await
    }

    pub async fn retrieve(&self, id: &str) -> Result<Value, CallError> {
        self.json(self.client.get(format!("{}/v1/batches/{}", self.base, crate::base::text::encode_component(id)))).await
    }

    pub async fn cancel(&self, id: &str) -> Result<Value, CallError> {
        self.json(self.client.post(format!("{}/v1/batches/{}/cancel", self.base, crate::base::text::encode_component(id)))).await
    }

    /// A file's bytes, written to an unnamed temporary file as they come; it and its length.
    pub async fn download(&self, id: &str) -> Result<(std::fs::File, u64), CallError> {
        let url = format!("{}/v1/files/{}/content", self.base, crate::base::text::encode_component(id));
        let resp = self.client.get(url).header(http::header::AUTHORIZATION, &self.auth).send().await.map_err(unreached)?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let body = resp.bytes().await.unwrap_or_default();
            return Err(CallError { status: Some(status), message: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned() });
        }
        let local = |e: std::io::Error| CallError { status: None, message: format!("temporary file: {e}") };
        let file = tempfile::tempfile().map_err(local)?;
        let mut out = tokio::fs::File::from_std(file);
        let mut len = 0u64;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk: Bytes = chunk.map_err(unreached)?;
            tokio::io::AsyncWriteExt::write_all(&mut out, &chunk).await.map_err(local)?;
            len += chunk.len() as u64;
        }
        tokio::io::AsyncWriteExt::flush(&mut out).await.map_err(local)?;
        Ok((out.into_std().await, len))
    }
}
