//! Usage as stored and summed: one billed event ([`UsageRecord`]), the owner of a stored
//! response it created, the counters of `/v1/usage` and what their rows are grouped by.
//! Their stored form is `store::usage_codec`'s.

use crate::base::money::usd;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One billed event, as stored and summed by `/v1/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unix milliseconds.
    pub time_ms: u64,
    pub key_id: String,
    pub model: String,
    /// `openai`, `anthropic`, `gemini` or `video`.
    pub protocol: String,
    pub route: String,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// Prompt-cache writes (priced at `cache_write_input`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
    /// nano-USD charged; negative for a refund.
    pub cost_nanos: i64,
    /// What it cost at the price table, when a price multiplier made the charge differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_cost_nanos: Option<i64>,
    pub status: u16,
    pub latency_ms: u64,
    /// Usage was estimated (no usage report seen).
    pub estimated: bool,
    /// Booking sequence number (set by the ledger).
    #[serde(default)]
    pub seq: u64,
    /// The key's balance after this record (set by the ledger).
    #[serde(default)]
    pub balance_after: i64,
    /// The provider that served the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Requests sent upstream for it (more than 1: retried before the first byte).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The stored response the request created (responses API): booking the record makes the
    /// key its owner (see [`ResponseOwner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
    /// The provider's protocol when it is not the client's (`protocol`): a translated request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_protocol: Option<String>,
    /// The purses debited besides the key's own balance: its shared account's, spend windows'
    /// (see [`crate::records::purse::Purse`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub charged: Vec<String>,
    /// The key's tags when the record was written (a later change of the key's tags leaves
    /// them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The model the call asked for, when another served it (`model`): it fell back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_model: Option<String>,
    /// Each model it left for the next, and why (`model:reason`, comma-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallbacks: Option<String>,
    /// Answered from the response cache (`hit`): its tokens are the original answer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// What the cache saved: the original answer's list cost less the hit's (nano-USD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_saved_nanos: Option<i64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Who created a stored response, and where it is stored: tree `response_owners`, keyed by the
/// response id, written in the same commit as the usage record that created it and pruned with
/// it. Only its owner may read, cancel or delete the response, or continue from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseOwner {
    pub key_id: String,
    pub provider: String,
    pub model: String,
    pub time_ms: u64,
    /// The conversation's size as of this response: its input (cache reads and writes
    /// included) and output tokens. A turn that continues it is held for them as input.
    #[serde(default)]
    pub context_tokens: u64,
}

impl UsageRecord {
    /// A usage record of a call of `key_id` to `model` over `protocol` and `route`, now, that
    /// cost nothing and used nothing yet. Status 200, one attempt. The charge floor is the one
    /// place that makes records of calls (`charge::Used`); tests make them here.
    pub fn new(key_id: &str, model: &str, protocol: &str, route: &str) -> UsageRecord {
        UsageRecord {
            time_ms: crate::base::clock::now_ms(),
            key_id: key_id.to_string(),
            model: model.to_string(),
            protocol: protocol.to_string(),
            route: route.to_string(),
            input_tokens: 0,
            cached_tokens: 0,
            cache_write_tokens: 0,
            output_tokens: 0,
            cost_nanos: 0,
            list_cost_nanos: None,
            status: 200,
            latency_ms: 0,
            estimated: false,
            seq: 0,
            balance_after: 0,
            provider: None,
            attempts: 1,
            response_id: None,
            upstream_protocol: None,
            charged: Vec::new(),
            tags: BTreeMap::new(),
            requested_model: None,
            fallbacks: None,
            cache: None,
            cache_saved_nanos: None,
        }
    }

    /// The owner of the stored response this record created, if it created one.
    pub fn owner(&self) -> Option<ResponseOwner> {
        self.response_id.as_ref()?;
        Some(ResponseOwner {
            key_id: self.key_id.clone(),
            provider: self.provider.clone()?,
            model: self.model.clone(),
            time_ms: self.time_ms,
            context_tokens: self.input_total().saturating_add(self.output_tokens),
        })
    }

    /// What it cost at the price table (its charge, when no multiplier applied).
    pub fn list_cost(&self) -> i64 {
        self.list_cost_nanos.unwrap_or(self.cost_nanos)
    }

    /// All input: plain, cache reads and cache writes.
    pub fn input_total(&self) -> u64 {
        self.input_tokens.saturating_add(self.cached_tokens).saturating_add(self.cache_write_tokens)
    }
}

/// The route of a batch's records: its worst case charged at creation, and its settlement.
pub const BATCH_ROUTE: &str = "batch";

/// Counters of `/v1/usage`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub requests: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
    pub output_tokens: u64,
    pub cost_nanos: i64,
    /// What the records cost at the price table (the operator's views show it and the margin).
    #[serde(skip)]
    pub list_cost_nanos: i64,
    /// Of which credits (refunds, adjustments): how many, and their sum (≤ 0).
    #[serde(skip)]
    pub refunds: u64,
    #[serde(skip)]
    pub refunded_nanos: i64,
    /// Of the requests, answers from the response cache, and what they saved (nano-USD at the
    /// price table).
    #[serde(skip)]
    pub cache_hits: u64,
    #[serde(skip)]
    pub cache_saved_nanos: i64,
}

