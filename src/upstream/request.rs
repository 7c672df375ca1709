//! The request an upstream gets and the answer a client gets back: allowlisted headers both
//! ways, allowed query parameters, the upstream's path; the credential is the seam's.

use super::catalog::Upstream;
use super::path::Destination;
use super::seam::Call;
use crate::config::Protocol;
use bytes::Bytes;
use pingora_http::RequestHeader;

/// Client headers relayed upstream, besides the operator's `forward_headers`. Everything else
/// a client sends is dropped: credentials, account selectors (`OpenAI-Organization`,
/// `OpenAI-Project`, `x-goog-user-project`), response shaping (`X-Goog-FieldMask`), cookies.
const COMMON_HEADERS: [&str; 3] = ["content-type", "accept", "user-agent"];

/// Header-name prefixes relayed for every protocol: the official SDKs' platform and retry
/// headers.
const COMMON_PREFIXES: [&str; 1] = ["x-stainless-"];

/// Whether a client header (lower-case name) may go to an upstream of `protocol`.
pub fn header_allowed(name: &str, protocol: Protocol, forward: &[String]) -> bool {
    if crate::protocol::never_forwarded(name) {
        return false;
    }
    COMMON_HEADERS.contains(&name)
        || protocol.relayed_headers().contains(&name)
        || COMMON_PREFIXES.iter().any(|p| name.starts_with(p))
        || listed(name, forward)
}

/// Whether `name` is one of the operator's header patterns (a trailing `*` makes a prefix).
fn listed(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|f| match f.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => f == name,
    })
}

/// Upstream response headers every client gets: framing and content (Pingora re-frames the
/// body, see `gateway::prepare_response_header`), caching, and when to retry. Everything else
/// an upstream sends is dropped unless allowlisted for its protocol or by the operator
/// (`forward_response_headers`): the operator's account identifiers (`openai-organization`,
/// `openai-project`, `anthropic-organization-id`), account-wide rate limits
/// (`x-ratelimit-*`, `anthropic-ratelimit-*`), cookies and the service's internal headers.
const COMMON_RESPONSE_HEADERS: [&str; 10] = [
    "content-type",
    "content-length",
    "transfer-encoding",
    "content-encoding",
    "content-disposition",
    "cache-control",
    "date",
    "retry-after",
    // The official SDKs' retry hints.
    "retry-after-ms",
    "x-should-retry",
];

/// Whether an upstream response header (lower-case name) may reach a client of `protocol`.
pub fn response_header_allowed(name: &str, protocol: Protocol, forward: &[String]) -> bool {
    if name == "set-cookie" {
        return false;
    }
    COMMON_RESPONSE_HEADERS.contains(&name) || protocol.response_headers().contains(&name) || listed(name, forward)
}

/// The request sent to `upstream` (its header and body), built from the client's: only
/// allowlisted client headers are copied (credentials, account selectors and answer shaping
/// never reach the operator's upstream account; also dropped: accept-encoding, since the usage
/// scanner needs plain bytes, and expect, since the whole body is already here), `Host` and the
/// body length are set; the provider's seam gives the path (the provider's prefix, only
/// allowlisted query parameters), the body (the model under the provider's name, the cloud's
/// own fields) and the credential (a key, `token` from its [`Seam::tokens`](super::seam::Seam::tokens)
/// — see [`bearer`] —, or a signature over both). Always HTTP/1.1 (an HTTP/2 client's request
/// included).
#[allow(clippy::too_many_arguments)]
pub fn upstream_request(
    client: &RequestHeader,
    upstream: &Upstream,
    key: usize,
    to: Destination<'_>,
    ask: &Ask<'_>,
    body: &Bytes,
    forward: &[String],
    token: Option<&http::HeaderValue>,
) -> pingora_error::Result<(RequestHeader, Bytes, Option<String>)> {
    let seam = &upstream.seam;
    let config = &upstream.config;
    let wire = match to {
        Destination::Translated(t) => t.upstream,
        Destination::Relayed(_) => config.wire(ask.model),
    };
    // The provider's rewrite rules that apply (none configured: nothing looked at).
    let rules = match config.rewrite.is_empty() {
        true => Vec::new(),
        false => super::rewrite::for_provider(
            &config.rewrite,
            &super::rewrite::Facts { model: ask.model, route: ask.route, headers: &client.headers },
        ),
    };
    let call = Call {
        client,
        to,
        model: super::rewrite::provider_model(config, &rules, ask.model),
        client_model: ask.model,
        wire,
        stream: ask.stream,
        client_version: ask.client_version,
    };
    let mut body = seam.body(&call, body)?;
    if !rules.is_empty() {
        body = super::rewrite::provider_body(&rules, body)?;
    }
    let path_and_query = seam.target(&call, &config.base_url.prefix);
    let mut req = RequestHeader::build(client.method.clone(), path_and_query.as_bytes(), Some(client.headers.len() + 4))?;
    for (name, value) in client.headers.iter() {
        if header_allowed(name.as_str(), wire, forward) {
            req.append_header(name.clone(), value.clone())?;
        }
    }
    // The group's rules (matched before the hold), then the provider's; then the framing and
    // the credential, so a signature covers what the rules left.
    if ask.group_rules.is_some() || !rules.is_empty() {
        super::rewrite::edit_headers(ask.group_rules.into_iter().flat_map(|g| g.iter()).chain(rules.iter().copied()), &mut req)?;
    }
    req.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    req.insert_header(http::header::HOST, upstream.host_value.clone())?;
    seam.authenticate(&mut req, key, token, &call, &body)?;
    let applied = (!rules.is_empty()).then(|| super::rewrite::ids(rules.into_iter()));
    Ok((req, body, applied))
}

