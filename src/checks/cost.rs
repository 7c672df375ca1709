//! The key's cost cap (`max_request_cost`): 402 for a call whose hold is above it.

use super::{Check, Looks, Subject, Verdict};

pub(super) struct CostCap;

impl Check for CostCap {
    fn name(&self) -> &'static str {
        "cost_cap"
    }

    fn looks_at(&self) -> Looks {
        Looks::COST
    }

    fn check(&self, call: &Subject) -> Verdict {
        match call.cost.map(|c| call.policy.check_cost(c)) {
            Some(Err(e)) => Verdict::Refuse(e),
            _ => Verdict::Continue,
        }
    }
}
