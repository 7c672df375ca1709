//! The audit trail's entry: a balance moved by an administrator, as stored.

use crate::base::clock::now_ms;
use crate::base::money::usd;
use serde::{Deserialize, Serialize};

/// A balance moved by an administrator (`balance_delta`), kept for the audit trail
/// (`GET /admin/audit`), written with the move itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Unix milliseconds.
    pub time_ms: u64,
    /// `key` or `account`.
    pub kind: String,
    /// The key's id or the account's name.
    pub id: String,
    /// nano-USD.
    pub delta: i64,
    pub balance_before: i64,
    pub balance_after: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The store's number of the entry (set when read; a page's position with `time_ms`).
    #[serde(default, skip_serializing)]
    pub seq: u64,
}

impl AuditEntry {
    /// Its position in the trail.
    pub fn cursor(&self) -> crate::records::log::Cursor {
        crate::records::log::Cursor { time_ms: self.time_ms, seq: self.seq }
    }

    /// The entry for `delta` on the purse `id` (a key id or `acct:<name>`) that left it at
    /// `balance_after`.
    pub fn new(id: &str, delta: i64, balance_after: i64, reason: Option<&str>) -> AuditEntry {
        let (kind, id) = match id.strip_prefix("acct:") {
            Some(name) => ("account", name),
            None => ("key", id),
        };
        AuditEntry {
            time_ms: now_ms(),
            kind: kind.into(),
            id: id.into(),
            delta,
            balance_before: balance_after.saturating_sub(delta),
            balance_after,
            reason: reason.map(str::to_string),
            seq: 0,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "object": "audit_entry", "time": crate::protocol::rfc3339(self.time_ms / 1000), "time_ms": self.time_ms,
            "kind": self.kind, "id": self.id, "delta": usd(self.delta),
            "balance_before": usd(self.balance_before), "balance_after": usd(self.balance_after), "reason": self.reason,
        })
    }
}
