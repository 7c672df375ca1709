//! The key's model rules (`models: {allow, deny}`): 403 for a model they exclude.

use super::{Check, Looks, Subject, Verdict};

pub(super) struct ModelRules;

impl Check for ModelRules {
    fn name(&self) -> &'static str {
        "model_rules"
    }

    fn looks_at(&self) -> Looks {
        Looks::MODEL
    }

    fn check(&self, call: &Subject) -> Verdict {
        match call.model.map(|m| call.policy.check_model(m)) {
            Some(Err(e)) => Verdict::Refuse(e),
            _ => Verdict::Continue,
        }
    }
}
