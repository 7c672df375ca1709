//! `identity.claude_code`: Claude Code's gateway sign-in (its device flow, tollgate's own
//! tokens, managed settings per team and role, the telemetry relay). Checked here without
//! calling out.

use super::{err, ConfigError};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The most a relayed telemetry export may hold, by default (bytes).
pub const DEFAULT_TELEMETRY_BYTES: usize = 4 << 20;

/// `identity.claude_code`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaudeCodeConfig {
    /// The base URL clients sign in at (`https://gw.example.com`); None: the scheme and `Host`
    /// of each request (only where the listener is reached under one name).
    pub public_url: Option<String>,
    /// How long an access token lives (seconds; default one hour).
    pub token_ttl_secs: u64,
    /// How long a refresh token lives from the sign-in that made it (seconds; default 30 days).
    pub refresh_ttl_secs: u64,
    /// Managed settings: for everyone, per team (account name) and per role.
    pub settings: ManagedSettings,
    /// Where the clients' telemetry goes (OTLP/HTTP base URL); None: answered and dropped.
    pub telemetry_endpoint: Option<String>,
    /// Headers sent with each relayed export (a collector's credential).
    pub telemetry_headers: Vec<(String, String)>,
    /// The largest export relayed (bytes); a larger one is 413.
    pub telemetry_max_bytes: usize,
}

/// `identity.claude_code.settings`: each a JSON object, as Claude Code's
/// `managed-settings.json` holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ManagedSettings {
    pub default: Option<Map<String, Value>>,
    pub teams: BTreeMap<String, Map<String, Value>>,
    pub roles: BTreeMap<String, Map<String, Value>>,
}

impl ManagedSettings {
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.teams.is_empty() && self.roles.is_empty()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClaudeCode {
    #[serde(default)]
    public_url: Option<String>,
    #[serde(default)]
    token_ttl: Option<String>,
    #[serde(default)]
    refresh_ttl: Option<String>,
    #[serde(default)]
    settings: Option<RawSettings>,
    #[serde(default)]
    telemetry: Option<RawTelemetry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    #[serde(default)]
    default: Option<serde_yaml::Value>,
    #[serde(default)]
    teams: BTreeMap<String, serde_yaml::Value>,
    #[serde(default)]
    roles: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    max_bytes: Option<usize>,
}

/// A duration as written: digits and `s`, `m`, `h` or `d`.
fn secs(label: &str) -> Option<u64> {
    let unit = match label.as_bytes().last()? {
        b's' => 1,
        b'm' => 60,
        b'h' => 3_600,
        b'd' => 86_400,
        _ => return None,
    };
    let digits = &label[..label.len() - 1];
    if digits.is_empty() || digits.len() > 7 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// A settings object from YAML, as JSON (numbers, strings, booleans, lists and objects).
fn object(at: &str, v: serde_yaml::Value) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => err(format!("{at}: an object of Claude Code settings (as managed-settings.json holds them)")),
        Err(e) => err(format!("{at}: not representable as JSON ({e})")),
    }
}

