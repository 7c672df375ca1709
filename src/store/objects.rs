//! S3-compatible object storage (aws-sdk-s3): streaming uploads (multipart above one part),
//! presigned or public URLs, ranged downloads, listings by prefix, deletes. The bucket is created on first use
//! when it does not exist.

use crate::config::S3Config;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use std::fmt;
use std::time::Duration;

/// Size of one multipart part (S3's minimum is 5 MiB); also the most held in memory.
pub const PART_SIZE: usize = 8 * 1024 * 1024;

#[derive(Debug)]
pub enum StorageError {
    /// The object store failed or could not be reached.
    Backend(String),
    /// The source of an upload failed.
    Source(String),
    NotFound,
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Backend(e) => write!(f, "object storage: {e}"),
            StorageError::Source(e) => write!(f, "upload source: {e}"),
            StorageError::NotFound => write!(f, "object not found"),
        }
    }
}

impl std::error::Error for StorageError {}

fn backend<E: std::error::Error>(e: E) -> StorageError {
    StorageError::Backend(DisplayErrorContext(e).to_string())
}

/// Read from `source` until `part` holds a whole part; true when the source ended.
async fn fill_part<S, E>(source: &mut S, part: &mut BytesMut) -> Result<bool, StorageError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: fmt::Display,
{
    while part.len() < PART_SIZE {
        match source.next().await {
            Some(Ok(chunk)) => part.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(StorageError::Source(e.to_string())),
            None => return Ok(true),
        }
    }
    Ok(false)
}

/// A download from storage.
pub struct Download {
    pub status: u16,
    pub content_type: Option<String>,
    pub content_length: Option<i64>,
    pub content_range: Option<String>,
    pub body: ByteStream,
}

pub struct ObjectStore {
    client: Client,
    bucket: String,
    url_ttl: Duration,
    public_base_url: Option<String>,
}

