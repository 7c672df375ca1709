//! The OpenAI API's media endpoints through the real daemon and the mock: images (generated,
//! edited with a mask, streamed with partial images too large to read whole), speech streamed
//! as it is made, transcriptions and translations uploaded as multipart (a 20 MiB upload with
//! the gateway's memory measured), moderations; each billed exactly what the upstream reported
//! or the price table says, cut answers billed, refusals named. The SDKs' side is
//! `tests/sdk/test_media.py`.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const ZERO_KEY: &str = "sk-client-media-zero";
const RPM_KEY: &str = "sk-client-media-rpm";
const POOR_KEY: &str = "sk-client-media-poor";
const ADMIN_TOKEN: &str = "media-admin-token-0000000001";
const CAPPED_KEY: &str = "sk-client-media-capped";

/// Media models on the mock's `oa` provider (the image model under an upstream name of its own).
fn config(mock_port: u16, extra: &str) -> String {
    format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/oa", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5, {{ name: alpha-image, upstream: alpha-image-1 }}, alpha-dall-e, alpha-tts, alpha-tts-tokens,
               alpha-whisper, alpha-transcribe, alpha-moderation] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini, video] }}
  nomedia: {{ platforms: [anthropic] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  alpha-image: {{ input: 5.0, output: 10.0, image_input: 10.0, image_output: 40.0 }}
  alpha-dall-e: {{ input: 0, output: 0, per_image: {{ standard: {{ "1024x1024": 0.04, "1792x1024": 0.08 }}, hd: {{ "*": 0.12 }} }} }}
  alpha-tts: {{ input: 0, output: 0, characters: 15.0 }}
  alpha-tts-tokens: {{ input: 0.6, output: 12.0 }}
  alpha-whisper: {{ input: 0, output: 0, per_second: 0.0001 }}
  alpha-transcribe: {{ input: 2.5, output: 10.0, audio_input: 6.0 }}
  alpha-moderation: {{ input: 0, output: 0 }}
keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 50.0 }}
  - {{ key: {CHAT_KEY}, name: nomedia, group: nomedia, balance: 5.0 }}
  - {{ key: {ZERO_KEY}, name: zero, group: default, balance: 1.0 }}
  - {{ key: {RPM_KEY}, name: limited, group: default, balance: 1.0, rpm: 2 }}
  - {{ key: {POOR_KEY}, name: poor, group: default, balance: 1.0 }}
  - {{ key: {CAPPED_KEY}, name: capped, group: default, balance: 5.0, max_request_cost: 0.1, models: {{ deny: [alpha-whisper] }} }}
{extra}"#
    )
}

/// nano-USD of `tokens` at `usd` per 1M tokens, rounded as the ledger rounds.
fn at(tokens: u64, usd_per_m: f64) -> i64 {
    ((tokens as i128 * (usd_per_m * 1e9).round() as i128 + 500_000) / 1_000_000) as i64
}

async fn all_requests(mock: &Proc) -> Vec<Value> {
    client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap()
}

async fn post_json(gw: &Gateway, path: &str, key: &str, body: Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut rb = client().post(gw.url(path)).bearer_auth(key).json(&body);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    rb.send().await.expect("post")
}

async fn post_form(
    gw: &Gateway,
    path: &str,
    key: &str,
    (content_type, body): (String, Vec<u8>),
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut rb = client().post(gw.url(path)).bearer_auth(key).header("content-type", content_type).body(body);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    rb.send().await.expect("post")
}

/// The cost of the key's last `n` requests together, and its records' `estimated` flags, from
/// its balance: what it was charged since `before`.
async fn charged_since(gw: &Gateway, key: &str, before: i64) -> i64 {
    before - balance(gw, key).await
}

