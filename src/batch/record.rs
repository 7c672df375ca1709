//! A batch as tollgate keeps it (the JSON text of its job row) and as the API shows it.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The job kind of batches in the job store.
pub const KIND: &str = "batch";

/// Until the upstream confirmed it: shown as `validating`. Left so by a node that died, a batch
/// is failed and refunded, never submitted twice.
pub const SUBMITTING: &str = "submitting";

/// The statuses after which nothing more happens upstream.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "expired" | "cancelled")
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub id: String,
    /// The key that created it: the only one that sees it.
    pub owner: String,
    pub created_at: u64,
    pub endpoint: String,
    pub input_file_id: String,
    pub completion_window: String,
    #[serde(default)]
    pub metadata: Option<Value>,
    /// The one model its lines call, as the client names it.
    pub model: String,
    /// The provider it was submitted to, and which of its keys.
    pub provider: String,
    #[serde(default)]
    pub key_index: usize,
    pub status: String,
    #[serde(default)]
    pub upstream_id: Option<String>,
    #[serde(default)]
    pub upstream_input_file: Option<String>,
    /// The provider's output and error files of an ended batch, until they are the key's.
    #[serde(default)]
    pub upstream_output_file: Option<String>,
    #[serde(default)]
    pub upstream_error_file: Option<String>,
    #[serde(default)]
    pub counts: Counts,
    /// The key's own files holding the output and the errors, once the batch ended.
    #[serde(default)]
    pub output_file_id: Option<String>,
    #[serde(default)]
    pub error_file_id: Option<String>,
    #[serde(default)]
    pub errors: Option<Value>,
    /// `in_progress_at`, `finalizing_at`, `completed_at`, `failed_at`, `expired_at`,
    /// `cancelling_at`, `cancelled_at`, `expires_at`: Unix seconds.
    #[serde(default)]
    pub times: BTreeMap<String, u64>,
    /// What was charged when it was accepted (its worst case at the batch prices, before its
    /// price multiplier).
    pub hold_nanos: i64,
    /// The price multiplier its owner paid at creation (its settlement charges at the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_multiplier: Option<crate::base::money::Multiplier>,
    #[serde(default)]
    pub charged_to: Vec<String>,
    /// Settled from its output: what it cost, and the tokens of its answers.
    #[serde(default)]
    pub settled: bool,
    #[serde(default)]
    pub cost_nanos: i64,
    #[serde(default)]
    pub usage: (u64, u64, u64),
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub last_polled_at: u64,
    /// Lines a guardrail blocked at submission (custom_id, guardrail): never sent nor charged;
    /// in the batch's error file and its failed count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<(String, String)>,
    /// What the guardrails' checks at submission cost (`price_per_check`), billed with it.
    #[serde(default)]
    pub guard_nanos: i64,
}

impl Batch {
    /// The error file's lines of the lines a guardrail blocked (the provider's error file's
    /// shape).
    pub fn blocked_lines(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (custom_id, guardrail) in &self.blocked {
            let line = json!({
                "id": format!("batch_req_{}", crate::base::secrets::random_base62(24)),
                "custom_id": custom_id,
                "response": null,
                "error": {"code": "content_policy_violation", "message": format!("The request was blocked by the gateway's guardrail '{guardrail}'.")},
            });
            out.extend(serde_json::to_vec(&line).unwrap_or_default());
            out.push(b'\n');
        }
        out
    }

    /// Still to be worked on: not ended, or ended and not yet settled.
    pub fn open(&self) -> bool {
        !is_terminal(&self.status) || !self.settled
    }

    /// As the API shows it.
    pub fn view(&self) -> Value {
        let status = if self.status == SUBMITTING { "validating" } else { self.status.as_str() };
        let time = |name: &str| self.times.get(name).copied();
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": self.errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": time("in_progress_at"),
            "expires_at": time("expires_at"),
            "finalizing_at": time("finalizing_at"),
            "completed_at": time("completed_at"),
            "failed_at": time("failed_at"),
            "expired_at": time("expired_at"),
            "cancelling_at": time("cancelling_at"),
            "cancelled_at": time("cancelled_at"),
            "request_counts": self.counts,
            "metadata": self.metadata,
        })
    }

    /// Take the upstream's view of it: status, counts, times, errors.
    pub fn take_upstream(&mut self, up: &Value) {
        if let Some(status) = up.get("status").and_then(Value::as_str) {
            if matches!(
                status,
                "validating" | "in_progress" | "finalizing" | "completed" | "failed" | "expired" | "cancelling" | "cancelled"
            ) {
                self.status = status.to_string();
            }
        }
        if let Some(c) = up.get("request_counts") {
            let n = |name: &str| c.get(name).and_then(Value::as_u64).unwrap_or(0);
            let blocked = self.blocked.len() as u64;
            self.counts = Counts { total: n("total") + blocked, completed: n("completed"), failed: n("failed") + blocked };
        }
        for name in
            ["in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at"]
        {
            if let Some(at) = up.get(name).and_then(Value::as_u64) {
                self.times.insert(name.to_string(), at);
            }
        }
        if let Some(errors) = up.get("errors").filter(|e| !e.is_null()) {
            self.errors = Some(errors.clone());
        }
    }
}
