use super::stream::{Dialect, OutputGuard};
use super::*;
use crate::config::Config;
use serde_json::json;

fn guardrails(yaml: &str) -> Guardrails {
    let config = Config::parse(&format!("listen: 127.0.0.1:0\n{yaml}"), &|_| None).expect("config");
    Guardrails::new(&config, &Default::default()).expect("guardrails")
}

fn applied(g: &Guardrails) -> Applied {
    g.applying("default", &KeyPolicy::default(), &[])
}

fn call() -> (BTreeMap<String, String>, &'static str) {
    (BTreeMap::new(), "k1")
}

const SECRETS_MASK: &str = "guardrails: [{name: s, kind: secrets, action: mask, phase: both, restore: true}, {name: p, kind: pii, action: block, recognisers: [card]}]\ngroups: {default: {platforms: [openai], guardrails: [s, p]}}\n";

#[tokio::test]
async fn input_is_masked_or_blocked_and_the_masks_are_restored_in_the_answer() {
    let g = guardrails(SECRETS_MASK);
    let a = applied(&g);
    let metrics = Metrics::default();
    let (tags, key_id) = call();
    let call = Call { protocol: "openai", route: "chat_completions", model: Some("m"), key_id, tags: &tags };
    let body = br#"{"model":"m","messages":[{"role":"user","content":"my key AKIAIOSFODNN7EXAMPLE ok"}]}"#;
    let mut screening = Screening::default();
    let masked = screen_body(&a, &call, body, &mut screening, &metrics).await.expect("passes").expect("masked");
    let masked: Value = serde_json::from_slice(&masked).expect("json");
    assert_eq!(masked["messages"][0]["content"], "my key [AWS_KEY_1] ok");
    assert_eq!(masked["model"], "m");
    assert_eq!(screening.noted, [Noted { guardrail: "s".into(), phase: "input", action: "mask", categories: vec!["aws_key".into()] }]);
    assert!(metrics.render(&[]).contains("tollgate_guardrail_actions_total{guardrail=\"s\",phase=\"input\",action=\"mask\"} 1"));

    // A card number is blocked; the refusal names the guardrail, never the number.
    let body = br#"{"model":"m","messages":[{"role":"user","content":"card 4111 1111 1111 1111"}]}"#;
    let refused = screen_body(&a, &call, body, &mut Screening::default(), &metrics).await.expect_err("blocked");
    let err = refused.error();
    assert_eq!((err.status(), err.kind.code()), (400, Some("content_policy_violation")));
    assert!(err.message.contains("'p'") && !err.message.contains("4111"), "{}", err.message);

    // The answer echoes the placeholder: restored for this client, split across events too.
    let mut out = OutputGuard::new(&a, &screening.masks, Some(Dialect::Chat), "m").expect("guard");
    let mut sent = Vec::new();
    for piece in ["your key [AWS_", "KEY_1] is safe"] {
        let event = format!("data: {}\n\n", json!({"choices":[{"index":0,"delta":{"content":piece}}]}));
        let fed = out.feed(event.as_bytes(), &metrics);
        assert!(fed.blocked.is_none());
        sent.extend(fed.out);
    }
    sent.extend(out.finish());
    assert_eq!(contents(&sent), "your key AKIAIOSFODNN7EXAMPLE is safe");
}

