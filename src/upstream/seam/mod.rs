//! The upstream seam: what differs between kinds of upstream, behind one small interface —
//! which requests it serves, where a request goes (its path and query), the body it is sent
//! (the model under the upstream's own name, a cloud's own fields), how it is authenticated (a
//! static key, a bearer token from a [`token::TokenSource`], or a SigV4 signature over the whole
//! request), and how its answer is framed (a [`Decode`] turns a cloud's framing into the wire
//! protocol's). Everything else about an upstream (its catalog entry, peers, health, the headers
//! relayed to it, metering and translation) is the same for every kind.
//!
//! The kinds: [`openai`] (chat completions), [`anthropic`] (messages) and [`gemini`] (generate
//! content) with static keys; [`bedrock`] (AWS, Anthropic's messages over `InvokeModel`),
//! [`vertex`] (Google Cloud, Gemini and Anthropic models) and [`azure`] (Azure OpenAI). A new
//! kind of upstream is a file here, implementing [`Seam`], and an arm of [`for_provider`].
//! Bedrock's models that are not Anthropic's go through [`converse`], which keeps their
//! provider's messages-protocol face.

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod converse;
pub mod eventstream;
pub mod gemini;
pub mod openai;
pub mod sigv4;
pub mod token;
pub mod vertex;

use super::path::{upstream_path, upstream_query, Destination};
use crate::config::{Cloud, Protocol, ProviderConfig};
use crate::route::Route;
use bytes::Bytes;
use pingora_http::{RequestHeader, ResponseHeader};

/// One request to one provider, as its seam sees it.
pub struct Call<'a> {
    pub client: &'a RequestHeader,
    pub to: Destination<'a>,
    /// The model as the provider knows it (its `upstream` name).
    pub model: &'a str,
    /// The model as the client named it.
    pub client_model: &'a str,
    /// The wire protocol the body is written in.
    pub wire: Protocol,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// The client's `anthropic-version`, if it sent one.
    pub client_version: Option<&'a str>,
}

/// Why a seam could not prepare a request: nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeamError {
    /// The body is not the JSON object its protocol needs (the client's mistake, caught earlier
    /// for every protocol; kept for the cloud's own rewrites).
    Body(String),
    /// The provider's credentials could not be had (a token endpoint failing or refusing).
    Credentials(String),
}

impl std::fmt::Display for SeamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeamError::Body(why) => write!(f, "{why}"),
            SeamError::Credentials(why) => write!(f, "credentials: {why}"),
        }
    }
}

/// The name of the pingora error a credentials failure becomes (the gateway answers it 503).
pub const CREDENTIALS_ERROR: &str = "UpstreamCredentials";

/// The name of the pingora error a body this kind of upstream cannot take becomes (the gateway
/// answers it 400 with its message, when no other provider took the request).
pub const BODY_ERROR: &str = "UpstreamBody";

impl From<SeamError> for Box<pingora_error::Error> {
    fn from(e: SeamError) -> Self {
        let etype = match &e {
            SeamError::Credentials(_) => pingora_error::ErrorType::Custom(CREDENTIALS_ERROR),
            SeamError::Body(_) => pingora_error::ErrorType::Custom(BODY_ERROR),
        };
        pingora_error::Error::explain(etype, e.to_string())
    }
}

/// What differs between kinds of upstream.
pub trait Seam: Send + Sync {
    /// Whether it serves `route` over `wire` (`translated`: written in `wire` by the
    /// translation layer). A provider that does not is left out of the request's candidates.
    fn serves(&self, _route: &Route, _wire: Protocol, _translated: bool) -> bool {
        true
    }

    /// The path and query a request is sent to, under `prefix` (the base URL's path): a
    /// relayed request keeps the client's path (root aliases gain `/v1`; a generate-content
    /// model in the path gets its upstream name) and only its route's allowed query parameters;
    /// a translated one goes to the provider's own endpoint.
    fn target(&self, call: &Call<'_>, prefix: &str) -> String {
        native_target(call, prefix)
    }

    /// The body sent: the client's (or the translation's), its model under the upstream's name.
    fn body(&self, call: &Call<'_>, body: &Bytes) -> Result<Bytes, SeamError> {
        Ok(renamed(call, body))
    }

    /// Where its bearer tokens come from, when it signs in for them (the gateway awaits one
    /// before [`Seam::authenticate`]).
    fn tokens(&self) -> Option<&token::TokenSource> {
        None
    }

