//! `mcp:`: the MCP servers tollgate fronts at `/mcp` (Streamable HTTP or the older HTTP+SSE
//! transport), each with its own credentials, the tools it may show and a price per call.
//! Checked here without calling out; the servers are reached when a client asks.

use super::{err, secret, ConfigError};
use crate::policy::ModelRules;
use serde::Deserialize;

/// How tollgate talks to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum McpTransport {
    /// One endpoint; answers as JSON or SSE; `Mcp-Session-Id` (revisions 2025-03-26 on).
    StreamableHttp,
    /// The 2024-11-05 transport: a GET stream that names the endpoint messages are posted to
    /// and carries every answer.
    Sse,
}

/// How tollgate authenticates to a server (never with a client's key).
#[derive(Debug, Clone, PartialEq)]
pub enum McpAuth {
    None,
    /// Headers sent as they are (`Authorization: Bearer …` for `bearer_env`).
    Headers(Vec<(String, String)>),
    /// The OAuth 2.0 client-credentials grant: a token fetched from `token_url` and sent as a
    /// bearer token until it expires (or the server refuses it: 401).
    ClientCredentials {
        token_url: String,
        client_id: String,
        client_secret: String,
        scope: Option<String>,
    },
}

/// One server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerConfig {
    /// Its tools are listed as `name__tool` (unless `prefix` is false).
    pub name: String,
    /// Its tools and prompts carry `name__` in front (false: their own names; see `mcp()`).
    pub prefix: bool,
    pub url: String,
    pub transport: McpTransport,
    pub auth: McpAuth,
    /// Which of its tools (its own names) tollgate shows and calls.
    pub tools: Option<ModelRules>,
    /// What one `tools/call` costs (nano-USD; 0: free).
    pub per_call_nanos: i64,
    /// How long a call may take, read to read.
    pub timeout_secs: u64,
}

