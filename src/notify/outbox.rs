//! The outbox: every alert decided is written before it is sent (a job of the store's,
//! kind `webhook`: sled on one node, the shared database in a fleet), once per receiver
//! whatever the nodes that decide it, and sent from there — signed as Standard Webhooks sign,
//! again with backoff until it is answered 2xx or a day has passed, each attempt logged.

use crate::config::notifications::NotificationConfig;
use crate::store::{JobRow, JobStore, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The store's kind of these jobs.
pub const KIND: &str = "webhook";
/// How long an alert is tried.
const GIVE_UP_SECS: u64 = 86_400;
/// The waits between attempts (the last repeats).
const BACKOFF_SECS: [u64; 8] = [5, 30, 120, 600, 1_800, 3_600, 7_200, 14_400];
/// One attempt's limit.
const ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One alert to one receiver, as kept until it is delivered or given up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// The message id (`webhook-id`, the same on every attempt) and the job's id.
    pub id: String,
    pub notification: String,
    /// What the alert is about, once per what (`budget.threshold:<purse>:<threshold>`, …).
    pub event: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The key (its id) or the account (`acct:<name>`) it is about: who may see it.
    pub owner: String,
    /// The body sent, the same bytes on every attempt.
    pub payload: String,
    pub created_at: u64,
    pub attempts: u32,
    pub next_at: u64,
    /// `pending`, `delivered` or `failed` (given up after a day).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<u64>,
}

impl Delivery {
    /// The message id of `event` for `notification`: the same whichever node decides it.
    pub fn id_of(notification: &str, event: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{notification}\n{event}").as_bytes());
        format!("msg_{}", digest[..16].iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    fn row(&self) -> Result<JobRow, StoreError> {
        Ok(JobRow {
            kind: KIND,
            id: self.id.clone(),
            owner: self.owner.clone(),
            created_at: self.created_at,
            open: self.status == "pending",
            record: serde_json::to_string(self).map_err(|e| StoreError::Corrupt(format!("alert {}: {e}", self.id)))?,
        })
    }
}

/// How long an alert is kept once it was decided (delivered or given up by then: a day of
/// retries): 90 days, longer than any window or period it can be about.
pub const KEPT_SECS: u64 = 90 * 86_400;

/// Where alerts are kept and sent from.
pub struct Outbox {
    jobs: Arc<dyn JobStore>,
    http: reqwest::Client,
}

impl Outbox {
    pub fn new(jobs: Arc<dyn JobStore>) -> Outbox {
        let http = crate::base::outbound::Outbound { total: Some(ATTEMPT_TIMEOUT), ..Default::default() }.client().unwrap_or_default();
        Outbox { jobs, http }
    }

    /// Keep `d` to be sent, unless it is kept already (by this node or another): true when it
    /// was new.
    pub async fn enqueue(&self, d: &Delivery) -> Result<bool, StoreError> {
        if self.jobs.get(&d.id).await?.is_some() {
            return Ok(false);
        }
        match self.jobs.put(&d.row()?).await {
            Ok(()) => Ok(true),
            // Another node wrote it first (and holds it).
            Err(StoreError::Shared(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Send what is due (everything pending, with `all`: at a start), each to its receiver.
    pub async fn deliver(&self, receivers: &[NotificationConfig], now: u64, all: bool) -> Result<(), StoreError> {
        for record in self.jobs.open(KIND).await? {
            let Ok(mut d) = serde_json::from_str::<Delivery>(&record) else {
                log::error!("notifications: an unreadable alert in the outbox is skipped");
                continue;
            };
            if d.status != "pending" || (!all && d.next_at > now) {
                continue;
            }
            let Some(receiver) = receivers.iter().find(|r| r.name == d.notification) else {
                d.status = "failed".into();
                d.last_error = Some("its notification is no longer configured".into());
                self.write(&d).await?;
                continue;
            };
            self.attempt(receiver, &mut d, now).await;
            self.write(&d).await?;
        }
        Ok(())
    }

    async fn write(&self, d: &Delivery) -> Result<(), StoreError> {
        match self.jobs.put(&d.row()?).await {
            // Another node took it over (this one stalled): it sends it from now on.
            Err(StoreError::Shared(e)) => {
                log::warn!("notifications: {e}");
                Ok(())
            }
            other => other,
        }
    }

    /// One attempt: delivered on 2xx; else tried again after the next wait, or given up.
    async fn attempt(&self, receiver: &NotificationConfig, d: &mut Delivery, now: u64) {
        d.attempts += 1;
        let timestamp = crate::base::clock::now_unix();
        let signature = crate::base::secrets::webhook_signature(&receiver.secret, &d.id, timestamp, d.payload.as_bytes());
        let sent = self
            .http
            .post(&receiver.url)
            .header("content-type", "application/json")
            .header("webhook-id", &d.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(d.payload.clone())
            .send()
            .await;
        let outcome = match sent {
            Ok(r) if r.status().is_success() => Ok(r.status().as_u16()),
            Ok(r) => Err(format!("answered {}", r.status().as_u16())),
            Err(e) if e.is_timeout() => Err("no answer in time".to_string()),
            Err(_) => Err("unreachable".to_string()),
        };
        match outcome {
            Ok(status) => {
                log::info!(
                    "notifications: {} {} to {} ({}): delivered ({status}), attempt {}",
                    d.kind,
                    d.id,
                    receiver.name,
                    d.event,
                    d.attempts
                );
                d.status = "delivered".into();
                d.delivered_at = Some(now);
                d.last_error = None;
            }
            Err(why) => {
                let wait = BACKOFF_SECS[(d.attempts as usize - 1).min(BACKOFF_SECS.len() - 1)];
                let give_up = now.saturating_sub(d.created_at) + wait > GIVE_UP_SECS;
                log::warn!(
                    "notifications: {} {} to {} ({}): attempt {} failed: {why}; {}",
                    d.kind,
                    d.id,
                    receiver.name,
                    d.event,
                    d.attempts,
                    if give_up { "given up after a day".to_string() } else { format!("tried again in {wait} s") }
                );
                d.last_error = Some(why);
                d.next_at = now + wait;
                if give_up {
                    d.status = "failed".into();
                }
            }
        }
    }

    /// Forget the alerts delivered or given up more than [`KEPT_SECS`] after they were
    /// decided (what they were about has long ended: every alert names its window, day or
    /// period, so none is decided again): how many.
    pub async fn prune(&self, now: u64) -> Result<usize, StoreError> {
        self.jobs.prune_closed(KIND, now.saturating_sub(KEPT_SECS), 10_000).await
    }

    /// The alerts about `owner` (a key id or `acct:<name>`), newest first.
    pub async fn of(&self, owner: &str, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        Ok(self.jobs.of_owner(KIND, owner, None, limit).await?.iter().filter_map(|r| serde_json::from_str(r).ok()).collect())
    }
}
