//! Video tasks against the real daemon and the mock Tencent-style service (which checks every
//! TC3 signature): each capability, the legacy paths, FAIL, content download, ownership,
//! idempotency, validation, and a hard restart in the middle of a task.

use crate::common;

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const OTHER_KEY: &str = "sk-client-other-0001";
const IMG: &str = "https://example.com/a.png";

fn config(mock_port: u16) -> String {
    let base = with_key(&standard_config(mock_port), &format!("{{ key: {OTHER_KEY}, name: other, group: default, balance: 5.0 }}"));
    format!("{base}{}", video_section(mock_port))
}

async fn create(gw: &Gateway, path: &str, key: &str, body: Value, idem: Option<&str>) -> reqwest::Response {
    let mut rb = client().post(gw.url(path)).bearer_auth(key).json(&body);
    if let Some(i) = idem {
        rb = rb.header("idempotency-key", i);
    }
    rb.send().await.expect("create")
}

async fn get_task(gw: &Gateway, path: &str, key: &str) -> (u16, Value) {
    let r = client().get(gw.url(path)).bearer_auth(key).send().await.expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// Poll as a client does until the task reaches `want` (or fail after 30 s).
async fn poll_until(gw: &Gateway, path: &str, key: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, v) = get_task(gw, path, key).await;
        assert_eq!(status, 200, "{v}");
        if v["status"] == want {
            return v;
        }
        assert!(Instant::now() < deadline, "task never reached {want}: {v}");
        assert!(v["status"] != "failed" || want == "failed", "task failed: {v}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn tc_calls(mock: &Proc) -> Vec<Value> {
    client().get(mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json")
}

fn submits_with_prompt<'a>(calls: &'a [Value], prompt: &str) -> Vec<&'a Value> {
    calls.iter().filter(|c| c["action"].as_str().is_some_and(|a| a.starts_with("Submit")) && c["payload"]["Prompt"] == prompt).collect()
}

#[tokio::test]
async fn each_capability_is_submitted_polled_and_downloadable() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let cases = [
        (
            json!({"model": "genq3-pro", "prompt": "text one", "duration": "8",
                "metadata": {"Resolution": "1080p", "MovementAmplitude": "large", "Bgm": true, "AspectRatio": "16:9"}}),
            "TextToVideo",
            "genq3-pro",
        ),
        (json!({"model": "genq2-pro", "prompt": "image one", "image": IMG}), "ImageToVideo", "genq2-pro"),
        (
            json!({"model": "genq2-turbo", "prompt": "ref one", "images": [IMG, IMG, IMG], "metadata": {"action": "referenceGenerate"}}),
            "ReferenceToVideo",
            "genq2",
        ),
    ];
    for (body, capability, upstream_model) in cases {
        let prompt = body["prompt"].as_str().unwrap_or_default().to_string();
        let r = create(&gw, "/v1/videos", CLIENT_KEY, body.clone(), None).await;
        assert_eq!(r.status(), 200);
        let created: Value = r.json().await.expect("json");
        let id = created["id"].as_str().expect("id").to_string();
        assert!(id.starts_with("task_") && id.len() >= 29, "{id}");
        assert_eq!(created["task_id"], created["id"]);
        assert_eq!(created["object"], "video");
        assert_eq!(created["model"], body["model"]);
        assert_eq!(created["status"], "queued");
        assert_eq!(created["progress"], 0);
        assert!(created["created_at"].as_u64().is_some());
        let text = created.to_string();
        assert!(!text.contains("job-") && !text.contains("key_"), "internal ids leak: {text}");

        let calls = tc_calls(&mock).await;
        let submit = submits_with_prompt(&calls, &prompt);
        assert_eq!(submit.len(), 1);
        assert_eq!(submit[0]["action"], format!("Submit{capability}GenJob"));
        let payload = &submit[0]["payload"];
        assert_eq!(payload["Model"], upstream_model);
        assert!(payload.get("Resolution").is_none() && payload.get("MovementAmplitude").is_none());
        assert!(payload.get("Action").is_none() && payload.get("action").is_none());
        if capability == "TextToVideo" {
            assert_eq!(payload["Duration"], 8);
            assert_eq!(payload["Bgm"], true);
            assert_eq!(payload["AspectRatio"], "16:9");
        } else {
            assert!(payload["Images"].as_array().is_some_and(|i| !i.is_empty()));
        }

        let done = poll_until(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY, "completed").await;
        assert_eq!(done["progress"], 100);
        assert!(done["completed_at"].as_u64().is_some_and(|t| t >= created["created_at"].as_u64().unwrap_or(0)));
        let url = done["metadata"]["url"].as_str().expect("url");
        assert!(url.ends_with(".mp4"), "{url}");
        assert!(tc_calls(&mock).await.iter().any(|c| c["action"] == format!("Describe{capability}GenJob")));

        let r = client().get(gw.url(&format!("/v1/videos/{id}/content"))).bearer_auth(CLIENT_KEY).send().await.expect("content");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "video/mp4");
        assert_eq!(r.headers()["content-length"], MOCK_VIDEO_LEN.to_string());
        let bytes = r.bytes().await.expect("bytes");
        assert_eq!(bytes.as_ref(), common::mock_video::mock_video_bytes().as_slice());
    }
}

