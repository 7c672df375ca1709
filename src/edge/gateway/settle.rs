//! Stage 6, settle: a relayed request is billed once, when its answer ends (or fails, or its
//! client left and the drain ended): the hold released, the cost of the usage the upstream
//! reported (else the estimate) debited from every purse, its usage record booked, the
//! tokens spent under the key's `tpm`.

use super::{Gateway, RelayPlan};
use crate::billing;
use crate::billing::meter::UsageScanner;
use crate::charge::{Payer, Used};
use crate::route::Route;

impl Gateway {
    /// Bill a finished relay: release the hold, charge what was used. Runs before the last
    /// byte goes to the client (with `sync_commit`, after the record is on disk).
    pub(super) async fn settle(&self, plan: &mut RelayPlan, scanner: Option<&mut UsageScanner>, status: u16) {
        let Some(hold) = plan.hold.take() else { return };
        let scan = scanner.map(|s| {
            let found = (s.finish(), s.response_id().map(str::to_string));
            if let Some(trace) = plan.trace.as_mut() {
                trace.answer = s.take_answer();
            }
            found
        });
        // A response the upstream stored (a successful create) becomes the key's.
        let (scan, response_id) = match scan {
            Some((scan, id)) => (Some(scan), id.filter(|_| plan.route == Route::Responses && (200..300).contains(&status))),
            None => (None, None),
        };
        let hit = plan.cache.as_ref().and_then(|c| c.answered);
        let (usage, cost, estimated) = match (&plan.media, hit) {
            // A hit: its original usage, at its hit price.
            (_, Some(hit)) => (hit.usage, hit.cost, false),
            (Some(call), None) => call.bill(&plan.routing.prices, &plan.model, scan, status, hold.list()),
            (None, None) => {
                let (usage, estimated) = billing::billed_usage(scan, status, plan.input_estimate, plan.route.embeds());
                (usage, plan.routing.prices.cost(&plan.model, usage), estimated)
            }
        };
        // Its guardrails' price is billed whatever the answer.
        let cost = cost.saturating_add(plan.guard_price_nanos);
        // What the logs, the metrics and the trace show: the charge (the record keeps both).
        let charged = hold.rate().apply(cost);
        plan.happened.billed = Some((usage, charged, estimated));
        let input_total = usage.input_total();
        let series = self.metrics.model(&plan.model);
        match hit {
            // A hit spends no tokens under a `tpm`, and no model produced any.
            Some(hit) => series.cache_saved_nanos.add(hit.saved as u64),
            None => {
                self.charge.spend_tokens_under(&plan.key, &plan.under, input_total.saturating_add(usage.output)).await;
                series.input_tokens.add(input_total);
                series.output_tokens.add(usage.output);
            }
        }
        plan.tokens_reserved = None;
        if estimated {
            series.estimated_bills.add(1);
        }
        series.cost_nanos.add(charged.max(0) as u64);
        let payer = Payer {
            key_id: &plan.key.id,
            tags: &plan.key.policy.tags,
            model: &plan.model,
            protocol: plan.protocol.as_str(),
            route: plan.route.label(),
            rate: hold.rate(),
        };
        let used = Used {
            usage,
            cost_nanos: cost,
            status,
            latency_ms: plan.started.elapsed().as_millis() as u64,
            estimated,
            provider: plan.happened.served_by.map(|i| plan.routing.catalog.upstreams[i].config.name.clone()),
            attempts: plan.happened.attempts,
            response_id,
            upstream_protocol: plan.translation.as_ref().map(|t| t.upstream.as_str().to_string()),
            charged: Vec::new(),
            prior_list_nanos: 0,
            cache_saved: hit.map(|h| h.saved),
            fell_back: match plan.happened.fell_back.first() {
                None => None,
                Some((asked, _)) => super::fallback::fell_back(plan).map(|fell| (asked.clone(), fell)),
            },
        };
        if let Err(e) = self.charge.books().settle(hold, &payer, used).await {
            log::error!("ledger: could not settle a request of key {}: {e}", plan.key.name);
        }
    }
}
