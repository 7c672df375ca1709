//! `/v1/files`: files a key uploads (`purpose: batch`, the input of a batch), owned by that key
//! alone, like its stored responses and video tasks — another key's file is the same 404 as no
//! file. Kept where video results go: object storage when `storage.s3` is configured (under
//! `files/<key id>/`), else the data directory (`data_dir/files/<key id>/`); each file beside its
//! description (`<id>.json`). A fleet without object storage has no shared place for them:
//! there the endpoints answer 404 saying so (and `-t` says it too).
//!
//! A key keeps at most `limits.file_quota_bytes` of files (413 past it), and each file lives
//! until its expiry: `expires_after` as the API takes it (`anchor: created_at`, 1 hour to 30
//! days), else [`DEFAULT_LIFETIME_SECS`]. An expired file is gone (404) and its bytes are
//! removed when the key's files are next listed or counted.

use crate::base::clock::now_unix;
use crate::protocol::multipart::Form;
use crate::protocol::{ApiError, ErrorKind};
use crate::store::objects::{ObjectStore, StorageError};
use bytes::Bytes;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

/// The purposes a file may be uploaded for.
pub const PURPOSES: [&str; 2] = ["batch", "user_data"];

/// How long a file lives when its upload names no `expires_after` (30 days).
pub const DEFAULT_LIFETIME_SECS: u64 = 30 * 86_400;

/// The shortest and longest `expires_after[seconds]` (the API's bounds).
const LIFETIME_SECS: std::ops::RangeInclusive<u64> = 3600..=30 * 86_400;

/// A file as the API describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    pub purpose: String,
    pub status: String,
    /// When it is gone (unix seconds); None for files kept before lifetimes (they live on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl FileObject {
    fn expired(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

/// Where files are kept.
enum Backend {
    Dir(PathBuf),
    Objects(Arc<ObjectStore>),
    /// A fleet without object storage: no place every node shares.
    None,
}

pub struct FileService {
    backend: Backend,
    /// The bytes of files one key may keep.
    quota: u64,
}

/// A file's bytes on their way to the client.
pub type Content = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    log::error!("files: {what}: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error while storing the file.")
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("No such file: '{id}'.")).with_param("file_id")
}

