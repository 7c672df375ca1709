//! Request-body intake: every body tollgate buffers (to route by its model, to validate a
//! video task) is read here, under three bounds: its size (`max_body_bytes`, 413), the time
//! the client takes to send it (`body_read_timeout_secs`, 408) and a process-wide budget of
//! buffered body bytes (`max_buffered_body_bytes`, 503 with `Retry-After`), so that no number
//! of large or slow requests can take the memory of the host.

use crate::protocol::{header_str, ApiError, ErrorKind};
use bytes::{Bytes, BytesMut};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Process-wide budget of buffered request-body bytes.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget { limit, used: AtomicUsize::new(0) })
    }

    /// Bytes currently reserved.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// An empty reservation, grown as the body arrives.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation { budget: self.clone(), bytes: 0, also: Vec::new() }
    }

    fn take(&self, n: usize) -> bool {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(n).filter(|&total| total <= self.limit)).is_ok()
    }
}

/// Bytes of the budget held by one request; given back when dropped (with the reservations of
/// other budgets it carries: an upload's memory, its key's share of the spool).
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
    also: Vec<Reservation>,
}

impl Reservation {
    /// Hold `n` more bytes; false (and nothing held) when the budget has no room.
    pub fn grow(&mut self, n: usize) -> bool {
        if self.budget.take(n) {
            self.bytes += n;
            true
        } else {
            false
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Hold exactly `n` bytes: more when the budget has room (false, and nothing more held, when
    /// it has not), or give back what is held beyond `n`.
    pub fn resize(&mut self, n: usize) -> bool {
        if n > self.bytes {
            return self.grow(n - self.bytes);
        }
        self.budget.used.fetch_sub(self.bytes - n, Ordering::AcqRel);
        self.bytes = n;
        true
    }

    /// This reservation carrying `other` too: both are given back together.
    pub fn with(mut self, other: Reservation) -> Reservation {
        self.also.push(other);
        self
    }
}

/// A budget per key — its share of the spool, the realtime sessions it may hold open —, made
/// when a key first needs it and forgotten once none of its reservations is held.
#[derive(Debug)]
pub struct KeyBudgets {
    per_key: usize,
    map: std::sync::Mutex<std::collections::HashMap<String, Arc<BodyBudget>>>,
}

impl KeyBudgets {
    pub fn new(per_key: usize) -> KeyBudgets {
        KeyBudgets { per_key, map: std::sync::Mutex::new(std::collections::HashMap::new()) }
    }

    /// `key_id`'s budget.
    pub fn of(&self, key_id: &str) -> Arc<BodyBudget> {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, b| Arc::strong_count(b) > 1 || b.used() > 0);
        map.entry(key_id.to_string()).or_insert_with(|| BodyBudget::new(self.per_key)).clone()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The bounds a body is read under.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub read_timeout: Duration,
    pub budget: Arc<BodyBudget>,
}

/// A body read whole, with the budget it holds until dropped.
#[derive(Debug)]
pub struct ClientBody {
    pub bytes: Bytes,
    pub reservation: Reservation,
}

/// Seconds a client refused for want of budget is told to wait.
const BUSY_RETRY_AFTER_SECS: u64 = 1;

fn too_large(limit: usize) -> ApiError {
    ApiError::new(ErrorKind::PayloadTooLarge, format!("The request body exceeds the limit of {limit} bytes."))
}

/// 503 with `Retry-After`: the budget of bytes held for request bodies (in memory, or spooled
/// uploads on disk) is full.
pub fn busy() -> ApiError {
    let mut e =
        ApiError::new(ErrorKind::Overloaded, "The gateway is receiving more request data than it can hold right now; retry shortly.");
    e.retry_after = Some(BUSY_RETRY_AFTER_SECS);
    e
}

fn unreadable(e: &pingora_error::Error) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {}", e.etype().as_str()))
}

/// Read the whole request body within `limits`. A declared `Content-Length` is checked and
/// reserved before anything is read (and read into one buffer of that size); a chunked body
/// reserves as it arrives. The caller closes the connection on an error (the rest of the body
/// is unread).
pub async fn read(session: &mut Session, limits: &BodyLimits) -> Result<ClientBody, ApiError> {
    let deadline = tokio::time::Instant::now() + limits.read_timeout;
    let mut reservation = limits.budget.reservation();
    let declared = header_str(session.req_header(), "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared {
        if n > limits.max_bytes as u64 {
            return Err(too_large(limits.max_bytes));
        }
        // n ≤ max_bytes, a usize.
        if !reservation.grow(n as usize) {
            return Err(busy());
        }
    }
    // The checks passed: tell a client that waits for it (curl does above 1 MiB) to send.
    continue_if_expected(session).await?;
    let mut buf: Option<BytesMut> = None;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, session.read_request_body()).await {
            Ok(read) => read.map_err(|e| unreadable(&e))?,
            Err(_) => {
                return Err(ApiError::new(
                    ErrorKind::RequestTimeout,
                    format!("The request body was not received within {} seconds.", limits.read_timeout.as_secs()),
                ))
            }
        };
        let Some(chunk) = chunk else { break };
        let total = buf.as_ref().map_or(0, BytesMut::len) + chunk.len();
        if total > limits.max_bytes {
            return Err(too_large(limits.max_bytes));
        }
        if total > reservation.bytes() && !reservation.grow(total - reservation.bytes()) {
            return Err(busy());
        }
        if buf.is_none() && session.is_body_done() {
            // The whole body in one chunk (the common case): no copy.
            return Ok(ClientBody { bytes: chunk, reservation });
        }
        // One buffer of the declared size (or growing, for a chunked body).
        buf.get_or_insert_with(|| BytesMut::with_capacity(reservation.bytes().max(chunk.len()))).extend_from_slice(&chunk);
    }
    Ok(ClientBody { bytes: buf.map_or_else(Bytes::new, BytesMut::freeze), reservation })
}