    /// Authenticate `req` (its body `body`, as sent) with key `key` of the provider's pool (the
    /// first one when there is no such key) or `token` (from [`Seam::tokens`]), and set the
    /// headers the protocol requires of every request.
    fn authenticate(
        &self,
        req: &mut RequestHeader,
        key: usize,
        token: Option<&http::HeaderValue>,
        call: &Call<'_>,
        body: &[u8],
    ) -> Result<(), SeamError>;

    /// Whether an answer's header showed the request's date to be off the service's clock, now
    /// corrected (the request is then signed again, once).
    fn clock_corrected(&self, _header: &ResponseHeader) -> bool {
        false
    }

    /// Sees every answer's header (to `model`, the provider's name); for an answer framed or
    /// written otherwise than its wire protocol's, the decoder its header and body go through.
    fn decoder(&self, _model: &str, _header: &ResponseHeader) -> Option<Box<dyn Decode>> {
        None
    }
}

/// An answer's header and body, decoded into its wire protocol's framing.
pub trait Decode: Send {
    /// The header as the wire protocol's (its content type; no length, the body's changes).
    fn header(&self, header: &mut ResponseHeader);
    /// The bytes of `chunk` in the wire protocol's framing (a frame cut between chunks is kept
    /// for the next).
    fn decode(&mut self, chunk: &[u8]) -> Bytes;
    /// The answer ended: what is left (an incomplete frame is an error event of the protocol).
    fn finish(&mut self) -> Bytes;
}

/// The seam of a configured provider.
pub fn for_provider(config: &ProviderConfig) -> Box<dyn Seam> {
    match &config.cloud {
        Some(Cloud::Bedrock(b)) => Box::new(bedrock::Bedrock::new(b)),
        Some(Cloud::Vertex(v)) => Box::new(vertex::Vertex::new(v, &config.name)),
        Some(Cloud::Azure(a)) => Box::new(azure::Azure::new(a, &config.api_keys, &config.name)),
        None => match config.protocol {
            Protocol::Openai => Box::new(openai::OpenAi::new(&config.api_keys)),
            Protocol::Anthropic => Box::new(anthropic::Anthropic::new(&config.api_keys, &config.anthropic_version)),
            Protocol::Gemini => Box::new(gemini::Gemini::new(&config.api_keys)),
        },
    }
}

/// The native kinds' target: the client's path (or the translation's endpoint) under the prefix.
pub fn native_target(call: &Call<'_>, prefix: &str) -> String {
    match call.to {
        Destination::Translated(t) => {
            let path = t.upstream_path(prefix);
            if call.model == call.client_model {
                path
            } else {
                path.replacen(&format!("/models/{}:", call.client_model), &format!("/models/{}:", call.model), 1)
            }
        }
        Destination::Relayed(route) => {
            let mut path = upstream_path(call.client.uri.path(), prefix);
            if call.model != call.client_model && call.wire == Protocol::Gemini {
                path = path.replacen(&format!("/models/{}:", call.client_model), &format!("/models/{}:", call.model), 1);
            }
            match upstream_query(call.client.uri.query(), route) {
                Some(q) => format!("{path}?{q}"),
                None => path,
            }
        }
    }
}

/// The body with its `model` field under the upstream's name, when that differs and the
/// protocol names the model in the body (generate-content names it in the path).
pub fn renamed(call: &Call<'_>, body: &Bytes) -> Bytes {
    if call.model == call.client_model || call.wire == Protocol::Gemini || body.is_empty() {
        return body.clone();
    }
    let Ok(name) = serde_json::to_string(call.model) else { return body.clone() };
    edit_members(body, &[("model", &name)], &[], false).unwrap_or_else(|_| body.clone())
}

