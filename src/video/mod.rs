//! Asynchronous video-generation tasks (video spec): validation and capability routing
//! ([`request`]), the pure state machine ([`crate::records::task`]), the TC3 signer ([`tc3`]) and client
//! ([`upstream`]), sled persistence ([`store`]); this module ties them into the service the
//! HTTP layer calls, the background poller and crash recovery.

pub mod http;
pub mod request;
pub mod store;
pub mod tc3;
pub mod upstream;

use crate::base::clock::now_unix;
use crate::charge::{Books, Payer, Used};
use crate::checks::{Checks, Kind, Subject, Text};
use crate::config::VideoConfig;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::records::task::{Event, Status, Task, TaskError};
use crate::store::objects::ObjectStore;
use crate::store::StoreError;
use async_trait::async_trait;
use futures_util::StreamExt;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::VideoStore;
use upstream::{UpstreamError, VideoUpstream};

/// Off-peak tasks may take up to 48 hours (the video API's overview and limits).
pub const OFF_PEAK_LIMIT_SECS: u64 = 48 * 3600;
/// The upstream result URL is valid for 24 hours (the video API's service's overview).
pub const RESULT_URL_TTL_SECS: u64 = 24 * 3600;

/// `task_` + 28 random base62 characters (~166 bits).
pub fn new_task_id() -> String {
    format!("task_{}", crate::base::secrets::random_base62(28))
}

fn internal(e: StoreError) -> ApiError {
    log::error!("video store: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error while storing the task.")
}

pub struct VideoService {
    cfg: VideoConfig,
    store: VideoStore,
    books: Books,
    /// The checks every video task goes through.
    checks: Arc<Checks>,
    /// Object storage for results and base64 inputs, when configured.
    storage: Option<Arc<ObjectStore>>,
    upstream: VideoUpstream,
    /// Per-task locks: concurrent refreshes of one task coalesce into one describe.
    refreshing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// For downloading result videos.
    pub(crate) download: reqwest::Client,
    completed: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    /// Tasks this process is submitting now. In a fleet, a task found in `submitting` that is
    /// not one of these was left so by a node that died (or stalled past its claim) during the
    /// submission: it is failed and refunded, never submitted a second time.
    creating: crate::base::marks::Marks,
}

impl VideoService {
    pub fn new(
        cfg: VideoConfig,
        store: VideoStore,
        books: Books,
        checks: Arc<Checks>,
        storage: Option<Arc<ObjectStore>>,
    ) -> Result<Self, String> {
        let upstream = VideoUpstream::new(cfg.clone())?;
        let download = crate::base::outbound::Outbound {
            connect: Some(Duration::from_secs(10)),
            read: Some(Duration::from_secs(60)),
            ..Default::default()
        }
        .client()
        .map_err(|e| format!("video download client: {e}"))?;
        Ok(VideoService {
            cfg,
            store,
            books,
            checks,
            storage,
            upstream,
            refreshing: Mutex::new(HashMap::new()),
            download,
            completed: Default::default(),
            failed: Default::default(),
            creating: Default::default(),
        })
    }

    /// Price of a task in nano-USD: `video.prices[model]` USD per second × duration. None for
    /// an unpriced model (configuration validation refuses those; billing fails closed).
    pub fn price_nanos(&self, api_model: &str, duration: u32) -> Option<i64> {
        let per_second = self.cfg.prices.get(api_model).copied()?;
        Some(crate::base::money::usd_to_nanos(per_second * f64::from(duration)))
    }

    /// Who pays for a task: its owner, under its model and `route` (`video`, `video_refund`).
    fn payer<'a>(task: &'a Task, route: &'a str) -> Payer<'a> {
        let rate = task.price_multiplier.unwrap_or_default();
        Payer { key_id: &task.owner, tags: &task.tags, model: &task.api_model, protocol: "video", route, rate }
    }

    /// A task's price (a refund: negative, of the price charged), to the purses it was charged.
    fn used(task: &Task, cost_nanos: i64) -> Used {
        let prior_list_nanos = if cost_nanos < 0 { task.cost_nanos } else { 0 };
        Used { attempts: 0, charged: task.charged_to.clone(), prior_list_nanos, ..Used::cost(cost_nanos) }
    }