#[tokio::test]
async fn images_are_billed_from_their_usage_at_image_token_prices_or_per_image() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    // Usage reported: text and image tokens at their own prices.
    let before = balance(&gw, CLIENT_KEY).await;
    let r = post_json(&gw, "/v1/images/generations", CLIENT_KEY, json!({"model": "alpha-image", "prompt": "a red fox", "n": 2}), &[]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert!(v["data"][0]["b64_json"].as_str().unwrap().starts_with("iVBORw0KGg"), "a PNG, relayed as it came");
    let u = &v["usage"];
    let (text_in, image_out) = (u["input_tokens_details"]["text_tokens"].as_u64().unwrap(), u["output_tokens"].as_u64().unwrap());
    assert_eq!(image_out, 2000);
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(text_in, 5.0) + at(image_out, 40.0));
    // The upstream got its own model name.
    let seen = all_requests(&mock).await;
    assert!(seen.iter().any(|r| r["path"] == "/oa/v1/images/generations" && r["model"] == "alpha-image-1"), "{seen:?}");

    // Per image, by quality and size.
    let before = balance(&gw, CLIENT_KEY).await;
    let body =
        json!({"model": "alpha-dall-e", "prompt": "a fox", "n": 3, "quality": "standard", "size": "1792x1024", "response_format": "url"});
    let v: Value = post_json(&gw, "/v1/images/generations", CLIENT_KEY, body, &[]).await.json().await.unwrap();
    assert_eq!(v["data"][2]["url"], "https://images.mock.invalid/2.png");
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, 3 * 80_000_000);
    let u: Value = client().get(gw.url("/v1/usage?group_by=model")).bearer_auth(CLIENT_KEY).send().await.unwrap().json().await.unwrap();
    let row = u["models"].as_array().and_then(|rows| rows.iter().find(|r| r["model"] == "alpha-dall-e").cloned()).expect("a row");
    assert_eq!((nanos(&row["cost"]), row["requests"].as_u64()), (240_000_000, Some(1)), "{u}");

    // Held for n images at the dearest price the request can cost: 10 × $0.12 is more than $1.
    let r = post_json(&gw, "/v1/images/generations", ZERO_KEY, json!({"model": "alpha-dall-e", "prompt": "x", "n": 10}), &[]).await;
    assert_eq!(r.status(), 402, "{}", r.text().await.unwrap());
    // A quality and size the table has no price for is refused before anything is sent.
    let r = post_json(
        &gw,
        "/v1/images/generations",
        CLIENT_KEY,
        json!({"model": "alpha-dall-e", "prompt": "x", "quality": "standard", "size": "256x256"}),
        &[],
    )
    .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "size", "{e}");
    // A key's cost cap and model rules hold here too.
    let r =
        post_json(&gw, "/v1/images/generations", CAPPED_KEY, json!({"model": "alpha-dall-e", "prompt": "x", "quality": "hd"}), &[]).await;
    let (status, e) = (r.status(), r.json::<Value>().await.unwrap());
    assert_eq!((status.as_u16(), e["error"]["code"].as_str()), (402, Some("request_cost_cap_exceeded")), "{e}");
    let ok = post_json(
        &gw,
        "/v1/images/generations",
        CAPPED_KEY,
        json!({"model": "alpha-dall-e", "prompt": "x", "quality": "standard", "size": "1024x1024"}),
        &[],
    )
    .await;
    assert_eq!(ok.status(), 200);
    let body = form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", vec![1; 100])]);
    let r = post_form(&gw, "/v1/audio/transcriptions", CAPPED_KEY, body, &[]).await;
    assert_eq!(r.status(), 403, "a denied model");
    // More images than the API allows.
    let r = post_json(&gw, "/v1/images/generations", CLIENT_KEY, json!({"model": "alpha-image", "prompt": "x", "n": 11}), &[]).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn streamed_images_relay_partial_images_and_are_billed_from_events_too_long_to_read_whole() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    let before = balance(&gw, CLIENT_KEY).await;
    // 3 MiB images: each completed event is one line over the scanner's 1 MiB.
    let body = json!({"model": "alpha-image", "prompt": "a fox in snow", "stream": true, "partial_images": 2});
    let r = post_json(&gw, "/v1/images/generations", CLIENT_KEY, body, &[("x-mock-image-bytes", "3145728")]).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["image_generation.partial_image", "image_generation.partial_image", "image_generation.completed"]);
    let u = &events[2]["usage"];
    let (text_in, out) = (u["input_tokens"].as_u64().unwrap(), u["output_tokens"].as_u64().unwrap());
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(text_in, 5.0) + at(out, 40.0));
}

