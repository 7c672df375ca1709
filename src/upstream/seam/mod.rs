//! The upstream seam: what differs between kinds of upstream, behind one small interface —
//! which wire protocol it speaks, where a request goes (its path and query), and how a
//! request is authenticated (today a static key in a header; a request signer or a token
//! source fits the same method, which sees the whole header before it is sent). Everything
//! else about an upstream (its catalog entry, peers, health, the headers relayed to it) is
//! the same for every kind.
//!
//! Today's kinds are the three wire protocols with a static key: [`openai`] (chat
//! completions), [`anthropic`] (messages) and [`gemini`] (generate content). A new kind of
//! upstream is a file here, implementing [`Seam`], and an arm of [`for_provider`].

pub mod anthropic;
pub mod gemini;
pub mod openai;

use super::path::{upstream_path, upstream_query, Destination};
use crate::config::{Protocol, ProviderConfig};
use pingora_http::RequestHeader;

/// What differs between kinds of upstream.
pub trait Seam: Send + Sync {
    /// The wire protocol its requests and answers are in.
    fn protocol(&self) -> Protocol;

    /// The path and query a request is sent to, under `prefix` (the base URL's path): a
    /// relayed request keeps the client's path (root aliases gain `/v1`) and only its route's
    /// allowed query parameters; a translated one goes to the provider's own endpoint.
    fn target(&self, client: &RequestHeader, to: Destination<'_>, prefix: &str) -> String {
        match to {
            Destination::Translated(t) => t.upstream_path(prefix),
            Destination::Relayed(route) => {
                let path = upstream_path(client.uri.path(), prefix);
                match upstream_query(client.uri.query(), route) {
                    Some(q) => format!("{path}?{q}"),
                    None => path,
                }
            }
        }
    }

    /// Authenticate `req` with key `key` of the provider's pool (the first one when there is
    /// no such key), and set the headers the protocol requires of every request.
    /// `client_version` is the client's `anthropic-version`, if it sent one.
    fn authenticate(&self, req: &mut RequestHeader, key: usize, client_version: Option<&str>) -> pingora_error::Result<()>;
}

/// The seam of a configured provider.
pub fn for_provider(config: &ProviderConfig) -> Box<dyn Seam> {
    match config.protocol {
        Protocol::Openai => Box::new(openai::OpenAi::new(&config.api_keys)),
        Protocol::Anthropic => Box::new(anthropic::Anthropic::new(&config.api_keys, &config.anthropic_version)),
        Protocol::Gemini => Box::new(gemini::Gemini::new(&config.api_keys)),
    }
}

/// A pool of static keys, each the value of one credential header, built once and marked
/// sensitive (never logged by the HTTP stack).
pub struct StaticKeys {
    values: Vec<http::HeaderValue>,
}

impl StaticKeys {
    /// Each key as `format` makes it (`Bearer <key>`, or the key itself). A key that is no
    /// valid header value (the configuration refuses such keys) sends no credential.
    pub fn new(keys: &[String], format: impl Fn(&str) -> String) -> StaticKeys {
        let values = keys
            .iter()
            .map(|key| {
                let mut value = http::HeaderValue::from_str(&format(key)).unwrap_or_else(|_| http::HeaderValue::from_static(""));
                value.set_sensitive(true);
                value
            })
            .collect();
        StaticKeys { values }
    }

    /// Key `index` of the pool, else the first.
    pub fn get(&self, index: usize) -> http::HeaderValue {
        self.values.get(index).or(self.values.first()).cloned().unwrap_or_else(|| http::HeaderValue::from_static(""))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The request an upstream would get: built fresh, as `upstream_request` does, then
    /// authenticated by `seam`.
    pub fn authenticated(seam: &dyn Seam, key: usize, client_version: Option<&str>) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/v1/x", None).unwrap();
        seam.authenticate(&mut req, key, client_version).unwrap();
        req
    }

    pub fn header<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
        req.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn a_key_out_of_the_pool_falls_back_to_the_first_and_values_are_sensitive() {
        let keys = StaticKeys::new(&["a".into(), "b".into()], |k| format!("K {k}"));
        assert_eq!(keys.get(1), "K b");
        assert_eq!(keys.get(7), "K a");
        assert!(keys.get(0).is_sensitive());
        assert_eq!(StaticKeys::new(&[], str::to_string).get(0), "");
    }

    #[test]
    fn each_protocol_gets_its_own_kind() {
        let mut cfg = crate::config::Config::parse(
            "listen: 127.0.0.1:1\nproviders:\n  - {name: p, protocol: anthropic, base_url: 'http://127.0.0.1:9', api_key: k, models: [m]}\nprices: {m: {input: 1, output: 1}}\n",
            &|_| None,
        )
        .unwrap()
        .providers
        .remove(0);
        for protocol in [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini] {
            cfg.protocol = protocol;
            assert_eq!(for_provider(&cfg).protocol(), protocol);
        }
    }

    #[test]
    fn a_relayed_request_keeps_its_path_under_the_prefix_with_only_allowed_query_parameters() {
        let seam = openai::OpenAi::new(&["k".into()]);
        let client = RequestHeader::build("POST", b"/v1beta/models/g:streamGenerateContent?alt=sse&key=x&fields=y", None).unwrap();
        let route = crate::route::Route::GenerateContent { model: "g".into(), stream: true };
        assert_eq!(seam.target(&client, Destination::Relayed(&route), "/api"), "/api/v1beta/models/g:streamGenerateContent?alt=sse");
        let root = RequestHeader::build("POST", b"/chat/completions", None).unwrap();
        assert_eq!(seam.target(&root, Destination::Relayed(&crate::route::Route::ChatCompletions), ""), "/v1/chat/completions");
    }
}
