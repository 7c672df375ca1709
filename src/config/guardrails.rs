//! `guardrails:`: the guardrails a call's text goes through, each attached by name to groups
//! (`groups.<g>.guardrails`), accounts (`accounts[].guardrails`) and keys (`keys[].guardrails`);
//! a key has the union of what applies to it. This file checks every field and names it; the
//! checks floor (`checks::guard`) builds them.

use super::{err, ConfigError};
use serde::Deserialize;

/// The built-in recognisers of kind `pii`.
pub const PII: [&str; 6] = ["email", "phone", "card", "iban", "ssn", "ip"];
/// The built-in recognisers of kind `secrets`.
pub const SECRETS: [&str; 7] = ["aws_key", "google_api_key", "azure_key", "private_key", "jwt", "bearer", "provider_key"];

/// The most guardrails a file may declare, and patterns one `regex` guardrail may hold.
const MAX_GUARDRAILS: usize = 64;
const MAX_PATTERNS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGuardrail {
    name: String,
    kind: String,
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    on_error: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    restore: bool,
    /// USD billed to the key for each call this guardrail checked.
    #[serde(default)]
    price_per_check: Option<f64>,
    /// `pii` / `secrets`: the recognisers switched on (all of the kind when absent).
    #[serde(default)]
    recognisers: Option<Vec<String>>,
    /// `regex`: the operator's own patterns.
    #[serde(default)]
    patterns: Vec<RawPattern>,
    /// `webhook`: where the texts are posted.
    #[serde(default)]
    url: Option<String>,
    /// `webhook`: the Standard Webhooks secret (`whsec_…`), from this variable.
    #[serde(default)]
    secret_env: Option<String>,
    /// `moderation`: the moderation model, served by one of the gateway's `openai` providers.
    #[serde(default)]
    model: Option<String>,
    /// `moderation`: a category whose score reaches its threshold is a finding (without:
    /// whatever the model flags).
    #[serde(default)]
    thresholds: Option<std::collections::BTreeMap<String, f64>>,
    /// `bedrock`: the `bedrock` provider whose region, endpoint and credentials it is asked with.
    #[serde(default)]
    provider: Option<String>,
    /// `bedrock`: the guardrail's id (or ARN) and version (`DRAFT` or a number).
    #[serde(default)]
    guardrail_id: Option<String>,
    #[serde(default)]
    guardrail_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    name: String,
    regex: String,
}

/// Which texts a guardrail reads: what the call sends, what comes back, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Input,
    Output,
    Both,
}

impl Phase {
    pub fn input(self) -> bool {
        matches!(self, Phase::Input | Phase::Both)
    }
    pub fn output(self) -> bool {
        matches!(self, Phase::Output | Phase::Both)
    }
}

/// What a guardrail does with a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Block,
    Mask,
    Monitor,
}

impl Action {
    pub fn label(self) -> &'static str {
        match self {
            Action::Block => "block",
            Action::Mask => "mask",
            Action::Monitor => "monitor",
        }
    }
}

/// What a guardrail whose service fails does with the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    Open,
    Closed,
}

/// What a guardrail looks for.
#[derive(Debug, Clone, PartialEq)]
pub enum GuardKind {
    /// Built-in recognisers (`pii`, `secrets`) by name, and the operator's own patterns
    /// (`regex`) as (name, regex).
    Patterns { builtin: Vec<String>, patterns: Vec<(String, String)> },
    /// The operator's service, asked over HTTP and signed.
    Webhook { url: String, secret: Vec<u8> },
    /// A moderation model (`/v1/moderations`) of one of the gateway's own providers.
    Moderation { model: String, thresholds: std::collections::BTreeMap<String, f64> },
    /// An AWS Bedrock guardrail (`ApplyGuardrail`), asked through a `bedrock` provider.
    Bedrock { provider: String, id: String, version: String },
}

/// One guardrail as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardrailConfig {
    pub name: String,
    /// `pii`, `secrets`, `regex` or `webhook`.
    pub kind_name: String,
    pub kind: GuardKind,
    pub phase: Phase,
    pub action: Action,
    pub on_error: OnError,
    pub timeout_ms: u64,
    /// Placeholders the model echoes back are restored in the answer (`mask` only).
    pub restore: bool,
    /// Billed to the key for each call the guardrail checked (nano-USD).
    pub price_per_check_nanos: i64,
}

