//! A `webhook` guardrail: the call's texts posted to the operator's service, signed as
//! Standard Webhooks sign (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64
//! HMAC-SHA256 of "id.timestamp.body">`), and its answer `{ action: allow | block | mask,
//! reason?, replacements? }` (`replacements`: the texts as they are to be sent, one for each
//! text posted, when it masks).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// What the service is told of the call besides its texts.
#[derive(Debug, Serialize)]
pub struct Asked<'a> {
    pub phase: &'static str,
    pub protocol: &'a str,
    pub route: &'a str,
    pub model: Option<&'a str>,
    pub key_id: &'a str,
    pub tags: &'a BTreeMap<String, String>,
    pub texts: Vec<&'a str>,
}

/// The service's answer.
#[derive(Debug, Deserialize)]
pub struct Answer {
    pub action: Verdict,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub replacements: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Block,
    Mask,
}

/// Why the service gave no usable answer (never its body: it may quote the texts).
#[derive(Debug, PartialEq, Eq)]
pub enum Failed {
    Timeout,
    Unreachable,
    Status(u16),
    Unreadable,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Timeout => f.write_str("no answer in time"),
            Failed::Unreachable => f.write_str("unreachable"),
            Failed::Status(s) => write!(f, "answered {s}"),
            Failed::Unreadable => f.write_str("answered something that is not {action, reason?, replacements?}"),
        }
    }
}

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 4 << 20;

pub struct Webhook {
    pub url: String,
    secret: Vec<u8>,
    http: reqwest::Client,
    timeout: Duration,
}

impl Webhook {
    pub fn new(url: String, secret: Vec<u8>, http: reqwest::Client, timeout: Duration) -> Webhook {
        Webhook { url, secret, http, timeout }
    }

    /// The Standard Webhooks signature of `body` sent as message `id` at `timestamp` (seconds).
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        crate::base::secrets::webhook_signature(&self.secret, id, timestamp, body)
    }

    /// Ask the service about `asked`, within the guardrail's `timeout_ms`.
    pub async fn ask(&self, asked: &Asked<'_>) -> Result<Answer, Failed> {
        let body = serde_json::to_vec(asked).map_err(|_| Failed::Unreadable)?;
        let id = format!("msg_{}", crate::base::secrets::random_base62(24));
        let timestamp = crate::base::clock::now_ms() / 1000;
        let signature = self.sign(&id, timestamp, &body);
        let sent = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body);
        let call = async {
            let answer = sent.send().await.map_err(|e| if e.is_timeout() { Failed::Timeout } else { Failed::Unreachable })?;
            let status = answer.status().as_u16();
            if !(200..300).contains(&status) {
                return Err(Failed::Status(status));
            }
            if answer.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
                return Err(Failed::Unreadable);
            }
            let bytes = answer.bytes().await.map_err(|_| Failed::Unreadable)?;
            if bytes.len() > MAX_ANSWER_BYTES {
                return Err(Failed::Unreadable);
            }
            serde_json::from_slice::<Answer>(&bytes).map_err(|_| Failed::Unreadable)
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| Failed::Timeout)?
    }
}
