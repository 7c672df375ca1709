//! Per-key policy beyond group, balance and rate limits: when a key expires, which models it may
//! call, from which addresses. Parsed and validated once (the configuration file, the admin
//! API: a bad value is refused naming its field, nothing is stored), checked here on every
//! request.
//!
//! The client address is derived in `forwarded`: the TCP peer's, unless the peer is a trusted
//! proxy.

pub mod budget;
pub mod cache;
pub mod cidr;
mod fields;
pub mod forwarded;
pub mod limits;
pub mod plan;

pub use cidr::{normalize, Cidr};

use crate::protocol::{ApiError, ErrorKind};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// A policy field refused: its path (`expires_at`, `models.allow`, `budgets.day`) and why.
/// Shown as `path: why`; the admin API names the top field (`param`), the file's check
/// prefixes where the policy is (`keys[2].`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub field: String,
    pub why: String,
}

impl PolicyError {
    pub fn new(field: impl Into<String>, why: impl Into<String>) -> Self {
        PolicyError { field: field.into(), why: why.into() }
    }

    /// The field at the top of the path (`models` of `models.allow`).
    pub fn top(&self) -> &str {
        self.field.split('.').next().unwrap_or_default()
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl std::error::Error for PolicyError {}

/// Which models a key may call: exact names or a prefix ending in `*`. `deny` wins; with
/// `allow`, only what it names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

fn matches(pattern: &str, model: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => model.starts_with(prefix),
        None => pattern == model,
    }
}

impl ModelRules {
    /// Refuse an empty `allow` (never read as "everything") and a `*` anywhere but at the end.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_as("models")
    }

    /// [`validate`](Self::validate) for rules given under `field` (`models`, `tools`).
    pub fn validate_as(&self, field: &str) -> Result<(), PolicyError> {
        if self.allow.as_ref().is_some_and(Vec::is_empty) {
            return Err(PolicyError::new(format!("{field}.allow"), "an empty list would allow nothing; leave it out to allow everything"));
        }
        for (list, patterns) in [("allow", self.allow.as_deref().unwrap_or_default()), ("deny", &self.deny)] {
            if let Some(bad) = patterns.iter().find(|p| p.is_empty() || p.trim_end_matches('*').contains('*') || p.matches('*').count() > 1)
            {
                return Err(PolicyError::new(format!("{field}.{list}"), format!("'{bad}' — a name, or a prefix ending in one '*'")));
            }
        }
        Ok(())
    }

    pub fn allows(&self, model: &str) -> bool {
        !self.deny.iter().any(|p| matches(p, model)) && self.allow.as_ref().is_none_or(|allow| allow.iter().any(|p| matches(p, model)))
    }
}

/// A key's policy (stored with the key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicy {
    /// Unix seconds after which the key is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<ModelRules>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_allow: Option<Vec<Cidr>>,
    /// The most one request may cost (its hold, the worst case), nano-USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_cost_nanos: Option<i64>,
    /// The largest output maximum a request may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// The output maximum set for a request that names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_output_tokens: Option<u64>,
    /// Spend caps per calendar window (nano-USD).
    #[serde(default, skip_serializing_if = "budget::Budgets::is_empty")]
    pub budgets: budget::Budgets,
    /// The shared account the key also draws on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Copied onto every usage record of the key as it is written.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// Which MCP tools (`server__tool`) the key may see and call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ModelRules>,
    /// MCP tool calls per minute (listings are free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_rpm: Option<u32>,
    /// Guardrails (by name) its calls go through, besides its group's and its account's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrails: Option<Vec<String>>,
    /// Its own response-cache entry (before its account's and its group's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<cache::CachePolicy>,
}

/// At most this many guardrails named on a key.
pub const MAX_GUARDRAILS: usize = 16;
/// At most this many tags per key.
pub const MAX_TAGS: usize = 16;
/// Longest tag name and value, in characters.
pub const MAX_TAG_NAME: usize = 64;
pub const MAX_TAG_VALUE: usize = 256;

crate::with_key_policy! { plain
    /// A policy as the configuration file and the admin API give it (validated by
    /// [`KeyPolicy::parse`]).
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct PolicyInput {}
}

impl KeyPolicy {
    pub fn is_empty(&self) -> bool {
        *self == KeyPolicy::default()
    }