/// `body` (a JSON object) with each member `set` names given that value (raw JSON text) where
/// it is — or first, when it is absent and `add` — and each `drop` names left out; the other
/// members' bytes as they came, in their order (a name given twice: its last, as a parsed
/// object would keep it). Read as a borrowed view of the members: no tree of values is built.
pub fn edit_members(body: &[u8], set: &[(&str, &str)], drop: &[&str], add: bool) -> Result<Bytes, SeamError> {
    let not_json = |e: serde_json::Error| SeamError::Body(format!("not a JSON object ({e})"));
    let members = serde_json::from_slice::<Members<'_>>(body).map_err(not_json)?.0;
    let mut out = Vec::with_capacity(body.len() + set.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>());
    out.push(b'{');
    let member = |out: &mut Vec<u8>, name: &str, value: &str| -> Result<(), SeamError> {
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, name).map_err(not_json)?;
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        Ok(())
    };
    if add {
        for (name, value) in set.iter().filter(|(n, _)| !members.iter().any(|(m, _)| m == n)) {
            member(&mut out, name, value)?;
        }
    }
    for (i, (name, value)) in members.iter().enumerate() {
        let later = members[i + 1..].iter().any(|(m, _)| m == name);
        if later || drop.contains(&name.as_ref()) {
            continue;
        }
        let value = set.iter().find(|(n, _)| n == name).map_or(value.get(), |(_, v)| *v);
        member(&mut out, name, value)?;
    }
    out.push(b'}');
    Ok(Bytes::from(out))
}

/// A JSON object's members as borrowed raw values, in their order.
struct Members<'a>(Vec<(std::borrow::Cow<'a, str>, &'a serde_json::value::RawValue)>);

