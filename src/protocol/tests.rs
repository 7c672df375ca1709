//! The wire protocol readers' tests (`protocol::tests::arb_json` also serves other modules' property tests).

use super::*;

#[test]
fn a_body_edit_is_one_copy_with_members_first_and_a_span_replaced() {
    let edit = |first: &[&str], replace: Option<(usize, usize, &str)>| BodyEdit {
        first: first.iter().map(|m| m.to_string()).collect(),
        replace: replace.map(|(s, e, t)| (s, e, t.to_string())),
    };
    let body = br#" {"a":1,"so":null}"#;
    let out = edit(&[r#""m":5"#], Some((13, 17, r#"{"x":true}"#))).apply(body).expect("applied");
    assert_eq!(&out[..], br#" {"m":5,"a":1,"so":{"x":true}}"#);
    assert_eq!(&edit(&[r#""m":5"#, r#""n":6"#], None).apply(b"{}").expect("empty object")[..], br#"{"m":5,"n":6}"#);
    assert_eq!(&edit(&[r#""m":5"#], None).apply(b"{ }").expect("spaced")[..], br#"{"m":5 }"#);
    assert!(edit(&["\"m\":5"], None).apply(b"[1]").is_err(), "not an object");
    assert!(edit(&[], Some((0, 1, "x"))).apply(b"{}").is_err(), "a span before the object");
    assert!(edit(&[], Some((1, 9, "x"))).apply(b"{}").is_err(), "a span past the end");
}
use proptest::prelude::*;

/// Any JSON value (nested up to a few levels).
pub fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::btree_map(any::<String>(), inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Any JSON object, with the body fields tollgate reads among arbitrary others.
pub fn arb_body() -> impl Strategy<Value = Value> {
    (
        proptest::collection::btree_map("[a-z_]{1,12}", arb_json(), 0..6),
        proptest::option::of(any::<String>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(0u64..1_000_000),
        proptest::option::of(arb_json()),
    )
        .prop_map(|(others, model, stream, max_tokens, stream_options)| {
            let mut m: serde_json::Map<String, Value> = others.into_iter().collect();
            for name in [
                "model",
                "stream",
                "max_tokens",
                "stream_options",
                "n",
                "max_completion_tokens",
                "max_output_tokens",
                "previous_response_id",
                "prompt_cache_key",
                "background",
            ] {
                m.remove(name);
            }
            if let Some(v) = model {
                m.insert("model".into(), Value::String(v));
            }
            if let Some(v) = stream {
                m.insert("stream".into(), Value::Bool(v));
            }
            if let Some(v) = max_tokens {
                m.insert("max_tokens".into(), Value::from(v));
            }
            if let Some(v) = stream_options {
                m.insert("stream_options".into(), v);
            }
            Value::Object(m)
        })
}

fn real_count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(real_count).sum(),
        Value::Object(m) => m.values().map(real_count).sum(),
        _ => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The fields are read from any object, whatever else it holds and however it is
    /// formatted; arbitrary bytes are refused or read, never a panic.
    #[test]
    fn body_fields_reads_any_object(body in arb_body(), pretty in any::<bool>()) {
        let bytes = if pretty { serde_json::to_vec_pretty(&body) } else { serde_json::to_vec(&body) }.expect("json");
        let f = body_fields(&bytes).expect("an object is read");
        prop_assert_eq!(f.model.as_deref(), body.get("model").and_then(Value::as_str));
        prop_assert_eq!(f.stream, body.get("stream").and_then(Value::as_bool));
        prop_assert_eq!(f.max_tokens, body.get("max_tokens").and_then(Value::as_u64));
        prop_assert_eq!(f.stream_options.is_some(), body.get("stream_options").is_some());
        // The raw values are the members' exact text, as serde_json's own raw capture has it.
        #[derive(Deserialize)]
        struct Raws<'a> {
            #[serde(borrow)]
            stream_options: Option<&'a serde_json::value::RawValue>,
        }
        let raws: Raws = serde_json::from_slice(&bytes).expect("json");
        // (serde's `Option` reads a null as None; the scan keeps it.)
        let ours = f.stream_options.and_then(|r| r.text()).filter(|t| *t != "null");
        prop_assert_eq!(ours, raws.stream_options.map(|r| r.get()));
    }

    #[test]
    fn body_fields_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = body_fields(&bytes);
    }

    /// The value count never under-counts (the bound it enforces holds).
    #[test]
    fn the_value_count_is_at_least_the_real_one(v in arb_json()) {
        let text = serde_json::to_string(&v).expect("json");
        prop_assert!(json_value_count(text.as_bytes(), usize::MAX) >= real_count(&v));
    }
}

#[test]
fn json_values_are_counted_outside_strings_only() {
    let count = |t: &str| json_value_count(t.as_bytes(), usize::MAX);
    assert_eq!(count("0"), 1);
    assert_eq!(count(r#""a,b,[c{""#), 1);
    assert_eq!(count(r#""esc\"aped,\\",1"#), 2);
    assert_eq!(count("[]"), 2, "an opening counts, over-counting an empty one is harmless");
    assert_eq!(count("[0,0,0]"), 4);
    assert_eq!(count(r#"{"a":[1,{"b":2}],"c":"x,y"}"#), 6);
    // Counting stops past the cap.
    assert_eq!(json_value_count("[0,0,0,0,0,0]".as_bytes(), 3), 4);
    // Never fewer than the values really present.
    for text in [r#"{"a":1,"b":[true,null,"q"],"c":{"d":{}}}"#, "[[[[]]],[],{}]"] {
        fn real(v: &Value) -> usize {
            1 + match v {
                Value::Array(a) => a.iter().map(real).sum(),
                Value::Object(m) => m.values().map(real).sum(),
                _ => 0,
            }
        }
        let v: Value = serde_json::from_str(text).expect("json");
        assert!(count(text) >= real(&v), "{text}");
    }
}

#[test]
fn a_part_with_too_many_values_is_refused_before_it_is_parsed() {
    let bomb = format!("[{}0]", "0,".repeat(MAX_PARSED_VALUES));
    let e = parse_bounded(&bomb, "metadata").expect_err("refused");
    assert_eq!((e.status(), e.param.as_deref()), (400, Some("metadata")));
    let fits = format!("[{}0]", "0,".repeat(MAX_PARSED_VALUES - 3));
    assert!(parse_bounded(&fits, "metadata").is_ok());
    assert!(parse_bounded("{", "metadata").is_err());
}

#[test]
fn day_labels_are_utc_dates() {
    assert_eq!(utc_date(0), "1970-01-01");
    assert_eq!(utc_date(59), "1970-03-01");
    assert_eq!(utc_date(11_016), "2000-02-29");
    assert_eq!(utc_date(20_781), "2026-11-24");
}

#[test]
fn rfc3339_known_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_551_113_065), "2019-02-25T16:44:25Z");
    assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
}

#[test]
fn statuses() {
    assert_eq!(ErrorKind::ModelNotFound.status(), 404);
    assert_eq!(ErrorKind::PayloadTooLarge.status(), 413);
    assert_eq!(ErrorKind::GatewayTimeout.status(), 504);
}

#[test]
fn every_shape_is_json_with_the_message() {
    let e = ApiError::new(ErrorKind::Unauthorized, "invalid API key");
    for p in [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini] {
        let v: serde_json::Value = serde_json::from_slice(&e.body(p)).expect("json");
        assert!(v.to_string().contains("invalid API key"));
    }
}

#[test]
fn body_fields_read_each_member_as_serde_would() {
    let f = body_fields(
        br#" { "mod\u0065l" : "m1", "stream":true, "messages": [{"role":"user","content":[{"type":"image_url"}]}],
             "input": null, "stream_options": null, "generation_config": {"candidate_count": 2}, "system": "be \"brief\"" } "#,
    )
    .expect("read");
    assert_eq!(f.model.as_deref(), Some("m1"), "an escaped key is its decoded name");
    assert_eq!(f.stream, Some(true));
    assert_eq!(f.messages.and_then(|r| r.text()), Some(r#"[{"role":"user","content":[{"type":"image_url"}]}]"#));
    assert_eq!(f.input, None, "null is absent");
    assert_eq!(f.stream_options.and_then(|r| r.text()), Some("null"), "stream_options is present even when null");
    assert_eq!(f.generation_config.and_then(|g| g.candidate_count), Some(2));
    assert_eq!(f.system.and_then(|r| r.text()), Some(r#""be \"brief\"""#));
    assert_eq!(f.media, MediaCount { images: 1, files: 0 });
    // Media parts count in the content fields only.
    let f = body_fields(br#"{"metadata":{"type":"image_url"},"contents":[{"parts":[{"fileData":{}}]}]}"#).expect("read");
    assert_eq!(f.media, MediaCount { images: 0, files: 1 });
}

#[test]
fn body_fields_refuse_what_is_not_one_json_object() {
    let refused = |body: &[u8]| body_fields(body).expect_err("refused");
    for (body, param) in [
        (&br#"{"model":"a","model":"b"}"#[..], Some("model")),
        (br#"{"generationConfig":{},"generation_config":{}}"#, Some("generationConfig")),
        (br#"{"model":5}"#, Some("model")),
        (br#"{"max_tokens":-1}"#, Some("max_tokens")),
        (br#"{"stream":"yes"}"#, Some("stream")),
        (br#"{"model":"a"} x"#, None),
        (br#"{"model":"a",}"#, None),
        (br#"{"model":"a" "stream":true}"#, None),
        (b"{\"model\":\"a\tb\"}", None),
        (br#"{"messages":[{"content":"open}]}"#, None),
        (br#"{"mod\ud800el":"a"}"#, None),
    ] {
        let e = refused(body);
        assert_eq!((e.status(), e.param.as_deref()), (400, param), "{}", String::from_utf8_lossy(body));
    }
    let e = refused(b"{\n  \"model\": tru\n}");
    assert!(e.message.contains("line 2 column 12"), "{}", e.message);
    let e = refused(br#"{"model":5}"#);
    assert_eq!(e.message, "The request body's 'model' is not valid: invalid type: integer `5`, expected a string.");
    // Repeating a member tollgate does not read is the upstream's business, as before.
    assert!(body_fields(br#"{"temperature":1,"temperature":2}"#).is_ok());
}

mod key_tests {
    use super::super::QuotedKey;

    fn key_strings(body: &[u8], key: &'static str) -> Vec<String> {
        let key: &'static QuotedKey = Box::leak(Box::new(QuotedKey::new(key)));
        super::key_strings(body, key).map(|s| s.into_owned()).collect()
    }

    #[test]
    fn key_strings_finds_members_and_never_text_inside_strings() {
        let body = br#"{"model" : "m-1","choices":[{"message":{"content":"say \"model\": \"fake\""},"finish_reason":"stop"},
            {"finish_reason":null},{"finish_reason":"length","model":7}]}"#;
        assert_eq!(key_strings(body, "\"model\""), ["m-1"]);
        assert_eq!(key_strings(body, "\"finish_reason\""), ["stop", "length"]);
        assert_eq!(key_strings(br#"{"model":"a\u00e9"}"#, "\"model\""), ["aé"]);
        assert!(key_strings(b"not json \"model\":", "\"model\"").is_empty());
        assert_eq!(key_strings(br#"{"model":"a\"b"}"#, "\"model\""), ["a\"b"]);
        assert!(key_strings(br#"{"model":"unterminated"#, "\"model\"").is_empty());
    }
}