#[tokio::test]
async fn an_image_edit_with_a_mask_reaches_the_upstream_as_a_form_and_its_image_tokens_are_billed() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    let png = |n: usize| {
        let mut b = b"\x89PNG\r\n\x1a\n".to_vec();
        b.resize(n, 7);
        b
    };
    let before = balance(&gw, CLIENT_KEY).await;
    let body = form(
        &[("model", "alpha-image"), ("prompt", "add a hat"), ("n", "1")],
        &[
            ("image[]", "a.png", "image/png", png(5000)),
            ("image[]", "b.png", "image/png", png(7000)),
            ("mask", "m.png", "image/png", png(900)),
        ],
    );
    let r = post_form(&gw, "/v1/images/edits", CLIENT_KEY, body, &[("x-test-tag", "edit")]).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let v: Value = r.json().await.unwrap();
    let u = &v["usage"];
    let (text_in, image_in, out) = (
        u["input_tokens_details"]["text_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["image_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(image_in, 300, "three files, 100 image tokens each");
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(text_in, 5.0) + at(image_in, 10.0) + at(out, 40.0));
    let seen = mock_requests(&mock, "edit").await;
    let got: Value = serde_json::from_str(seen[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(got["fields"]["model"], "alpha-image-1", "the model under the provider's name: {got}");
    assert_eq!(got["fields"]["prompt"], "add a hat");
    let files: Vec<(String, u64)> =
        got["files"].as_array().unwrap().iter().map(|f| (f["name"].as_str().unwrap().to_string(), f["len"].as_u64().unwrap())).collect();
    assert_eq!(files, [("image[]".to_string(), 5000), ("image[]".to_string(), 7000), ("mask".to_string(), 900)]);
    let ct = seen[0]["headers"]["content-type"][0].as_str().unwrap();
    assert!(ct.starts_with("multipart/form-data; boundary=tollgate-"), "{ct}");
    // The client's key never reached the upstream.
    assert_eq!(seen[0]["headers"]["authorization"][0], format!("Bearer {UPSTREAM_KEY}"));
    // Variations, per image: no quality named, so the dearest price the size can match.
    let before = balance(&gw, CLIENT_KEY).await;
    let body = form(&[("model", "alpha-dall-e"), ("n", "2"), ("size", "1024x1024")], &[("image", "a.png", "image/png", png(4000))]);
    let r = post_form(&gw, "/v1/images/variations", CLIENT_KEY, body, &[("x-test-tag", "variation")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["data"].as_array().unwrap().len(), 2);
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, 2 * 120_000_000);
    assert_eq!(mock_requests(&mock, "variation").await[0]["path"], "/oa/v1/images/variations");
}

#[tokio::test]
async fn speech_reaches_the_client_while_the_upstream_is_still_sending_and_is_billed_by_character() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    let text = "Bonjour à tous, ceci est un test.";
    let before = balance(&gw, CLIENT_KEY).await;
    let body = json!({"model": "alpha-tts", "input": text, "voice": "alloy"});
    let mut r =
        post_json(&gw, "/v1/audio/speech", CLIENT_KEY, body, &[("x-mock-hold", "speech-1"), ("x-mock-speech-bytes", "65536")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "audio/mpeg");
    // The first chunk arrives while the upstream holds the rest back.
    let first = tokio::time::timeout(Duration::from_secs(10), r.chunk()).await.expect("first bytes in time").unwrap().unwrap();
    assert!(!first.is_empty());
    client().post(mock.url("/__mock/release?token=speech-1")).send().await.unwrap();
    let mut total = first.len();
    while let Some(chunk) = r.chunk().await.unwrap() {
        total += chunk.len();
    }
    assert_eq!(total, 65536);
    let characters = text.chars().count() as u64;
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(characters, 15.0));

    // Cut mid-stream: the text was spoken, and is billed.
    let before = balance(&gw, CLIENT_KEY).await;
    let body = json!({"model": "alpha-tts", "input": text, "voice": "alloy"});
    let r = post_json(&gw, "/v1/audio/speech", CLIENT_KEY, body, &[("x-mock-cut-after", "2")]).await;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.is_err(), "the cut reaches the client as a cut");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while charged_since(&gw, CLIENT_KEY, before).await == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(characters, 15.0));

    // Token-priced speech in events: billed from the usage of `speech.audio.done`.
    let before = balance(&gw, CLIENT_KEY).await;
    let body = json!({"model": "alpha-tts-tokens", "input": text, "voice": "alloy", "stream_format": "sse"});
    let events = post_json(&gw, "/v1/audio/speech", CLIENT_KEY, body, &[]).await.text().await.unwrap();
    let done: Value =
        events.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str::<Value>(d).unwrap()).next_back().unwrap();
    assert_eq!(done["type"], "speech.audio.done");
    let (i, o) = (done["usage"]["input_tokens"].as_u64().unwrap(), done["usage"]["output_tokens"].as_u64().unwrap());
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(i, 0.6) + at(o, 12.0));
    // Over the API's 4096 characters: refused, naming the field.
    let r = post_json(&gw, "/v1/audio/speech", CLIENT_KEY, json!({"model": "alpha-tts", "input": "a".repeat(4097), "voice": "alloy"}), &[])
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "input");
}