/// `guardrails:`: each named once, every field checked.
pub(super) fn guardrails(
    raw: Vec<RawGuardrail>,
    env: &dyn Fn(&str) -> Option<String>,
    providers: &[super::ProviderConfig],
) -> Result<Vec<GuardrailConfig>, ConfigError> {
    if raw.len() > MAX_GUARDRAILS {
        return err(format!("guardrails: at most {MAX_GUARDRAILS} guardrails"));
    }
    let mut out: Vec<GuardrailConfig> = Vec::with_capacity(raw.len());
    for (i, g) in raw.into_iter().enumerate() {
        let at = format!("guardrails[{i}]");
        if !valid_name(&g.name) {
            return err(format!("{at}.name: 1 to 64 letters, digits, '-' or '_'"));
        }
        if out.iter().any(|o| o.name == g.name) {
            return err(format!("{at}.name: the guardrail '{}' is listed twice", g.name));
        }
        let phase = match g.phase.as_deref() {
            None | Some("input") => Phase::Input,
            Some("output") => Phase::Output,
            Some("both") => Phase::Both,
            Some(other) => return err(format!("{at}.phase: '{other}' is not one of input, output, both")),
        };
        let action = match g.action.as_deref() {
            None | Some("block") => Action::Block,
            Some("mask") => Action::Mask,
            Some("monitor") => Action::Monitor,
            Some(other) => return err(format!("{at}.action: '{other}' is not one of block, mask, monitor")),
        };
        let on_error = match g.on_error.as_deref() {
            None | Some("open") => OnError::Open,
            Some("closed") => OnError::Closed,
            Some(other) => return err(format!("{at}.on_error: '{other}' is not one of open, closed")),
        };
        let timeout_ms = g.timeout_ms.unwrap_or(1000);
        if !(1..=60_000).contains(&timeout_ms) {
            return err(format!("{at}.timeout_ms: 1 to 60000"));
        }
        if g.restore && action != Action::Mask {
            return err(format!("{at}.restore: only a guardrail whose action is mask restores"));
        }
        let price_per_check_nanos = match g.price_per_check {
            None => 0,
            Some(usd) if usd.is_finite() && (0.0..=1.0).contains(&usd) => (usd * 1e9).round() as i64,
            Some(_) => return err(format!("{at}.price_per_check: USD from 0 to 1")),
        };
        let kind = kind(&at, &g, env, providers)?;
        if matches!(kind, GuardKind::Moderation { .. }) && action == Action::Mask {
            return err(format!("{at}.action: a moderation guardrail blocks or monitors; it has nothing to mask"));
        }
        out.push(GuardrailConfig {
            name: g.name,
            kind_name: g.kind,
            kind,
            phase,
            action,
            on_error,
            timeout_ms,
            restore: g.restore,
            price_per_check_nanos,
        });
    }
    Ok(out)
}

