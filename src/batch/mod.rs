//! `/v1/batches`: a key's batch jobs, run by the provider's batch API at its batch prices.
//!
//! * **Create**: the key's input file (`/v1/files`, `purpose: batch`) is read and every line
//!   checked before anything is charged (JSON, unique `custom_id`, `POST`, the batch's own
//!   `endpoint`, one model for the whole file — the API's rule — that the key may call and
//!   tollgate serves from an OpenAI provider); each line is written again with the model under
//!   the provider's name and, where it named none, the output maximum it is held for. The
//!   worst case of the whole file at the batch prices is charged (`billing::batch`), the batch
//!   stored (`submitting`), the file uploaded and the batch created upstream with the
//!   provider's key; a failure there refunds the charge.
//! * **Poll** ([`BatchPoller`]): each open batch is retrieved from the provider every
//!   `limits.batch_poll_secs` (and when its owner reads it after that long, on one node). The
//!   job store keeps it (in a fleet claimed by one node, taken over by another when that node
//!   dies). Once it ended (completed, failed, expired, cancelled), its output and error files
//!   are copied into the key's files and it is settled line by line: each output line's usage
//!   at the batch prices; the difference to the charge is booked back in one record (lines
//!   never done cost nothing).
//! * **Cancel** asks the provider; the batch is settled when the provider says it is cancelled.

mod guard;
pub mod record;
pub mod upstream;

use crate::base::clock::now_unix;
use crate::charge::{Books, Payer, Used};
use crate::checks::{Checks, Kind, Subject, Text};
use crate::config::{Protocol, ProviderConfig, ProviderKind};
use crate::files::FileService;
use crate::protocol::batch::{output_line, rewrite_line, BatchLine, BATCH_URLS};
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::store::{JobRow, JobStore, StoreError};
use crate::upstream::Routing;
use arc_swap::ArcSwap;
use record::{Batch, KIND, SUBMITTING};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The only completion window the API offers.
pub const COMPLETION_WINDOW: &str = "24h";

/// The most `metadata` pairs, and their lengths (the API's bounds).
const METADATA_PAIRS: usize = 16;
const METADATA_KEY: usize = 64;
const METADATA_VALUE: usize = 512;

fn internal(e: StoreError) -> ApiError {
    match e {
        StoreError::Shared(e) => {
            log::warn!("batches: {e}");
            crate::store::fleet::unavailable("the batch")
        }
        e => {
            log::error!("batches: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while storing the batch.")
        }
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("No batch found with id '{id}'.")).with_param("batch_id")
}

fn line_error(n: usize, field: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("Line {n} of the input file: {why}")).with_param(&format!("line {n}: {field}"))
}

pub struct BatchService {
    /// Where its guardrails' checks are counted.
    metrics: Arc<crate::observe::metrics::Metrics>,
    jobs: Arc<dyn JobStore>,
    books: Books,
    /// The checks every batch line goes through.
    checks: Arc<Checks>,
    files: Arc<FileService>,
    routing: Arc<ArcSwap<Routing>>,
    poll_every: Duration,
    /// Batches this process is submitting now (see the video service's `creating`).
    creating: crate::base::marks::Marks,
    /// One refresh (or cancel) of a batch at a time in this process, per batch: a batch whose
    /// files are being downloaded never holds up another's.
    refreshing: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// An input file checked: the lines as sent upstream (a temporary file and its length), how many
/// requests, their worst case, the model and its provider, and the lines that continue a stored
/// response (line number, response id).
struct Prepared {
    written: (Arc<std::fs::File>, u64),
    requests: u64,
    worst: i64,
    model: String,
    provider: ProviderConfig,
    continues: Vec<(usize, String)>,
    /// Lines a guardrail blocked (custom_id, guardrail), and what the guardrails cost.
    blocked: Vec<(String, String)>,
    guard_price: i64,
}

/// What the first line of an input file decides for all of them: the model, its provider and
/// the provider's name for it, and the route its bodies are read as.
struct Batchwide {
    model: String,
    provider: ProviderConfig,
    theirs: String,
    route: Option<Route>,
}

impl Batchwide {
    fn of(routing: &Routing, endpoint: &str, model: &str, n: usize) -> Result<Batchwide, ApiError> {
        let provider = BatchService::provider_for(routing, model)
            .ok_or_else(|| line_error(n, "body.model", format!("the model '{model}' is not served for batches by this gateway.")))?;
        let route = match endpoint {
            "/v1/chat/completions" => Some(Route::ChatCompletions),
            "/v1/responses" => Some(Route::Responses),
            _ => None,
        };
        Ok(Batchwide { model: model.to_string(), theirs: provider.upstream_model(model).to_string(), provider, route })
    }
}

/// Batches one key may hold open at once.
pub const MAX_OPEN_BATCHES_PER_KEY: usize = 50;

/// How many of a key's newest batches are looked at to count its open ones.
const OPEN_BATCHES_LOOKED_AT: usize = 500;

/// The longest an open batch goes without being asked about at its provider.
const MAX_POLL_INTERVAL_SECS: u64 = 600;

/// What a create request asks for.
struct Asked {
    input_file_id: String,
    endpoint: &'static str,
    metadata: Option<Value>,
}

fn parse_create(body: &[u8]) -> Result<Asked, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The body is not JSON: {e}")))?;
    let field = |name: &str| v.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
    let input_file_id = field("input_file_id")
        .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "'input_file_id' is required.").with_param("input_file_id"))?
        .to_string();
    let endpoint = field("endpoint").and_then(|e| BATCH_URLS.into_iter().find(|u| *u == e)).ok_or_else(|| {
        ApiError::new(ErrorKind::BadRequest, format!("'endpoint' must be one of {}.", BATCH_URLS.join(", "))).with_param("endpoint")
    })?;
    if field("completion_window") != Some(COMPLETION_WINDOW) {
        return Err(ApiError::new(ErrorKind::BadRequest, "'completion_window' must be \"24h\".").with_param("completion_window"));
    }
    let metadata = match v.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m))
            if m.len() <= METADATA_PAIRS
                && m.iter().all(|(k, v)| k.len() <= METADATA_KEY && v.as_str().is_some_and(|s| s.len() <= METADATA_VALUE)) =>
        {
            Some(Value::Object(m.clone()))
        }
        Some(_) => {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("'metadata' is at most {METADATA_PAIRS} string pairs (keys up to {METADATA_KEY} characters, values up to {METADATA_VALUE})."),
            )
            .with_param("metadata"))
        }
    };
    Ok(Asked { input_file_id, endpoint, metadata })
}