impl Totals {
    /// Count one record (a negative cost is an adjustment: money, not a request). A batch's
    /// settlement giving back what its worst case held beyond its cost is neither a request nor
    /// a refund: with it, the batch counts what it cost (not what it held) as billed.
    pub fn add(&mut self, r: &UsageRecord) {
        if r.cost_nanos >= 0 {
            self.requests += 1;
        } else if r.route != BATCH_ROUTE {
            self.refunds += 1;
            self.refunded_nanos = self.refunded_nanos.saturating_add(r.cost_nanos);
        }
        self.input_tokens = self.input_tokens.saturating_add(r.input_total());
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(r.cached_tokens);
        self.cache_write_input_tokens = self.cache_write_input_tokens.saturating_add(r.cache_write_tokens);
        self.output_tokens = self.output_tokens.saturating_add(r.output_tokens);
        self.cost_nanos = self.cost_nanos.saturating_add(r.cost_nanos);
        self.list_cost_nanos = self.list_cost_nanos.saturating_add(r.list_cost());
        if r.cache.is_some() {
            self.cache_hits += 1;
            self.cache_saved_nanos = self.cache_saved_nanos.saturating_add(r.cache_saved_nanos.unwrap_or(0));
        }
    }

    /// Add another set of counters to these.
    pub fn merge(&mut self, other: &Totals) {
        self.requests = self.requests.saturating_add(other.requests);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(other.cached_input_tokens);
        self.cache_write_input_tokens = self.cache_write_input_tokens.saturating_add(other.cache_write_input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_nanos = self.cost_nanos.saturating_add(other.cost_nanos);
        self.list_cost_nanos = self.list_cost_nanos.saturating_add(other.list_cost_nanos);
        self.refunds = self.refunds.saturating_add(other.refunds);
        self.refunded_nanos = self.refunded_nanos.saturating_add(other.refunded_nanos);
        self.cache_hits = self.cache_hits.saturating_add(other.cache_hits);
        self.cache_saved_nanos = self.cache_saved_nanos.saturating_add(other.cache_saved_nanos);
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_input_tokens": self.cache_write_input_tokens,
            "output_tokens": self.output_tokens,
            "cost": usd(self.cost_nanos),
        })
    }

    /// The operator's view: [`Totals::to_json`], the cost at the price table and the margin
    /// (what was charged beyond it; negative below it).
    pub fn to_json_with_margin(&self) -> serde_json::Value {
        let mut v = self.to_json();
        v["list_cost"] = serde_json::json!(usd(self.list_cost_nanos));
        v["margin"] = serde_json::json!(usd(self.cost_nanos.saturating_sub(self.list_cost_nanos)));
        v["cache_hits"] = serde_json::json!(self.cache_hits);
        v["cache_saved"] = serde_json::json!(usd(self.cache_saved_nanos));
        v
    }
}

/// What the rows of a usage summary are: a record's model, its route, its provider, its day in a
/// timezone (`YYYY-MM-DD`), or its value of one tag (the empty string for records without the
/// tag, or without a provider).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    Model,
    /// The endpoint that made the record (`chat_completions`, `batch`, `realtime`, `video`…).
    Route,
    Provider,
    Day(jiff::tz::TimeZone),
    Tag(String),
    /// The records charged to one purse (an account's `acct:<name>`), by day in a timezone and
    /// model (`<day>\t<model>`); the others under the empty label (a statement's lines).
    Charged(String, jiff::tz::TimeZone),
}

impl Grouping {
    /// `model`, `route`, or `tag:<name>` (percent-decoded); None for anything else.
    pub fn parse(text: &str) -> Option<Grouping> {
        match text {
            "model" => Some(Grouping::Model),
            "route" => Some(Grouping::Route),
            _ => {
                let name = crate::base::text::decode_component(text.strip_prefix("tag:")?);
                (!name.is_empty()).then_some(Grouping::Tag(name))
            }
        }
    }

    /// The row `r` counts in.
    pub fn label<'r>(&self, r: &'r UsageRecord) -> std::borrow::Cow<'r, str> {
        use std::borrow::Cow;
        match self {
            Grouping::Model => Cow::Borrowed(&r.model),
            Grouping::Route => Cow::Borrowed(&r.route),
            Grouping::Provider => Cow::Borrowed(r.provider.as_deref().unwrap_or("")),
            Grouping::Day(tz) => Cow::Owned(crate::base::clock::date_in(r.time_ms / 1000, tz)),
            Grouping::Tag(name) => Cow::Borrowed(r.tags.get(name).map_or("", String::as_str)),
            Grouping::Charged(purse, tz) if r.charged.iter().any(|c| c == purse) => {
                Cow::Owned(format!("{}\t{}", crate::base::clock::date_in(r.time_ms / 1000, tz), r.model))
            }
            Grouping::Charged(..) => Cow::Borrowed(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(route: &str, cost_nanos: i64) -> UsageRecord {
        UsageRecord { cost_nanos, ..UsageRecord::new("k", "m", "openai", route) }
    }

    #[test]
    fn a_batch_counts_what_it_cost_not_what_it_held_and_a_refund_stays_a_refund() {
        let mut t = Totals::default();
        // $1.28 held at creation, $0.0007 spent: the settlement gives back the rest.
        t.add(&record(BATCH_ROUTE, 1_280_000_000));
        t.add(&record(BATCH_ROUTE, 700_000 - 1_280_000_000));
        assert_eq!((t.requests, t.cost_nanos, t.refunds, t.refunded_nanos), (1, 700_000, 0, 0));
        // A failed video task's refund is one.
        t.add(&record("video", -500));
        assert_eq!((t.refunds, t.refunded_nanos), (1, -500));
    }
}
