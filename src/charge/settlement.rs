//! Settlement: what a call used becomes its usage record here, and only here, and is debited
//! once.

use crate::base::money::Multiplier;
use crate::base::usage::Usage;
use crate::billing::ledger::{Hold, Ledger, Refused};
use crate::records::purse::Purse;
use crate::records::usage::{ResponseOwner, UsageRecord};
use crate::store::StoreError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Who pays for a call and what its record is filed under.
#[derive(Debug, Clone, Copy)]
pub struct Payer<'a> {
    pub key_id: &'a str,
    /// The key's tags when the call was made.
    pub tags: &'a BTreeMap<String, String>,
    /// The model as the client named it (a tool call: its prefixed tool name).
    pub model: &'a str,
    /// `openai`, `anthropic`, `gemini`, `mcp`, `video`.
    pub protocol: &'a str,
    /// The route label of the record (`chat_completions`, `realtime`, `mcp_tool_call`, …).
    pub route: &'a str,
    /// The price multiplier it pays at (`Charge::rate`; a settled hold pays at the one it was
    /// held at, whatever this says).
    pub rate: Multiplier,
}

/// What a call of a key is paid from (its purses, `Charge::purses`) and at which price
/// multiplier (`Charge::rate`): what a kind that charges up front (a video task, a batch) is
/// handed.
#[derive(Debug, Clone)]
pub struct Payment {
    pub purses: Vec<Purse>,
    pub rate: Multiplier,
    /// The model rules of the plans it pays under (its checks read them).
    pub plan_models: Vec<crate::policy::plan::PlanModels>,
}

/// What a call used and cost, as its kind knows it.
#[derive(Debug, Clone)]
pub struct Used {
    pub usage: Usage,
    /// nano-USD at the price table (the payer's multiplier applies to it); negative for a
    /// refund.
    pub cost_nanos: i64,
    /// What was already charged for this call, at the price table (a batch's worst case, a
    /// video task's price): the multiplier applies to the call's total, so that its charges
    /// add up to exactly the multiplier times its cost.
    pub prior_list_nanos: i64,
    pub status: u16,
    pub latency_ms: u64,
    /// Estimated: no usage was reported.
    pub estimated: bool,
    pub provider: Option<String>,
    /// Requests sent upstream for it.
    pub attempts: u32,
    /// A stored response the call created: booking it makes the key its owner.
    pub response_id: Option<String>,
    /// The provider's protocol when it is not the client's.
    pub upstream_protocol: Option<String>,
    /// The purses debited besides the key's own, when they are not those of a hold (a refund
    /// gives back to what was charged).
    pub charged: Vec<String>,
    /// The model asked for and each model left, when another model served (see `UsageRecord`).
    pub fell_back: Option<(String, String)>,
    /// Answered from the response cache: what it saved (nano-USD at the price table).
    pub cache_saved: Option<i64>,
}

impl Default for Used {
    /// Nothing used, nothing cost: status 200, one attempt.
    fn default() -> Self {
        Used {
            usage: Usage::default(),
            cost_nanos: 0,
            prior_list_nanos: 0,
            status: 200,
            latency_ms: 0,
            estimated: false,
            provider: None,
            attempts: 1,
            response_id: None,
            upstream_protocol: None,
            charged: Vec::new(),
            fell_back: None,
            cache_saved: None,
        }
    }
}

impl Used {
    /// A price and nothing else (a tool call, a video task, a refund).
    pub fn cost(cost_nanos: i64) -> Used {
        Used { cost_nanos, ..Used::default() }
    }
}

