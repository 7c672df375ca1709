//! The key's model rules (`models: {allow, deny}`), and those of the plans it is under: 403 for
//! a model they exclude.

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
        let Some(model) = call.model else { return Verdict::Continue };
        match call.policy.check_model(model).and_then(|()| call.plans.iter().try_for_each(|p| p.check(model))) {
            Err(e) => Verdict::Refuse(e),
            Ok(()) => Verdict::Continue,
        }
    }
}