    /// Give the price of a failed task back, once. Returns the task to store.
    async fn refund_if_failed(&self, mut task: Task) -> Result<Task, StoreError> {
        if task.status == Status::Failed && task.charged && !task.refunded && task.cost_nanos > 0 {
            self.books.adjust(&Self::payer(&task, "video_refund"), Self::used(&task, -task.cost_nanos)).await?;
            task.refunded = true;
        }
        Ok(task)
    }

    /// Everything that follows a task's end: refund a failure, copy a result to object storage
    /// (or schedule the copy), delete uploaded inputs.
    async fn settle_terminal(&self, task: Task) -> Result<Task, StoreError> {
        let mut task = self.refund_if_failed(task).await?;
        if !task.status.is_terminal() {
            return Ok(task);
        }
        let counter = if task.status == Status::Completed { &self.completed } else { &self.failed };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match task.status {
            Status::Completed => log::info!(
                "video: task {} of key {} completed: model={} seconds={} charged_usd={:.9}",
                task.id,
                task.owner,
                task.api_model,
                task.duration,
                crate::base::money::usd(task.cost_nanos)
            ),
            _ => log::info!(
                "video: task {} of key {} failed ({}): model={} seconds={} refunded_usd={:.9}",
                task.id,
                task.owner,
                task.error.as_ref().map_or("no reason given", |e| e.message.as_str()),
                task.api_model,
                task.duration,
                crate::base::money::usd(if task.refunded { task.cost_nanos } else { 0 })
            ),
        }
        if task.status == Status::Completed && task.storage_key.is_none() && !task.copy_pending && self.storage.is_some() {
            match self.copy_result(&task).await {
                Ok((key, url)) => {
                    task.storage_key = Some(key);
                    task.url = Some(url);
                }
                Err(e) => {
                    log::warn!("video task {}: copy to object storage failed, serving the upstream URL for now: {e}", task.id);
                    task.copy_pending = true;
                    task.copy_attempts = 1;
                    task.next_copy_at = now_unix() + self.copy_backoff(1);
                }
            }
        }
        if let Some(storage) = &self.storage {
            for key in std::mem::take(&mut task.temp_objects) {
                if let Err(e) = storage.delete(&key).await {
                    log::warn!("video task {}: could not delete input {key}: {e}", task.id);
                }
            }
        }
        Ok(task)
    }

    fn copy_backoff(&self, attempts: u32) -> u64 {
        (self.cfg.poll_interval_secs << attempts.min(16)).min(300)
    }

