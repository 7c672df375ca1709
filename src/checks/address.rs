//! The key's `ip_allow`: every request of the key comes from an address it lists.

use super::{Check, Looks, Subject, Verdict};

pub(super) struct Address;

impl Check for Address {
    fn name(&self) -> &'static str {
        "address"
    }

    fn looks_at(&self) -> Looks {
        Looks::ADDRESS
    }

    fn check(&self, call: &Subject) -> Verdict {
        let (Some(_), Some(address)) = (&call.policy.ip_allow, call.address) else { return Verdict::Continue };
        match address().and_then(|client| call.policy.check_address(client)) {
            Ok(()) => Verdict::Continue,
            Err(e) => Verdict::Refuse(e),
        }
    }
}
