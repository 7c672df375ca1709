//! `identity:`: the OpenID Connect provider people sign in with, and whose access tokens
//! clients may present instead of gateway keys. Checked here without calling out: the
//! provider's documents are fetched by the identity service at start, never by `-t`.

use super::{err, ConfigError};
use serde::Deserialize;

/// `identity.oidc`, as the service uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct OidcConfig {
    /// The issuer, exactly as tokens name it (`iss`), without a trailing slash.
    pub issuer: String,
    pub client_id: String,
    /// From the variable `client_secret_env` names (None: a public client, PKCE alone).
    pub client_secret: Option<String>,
    pub client_secret_env: Option<String>,
    pub scopes: Vec<String>,
    /// The claim holding a person's roles (a list; a dotted path reaches into objects, as
    /// Keycloak's `realm_access.roles`).
    pub claim_roles: String,
    /// The claim holding a person's teams (a list of account names).
    pub claim_teams: String,
    /// What a client's access token must name in `aud` (default: `client_id`).
    pub audience: String,
    /// The group a person's key is made in (default `default`).
    pub group: String,
    /// What a person's own key may spend before its team's account (nano-USD; default 0: a
    /// team admin or operator tops it up).
    pub allowance_nanos: i64,
    /// Seconds of clock difference tolerated on `exp`, `nbf` and `iat` (default 60).
    pub clock_skew_secs: u64,
}

/// `identity:` (None without an `oidc` block).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IdentityConfig {
    pub oidc: Option<OidcConfig>,
    /// `identity.signup`: people who sign in and belong to no team get an account of their own.
    pub signup: Option<SignupConfig>,
    /// `identity.claude_code`: Claude Code's gateway sign-in.
    pub claude_code: Option<super::claude_code::ClaudeCodeConfig>,
}