/// An id or a key id as a path component: letters, digits, `-` and `_` only.
fn safe(part: &str) -> bool {
    !part.is_empty() && part.len() <= 128 && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl FileService {
    /// Files in `data_dir/files`, or in object storage when there is one; `shared`: a node of a
    /// fleet (which needs object storage).
    pub fn new(data_dir: &std::path::Path, objects: Option<Arc<ObjectStore>>, shared: bool) -> FileService {
        let backend = match (objects, shared) {
            (Some(o), _) => Backend::Objects(o),
            (None, false) => Backend::Dir(data_dir.join("files")),
            (None, true) => Backend::None,
        };
        FileService { backend, quota: crate::config::listen::DEFAULT_FILE_QUOTA_BYTES }
    }

    /// The same, with `quota` bytes of files a key may keep.
    pub fn with_quota(mut self, quota: u64) -> FileService {
        self.quota = quota;
        self
    }

    fn dir(&self, key_id: &str) -> Option<PathBuf> {
        match &self.backend {
            Backend::Dir(root) => Some(root.join(key_id)),
            _ => None,
        }
    }

    fn unavailable() -> ApiError {
        ApiError::new(ErrorKind::NotFound, "Files need object storage (storage.s3) on a gateway of several nodes; none is configured.")
    }

    /// Store the form's `file` for `purpose`; its description.
    pub async fn create(&self, key_id: &str, form: &Form) -> Result<FileObject, ApiError> {
        if !safe(key_id) {
            return Err(internal("key id", key_id));
        }
        let purpose = form
            .field("purpose")
            .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'purpose' field is required.").with_param("purpose"))?;
        if !PURPOSES.contains(&purpose) {
            return Err(
                ApiError::new(ErrorKind::BadRequest, format!("'purpose' must be one of {}.", PURPOSES.join(", "))).with_param("purpose")
            );
        }
        let part = form
            .files
            .iter()
            .find(|f| f.name == "file")
            .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'file' part is required.").with_param("file"))?;
        let lifetime = match (form.field("expires_after[anchor]"), form.field("expires_after[seconds]")) {
            (None, None) => DEFAULT_LIFETIME_SECS,
            (Some("created_at"), Some(secs)) => secs.trim().parse::<u64>().ok().filter(|s| LIFETIME_SECS.contains(s)).ok_or_else(|| {
                ApiError::new(ErrorKind::BadRequest, "'expires_after[seconds]' must be between 3600 and 2592000.")
                    .with_param("expires_after[seconds]")
            })?,
            (Some(_), Some(_)) => {
                return Err(ApiError::new(ErrorKind::BadRequest, "'expires_after[anchor]' must be \"created_at\".")
                    .with_param("expires_after[anchor]"))
            }
            _ => {
                return Err(
                    ApiError::new(ErrorKind::BadRequest, "'expires_after' takes both 'anchor' and 'seconds'.").with_param("expires_after")
                )
            }
        };
        self.store_for(key_id, part.filename.as_deref().unwrap_or("file"), purpose, (part.spool.clone(), part.len), lifetime).await
    }

    /// The bytes of the key's files that have not expired (expired ones are removed on the way).
    pub async fn used(&self, key_id: &str) -> Result<u64, ApiError> {
        let (files, _) = self.list(key_id, None, usize::MAX).await?;
        Ok(files.iter().map(|f| f.bytes).sum())
    }

    /// Keep `len` bytes of `spool` as a file of `key_id` for `purpose` (a batch's output), for
    /// the default lifetime; its description.
    pub async fn store(
        &self,
        key_id: &str,
        filename: &str,
        purpose: &str,
        spool: Arc<std::fs::File>,
        len: u64,
    ) -> Result<FileObject, ApiError> {
        self.store_for(key_id, filename, purpose, (spool, len), DEFAULT_LIFETIME_SECS).await
    }

    /// Keep a file for `lifetime` seconds, within the key's quota; its description.
    async fn store_for(
        &self,
        key_id: &str,
        filename: &str,
        purpose: &str,
        (spool, len): (Arc<std::fs::File>, u64),
        lifetime: u64,
    ) -> Result<FileObject, ApiError> {
        if !safe(key_id) {
            return Err(internal("key id", key_id));
        }
        let used = self.used(key_id).await?;
        if used.saturating_add(len) > self.quota {
            return Err(ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "This key keeps {used} bytes of files; {len} more would pass its quota of {} bytes. Delete files first.",
                    self.quota
                ),
            )
            .with_param("file"));
        }
        let created_at = now_unix();
        let file = FileObject {
            id: format!("file-{}", crate::base::secrets::random_base62(24)),
            object: "file".into(),
            bytes: len,
            filename: filename.chars().filter(|c| !c.is_control()).take(255).collect(),
            purpose: purpose.to_string(),
            status: "processed".into(),
            created_at,
            expires_at: Some(created_at.saturating_add(lifetime)),
        };
        let description = serde_json::to_vec(&file).map_err(|e| internal("description", e))?;
        let bytes = crate::base::spool::chunks(spool, len, 256 << 10);
        match &self.backend {
            Backend::Dir(_) => {
                let dir = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?;
                write_file(&dir, &file.id, bytes, &description).await.map_err(|e| internal("write", e))?;
            }
            Backend::Objects(store) => {
                let key = format!("files/{key_id}/{}", file.id);
                store.put_stream(&key, "application/octet-stream", bytes).await.map_err(|e| internal("upload", e))?;
                store
                    .put_bytes(&format!("{key}.json"), "application/json", Bytes::from(description))
                    .await
                    .map_err(|e| internal("upload", e))?;
            }
            Backend::None => return Err(Self::unavailable()),
        }
        Ok(file)
    }

    /// The key's file `id`.
    pub async fn get(&self, key_id: &str, id: &str) -> Result<FileObject, ApiError> {
        if !safe(id) || !safe(key_id) {
            return Err(not_found(id));
        }
        let text = match &self.backend {
            Backend::Dir(_) => {
                let path = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?.join(format!("{id}.json"));
                match tokio::fs::read(&path).await {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(id)),
                    Err(e) => return Err(internal("read", e)),
                }
            }
            Backend::Objects(store) => read_object(store, &format!("files/{key_id}/{id}.json")).await?.ok_or_else(|| not_found(id))?,
            Backend::None => return Err(Self::unavailable()),
        };
        let file: FileObject = serde_json::from_slice(&text).map_err(|e| internal("description", e))?;
        if file.expired(now_unix()) {
            self.remove(key_id, id).await?;
            return Err(not_found(id));
        }
        Ok(file)
    }

    /// The key's files, newest first, after the file `after`, at most `limit`; whether more follow.
    pub async fn list(&self, key_id: &str, after: Option<&str>, limit: usize) -> Result<(Vec<FileObject>, bool), ApiError> {
        if !safe(key_id) {
            return Ok((Vec::new(), false));
        }
        let mut all = Vec::new();
        match &self.backend {
            Backend::Dir(_) => {
                let dir = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?;
                let mut entries = match tokio::fs::read_dir(&dir).await {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
                    Err(e) => return Err(internal("list", e)),
                };
                while let Some(entry) = entries.next_entry().await.map_err(|e| internal("list", e))? {
                    if entry.file_name().to_string_lossy().ends_with(".json") {
                        if let Ok(text) = tokio::fs::read(entry.path()).await {
                            all.extend(serde_json::from_slice::<FileObject>(&text).ok());
                        }
                    }
                }
            }
            Backend::Objects(store) => {
                let keys = store.list(&format!("files/{key_id}/")).await.map_err(|e| internal("list", e))?;
                for key in keys.iter().filter(|k| k.ends_with(".json")) {
                    if let Some(text) = read_object(store, key).await? {
                        all.extend(serde_json::from_slice::<FileObject>(&text).ok());
                    }
                }
            }
            Backend::None => return Err(Self::unavailable()),
        }
        let now = now_unix();
        for gone in all.iter().filter(|f| f.expired(now)) {
            self.remove(key_id, &gone.id).await?;
        }
        all.retain(|f| !f.expired(now));
        all.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        if let Some(after) = after {
            match all.iter().position(|f| f.id == after) {
                Some(at) => {
                    all.drain(..=at);
                }
                None => all.clear(),
            }
        }
        let more = all.len() > limit;
        all.truncate(limit);
        Ok((all, more))
    }

    /// The key's file `id` and its bytes.
    pub async fn content(&self, key_id: &str, id: &str) -> Result<(FileObject, Content), ApiError> {
        let file = self.get(key_id, id).await?;
        let content: Content = match &self.backend {
            Backend::Dir(_) => {
                let path = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?.join(id);
                let f = tokio::fs::File::open(&path).await.map_err(|e| internal("read", e))?;
                Box::pin(futures_util::stream::unfold(f, |mut f| async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0; 64 << 10];
                    match f.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(Bytes::from(buf)), f))
                        }
                        Err(e) => Some((Err(e.to_string()), f)),
                    }
                }))
            }
            Backend::Objects(store) => {
                let download = store.get(&format!("files/{key_id}/{id}"), None).await.map_err(|e| match e {
                    StorageError::NotFound => not_found(id),
                    other => internal("read", other),
                })?;
                Box::pin(futures_util::stream::unfold(download.body, |mut body| async move {
                    body.next().await.map(|r| (r.map_err(|e| e.to_string()), body))
                }))
            }
            Backend::None => return Err(Self::unavailable()),
        };
        Ok((file, content))
    }

    /// The key's file `id` as a file to read at offsets, and its length: the stored file itself
    /// in the data directory; from object storage, a temporary copy made as it downloads (never
    /// whole in memory).
    pub async fn open(&self, key_id: &str, id: &str) -> Result<(FileObject, Arc<std::fs::File>, u64), ApiError> {
        let file = self.get(key_id, id).await?;
        if let Backend::Dir(_) = &self.backend {
            let path = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?.join(id);
            let f = std::fs::File::open(&path).map_err(|e| internal("read", e))?;
            let len = file.bytes;
            return Ok((file, Arc::new(f), len));
        }
        let (_, mut content) = self.content(key_id, id).await?;
        let spool = tempfile::tempfile().map_err(|e| internal("spool", e))?;
        let mut writer = tokio::io::BufWriter::new(tokio::fs::File::from_std(spool.try_clone().map_err(|e| internal("spool", e))?));
        let mut len = 0u64;
        while let Some(chunk) = futures_util::StreamExt::next(&mut content).await {
            let chunk = chunk.map_err(|e| internal("read", e))?;
            len += chunk.len() as u64;
            tokio::io::AsyncWriteExt::write_all(&mut writer, &chunk).await.map_err(|e| internal("spool", e))?;
        }
        tokio::io::AsyncWriteExt::flush(&mut writer).await.map_err(|e| internal("spool", e))?;
        Ok((file, Arc::new(spool), len))
    }

    /// Delete the key's file `id`.
    pub async fn delete(&self, key_id: &str, id: &str) -> Result<(), ApiError> {
        self.get(key_id, id).await?;
        self.remove(key_id, id).await
    }

    /// Remove the file `id` of `key_id`: its description, then its bytes.
    async fn remove(&self, key_id: &str, id: &str) -> Result<(), ApiError> {
        match &self.backend {
            Backend::Dir(_) => {
                let dir = self.dir(key_id).ok_or_else(|| internal("dir", "none"))?;
                tokio::fs::remove_file(dir.join(format!("{id}.json"))).await.map_err(|e| internal("delete", e))?;
                if let Err(e) = tokio::fs::remove_file(dir.join(id)).await {
                    log::warn!("files: {id}: its description is gone but its bytes remain: {e}");
                }
            }
            Backend::Objects(store) => {
                let key = format!("files/{key_id}/{id}");
                store.delete(&format!("{key}.json")).await.map_err(|e| internal("delete", e))?;
                if let Err(e) = store.delete(&key).await {
                    log::warn!("files: {id}: its description is gone but its bytes remain: {e}");
                }
            }
            Backend::None => return Err(Self::unavailable()),
        }
        Ok(())
    }
}

