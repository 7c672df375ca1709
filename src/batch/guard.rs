//! A batch's lines read by the key's guardrails at submission (`checks::guard`): a line one
//! blocks is neither sent nor charged — it is in the batch's error file and failed count; a
//! masked one is sent masked. Checked where the input is read (a blocking thread), each line's
//! check awaited on the runtime that submitted it.

use crate::checks::guard::{self, Applied, Call, Refusal, Screening};
use crate::observe::metrics::Metrics;
use crate::protocol::ApiError;
use crate::records::key::KeyRecord;
use serde_json::Value;
use std::sync::Arc;

/// What a line came to.
pub(super) enum Line {
    /// Sent as it came.
    Kept,
    /// Sent masked (the line again).
    Masked(Vec<u8>),
    /// Blocked by this guardrail.
    Blocked(String),
}

pub(super) struct LineGuard {
    pub applied: Applied,
    pub metrics: Arc<Metrics>,
    pub handle: tokio::runtime::Handle,
    /// What the guardrails cost (`price_per_check`), every line together.
    pub price_nanos: i64,
}

impl LineGuard {
    /// Read a line's `body` (from a blocking thread). A guardrail that fails closed refuses the
    /// whole batch (503: it may be submitted again).
    pub fn line(&mut self, key: &KeyRecord, endpoint: &str, model: &str, raw: &[u8]) -> Result<Line, ApiError> {
        if !self.applied.input() {
            return Ok(Line::Kept);
        }
        let Ok(mut value) = serde_json::from_slice::<Value>(raw) else { return Ok(Line::Kept) };
        let Some(body) = value.get_mut("body") else { return Ok(Line::Kept) };
        let call = Call { protocol: "openai", route: endpoint, model: Some(model), key_id: &key.id, tags: &key.policy.tags };
        let mut screening = Screening::default();
        let mut texts = guard::texts_of(body);
        let screened = self.handle.block_on(guard::screen(&self.applied, false, &call, &mut texts, &mut screening, &self.metrics));
        self.price_nanos = self.price_nanos.saturating_add(screening.price_nanos);
        match screened {
            Ok(false) => Ok(Line::Kept),
            Ok(true) => Ok(Line::Masked(serde_json::to_vec(&value).unwrap_or_else(|_| raw.to_vec()))),
            Err(Refusal::Blocked { guardrail, .. }) => Ok(Line::Blocked(guardrail)),
            Err(unavailable) => Err(unavailable.error()),
        }
    }
}