impl BatchService {
    pub fn new(
        jobs: Arc<dyn JobStore>,
        books: Books,
        checks: Arc<Checks>,
        files: Arc<FileService>,
        routing: Arc<ArcSwap<Routing>>,
        poll_every: Duration,
    ) -> Self {
        BatchService {
            jobs,
            books,
            checks,
            files,
            routing,
            poll_every,
            creating: Default::default(),
            refreshing: Mutex::new(std::collections::HashMap::new()),
            metrics: Arc::default(),
        }
    }

    /// Count its guardrails' checks in `metrics` (the process's).
    pub fn with_metrics(mut self, metrics: Arc<crate::observe::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn poll_interval(&self) -> Duration {
        self.poll_every
    }

    /// The lock of batch `id` (made on first use; dropped from the map once nobody holds it).
    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.refreshing.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(id.to_string()).or_default().clone()
    }

    /// Who pays for a batch: its owner, under its model and the batch route.
    fn payer(batch: &Batch) -> Payer<'_> {
        Payer {
            rate: batch.price_multiplier.unwrap_or_default(),
            key_id: &batch.owner,
            tags: &batch.tags,
            model: &batch.model,
            protocol: "openai",
            route: crate::records::usage::BATCH_ROUTE,
        }
    }

    /// What a batch used (input, cache reads, output) and cost, charged to its purses.
    fn used(batch: &Batch, cost_nanos: i64, usage: (u64, u64, u64)) -> Used {
        Used {
            usage: crate::base::usage::Usage { input: usage.0, cached: usage.1, cache_write: 0, output: usage.2 },
            provider: Some(batch.provider.clone()),
            attempts: 0,
            charged: batch.charged_to.clone(),
            ..Used::cost(cost_nanos)
        }
    }

    async fn put(&self, batch: &Batch) -> Result<(), StoreError> {
        let record = serde_json::to_string(batch).map_err(|e| StoreError::Corrupt(format!("batch {}: {e}", batch.id)))?;
        self.jobs
            .put(&JobRow {
                kind: KIND,
                id: batch.id.clone(),
                owner: batch.owner.clone(),
                created_at: batch.created_at,
                open: batch.open(),
                record,
            })
            .await
    }

    fn read(text: &str) -> Option<Batch> {
        match serde_json::from_str(text) {
            Ok(b) => Some(b),
            Err(e) => {
                log::warn!("batches: an unreadable batch is left alone: {e}");
                None
            }
        }
    }

    /// The provider a batch of `model` goes to: the first of the model's OpenAI providers
    /// (not Azure's, whose batch API has its own paths), as the routing orders them.
    fn provider_for(routing: &Routing, model: &str) -> Option<ProviderConfig> {
        let candidates = routing.catalog.candidates(Protocol::Openai, model)?;
        candidates.iter().map(|&i| &routing.catalog.upstreams[i].config).find(|c| c.kind == ProviderKind::Openai).cloned()
    }

    fn provider(&self, batch: &Batch) -> Result<upstream::Provider, upstream::CallError> {
        let routing = self.routing.load();
        let config = routing.catalog.upstreams.iter().map(|u| &u.config).find(|c| c.name == batch.provider).ok_or_else(|| {
            upstream::CallError { status: None, message: format!("provider '{}' is no longer configured", batch.provider) }
        })?;
        upstream::Provider::new(config, batch.key_index)
    }

    /// The key's input file, to read at offsets (see [`FileService::open`]).
    async fn input(&self, key: &KeyRecord, id: &str) -> Result<Arc<std::fs::File>, ApiError> {
        let (file, input, _) = self.files.open(&key.id, id).await.map_err(|e| e.with_param("input_file_id"))?;
        if file.purpose != "batch" {
            return Err(ApiError::new(ErrorKind::BadRequest, format!("The file '{id}' was not uploaded with purpose 'batch'."))
                .with_param("input_file_id"));
        }
        Ok(input)
    }

    /// Check every line against the batch, the key and the routing, reading the input one line at
    /// a time and writing the lines for the provider to a temporary file as they are checked
    /// (neither file is ever whole in memory); the lines written, the worst case, the model and
    /// the provider.
    fn prepare(
        who: (&KeyRecord, &Checks, &[crate::policy::plan::PlanModels]),
        routing: &Routing,
        endpoint: &str,
        input: Arc<std::fs::File>,
        mut guard: guard::LineGuard,
    ) -> Result<Prepared, ApiError> {
        use std::io::{BufRead, Write};
        let disk = |e: std::io::Error| {
            log::error!("batches: checking the input: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while checking the input file.")
        };
        let mut reader = std::io::BufReader::with_capacity(64 << 10, crate::base::spool::Reader::new(input));
        let out = tempfile::tempfile().map_err(disk)?;
        let mut writer = std::io::BufWriter::with_capacity(64 << 10, out.try_clone().map_err(disk)?);
        let mut lines = crate::protocol::batch::Lines::default();
        let mut batch: Option<Batchwide> = None;
        let (mut raw, mut n, mut worst, mut len, mut continues) = (Vec::new(), 0usize, 0i64, 0u64, Vec::new());
        let mut blocked = Vec::new();
        loop {
            raw.clear();
            if reader.read_until(b'\n', &mut raw).map_err(disk)? == 0 {
                break;
            }
            n += 1;
            let bytes = raw.strip_suffix(b"\n").unwrap_or(&raw);
            let Some(mut line) = lines.check(n, bytes)? else { continue };
            let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            let wide = match &batch {
                Some(w) => w,
                None => batch.insert(Batchwide::of(routing, endpoint, &line.model, n)?),
            };
            // The key's guardrails: a blocked line is neither sent nor charged.
            let masked = match guard.line(who.0, endpoint, &line.model, bytes)? {
                guard::Line::Blocked(guardrail) => {
                    blocked.push((line.custom_id.clone(), guardrail));
                    continue;
                }
                guard::Line::Masked(masked) => Some(masked),
                guard::Line::Kept => None,
            };
            let bytes = masked.as_deref().unwrap_or(bytes);
            let rewritten = Self::prepare_line(who, routing, endpoint, wide, (n, bytes), &mut line, &mut continues)?;
            let sent = rewritten.as_deref().unwrap_or(bytes);
            writer.write_all(sent).and_then(|()| writer.write_all(b"\n")).map_err(disk)?;
            len += sent.len() as u64 + 1;
            let cost = crate::billing::batch::worst_case(&routing.prices, std::slice::from_ref(&line), |_| 0).ok_or_else(|| {
                log::error!("batch model {} is served without a price; refused", line.model);
                ApiError::new(
                    ErrorKind::Internal,
                    format!("The model '{}' is not priced on this gateway and cannot be served.", line.model),
                )
            })?;
            worst = worst.saturating_add(cost);
        }
        lines.finish()?;
        writer.flush().map_err(disk)?;
        let Batchwide { model, provider, .. } =
            batch.ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The input file has no requests."))?;
        let requests = (lines.count() - blocked.len()) as u64;
        if requests == 0 {
            let guardrail = blocked.first().map_or("", |b| b.1.as_str());
            return Err(crate::checks::guard::Refusal::Blocked { guardrail: guardrail.to_string(), output: false }.error());
        }
        let guard_price = guard.price_nanos;
        Ok(Prepared { written: (Arc::new(out), len), requests, worst, model, provider, continues, blocked, guard_price })
    }

    /// One line against the batch (its endpoint and model), the key and the prices: its output
    /// maximum and what it references counted into `line`, a continued response noted; the line
    /// as written for the provider when it is not sent as it came.
    fn prepare_line(
        (key, checks, plans): (&KeyRecord, &Checks, &[crate::policy::plan::PlanModels]),
        routing: &Routing,
        endpoint: &str,
        wide: &Batchwide,
        (n, raw): (usize, &[u8]),
        line: &mut BatchLine,
        continues: &mut Vec<(usize, String)>,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        let model = &wide.model;
        if line.url != endpoint {
            return Err(line_error(n, "url", format!("its url '{}' is not the batch's endpoint '{endpoint}'.", line.url)));
        }
        if line.model != *model {
            return Err(line_error(
                n,
                "body.model",
                format!("a batch calls one model; this line names '{}', the first '{model}'.", line.model),
            ));
        }
        // The checks of a batch line: the key's model rules and those that read its text here,
        // its output limit below.
        let refused = |e: ApiError| match &e.param {
            Some(field) => line_error(n, &format!("body.{field}"), e.message),
            None => line_error(n, "body", e.message),
        };
        checks.vet(&Subject::new(Kind::BatchLine, &key.policy).model(&line.model).plans(plans).text(Text::Json(raw))).map_err(refused)?;
        let mut maximum = None;
        if let Some(route) = &wide.route {
            let price = routing.prices.price(model);
            let body = serde_json::from_slice::<Value>(raw).ok().and_then(|v| v.get("body").map(Value::to_string)).unwrap_or_default();
            let fields = crate::protocol::body_fields(body.as_bytes()).map_err(|e| line_error(n, "body", e.message))?;
            // What the body references is held as the same body sent alone would be.
            line.extra_input = routing.media_allowance.tokens(fields.media);
            if let Some(previous) = &fields.previous_response_id {
                continues.push((n, previous.to_string()));
            }
            // A conversation object is not one tollgate knows the owner of: never continued with
            // the provider's key on a line's say-so.
            if serde_json::from_str::<Value>(&body).ok().is_some_and(|b| b.get("conversation").is_some_and(|c| !c.is_null())) {
                return Err(line_error(
                    n,
                    "body.conversation",
                    "a batch line cannot continue a stored conversation; send its items instead.",
                ));
            }
            if fields.stream == Some(true) {
                return Err(line_error(n, "body.stream", "a batch's answers are not streamed."));
            }
            let asked = crate::upstream::output::asked(route, &fields).map_err(|e| line_error(n, "body", e.message))?;
            let field = crate::upstream::output::named_field(route, &fields);
            checks.vet(&Subject { output: Some((asked, field)), ..Subject::new(Kind::BatchLine, &key.policy) }).map_err(refused)?;
            let limit = price.and_then(|p| p.max_output_tokens).unwrap_or(crate::base::usage::MAX_OUTPUT_ALLOWANCE);
            let per_choice = match asked {
                Some(a) if a > limit => {
                    return Err(line_error(
                        n,
                        &format!("body.{field}"),
                        format!("{a} output tokens is more than '{model}' can produce ({limit})."),
                    ))
                }
                Some(a) => a,
                None => {
                    let a = crate::upstream::output::default_allowance(
                        price.and_then(|p| p.default_output_tokens),
                        price.and_then(|p| p.max_output_tokens),
                        key.policy.default_output_tokens,
                        key.policy.max_output_tokens,
                        routing.default_output_tokens,
                    );
                    maximum = Some((crate::upstream::output::field(route), a));
                    a
                }
            };
            line.max_output = Some(per_choice.saturating_mul(fields.n.unwrap_or(1).max(1)));
        }
        if wide.theirs != *model || maximum.is_some() {
            return Ok(Some(rewrite_line(raw, n, &wide.theirs, maximum)?));
        }
        Ok(None)
    }

    /// Create a batch of the key's input file: checked, charged its worst case, submitted. A
    /// key holds at most [`MAX_OPEN_BATCHES_PER_KEY`] open at once.
    /// `guards`: the key's guardrails, which read each line.
    pub async fn create(
        &self,
        key: &KeyRecord,
        payment: &crate::charge::Payment,
        body: &[u8],
        guards: crate::checks::guard::Applied,
    ) -> Result<Batch, ApiError> {
        let asked = parse_create(body)?;
        let recent = self.jobs.of_owner(KIND, &key.id, None, OPEN_BATCHES_LOOKED_AT).await.map_err(internal)?;
        let open = recent.iter().filter_map(|t| Self::read(t)).filter(Batch::open).count();
        if open >= MAX_OPEN_BATCHES_PER_KEY {
            let mut refused = ApiError::new(
                ErrorKind::RateLimited,
                format!("This key has {open} batches open, the most it may hold at once; wait for one to end or cancel one."),
            );
            refused.retry_after = Some(60);
            return Err(refused);
        }
        let input = self.input(key, &asked.input_file_id).await?;
        let routing = self.routing.load_full();
        let endpoint = asked.endpoint;
        let (key_owned, checks, plans) = (key.clone(), self.checks.clone(), payment.plan_models.clone());
        let prices = routing.prices.clone();
        let guard =
            guard::LineGuard { applied: guards, metrics: self.metrics.clone(), handle: tokio::runtime::Handle::current(), price_nanos: 0 };
        let Prepared { written, requests, mut worst, model, provider, continues, blocked, guard_price } =
            tokio::task::spawn_blocking(move || Self::prepare((&key_owned, &checks, &plans), &routing, endpoint, input, guard))
                .await
                .map_err(|e| {
                    log::error!("batches: checking the input failed: {e}");
                    ApiError::new(ErrorKind::Internal, "Internal error while checking the input file.")
                })??;
        // A line that continues a stored response: only one of this key's, and held for the
        // conversation it continues, as the relay does.
        for (n, previous) in continues {
            let owner = self.books.owner_of(&previous).await.map_err(internal)?.filter(|o| o.key_id == key.id);
            let Some(owner) = owner else {
                return Err(line_error(n, "body.previous_response_id", format!("previous response with id '{previous}' not found.")));
            };
            let context =
                crate::billing::batch::worst_case(&prices, &[BatchLine::context(&model, owner.context_tokens)], |_| 0).unwrap_or(0);
            worst = worst.saturating_add(context);
        }
        let worst = worst.saturating_add(guard_price);
        let now = now_unix();
        let mut batch = Batch {
            id: format!("batch_{}", crate::base::secrets::random_base62(28)),
            owner: key.id.clone(),
            created_at: now,
            endpoint: endpoint.to_string(),
            input_file_id: asked.input_file_id,
            completion_window: COMPLETION_WINDOW.into(),
            metadata: asked.metadata,
            model,
            provider: provider.name.clone(),
            key_index: 0,
            status: SUBMITTING.into(),
            upstream_id: None,
            upstream_input_file: None,
            upstream_output_file: None,
            upstream_error_file: None,
            // The blocked lines count as failed ones from the start.
            counts: record::Counts { total: requests + blocked.len() as u64, failed: blocked.len() as u64, ..Default::default() },
            output_file_id: None,
            error_file_id: None,
            errors: None,
            times: Default::default(),
            hold_nanos: worst,
            price_multiplier: Some(payment.rate).filter(|m| !m.is_one()),
            charged_to: crate::records::purse::charged(&payment.purses),
            settled: false,
            cost_nanos: 0,
            usage: (0, 0, 0),
            tags: key.policy.tags.clone(),
            last_polled_at: now,
            blocked,
            guard_nanos: guard_price,
        };
        let _creating = self.creating.mark(&batch.id);
        match self.books.charge(&Self::payer(&batch), Self::used(&batch, worst, (0, 0, 0)), &payment.purses).await.map_err(internal)? {
            Ok(_) => {}
            Err(refused) => return Err(refused.to_api_error("this batch may cost", now)),
        }
        // Durable before the provider is called.
        self.put(&batch).await.map_err(internal)?;
        let submitted = async {
            let up = upstream::Provider::new(&provider, batch.key_index)?;
            let file = up.upload(&format!("{}.jsonl", batch.id), written.0.clone(), written.1).await?;
            batch.upstream_input_file = Some(file.clone());
            up.create(&file, endpoint, COMPLETION_WINDOW, batch.metadata.as_ref()).await
        }
        .await;
        match submitted {
            Ok(up) => {
                batch.upstream_id = up.get("id").and_then(Value::as_str).map(str::to_string);
                batch.take_upstream(&up);
                if batch.upstream_id.is_none() || batch.status == SUBMITTING {
                    batch.status = "validating".into();
                }
                self.put(&batch).await.map_err(internal)?;
                log::info!(
                    "batch {} of key {}: {} requests of {} submitted to {}, {} nano-USD held",
                    batch.id,
                    batch.owner,
                    batch.counts.total,
                    batch.model,
                    batch.provider,
                    worst
                );
                Ok(batch)
            }
            Err(e) => {
                log::warn!("batch {}: submission to {} failed: {e}", batch.id, batch.provider);
                self.fail(&mut batch, "submission_failed", &format!("The provider did not accept the batch: {}", e.message))
                    .await
                    .map_err(internal)?;
                Err(match e.status {
                    Some(400) => ApiError::new(ErrorKind::BadRequest, format!("The provider refused the batch: {}", e.message)),
                    _ => ApiError::new(
                        ErrorKind::BadGateway,
                        "The provider's batch API is unavailable; the batch was not created and nothing was charged. Retry later.",
                    ),
                })
            }
        }
    }

    /// End a batch that never ran: failed, the charge given back.
    async fn fail(&self, batch: &mut Batch, code: &str, message: &str) -> Result<(), StoreError> {
        batch.status = "failed".into();
        batch.times.insert("failed_at".into(), now_unix());
        batch.errors = Some(serde_json::json!({"object": "list", "data": [{"code": code, "message": message}]}));
        self.settle(batch, None).await?;
        self.put(batch).await
    }

    /// Book what the batch cost, from its output (None: nothing was done) line by line at the
    /// batch prices, against what was charged: one record, the difference.
    async fn settle(&self, batch: &mut Batch, output: Option<Arc<std::fs::File>>) -> Result<(), StoreError> {
        if batch.settled {
            return Ok(());
        }
        let routing = self.routing.load_full();
        let model = batch.model.clone();
        let (cost, usage, done, failed) = match output {
            None => (0, (0, 0, 0), 0, 0),
            Some(file) => tokio::task::spawn_blocking(move || {
                use std::io::BufRead;
                let (mut cost, mut usage, mut done, mut failed) = (0i64, (0u64, 0u64, 0u64), 0u64, 0u64);
                // Read at offsets from the start, whatever the file's position.
                let reader = std::io::BufReader::new(crate::base::spool::Reader::new(file));
                for raw in reader.split(b'\n').map_while(Result::ok) {
                    let Some(line) = output_line(&raw) else { continue };
                    match line.usage {
                        Some(u) if (200..300).contains(&line.status) => {
                            cost = cost.saturating_add(crate::billing::batch::line_cost(&routing.prices, &model, &u));
                            usage = (usage.0 + u.input, usage.1 + u.cached, usage.2 + u.output);
                            done += 1;
                        }
                        _ => failed += 1,
                    }
                }
                (cost, usage, done, failed)
            })
            .await
            .map_err(|e| StoreError::Corrupt(format!("batch output: {e}")))?,
        };
        // The guardrails' checks at submission are billed whatever the lines came to.
        let cost = cost.saturating_add(batch.guard_nanos);
        // The settlement's record carries a marker (as a stored response's id): a settlement
        // booked before a crash, whose batch state was not written, is found and not booked
        // again.
        let marker = format!("{}:settled", batch.id);
        if self.books.owner_of(&marker).await?.is_some() {
            log::warn!("batch {}: its settlement was booked before; not booked again", batch.id);
        } else {
            let used =
                Used { response_id: Some(marker), prior_list_nanos: batch.hold_nanos, ..Self::used(batch, cost - batch.hold_nanos, usage) };
            self.books.adjust(&Self::payer(batch), used).await?;
        }
        batch.settled = true;
        batch.cost_nanos = cost;
        batch.usage = usage;
        log::info!(
            "batch {} of key {} {}: {done} answers billed ({failed} without usage), {cost} nano-USD of {} held",
            batch.id,
            batch.owner,
            batch.status,
            batch.hold_nanos
        );
        Ok(())
    }

    /// The key's batch; another key's is the same 404 as none.
    pub async fn owned(&self, key: &KeyRecord, id: &str) -> Result<Batch, ApiError> {
        match self.jobs.get(id).await.map_err(internal)?.as_deref().and_then(Self::read) {
            Some(b) if b.owner == key.id => Ok(b),
            _ => Err(not_found(id)),
        }
    }

    /// The key's batch, brought up to date first when its last poll is older than the poll
    /// interval (on one node; in a fleet the node holding it keeps it current).
    pub async fn get(&self, key: &KeyRecord, id: &str) -> Result<Batch, ApiError> {
        let batch = self.owned(key, id).await?;
        if !self.jobs.shared() && batch.open() && now_unix().saturating_sub(batch.last_polled_at) >= self.interval_of(&batch, now_unix()) {
            self.refresh(batch).await;
            return self.owned(key, id).await;
        }
        Ok(batch)
    }

    /// The key's batches, newest first, after `after`, at most `limit`; whether more follow.
    pub async fn list(&self, key: &KeyRecord, after: Option<&str>, limit: usize) -> Result<(Vec<Batch>, bool), ApiError> {
        let texts = self.jobs.of_owner(KIND, &key.id, after, limit.saturating_add(1)).await.map_err(internal)?;
        let mut batches: Vec<Batch> = texts.iter().filter_map(|t| Self::read(t)).collect();
        let more = batches.len() > limit;
        batches.truncate(limit);
        Ok((batches, more))
    }

    /// Ask the provider to cancel the key's batch; settled once the provider says it is.
    pub async fn cancel(&self, key: &KeyRecord, id: &str) -> Result<Batch, ApiError> {
        let lock = self.lock_for(id);
        let _turn = lock.lock().await;
        let mut batch = self.owned(key, id).await?;
        if record::is_terminal(&batch.status) || batch.status == "cancelling" {
            return Err(ApiError::new(ErrorKind::Conflict, format!("The batch '{id}' is {}; it cannot be cancelled.", batch.status))
                .with_param("batch_id"));
        }
        let Some(upstream_id) = batch.upstream_id.clone() else {
            return Err(ApiError::new(ErrorKind::Conflict, format!("The batch '{id}' is still being submitted; cancel it in a moment."))
                .with_param("batch_id"));
        };
        let provider = self.provider(&batch).map_err(|e| {
            log::error!("batch {id}: {e}");
            ApiError::new(ErrorKind::BadGateway, "The batch's provider is unavailable; retry later.")
        })?;
        match provider.cancel(&upstream_id).await {
            Ok(up) => {
                batch.take_upstream(&up);
                if !record::is_terminal(&batch.status) {
                    batch.status = "cancelling".into();
                    batch.times.entry("cancelling_at".into()).or_insert_with(now_unix);
                }
                self.put(&batch).await.map_err(internal)?;
                Ok(batch)
            }
            Err(e) => {
                log::warn!("batch {id}: cancel at {} failed: {e}", batch.provider);
                Err(ApiError::new(ErrorKind::BadGateway, format!("The provider did not cancel the batch: {}", e.message)))
            }
        }
    }

    /// Bring one open batch up to date with the provider, and settle it once it ended.
    async fn refresh(&self, batch: Batch) {
        let lock = self.lock_for(&batch.id);
        let _turn = lock.lock().await;
        // Read again under the lock: another refresh may have moved it on.
        let batch = match self.jobs.get(&batch.id).await {
            Ok(Some(text)) => match Self::read(&text) {
                Some(b) => b,
                None => return,
            },
            Ok(None) => return,
            Err(e) => return log::warn!("batch {}: {e}", batch.id),
        };
        let id = batch.id.clone();
        if let Err(e) = self.refresh_locked(batch).await {
            log::warn!("batch {id}: {e}");
        }
    }

    async fn refresh_locked(&self, mut batch: Batch) -> Result<(), StoreError> {
        if !batch.open() {
            return Ok(());
        }
        if batch.status == SUBMITTING {
            if self.creating.contains(&batch.id) {
                return Ok(());
            }
            // Left so by a process that stopped (or a node that died) while submitting it: the
            // provider may never have got it; failed and refunded, never submitted again.
            return self
                .fail(&mut batch, "interrupted", "The gateway stopped before the provider confirmed this batch; it was not started.")
                .await;
        }
        let provider = match self.provider(&batch) {
            Ok(p) => p,
            Err(e) => {
                log::error!("batch {}: {e}", batch.id);
                return Ok(());
            }
        };
        let Some(upstream_id) = batch.upstream_id.clone() else { return Ok(()) };
        if !record::is_terminal(&batch.status) {
            match provider.retrieve(&upstream_id).await {
                Ok(up) => {
                    batch.take_upstream(&up);
                    if record::is_terminal(&batch.status) {
                        let named = |n: &str| up.get(n).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
                        batch.upstream_output_file = named("output_file_id");
                        batch.upstream_error_file = named("error_file_id");
                    }
                }
                Err(e) if e.is_transient() => log::warn!("batch {}: retrieve failed, will retry: {e}", batch.id),
                Err(e) => log::warn!("batch {}: the provider refused to describe it: {e}", batch.id),
            }
            batch.last_polled_at = now_unix();
        }
        if record::is_terminal(&batch.status) && !batch.settled {
            self.finish(&mut batch, &provider).await?;
        }
        self.put(&batch).await
    }

    /// Copy an ended batch's files into the key's files and settle it from its output. A file
    /// that cannot be had now is tried again at the next round: nothing is settled without it.
    async fn finish(&self, batch: &mut Batch, provider: &upstream::Provider) -> Result<(), StoreError> {
        let mut output = None;
        // The lines a guardrail blocked end the error file (which they make alone when the
        // provider has none).
        let blocked = batch.blocked_lines();
        for which in ["output", "errors"] {
            let upstream_file = if which == "output" { &batch.upstream_output_file } else { &batch.upstream_error_file };
            let ours = if which == "errors" { blocked.as_slice() } else { &[] };
            let (file, len) = match upstream_file.clone() {
                Some(upstream_file) => match provider.download(&upstream_file).await {
                    Ok(f) => f,
                    Err(e) => {
                        log::warn!("batch {}: downloading its {which} file failed, will retry: {e}", batch.id);
                        return Ok(());
                    }
                },
                None if !ours.is_empty() => match tempfile::tempfile() {
                    Ok(f) => (f, 0),
                    Err(e) => {
                        log::warn!("batch {}: writing its {which} file failed, will retry: {e}", batch.id);
                        return Ok(());
                    }
                },
                None => continue,
            };
            let (file, len) = match append(file, len, ours) {
                Ok(done) => done,
                Err(e) => {
                    log::warn!("batch {}: writing its {which} file failed, will retry: {e}", batch.id);
                    return Ok(());
                }
            };
            let file = Arc::new(file);
            let name = format!("{}_{which}.jsonl", batch.id);
            let stored = match self.files.store(&batch.owner, &name, "batch_output", file.clone(), len).await {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("batch {}: keeping its {which} file failed, will retry: {}", batch.id, e.message);
                    return Ok(());
                }
            };
            if which == "output" {
                batch.output_file_id = Some(stored.id);
                output = Some(file);
            } else {
                batch.error_file_id = Some(stored.id);
            }
        }
        // Written (in a fleet: the claim renewed) right before the booking, so that a node
        // that lost its claim while downloading settles nothing: the holder settles it.
        self.put(batch).await?;
        self.settle(batch, output).await
    }

    /// How often an open batch is asked about at its provider: `limits.batch_poll_secs` while it
    /// is young, backing off to a tenth of its age (at most 10 minutes) — a batch runs for up to
    /// a day, and a key's many batches are not each asked about every few seconds.
    fn interval_of(&self, batch: &Batch, now: u64) -> u64 {
        let every = self.poll_every.as_secs();
        (now.saturating_sub(batch.created_at) / 10).clamp(every, MAX_POLL_INTERVAL_SECS.max(every))
    }

    /// One poller round: every open batch this node works on whose last poll is stale.
    pub async fn poll_once(&self) {
        let texts = match self.jobs.open(KIND).await {
            Ok(t) => t,
            Err(e) => return log::warn!("batch poller: {e}"),
        };
        let now = now_unix();
        for batch in texts.iter().filter_map(|t| Self::read(t)) {
            let due = batch.status == SUBMITTING
                || (record::is_terminal(&batch.status) && !batch.settled)
                || now.saturating_sub(batch.last_polled_at) >= self.interval_of(&batch, now);
            if due {
                self.refresh(batch).await;
            }
        }
    }
}

