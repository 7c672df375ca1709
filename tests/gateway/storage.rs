//! Object storage against a real S3-compatible server (moto's server, started by each test):
//! results copied to the bucket (multipart for a large one), base64 inputs turned into URLs
//! that serve the same image, and a storage outage that leaves the upstream URL in place until
//! the background copy succeeds.

use crate::common::mock_video::{mock_video_bytes, mock_video_of, MOCK_BIG_VIDEO_LEN};
use crate::common::*;
use base64::Engine;
use serde_json::{json, Value};

const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89tollgate-test-image";

fn config(mock_port: u16, s3_port: u16) -> String {
    format!("{}{}{}", standard_config(mock_port), video_section(mock_port), storage_section(s3_port))
}

async fn create(gw: &Gateway, body: Value) -> Value {
    let r = client().post(gw.url("/v1/videos")).bearer_auth(CLIENT_KEY).json(&body).send().await.expect("create");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

async fn fetch(url: &str) -> (u16, Vec<u8>) {
    let r = client().get(url).send().await.expect("fetch");
    let status = r.status().as_u16();
    (status, r.bytes().await.expect("bytes").to_vec())
}

#[tokio::test]
async fn completed_results_are_served_from_our_storage() {
    let mock = start_mock();
    let s3 = start_s3_on(free_port());
    let gw = start_gateway(&config(mock.port, s3.port));
    for (prompt, expected) in [("small", mock_video_bytes()), ("large [big]", mock_video_of(MOCK_BIG_VIDEO_LEN))] {
        let id = create(&gw, json!({"model": "genq3-pro", "prompt": prompt})).await["id"].as_str().expect("id").to_string();
        let done = poll_task(&gw, CLIENT_KEY, &id, |v| v["status"] == "completed").await;
        let url = done["metadata"]["url"].as_str().expect("url");
        assert!(
            url.starts_with(&format!("http://127.0.0.1:{}/tollgate-test/videos/{id}.mp4?", s3.port)),
            "a presigned URL of our bucket: {url}"
        );
        assert!(!url.contains("__mock"), "{url}");
        let (status, bytes) = fetch(url).await;
        assert_eq!(status, 200);
        assert!(bytes == expected, "{prompt}: the stored object is the upstream video ({} vs {} bytes)", bytes.len(), expected.len());
        // The content endpoint serves from storage too, ranges included.
        let r = client().get(gw.url(&format!("/v1/videos/{id}/content"))).bearer_auth(CLIENT_KEY).send().await.expect("content");
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.expect("bytes").as_ref() == expected.as_slice());
        let r = client()
            .get(gw.url(&format!("/v1/videos/{id}/content")))
            .bearer_auth(CLIENT_KEY)
            .header("range", "bytes=10-19")
            .send()
            .await
            .expect("range");
        assert_eq!(r.status(), 206);
        assert_eq!(r.bytes().await.expect("bytes").as_ref(), &expected[10..20]);
    }
    // The upstream URL is no longer needed: the mock's copy is never fetched by the client.
    drop(mock);
}

#[tokio::test]
async fn base64_inputs_reach_the_upstream_as_urls_serving_the_same_image() {
    let mock = start_mock();
    let s3 = start_s3_on(free_port());
    let gw = start_gateway(&config(mock.port, s3.port));
    let b64 = base64::engine::general_purpose::STANDARD.encode(PNG);
    let created =
        create(&gw, json!({"model": "genq3-pro", "prompt": "from base64", "image": format!("data:image/png;base64,{b64}")})).await;
    let id = created["id"].as_str().expect("id").to_string();
    let calls: Vec<Value> = client().get(mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json");
    let submit = calls.iter().find(|c| c["payload"]["Prompt"] == "from base64").expect("submitted");
    let url = submit["payload"]["Images"][0].as_str().expect("a URL, not base64").to_string();
    assert!(url.starts_with(&format!("http://127.0.0.1:{}/tollgate-test/tmp/{id}/", s3.port)), "{url}");
    let (status, bytes) = fetch(&url).await;
    assert_eq!(status, 200);
    assert_eq!(bytes, PNG, "the URL serves the same image");
    // Once the task ends the temporary object is deleted.
    poll_task(&gw, CLIENT_KEY, &id, |v| v["status"] == "completed").await;
    let (status, _) = fetch(&url).await;
    assert_eq!(status, 404, "temporary input deleted");

    // Bad base64, or base64 that is not an image: 400 naming the field.
    for (body, field) in [
        (json!({"model": "genq3-pro", "image": "%%%"}), "image"),
        (json!({"model": "genq3-pro", "images": [base64::engine::general_purpose::STANDARD.encode(b"GIF89a....")]}), "images[0]"),
    ] {
        let r = client().post(gw.url("/v1/videos")).bearer_auth(CLIENT_KEY).json(&body).send().await.expect("req");
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.expect("json");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.starts_with(&format!("{field}:"))), "{v}");
    }
}

#[tokio::test]
async fn an_uploaded_input_reference_reaches_the_upstream_as_a_url_serving_the_same_image() {
    let mock = start_mock();
    let s3 = start_s3_on(free_port());
    let gw = start_gateway(&config(mock.port, s3.port));
    let body = form(
        &[("model", "genq3-pro"), ("prompt", "from a form"), ("seconds", "5")],
        &[("input_reference", "ref.png", "image/png", PNG.to_vec())],
    );
    let r = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .header("content-type", body.0)
        .body(body.1)
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200, "{}", r.text().await.expect("text"));
    let calls: Vec<Value> = client().get(mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json");
    let submit = calls.iter().find(|c| c["payload"]["Prompt"] == "from a form").expect("submitted");
    assert_eq!(submit["action"], "SubmitReferenceToVideoGenJob", "{submit}");
    let url = submit["payload"].to_string();
    let url =
        url.split('"').find(|s| s.starts_with(&format!("http://127.0.0.1:{}/tollgate-test/tmp/", s3.port))).expect("a URL").to_string();
    let (status, bytes) = fetch(&url).await;
    assert_eq!((status, bytes.as_slice()), (200, PNG), "the URL serves the uploaded image");
}

#[tokio::test]
async fn with_storage_down_the_task_completes_with_the_upstream_url_then_switches() {
    let mock = start_mock();
    let s3_port = free_port();
    let gw = start_gateway(&config(mock.port, s3_port));
    let id = create(&gw, json!({"model": "genq3-pro", "prompt": "storage down"})).await["id"].as_str().expect("id").to_string();
    let done = poll_task(&gw, CLIENT_KEY, &id, |v| v["status"] == "completed").await;
    let upstream_url = done["metadata"]["url"].as_str().expect("url").to_string();
    assert!(upstream_url.contains("/__mock/video/"), "the upstream URL while storage is down: {upstream_url}");
    let (status, bytes) = fetch(&upstream_url).await;
    assert_eq!((status, bytes == mock_video_bytes()), (200, true));

    // Storage comes back: the background copy succeeds and the URL switches.
    let s3 = start_s3_on(s3_port);
    let switched = poll_task(&gw, CLIENT_KEY, &id, |v| v["metadata"]["url"].as_str().is_some_and(|u| u.contains("/tollgate-test/"))).await;
    let url = switched["metadata"]["url"].as_str().expect("url");
    let (status, bytes) = fetch(url).await;
    assert_eq!(status, 200);
    assert!(bytes == mock_video_bytes());
    drop(s3);
}