/// The gateway's resident memory (VmRSS) and its peak (VmHWM), in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()).unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test]
async fn a_20_mib_transcription_is_streamed_through_disk_with_the_gateways_memory_bounded() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    // Warm up the paths the upload takes (allocator arenas, connections).
    let small = form(&[("model", "alpha-whisper")], &[("file", "a.mp3", "audio/mpeg", vec![1; 64 << 10])]);
    assert_eq!(post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, small, &[]).await.status(), 200);
    let pid = gw.proc.child.id();
    let (rss_before, peak_before) = memory_kib(pid);
    let before = balance(&gw, CLIENT_KEY).await;
    let audio: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
    let body = form(&[("model", "alpha-whisper"), ("response_format", "verbose_json")], &[("file", "talk.mp3", "audio/mpeg", audio)]);
    let r = post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, body, &[("x-test-tag", "big")]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let (rss_after, peak_after) = memory_kib(pid);
    let seconds = v["usage"]["seconds"].as_u64().unwrap();
    assert_eq!(seconds, (20u64 << 20).div_ceil(16_000));
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, seconds as i64 * 100_000);
    let seen = mock_requests(&mock, "big").await;
    let got: Value = serde_json::from_str(seen[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(got["files"][0]["len"], 20 << 20, "every byte reached the upstream");
    // The upload went to disk, not memory: the gateway's resident memory grew by far less than it.
    let grown = peak_after.saturating_sub(rss_before);
    println!(
        "gateway RSS before {rss_before} KiB, after a 20 MiB upload {rss_after} KiB (+{grown} KiB); peak {peak_before} -> {peak_after} KiB"
    );
    assert!(grown < 4 << 10, "peak resident memory grew {grown} KiB for a 20 MiB upload");
}

#[tokio::test]
async fn transcriptions_and_translations_are_billed_by_seconds_or_tokens_and_streamed() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    let audio = vec![3u8; 160_000];
    // Per second, from `usage.seconds`.
    let before = balance(&gw, CLIENT_KEY).await;
    let r = post_form(
        &gw,
        "/v1/audio/translations",
        CLIENT_KEY,
        form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", audio.clone())]),
        &[],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["text"], "The mock heard every word.");
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, 10 * 100_000);
    // Per token, streamed: the events relayed, billed from `transcript.text.done`.
    let before = balance(&gw, CLIENT_KEY).await;
    let body = form(&[("model", "alpha-transcribe"), ("stream", "true")], &[("file", "a.wav", "audio/wav", audio.clone())]);
    let text = post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, body, &[]).await.text().await.unwrap();
    let events: Vec<Value> = text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    assert!(events.len() > 2 && events[0]["type"] == "transcript.text.delta");
    let u = &events.last().unwrap()["usage"];
    let (input, audio_in, out) = (
        u["input_tokens"].as_u64().unwrap(),
        u["input_token_details"]["audio_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(input - audio_in, 2.5) + at(audio_in, 6.0) + at(out, 10.0));
    // A plain-text answer reports nothing: billed the seconds its container says it plays — an
    // Ogg Opus file of 20 s at 3 kbit/s (12 KB: under 1 KB a second, which a bound by size
    // once assumed), whose 20.x s are billed, not a size's guess.
    let opus = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/audio/tone-20s-3kbps.opus")).unwrap();
    let before = balance(&gw, CLIENT_KEY).await;
    let body = form(&[("model", "alpha-whisper"), ("response_format", "text")], &[("file", "a.opus", "audio/ogg", opus)]);
    assert_eq!(post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, body, &[]).await.text().await.unwrap(), "The mock heard every word.");
    let charged = charged_since(&gw, CLIENT_KEY, before).await;
    assert!((2_000_000..=2_030_000).contains(&charged), "20 s at $0.0001 a second, charged {charged}");
    // … and one whose container tells nothing: billed its hold, the seconds its size can hold at
    // the least rate any codec takes (64 bytes a second).
    let before = balance(&gw, CLIENT_KEY).await;
    let body = form(&[("model", "alpha-whisper"), ("response_format", "text")], &[("file", "a.wav", "audio/wav", audio)]);
    assert_eq!(post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, body, &[]).await.text().await.unwrap(), "The mock heard every word.");
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, 2500 * 100_000, "160000 bytes at no less than 64 bytes a second");
    // No file part: refused, naming it.
    let r = post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, form(&[("model", "alpha-whisper")], &[]), &[]).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "file");
}