    /// Stream the upstream result into object storage; the key and the URL to show.
    async fn copy_result(&self, task: &Task) -> Result<(String, String), String> {
        let storage = self.storage.as_ref().ok_or("no object storage")?;
        let url = task.upstream_url.as_deref().ok_or("no upstream URL")?;
        let resp = self.download.get(url).send().await.map_err(|e| format!("download: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("download answered {}", resp.status()));
        }
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("video/mp4").to_string();
        let key = format!("videos/{}.mp4", task.id);
        storage.put_stream(&key, &content_type, resp.bytes_stream()).await.map_err(|e| e.to_string())?;
        let shown = storage.url(&key).await.map_err(|e| e.to_string())?;
        Ok((key, shown))
    }

    /// Retry a pending copy whose time has come (background poller).
    async fn retry_copy(&self, id: &str) -> Result<(), StoreError> {
        let Some(mut task) = self.store.get(id).await? else { return self.store.drop_copy(id) };
        let now = now_unix();
        if !task.copy_pending {
            return self.store.drop_copy(id);
        }
        if now < task.next_copy_at {
            return Ok(());
        }
        if task.completed_at.is_some_and(|at| now.saturating_sub(at) > RESULT_URL_TTL_SECS) {
            log::warn!("video task {id}: giving up the copy to object storage, the upstream URL has expired");
            task.copy_pending = false;
            return self.store.put(&task).await;
        }
        match self.copy_result(&task).await {
            Ok((key, url)) => {
                log::info!("video task {id}: result copied to object storage");
                task.storage_key = Some(key);
                task.url = Some(url);
                task.copy_pending = false;
            }
            Err(e) => {
                task.copy_attempts += 1;
                task.next_copy_at = now + self.copy_backoff(task.copy_attempts);
                log::warn!("video task {id}: copy attempt {} failed: {e}", task.copy_attempts);
            }
        }
        self.store.put(&task).await
    }

    /// The task as a client sees it: a stored result gets a fresh presigned URL.
    pub async fn present(&self, mut task: Task) -> Task {
        if let (Some(storage), Some(key)) = (&self.storage, &task.storage_key) {
            match storage.url(key).await {
                Ok(url) => task.url = Some(url),
                Err(e) => log::warn!("video task {}: cannot sign the result URL: {e}", task.id),
            }
        }
        task
    }

    /// Where the content endpoint reads the video from.
    pub fn storage(&self) -> Option<&ObjectStore> {
        self.storage.as_deref()
    }

    /// Upload base64 inputs and put their URLs in the payload.
    async fn upload_inputs(&self, task: &mut Task, sub: &mut request::Submission) -> Result<(), ApiError> {
        let Some(storage) = &self.storage else { return Ok(()) };
        for (i, image) in std::mem::take(&mut sub.uploads).into_iter().enumerate() {
            let key = format!("tmp/{}/{i}.{}", task.id, image.extension);
            let failed = |e: crate::store::objects::StorageError| {
                log::warn!("video task {}: storing {} failed: {e}", task.id, image.field);
                ApiError::new(
                    ErrorKind::BadGateway,
                    format!("{}: the image could not be stored; retry, or send a public URL.", image.field),
                )
                .with_param(&image.field)
            };
            storage.put_bytes(&key, image.content_type, bytes::Bytes::from(image.bytes.clone())).await.map_err(failed)?;
            task.temp_objects.push(key.clone());
            let url = storage.url(&key).await.map_err(failed)?;
            replace_placeholder(&mut sub.payload, &image.placeholder, &url);
        }
        Ok(())
    }

    /// Start-up recovery: a task left in `submitting` by a crash is failed (and refunded).
    /// `spare_newer_than` (seconds) leaves younger ones alone: after an upgrade, the previous
    /// process may still be submitting them and will hand their state over.
    pub async fn recover(&self, spare_newer_than: u64) -> Result<usize, StoreError> {
        let mut failed = 0;
        let now = now_unix();
        for id in self.store.open_ids().await? {
            let Some(task) = self.store.get(&id).await? else { continue };
            if task.status == Status::Submitting && now.saturating_sub(task.created_at) >= spare_newer_than {
                let next = task.apply(
                    Event::Fail(TaskError::new(
                        "interrupted",
                        "The gateway stopped before the video service confirmed this task; it was not started.",
                    )),
                    now_unix(),
                );
                let next = self.settle_terminal(next).await?;
                self.store.put(&next).await?;
                failed += 1;
            }
        }
        Ok(failed)
    }

    /// Validate, persist, submit. Returns the task (new, or the one an Idempotency-Key names).
    /// Create (validate, charge, store, submit) a task; or, for an Idempotency-Key used before,
    /// the task it named. The flag says whether this call created (and charged) the task.
    /// `purses`: what the key pays from (its balance, its account's, spend windows);
    /// `checks_nanos`: what the guardrails that read its request cost (`price_per_check`),
    /// charged with the task (and refunded with it, should it fail).
    pub async fn create(
        &self,
        key: &KeyRecord,
        payment: &crate::charge::Payment,
        body: &[u8],
        (idempotency_key, checks_nanos): (Option<&str>, i64),
    ) -> Result<(Task, bool), ApiError> {
        let json = request::parse_body(body)?;
        let now = now_unix();
        // What an Idempotency-Key's task was created from: the same request sent again gets the
        // same task; another body under the same key is refused.
        let digest = idempotency_key.map(|_| {
            use sha2::{Digest, Sha256};
            let mut canonical = Vec::new();
            canonical_json(&json, &mut canonical);
            Sha256::digest(&canonical).iter().map(|b| format!("{b:02x}")).collect::<String>()
        });
        let reused = |task: Task| -> Result<(Task, bool), ApiError> {
            match (&task.request_digest, &digest) {
                (Some(was), Some(now)) if was != now => Err(ApiError::new(
                    ErrorKind::IdempotencyKeyReused,
                    "This Idempotency-Key was used for a different request. Use a new key for a new request.",
                )
                .with_param("Idempotency-Key")),
                _ => Ok((task, false)),
            }
        };
        if let Some(idem) = idempotency_key {
            if let Some(existing) = self.store.idempotent_task(&key.id, idem, now).await.map_err(internal)? {
                if let Some(task) = self.store.get(&existing).await.map_err(internal)? {
                    return reused(task);
                }
            }
        }
        let mut sub = request::validate(&json, &self.cfg.models, self.storage.is_some())?;
        // The key's model rules apply to video models too (before anything is charged).
        // (And every other check of a video task: those that read its request's text.)
        self.checks
            .vet(&Subject::new(Kind::VideoTask, &key.policy).model(&sub.api_model).plans(&payment.plan_models).text(Text::Value(&json)))?;
        let cost = self.price_nanos(&sub.api_model, sub.duration).ok_or_else(|| {
            log::error!("video model {} is enabled without a price; refused", sub.api_model);
            ApiError::new(ErrorKind::Internal, format!("The model '{}' is not priced on this gateway and cannot be served.", sub.api_model))
        })?;
        let mut task = sub.task(new_task_id(), key.id.clone(), now, cost.saturating_add(checks_nanos.max(0)));
        task.tags = key.policy.tags.clone();
        task.price_multiplier = Some(payment.rate).filter(|m| !m.is_one());
        task.request_digest = digest.clone();
        let purses = &payment.purses[..];
        let _creating = self.creating.mark(&task.id);
        // Charged at submission; refunded if the task fails.
        if task.cost_nanos > 0 {
            match self.books.charge(&Self::payer(&task, "video"), Self::used(&task, task.cost_nanos), purses).await.map_err(internal)? {
                Ok(_) => {
                    task.charged = true;
                    task.charged_to = crate::records::purse::charged(purses);
                }
                Err(refused) => return Err(refused.to_api_error("this video costs", now)),
            }
        }
        // Durable before the upstream is called.
        self.store.put(&task).await.map_err(internal)?;
        if let Some(idem) = idempotency_key {
            let holder = self.store.claim_idempotency(&key.id, idem, &task.id, now).await.map_err(internal)?;
            if holder != task.id {
                self.store.discard(&task.id).await.map_err(internal)?;
                if task.charged {
                    let refund = Self::used(&task, -task.cost_nanos);
                    self.books.adjust(&Self::payer(&task, "video_refund"), refund).await.map_err(internal)?;
                }
                let earlier = self.store.get(&holder).await.map_err(internal)?;
                return earlier
                    .ok_or_else(|| ApiError::new(ErrorKind::Internal, "The task for this Idempotency-Key is missing."))
                    .and_then(reused);
            }
        }
        if let Err(e) = self.upload_inputs(&mut task, &mut sub).await {
            task = task.apply(Event::Fail(TaskError::new("input_storage_failed", e.message.clone())), now_unix());
            task = self.settle_terminal(task).await.map_err(internal)?;
            self.store.put(&task).await.map_err(internal)?;
            return Err(e);
        }
        match self.upstream.submit(sub.capability, &sub.payload).await {
            Ok(job_id) => {
                task = task.apply(Event::Submitted { job_id }, now_unix());
                // Durable again before the client sees the id.
                self.store.put(&task).await.map_err(internal)?;
                Ok((task, true))
            }
            Err(e) => {
                log::warn!("video submit for {} failed: {e}", task.id);
                task = task.apply(Event::Fail(e.as_task_error()), now_unix());
                task = self.settle_terminal(task).await.map_err(internal)?;
                self.store.put(&task).await.map_err(internal)?;
                Err(submit_error(&e))
            }
        }
    }

    /// The caller's task, refreshed from the upstream first when its last poll is stale.
    /// In a fleet, the task as stored: the node holding its claim keeps it current.
    pub async fn get(&self, key: &KeyRecord, id: &str) -> Result<Task, ApiError> {
        let task = self.owned(key, id).await?;
        if !self.store.shared() && !task.status.is_terminal() && self.is_stale(&task, now_unix()) {
            self.refresh(id).await;
            return self.owned(key, id).await;
        }
        Ok(task)
    }

    /// A task only its owner may see; anyone else gets the same 404 as for no task at all.
    pub async fn owned(&self, key: &KeyRecord, id: &str) -> Result<Task, ApiError> {
        match self.store.get(id).await.map_err(internal)? {
            Some(t) if t.owner == key.id => Ok(t),
            _ => Err(ApiError::new(ErrorKind::NotFound, format!("No video task with id '{id}'.")).with_param("task_id")),
        }
    }

    /// The caller's tasks, newest first (`newest_first: false`: oldest), after the task
    /// `after` in that order, at most `limit`; and whether more follow.
    pub async fn list(
        &self,
        key: &KeyRecord,
        after: Option<&str>,
        limit: usize,
        newest_first: bool,
    ) -> Result<(Vec<Task>, bool), ApiError> {
        let mut tasks = self.store.of_owner(&key.id, after, limit.saturating_add(1), newest_first).await.map_err(internal)?;
        let more = tasks.len() > limit;
        tasks.truncate(limit);
        let mut shown = Vec::with_capacity(tasks.len());
        for task in tasks {
            shown.push(self.present(task).await);
        }
        Ok((shown, more))
    }

    /// Delete a finished task of the caller, and its stored result. A task still being made
    /// is refused (409): its charge is settled only when it ends.
    pub async fn delete(&self, key: &KeyRecord, id: &str) -> Result<(), ApiError> {
        let task = self.owned(key, id).await?;
        if !task.status.is_terminal() || task.copy_pending {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("The video task '{id}' is still being made; it can be deleted once it completed or failed."),
            )
            .with_param("task_id"));
        }
        self.store.delete(&task).await.map_err(internal)?;
        if let (Some(storage), Some(object)) = (&self.storage, &task.storage_key) {
            if let Err(e) = storage.delete(object).await {
                log::warn!("video task {id}: deleted, but its stored result {object} could not be removed: {e}");
            }
        }
        Ok(())
    }

    fn is_stale(&self, task: &Task, now: u64) -> bool {
        now.saturating_sub(task.last_polled_at) >= self.cfg.poll_interval_secs
    }

    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_string()).or_default().clone()
    }

    fn forget_lock(&self, id: &str) {
        let mut map = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(id);
    }

    /// Ask the upstream about one task (at most one describe in flight per task; callers that
    /// arrive meanwhile wait for it and then see its result).
    pub async fn refresh(&self, id: &str) {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        if let Err(e) = self.refresh_locked(id).await {
            log::error!("video task {id}: {e}");
        }
    }

    async fn refresh_locked(&self, id: &str) -> Result<(), StoreError> {
        let Some(task) = self.store.get(id).await? else {
            self.store.drop_open(id)?;
            self.forget_lock(id);
            return Ok(());
        };
        let now = now_unix();
        if task.status.is_terminal() {
            self.store.drop_open(id)?;
            self.forget_lock(id);
            return Ok(());
        }
        if task.status == Status::Submitting && self.store.shared() && !self.creating.contains(id) {
            // Left in `submitting` by a node that died or stalled during the submission (this
            // node holds its claim now): failed and refunded, not submitted again.
            let next = task.apply(
                Event::Fail(TaskError::new(
                    "interrupted",
                    "The gateway stopped before the video service confirmed this task; it was not started.",
                )),
                now,
            );
            let next = self.settle_terminal(next).await?;
            self.store.put(&next).await?;
            self.forget_lock(id);
            return Ok(());
        }
        if task.status == Status::Submitting || !self.is_stale(&task, now) {
            return Ok(());
        }
        let limit = if task.off_peak { OFF_PEAK_LIMIT_SECS } else { self.cfg.max_task_hours * 3600 };
        if now.saturating_sub(task.created_at) > limit {
            let hours = limit / 3600;
            let next = task.apply(
                Event::Fail(TaskError::new("timeout", format!("The video service did not finish the task within {hours} hours."))),
                now,
            );
            let next = self.settle_terminal(next).await?;
            self.store.put(&next).await?;
            self.forget_lock(id);
            return Ok(());
        }
        let Some(job_id) = task.job_id.clone() else { return Ok(()) };
        let mut next = match self.upstream.describe(task.capability, &job_id).await {
            Ok(job) => {
                task.apply(Event::Upstream { status: job.status, progress: job.progress, url: job.url, error: job.error }, now_unix())
            }
            Err(e) if e.is_transient() => {
                log::warn!("video task {id}: describe failed, will retry: {e}");
                task.clone()
            }
            Err(e) => task.apply(Event::Fail(e.as_task_error()), now_unix()),
        };
        next.last_polled_at = now_unix();
        let next = self.settle_terminal(next).await?;
        self.store.put(&next).await?;
        if next.status.is_terminal() {
            self.forget_lock(id);
        }
        Ok(())
    }

    /// One poller round: refresh every stale unfinished task, `poll_concurrency` at a time.
    pub async fn poll_once(&self) {
        let ids = match self.store.open_ids().await {
            Ok(ids) => ids,
            Err(e) => {
                log::error!("video poller: {e}");
                return;
            }
        };
        futures_util::stream::iter(ids).for_each_concurrent(self.cfg.poll_concurrency, |id| async move { self.refresh(&id).await }).await;
        let copies = match self.store.copy_pending_ids().await {
            Ok(ids) => ids,
            Err(e) => {
                log::error!("video poller: {e}");
                return;
            }
        };
        futures_util::stream::iter(copies)
            .for_each_concurrent(self.cfg.poll_concurrency, |id| async move {
                let lock = self.lock_for(&id);
                let _guard = lock.lock().await;
                if let Err(e) = self.retry_copy(&id).await {
                    log::error!("video task {id}: {e}");
                }
                self.forget_lock(&id);
            })
            .await;
    }

    /// After the database is handed over, task writes are sent to the new process at `socket`.
    pub fn set_handover(&self, to: Arc<dyn crate::store::ForwardTasks>) {
        self.store.set_handover(to);
    }

    /// Store a task written by a process that handed its database over to this one; the poller
    /// takes it from there.
    pub async fn accept_forwarded_task(&self, task: Task) -> Result<(), StoreError> {
        self.store.put(&task).await
    }

    /// Unfinished tasks by public status, and the longest time since one of them was last
    /// polled (seconds).
    /// In a fleet: of the tasks this node holds.
    pub async fn open_stats(&self) -> (std::collections::BTreeMap<&'static str, usize>, u64) {
        let now = now_unix();
        let mut by_status = std::collections::BTreeMap::new();
        let mut lag = 0;
        for task in self.store.open_tasks().await.unwrap_or_default() {
            *by_status.entry(task.status.public()).or_insert(0) += 1;
            lag = lag.max(now.saturating_sub(task.last_polled_at));
        }
        (by_status, lag)
    }

    /// The most recently updated tasks, any status, newest first.
    pub async fn recent_tasks(&self, limit: usize) -> Result<Vec<Task>, StoreError> {
        self.store.recent(limit).await
    }

    /// Tasks that ended in this process's lifetime: (completed, failed).
    pub fn finished_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.completed.load(Relaxed), self.failed.load(Relaxed))
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_secs(self.cfg.poll_interval_secs)
    }
}