fn kind(
    at: &str,
    g: &RawGuardrail,
    env: &dyn Fn(&str) -> Option<String>,
    providers: &[super::ProviderConfig],
) -> Result<GuardKind, ConfigError> {
    let only = |field: &str, present: bool| match present {
        true => err(format!("{at}.{field}: not a field of a {} guardrail", g.kind)),
        false => Ok(()),
    };
    if g.kind != "moderation" {
        only("model", g.model.is_some())?;
        only("thresholds", g.thresholds.is_some())?;
    }
    if g.kind != "bedrock" {
        only("provider", g.provider.is_some())?;
        only("guardrail_id", g.guardrail_id.is_some())?;
        only("guardrail_version", g.guardrail_version.is_some())?;
    }
    match g.kind.as_str() {
        "pii" | "secrets" => {
            only("patterns", !g.patterns.is_empty())?;
            only("url", g.url.is_some())?;
            only("secret_env", g.secret_env.is_some())?;
            let known: &[&str] = if g.kind == "pii" { &PII } else { &SECRETS };
            let builtin = match &g.recognisers {
                None => known.iter().map(|s| s.to_string()).collect(),
                Some(list) if list.is_empty() => return err(format!("{at}.recognisers: switch at least one on")),
                Some(list) => {
                    for (j, r) in list.iter().enumerate() {
                        if !known.contains(&r.as_str()) {
                            return err(format!("{at}.recognisers[{j}]: '{r}' is not one of {}", known.join(", ")));
                        }
                    }
                    list.clone()
                }
            };
            Ok(GuardKind::Patterns { builtin, patterns: Vec::new() })
        }
        "regex" => {
            only("recognisers", g.recognisers.is_some())?;
            only("url", g.url.is_some())?;
            only("secret_env", g.secret_env.is_some())?;
            if g.patterns.is_empty() || g.patterns.len() > MAX_PATTERNS {
                return err(format!("{at}.patterns: 1 to {MAX_PATTERNS} patterns"));
            }
            let mut patterns = Vec::with_capacity(g.patterns.len());
            for (j, p) in g.patterns.iter().enumerate() {
                if !valid_name(&p.name) {
                    return err(format!("{at}.patterns[{j}].name: 1 to 64 letters, digits, '-' or '_'"));
                }
                if let Err(e) = regex::RegexBuilder::new(&p.regex).size_limit(1 << 20).build() {
                    return err(format!("{at}.patterns[{j}].regex: {e}"));
                }
                patterns.push((p.name.clone(), p.regex.clone()));
            }
            Ok(GuardKind::Patterns { builtin: Vec::new(), patterns })
        }
        "webhook" => {
            only("recognisers", g.recognisers.is_some())?;
            only("patterns", !g.patterns.is_empty())?;
            let url = g.url.clone().ok_or_else(|| ConfigError(format!("{at}.url: a webhook guardrail needs its url")))?;
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.parse::<http::Uri>().is_err() {
                return err(format!("{at}.url: an http:// or https:// URL"));
            }
            let name = g
                .secret_env
                .clone()
                .ok_or_else(|| ConfigError(format!("{at}.secret_env: a webhook guardrail signs with a secret from the environment")))?;
            let secret = env(&name)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ConfigError(format!("{at}.secret_env: environment variable {name} is not set")))?;
            let secret = crate::base::secrets::webhook_secret(&secret).map_err(|e| ConfigError(format!("{at}.secret_env: {e}")))?;
            Ok(GuardKind::Webhook { url, secret })
        }
        "moderation" => {
            only("recognisers", g.recognisers.is_some())?;
            only("patterns", !g.patterns.is_empty())?;
            only("url", g.url.is_some())?;
            only("secret_env", g.secret_env.is_some())?;
            let model = g.model.clone().ok_or_else(|| ConfigError(format!("{at}.model: a moderation guardrail names its model")))?;
            let served = providers.iter().any(|p| p.kind == super::ProviderKind::Openai && p.models.contains(&model));
            if !served {
                return err(format!("{at}.model: no provider of protocol openai serves '{model}'"));
            }
            let thresholds = g.thresholds.clone().unwrap_or_default();
            if let Some((category, _)) = thresholds.iter().find(|(_, t)| !(t.is_finite() && (0.0..=1.0).contains(*t))) {
                return err(format!("{at}.thresholds.{category}: a score from 0 to 1"));
            }
            Ok(GuardKind::Moderation { model, thresholds })
        }
        "bedrock" => {
            only("recognisers", g.recognisers.is_some())?;
            only("patterns", !g.patterns.is_empty())?;
            only("url", g.url.is_some())?;
            only("secret_env", g.secret_env.is_some())?;
            let provider =
                g.provider.clone().ok_or_else(|| ConfigError(format!("{at}.provider: a bedrock guardrail names its bedrock provider")))?;
            if !providers.iter().any(|p| p.kind == super::ProviderKind::Bedrock && p.name == provider) {
                return err(format!("{at}.provider: no provider of protocol bedrock is named '{provider}'"));
            }
            let id = g.guardrail_id.clone().ok_or_else(|| ConfigError(format!("{at}.guardrail_id: a bedrock guardrail names its id")))?;
            let valid_id = (1..=2048).contains(&id.len())
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'/' | b'-' | b'_' | b'.'));
            if !valid_id {
                return err(format!("{at}.guardrail_id: a guardrail id or ARN (letters, digits, ':', '/', '-', '_', '.')"));
            }
            let version =
                g.guardrail_version.clone().ok_or_else(|| ConfigError(format!("{at}.guardrail_version: DRAFT or a version number")))?;
            if !(version == "DRAFT" || (1..=8).contains(&version.len()) && version.bytes().all(|b| b.is_ascii_digit())) {
                return err(format!("{at}.guardrail_version: DRAFT or a version number"));
            }
            Ok(GuardKind::Bedrock { provider, id, version })
        }
        other => err(format!("{at}.kind: '{other}' is not one of pii, secrets, regex, webhook, moderation, bedrock")),
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A list of guardrail names attached somewhere (`at` names the field): each declared.
pub(super) fn attached(at: &str, names: &[String], declared: &[GuardrailConfig]) -> Result<(), ConfigError> {
    for (j, name) in names.iter().enumerate() {
        if !declared.iter().any(|g| &g.name == name) {
            return err(format!("{at}[{j}]: no guardrail named '{}' in guardrails", crate::base::text::clip(name, 64)));
        }
    }
    Ok(())
}