use crate::common::mock_video::MOCK_VIDEO_LEN;

#[tokio::test]
async fn content_range_not_ready_failed_and_expired() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    // Completed: a Range request gets 206 with exactly those bytes.
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-turbo", "prompt": "range"}), None).await;
    let id = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    poll_until(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY, "completed").await;
    let r = client()
        .get(gw.url(&format!("/v1/videos/{id}/content")))
        .bearer_auth(CLIENT_KEY)
        .header("range", "bytes=100-199")
        .send()
        .await
        .expect("range");
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"], format!("bytes 100-199/{MOCK_VIDEO_LEN}"));
    assert_eq!(r.bytes().await.expect("bytes").as_ref(), &common::mock_video::mock_video_bytes()[100..200]);

    // Not completed yet: 409.
    let token = format!("nr-{}", std::process::id());
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": format!("wait [hold:{token}]")}), None).await;
    let held = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    let r = client().get(gw.url(&format!("/v1/videos/{held}/content"))).bearer_auth(CLIENT_KEY).send().await.expect("content");
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.expect("json");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("not ready")), "{v}");

    // FAIL: the task carries the error, and there is no video.
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "bad [fail]"}), None).await;
    let failed = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    let v = poll_until(&gw, &format!("/v1/videos/{failed}"), CLIENT_KEY, "failed").await;
    assert_eq!(v["error"]["code"], "FailedOperation.Moderation");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(v.get("metadata").is_none());
    let r = client().get(gw.url(&format!("/v1/videos/{failed}/content"))).bearer_auth(CLIENT_KEY).send().await.expect("content");
    assert_eq!(r.status(), 409);

    // The upstream URL answers 403 (expired): 410.
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "old [expired]"}), None).await;
    let old = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    poll_until(&gw, &format!("/v1/videos/{old}"), CLIENT_KEY, "completed").await;
    let r = client().get(gw.url(&format!("/v1/videos/{old}/content"))).bearer_auth(CLIENT_KEY).send().await.expect("content");
    assert_eq!(r.status(), 410);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], "expired");
}

#[tokio::test]
async fn legacy_paths_share_the_task_object_plus_result_url() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    for path in ["/v1/video/generations", "/v1/videos/generations"] {
        let r = create(&gw, path, CLIENT_KEY, json!({"model": "genq2", "prompt": format!("legacy {path}")}), None).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["status"], "queued");
        assert_eq!(v["task_id"], v["id"]);
        let id = v["id"].as_str().expect("id").to_string();
        let done = poll_until(&gw, &format!("/v1/video/generations/{id}"), CLIENT_KEY, "completed").await;
        assert_eq!(done["result_url"], done["metadata"]["url"]);
        assert!(done["result_url"].as_str().is_some_and(|u| u.ends_with(".mp4")));
        let (_, modern) = get_task(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY).await;
        assert!(modern.get("result_url").is_none());
        assert_eq!(modern["metadata"]["url"], done["result_url"]);
    }
}