/// Replace every string equal to `placeholder` in `payload` with `url`.
fn replace_placeholder(payload: &mut serde_json::Map<String, serde_json::Value>, placeholder: &str, url: &str) {
    fn walk(v: &mut serde_json::Value, placeholder: &str, url: &str) {
        match v {
            serde_json::Value::String(s) if s == placeholder => *s = url.to_string(),
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(i, placeholder, url)),
            serde_json::Value::Object(map) => map.values_mut().for_each(|i| walk(i, placeholder, url)),
            _ => {}
        }
    }
    payload.values_mut().for_each(|v| walk(v, placeholder, url));
}

/// The client-facing error for a failed submission.
fn submit_error(e: &UpstreamError) -> ApiError {
    match e {
        UpstreamError::Api { code, message } if e.is_invalid_request() => {
            ApiError::new(ErrorKind::BadRequest, format!("The video service rejected the request ({code}): {message}"))
        }
        UpstreamError::Network { timed_out: true, .. } => ApiError::new(
            ErrorKind::GatewayTimeout,
            "The video service did not answer in time; the task was failed and not charged. Retry later.",
        ),
        UpstreamError::Network { sent: true, .. } => ApiError::new(
            ErrorKind::BadGateway,
            "The connection to the video service was lost; the task was failed and not charged. Retry later.",
        ),
        _ => ApiError::new(ErrorKind::BadGateway, "The video service is unavailable; the task was not created. Retry later."),
    }
}