#[tokio::test]
async fn oversize_malformed_and_unroutable_uploads_are_refused_with_the_part_named() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, "limits: { max_upload_bytes: 100000 }\n"));
    let audio = |n: usize| vec![5u8; n];
    // Over the upload limit, declared or chunked.
    let r = post_form(
        &gw,
        "/v1/audio/transcriptions",
        CLIENT_KEY,
        form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", audio(200_000))]),
        &[],
    )
    .await;
    assert_eq!(r.status(), 413);
    let (ct, body) = form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", audio(100_500))]);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body.chunks(8192).map(|c| Ok(c.to_vec())).collect();
    let r = client()
        .post(gw.url("/v1/audio/transcriptions"))
        .bearer_auth(CLIENT_KEY)
        .header("content-type", ct)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // Cut inside the file part.
    let (ct, mut body) = form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", audio(5000))]);
    body.truncate(body.len() - 2000);
    let r = post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, (ct, body), &[]).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "file", "{e}");
    // A text field over 64 KiB.
    let long = "p".repeat(70_000);
    let r = post_form(
        &gw,
        "/v1/images/edits",
        CLIENT_KEY,
        form(&[("model", "alpha-image"), ("prompt", &long)], &[("image", "a.png", "image/png", audio(10))]),
        &[],
    )
    .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "prompt");
    // Too many parts.
    let many: Vec<(String, String)> = (0..70).map(|i| (format!("f{i}"), "x".to_string())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let r = post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, form(&many, &[]), &[]).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("more than 64 parts"));
    // A key whose group has no OpenAI endpoints.
    for path in ["/v1/images/generations", "/v1/audio/speech", "/v1/moderations"] {
        let r = post_json(&gw, path, CHAT_KEY, json!({"model": "alpha-tts", "input": "x", "prompt": "x"}), &[]).await;
        assert_eq!(r.status(), 404, "{path}");
    }
    // A model the key's provider does not serve.
    let r = post_form(
        &gw,
        "/v1/audio/transcriptions",
        CLIENT_KEY,
        form(&[("model", "nope")], &[("file", "a.wav", "audio/wav", audio(10))]),
        &[],
    )
    .await;
    assert_eq!(r.status(), 404);
    // The mock never saw any of them.
    assert!(all_requests(&mock).await.is_empty());
}