/// `identity.signup`, checked (its group and plan against the file's by `Config::parse`).
#[derive(Debug, Clone, PartialEq)]
pub struct SignupConfig {
    /// False: nobody new gets an account (those who have one keep it).
    pub open: bool,
    /// What a new account starts with, granted once per person (nano-USD).
    pub credit_nanos: i64,
    /// The group of the keys a signed-up person makes.
    pub group: String,
    /// The plan a new account subscribes to.
    pub plan: Option<String>,
    /// Email domains (lowercase) a person's verified email must be of; empty: any.
    pub allowed_domains: Vec<String>,
    /// Accounts made for one client address per hour, at most.
    pub per_address_per_hour: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    #[serde(default)]
    oidc: Option<RawOidc>,
    #[serde(default)]
    signup: Option<RawSignup>,
    #[serde(default)]
    claude_code: Option<super::claude_code::RawClaudeCode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSignup {
    open: bool,
    /// USD.
    #[serde(default)]
    credit: f64,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    plan: Option<String>,
    #[serde(default)]
    allowed_domains: Vec<String>,
    #[serde(default)]
    per_address_per_hour: Option<u32>,
}

fn signup(raw: Option<RawSignup>, oidc: &OidcConfig) -> Result<Option<SignupConfig>, ConfigError> {
    let Some(s) = raw else { return Ok(None) };
    if !(s.credit.is_finite() && (0.0..=1e6).contains(&s.credit)) {
        return err("identity.signup.credit: USD, 0 to 1,000,000");
    }
    let mut allowed_domains = Vec::new();
    for d in &s.allowed_domains {
        let d = d.trim().trim_start_matches('@').to_ascii_lowercase();
        if d.is_empty() || d.len() > 253 || !d.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-') {
            return err(format!("identity.signup.allowed_domains: '{d}' is not a domain name"));
        }
        allowed_domains.push(d);
    }
    let per_address_per_hour = s.per_address_per_hour.unwrap_or(5);
    if !(1..=10_000).contains(&per_address_per_hour) {
        return err("identity.signup.per_address_per_hour: 1 to 10000");
    }
    Ok(Some(SignupConfig {
        open: s.open,
        credit_nanos: crate::base::money::usd_to_nanos(s.credit),
        group: s.group.filter(|g| !g.is_empty()).unwrap_or_else(|| oidc.group.clone()),
        plan: s.plan.filter(|p| !p.is_empty()),
        allowed_domains,
        per_address_per_hour,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOidc {
    issuer: String,
    client_id: String,
    #[serde(default)]
    client_secret_env: Option<String>,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    claim_roles: Option<String>,
    #[serde(default)]
    claim_teams: Option<String>,
    #[serde(default)]
    audience: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    allowance: Option<f64>,
    #[serde(default)]
    clock_skew_secs: Option<u64>,
}

pub(super) fn identity(raw: Option<RawIdentity>, env: &dyn Fn(&str) -> Option<String>) -> Result<IdentityConfig, ConfigError> {
    let Some(raw) = raw else { return Ok(IdentityConfig::default()) };
    let raw_signup = raw.signup;
    let claude_code = super::claude_code::claude_code(raw.claude_code, raw.oidc.is_some())?;
    let Some(oidc) = raw.oidc else {
        if raw_signup.is_some() {
            return err("identity.signup: people sign up by signing in with identity.oidc, which is not configured");
        }
        return Ok(IdentityConfig::default());
    };
    let issuer = oidc.issuer.trim().trim_end_matches('/').to_string();
    let uri: http::Uri = issuer.parse().map_err(|e| ConfigError(format!("identity.oidc.issuer: not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if crate::base::text::loopback_url(&issuer) => {}
        Some("http") => return err("identity.oidc.issuer: must be https (plain http only for a provider on this machine)"),
        _ => return err("identity.oidc.issuer: an https URL, as the provider's tokens name it (iss)"),
    }
    if uri.query().is_some() || uri.host().is_none() {
        return err("identity.oidc.issuer: a URL without a query, as the provider's tokens name it (iss)");
    }
    if oidc.client_id.trim().is_empty() {
        return err("identity.oidc.client_id: required (the client registered at the provider for tollgate)");
    }
    let client_secret = match &oidc.client_secret_env {
        Some(name) => Some(
            env(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| ConfigError(format!("identity.oidc.client_secret_env: the variable {name} is not set (or empty)")))?,
        ),
        None => None,
    };
    let scopes = oidc.scopes.unwrap_or_else(|| ["openid", "email", "profile"].map(String::from).to_vec());
    if !scopes.iter().any(|s| s == "openid") {
        return err("identity.oidc.scopes: must include openid");
    }
    if scopes.iter().any(|s| s.is_empty() || s.contains(char::is_whitespace)) {
        return err("identity.oidc.scopes: each a scope name without spaces");
    }
    let claim = |name: &str, value: Option<String>, default: &str| -> Result<String, ConfigError> {
        let v = value.unwrap_or_else(|| default.to_string());
        if v.is_empty() || v.split('.').any(str::is_empty) {
            return err(format!("identity.oidc.{name}: a claim name (a dotted path reaches into objects)"));
        }
        Ok(v)
    };
    let allowance = oidc.allowance.unwrap_or(0.0);
    if !allowance.is_finite() || allowance < 0.0 {
        return err("identity.oidc.allowance: USD, 0 or more");
    }
    let clock_skew_secs = oidc.clock_skew_secs.unwrap_or(60);
    if clock_skew_secs > 600 {
        return err("identity.oidc.clock_skew_secs: 0 to 600");
    }
    let oidc = OidcConfig {
        issuer,
        audience: oidc.audience.filter(|a| !a.is_empty()).unwrap_or_else(|| oidc.client_id.clone()),
        client_id: oidc.client_id,
        client_secret,
        client_secret_env: oidc.client_secret_env,
        scopes,
        claim_roles: claim("claim_roles", oidc.claim_roles, "roles")?,
        claim_teams: claim("claim_teams", oidc.claim_teams, "teams")?,
        group: oidc.group.filter(|g| !g.is_empty()).unwrap_or_else(|| "default".into()),
        allowance_nanos: crate::base::money::usd_to_nanos(allowance),
        clock_skew_secs,
    };
    let signup = signup(raw_signup, &oidc)?;
    Ok(IdentityConfig { oidc: Some(oidc), signup, claude_code })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "listen: 127.0.0.1:8080\nproviders:\n  - { name: oa, protocol: openai, base_url: \"https://api.example.com\", api_key: k, models: [m] }\nprices:\n  m: { input: 1, output: 1 }\n";

    fn parse(extra: &str) -> Result<Config, String> {
        let env = |name: &str| (name == "OIDC_SECRET").then(|| "s3cret".to_string());
        Config::parse(&format!("{BASE}{extra}"), &env).map_err(|e| e.0)
    }

    const OIDC: &str = "identity:\n  oidc: { issuer: \"https://idp.example.com/\", client_id: tollgate, client_secret_env: OIDC_SECRET }\n";

    #[test]
    fn the_provider_block_is_read_with_its_defaults_and_checked_without_calling_out() {
        let c = parse(OIDC).expect("valid");
        let o = c.identity.oidc.expect("oidc");
        assert_eq!(
            (o.issuer.as_str(), o.audience.as_str(), o.client_secret.as_deref()),
            ("https://idp.example.com", "tollgate", Some("s3cret"))
        );
        assert_eq!((o.claim_roles.as_str(), o.claim_teams.as_str(), o.group.as_str(), o.allowance_nanos), ("roles", "teams", "default", 0));
        assert_eq!(o.scopes, ["openid", "email", "profile"]);
        assert!(parse("identity:\n  oidc: { issuer: \"http://127.0.0.1:9000\", client_id: t }\n").is_ok(), "plain http on this machine");
        for (bad, says) in [
            ("identity:\n  oidc: { issuer: \"http://idp.example.com\", client_id: t }\n", "must be https"),
            ("identity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: \"\" }\n", "client_id"),
            ("identity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: t, client_secret_env: UNSET }\n", "UNSET is not set"),
            ("identity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: t, scopes: [email] }\n", "must include openid"),
            ("identity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: t, claim_roles: \"a..b\" }\n", "claim_roles"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn sign_up_needs_the_provider_and_a_known_group_and_plan() {
        let signup = "  signup: { open: true, credit: 2.5, allowed_domains: [\"@Example.com\"] }\n";
        let c = parse(&format!("{OIDC}{signup}")).expect("valid");
        let s = c.identity.signup.expect("signup");
        assert_eq!(
            (s.open, s.credit_nanos, s.group.as_str(), s.allowed_domains.clone(), s.per_address_per_hour),
            (true, 2_500_000_000, "default", vec!["example.com".to_string()], 5)
        );
        let e = parse(&format!("identity:\n{signup}")).expect_err("no oidc");
        assert!(e.contains("identity.oidc"), "{e}");
        for (extra, says) in [
            ("  signup: { open: true, group: nope }\n", "identity.signup.group"),
            ("  signup: { open: true, plan: nope }\n", "identity.signup.plan"),
            ("  signup: { open: true, credit: -1 }\n", "identity.signup.credit"),
            ("  signup: { open: true, allowed_domains: [\"a b\"] }\n", "allowed_domains"),
        ] {
            let e = parse(&format!("{OIDC}{extra}")).expect_err(extra);
            assert!(e.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn the_console_faces_a_network_only_with_sign_in_by_the_provider_and_tls() {
        let listen = "console: { listen: \"0.0.0.0:8443\", public_url: \"https://console.example.com\" }\n";
        let e = parse(listen).expect_err("no oidc");
        assert!(e.contains("identity.oidc"), "{e}");
        let e = parse(&format!("{OIDC}{listen}")).expect_err("no tls");
        assert!(e.contains("console.tls"), "{e}");
        let ok = "console: { listen: \"0.0.0.0:8443\", public_url: \"https://console.example.com\", tls: { cert: c.pem, key: k.pem } }\n";
        let c = parse(&format!("{OIDC}{ok}")).expect("valid");
        assert_eq!(c.console_listen.expect("listen").public_url, "https://console.example.com");
        let e = parse(&format!("{OIDC}console: {{ listen: \"0.0.0.0:8443\", tls: {{ cert: c.pem, key: k.pem }} }}\n")).expect_err("no url");
        assert!(e.contains("public_url"), "{e}");
        let local = parse("console: { listen: \"127.0.0.1:8090\" }\n").expect("loopback needs neither");
        assert_eq!(local.console_listen.expect("listen").public_url, "http://127.0.0.1:8090");
    }
}