/// A file's bytes and, once they are on disk, its description, in `dir`.
async fn write_file(
    dir: &std::path::Path,
    id: &str,
    mut bytes: impl Stream<Item = std::io::Result<Bytes>> + Unpin,
    description: &[u8],
) -> std::io::Result<()> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    tokio::fs::create_dir_all(dir).await?;
    let mut out = tokio::fs::File::create(dir.join(id)).await?;
    while let Some(chunk) = bytes.next().await {
        out.write_all(&chunk?).await?;
    }
    out.sync_all().await?;
    tokio::fs::write(dir.join(format!("{id}.json")), description).await
}

/// A small object whole (a file's description); None when there is none.
async fn read_object(store: &ObjectStore, key: &str) -> Result<Option<Vec<u8>>, ApiError> {
    let download = match store.get(key, None).await {
        Ok(d) => d,
        Err(StorageError::NotFound) => return Ok(None),
        Err(e) => return Err(internal("read", e)),
    };
    let bytes = download.body.collect().await.map_err(|e| internal("read", e))?;
    Ok(Some(bytes.into_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_expired_file_is_gone_and_its_bytes_removed() {
        let dir = tempfile::tempdir().unwrap();
        let files = FileService::new(dir.path(), None, false).with_quota(1000);
        let spool = |n: usize| {
            use std::io::Write;
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&vec![b'x'; n]).unwrap();
            Arc::new(f)
        };
        let kept = files.store("key_a", "a", "batch", spool(600), 600).await.unwrap();
        assert_eq!(files.used("key_a").await.unwrap(), 600);
        assert!(files.store("key_a", "b", "batch", spool(500), 500).await.is_err(), "past the quota");
        // Its lifetime ends: it is gone, and its bytes with it.
        let path = dir.path().join("files/key_a").join(format!("{}.json", kept.id));
        let expired = FileObject { expires_at: Some(1), ..kept.clone() };
        std::fs::write(&path, serde_json::to_vec(&expired).unwrap()).unwrap();
        assert_eq!(files.get("key_a", &kept.id).await.unwrap_err().status(), 404);
        assert!(!dir.path().join("files/key_a").join(&kept.id).exists(), "its bytes were removed");
        assert_eq!(files.used("key_a").await.unwrap(), 0);
        assert!(files.store("key_a", "b", "batch", spool(500), 500).await.is_ok());
    }
}