#[tokio::test]
async fn a_task_is_visible_only_to_its_owner() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "mine"}), None).await;
    let id = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    for path in [format!("/v1/videos/{id}"), format!("/v1/video/generations/{id}"), format!("/v1/videos/{id}/content")] {
        let (status, v) = get_task(&gw, &path, OTHER_KEY).await;
        assert_eq!(status, 404, "{path}: {v}");
        let (status, _) = get_task(&gw, &path.replace(&id, "task_doesnotexist0000000000000000"), CLIENT_KEY).await;
        assert_eq!(status, 404, "{path}: same answer as no task at all");
    }
    let (status, _) = get_task(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY).await;
    assert_eq!(status, 200);
    let r = client().get(gw.url(&format!("/v1/videos/{id}"))).send().await.expect("no key");
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn idempotency_key_returns_the_original_task_and_submits_once() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let body = json!({"model": "genq3-pro", "prompt": "idempotent"});
    let first: Value = create(&gw, "/v1/videos", CLIENT_KEY, body.clone(), Some("order-42")).await.json().await.expect("json");
    let again: Value = create(&gw, "/v1/videos", CLIENT_KEY, body.clone(), Some("order-42")).await.json().await.expect("json");
    assert_eq!(first["id"], again["id"]);
    // Concurrent duplicates also collapse into the one task.
    let dupes = futures_util::future::join_all((0..4).map(|_| create(&gw, "/v1/videos", CLIENT_KEY, body.clone(), Some("order-43")))).await;
    let mut ids = Vec::new();
    for r in dupes {
        assert_eq!(r.status(), 200);
        ids.push(r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    // Another key with the same Idempotency-Key gets its own task.
    let other: Value = create(&gw, "/v1/videos", OTHER_KEY, body.clone(), Some("order-42")).await.json().await.expect("json");
    assert_ne!(other["id"], first["id"]);
    assert_eq!(submits_with_prompt(&tc_calls(&mock).await, "idempotent").len(), 3, "order-42 twice, order-43, other key");
    // The same key with another body: 422, not the first task (nothing charged, nothing sent).
    let before = balance(&gw, CLIENT_KEY).await;
    let changed = json!({"model": "genq3-pro", "prompt": "idempotent, but another prompt"});
    let r = create(&gw, "/v1/videos", CLIENT_KEY, changed, Some("order-42")).await;
    assert_eq!(r.status(), 422);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], "idempotency_key_reused");
    assert_eq!(balance(&gw, CLIENT_KEY).await, before);
    assert!(submits_with_prompt(&tc_calls(&mock).await, "another prompt").is_empty());
    // The same body, however it is spaced and ordered, is still the same request.
    let reordered = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .header("idempotency-key", "order-42")
        .header("content-type", "application/json")
        .body(r#"{ "prompt" : "idempotent",  "model": "genq3-pro" }"#)
        .send()
        .await
        .expect("create");
    assert_eq!(reordered.json::<Value>().await.expect("json")["id"], first["id"]);
}

#[tokio::test]
async fn invalid_requests_are_400_and_reach_nobody() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let cases = [
        (json!({"model": "genq9", "prompt": "invalid-a"}), "unsupported model 'genq9'"),
        (json!({"model": "genq2-pro", "prompt": "invalid-b"}), "text-to-video is not supported"),
        (json!({"model": "genq2", "prompt": "invalid-c", "image": IMG}), "image-to-video is not supported"),
        (json!({"model": "genq3-pro", "prompt": "invalid-d", "duration": 30}), "duration"),
        (json!({"model": "genq3-pro", "prompt": "invalid-e", "image": "data:image/png;base64,AAAA"}), "public https URL"),
        (json!({"model": "genq3-pro", "prompt": "invalid-f", "metadata": {"Prompt": "x"}}), "metadata.Prompt"),
        (json!({"model": "genq3-pro", "prompt": "x".repeat(2001)}), "prompt"),
    ];
    for (body, needle) in cases {
        let r = create(&gw, "/v1/videos", CLIENT_KEY, body.clone(), None).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(needle)), "{needle}: {v}");
    }
    let r = client().post(gw.url("/v1/videos")).bearer_auth(CLIENT_KEY).body("{nope").send().await.expect("req");
    assert_eq!(r.status(), 400);
    assert!(tc_calls(&mock).await.is_empty(), "nothing was submitted");

    // The upstream refuses a submission: 400 with its reason; throttling is retried.
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "p [submit-error]"}), None).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("InvalidParameterValue.Prompt")), "{v}");
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "p [throttle-once]"}), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(submits_with_prompt(&tc_calls(&mock).await, "p [throttle-once]").len(), 2, "one throttled, one retried");
}

/// A submission that may have reached the service (it timed out after it was sent) is not sent
/// again: one paid upstream job at most; the task fails and the charge is refunded.
#[tokio::test]
async fn a_submission_that_timed_out_is_not_sent_again_and_is_refunded() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port).replace("rate_per_sec: 100", "rate_per_sec: 100, timeout_secs: 1"));
    let before = balance(&gw, CLIENT_KEY).await;
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "p [slow-submit]"}), None).await;
    assert_eq!(r.status(), 504);
    let v: Value = r.json().await.expect("json");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("not charged")), "{v}");
    assert_eq!(submits_with_prompt(&tc_calls(&mock).await, "p [slow-submit]").len(), 1, "submitted once, never retried");
    assert_eq!(balance(&gw, CLIENT_KEY).await, before, "the charge was refunded");
}

#[tokio::test]
async fn video_is_404_when_not_configured() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": "p"}), None).await;
    assert_eq!(r.status(), 404);
}