fn contents(sse: &[u8]) -> String {
    String::from_utf8_lossy(sse)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_match_split_across_chunks_is_found_and_masked_or_blocked() {
    let metrics = Metrics::default();
    for (action, expect_blocked) in [("mask", false), ("block", true)] {
        let g = guardrails(&format!(
            "guardrails: [{{name: out, kind: secrets, phase: output, action: {action}}}]\ngroups: {{default: {{platforms: [openai], guardrails: [out]}}}}\n"
        ));
        let mut out = OutputGuard::new(&applied(&g), &Masks::default(), Some(Dialect::Chat), "m").expect("guard");
        let mut sent = Vec::new();
        let mut blocked = None;
        // The key arrives in three chunks, an event cut in the middle of a chunk too.
        let events: String = ["here: AKIAIOSF", "ODNN7EX", "AMPLE done"]
            .iter()
            .map(|p| format!("data: {}\n\n", json!({"choices":[{"index":0,"delta":{"content":p}}]})))
            .collect();
        let bytes = events.as_bytes();
        for chunk in bytes.chunks(37) {
            let fed = out.feed(chunk, &metrics);
            sent.extend(fed.out);
            if fed.blocked.is_some() {
                blocked = fed.blocked;
                break;
            }
        }
        sent.extend(out.finish());
        let text = String::from_utf8_lossy(&sent).into_owned();
        assert!(!text.contains("AKIAIOSF"), "{action}: {text}");
        match expect_blocked {
            true => {
                assert_eq!(blocked.as_deref(), Some("out"));
                assert!(text.contains("content_policy_violation"), "{text}");
            }
            false => assert_eq!(contents(&sent), "here: [AWS_KEY_1] done"),
        }
    }
}

#[test]
fn a_chunk_is_held_only_until_the_window_follows_it() {
    let metrics = Metrics::default();
    let g = guardrails("guardrails: [{name: out, kind: pii, phase: output, action: monitor}]\ngroups: {default: {platforms: [openai], guardrails: [out]}}\n");
    let mut out = OutputGuard::new(&applied(&g), &Masks::default(), Some(Dialect::Messages), "m").expect("guard");
    let event = |text: &str| {
        format!(
            "event: content_block_delta\ndata: {}\n\n",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}})
        )
    };
    // A non-text event ahead of any text goes at once.
    let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
    assert_eq!(out.feed(start.as_bytes(), &metrics).out, start.as_bytes());
    let first = event(&"a".repeat(100));
    assert!(out.feed(first.as_bytes(), &metrics).out.is_empty(), "held: less than the window follows it");
    let second = event(&"b".repeat(stream::WINDOW));
    let fed = out.feed(second.as_bytes(), &metrics);
    assert_eq!(fed.out, first.as_bytes(), "released once the window followed it, unchanged");
    assert_eq!(out.finish(), second.as_bytes());
}

#[tokio::test]
async fn the_first_read_finds_what_escapes_hide_and_skips_what_is_not_text() {
    let g = guardrails(SECRETS_MASK);
    let a = applied(&g);
    let metrics = Metrics::default();
    let (tags, key_id) = call();
    let call = Call { protocol: "openai", route: "chat_completions", model: None, key_id, tags: &tags };
    // Written with a \u escape and after a newline escape: read as the client's text is, found.
    let body = br#"{"model":"m","messages":[{"role":"user","content":"line\n\u0041KIAIOSFODNN7EXAMPLE"}]}"#;
    let masked = screen_body(&a, &call, body, &mut Screening::default(), &metrics).await.expect("passes").expect("masked");
    assert_eq!(serde_json::from_slice::<Value>(&masked).expect("json")["messages"][0]["content"], "line\n[AWS_KEY_1]");
    // A name of a thing (an id, a model) is not text; a clean body is sent as it came, priced.
    let body = br#"{"model":"AKIAIOSFODNN7EXAMPLE","messages":[{"role":"user","content":"nothing here 12"}]}"#;
    let mut screening = Screening::default();
    assert_eq!(screen_body(&a, &call, body, &mut screening, &metrics).await, Ok(None));
    assert!(screening.noted.is_empty());
}

#[test]
fn a_text_is_read_only_where_its_digits_could_make_a_shape() {
    let g = guardrails("guardrails: [{name: p, kind: pii}]\ngroups: {default: {platforms: [openai], guardrails: [p]}}\n");
    let Detector::Patterns(m) = &g.by_name["p"].detector else { panic!("a pattern guardrail") };
    assert!(!m.any("three digits 1 2 3 and nothing else"));
    assert!(m.any("an address 10.0.0.1 here"), "four digits, one per word");
    assert!(m.any(&format!("{}card 4111111111111111", "x".repeat(13))), "digits across eight-byte words");
}

#[test]
fn prose_flows_and_only_what_may_be_a_match_under_way_is_held() {
    let metrics = Metrics::default();
    let g = guardrails("guardrails: [{name: s, kind: secrets, phase: output}, {name: p, kind: pii, phase: output}]\ngroups: {default: {platforms: [openai], guardrails: [s, p]}}\n");
    let mut out = OutputGuard::new(&applied(&g), &Masks::default(), Some(Dialect::Chat), "m").expect("guard");
    let event = |text: &str| format!("data: {}\n\n", json!({"choices":[{"index":0,"delta":{"content":text}}]}));
    // Words that end: each goes as it comes.
    for piece in ["Hello there, ", "how are ", "you today? "] {
        assert_eq!(contents(&out.feed(event(piece).as_bytes(), &metrics).out), piece);
    }
    // An event where a key may begin waits for what follows it (an event goes whole).
    assert_eq!(contents(&out.feed(event("My key AKIA").as_bytes(), &metrics).out), "");
    let fed = out.feed(event("IOSFODNN7EXAMPLE and more. ").as_bytes(), &metrics);
    assert_eq!(fed.blocked.as_deref(), Some("s"));
    let sent = String::from_utf8_lossy(&fed.out).into_owned();
    assert!(!sent.contains("AKIA") && sent.contains("content_policy_violation"), "{sent}");
}
