//! Issue 31, point 3 against the real daemon: OpenTelemetry's GenAI metrics on `/metrics` —
//! token usage by operation, provider, model and token type, request duration and time to
//! first token — for each protocol, streamed and not.

use crate::common::*;
use serde_json::json;

const ADMIN_TOKEN: &str = "telemetry-admin-token-00000001";

/// The value of one series line of the Prometheus text.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn gen_ai_metrics_count_tokens_duration_and_first_token_per_operation_provider_and_model() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&format!("{}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n", standard_config(mock.port)));
    let chat = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-usage", "12,7")
        .json(&json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("chat");
    assert_eq!(chat.status(), 200);
    chat.bytes().await.expect("body");
    let streamed = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .header("x-mock-usage", "30,5")
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("messages");
    assert!(streamed.text().await.expect("stream").contains("message_stop"));
    let gemini = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent"))
        .header("x-goog-api-key", CLIENT_KEY)
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .expect("gemini");
    assert_eq!(gemini.status(), 200);
    gemini.bytes().await.expect("body");
    // Refused before any provider: no GenAI series.
    let refused = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-not-a-key-0000001")
        .json(&json!({"model": "alpha-4o-mini"}))
        .send()
        .await;
    assert_eq!(refused.expect("refused").status(), 401);

    let text = client()
        .get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for kind in ["gen_ai_client_token_usage", "gen_ai_server_request_duration", "gen_ai_server_time_to_first_token"] {
        assert!(text.contains(&format!("# TYPE {kind} histogram")), "{kind}\n{text}");
    }
    let openai = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="alpha-5.5""#;
    assert_eq!(value(&text, &format!("gen_ai_client_token_usage_sum{{{openai},gen_ai_token_type=\"input\"}}")), Some(12.0), "{text}");
    assert_eq!(value(&text, &format!("gen_ai_client_token_usage_sum{{{openai},gen_ai_token_type=\"output\"}}")), Some(7.0), "{text}");
    assert_eq!(
        value(&text, &format!("gen_ai_client_token_usage_bucket{{{openai},gen_ai_token_type=\"input\",le=\"16\"}}")),
        Some(1.0),
        "12 input tokens fall in the bucket up to 16\n{text}"
    );
    assert_eq!(
        value(&text, &format!("gen_ai_client_token_usage_bucket{{{openai},gen_ai_token_type=\"input\",le=\"4\"}}")),
        Some(0.0),
        "{text}"
    );
    assert_eq!(value(&text, &format!("gen_ai_server_request_duration_count{{{openai}}}")), Some(1.0), "{text}");
    let anthropic = r#"gen_ai_operation_name="chat",gen_ai_provider_name="anthropic",gen_ai_request_model="beta-opus-4-7""#;
    assert_eq!(value(&text, &format!("gen_ai_client_token_usage_sum{{{anthropic},gen_ai_token_type=\"input\"}}")), Some(30.0), "{text}");
    assert_eq!(value(&text, &format!("gen_ai_client_token_usage_sum{{{anthropic},gen_ai_token_type=\"output\"}}")), Some(5.0), "{text}");
    assert_eq!(value(&text, &format!("gen_ai_server_time_to_first_token_count{{{anthropic}}}")), Some(1.0), "{text}");
    let ttft = value(&text, &format!("gen_ai_server_time_to_first_token_sum{{{anthropic}}}")).expect("ttft sum");
    let duration = value(&text, &format!("gen_ai_server_request_duration_sum{{{anthropic}}}")).expect("duration sum");
    assert!(ttft > 0.0 && ttft <= duration, "first token {ttft} s within the request's {duration} s");
    let gemini = r#"gen_ai_operation_name="generate_content",gen_ai_provider_name="gcp.gemini",gen_ai_request_model="gamma-3.5-flash""#;
    assert_eq!(value(&text, &format!("gen_ai_server_request_duration_count{{{gemini}}}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("gen_ai_client_token_usage_count{{{gemini},gen_ai_token_type=\"input\"}}")), Some(1.0), "{text}");
    assert!(!text.contains(r#"gen_ai_request_model="alpha-4o-mini""#), "a refused request has no GenAI series\n{text}");
}
