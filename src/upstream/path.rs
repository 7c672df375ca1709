//! Where a request goes upstream: the client's path under the provider's prefix with only its
//! route's allowed query parameters, or a translated request's own endpoint. Used by every
//! kind of upstream's seam.

use crate::route::Route;

/// Query parameters a route relays: `alt` (stream framing) for generate-content, `beta`
/// (the beta messages API the `anthropic` SDK and Claude Code call) for messages; nothing
/// elsewhere, so no client can shape the answer (`fields`, `$fields`, `prettyPrint`…).
fn query_allowlist(route: &Route) -> &'static [&'static str] {
    match route {
        Route::GenerateContent { .. } => &["alt"],
        Route::Messages => &["beta"],
        // Reading a stored response: which extra fields, and resuming its stream.
        Route::StoredResponse { op: crate::route::ResponseOp::Get, .. } => {
            &["include", "include[]", "stream", "starting_after", "include_obfuscation"]
        }
        // Paging through its input items.
        Route::StoredResponse { op: crate::route::ResponseOp::InputItems, .. } => {
            &["after", "before", "limit", "order", "include", "include[]"]
        }
        _ => &[],
    }
}

/// The query string relayed upstream: only the allowed parameters, as the client wrote them.
pub fn upstream_query(query: Option<&str>, route: &Route) -> Option<String> {
    let allowed = query_allowlist(route);
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
            let name = crate::base::text::decode_component(name);
            allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// Where a request goes upstream.
#[derive(Debug, Clone, Copy)]
pub enum Destination<'a> {
    /// The client's own path (a route of the provider's protocol), with its allowed query.
    Relayed(&'a Route),
    /// The provider's endpoint for a translated request.
    Translated(&'a crate::translate::Translation),
}

/// The upstream path: root aliases gain `/v1`, then the base-URL prefix goes in front.
pub fn upstream_path(client_path: &str, prefix: &str) -> String {
    let versioned = if client_path.starts_with("/v1/") || client_path.starts_with("/v1beta/") {
        client_path.to_string()
    } else {
        format!("/v1{client_path}")
    };
    format!("{prefix}{versioned}")
}