    /// 401 `key_expired` once past `expires_at`.
    pub fn check_expiry(&self, now: u64) -> Result<(), ApiError> {
        match self.expires_at {
            Some(at) if now >= at => Err(ApiError::new(ErrorKind::KeyExpired, "This API key has expired.")),
            _ => Ok(()),
        }
    }

    /// 403 `ip_not_allowed` when the client address is outside `ip_allow`.
    pub fn check_address(&self, client: IpAddr) -> Result<(), ApiError> {
        match &self.ip_allow {
            Some(blocks) if !blocks.iter().any(|b| b.contains(client)) => {
                Err(ApiError::new(ErrorKind::IpNotAllowed, format!("This API key may not be used from {}.", normalize(client))))
            }
            _ => Ok(()),
        }
    }

    /// Whether the key may call `model` (the model a provider serves).
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|rules| rules.allows(model))
    }

    /// Whether the key may see and call the MCP tool `name` (`server__tool`).
    pub fn allows_tool(&self, name: &str) -> bool {
        self.tools.as_ref().is_none_or(|rules| rules.allows(name))
    }

    /// 403 `model_not_allowed` for a model the rules exclude.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.allows_model(model) {
            Ok(())
        } else {
            Err(ApiError::new(ErrorKind::ModelNotAllowed, format!("This API key may not call the model '{model}'.")).with_param("model"))
        }
    }

    /// 402 `request_cost_cap_exceeded` when a request's hold (its worst-case cost) is above
    /// `max_request_cost`.
    pub fn check_cost(&self, hold_nanos: i64) -> Result<(), ApiError> {
        match self.max_request_cost_nanos {
            Some(cap) if hold_nanos > cap => Err(ApiError::new(
                ErrorKind::RequestCostCap,
                format!(
                    "This request may cost up to ${:.6}, more than this API key's cap of ${:.6} per request. Ask for fewer output tokens or send less input.",
                    crate::base::money::usd(hold_nanos),
                    crate::base::money::usd(cap)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A request's own output maximum against the key's `max_output_tokens`: above it, 400
    /// naming `field`. (What a request that names none is held for is `relay::output`'s rule.)
    pub fn check_output_tokens(&self, asked: Option<u64>, field: &str) -> Result<(), ApiError> {
        match (asked, self.max_output_tokens) {
            (Some(a), Some(cap)) if a > cap => Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("'{field}' asks for {a} output tokens; this API key may ask for at most {cap}."),
            )
            .with_param(field)),
            _ => Ok(()),
        }
    }

    /// Validate a policy as given: an RFC 3339 expiry (refused when past), model rules, address
    /// blocks, a cost cap, output limits. Errors name the field.
    pub fn parse(input: PolicyInput, now: u64) -> Result<KeyPolicy, PolicyError> {
        let expires_at = match input.expires_at.as_deref() {
            Some(text) => {
                let at = rfc3339_unix(text)
                    .ok_or_else(|| PolicyError::new("expires_at", format!("'{text}' is not an RFC 3339 time (2026-12-31T23:59:59Z)")))?;
                if at <= now {
                    return Err(PolicyError::new("expires_at", format!("'{text}' is in the past")));
                }
                Some(at)
            }
            None => None,
        };
        if let Some(rules) = &input.models {
            rules.validate()?;
        }
        if let Some(rules) = &input.tools {
            rules.validate_as("tools")?;
        }
        if input.tool_rpm == Some(0) {
            return Err(PolicyError::new("tool_rpm", "at least 1 (leave it out for no limit)"));
        }
        let ip_allow = match input.ip_allow.as_deref() {
            Some([]) => {
                return Err(PolicyError::new("ip_allow", "an empty list would allow no address; leave it out to allow every address"))
            }
            Some(list) => {
                Some(list.iter().map(|c| Cidr::parse(c).map_err(|e| PolicyError::new("ip_allow", e))).collect::<Result<Vec<_>, _>>()?)
            }
            None => None,
        };
        let max_request_cost_nanos = match input.max_request_cost {
            Some(usd) if !(usd.is_finite() && usd > 0.0 && usd <= 1e6) => {
                return Err(PolicyError::new("max_request_cost", "a positive number of USD, at most 1000000"))
            }
            Some(usd) => Some(crate::base::money::usd_to_nanos(usd)),
            None => None,
        };
        let limit = crate::base::usage::MAX_OUTPUT_ALLOWANCE;
        for (field, v) in [("max_output_tokens", input.max_output_tokens), ("default_output_tokens", input.default_output_tokens)] {
            if v.is_some_and(|n| n == 0 || n > limit) {
                return Err(PolicyError::new(field, format!("1 to {limit}")));
            }
        }
        if let (Some(d), Some(m)) = (input.default_output_tokens, input.max_output_tokens) {
            if d > m {
                return Err(PolicyError::new("default_output_tokens", format!("{d} is above max_output_tokens ({m})")));
            }
        }
        let budgets = input.budgets.as_ref().map(budget::Budgets::parse).transpose()?.unwrap_or_default();
        if let Some(name) = &input.account {
            budget::valid_account_name(name).map_err(|e| PolicyError::new("account", e))?;
        }
        let tags = input.tags.unwrap_or_default();
        if tags.len() > MAX_TAGS {
            return Err(PolicyError::new("tags", format!("at most {MAX_TAGS}, not {}", tags.len())));
        }
        for (name, value) in &tags {
            let printable = |t: &str| !t.chars().any(char::is_control);
            if name.is_empty() || name.chars().count() > MAX_TAG_NAME || !printable(name) {
                return Err(PolicyError::new("tags", format!("the name '{name}' must be 1 to {MAX_TAG_NAME} printable characters")));
            }
            if value.chars().count() > MAX_TAG_VALUE || !printable(value) {
                return Err(PolicyError::new(format!("tags.{name}"), format!("at most {MAX_TAG_VALUE} printable characters")));
            }
        }
        if let Some(list) = &input.guardrails {
            if list.len() > MAX_GUARDRAILS {
                return Err(PolicyError::new("guardrails", format!("at most {MAX_GUARDRAILS} names")));
            }
            if let Some(bad) = list
                .iter()
                .position(|n| n.is_empty() || n.len() > 64 || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
            {
                return Err(PolicyError::new(format!("guardrails[{bad}]"), "a guardrail's name: 1 to 64 letters, digits, '-' or '_'"));
            }
        }
        if let Some(c) = &input.cache {
            c.validate()?;
        }
        Ok(KeyPolicy {
            cache: input.cache,
            guardrails: input.guardrails.filter(|l| !l.is_empty()),
            tools: input.tools,
            tool_rpm: input.tool_rpm,
            tags,
            expires_at,
            models: input.models,
            ip_allow,
            max_request_cost_nanos,
            max_output_tokens: input.max_output_tokens,
            default_output_tokens: input.default_output_tokens,
            budgets,
            account: input.account,
        })
    }

    /// The policy as [`PolicyInput`] (to change one field and validate the whole again).
    pub fn input(&self) -> PolicyInput {
        PolicyInput {
            expires_at: self.expires_at.map(crate::protocol::rfc3339),
            models: self.models.clone(),
            ip_allow: self.ip_allow.as_ref().map(|blocks| blocks.iter().map(ToString::to_string).collect()),
            max_request_cost: self.max_request_cost_nanos.map(crate::base::money::usd),
            max_output_tokens: self.max_output_tokens,
            default_output_tokens: self.default_output_tokens,
            budgets: (!self.budgets.is_empty()).then(|| self.budgets.input()),
            account: self.account.clone(),
            tags: (!self.tags.is_empty()).then(|| self.tags.clone()),
            tools: self.tools.clone(),
            tool_rpm: self.tool_rpm,
            guardrails: self.guardrails.clone(),
            cache: self.cache.clone(),
        }
    }
}

/// RFC 3339 (`2026-12-31T23:59:59Z`, `…+02:00`, fractions ignored) → unix seconds.
pub fn rfc3339_unix(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, s) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if mo <= 2 { (y - 1, mo + 9) } else { (y, mo - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + s - offset).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn blocks_contain_their_addresses_v4_v6_and_mapped() {
        let b = Cidr::parse("10.1.0.0/16").expect("cidr");
        assert!(b.contains(ip("10.1.200.3")) && !b.contains(ip("10.2.0.1")));
        assert!(b.contains(ip("::ffff:10.1.2.3")), "a mapped address is its IPv4 address");
        let one = Cidr::parse("::ffff:192.0.2.7").expect("cidr");
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains(ip("192.0.2.7")));
        let v6 = Cidr::parse("2001:db8::/32").expect("cidr");
        assert!(v6.contains(ip("2001:db8:1::5")) && !v6.contains(ip("2001:db9::1")) && !v6.contains(ip("10.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").expect("cidr").contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "10.0.0/8", "nope", "2001:db8::/129", "10.0.0.0/x"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn model_rules_deny_first_globs_at_the_end_and_no_empty_allow() {
        let rules = ModelRules { allow: Some(vec!["alpha-*".into(), "beta-opus-4-7".into()]), deny: vec!["alpha-5.5".into()] };
        assert!(rules.validate().is_ok());
        assert!(rules.allows("alpha-4o-mini") && rules.allows("beta-opus-4-7"));
        assert!(!rules.allows("alpha-5.5") && !rules.allows("beta-opus-4-6") && !rules.allows("gamma-3.5-flash"));
        let deny_only = ModelRules { allow: None, deny: vec!["gamma-*".into()] };
        assert!(deny_only.allows("alpha-5.5") && !deny_only.allows("gamma-3.5-flash"));
        assert!(ModelRules { allow: Some(vec![]), deny: vec![] }.validate().is_err(), "an empty allow list is refused");
        for bad in ["al*pha", "*", "a**", ""] {
            let r = ModelRules { allow: None, deny: vec![bad.into()] };
            assert_eq!(r.validate().is_err(), bad != "*", "{bad}");
        }
    }

    #[test]
    fn expiry_is_checked_and_rfc3339_read() {
        assert_eq!(rfc3339_unix("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_unix("2026-11-24T12:00:00Z"), Some(1_795_521_600));
        assert_eq!(rfc3339_unix("2026-11-24T14:00:00.123+02:00"), Some(1_795_521_600));
        assert_eq!(rfc3339_unix("2026-11-24T07:00:00-05:00"), Some(1_795_521_600));
        for bad in ["2026-11-24", "2026-13-01T00:00:00Z", "2026-11-24T12:00:00", "2026-11-24T12:00:00+0200"] {
            assert_eq!(rfc3339_unix(bad), None, "{bad}");
        }
        let now = 1_795_521_600;
        let at = |t: &str| PolicyInput { expires_at: Some(t.into()), ..PolicyInput::default() };
        assert!(KeyPolicy::parse(at("2026-11-24T11:59:59Z"), now).is_err(), "past expiry refused");
        let p = KeyPolicy::parse(at("2026-11-24T12:00:10Z"), now).expect("valid");
        assert!(p.check_expiry(now + 9).is_ok());
        assert_eq!(p.check_expiry(now + 10).map_err(|e| e.kind), Err(ErrorKind::KeyExpired));
        let ips = |list: Vec<String>| PolicyInput { ip_allow: Some(list), ..PolicyInput::default() };
        assert!(KeyPolicy::parse(ips(vec![]), now).is_err(), "an empty ip_allow is refused");
        assert!(KeyPolicy::parse(ips(vec!["10.0.0.0/40".into()]), now).unwrap_err().to_string().starts_with("ip_allow:"));
    }

    #[test]
    fn output_limits_and_the_cost_cap() {
        let p = KeyPolicy::parse(
            PolicyInput {
                max_output_tokens: Some(1000),
                default_output_tokens: Some(200),
                max_request_cost: Some(0.01),
                ..PolicyInput::default()
            },
            0,
        )
        .expect("valid");
        assert_eq!(p.check_output_tokens(Some(1000), "max_tokens").map_err(|e| e.param), Ok(()));
        assert_eq!(p.check_output_tokens(Some(1001), "max_tokens").map_err(|e| e.param), Err(Some("max_tokens".into())));
        assert!(p.check_output_tokens(None, "max_tokens").is_ok(), "naming none is the allowance's business");
        assert!(KeyPolicy::default().check_output_tokens(Some(1 << 20), "x").is_ok());
        assert!(p.check_cost(10_000_000).is_ok());
        assert_eq!(p.check_cost(10_000_001).map_err(|e| e.status()), Err(402));
        for bad in [
            PolicyInput { max_request_cost: Some(-1.0), ..PolicyInput::default() },
            PolicyInput { max_output_tokens: Some(0), ..PolicyInput::default() },
            PolicyInput { max_output_tokens: Some(10), default_output_tokens: Some(20), ..PolicyInput::default() },
        ] {
            assert!(KeyPolicy::parse(bad.clone(), 0).is_err(), "{bad:?}");
        }
        // The input form says the same policy again.
        assert_eq!(KeyPolicy::parse(p.input(), 0), Ok(p));
    }
}