#[tokio::test]
async fn moderations_cost_their_price_entry_count_against_rate_limits_and_show_in_the_model_list() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, &format!("admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n")));
    for _ in 0..2 {
        let r = post_json(&gw, "/v1/moderations", RPM_KEY, json!({"model": "alpha-moderation", "input": ["one", "two"]}), &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["results"].as_array().unwrap().len(), 2);
    }
    let r = post_json(&gw, "/v1/moderations", RPM_KEY, json!({"model": "alpha-moderation", "input": "three"}), &[]).await;
    assert_eq!(r.status(), 429, "counted against the key's rpm");
    // Priced at zero, and recorded.
    let before = balance(&gw, CLIENT_KEY).await;
    let r = post_json(&gw, "/v1/moderations", CLIENT_KEY, json!({"model": "alpha-moderation", "input": "four"}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(balance(&gw, CLIENT_KEY).await, before);
    let u: Value = client().get(gw.url("/v1/usage?group_by=model")).bearer_auth(CLIENT_KEY).send().await.unwrap().json().await.unwrap();
    assert!(u["models"].as_array().unwrap().iter().any(|r| r["model"] == "alpha-moderation" && r["requests"] == 1), "{u}");
    // The model list shows the media models the key may call.
    let models: Value = client().get(gw.url("/v1/models")).bearer_auth(CLIENT_KEY).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    for m in ["alpha-image", "alpha-tts", "alpha-whisper", "alpha-moderation"] {
        assert!(ids.contains(&m), "{m} in {ids:?}");
    }
    // An upstream error is relayed in the SDK's shape and costs nothing.
    let before = balance(&gw, POOR_KEY).await;
    let r = post_json(&gw, "/v1/images/generations", POOR_KEY, json!({"model": "alpha-image", "prompt": "x"}), &[("x-mock-status", "400")])
        .await;
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    assert_eq!(balance(&gw, POOR_KEY).await, before);
    // Counted per endpoint, and logged without what was sent (no prompt, no image, no audio).
    let secret = "a prompt that must not be kept";
    let r = post_json(&gw, "/v1/images/generations", CLIENT_KEY, json!({"model": "alpha-image", "prompt": secret}), &[]).await;
    assert_eq!(r.status(), 200);
    let metrics = admin_metrics(admin_port, ADMIN_TOKEN).await;
    for series in [
        "tollgate_requests_total{route=\"moderations\",model=\"alpha-moderation\",status=\"200\"}",
        "tollgate_requests_total{route=\"image_generation\",model=\"alpha-image\",status=\"200\"}",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    let log: Value = client()
        .get(format!("http://127.0.0.1:{admin_port}/admin/requests?limit=50"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = log.to_string();
    assert!(text.contains("image_generation") && text.contains("moderations"), "{text}");
    assert!(!text.contains(secret), "the request log keeps no prompt: {text}");
}

#[tokio::test]
async fn an_upload_refused_by_one_provider_is_sent_again_from_disk_to_the_next_and_billed_once() {
    let mock = start_mock();
    let config = format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{port}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-whisper] }}
  - {{ name: ob, protocol: openai, base_url: "http://127.0.0.1:{port}/ob", api_key: {UPSTREAM_KEY}, models: [alpha-whisper], priority: 1 }}
retry: {{ attempts: 2, on_status: [500] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-whisper: {{ input: 0, output: 0, per_second: 0.0001 }}
keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
"#,
        port = mock.port
    );
    let gw = start_gateway(&config);
    let before = balance(&gw, CLIENT_KEY).await;
    let audio: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let body = form(&[("model", "alpha-whisper")], &[("file", "long.wav", "audio/wav", audio)]);
    let r = post_form(
        &gw,
        "/v1/audio/transcriptions",
        CLIENT_KEY,
        body,
        &[("x-mock-status", "500"), ("x-mock-only", "/oa"), ("x-test-tag", "retry")],
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let seen = mock_requests(&mock, "retry").await;
    let paths: Vec<&str> = seen.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["/oa/v1/audio/transcriptions", "/ob/v1/audio/transcriptions"]);
    for attempt in &seen {
        let got: Value = serde_json::from_str(attempt["body"].as_str().unwrap()).unwrap();
        assert_eq!(got["files"][0]["len"], 3_000_000, "each attempt carried the whole file: {got}");
    }
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, 3_000_000u64.div_ceil(16_000) as i64 * 100_000, "billed once, by the answer");
}

/// A raw upload of `declared` bytes to the transcriptions endpoint: sent up to `first`, after
/// the gateway's `100 Continue` (its checks passed; the spool is held as the bytes arrive).
fn start_held_upload(port: u16, content_type: &str, declared: usize, first: &[u8]) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {declared}\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 100"), "{}", String::from_utf8_lossy(&head));
    s.write_all(first).unwrap();
    s
}

