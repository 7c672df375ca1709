//! `/v1/files` on one node without object storage (the data directory): uploaded as a form,
//! listed newest first, read, streamed, deleted; another key's file unreachable; bad forms
//! refused naming the field. With object storage it is `tests/sdk/test_media.py`'s.

use crate::common::*;
use serde_json::Value;

const OTHER_KEY: &str = "sk-client-files-other-1";

async fn upload(gw: &Gateway, key: &str, purpose: &str, name: &str, bytes: Vec<u8>) -> reqwest::Response {
    let (ct, body) = form(&[("purpose", purpose)], &[("file", name, "application/jsonl", bytes)]);
    client().post(gw.url("/v1/files")).bearer_auth(key).header("content-type", ct).body(body).send().await.unwrap()
}

async fn get(gw: &Gateway, key: &str, path: &str) -> reqwest::Response {
    client().get(gw.url(path)).bearer_auth(key).send().await.unwrap()
}

#[tokio::test]
async fn a_keys_files_are_stored_listed_read_and_deleted_and_no_other_key_sees_them() {
    let mock = start_mock();
    let gw = start_gateway(&with_key(
        &standard_config(mock.port),
        &format!("{{ key: {OTHER_KEY}, name: other, group: default, balance: 1.0 }}"),
    ));
    let lines: Vec<u8> = (0..2000)
        .flat_map(|i| {
            format!("{{\"custom_id\":\"r{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{{}}}}\n").into_bytes()
        })
        .collect();
    let r = upload(&gw, CLIENT_KEY, "batch", "input.jsonl", lines.clone()).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let first: Value = r.json().await.unwrap();
    assert_eq!(
        (first["object"].as_str(), first["purpose"].as_str(), first["filename"].as_str()),
        (Some("file"), Some("batch"), Some("input.jsonl"))
    );
    assert_eq!(first["bytes"].as_u64(), Some(lines.len() as u64));
    let id = first["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("file-"));
    let second: Value = upload(&gw, CLIENT_KEY, "user_data", "b.txt", b"hello".to_vec()).await.json().await.unwrap();
    // Listed (newest first), read, streamed back byte for byte.
    let list: Value = get(&gw, CLIENT_KEY, "/v1/files").await.json().await.unwrap();
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&id.as_str()) && ids.contains(&second["id"].as_str().unwrap()));
    let page: Value = get(&gw, CLIENT_KEY, "/v1/files?limit=1").await.json().await.unwrap();
    assert_eq!((page["data"].as_array().unwrap().len(), page["has_more"].as_bool()), (1, Some(true)));
    assert_eq!(get(&gw, CLIENT_KEY, &format!("/v1/files/{id}")).await.json::<Value>().await.unwrap(), first);
    let content = get(&gw, CLIENT_KEY, &format!("/v1/files/{id}/content")).await;
    assert_eq!(content.status(), 200);
    assert_eq!(content.bytes().await.unwrap().to_vec(), lines);
    // Another key: as if there were none.
    assert_eq!(get(&gw, OTHER_KEY, &format!("/v1/files/{id}")).await.status(), 404);
    assert_eq!(get(&gw, OTHER_KEY, &format!("/v1/files/{id}/content")).await.status(), 404);
    assert_eq!(get(&gw, OTHER_KEY, "/v1/files").await.json::<Value>().await.unwrap()["data"].as_array().unwrap().len(), 0);
    let r = client().delete(gw.url(&format!("/v1/files/{id}"))).bearer_auth(OTHER_KEY).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // A path that is not an id reaches nothing.
    assert_eq!(get(&gw, CLIENT_KEY, "/v1/files/..%2F..%2Fkeys").await.status(), 404);
    // Deleted by its key: gone.
    let r = client().delete(gw.url(&format!("/v1/files/{id}"))).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["deleted"], true);
    assert_eq!(get(&gw, CLIENT_KEY, &format!("/v1/files/{id}")).await.status(), 404);
    // Refusals name the field.
    let r = upload(&gw, CLIENT_KEY, "fine-tune", "x.jsonl", b"{}".to_vec()).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "purpose");
    let (ct, body) = form(&[("purpose", "batch")], &[]);
    let r = client().post(gw.url("/v1/files")).bearer_auth(CLIENT_KEY).header("content-type", ct).body(body).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "file");
}