impl ObjectStore {
    pub fn new(cfg: &S3Config) -> Self {
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(cfg.region.clone()))
            .credentials_provider(Credentials::new(&cfg.access_key, &cfg.secret_key, None, None, "tollgate"))
            .force_path_style(cfg.force_path_style);
        if let Some(endpoint) = &cfg.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        if let Some(pem) = &cfg.ca_pem {
            use aws_smithy_http_client::tls;
            let trust = tls::TrustStore::empty().with_native_roots(true).with_pem_certificate(pem.as_bytes().to_vec());
            match tls::TlsContext::builder().with_trust_store(trust).build() {
                Ok(context) => {
                    let http = aws_smithy_http_client::Builder::new()
                        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
                        .tls_context(context)
                        .build_https();
                    builder = builder.http_client(http);
                }
                Err(e) => log::error!("storage.s3.ca_file: {e}; using the system roots only"),
            }
        }
        ObjectStore {
            client: Client::from_conf(builder.build()),
            bucket: cfg.bucket.clone(),
            url_ttl: Duration::from_secs(cfg.url_ttl_secs),
            public_base_url: cfg.public_base_url.clone(),
        }
    }

    async fn ensure_bucket(&self) -> Result<(), StorageError> {
        if self.client.head_bucket().bucket(&self.bucket).send().await.is_ok() {
            return Ok(());
        }
        match self.client.create_bucket().bucket(&self.bucket).send().await {
            Ok(_) => {
                log::info!("object storage: created bucket {}", self.bucket);
                Ok(())
            }
            Err(e) => {
                let text = DisplayErrorContext(&e).to_string();
                if text.contains("BucketAlreadyOwnedByYou") || text.contains("BucketAlreadyExists") {
                    Ok(())
                } else {
                    Err(StorageError::Backend(text))
                }
            }
        }
    }

    async fn put(&self, key: &str, content_type: &str, body: Bytes) -> Result<(), StorageError> {
        let attempt = |body: Bytes| {
            self.client.put_object().bucket(&self.bucket).key(key).content_type(content_type).body(ByteStream::from(body)).send()
        };
        match attempt(body.clone()).await {
            Ok(_) => Ok(()),
            Err(e) if DisplayErrorContext(&e).to_string().contains("NoSuchBucket") => {
                self.ensure_bucket().await?;
                attempt(body).await.map(|_| ()).map_err(backend)
            }
            Err(e) => Err(backend(e)),
        }
    }

    /// Store small bytes (a decoded input image).
    pub async fn put_bytes(&self, key: &str, content_type: &str, body: Bytes) -> Result<(), StorageError> {
        self.put(key, content_type, body).await
    }

    /// Store a stream without holding more than one part in memory: a single PUT when it ends
    /// within the first part, multipart upload otherwise. Returns the bytes stored.
    pub async fn put_stream<S, E>(&self, key: &str, content_type: &str, mut source: S) -> Result<u64, StorageError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: fmt::Display,
    {
        let mut part = BytesMut::with_capacity(64 * 1024);
        let mut total = 0u64;
        // First part: decide between PUT and multipart.
        if fill_part(&mut source, &mut part).await? {
            total += part.len() as u64;
            self.put(key, content_type, part.freeze()).await?;
            return Ok(total);
        }
        let upload = match self.client.create_multipart_upload().bucket(&self.bucket).key(key).content_type(content_type).send().await {
            Ok(u) => u,
            Err(e) if DisplayErrorContext(&e).to_string().contains("NoSuchBucket") => {
                self.ensure_bucket().await?;
                self.client
                    .create_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .content_type(content_type)
                    .send()
                    .await
                    .map_err(backend)?
            }
            Err(e) => return Err(backend(e)),
        };
        let upload_id = upload.upload_id().unwrap_or_default().to_string();
        let result = self.upload_parts(key, &upload_id, part, &mut source, &mut total).await;
        match result {
            Ok(parts) => {
                self.client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
                    .send()
                    .await
                    .map_err(backend)?;
                Ok(total)
            }
            Err(e) => {
                let _ = self.client.abort_multipart_upload().bucket(&self.bucket).key(key).upload_id(&upload_id).send().await;
                Err(e)
            }
        }
    }

    async fn upload_parts<S, E>(
        &self,
        key: &str,
        upload_id: &str,
        first: BytesMut,
        source: &mut S,
        total: &mut u64,
    ) -> Result<Vec<CompletedPart>, StorageError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: fmt::Display,
    {
        let mut parts = Vec::new();
        let mut part = first;
        let mut number = 1;
        loop {
            let ended = fill_part(source, &mut part).await?;
            if !part.is_empty() {
                *total += part.len() as u64;
                let body = std::mem::replace(&mut part, BytesMut::with_capacity(64 * 1024)).freeze();
                let out = self
                    .client
                    .upload_part()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .part_number(number)
                    .body(ByteStream::from(body))
                    .send()
                    .await
                    .map_err(backend)?;
                parts.push(CompletedPart::builder().part_number(number).set_e_tag(out.e_tag().map(str::to_string)).build());
                number += 1;
            }
            if ended {
                return Ok(parts);
            }
        }
    }

    /// A URL a client (or the video service) can fetch the object from.
    pub async fn url(&self, key: &str) -> Result<String, StorageError> {
        if let Some(base) = &self.public_base_url {
            return Ok(format!("{base}/{key}"));
        }
        let cfg = PresigningConfig::expires_in(self.url_ttl).map_err(backend)?;
        let req = self.client.get_object().bucket(&self.bucket).key(key).presigned(cfg).await.map_err(backend)?;
        Ok(req.uri().to_string())
    }

    /// Fetch an object, optionally a byte range (`bytes=a-b`).
    pub async fn get(&self, key: &str, range: Option<&str>) -> Result<Download, StorageError> {
        let mut req = self.client.get_object().bucket(&self.bucket).key(key);
        if let Some(r) = range {
            req = req.range(r);
        }
        let out = req.send().await.map_err(|e| {
            let text = DisplayErrorContext(&e).to_string();
            if text.contains("NoSuchKey") || text.contains("NoSuchBucket") {
                StorageError::NotFound
            } else {
                StorageError::Backend(text)
            }
        })?;
        Ok(Download {
            status: if out.content_range().is_some() { 206 } else { 200 },
            content_type: out.content_type().map(str::to_string),
            content_length: out.content_length(),
            content_range: out.content_range().map(str::to_string),
            body: out.body,
        })
    }

    /// The keys of every object under `prefix` (none when the bucket does not exist yet).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.client.list_objects_v2().bucket(&self.bucket).prefix(prefix).set_continuation_token(token.take()).send().await;
            let page = match page {
                Ok(page) => page,
                Err(e) if DisplayErrorContext(&e).to_string().contains("NoSuchBucket") => return Ok(keys),
                Err(e) => return Err(backend(e)),
            };
            keys.extend(page.contents().iter().filter_map(|o| o.key().map(str::to_string)));
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_string()),
                _ => return Ok(keys),
            }
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.client.delete_object().bucket(&self.bucket).key(key).send().await.map(|_| ()).map_err(backend)
    }
}