#[derive(serde::Deserialize)]
struct Name<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((Name(name), value)) = map.next_entry::<Name<'de>, &'de serde_json::value::RawValue>()? {
                    members.push((name, value));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// `body` (a JSON object) changed by `edit` and written again.
pub fn edit_object(body: &[u8], edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Result<Bytes, SeamError> {
    let mut value: serde_json::Value = serde_json::from_slice(body).map_err(|e| SeamError::Body(format!("not JSON ({e})")))?;
    let Some(map) = value.as_object_mut() else {
        return Err(SeamError::Body("not a JSON object".into()));
    };
    edit(map);
    serde_json::to_vec(&value).map(Bytes::from).map_err(|e| SeamError::Body(e.to_string()))
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
        let values = keys.iter().map(|key| sensitive(&format(key))).collect();
        StaticKeys { values }
    }

    /// Key `index` of the pool, else the first.
    pub fn get(&self, index: usize) -> http::HeaderValue {
        self.values.get(index).or(self.values.first()).cloned().unwrap_or_else(|| http::HeaderValue::from_static(""))
    }
}

/// Set header `name` of a request to an upstream.
pub fn set<V: TryInto<http::HeaderValue>>(req: &mut RequestHeader, name: &'static str, value: V) -> Result<(), SeamError> {
    req.insert_header(name, value).map_err(|e| SeamError::Credentials(format!("header {name}: {e}")))
}

/// A credential's header value, marked sensitive (an invalid one sends nothing).
pub fn sensitive(value: &str) -> http::HeaderValue {
    let mut value = http::HeaderValue::from_str(value).unwrap_or_else(|_| http::HeaderValue::from_static(""));
    value.set_sensitive(true);
    value
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A relayed chat-completions call of `model` (the client's name `client_model`).
    pub fn call<'a>(client: &'a RequestHeader, route: &'a Route, model: &'a str, client_model: &'a str, wire: Protocol) -> Call<'a> {
        Call { client, to: Destination::Relayed(route), model, client_model, wire, stream: false, client_version: None }
    }

    /// The request an upstream would get: built fresh, as `upstream_request` does, then
    /// authenticated by `seam`.
    pub fn authenticated(seam: &dyn Seam, key: usize, client_version: Option<&str>) -> RequestHeader {
        let client = RequestHeader::build("POST", b"/v1/x", None).unwrap();
        let route = Route::ChatCompletions;
        let mut c = call(&client, &route, "m", "m", Protocol::Openai);
        c.client_version = client_version;
        let mut req = RequestHeader::build("POST", b"/v1/x", None).unwrap();
        seam.authenticate(&mut req, key, None, &c, b"{}").unwrap();
        req
    }

    pub fn header<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
        req.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn members_are_set_dropped_and_added_with_the_others_bytes_as_they_came() {
        let edit = |body: &str, set: &[(&str, &str)], drop: &[&str], add: bool| {
            edit_members(body.as_bytes(), set, drop, add).map(|b| String::from_utf8(b.to_vec()).unwrap())
        };
        let body =
            r#" {"model": "m", "max_tokens":9, "stream":true, "messages":[{"role":"user","content":"a\"b"}], "x\u00e9":{"k": [1, 2]}} "#;
        let out = edit(body, &[("anthropic_version", r#""v1""#)], &["model", "stream"], true).unwrap();
        assert_eq!(out, r#"{"anthropic_version":"v1","max_tokens":9,"messages":[{"role":"user","content":"a\"b"}],"xé":{"k": [1, 2]}}"#);
        let as_value = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(as_value(&out)["xé"], serde_json::json!({"k": [1, 2]}));
        // Set where it is; not added when absent unless asked; a name given twice keeps its last.
        assert_eq!(edit(r#"{"a":1,"model":"m","b":2}"#, &[("model", r#""up""#)], &[], false).unwrap(), r#"{"a":1,"model":"up","b":2}"#);
        assert_eq!(edit(r#"{"a":1}"#, &[("model", r#""up""#)], &[], false).unwrap(), r#"{"a":1}"#);
        assert_eq!(edit(r#"{"a":1,"a":2,"b":3}"#, &[], &[], false).unwrap(), r#"{"a":2,"b":3}"#);
        assert_eq!(edit("{}", &[("v", "1")], &[], true).unwrap(), r#"{"v":1}"#);
        for bad in ["[1]", "\"s\"", "{\"a\":}", "{\"a\":1", ""] {
            assert!(matches!(edit(bad, &[], &[], false), Err(SeamError::Body(_))), "{bad}");
        }
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
        let cfg = crate::config::Config::parse(
            "listen: 127.0.0.1:1\nproviders:\n  - {name: p, protocol: anthropic, base_url: 'http://127.0.0.1:9', api_key: k, models: [m]}\nprices: {m: {input: 1, output: 1}}\n",
            &|_| None,
        )
        .unwrap()
        .providers
        .remove(0);
        let client = RequestHeader::build("POST", b"/v1/x", None).unwrap();
        let route = Route::ChatCompletions;
        for (protocol, credential) in
            [(Protocol::Openai, "authorization"), (Protocol::Anthropic, "x-api-key"), (Protocol::Gemini, "x-goog-api-key")]
        {
            let mut cfg = cfg.clone();
            cfg.protocol = protocol;
            let mut req = RequestHeader::build("POST", b"/v1/x", None).unwrap();
            for_provider(&cfg).authenticate(&mut req, 0, None, &call(&client, &route, "m", "m", protocol), b"").unwrap();
            assert!(req.headers.contains_key(credential), "{protocol:?}: {:?}", req.headers);
        }
    }

    #[test]
    fn a_relayed_request_keeps_its_path_under_the_prefix_with_only_allowed_query_parameters() {
        let seam = openai::OpenAi::new(&["k".into()]);
        let client = RequestHeader::build("POST", b"/v1beta/models/g:streamGenerateContent?alt=sse&key=x&fields=y", None).unwrap();
        let route = crate::route::Route::GenerateContent { model: "g".into(), stream: true };
        let c = call(&client, &route, "g", "g", Protocol::Gemini);
        assert_eq!(seam.target(&c, "/api"), "/api/v1beta/models/g:streamGenerateContent?alt=sse");
        let aliased = call(&client, &route, "gemini-real-001", "g", Protocol::Gemini);
        assert_eq!(seam.target(&aliased, "/api"), "/api/v1beta/models/gemini-real-001:streamGenerateContent?alt=sse");
        let root = RequestHeader::build("POST", b"/chat/completions", None).unwrap();
        let chat = crate::route::Route::ChatCompletions;
        assert_eq!(seam.target(&call(&root, &chat, "m", "m", Protocol::Openai), ""), "/v1/chat/completions");
    }

    #[test]
    fn an_aliased_model_goes_upstream_under_its_own_name_and_the_rest_of_the_body_is_kept() {
        let client = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        let route = Route::ChatCompletions;
        let body = Bytes::from_static(br#"{"model":"gpt-x","messages":[{"role":"user","content":"hi"}],"stream":true}"#);
        let same = call(&client, &route, "gpt-x", "gpt-x", Protocol::Openai);
        assert_eq!(renamed(&same, &body).as_ptr(), body.as_ptr(), "not aliased: the same bytes, not a copy");
        let aliased = call(&client, &route, "prod-deployment", "gpt-x", Protocol::Openai);
        let v: serde_json::Value = serde_json::from_slice(&renamed(&aliased, &body)).unwrap();
        assert_eq!(v["model"], "prod-deployment");
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["stream"], true);
    }
}
