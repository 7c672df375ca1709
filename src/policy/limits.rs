//! Limits many keys share: an account's (a team is an account) and a tag value's
//! (`tag_limits: { "team=search": { rpm, tpm, max_concurrent, budgets } }`). Every call of
//! every key under them counts against them — its requests and tokens per minute and its
//! requests in flight in `access::limits`, its spend in the windows `records::purse` holds —
//! checked after the key's own, the account's before the tags'.

use super::budget::{Budgets, BudgetsInput};
use super::PolicyError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Requests per minute, tokens per minute, requests in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
}

impl RateLimits {
    pub fn is_empty(&self) -> bool {
        self.rpm.is_none() && self.tpm.is_none() && self.max_concurrent.is_none()
    }

    /// Each limit set is at least 1 (leave it out for none).
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (field, zero) in
            [("rpm", self.rpm == Some(0)), ("tpm", self.tpm == Some(0)), ("max_concurrent", self.max_concurrent == Some(0))]
        {
            if zero {
                return Err(PolicyError::new(field, "at least 1 (leave it out for no limit)"));
            }
        }
        Ok(())
    }
}

/// A tag value's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct TagLimit {
    pub tag: String,
    pub value: String,
    pub rates: RateLimits,
    pub budgets: Budgets,
}

impl TagLimit {
    /// The name its counts and windows are kept under: `tag:<name>=<value>`.
    pub fn id(&self) -> String {
        format!("tag:{}={}", self.tag, self.value)
    }

    /// How a refusal names it: `the tag team=search`.
    pub fn whose(&self) -> String {
        format!("the tag {}={}", self.tag, self.value)
    }
}

/// `tag_limits:` as the file gives one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagLimitInput {
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub tpm: Option<u64>,
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    #[serde(default)]
    pub budgets: Option<BudgetsInput>,
}

/// Every tag value's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TagLimits(pub Vec<TagLimit>);

/// The most tag values with limits.
const MAX_TAG_LIMITS: usize = 256;

impl TagLimits {
    /// `tag_limits:` keyed `name=value`; errors name the entry (`"team=search".rpm`).
    pub fn parse(input: &BTreeMap<String, TagLimitInput>) -> Result<TagLimits, PolicyError> {
        if input.len() > MAX_TAG_LIMITS {
            return Err(PolicyError::new("", format!("at most {MAX_TAG_LIMITS} tag values")));
        }
        let mut out = Vec::with_capacity(input.len());
        for (name, given) in input {
            let at = |field: &str| format!("\"{name}\".{field}");
            let (tag, value) = name
                .split_once('=')
                .filter(|(t, v)| (1..=64).contains(&t.len()) && !v.is_empty() && v.len() <= 256 && !t.contains(char::is_whitespace))
                .ok_or_else(|| {
                    PolicyError::new(format!("\"{name}\""), "a tag and its value: name=value (name 1 to 64 characters, value 1 to 256)")
                })?;
            let rates = RateLimits { rpm: given.rpm, tpm: given.tpm, max_concurrent: given.max_concurrent };
            rates.validate().map_err(|e| PolicyError::new(at(&e.field), e.why))?;
            let budgets = given
                .budgets
                .as_ref()
                .map(Budgets::parse)
                .transpose()
                .map_err(|e| PolicyError::new(at(&e.field), e.why))?
                .unwrap_or_default();
            if rates.is_empty() && budgets.is_empty() {
                return Err(PolicyError::new(format!("\"{name}\""), "no limit: give rpm, tpm, max_concurrent or budgets"));
            }
            out.push(TagLimit { tag: tag.to_string(), value: value.to_string(), rates, budgets });
        }
        Ok(TagLimits(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The limits of the tag values a key carries, in the order of `tag_limits`.
    pub fn of<'a>(&'a self, tags: &'a BTreeMap<String, String>) -> impl Iterator<Item = &'a TagLimit> + 'a {
        self.0.iter().filter(move |t| tags.get(&t.tag) == Some(&t.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_limits_are_named_and_validated() {
        let parse = |json: &str| TagLimits::parse(&serde_json::from_str(json).expect("json"));
        let limits = parse(r#"{"team=search": {"rpm": 600, "budgets": {"day": 50}}, "env=prod": {"max_concurrent": 8}}"#).expect("valid");
        assert_eq!(limits.0.len(), 2);
        let tags: BTreeMap<String, String> = [("team".to_string(), "search".to_string())].into();
        let applying: Vec<String> = limits.of(&tags).map(TagLimit::id).collect();
        assert_eq!(applying, ["tag:team=search"]);
        for (bad, field) in [
            (r#"{"team": {"rpm": 1}}"#, "\"team\""),
            (r#"{"team=search": {"rpm": 0}}"#, "\"team=search\".rpm"),
            (r#"{"team=search": {}}"#, "\"team=search\""),
            (r#"{"team=search": {"budgets": {"day": -1}}}"#, "\"team=search\".budgets.day"),
        ] {
            assert_eq!(parse(bad).expect_err(bad).field, field, "{bad}");
        }
    }
}