/// Polls unfinished tasks every `poll_interval_secs` until shutdown.
pub struct VideoPoller {
    pub service: Arc<VideoService>,
}

#[async_trait]
impl BackgroundService for VideoPoller {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.service.poll_interval()) => {}
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.service.poll_once() => {}
            }
        }
    }
}

/// `v` as JSON with every object's members in name order, however the client ordered them.
fn canonical_json(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(serde_json::Value::String(name.clone()).to_string().as_bytes());
                out.push(b':');
                canonical_json(value, out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_long_random_base62() {
        let a = new_task_id();
        let b = new_task_id();
        assert_ne!(a, b);
        let tail = a.strip_prefix("task_").expect("prefix");
        assert!(tail.len() >= 24 && tail.bytes().all(|c| c.is_ascii_alphanumeric()), "{a}");
    }

    fn sled_tasks(db: &sled::Db) -> VideoStore {
        Arc::new(crate::store::sled::tasks::SledTasks::new(db).expect("tasks"))
    }

    fn config() -> VideoConfig {
        VideoConfig {
            base_url: crate::config::BaseUrl::parse("http://127.0.0.1:9").expect("url"),
            secret_id: "id".into(),
            secret_key: "key".into(),
            region: "r".into(),
            version: "v".into(),
            brand: "Gen".into(),
            timeout_secs: 1,
            rate_per_sec: 10,
            ca_pem: None,
            poll_interval_secs: 5,
            poll_concurrency: 2,
            prices: [("genq3-pro".to_string(), 0.05)].into_iter().collect(),
            models: request::MODELS.iter().map(|m| m.to_string()).collect(),
            max_task_hours: 24,
        }
    }

    #[tokio::test]
    async fn recovery_fails_tasks_left_in_submitting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(crate::billing::ledger::Ledger::open(&db).expect("ledger"));
        ledger.open_account("key_a", 1_000_000_000).await.expect("account");
        let svc = VideoService::new(config(), sled_tasks(&db), Books::new(ledger.clone()), Arc::default(), None).expect("service");
        let mut interrupted = crate::records::task::tests::task();
        interrupted.id = "task_interrupted".into();
        interrupted.cost_nanos = 250_000_000;
        interrupted.charged = true;
        let purses = [crate::records::purse::Purse::key("key_a")];
        let payer = VideoService::payer(&interrupted, "video");
        svc.books.charge(&payer, Used::cost(250_000_000), &purses).await.expect("db").expect("charged");
        let mut queued = crate::records::task::tests::task().apply(Event::Submitted { job_id: "j".into() }, 1);
        queued.id = "task_queued".into();
        svc.store.put(&interrupted).await.expect("put");
        svc.store.put(&queued).await.expect("put");
        assert_eq!(svc.recover(0).await.expect("recover"), 1);
        let t = svc.store.get("task_interrupted").await.expect("get").expect("task");
        assert_eq!(t.status, Status::Failed);
        assert_eq!(t.error.map(|e| e.code), Some("interrupted".to_string()));
        assert!(t.refunded);
        assert_eq!(ledger.balance("key_a").await.expect("balance"), 1_000_000_000, "charge given back");
        assert_eq!(svc.recover(0).await.expect("again"), 0, "refunded once");
        assert_eq!(svc.store.get("task_queued").await.expect("get").map(|t| t.status), Some(Status::Queued));
        assert_eq!(svc.store.open_ids().await.expect("ids"), vec!["task_queued".to_string()]);
    }

    #[test]
    fn price_is_per_second_times_duration() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let svc = VideoService::new(
            config(),
            sled_tasks(&db),
            Books::new(Arc::new(crate::billing::ledger::Ledger::open(&db).expect("ledger"))),
            Arc::default(),
            None,
        )
        .expect("service");
        assert_eq!(svc.price_nanos("genq3-pro", 8), Some(400_000_000));
        assert_eq!(svc.price_nanos("genq2", 8), None, "no price configured");
    }

    #[test]
    fn submit_errors_map_to_statuses() {
        let api = |c: &str| UpstreamError::Api { code: c.into(), message: "m".into() };
        assert_eq!(submit_error(&api("InvalidParameterValue.Image")).status(), 400);
        assert_eq!(submit_error(&api("InternalError")).status(), 502);
        assert_eq!(submit_error(&UpstreamError::Network { timed_out: true, sent: true }).status(), 504);
        assert_eq!(submit_error(&UpstreamError::Network { timed_out: false, sent: false }).status(), 502);
    }
}