pub(super) fn claude_code(raw: Option<RawClaudeCode>, has_oidc: bool) -> Result<Option<ClaudeCodeConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    if !has_oidc {
        return err("identity.claude_code: people sign in through identity.oidc, which is not configured");
    }
    let public_url = match raw.public_url.map(|u| u.trim().trim_end_matches('/').to_string()) {
        None => None,
        Some(u) => {
            let uri: http::Uri = u.parse().map_err(|e| ConfigError(format!("identity.claude_code.public_url: not a URL ({e})")))?;
            match uri.scheme_str() {
                Some("https") => {}
                Some("http") if crate::base::text::loopback_url(&u) => {}
                _ => {
                    return err(
                        "identity.claude_code.public_url: https (Claude Code takes plain http only for localhost, 127.0.0.1 and [::1])",
                    )
                }
            }
            if uri.host().is_none() || uri.query().is_some() || uri.path().len() > 1 {
                return err("identity.claude_code.public_url: scheme, host and port only (the base URL clients are given)");
            }
            Some(u)
        }
    };
    let ttl = |name: &str, v: Option<String>, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        match secs(v.trim()) {
            Some(s) if (min..=max).contains(&s) => Ok(s),
            _ => err(format!("identity.claude_code.{name}: a duration ('90s', '15m', '1h', '30d') from {min} s to {max} s")),
        }
    };
    let token_ttl_secs = ttl("token_ttl", raw.token_ttl, 3_600, 60, 86_400)?;
    let refresh_ttl_secs = ttl("refresh_ttl", raw.refresh_ttl, 30 * 86_400, 3_600, 366 * 86_400)?;
    let mut settings = ManagedSettings::default();
    if let Some(s) = raw.settings {
        settings.default = s.default.map(|v| object("identity.claude_code.settings.default", v)).transpose()?;
        for (team, v) in s.teams {
            settings.teams.insert(team.clone(), object(&format!("identity.claude_code.settings.teams.{team}"), v)?);
        }
        for (role, v) in s.roles {
            if !matches!(role.as_str(), "member" | "team_admin" | "operator") {
                return err(format!("identity.claude_code.settings.roles.{role}: a role is member, team_admin or operator"));
            }
            settings.roles.insert(role.clone(), object(&format!("identity.claude_code.settings.roles.{role}"), v)?);
        }
    }
    let telemetry = raw.telemetry.unwrap_or(RawTelemetry { endpoint: None, headers: BTreeMap::new(), max_bytes: None });
    let telemetry_endpoint = match telemetry.endpoint.map(|e| e.trim().trim_end_matches('/').to_string()) {
        None => None,
        Some(e) => {
            let url = reqwest::Url::parse(&e)
                .map_err(|why| ConfigError(format!("identity.claude_code.telemetry.endpoint: not a URL ({why})")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return err("identity.claude_code.telemetry.endpoint: the collector's http:// or https:// base URL (/v1/logs is added)");
            }
            Some(e)
        }
    };
    let mut telemetry_headers = Vec::new();
    for (name, value) in telemetry.headers {
        let name = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() || http::HeaderValue::from_str(&value).is_err() {
            return err(format!("identity.claude_code.telemetry.headers: '{name}' is not a valid header"));
        }
        telemetry_headers.push((name, value));
    }
    let telemetry_max_bytes = telemetry.max_bytes.unwrap_or(DEFAULT_TELEMETRY_BYTES);
    if !(1024..=64 << 20).contains(&telemetry_max_bytes) {
        return err("identity.claude_code.telemetry.max_bytes: 1024 to 67108864");
    }
    Ok(Some(ClaudeCodeConfig {
        public_url,
        token_ttl_secs,
        refresh_ttl_secs,
        settings,
        telemetry_endpoint,
        telemetry_headers,
        telemetry_max_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "listen: 127.0.0.1:8080\nproviders:\n  - { name: oa, protocol: openai, base_url: \"https://api.example.com\", api_key: k, models: [m] }\nprices:\n  m: { input: 1, output: 1 }\nidentity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: tollgate }\n";

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{extra}"), &|_| None).map_err(|e| e.0)
    }

    #[test]
    fn the_block_is_read_with_its_defaults_and_its_settings_as_json_objects() {
        let c = parse("  claude_code:\n    settings:\n      default: { model: m, permissions: { deny: [WebFetch] } }\n      teams: { research: { env: { A: \"1\" } } }\n      roles: { team_admin: { cleanupPeriodDays: 7 } }\n").expect("valid");
        let cc = c.identity.claude_code.expect("claude_code");
        assert_eq!(
            (cc.token_ttl_secs, cc.refresh_ttl_secs, cc.public_url.clone(), cc.telemetry_max_bytes),
            (3600, 30 * 86400, None, 4 << 20)
        );
        assert_eq!(
            cc.settings.default.as_ref().and_then(|d| d.get("permissions")).map(|p| p.to_string()).as_deref(),
            Some("{\"deny\":[\"WebFetch\"]}")
        );
        assert_eq!(cc.settings.roles["team_admin"]["cleanupPeriodDays"], 7);
        let c = parse("  claude_code: { token_ttl: 3m, refresh_ttl: 2h, public_url: \"https://gw.example.com/\", telemetry: { endpoint: \"http://otel:4318\" } }\n").expect("valid");
        let cc = c.identity.claude_code.expect("claude_code");
        assert_eq!((cc.token_ttl_secs, cc.refresh_ttl_secs, cc.public_url.as_deref()), (180, 7200, Some("https://gw.example.com")));
        assert_eq!(cc.telemetry_endpoint.as_deref(), Some("http://otel:4318"));
        for (bad, says) in [
            ("  claude_code: { token_ttl: 5s }\n", "token_ttl"),
            ("  claude_code: { token_ttl: forever }\n", "token_ttl"),
            ("  claude_code: { public_url: \"http://gw.example.com\" }\n", "https"),
            ("  claude_code: { public_url: \"https://gw.example.com/base\" }\n", "scheme, host and port only"),
            ("  claude_code: { settings: { default: [1, 2] } }\n", "an object"),
            ("  claude_code: { settings: { roles: { wizard: {} } } }\n", "roles.wizard"),
            ("  claude_code: { telemetry: { endpoint: \"ftp://x\" } }\n", "telemetry.endpoint"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = Config::parse("listen: 127.0.0.1:8080\nidentity:\n  claude_code: {}\n", &|_| None).map(|_| ()).expect_err("no oidc").0;
        assert!(e.contains("identity.oidc"), "{e}");
    }
}