#[tokio::test]
async fn past_the_spool_budget_uploads_get_503_with_retry_after_until_room_returns() {
    use std::io::{Read, Write};
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, "limits: { max_upload_bytes: 100000, max_spooled_bytes: 100000 }\n"));
    // One upload of exactly 100000 bytes, held after 99,500 of them: nearly the whole spool is
    // its (what arrived, not what it declared: a declared length alone holds nothing).
    let overhead = form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", Vec::new())]).1.len();
    let (content_type, body) = form(&[("model", "alpha-whisper")], &[("file", "a.wav", "audio/wav", vec![9; 100_000 - overhead])]);
    assert_eq!(body.len(), 100_000);
    let port = gw.proc.port;
    let (first, rest) = (body[..99_500].to_vec(), body[99_500..].to_vec());
    let ct = content_type.clone();
    let mut held = tokio::task::spawn_blocking(move || start_held_upload(port, &ct, 100_000, &first)).await.unwrap();
    let small = || form(&[("model", "alpha-whisper")], &[("file", "b.wav", "audio/wav", vec![1; 1000])]);
    let refused = std::sync::Arc::new(std::sync::Mutex::new(None));
    until("the held upload's bytes spooled", || {
        let refused = refused.clone();
        let gw = &gw;
        async move {
            let r = post_form(gw, "/v1/audio/transcriptions", CLIENT_KEY, small(), &[]).await;
            let busy = r.status() == 503;
            if busy {
                *refused.lock().unwrap() = Some(r);
            }
            busy
        }
    })
    .await;
    let r = refused.lock().unwrap().take().unwrap();
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "overloaded");
    // The held upload completes and is served; once it was sent its share comes back.
    let answer = tokio::task::spawn_blocking(move || {
        held.write_all(&rest).unwrap();
        let mut buf = [0u8; 12];
        held.read_exact(&mut buf).unwrap();
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .unwrap();
    assert_eq!(answer, "HTTP/1.1 200");
    assert_eq!(post_form(&gw, "/v1/audio/transcriptions", CLIENT_KEY, small(), &[]).await.status(), 200);
}

#[tokio::test]
async fn an_image_download_the_client_cuts_is_still_billed_what_the_upstream_reported() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, ""));
    let before = balance(&gw, CLIENT_KEY).await;
    let prompt = "a very large image";
    // 8 MiB of b64_json: the client reads its first bytes and leaves.
    let mut r = post_json(
        &gw,
        "/v1/images/generations",
        CLIENT_KEY,
        json!({"model": "alpha-image", "prompt": prompt}),
        &[("x-mock-image-bytes", "8388608")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(!r.chunk().await.unwrap().unwrap().is_empty());
    drop(r);
    // The gateway reads the rest for its usage and settles on it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while charged_since(&gw, CLIENT_KEY, before).await == 0 {
        assert!(std::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let prompt_tokens = (prompt.len() as u64).div_ceil(4);
    assert_eq!(charged_since(&gw, CLIENT_KEY, before).await, at(prompt_tokens, 5.0) + at(1000, 40.0));
}