/// `mcp:`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct McpConfig {
    pub servers: Vec<McpServerConfig>,
    /// The browser origins (`scheme://host[:port]`, lowercase) whose pages may call `/mcp`; a
    /// request with an `Origin` header of another is refused (403), one without passes (SDK
    /// and CLI clients send none). Empty: no browser page.
    pub allowed_origins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcp {
    #[serde(default)]
    servers: Vec<RawServer>,
    #[serde(default)]
    allowed_origins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    name: String,
    url: String,
    #[serde(default)]
    prefix: Option<bool>,
    #[serde(default)]
    transport: Option<McpTransport>,
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    tools: Option<ModelRules>,
    #[serde(default)]
    prices: Option<RawPrices>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    /// `Authorization: Bearer $VAR`.
    #[serde(default)]
    bearer_env: Option<String>,
    /// A header of the server's choosing (`header`), its value from `header_env`.
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    header_env: Option<String>,
    #[serde(default)]
    oauth: Option<RawOauth>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOauth {
    token_url: String,
    client_id: String,
    client_secret_env: String,
    #[serde(default)]
    scope: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrices {
    /// USD per call.
    #[serde(default)]
    per_call: Option<f64>,
}

/// The longest a call may be given (`timeout_secs`).
const MAX_TIMEOUT_SECS: u64 = 3600;

fn http_url(at: &str, url: &str) -> Result<String, ConfigError> {
    let uri: http::Uri = url.parse().map_err(|e| ConfigError(format!("{at}: not a URL ({e})")))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(url.to_string()),
        _ => err(format!("{at}: an http:// or https:// URL")),
    }
}

fn auth(at: &str, raw: Option<RawAuth>, env: &dyn Fn(&str) -> Option<String>) -> Result<McpAuth, ConfigError> {
    let Some(a) = raw else { return Ok(McpAuth::None) };
    let given = [a.bearer_env.is_some(), a.header_env.is_some(), a.oauth.is_some()].iter().filter(|g| **g).count();
    if given > 1 {
        return err(format!("{at}: one of bearer_env, header_env (with header) or oauth"));
    }
    if a.header.is_some() != a.header_env.is_some() {
        return err(format!("{at}: header and header_env go together"));
    }
    let printable = |v: &str| !v.is_empty() && v.bytes().all(|b| (0x20..0x7f).contains(&b));
    if let Some(var) = a.bearer_env {
        let token = secret(&format!("{at}.bearer"), None, Some(var), env)?.unwrap_or_default();
        if !printable(&token) {
            return err(format!("{at}.bearer_env: the token must be printable ASCII"));
        }
        return Ok(McpAuth::Headers(vec![("authorization".into(), format!("Bearer {token}"))]));
    }
    if let (Some(name), Some(var)) = (a.header, a.header_env) {
        let value = secret(&format!("{at}.header"), None, Some(var), env)?.unwrap_or_default();
        let name = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() || !printable(&value) {
            return err(format!("{at}.header: a header name, and a printable ASCII value in header_env"));
        }
        return Ok(McpAuth::Headers(vec![(name, value)]));
    }
    if let Some(o) = a.oauth {
        let token_url = http_url(&format!("{at}.oauth.token_url"), &o.token_url)?;
        let client_secret = secret(&format!("{at}.oauth.client_secret"), None, Some(o.client_secret_env), env)?.unwrap_or_default();
        return Ok(McpAuth::ClientCredentials { token_url, client_id: o.client_id, client_secret, scope: o.scope });
    }
    Ok(McpAuth::None)
}

pub(super) fn mcp(raw: Option<RawMcp>, env: &dyn Fn(&str) -> Option<String>) -> Result<McpConfig, ConfigError> {
    let Some(raw) = raw else { return Ok(McpConfig::default()) };
    let mut servers: Vec<McpServerConfig> = Vec::with_capacity(raw.servers.len());
    for (i, s) in raw.servers.into_iter().enumerate() {
        let at = format!("mcp.servers[{i}]");
        if !crate::protocol::mcp::valid_server_name(&s.name) {
            return err(format!("{at}.name: '{}' — 1 to 32 letters, digits, '-' or '_', no '__', not ending in '_'", s.name));
        }
        if servers.iter().any(|o| o.name == s.name) {
            return err(format!("{at}.name: '{}' is named twice", s.name));
        }
        let url = http_url(&format!("{at}.url"), &s.url)?;
        if let Some(rules) = &s.tools {
            rules.validate_as("tools").map_err(|e| ConfigError(format!("{at}.{e}")))?;
        }
        let per_call = s.prices.and_then(|p| p.per_call).unwrap_or(0.0);
        if !(per_call.is_finite() && (0.0..=1000.0).contains(&per_call)) {
            return err(format!("{at}.prices.per_call: 0 to 1000 USD"));
        }
        let timeout_secs = s.timeout_secs.unwrap_or(300);
        if !(1..=MAX_TIMEOUT_SECS).contains(&timeout_secs) {
            return err(format!("{at}.timeout_secs: 1 to {MAX_TIMEOUT_SECS}"));
        }
        servers.push(McpServerConfig {
            auth: auth(&format!("{at}.auth"), s.auth, env)?,
            prefix: s.prefix.unwrap_or(true),
            name: s.name,
            url,
            transport: s.transport.unwrap_or(McpTransport::StreamableHttp),
            tools: s.tools,
            per_call_nanos: crate::base::money::usd_to_nanos(per_call),
            timeout_secs,
        });
    }
    unprefixed_names_cannot_collide(&servers)?;
    let mut allowed_origins = Vec::with_capacity(raw.allowed_origins.len());
    for (i, o) in raw.allowed_origins.iter().enumerate() {
        allowed_origins.push(origin(&format!("mcp.allowed_origins[{i}]"), o)?);
    }
    Ok(McpConfig { servers, allowed_origins })
}

/// `prefix: false` only where no two tools or prompts can carry one name: the one server, or
/// servers whose `tools.allow` name their tools exactly (no `*`), no name in two lists, none
/// of the form `<a prefixed server>__…`. (A prefixed server's names always carry its prefix,
/// which no other server's may take: see `mcp::hub`.)
fn unprefixed_names_cannot_collide(servers: &[McpServerConfig]) -> Result<(), ConfigError> {
    if servers.len() <= 1 {
        return Ok(());
    }
    let prefixed: Vec<&str> = servers.iter().filter(|s| s.prefix).map(|s| s.name.as_str()).collect();
    let mut seen: Vec<&str> = Vec::new();
    for (i, s) in servers.iter().enumerate().filter(|(_, s)| !s.prefix) {
        let exact = s.tools.as_ref().and_then(|r| r.allow.as_ref()).filter(|names| names.iter().all(|n| !n.contains('*')));
        let Some(names) = exact else {
            return err(format!(
                "mcp.servers[{i}].prefix: false with several servers needs tools.allow naming its tools exactly (no '*'), so no two servers' names can collide"
            ));
        };
        for n in names {
            let taken = seen.contains(&n.as_str()) || crate::protocol::mcp::split(n).is_some_and(|(server, _)| prefixed.contains(&server));
            if taken {
                return err(format!("mcp.servers[{i}].tools.allow: '{}' is also another server's name", crate::base::text::clip(n, 100)));
            }
            seen.push(n);
        }
    }
    Ok(())
}

/// An origin as browsers send it: `http://` or `https://`, a host, perhaps a port, nothing
/// after; lowercase.
fn origin(at: &str, text: &str) -> Result<String, ConfigError> {
    let uri: Option<http::Uri> = text.parse().ok();
    match uri.as_ref().map(|u| (u.scheme_str(), u.host(), u.path_and_query().map(|p| p.as_str()))) {
        Some((Some("http" | "https"), Some(_), None | Some("" | "/"))) if !text.ends_with('/') => Ok(text.to_ascii_lowercase()),
        _ => err(format!(
            "{at}: '{}' is not an origin (http:// or https://, a host and perhaps a port, no path)",
            crate::base::text::clip(text, 100)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<McpConfig, ConfigError> {
        let raw: RawMcp = serde_yaml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        mcp(Some(raw), &|name| (name == "DOCS_TOKEN").then(|| "t0k3n".to_string()))
    }

    #[test]
    fn a_server_block_is_read_with_its_credentials_tools_and_price() {
        let c = parse(
            "servers:\n  - { name: docs, url: 'http://127.0.0.1:9/mcp', auth: { bearer_env: DOCS_TOKEN }, tools: { deny: [drop*] }, prices: { per_call: 0.002 } }\n  - { name: old, url: 'https://x.example/sse', transport: sse, auth: { header: X-Api-Key, header_env: DOCS_TOKEN } }\n",
        )
        .expect("valid");
        let docs = &c.servers[0];
        assert_eq!(docs.auth, McpAuth::Headers(vec![("authorization".into(), "Bearer t0k3n".into())]));
        assert_eq!((docs.per_call_nanos, docs.transport, docs.timeout_secs), (2_000_000, McpTransport::StreamableHttp, 300));
        assert_eq!(c.servers[1].auth, McpAuth::Headers(vec![("x-api-key".into(), "t0k3n".into())]));
        assert_eq!(c.servers[1].transport, McpTransport::Sse);
        assert!(c.allowed_origins.is_empty(), "no browser page unless named");
        let one = parse("servers: [{ name: solo, url: 'http://h/mcp', prefix: false }]").expect("one server keeps its names");
        assert!(!one.servers[0].prefix && c.servers[0].prefix);
        parse("servers: [{ name: a, url: 'http://h/mcp', prefix: false, tools: { allow: [x, y] } }, { name: b, url: 'http://h/mcp' }, { name: c, url: 'http://h/mcp', prefix: false, tools: { allow: [z] } }]")
            .expect("exact, disjoint names");
        let allowed = parse("allowed_origins: ['https://App.example', 'http://localhost:5173']").expect("valid");
        assert_eq!(allowed.allowed_origins, ["https://app.example", "http://localhost:5173"]);
    }

    #[test]
    fn bad_blocks_are_refused_naming_the_field() {
        for (text, says) in [
            ("servers: [{ name: 'a__b', url: 'http://h/mcp' }]", "mcp.servers[0].name"),
            ("servers: [{ name: a, url: 'http://h/mcp' }, { name: a, url: 'http://h/mcp' }]", "named twice"),
            ("servers: [{ name: a, url: 'ftp://h/mcp' }]", "mcp.servers[0].url"),
            ("servers: [{ name: a, url: 'http://h/mcp', auth: { bearer_env: NOPE } }]", "NOPE is not set"),
            ("servers: [{ name: a, url: 'http://h/mcp', auth: { header: X-K } }]", "go together"),
            ("servers: [{ name: a, url: 'http://h/mcp', tools: { allow: [] } }]", "tools.allow"),
            ("servers: [{ name: a, url: 'http://h/mcp', prices: { per_call: -1 } }]", "per_call"),
            ("servers: [{ name: a, url: 'http://h/mcp', timeout_secs: 0 }]", "timeout_secs"),
            ("servers: [{ name: a, url: 'http://h/mcp', transport: websocket }]", "unknown variant"),
            ("allowed_origins: ['https://app.example/path']", "mcp.allowed_origins[0]"),
            ("servers: [{ name: a, url: 'http://h/mcp', prefix: false }, { name: b, url: 'http://h/mcp' }]", "mcp.servers[0].prefix"),
            (
                "servers: [{ name: a, url: 'http://h/mcp', prefix: false, tools: { allow: [x*] } }, { name: b, url: 'http://h/mcp' }]",
                "no '*'",
            ),
            (
                "servers: [{ name: a, url: 'http://h/mcp', prefix: false, tools: { allow: [x, y] } }, { name: b, url: 'http://h/mcp', prefix: false, tools: { allow: [y] } }]",
                "'y' is also",
            ),
            (
                "servers: [{ name: a, url: 'http://h/mcp', prefix: false, tools: { allow: [b__x] } }, { name: b, url: 'http://h/mcp' }]",
                "'b__x' is also",
            ),
            ("allowed_origins: ['https://ok.example', '*']", "mcp.allowed_origins[1]"),
            ("allowed_origins: ['app.example']", "not an origin"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.0.contains(says), "{text}: {e}");
        }
    }
}