/// Kill the daemon (SIGKILL) while a task runs upstream, start it again: the task completes.
#[tokio::test]
async fn a_task_survives_a_hard_restart() {
    let mock = start_mock();
    let mut gw = start_gateway(&config(mock.port));
    let token = format!("restart-{}", std::process::id());
    let r = create(&gw, "/v1/videos", CLIENT_KEY, json!({"model": "genq3-pro", "prompt": format!("long [hold:{token}]")}), None).await;
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    let running = poll_until(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY, "in_progress").await;
    assert!(running["progress"].as_u64().is_some_and(|p| p > 0 && p < 100), "{running}");

    gw.kill_hard();
    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    gw.start_again();

    let done = poll_until(&gw, &format!("/v1/videos/{id}"), CLIENT_KEY, "completed").await;
    assert!(done["metadata"]["url"].as_str().is_some_and(|u| u.ends_with(".mp4")));
    assert!(done["progress"].as_u64() == Some(100));
}

#[tokio::test]
async fn the_openai_sdks_calls_work_a_form_to_create_a_list_paged_newest_first_and_delete_when_done() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    // Created from a form as the SDK sends it (`seconds` is its name for the duration).
    let mut ids = Vec::new();
    for i in 0..3 {
        let prompt = format!("form video {i}");
        let body = form(&[("model", "genq3-pro"), ("prompt", &prompt), ("seconds", "8"), ("size", "1280x720")], &[]);
        let r =
            client().post(gw.url("/v1/videos")).bearer_auth(CLIENT_KEY).header("content-type", body.0).body(body.1).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let v: Value = r.json().await.unwrap();
        let submit = submits_with_prompt(&tc_calls(&mock).await, &prompt).into_iter().next().cloned().expect("submitted");
        assert_eq!(submit["payload"]["Duration"], 8, "{submit}");
        ids.push(v["id"].as_str().unwrap().to_string());
        // Distinct creation seconds, so that newest-first is observable.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // An uploaded reference needs object storage, which is not configured: refused, named.
    let png = b"\x89PNG\r\n\x1a\nrest-of-an-image".to_vec();
    let body = form(&[("model", "genq3-pro"), ("prompt", "with a reference")], &[("input_reference", "ref.png", "image/png", png)]);
    let r = client().post(gw.url("/v1/videos")).bearer_auth(CLIENT_KEY).header("content-type", body.0).body(body.1).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "input_reference", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("object storage"), "{e}");

    // Listed newest first, two a page, with the SDK's cursor.
    let list = |q: &'static str, key: &'static str| {
        let gw = &gw;
        async move { client().get(gw.url(&format!("/v1/videos{q}"))).bearer_auth(key).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let page = list("?limit=2", CLIENT_KEY).await;
    let got: Vec<&str> = page["data"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[2].as_str(), ids[1].as_str()], "{page}");
    assert_eq!((page["object"].as_str(), page["has_more"].as_bool()), (Some("list"), Some(true)));
    assert_eq!(page["last_id"], ids[1].as_str());
    let next: Value = client()
        .get(gw.url(&format!("/v1/videos?limit=2&after={}", ids[1])))
        .bearer_auth(CLIENT_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let got: Vec<&str> = next["data"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!((got, next["has_more"].as_bool()), (vec![ids[0].as_str()], Some(false)));
    // Oldest first on request; another key sees none of them.
    let asc = list("?order=asc", CLIENT_KEY).await;
    assert_eq!(asc["data"][0]["id"], ids[0].as_str());
    assert_eq!(list("", OTHER_KEY).await["data"].as_array().unwrap().len(), 0);
    let r = client().get(gw.url("/v1/videos?limit=500")).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(r.status(), 400);

    // Deleted once it is done (not before), by its owner only; then gone.
    let del = |id: String, key: &'static str| {
        let gw = &gw;
        async move { client().delete(gw.url(&format!("/v1/videos/{id}"))).bearer_auth(key).send().await.unwrap() }
    };
    let first = ids[0].clone();
    let (status, v) = get_task(&gw, &format!("/v1/videos/{first}"), CLIENT_KEY).await;
    if v["status"] != "completed" {
        assert_eq!(del(first.clone(), CLIENT_KEY).await.status(), 409, "{status} {v}");
    }
    poll_until(&gw, &format!("/v1/videos/{first}"), CLIENT_KEY, "completed").await;
    assert_eq!(del(first.clone(), OTHER_KEY).await.status(), 404);
    let r = del(first.clone(), CLIENT_KEY).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"id": first, "object": "video.deleted", "deleted": true}));
    assert_eq!(get_task(&gw, &format!("/v1/videos/{first}"), CLIENT_KEY).await.0, 404);
    assert_eq!(list("", CLIENT_KEY).await["data"].as_array().unwrap().len(), 2);
}