/// Every list of names attached (groups, accounts, keys): each declared.
pub(super) fn check_attached(config: &super::Config) -> Result<(), ConfigError> {
    for (name, group) in &config.groups {
        attached(&format!("groups.{name}.guardrails"), &group.guardrails, &config.guardrails)?;
    }
    for (i, account) in config.accounts.iter().enumerate() {
        attached(&format!("accounts[{i}].guardrails"), &account.guardrails, &config.guardrails)?;
    }
    for (i, key) in config.keys.iter().enumerate() {
        attached(&format!("keys[{i}].guardrails"), key.policy.guardrails.as_deref().unwrap_or_default(), &config.guardrails)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn parse(yaml: &str) -> Result<Config, String> {
        Config::parse(&format!("listen: 127.0.0.1:0\n{yaml}"), &|name| {
            (name == "HOOK_SECRET").then(|| "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=".to_string())
        })
        .map_err(|e| e.0)
    }

    #[test]
    fn every_field_is_checked_and_named() {
        let ok = "guardrails:\n  - {name: s, kind: secrets, action: mask, restore: true, phase: both}\n  - {name: p, kind: pii, recognisers: [email, card]}\n  - {name: r, kind: regex, patterns: [{name: ticket, regex: 'TKT-[0-9]{6}'}]}\n  - {name: w, kind: webhook, url: 'http://127.0.0.1:9/check', secret_env: HOOK_SECRET, on_error: closed, timeout_ms: 200}\ngroups:\n  default: {platforms: [openai], guardrails: [s, w]}\naccounts:\n  - {name: team, guardrails: [p]}\nkeys:\n  - {key: sk-a-1234567890, name: a, guardrails: [r], account: team}\n";
        let config = parse(ok).expect("valid");
        assert_eq!(config.guardrails.len(), 4);
        assert_eq!(config.groups["default"].guardrails, ["s", "w"]);
        assert_eq!(config.accounts[0].guardrails, ["p"]);
        assert_eq!(config.keys[0].policy.guardrails.as_deref(), Some(&["r".to_string()][..]));
        for (yaml, named) in [
            ("guardrails: [{name: s, kind: nope}]", "guardrails[0].kind"),
            ("guardrails: [{name: s, kind: pii, action: stop}]", "guardrails[0].action"),
            ("guardrails: [{name: s, kind: pii, phase: during}]", "guardrails[0].phase"),
            ("guardrails: [{name: s, kind: pii, on_error: maybe}]", "guardrails[0].on_error"),
            ("guardrails: [{name: s, kind: pii, timeout_ms: 0}]", "guardrails[0].timeout_ms"),
            ("guardrails: [{name: s, kind: pii, restore: true}]", "guardrails[0].restore"),
            ("guardrails: [{name: s, kind: pii, recognisers: [aws_key]}]", "guardrails[0].recognisers[0]"),
            ("guardrails: [{name: s, kind: regex, patterns: [{name: x, regex: '(['}]}]", "guardrails[0].patterns[0].regex"),
            ("guardrails: [{name: s, kind: regex}]", "guardrails[0].patterns"),
            ("guardrails: [{name: s, kind: webhook, secret_env: HOOK_SECRET}]", "guardrails[0].url"),
            ("guardrails: [{name: s, kind: webhook, url: 'http://x/', secret_env: NOT_SET}]", "guardrails[0].secret_env"),
            ("guardrails: [{name: s, kind: pii, price_per_check: -1}]", "guardrails[0].price_per_check"),
            ("guardrails: [{name: s, kind: pii, url: 'http://x/'}]", "guardrails[0].url"),
            ("guardrails: [{name: s, kind: moderation, model: nope}]", "guardrails[0].model"),
            ("guardrails: [{name: s, kind: pii, model: m}]", "guardrails[0].model"),
            ("guardrails: [{name: s, kind: pii}, {name: s, kind: secrets}]", "guardrails[1].name"),
            ("guardrails: [{name: s, kind: bedrock, guardrail_id: g, guardrail_version: '1'}]", "guardrails[0].provider"),
            ("guardrails: [{name: s, kind: bedrock, provider: nope, guardrail_id: g, guardrail_version: '1'}]", "guardrails[0].provider"),
            ("guardrails: [{name: s, kind: pii, guardrail_id: g}]", "guardrails[0].guardrail_id"),
            ("groups: {default: {platforms: [openai], guardrails: [nope]}}", "groups.default.guardrails[0]"),
            ("accounts: [{name: t, guardrails: [nope]}]", "accounts[0].guardrails[0]"),
            ("keys: [{key: sk-a-1234567890, name: a, guardrails: [nope]}]", "keys[0].guardrails[0]"),
        ] {
            let e = parse(yaml).expect_err(yaml);
            assert!(e.starts_with(named), "{yaml}: {e}");
        }
    }
}
