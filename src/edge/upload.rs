//! Uploads: a `multipart/form-data` body read as it arrives by a streaming parser (`multer`)
//! under bounds — its total size (`limits.max_upload_bytes`, 413), its number of parts
//! ([`MAX_PARTS`]), a text field's size ([`MAX_FIELD_BYTES`]), a part's headers
//! ([`MAX_PART_HEAD`]), the time between two of its chunks
//! (`body_read_timeout_secs`) and its pace ([`MIN_UPLOAD_BYTES_PER_SEC`] on average once
//! [`UPLOAD_GRACE`] has passed: a body trickled in a byte at a time cannot hold its share for
//! long; 408 either way). Text fields are kept in memory, counted against the process's budget
//! of buffered body bytes (`max_buffered_body_bytes`); files go to unnamed temporary files as
//! they arrive, never whole into memory, counted as they arrive against the process-wide budget
//! of spooled bytes (`limits.max_spooled_bytes`) and the key's share of it (a quarter, or one
//! upload's worth when that is more) — 503 with `Retry-After` when either is full, so no key
//! holds every tenant's uploads off. A malformed body is a 400 naming the part.

use crate::edge::body::Reservation;
use crate::protocol::multipart::{FilePart, Form};
use crate::protocol::{ApiError, ErrorKind};
use bytes::Bytes;
use pingora_proxy::Session;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The bounds an upload is read under.
#[derive(Debug, Clone)]
pub struct UploadLimits {
    pub max_bytes: u64,
    /// The longest wait for the next chunk of the body.
    pub idle_timeout: Duration,
    /// The disk every upload in flight may take together (`limits.max_spooled_bytes`): past it,
    /// 503 with `Retry-After`.
    pub spool: Arc<crate::edge::body::BodyBudget>,
    /// Each key's share of `spool`.
    pub spool_per_key: Arc<crate::edge::body::KeyBudgets>,
    /// The process's budget of buffered body bytes (text fields are held in memory).
    pub memory: Arc<crate::edge::body::BodyBudget>,
}

impl UploadLimits {
    pub fn new(max_bytes: u64, idle_timeout: Duration, max_spooled: u64, memory: Arc<crate::edge::body::BodyBudget>) -> UploadLimits {
        let spooled = usize::try_from(max_spooled).unwrap_or(usize::MAX);
        let per_key = (spooled / 4).max(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        UploadLimits {
            max_bytes,
            idle_timeout,
            spool: crate::edge::body::BodyBudget::new(spooled),
            spool_per_key: Arc::new(crate::edge::body::KeyBudgets::new(per_key)),
            memory,
        }
    }
}

/// The most bytes a part's headers may take (with the boundary before them): far above any real
/// form's (a few hundred bytes).
pub const MAX_PART_HEAD: u64 = 16 << 10;

/// The slowest average pace an upload may keep once [`UPLOAD_GRACE`] has passed.
pub const MIN_UPLOAD_BYTES_PER_SEC: u64 = 16 << 10;

/// How long an upload may take before its pace counts.
pub const UPLOAD_GRACE: Duration = Duration::from_secs(30);

/// The most parts a form may have.
pub const MAX_PARTS: usize = 64;

/// The largest text field of a form (a prompt, a model name).
pub const MAX_FIELD_BYTES: usize = 64 << 10;

/// Parts read as files even when they name no file name (`curl -F file=<a.mp3` sends none).
const FILE_PARTS: [&str; 6] = ["file", "image", "image[]", "mask", "input_reference", "video"];

/// Why the client's body stopped (the stream's error, read back by [`refusal`]).
#[derive(Debug)]
enum Intake {
    Timeout,
    TooSlow,
    HeadersTooLarge,
    Read(&'static str),
}

impl std::fmt::Display for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Intake::Timeout => write!(f, "timeout"),
            Intake::TooSlow => write!(f, "too slow"),
            Intake::HeadersTooLarge => write!(f, "part headers too large"),
            Intake::Read(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Intake {}

/// Read a `multipart/form-data` body with `boundary` from `session` for key `key_id`. The
/// form's files hold their share of the spool budget (the process's and the key's), and its
/// text fields their share of the memory budget, until the reservation is dropped (once they
/// were sent).
pub async fn read_form(
    session: &mut Session,
    limits: &UploadLimits,
    boundary: &str,
    key_id: &str,
) -> Result<(Form, Reservation), ApiError> {
    let declared = crate::protocol::header_str(session.req_header(), "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_bytes) {
        return Err(too_large(limits.max_bytes, None));
    }
    // What the body holds is reserved as it arrives, never on the strength of a declared
    // length alone: a client has to send the bytes it holds the budget with.
    let mut reservation = Holding {
        spool: limits.spool.reservation(),
        mine: limits.spool_per_key.of(key_id).reservation(),
        memory: limits.memory.reservation(),
    };
    crate::edge::body::continue_if_expected(session).await?;
    let idle = limits.idle_timeout;
    let started = tokio::time::Instant::now();
    // The state: the session and the bytes it sent so far.
    let chunks = futures_util::stream::unfold((session, 0u64), move |(s, so_far)| async move {
        // The next chunk within the idle bound, and before the body's average pace falls under
        // the minimum.
        let pace_deadline = started + UPLOAD_GRACE + Duration::from_secs(so_far / MIN_UPLOAD_BYTES_PER_SEC);
        let idle_deadline = tokio::time::Instant::now() + idle;
        let slow = pace_deadline < idle_deadline;
        match tokio::time::timeout_at(pace_deadline.min(idle_deadline), s.read_request_body()).await {
            Ok(Ok(Some(chunk))) => {
                let sent = so_far + chunk.len() as u64;
                Some((Ok::<Bytes, Intake>(chunk), (s, sent)))
            }
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(Intake::Read(e.etype().as_str())), (s, so_far))),
            Err(_) if slow => Some((Err(Intake::TooSlow), (s, so_far))),
            Err(_) => Some((Err(Intake::Timeout), (s, so_far))),
        }
    });
    let heads = Arc::new(Heads::default());
    let chunks = OneAtATime { inner: Box::pin(chunks), paused: false, heads: heads.clone() };
    let constraints = multer::Constraints::new().size_limit(multer::SizeLimit::new().whole_stream(limits.max_bytes));
    let mut parts = multer::Multipart::with_constraints(chunks, boundary.to_string(), constraints);
    let mut form = Form::default();
    let mut index = 0;
    loop {
        heads.begin();
        let field = match parts.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => return Err(refusal(e, index, limits)),
        };
        heads.end();
        index += 1;
        if index > MAX_PARTS {
            return Err(ApiError::new(ErrorKind::BadRequest, format!("The form has more than {MAX_PARTS} parts.")));
        }
        let name = field.name().unwrap_or_default().to_string();
        if name.is_empty() {
            return Err(ApiError::new(ErrorKind::BadRequest, format!("Part {index} of the form has no name.")));
        }
        let filename = field.file_name().map(str::to_string);
        let content_type = field.content_type().map(ToString::to_string);
        if filename.is_some() || FILE_PARTS.contains(&name.as_str()) {
            let spooled: u64 = form.files.iter().map(|f| f.len).sum();
            let (spool, len) = spool(field, &name, index, limits, (&mut reservation, spooled)).await?;
            form.files.push(FilePart { name, filename, content_type, len, spool: Arc::new(spool), played_ms: None });
        } else {
            let value = text(field, &name, index, limits, &mut reservation.memory).await?;
            form.fields.push((name, value));
        }
    }
    let Holding { spool, mine, memory } = reservation;
    Ok((form, spool.with(mine).with(memory)))
}

