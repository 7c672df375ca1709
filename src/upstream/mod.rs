//! The upstream floor: everything about the providers a request is sent to — the catalog
//! ([`catalog`]: which providers serve a model, in which order, at which addresses), their
//! health ([`health`]: cooldowns, probes, key rotation) and conversation affinity
//! ([`affinity`]), a model call resolved to what it may cost ([`draft`], [`output`]), the
//! request an upstream gets ([`request`], [`path`]), and the seam between kinds of upstream ([`seam`]:
//! protocol, path, authentication).
//!
//! May import the floors below (config, protocol, records, the ledger's prices, translate's
//! request shapes); the gateway drives it.

pub mod affinity;
pub mod catalog;
pub mod cloud_guard;
pub mod draft;
pub mod fallback;
pub mod health;
pub mod media;
pub mod moderation;
pub mod output;
pub mod path;
pub mod reply;
pub mod request;
pub mod rewrite;
pub mod seam;

pub use catalog::{order_providers, prefer_provider, Catalog, DnsRefresh, Upstream};
pub use draft::{draft, draft_form, stored_draft, Draft};
pub use path::{upstream_path, upstream_query, Destination};
pub use reply::Reply;
pub use request::{bearer, header_allowed, realtime_request, response_header_allowed, upstream_request, Ask};

use crate::config::MediaAllowance;
use std::sync::Arc;

pub use crate::protocol::{body_fields, BodyFields};

/// The part of the configuration a reload replaces: providers, models, groups, prices.
/// A request keeps the snapshot it started with.
#[derive(Clone)]
pub struct Routing {
    pub catalog: Arc<Catalog>,
    pub prices: Arc<crate::billing::ledger::PriceBook>,
    /// Output tokens held (and asked for) per choice for a request that names no maximum, when
    /// neither its key nor its model sets one (`billing.default_output_tokens`).
    pub default_output_tokens: u64,
    /// The fewest output tokens a request that names no maximum is lowered to when its key
    /// cannot afford the default (`billing.min_output_tokens`); below, 402.
    pub min_output_tokens: u64,
    /// The largest upstream event a translated stream holds (`limits.max_event_bytes`).
    pub max_event_bytes: usize,
    /// Extra client headers relayed upstream (`forward_headers`).
    pub forward_headers: Vec<String>,
    /// Extra upstream response headers relayed to clients (`forward_response_headers`).
    pub forward_response_headers: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed (`trusted_proxies`).
    pub trusted_proxies: Vec<crate::policy::Cidr>,
    /// Spend windows' calendar (`billing.timezone`).
    pub calendar: crate::policy::budget::Calendar,
    /// Whether `/me`, the key holder's page, is served (`console.key_page`).
    pub key_page: bool,
    /// Retries before the first byte.
    pub retry: crate::config::RetryPolicy,
    /// Input tokens held per referenced image and per file (`billing.image_input_tokens`,
    /// `billing.file_input_tokens`).
    pub media_allowance: MediaAllowance,
    /// The guardrails (`guardrails:`) and what is attached to each group and account.
    pub guardrails: Arc<crate::checks::guard::Guardrails>,
    /// Open sign-up (`identity.signup`): read at each sign-in, so a reload opens or closes it.
    pub signup: Option<Arc<crate::config::identity::SignupConfig>>,
    /// Fallbacks across models and the bounds of one request's attempts (`routing.fallbacks`).
    pub fallbacks: crate::config::fallbacks::Fallbacks,
}

