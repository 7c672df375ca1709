//! Micro-benchmarks of the hot pure functions: routing, key lookup, the usage scanner, body
//! model extraction and TC3 signing. `cargo bench --bench micro`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure here is a failed run, not a client's answer
#![allow(clippy::too_many_lines)] // a benchmark's main tells its run in order

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tollgate::access::auth::KeyIndex;
use tollgate::billing::meter::{Shape, UsageScanner};
use tollgate::config::KeyConfig;
use tollgate::route::classify;
use tollgate::store::sled::{keys::SledKeys, SledDb};
use tollgate::upstream::body_fields;
use tollgate::video::tc3;

fn routing(c: &mut Criterion) {
    c.bench_function("route/chat", |b| b.iter(|| classify(black_box("POST"), black_box("/v1/chat/completions"))));
    c.bench_function("route/generate_content", |b| {
        b.iter(|| classify(black_box("POST"), black_box("/v1beta/models/gamma-3.5-flash:streamGenerateContent")))
    });
}

fn key_lookup(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SledDb::open(dir.path()).expect("store");
    let store = std::sync::Arc::new(SledKeys::new(db.db()).expect("keys"));
    let seeds: Vec<KeyConfig> = (0..1000)
        .map(|i| KeyConfig {
            key: format!("sk-bench-key-{i:06}"),
            name: format!("k{i}"),
            group: "default".into(),
            balance: 1.0,
            rpm: None,
            tpm: None,
            max_concurrent: None,
            enabled: true,
            policy: Default::default(),
            plan: None,
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let index = runtime.block_on(KeyIndex::load(store, &seeds)).expect("index");
    c.bench_function("auth/lookup_1000_keys", |b| b.iter(|| index.authenticate(black_box(Some("sk-bench-key-000500"))).is_ok()));
}

fn chat_stream(deltas: usize) -> Vec<Bytes> {
    let mut events: Vec<Bytes> = (0..deltas)
        .map(|i| Bytes::from(format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n")))
        .collect();
    events
        .push(Bytes::from_static(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":64}}\n\ndata: [DONE]\n\n"));
    events
}

fn scanner(c: &mut Criterion) {
    let events = chat_stream(64);
    let bytes: usize = events.iter().map(Bytes::len).sum();
    let mut g = c.benchmark_group("meter");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("chat_stream_64_deltas", |b| {
        b.iter(|| {
            let mut s = UsageScanner::new(Shape::Chat, true, false);
            for e in &events {
                black_box(s.feed(e));
            }
            s.finish()
        })
    });
    g.bench_function("chat_stream_64_deltas_withheld_usage", |b| {
        b.iter(|| {
            let mut s = UsageScanner::new(Shape::Chat, true, true);
            for e in &events {
                black_box(s.feed(e));
            }
            s.finish()
        })
    });
    g.finish();
}

fn model_extraction(c: &mut Criterion) {
    let small = br#"{"model":"alpha-5.5","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":64}"#.to_vec();
    let big = format!(r#"{{"messages":[{{"role":"user","content":"{}"}}],"model":"alpha-5.5"}}"#, "x".repeat(4 << 20)).into_bytes();
    let mut g = c.benchmark_group("body_fields");
    g.bench_function("small", |b| b.iter(|| body_fields(black_box(&small)).map(|f| f.model)));
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.sample_size(20);
    g.bench_function("4_mib_model_last", |b| b.iter(|| body_fields(black_box(&big)).map(|f| f.model)));
    g.finish();
}

fn signing(c: &mut Criterion) {
    let payload = br#"{"Model":"genq3-pro","Prompt":"a cat surfing a wave at sunset","Duration":5}"#;
    c.bench_function("tc3/sign", |b| {
        b.iter(|| {
            tc3::authorization(&tc3::SignInput {
                secret_id: "AKIDEXAMPLE",
                secret_key: "secret",
                host: "vclm.tencentcloudapi.com",
                service: "vclm",
                timestamp: black_box(1_700_000_000),
                payload,
                action: Some("SubmitTextToVideoGenJob"),
            })
        })
    });
}

/// Guardrails (issue 65): a prompt of 4 KiB and of 64 KiB of prose read by the bundled kinds
/// (every secret and personal-data recogniser, nothing found), and a 64-delta stream through the
/// output guard against the same stream passed on as it is.
fn guardrails(c: &mut Criterion) {
    use tollgate::checks::guard::{self, stream::Dialect, stream::OutputGuard, Call, Guardrails, Masks, Screening};
    let yaml = "listen: 127.0.0.1:1\nguardrails: [{name: s, kind: secrets, phase: both}, {name: p, kind: pii, phase: both}]\ngroups: {default: {platforms: [openai], guardrails: [s, p]}}\n";
    let config = tollgate::config::Config::parse(yaml, &|_| None).expect("config");
    let guards = Guardrails::new(&config, &Default::default()).expect("guardrails");
    let applied = guards.applying("default", &tollgate::policy::KeyPolicy::default(), &[]);
    let metrics = tollgate::observe::metrics::Metrics::default();
    let tags = std::collections::BTreeMap::new();
    let call = Call { protocol: "openai", route: "chat_completions", model: None, key_id: "k", tags: &tags };
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let mut g = c.benchmark_group("guardrails");
    for (name, repeat) in [("prompt_4k", 50), ("prompt_64k", 800)] {
        let prose = "The quarterly report covers revenue, churn and the roadmap for the next release. ".repeat(repeat);
        let body =
            serde_json::to_vec(&serde_json::json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": prose}]})).expect("json");
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| runtime.block_on(guard::screen_body(&applied, &call, black_box(&body), &mut Screening::default(), &metrics)).is_ok())
        });
    }
    let events = chat_stream(64);
    g.throughput(Throughput::Bytes(events.iter().map(Bytes::len).sum::<usize>() as u64));
    g.bench_function("stream_64_deltas", |b| {
        b.iter(|| {
            let mut out = OutputGuard::new(&applied, &Masks::default(), Some(Dialect::Chat), "alpha-5.5").expect("guard");
            for e in &events {
                black_box(out.feed(e, &metrics));
            }
            out.finish()
        })
    });
    g.finish();
}

criterion_group!(benches, routing, key_lookup, scanner, model_extraction, signing, guardrails);
criterion_main!(benches);