/// The upgrade that opens a realtime session on `upstream` for `model` (the client's name):
/// `…/v1/realtime?model=<the provider's name>`, the client's WebSocket handshake headers (its
/// key, version and subprotocols less the one that carries its API key; never an extension, so
/// frames stay readable), the SDK headers, and the provider's credential.
pub fn realtime_request(
    client: &RequestHeader,
    upstream: &Upstream,
    key: usize,
    model: &str,
    token: Option<&http::HeaderValue>,
) -> pingora_error::Result<RequestHeader> {
    let theirs = upstream.config.upstream_model(model);
    let path = format!("{}/v1/realtime?model={}", upstream.config.base_url.prefix, crate::base::text::encode_component(theirs));
    let mut req = RequestHeader::build("GET", path.as_bytes(), Some(12))?;
    for name in ["sec-websocket-key", "sec-websocket-version", "openai-beta", "user-agent"] {
        if let Some(v) = client.headers.get(name) {
            req.insert_header(name, v.clone())?;
        }
    }
    for (name, value) in client.headers.iter().filter(|(n, _)| n.as_str().starts_with("x-stainless-")) {
        req.append_header(name.clone(), value.clone())?;
    }
    let offered = client.headers.get(http::header::SEC_WEBSOCKET_PROTOCOL).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let kept: Vec<&str> =
        offered.split(',').map(str::trim).filter(|p| !p.is_empty() && !p.starts_with(crate::protocol::realtime::KEY_SUBPROTOCOL)).collect();
    if !kept.is_empty() {
        req.insert_header(http::header::SEC_WEBSOCKET_PROTOCOL, kept.join(", "))?;
    }
    req.insert_header(http::header::UPGRADE, "websocket")?;
    req.insert_header(http::header::CONNECTION, "Upgrade")?;
    req.insert_header(http::header::HOST, upstream.host_value.clone())?;
    let call = Call {
        client,
        to: Destination::Relayed(&crate::route::Route::Realtime),
        model: theirs,
        client_model: model,
        wire: Protocol::Openai,
        stream: true,
        client_version: None,
    };
    upstream.seam.authenticate(&mut req, key, token, &call, b"")?;
    Ok(req)
}

/// What a request asks of every provider it may go to.
pub struct Ask<'a> {
    /// The model as the client named it.
    pub model: &'a str,
    pub stream: bool,
    /// The client's `anthropic-version`, if it sent one.
    pub client_version: Option<&'a str>,
    /// The route's label (what a rewrite rule's `when.route` names).
    pub route: &'static str,
    /// The group's rewrite rules that applied to it (their header edits are made here).
    pub group_rules: Option<&'a super::rewrite::Matched>,
}

/// The bearer token a request to `upstream` needs, when its kind signs in for tokens: the cached
/// one, else one fetched now (waiting on the heap: inline, the fetch's state would make every
/// request's future, of every kind of upstream, larger and copied with it).
pub async fn bearer(upstream: &Upstream) -> pingora_error::Result<Option<http::HeaderValue>> {
    let Some(source) = upstream.seam.tokens() else { return Ok(None) };
    Ok(Some(match source.fresh() {
        Some(value) => value,
        None => Box::pin(source.bearer()).await?,
    }))
}
