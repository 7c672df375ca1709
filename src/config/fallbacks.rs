//! `routing.fallbacks`, `routing.max_attempts`, `routing.max_fallback_secs`: the models a call
//! goes on to when its own cannot take it (before the first byte), on which classes of failure
//! (`protocol::error_class`), and the bounds every attempt of one request shares.

use super::{err, ConfigError};
use crate::protocol::error_class::FailureClass;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChain {
    to: Vec<String>,
    #[serde(default)]
    on: Option<Vec<String>>,
}

/// The classes a fallback is taken on, as a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Classes(u8);

impl Classes {
    /// Every class.
    pub const ALL: Classes = Classes(0b1_1111);

    pub fn of(classes: &[FailureClass]) -> Classes {
        Classes(classes.iter().fold(0, |bits, c| bits | Self::bit(*c)))
    }

    fn bit(class: FailureClass) -> u8 {
        1 << FailureClass::ALL.iter().position(|c| *c == class).unwrap_or(0)
    }

    pub fn contains(self, class: FailureClass) -> bool {
        self.0 & Self::bit(class) != 0
    }

    /// Their names, in the table's order.
    pub fn names(self) -> Vec<&'static str> {
        FailureClass::ALL.into_iter().filter(|c| self.contains(*c)).map(FailureClass::name).collect()
    }
}

/// One model's fallbacks: the models tried next, in order, and on what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub to: Vec<String>,
    pub on: Classes,
}

/// Fallbacks across models and the bounds of one request's attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallbacks {
    /// By the model the client asked for.
    pub chains: BTreeMap<String, Chain>,
    /// Requests sent upstream for one client request, retries and fallbacks together.
    pub max_attempts: u32,
    /// From the request's start: no fallback starts after it, and an attempt that a fallback
    /// may follow waits for its response header at most until it.
    pub max_wait: Duration,
}

/// Most models one fallback list may name.
pub const MAX_CHAIN: usize = 8;
/// Most requests one client request may send upstream.
pub const MAX_REQUEST_ATTEMPTS: u32 = 20;
/// `routing.max_fallback_secs` when not set.
pub const DEFAULT_FALLBACK_SECS: u64 = 60;

impl Default for Fallbacks {
    fn default() -> Self {
        Fallbacks { chains: BTreeMap::new(), max_attempts: 6, max_wait: Duration::from_secs(DEFAULT_FALLBACK_SECS) }
    }
}

/// `routing.fallbacks` and its bounds: every model named is `served` by a provider, none falls
/// back to itself, the classes are known ones (all five when `on` is left out);
/// `max_attempts` is at least `retry.attempts` (`retry_attempts`; default: the larger of 6 and it).
pub(super) fn fallbacks(
    raw: Option<BTreeMap<String, RawChain>>,
    (max_attempts, max_secs): (Option<u32>, Option<u64>),
    served: &dyn Fn(&str) -> bool,
    retry_attempts: u32,
) -> Result<Fallbacks, ConfigError> {
    let mut chains = BTreeMap::new();
    for (model, chain) in raw.unwrap_or_default() {
        let at = format!("routing.fallbacks.{model}");
        if !served(&model) {
            return err(format!("{at}: no provider serves the model '{model}'"));
        }
        if chain.to.is_empty() || chain.to.len() > MAX_CHAIN {
            return err(format!("{at}.to: 1 to {MAX_CHAIN} models"));
        }
        for (i, to) in chain.to.iter().enumerate() {
            if to == &model || chain.to[..i].contains(to) {
                return err(format!("{at}.to[{i}]: '{to}' is named twice (or is the model itself)"));
            }
            if !served(to) {
                return err(format!("{at}.to[{i}]: no provider serves the model '{to}'"));
            }
        }
        let on = match chain.on {
            None => Classes::ALL,
            Some(names) if names.is_empty() => return err(format!("{at}.on: name at least one class, or leave it out for all")),
            Some(names) => {
                let mut classes = Vec::with_capacity(names.len());
                for (i, name) in names.iter().enumerate() {
                    let Some(class) = FailureClass::parse(name) else {
                        let known: Vec<&str> = FailureClass::ALL.iter().map(|c| c.name()).collect();
                        return err(format!("{at}.on[{i}]: '{name}' is not one of {}", known.join(", ")));
                    };
                    classes.push(class);
                }
                Classes::of(&classes)
            }
        };
        chains.insert(model, Chain { to: chain.to, on });
    }
    let max_attempts = max_attempts.unwrap_or_else(|| retry_attempts.max(6));
    if !(retry_attempts..=MAX_REQUEST_ATTEMPTS).contains(&max_attempts) {
        return err(format!(
            "routing.max_attempts: {retry_attempts} (retry.attempts) to {MAX_REQUEST_ATTEMPTS}: the requests one call may send upstream, retries and fallbacks together"
        ));
    }
    let max_secs = max_secs.unwrap_or(DEFAULT_FALLBACK_SECS);
    if max_secs == 0 || max_secs > 3600 {
        return err("routing.max_fallback_secs: 1 to 3600");
    }
    Ok(Fallbacks { chains, max_attempts, max_wait: Duration::from_secs(max_secs) })
}