/// What an upload holds while it is read: the process's spool, the key's share of it, memory.
struct Holding {
    spool: Reservation,
    mine: Reservation,
    memory: Reservation,
}

/// The client's chunks handed to the parser one per poll. `multer` reads its stream until it is
/// pending, so a fast client's whole body would gather in its buffer before a field sees any
/// of it (measured: +16 MiB of peak memory for a 20 MiB upload); pausing after each chunk lets
/// the spool take it first.
///
/// It also bounds what the parser holds looking for a part's headers: while the form is between
/// two fields, no more is handed over once [`MAX_PART_HEAD`] bytes have been without the headers
/// ending (the parser would hold them all, up to the whole body).
struct OneAtATime<S> {
    inner: std::pin::Pin<Box<S>>,
    paused: bool,
    heads: Arc<Heads>,
}

/// Whether the form is between two fields (reading a part's headers), and the bytes handed to
/// the parser since.
#[derive(Default)]
struct Heads {
    between: std::sync::atomic::AtomicBool,
    since: std::sync::atomic::AtomicU64,
}

impl Heads {
    fn begin(&self) {
        self.since.store(0, std::sync::atomic::Ordering::Relaxed);
        self.between.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn end(&self) {
        self.between.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the parser has been handed too much looking for one part's headers.
    fn too_long(&self) -> bool {
        self.between.load(std::sync::atomic::Ordering::Relaxed) && self.since.load(std::sync::atomic::Ordering::Relaxed) > MAX_PART_HEAD
    }

    fn handed(&self, n: usize) {
        if self.between.load(std::sync::atomic::Ordering::Relaxed) {
            self.since.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl<S: futures_util::Stream<Item = Result<Bytes, Intake>>> futures_util::Stream for OneAtATime<S> {
    type Item = S::Item;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<S::Item>> {
        if std::mem::take(&mut self.paused) {
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        if self.heads.too_long() {
            return std::task::Poll::Ready(Some(Err(Intake::HeadersTooLarge)));
        }
        let next = self.inner.as_mut().poll_next(cx);
        if let std::task::Poll::Ready(Some(Ok(chunk))) = &next {
            self.heads.handed(chunk.len());
        }
        self.paused = matches!(next, std::task::Poll::Ready(Some(_)));
        next
    }
}

/// A text field's value: UTF-8, at most [`MAX_FIELD_BYTES`], held against the memory budget.
async fn text(
    mut field: multer::Field<'_>,
    name: &str,
    index: usize,
    limits: &UploadLimits,
    memory: &mut Reservation,
) -> Result<String, ApiError> {
    let mut value = Vec::new();
    loop {
        match field.chunk().await {
            Ok(Some(chunk)) => {
                if value.len() + chunk.len() > MAX_FIELD_BYTES {
                    return Err(ApiError::new(ErrorKind::BadRequest, format!("The form field '{name}' is over {MAX_FIELD_BYTES} bytes."))
                        .with_param(name));
                }
                if !memory.grow(chunk.len()) {
                    return Err(crate::edge::body::busy());
                }
                value.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Err(refusal(e, index, limits)),
        }
    }
    String::from_utf8(value)
        .map_err(|_| ApiError::new(ErrorKind::BadRequest, format!("The form field '{name}' is not UTF-8 text.")).with_param(name))
}

/// A file part written to an unnamed temporary file as it arrives; its length.
async fn spool(
    mut field: multer::Field<'_>,
    name: &str,
    index: usize,
    limits: &UploadLimits,
    (reservation, before): (&mut Holding, u64),
) -> Result<(std::fs::File, u64), ApiError> {
    let disk = |e: std::io::Error| {
        log::error!("upload: cannot write the part '{name}' to a temporary file: {e}");
        ApiError::new(ErrorKind::Overloaded, "The gateway cannot take uploads right now; retry shortly.")
    };
    let file = tempfile::tempfile().map_err(disk)?;
    let mut writer = tokio::fs::File::from_std(file.try_clone().map_err(disk)?);
    let mut len = 0u64;
    loop {
        match field.chunk().await {
            Ok(Some(chunk)) => {
                // The form's files so far, this chunk included, within what is reserved: in the
                // process's spool and in the key's share of it.
                let needed = usize::try_from(before + len + chunk.len() as u64).unwrap_or(usize::MAX);
                for r in [&mut reservation.spool, &mut reservation.mine] {
                    if needed > r.bytes() && !r.grow(needed - r.bytes()) {
                        return Err(crate::edge::body::busy());
                    }
                }
                len += chunk.len() as u64;
                writer.write_all(&chunk).await.map_err(disk)?;
            }
            Ok(None) => break,
            Err(e) => return Err(refusal(e, index, limits)),
        }
    }
    writer.flush().await.map_err(disk)?;
    Ok((file, len))
}

fn too_large(limit: u64, part: Option<&str>) -> ApiError {
    let e = ApiError::new(ErrorKind::PayloadTooLarge, format!("The upload exceeds the limit of {limit} bytes."));
    match part {
        Some(p) => e.with_param(p),
        None => e,
    }
}

/// A parser's error as the client is told it: the part it is about (by name, else by number).
fn refusal(e: multer::Error, index: usize, limits: &UploadLimits) -> ApiError {
    use multer::Error as M;
    let part = |name: Option<&str>| match name {
        Some(n) if !n.is_empty() => format!("part '{n}'"),
        _ => format!("part {}", index + 1),
    };
    let bad = |why: String| ApiError::new(ErrorKind::BadRequest, format!("The multipart body cannot be read: {why}."));
    match e {
        M::StreamSizeExceeded { .. } => too_large(limits.max_bytes, None),
        M::FieldSizeExceeded { field_name, .. } => too_large(limits.max_bytes, field_name.as_deref()),
        M::IncompleteFieldData { field_name } => {
            let e = bad(format!("it ends inside {}", part(field_name.as_deref())));
            match field_name {
                Some(n) => e.with_param(&n),
                None => e,
            }
        }
        M::IncompleteHeaders | M::ReadHeaderFailed(_) => bad(format!("the headers of {} are malformed", part(None))),
        M::DecodeHeaderName { name, .. } => bad(format!("{} has a malformed header '{name}'", part(None))),
        M::DecodeHeaderValue { .. } | M::DecodeContentType(_) => bad(format!("{} has a malformed header value", part(None))),
        M::IncompleteStream => bad("it ends before its closing boundary".into()),
        M::StreamReadFailed(inner) => match inner.downcast_ref::<Intake>() {
            Some(Intake::Timeout) => ApiError::new(
                ErrorKind::RequestTimeout,
                format!("The upload stalled: nothing arrived for {} seconds.", limits.idle_timeout.as_secs()),
            ),
            Some(Intake::TooSlow) => ApiError::new(
                ErrorKind::RequestTimeout,
                format!("The upload is too slow: under {} KiB a second on average.", MIN_UPLOAD_BYTES_PER_SEC >> 10),
            ),
            Some(Intake::HeadersTooLarge) => ApiError::new(
                ErrorKind::BadRequest,
                format!("The multipart body cannot be read: a part's headers take over {} KiB.", MAX_PART_HEAD >> 10),
            ),
            _ => ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {inner}")),
        },
        other => bad(other.to_string()),
    }
}
