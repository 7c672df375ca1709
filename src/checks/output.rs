//! The key's `max_output_tokens` against the output maximum a call names (400 naming its
//! field). What a call that names none is held for is the draft's allowance, not a refusal.

use super::{Check, Looks, Subject, Verdict};

pub(super) struct OutputLimit;

impl Check for OutputLimit {
    fn name(&self) -> &'static str {
        "output_limit"
    }

    fn looks_at(&self) -> Looks {
        Looks::OUTPUT
    }

    fn check(&self, call: &Subject) -> Verdict {
        match call.output.map(|(asked, field)| call.policy.check_output_tokens(asked, field)) {
            Some(Err(e)) => Verdict::Refuse(e),
            _ => Verdict::Continue,
        }
    }
}