/// The one construction of a usage record: who paid, what was used, at which multiplier
/// (its cost charged, its list cost kept when they differ).
fn record(payer: &Payer, used: Used, rate: Multiplier) -> UsageRecord {
    let mut record = UsageRecord::new(payer.key_id, payer.model, payer.protocol, payer.route);
    record.input_tokens = used.usage.input;
    record.cached_tokens = used.usage.cached;
    record.cache_write_tokens = used.usage.cache_write;
    record.output_tokens = used.usage.output;
    record.cost_nanos = match rate.is_one() {
        true => used.cost_nanos,
        false => {
            let total = used.prior_list_nanos.saturating_add(used.cost_nanos);
            record.list_cost_nanos = Some(used.cost_nanos);
            rate.apply(total).saturating_sub(rate.apply(used.prior_list_nanos))
        }
    };
    record.status = used.status;
    record.latency_ms = used.latency_ms;
    record.estimated = used.estimated;
    record.provider = used.provider;
    record.attempts = used.attempts;
    record.response_id = used.response_id;
    record.upstream_protocol = used.upstream_protocol;
    record.charged = used.charged;
    if let Some((asked, fell)) = used.fell_back {
        record.requested_model = Some(asked);
        record.fallbacks = Some(fell);
    }
    if let Some(saved) = used.cache_saved {
        record.cache = Some("hit".to_string());
        record.cache_saved_nanos = Some(saved);
    }
    record.tags = payer.tags.clone();
    record
}

/// Where every call is debited: the one path from what a call used to the ledger.
#[derive(Clone)]
pub struct Books {
    pub(super) ledger: Arc<Ledger>,
}

impl Books {
    pub fn new(ledger: Arc<Ledger>) -> Self {
        Books { ledger }
    }

    /// A held call ended: the hold released, what it used debited from the purses it was held
    /// in, its record booked. Returns the key's balance.
    pub async fn settle(&self, hold: Hold, payer: &Payer<'_>, used: Used) -> Result<i64, StoreError> {
        let rate = hold.rate();
        self.ledger.settle(hold, record(payer, used, rate)).await
    }

    /// A call that ran without a hold (the upstream already did the work): debited at once
    /// from every purse the key draws on, never refused.
    pub async fn debit(&self, payer: &Payer<'_>, mut used: Used, purses: &[Purse]) -> Result<i64, StoreError> {
        used.charged = crate::records::purse::charged(purses);
        self.ledger.adjust(record(payer, used, payer.rate)).await
    }

    /// A price charged up front (a video task, a batch's worst case) to every purse when each
    /// covers it, or refused; durable before this returns.
    pub async fn charge(&self, payer: &Payer<'_>, used: Used, purses: &[Purse]) -> Result<Result<i64, Refused>, StoreError> {
        self.ledger.charge_from(record(payer, used, payer.rate), purses).await
    }

    /// The difference between what was charged up front and what the call came to (a refund
    /// when negative), to the purses `used.charged` names; durable before this returns.
    pub async fn adjust(&self, payer: &Payer<'_>, used: Used) -> Result<i64, StoreError> {
        self.ledger.adjust(record(payer, used, payer.rate)).await
    }

    /// Who created the stored response (or booked the marker) `id`.
    pub async fn owner_of(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        self.ledger.response_owner(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_what_the_payer_and_the_use_say() {
        let tags = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let payer = Payer { key_id: "k", tags: &tags, model: "m", protocol: "openai", route: "realtime", rate: Multiplier::ONE };
        let used = Used {
            usage: Usage { input: 3, cached: 2, cache_write: 1, output: 4 },
            cost_nanos: 70,
            provider: Some("p".into()),
            ..Used::default()
        };
        let r = record(&payer, used.clone(), Multiplier::ONE);
        assert_eq!((r.key_id.as_str(), r.model.as_str(), r.protocol.as_str(), r.route.as_str()), ("k", "m", "openai", "realtime"));
        assert_eq!((r.input_tokens, r.cached_tokens, r.cache_write_tokens, r.output_tokens), (3, 2, 1, 4));
        assert_eq!((r.cost_nanos, r.status, r.attempts, r.provider.as_deref()), (70, 200, 1, Some("p")));
        assert_eq!(r.tags, tags);
        assert_eq!(r.list_cost_nanos, None);
        // At 1.25: charged 1.25 × list, the list kept; charges of one call add up exactly.
        let m = Multiplier::new(1.25).unwrap();
        let r = record(&payer, used, m);
        assert_eq!((r.cost_nanos, r.list_cost_nanos), (88, Some(70)));
        let worst = Used { cost_nanos: 7, ..Used::default() };
        let rest = Used { cost_nanos: 3 - 7, prior_list_nanos: 7, ..Used::default() };
        let (a, b) = (record(&payer, worst, m).cost_nanos, record(&payer, rest, m).cost_nanos);
        assert_eq!((a, a + b), (9, m.apply(3)));
    }
}