/// A client that sent `Expect: 100-continue` (curl does above 1 MiB) is told to send its body.
pub async fn continue_if_expected(session: &mut Session) -> Result<(), ApiError> {
    let expects_continue = header_str(session.req_header(), "expect").is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        let write = async {
            let continue_header = ResponseHeader::build(100, Some(0))?;
            session.write_response_header(Box::new(continue_header), false).await
        };
        write.await.map_err(|e| unreadable(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back_when_dropped() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reservation();
        let mut b = budget.reservation();
        assert!(a.grow(60));
        assert!(!b.grow(41), "over the budget");
        assert_eq!(b.bytes(), 0);
        assert!(b.grow(40));
        assert_eq!(budget.used(), 100);
        assert!(!a.grow(1));
        drop(a);
        assert_eq!(budget.used(), 40);
        assert!(b.grow(60));
        assert!(b.resize(30));
        assert_eq!((b.bytes(), budget.used()), (30, 30));
        assert!(!b.resize(101) && b.bytes() == 30);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn each_key_has_its_own_budget_given_back_when_its_reservations_drop() {
        let budgets = KeyBudgets::new(2);
        let mut a = budgets.of("a").reservation();
        assert!(a.grow(2) && !a.grow(1), "a key's share is its own bound");
        let mut b = budgets.of("b").reservation();
        assert!(b.grow(2), "another key is not held off");
        drop(a);
        assert!(budgets.of("a").reservation().grow(2));
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_budget() {
        let budget = BodyBudget::new(1000);
        let held: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    let budget = budget.clone();
                    s.spawn(move || {
                        let mut r = budget.reservation();
                        let mut got = 0;
                        for _ in 0..100 {
                            if r.grow(7) {
                                got += 7;
                            }
                        }
                        (r, got)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let total: usize = held.iter().map(|(_, g)| g).sum();
        assert!(total <= 1000 && total > 1000 - 7, "{total}");
        assert_eq!(budget.used(), total);
        drop(held);
        assert_eq!(budget.used(), 0);
    }
}