/// `lines` written at the end of `file` (`len` bytes long, a newline put between).
fn append(mut file: std::fs::File, len: u64, lines: &[u8]) -> std::io::Result<(std::fs::File, u64)> {
    use std::io::{Read, Seek, SeekFrom, Write};
    if lines.is_empty() {
        return Ok((file, len));
    }
    let mut len = len;
    if len > 0 {
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            file.write_all(b"\n")?;
            len += 1;
        }
    }
    file.seek(SeekFrom::Start(len))?;
    file.write_all(lines)?;
    file.flush()?;
    file.seek(SeekFrom::Start(0))?;
    Ok((file, len + lines.len() as u64))
}

/// Polls open batches every `limits.batch_poll_secs` until shutdown.
pub struct BatchPoller {
    pub service: Arc<BatchService>,
}

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for BatchPoller {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn routing() -> Routing {
        let text = "listen: 127.0.0.1:8080\nproviders:\n  - { name: oa, protocol: openai, base_url: \"http://127.0.0.1:9\", api_key: k, models: [m] }\nprices:\n  m: { input: 2, output: 8 }\n";
        crate::upstream::routing_for_tests(&crate::config::Config::parse(text, &|_| None).expect("config"))
    }

    #[tokio::test]
    async fn a_settlement_booked_before_a_crash_is_not_booked_again() {
        let dir = tempfile::tempdir().expect("dir");
        let db = crate::store::DbSlot::new(sled::open(dir.path()).expect("db"));
        let ledger = Arc::new(crate::billing::ledger::Ledger::open(db.clone()).expect("ledger"));
        ledger.open_account("key_b", 10_000_000_000).await.expect("account");
        let jobs: Arc<dyn JobStore> = Arc::new(crate::store::sled::jobs::SledJobs::new(db).expect("jobs"));
        let files = Arc::new(FileService::new(dir.path(), None, false));
        let svc = BatchService::new(
            jobs,
            Books::new(ledger.clone()),
            Arc::default(),
            files,
            Arc::new(ArcSwap::from_pointee(routing())),
            Duration::from_secs(1),
        );
        let mut batch: Batch = serde_json::from_value(serde_json::json!({
            "id": "batch_x", "owner": "key_b", "created_at": 1, "endpoint": "/v1/chat/completions", "input_file_id": "file-1",
            "completion_window": "24h", "model": "m", "provider": "oa", "status": "completed", "hold_nanos": 1_000_000,
        }))
        .expect("batch");
        let mut out = tempfile::tempfile().expect("file");
        writeln!(
            out,
            r#"{{"custom_id":"a","response":{{"status_code":200,"body":{{"usage":{{"prompt_tokens":100,"completion_tokens":10}}}}}}}}"#
        )
        .expect("write");
        let out = Arc::new(out);
        svc.settle(&mut batch, Some(out.clone())).await.expect("settle");
        // Half of $2 and $8 per 1M: 100 × 1000 + 10 × 4000 nano-USD, less the hold it replaces.
        assert_eq!(batch.cost_nanos, 140_000);
        let after_first = ledger.balance("key_b").await.expect("balance");
        assert_eq!(after_first, 10_000_000_000 - (140_000 - 1_000_000));
        // The process stopped before the settled state was written: settled again, booked once.
        batch.settled = false;
        svc.settle(&mut batch, Some(out)).await.expect("settle again");
        assert!(batch.settled);
        assert_eq!(ledger.balance("key_b").await.expect("balance"), after_first);
    }
}