/// The routing of `config` with the unit tests' defaults (100 output tokens held, 10 at the
/// least), for the tests of this module and the floors above.
#[cfg(test)]
pub(crate) fn routing_for_tests(config: &crate::config::Config) -> Routing {
    let health = crate::upstream::health::HealthBook::new(Arc::new(crate::observe::metrics::Metrics::default()));
    Routing {
        catalog: Arc::new(catalog::Catalog::new(config, 0, &health)),
        prices: Arc::new(crate::billing::ledger::PriceBook::new(&config.prices)),
        default_output_tokens: 100,
        min_output_tokens: 10,
        max_event_bytes: crate::config::listen::DEFAULT_MAX_EVENT_BYTES,
        forward_headers: Vec::new(),
        forward_response_headers: Vec::new(),
        trusted_proxies: Vec::new(),
        calendar: Default::default(),
        key_page: false,
        retry: crate::config::RetryPolicy::default(),
        media_allowance: MediaAllowance::default(),
        guardrails: Arc::new(crate::checks::guard::Guardrails::new(config, &Default::default()).unwrap_or_default()),
        signup: config.identity.signup.clone().map(Arc::new),
        fallbacks: config.fallbacks.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::draft::*;
    use super::path::*;
    use super::request::*;
    use super::*;
    use crate::config::{Config, Protocol};
    use crate::protocol::ErrorKind;
    use crate::route::Route;
    use pingora_http::RequestHeader;

    /// A model call's draft under the registered checks, refused as the client would be.
    fn draft(
        routing: &Routing,
        route: &Route,
        protocol: Protocol,
        group: &str,
        policy: &crate::policy::KeyPolicy,
        body: bytes::Bytes,
    ) -> Result<Draft, crate::protocol::ApiError> {
        super::draft::draft(routing, route, protocol, group, policy, (&crate::checks::Checks::default(), &[]), body)
            .map_err(crate::checks::Stop::refusal)
    }

    fn config() -> Config {
        let text = r#"
listen: 127.0.0.1:8080
providers:
  - { name: a, protocol: openai, base_url: "http://127.0.0.1:1/p", api_key: up-a, models: [alpha-5.5, alpha-4o-mini] }
  - { name: b, protocol: openai, base_url: "http://127.0.0.1:2", api_key: up-b, models: [alpha-5.5] }
  - { name: c, protocol: anthropic, base_url: "https://api.example.com", api_key: up-c, models: [beta-opus-4-7] }
  - { name: d, protocol: gemini, base_url: "http://127.0.0.1:3", api_key: up-d, models: [gamma-3.5-flash] }
groups:
  default: { platforms: [openai, anthropic, gemini] }
  chat: { platforms: [openai] }
prices:
  alpha-5.5: { input: 1, output: 2 }
  alpha-4o-mini: { input: 1, output: 2 }
  beta-opus-4-7: { input: 1, output: 2 }
  gamma-3.5-flash: { input: 0, output: 0 }
"#;
        Config::parse(text, &|_| None).expect("valid")
    }

    fn routing() -> Routing {
        super::routing_for_tests(&config())
    }

    fn health() -> crate::upstream::health::HealthBook {
        crate::upstream::health::HealthBook::new(Arc::new(crate::observe::metrics::Metrics::default()))
    }

    fn body(v: serde_json::Value) -> bytes::Bytes {
        bytes::Bytes::from(serde_json::to_vec(&v).expect("json"))
    }

    #[test]
    fn a_draft_names_the_model_its_providers_the_hold_and_the_body() {
        let r = routing();
        // 1 USD per 1M input tokens = 1,000 nano-USD a token; 2 USD per 1M output tokens.
        let chat = body(serde_json::json!({"model": "alpha-5.5", "messages": [], "max_tokens": 10, "n": 3}));
        let d = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), chat.clone())
            .expect("draft");
        assert_eq!(d.model, "alpha-5.5");
        assert_eq!(d.candidates, vec![0, 1], "both providers of the model, in file order");
        let input = crate::billing::hold_input_tokens(chat.len()) as i64;
        assert_eq!(d.hold_nanos, input * 1_000 + 3 * 10 * 2_000, "input + every choice's allowance");
        assert_eq!(d.body, chat, "a request that is not a stream is sent as it came");
        assert!(!d.withhold_usage);

        // No maximum named: the default allowance is held. Embeddings hold no output.
        let d = draft(
            &r,
            &Route::ChatCompletions,
            Protocol::Openai,
            "chat",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-4o-mini"})),
        )
        .expect("draft");
        assert_eq!(d.hold_nanos % 1_000, 0);
        assert!(d.hold_nanos >= 100 * 2_000);
        let e = draft(
            &r,
            &Route::Embeddings,
            Protocol::Openai,
            "default",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-5.5", "input": "x"})),
        )
        .expect("draft");
        assert!(e.hold_nanos < 100 * 2_000);

        // A stream that did not ask for usage: asked for, and withheld from the client.
        let stream = body(serde_json::json!({"model": "alpha-5.5", "stream": true, "stream_options": null}));
        let d = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), stream.clone())
            .expect("draft");
        assert!(d.withhold_usage);
        assert_eq!(d.client_body_len, stream.len());
        let sent: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        assert_eq!(sent["stream_options"]["include_usage"], true);
        // Naming no maximum either: both written in the one copy, the client's members kept.
        assert_eq!(sent["max_completion_tokens"], 100, "the default allowance");
        assert_eq!((sent["model"].as_str(), sent["stream"].as_bool()), (Some("alpha-5.5"), Some(true)));
        let plain = body(serde_json::json!({"model": "alpha-5.5", "stream": true}));
        let d =
            draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), plain).expect("draft");
        let sent: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        assert_eq!(
            (sent["max_completion_tokens"].as_u64(), &sent["stream_options"]),
            (Some(100), &serde_json::json!({"include_usage": true}))
        );

        // The one lowering rule: a request that named no maximum is lowered, never below the
        // floor (10 here) nor above what it had; one that named its maximum never.
        let mut d = draft(
            &r,
            &Route::ChatCompletions,
            Protocol::Openai,
            "default",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-5.5", "n": 2})),
        )
        .expect("draft");
        assert!(!d.lower_output(&r, &Route::ChatCompletions, 9).expect("rule"), "below the floor");
        assert!(!d.lower_output(&r, &Route::ChatCompletions, 100).expect("rule"), "not less than it had");
        assert!(d.lower_output(&r, &Route::ChatCompletions, 40).expect("rule"));
        assert_eq!(d.output_allowance, 80, "every choice");
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&d.body).expect("json")["max_completion_tokens"], 40, "and asked for");
        let mut named = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), chat.clone())
            .expect("draft");
        assert!(!named.lower_output(&r, &Route::ChatCompletions, 5).expect("rule"));
        assert_eq!(named.body, chat);

        // Generate-content takes the model from the path; an empty body is allowed.
        let gen = Route::GenerateContent { model: "gamma-3.5-flash".into(), stream: false };
        let d = draft(&r, &gen, Protocol::Gemini, "default", &crate::policy::KeyPolicy::default(), bytes::Bytes::new()).expect("draft");
        assert_eq!((d.model.as_str(), d.candidates.as_slice(), d.hold_nanos), ("gamma-3.5-flash", &[3usize][..], 0));
    }

    #[test]
    fn a_draft_refuses_what_cannot_be_relayed() {
        let r = routing();
        let refuse = |route: Route, protocol: Protocol, group: &str, v: serde_json::Value| {
            draft(&r, &route, protocol, group, &crate::policy::KeyPolicy::default(), body(v)).expect_err("refused").status()
        };
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"messages": []})), 400, "no model");
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"model": ""})), 400, "empty model");
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"model": "nope"})), 404);
        assert_eq!(refuse(Route::Messages, Protocol::Anthropic, "chat", serde_json::json!({"model": "beta-opus-4-7"})), 404, "group");
        assert_eq!(
            refuse(
                Route::ChatCompletions,
                Protocol::Openai,
                "default",
                serde_json::json!({"model": "alpha-5.5", "max_tokens": 1u64 << 40})
            ),
            400,
            "beyond any output limit"
        );
        assert_eq!(
            draft(
                &r,
                &Route::ChatCompletions,
                Protocol::Openai,
                "default",
                &crate::policy::KeyPolicy::default(),
                bytes::Bytes::from_static(b"{not json")
            )
            .expect_err("bad")
            .status(),
            400
        );
        // The key's model rules come before its output limits (issue 46: the documented order).
        let policy = crate::policy::KeyPolicy {
            models: Some(crate::policy::ModelRules { allow: None, deny: vec!["alpha-5.5".into()] }),
            max_output_tokens: Some(10),
            ..crate::policy::KeyPolicy::default()
        };
        let both = body(serde_json::json!({"model": "alpha-5.5", "max_tokens": 1000}));
        let e = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &policy, both).expect_err("refused");
        assert_eq!(e.kind, ErrorKind::ModelNotAllowed, "{}", e.message);
        let other = body(serde_json::json!({"model": "alpha-4o-mini", "max_tokens": 1000}));
        let e = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &policy, other).expect_err("refused");
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("max_tokens")), "{}", e.message);
    }

    fn weighted() -> Catalog {
        let text = r#"
listen: 127.0.0.1:8080
providers:
  - { name: heavy, protocol: openai, base_url: "http://127.0.0.1:1", api_key: k, models: [m], weight: 3 }
  - { name: light, protocol: openai, base_url: "http://127.0.0.1:2", api_key: k, models: [m] }
  - { name: backup, protocol: openai, base_url: "http://127.0.0.1:3", api_key: k, models: [m], priority: 1 }
prices:
  m: { input: 1, output: 1 }
"#;
        Catalog::new(&Config::parse(text, &|_| None).expect("valid"), 0, &health())
    }

    #[test]
    fn tiers_come_in_priority_order_and_weights_split_a_tier() {
        let c = weighted();
        let mut firsts = [0usize; 3];
        for _ in 0..200 {
            let mut order = vec![2, 1, 0];
            order_providers(&c, &mut order, None);
            assert_eq!(order[2], 2, "the backup tier comes last: {order:?}");
            firsts[order[0]] += 1;
        }
        assert_eq!(firsts, [150, 50, 0], "smooth weighted round-robin is exact");

        // Conversations: each keeps its order; over many, the split follows the weights.
        let mut firsts = [0usize; 3];
        for conversation in 0..20_000u64 {
            let mut order = vec![0, 1, 2];
            order_providers(&c, &mut order, Some(conversation));
            let mut again = vec![2, 0, 1];
            order_providers(&c, &mut again, Some(conversation));
            assert_eq!(order, again, "the same order from any starting order");
            assert_eq!(order[2], 2);
            firsts[order[0]] += 1;
        }
        let heavy = firsts[0] as f64 / 20_000.0;
        assert!((heavy - 0.75).abs() < 0.02, "weight 3 of 4: {heavy}");
    }

    #[test]
    fn the_next_provider_skips_the_resting_and_the_tried() {
        use crate::upstream::health::Verdict;
        let c = weighted();
        let now = std::time::Instant::now();
        let order = [0, 1, 2];
        let next = |tried: &[usize], dead: &[usize]| c.next_provider(&order, tried, dead, now).map(|(i, _)| i);
        assert_eq!(next(&[], &[]), Some(0));
        assert_eq!(next(&[0], &[]), Some(1), "another provider first");
        assert_eq!(next(&[0, 1, 2], &[]), Some(0), "then one already tried that takes requests");
        assert_eq!(next(&[], &[0, 1, 2]), None, "none reachable");
        // Provider 0 answered 429 for 60 s: skipped, even for a retry.
        let (_, a) = c.next_provider(&[0], &[], &[], now).expect("admitted");
        a.report_at(Verdict::Throttled(Some(std::time::Duration::from_secs(60))), now);
        assert_eq!(next(&[], &[]), Some(1));
        assert_eq!(next(&[1, 2], &[]), Some(1), "a retry never goes to a resting provider");
        // Every provider rests: the first free is tried, but only before anything was sent.
        for i in [1, 2] {
            let (_, a) = c.next_provider(&[i], &[], &[], now).expect("admitted");
            a.report_at(Verdict::Throttled(Some(std::time::Duration::from_secs(10 * i as u64))), now);
        }
        assert_eq!(next(&[], &[]), Some(1), "the one whose rest ends first (10 s)");
        assert_eq!(next(&[], &[1]), Some(2), "of those reachable");
        assert_eq!(next(&[1], &[]), None, "no retry into a rest");
    }

    #[test]
    fn candidates_in_config_order_per_protocol() {
        let c = Catalog::new(&config(), 0, &health());
        assert_eq!(c.candidates(Protocol::Openai, "alpha-5.5"), Some(&[0usize, 1][..]));
        assert_eq!(c.candidates(Protocol::Openai, "alpha-4o-mini"), Some(&[0usize][..]));
        assert_eq!(c.candidates(Protocol::Anthropic, "alpha-5.5"), None);
        assert_eq!(c.candidates(Protocol::Openai, "nope"), None);
    }

    #[test]
    fn models_filtered_by_group() {
        let c = Catalog::new(&config(), 0, &health());
        let ids = |g, p| c.models_for(g, p).into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(ids("default", None), ["alpha-5.5", "alpha-4o-mini", "beta-opus-4-7", "gamma-3.5-flash"]);
        assert_eq!(ids("chat", None), ["alpha-5.5", "alpha-4o-mini"]);
        assert!(ids("chat", Some(Protocol::Gemini)).is_empty());
        assert_eq!(ids("default", Some(Protocol::Gemini)), ["gamma-3.5-flash"]);
        assert!(ids("missing-group", None).is_empty());
    }

    #[test]
    fn body_fields_with_model_last_in_a_large_body() {
        let filler = "x".repeat(1 << 20);
        let body = format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"stream":true,"model":"alpha-5.5"}}"#);
        let f = body_fields(body.as_bytes()).expect("parse");
        assert_eq!(f.model.as_deref(), Some("alpha-5.5"));
        assert_eq!(f.stream, Some(true));
        assert_eq!(body_fields(b"{").unwrap_err().status(), 400);
        assert_eq!(body_fields(b"").unwrap_err().status(), 400);
        assert_eq!(body_fields(b"[1]").unwrap_err().status(), 400);
        assert_eq!(body_fields(br#"["alpha-5.5"]"#).unwrap_err().status(), 400);
        assert_eq!(body_fields(b"{}").expect("empty object").model, None);
    }

    #[test]
    fn choices_are_read_per_protocol() {
        use crate::protocol::openai::client_wants_usage;
        // The proto field names the service also accepts are held alike.
        let f = body_fields(br#"{"generation_config":{"max_output_tokens":13,"candidate_count":4}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).ok(), Some(4));
        let f = body_fields(br#"{"generationConfig":{"max_output_tokens":13,"candidateCount":2}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).ok(), Some(2));
        let both = br#"{"generationConfig":{"maxOutputTokens":1},"generation_config":{"max_output_tokens":100000}}"#;
        assert_eq!(body_fields(both).unwrap_err().status(), 400, "two spellings of one field: refused, not guessed");
        let both = br#"{"generationConfig":{"maxOutputTokens":1,"max_output_tokens":100000}}"#;
        assert_eq!(body_fields(both).unwrap_err().status(), 400);
        let f = body_fields(br#"{"model":"m","stream_options":{"include_usage":true}}"#).expect("parse");
        assert!(client_wants_usage(&f));
        let f = body_fields(br#"{"model":"m","n":4,"max_tokens":10}"#).expect("parse");
        assert_eq!(Protocol::Openai.choices(&f).expect("n"), 4);
        assert_eq!(Protocol::Anthropic.choices(&f).expect("one"), 1, "messages has no n");
        let f = body_fields(br#"{"generationConfig":{"candidateCount":3}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).expect("candidateCount"), 3);
        let f = body_fields(br#"{"model":"m","n":129}"#).expect("parse");
        assert_eq!(Protocol::Openai.choices(&f).unwrap_err().status(), 400);
        assert_eq!(body_fields(br#"{"model":"m","max_tokens":1e15}"#).unwrap_err().status(), 400, "not an integer");
        assert_eq!(body_fields(br#"{"model":"m","max_tokens":-1}"#).unwrap_err().status(), 400);
    }

    /// Whatever `stream_options` holds, the rewrite asks for usage, keeps every other byte of
    /// the body, and keeps the client's other options.
    #[test]
    fn include_usage_is_set_whatever_stream_options_holds() {
        let cases: [(&str, serde_json::Value); 9] = [
            (r#"{"model":"m","stream":true}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":null}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":"yes"}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":[1,{"a":2}]}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":7}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":{"include_usage":false}}"#, serde_json::json!({"include_usage": true})),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":null,"x":1}}"#,
                serde_json::json!({"include_usage": true, "x": 1}),
            ),
            (r#"{"model":"m","stream":true,"stream_options":{}}"#, serde_json::json!({"include_usage": true})),
            (r#"  { "stream_options" : { "x" : "}" } , "model":"m","stream":true}"#, serde_json::json!({"include_usage": true, "x": "}"})),
        ];
        for (body, want) in cases {
            let f = body_fields(body.as_bytes()).expect("parse");
            assert!(!crate::protocol::openai::client_wants_usage(&f), "{body}");
            let rewritten = crate::protocol::openai::with_include_usage(body.as_bytes(), &f).expect("rewrite");
            let v: serde_json::Value = serde_json::from_slice(&rewritten).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(v["stream_options"], want, "{body}");
            assert_eq!((v["model"].as_str(), v["stream"].as_bool()), (Some("m"), Some(true)), "{body}");
            let f2 = body_fields(&rewritten).expect("reparse");
            assert!(crate::protocol::openai::client_wants_usage(&f2), "{body}");
        }
        // A duplicate stream_options is ambiguous: refused, never rewritten into two.
        assert_eq!(
            body_fields(br#"{"model":"m","stream_options":null,"stream_options":{"include_usage":true}}"#).unwrap_err().status(),
            400
        );
    }

    #[test]
    fn only_allowlisted_response_headers_reach_a_client() {
        let none: &[String] = &[];
        for name in ["content-type", "retry-after", "x-should-retry", "x-request-id", "openai-processing-ms"] {
            assert!(response_header_allowed(name, Protocol::Openai, none), "{name}");
        }
        assert!(response_header_allowed("request-id", Protocol::Anthropic, none));
        for name in ["openai-organization", "openai-project", "x-ratelimit-remaining-requests", "set-cookie", "connection", "x-internal"] {
            assert!(!response_header_allowed(name, Protocol::Openai, none), "{name}");
        }
        assert!(!response_header_allowed("anthropic-ratelimit-tokens-remaining", Protocol::Anthropic, none));
        assert!(!response_header_allowed("request-id", Protocol::Openai, none), "the allowlist is the protocol's");
        let forward = ["x-ratelimit-*".to_string(), "openai-project".to_string()];
        assert!(response_header_allowed("x-ratelimit-remaining-requests", Protocol::Openai, &forward));
        assert!(response_header_allowed("openai-project", Protocol::Openai, &forward));
        assert!(!response_header_allowed("set-cookie", Protocol::Openai, &["set-*".to_string()]), "cookies never");
    }

    #[test]
    fn only_allowlisted_query_parameters_and_headers_go_upstream() {
        let gen = Route::GenerateContent { model: "g".into(), stream: true };
        assert_eq!(upstream_query(Some("alt=sse&fields=candidates&%24fields=x&prettyPrint=false"), &gen).as_deref(), Some("alt=sse"));
        assert_eq!(upstream_query(Some("%61lt=sse"), &gen).as_deref(), Some("%61lt=sse"));
        assert_eq!(upstream_query(Some("fields=candidates"), &gen), None);
        assert_eq!(upstream_query(Some("beta=true&x=1"), &Route::Messages).as_deref(), Some("beta=true"));
        assert_eq!(upstream_query(Some("alt=sse"), &Route::ChatCompletions), None);
        for h in [
            "openai-organization",
            "openai-project",
            "x-goog-fieldmask",
            "x-goog-user-project",
            "cookie",
            "authorization",
            "x-forwarded-for",
            "x-mock-status",
        ] {
            for p in [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini] {
                assert!(!header_allowed(h, p, &[]), "{h} to {p:?}");
            }
        }
        assert!(header_allowed("x-stainless-lang", Protocol::Openai, &[]));
        assert!(header_allowed("anthropic-beta", Protocol::Anthropic, &[]));
        assert!(!header_allowed("anthropic-beta", Protocol::Openai, &[]));
        assert!(header_allowed("x-goog-api-client", Protocol::Gemini, &[]));
        let forward = vec!["x-mock-*".to_string(), "x-test-tag".to_string()];
        assert!(header_allowed("x-mock-status", Protocol::Gemini, &forward));
        assert!(header_allowed("x-test-tag", Protocol::Gemini, &forward));
        assert!(!header_allowed("x-test-tagged", Protocol::Gemini, &forward));
    }

    /// The request `upstream_request` makes of `req` for `upstream`.
    fn prepared(req: &RequestHeader, upstream: &Upstream, route: &Route, version: Option<&str>, body: &'static [u8]) -> RequestHeader {
        let ask = Ask { model: "m", stream: false, client_version: version, route: route.label(), group_rules: None };
        let body = bytes::Bytes::from_static(body);
        upstream_request(req, upstream, 0, Destination::Relayed(route), &ask, &body, &[], None).expect("rewrite").0
    }

    #[test]
    fn rewrite_strips_client_keys_and_sets_provider_credentials() {
        let c = Catalog::new(&config(), 0, &health());
        let mut req = RequestHeader::build("POST", b"/messages?beta=true&fields=x", None).expect("req");
        for (k, v) in [
            ("authorization", "Bearer sk-client"),
            ("x-api-key", "sk-client"),
            ("x-goog-api-key", "sk-client"),
            ("x-alt-api-key", "sk-client"),
            ("compat-version", "2024-01-01"),
            ("accept-encoding", "gzip"),
            ("host", "gateway.local"),
            ("anthropic-beta", "tools-1"),
            ("openai-organization", "org-x"),
        ] {
            req.insert_header(k, v).expect("hdr");
        }
        let req = prepared(&req, &c.upstreams[2], &Route::Messages, Some("2024-01-01"), b"{\"model\":\"m\"}");
        assert_eq!(req.headers["anthropic-beta"], "tools-1");
        assert!(req.headers.get("openai-organization").is_none());
        let wire = format!("{:?}", req.headers);
        assert!(!wire.contains("sk-client"), "{wire}");
        assert_eq!(req.headers["x-api-key"], "up-c");
        assert_eq!(req.headers["anthropic-version"], "2024-01-01");
        assert_eq!(req.headers["host"], "api.example.com");
        assert_eq!(req.headers["content-length"], "13");
        assert!(req.headers.get("compat-version").is_none());
        assert!(req.headers.get("accept-encoding").is_none());
        assert_eq!(req.uri.to_string(), "/v1/messages?beta=true");

        let mut req = RequestHeader::build("POST", b"/v1/chat/completions", None).expect("req");
        req.insert_header("x-api-key", "sk-client").expect("hdr");
        req.set_version(http::Version::HTTP_2);
        let req = prepared(&req, &c.upstreams[0], &Route::ChatCompletions, None, b"");
        assert_eq!(req.headers["authorization"], "Bearer up-a");
        assert!(req.headers.get("x-api-key").is_none());
        assert_eq!(req.headers["host"], "127.0.0.1:1");
        assert_eq!(req.uri.path(), "/p/v1/chat/completions");
        assert_eq!(req.version, http::Version::HTTP_11);
    }

    #[test]
    fn anthropic_version_defaults_and_paths() {
        let c = Catalog::new(&config(), 0, &health());
        let req = RequestHeader::build("POST", b"/v1/messages", None).expect("req");
        let req = prepared(&req, &c.upstreams[2], &Route::Messages, None, b"");
        assert_eq!(req.headers["anthropic-version"], crate::config::upstream::DEFAULT_ANTHROPIC_VERSION);
        assert_eq!(upstream_path("/v1beta/models/g:generateContent", ""), "/v1beta/models/g:generateContent");
        assert_eq!(upstream_path("/embeddings", "/x"), "/x/v1/embeddings");
    }
}
