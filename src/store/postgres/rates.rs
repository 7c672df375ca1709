//! Rate limits that hold for the sum of all nodes, over one-minute windows by the database's
//! clock (as the single node counts one-minute windows).
//!
//! * **Requests per minute: exact.** Like money, a node leases a share of the key's window —
//!   an eighth of what is left, at least one request — in one locked transaction, and admits
//!   locally while its share lasts; the database never grants more than `rpm` in a window. A
//!   request refused while other nodes still hold unused shares is the only error: at most the
//!   unused part of their shares (each at most an eighth of the window's allowance when taken).
//!   A window's lease also counts the previous window's grants still inside the last sixty
//!   seconds (weighted by the part of that window not yet past, the sliding-window estimate), so
//!   a minute boundary does not open a second full window: across a boundary the fleet admits
//!   at most `rpm` plus what the estimate misses when the previous minute's requests bunched
//!   at its end.
//! * **Tokens per minute: within one sync interval and the other nodes' requests in flight.**
//!   Tokens are known only after a request, so each node adds its spend to the window's shared
//!   counter in batches ([`FleetRates::flush`], every `sync_ms`) and admits a request while the
//!   fleet's total it last read, its own unflushed spend, the tokens its requests in flight are
//!   held for and the new request's own stay within `tpm`. The fleet can overrun `tpm` by what
//!   the other nodes spent since their last flush (one `sync_ms` of their traffic) plus what
//!   their requests in flight are held for.
//! * **Requests in flight** (`max_concurrent`): leased slots, see [`FleetSlots`].

use super::{Pg, PgError};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What admission decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Over the limit until the window ends in this many seconds (at least 1).
    Refused {
        retry_after_secs: u64,
    },
}

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// The database's window number (unix minutes).
    number: i64,
    /// When it ends, on this node's clock.
    ends: Option<Instant>,
    /// Requests this node was granted in it, and admitted.
    granted: i64,
    admitted: i64,
    /// The fleet's tokens in it as last read, and this node's spend not yet written.
    fleet_tokens: i64,
    unflushed_tokens: i64,
    /// This node's spend on its way to the database in a flush under way: still counted here.
    flushing_tokens: i64,
    /// Tokens this node's requests in flight are held for (reserved until they settle).
    in_flight_tokens: i64,
    /// The key has a `tpm` here: its tokens are flushed every sync while it is in use.
    counts_tokens: bool,
    last_used: Option<Instant>,
}

impl Window {
    fn current(&self) -> bool {
        self.ends.is_some_and(|t| Instant::now() < t)
    }

    fn secs_left(&self) -> u64 {
        self.ends.map_or(1, |t| t.saturating_duration_since(Instant::now()).as_secs().max(1))
    }

    /// Take what the database says window `number` is (ending in `secs_left` from `sent`);
    /// an older window than the one known here changes nothing.
    fn at(&mut self, number: i64, sent: Instant, secs_left: f64) -> bool {
        if number < self.number {
            return false;
        }
        if number != self.number {
            *self = Window {
                number,
                counts_tokens: self.counts_tokens,
                last_used: self.last_used,
                unflushed_tokens: self.unflushed_tokens,
                flushing_tokens: self.flushing_tokens,
                in_flight_tokens: self.in_flight_tokens,
                ..Window::default()
            };
        }
        self.ends = Some(sent + Duration::from_secs_f64(secs_left.clamp(0.0, 60.0)));
        true
    }
}

/// A key quiet on this node for this long is forgotten (its windows have ended).
const FORGET_AFTER: Duration = Duration::from_secs(120);

/// The fleet's request and token counts per key, as this node sees them. The counts are
/// behind a std mutex held only for memory work: no request waits for a database statement
/// it does not need itself. Lease requests for `rpm` go one at a time.
pub struct FleetRates {
    pg: Pg,
    windows: std::sync::Mutex<HashMap<String, Window>>,
    leasing: tokio::sync::Mutex<()>,
}

impl FleetRates {
    pub fn new(pg: Pg) -> Self {
        FleetRates { pg, windows: std::sync::Mutex::new(HashMap::new()), leasing: tokio::sync::Mutex::new(()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Window>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit from this node's share of the current window, if it has one left.
    fn admit_locally(&self, key_id: &str) -> bool {
        let mut windows = self.lock();
        let Some(w) = windows.get_mut(key_id) else { return false };
        w.last_used = Some(Instant::now());
        if w.current() && w.admitted < w.granted {
            w.admitted += 1;
            return true;
        }
        false
    }

    /// Count one request of `key_id` against `rpm` for the fleet.
    pub async fn admit_request(&self, key_id: &str, rpm: u32) -> Result<Admission, PgError> {
        if self.admit_locally(key_id) {
            return Ok(Admission::Admitted);
        }
        let _leasing = self.leasing.lock().await;
        // Another request may have leased meanwhile.
        if self.admit_locally(key_id) {
            return Ok(Admission::Admitted);
        }
        let sent = Instant::now();
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_one("SELECT floor(extract(epoch FROM now()) / 60)::BIGINT, 60 - (extract(epoch FROM now())::numeric % 60)::float8", &[])
            .await?;
        let (number, secs_left): (i64, f64) = (row.get(0), row.get(1));
        tx.execute("INSERT INTO rate_windows (key_id, window_start) VALUES ($1, $2) ON CONFLICT DO NOTHING", &[&key_id, &number]).await?;
        let granted_so_far: i64 = tx
            .query_one("SELECT requests_granted FROM rate_windows WHERE key_id = $1 AND window_start = $2 FOR UPDATE", &[&key_id, &number])
            .await?
            .get(0);
        // The previous minute's grants, weighted by its part still inside the last 60 s.
        let previous: i64 = tx
            .query_one(
                "SELECT COALESCE((SELECT requests_granted FROM rate_windows WHERE key_id = $1 AND window_start = $2), 0)::BIGINT",
                &[&key_id, &(number - 1)],
            )
            .await?
            .get(0);
        let carried = sliding_share(previous, secs_left);
        let left = i64::from(rpm) - granted_so_far - carried;
        let grant = if left > 0 { (left / 8).max(1) } else { 0 };
        if grant > 0 {
            tx.execute(
                "UPDATE rate_windows SET requests_granted = requests_granted + $3 WHERE key_id = $1 AND window_start = $2",
                &[&key_id, &number, &grant],
            )
            .await?;
        }
        tx.commit().await?;
        self.pg.count(5);
        let mut windows = self.lock();
        let w = windows.entry(key_id.to_string()).or_default();
        w.last_used = Some(Instant::now());
        if !w.at(number, sent, secs_left) {
            // The database is in a later window than this grant's already: the grant is unused.
            return Ok(Admission::Refused { retry_after_secs: 1 });
        }
        w.granted += grant;
        if w.admitted < w.granted {
            w.admitted += 1;
            Ok(Admission::Admitted)
        } else {
            Ok(Admission::Refused { retry_after_secs: w.secs_left() })
        }
    }

    /// Whether `key_id` may make another request under `tpm` (the fleet's spend as last read
    /// plus this node's unflushed spend and its requests in flight).
    pub async fn admit_tokens(&self, key_id: &str, tpm: u64) -> Admission {
        self.reserve_tokens(key_id, tpm, 0)
    }

    /// Reserve the `tokens` a request of `key_id` is held for under `tpm` until
    /// [`Self::release_tokens`]: refused when the window's spend (as this node knows it) plus
    /// this node's requests in flight and this one would pass the limit.
    pub fn reserve_tokens(&self, key_id: &str, tpm: u64, tokens: u64) -> Admission {
        let mut windows = self.lock();
        let w = windows.entry(key_id.to_string()).or_default();
        w.counts_tokens = true;
        w.last_used = Some(Instant::now());
        let spent = if w.current() { w.fleet_tokens } else { 0 } + w.flushing_tokens + w.unflushed_tokens;
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
        let wanted = spent.saturating_add(w.in_flight_tokens).saturating_add(tokens).max(0) as u64;
        // With nothing to reserve (an admission check), a limit reached exactly refuses too.
        if wanted > tpm || (tokens == 0 && wanted >= tpm) {
            return Admission::Refused { retry_after_secs: w.secs_left() };
        }
        w.in_flight_tokens = w.in_flight_tokens.saturating_add(tokens);
        Admission::Admitted
    }

    /// A request's reservation ends (it settled, or never went out).
    pub fn release_tokens(&self, key_id: &str, tokens: u64) {
        if let Some(w) = self.lock().get_mut(key_id) {
            w.in_flight_tokens = (w.in_flight_tokens - i64::try_from(tokens).unwrap_or(i64::MAX)).max(0);
        }
    }

    /// Tokens a request of `key_id` (a key with a `tpm`) used.
    pub async fn spend_tokens(&self, key_id: &str, tokens: u64) {
        let mut windows = self.lock();
        let w = windows.entry(key_id.to_string()).or_default();
        w.counts_tokens = true;
        w.last_used = Some(Instant::now());
        w.unflushed_tokens = w.unflushed_tokens.saturating_add(i64::try_from(tokens).unwrap_or(i64::MAX));
    }

    /// Add this node's token spend to the fleet's windows and read their totals back, for the
    /// keys with a `tpm` in use here; forget keys quiet for two minutes. The spend is moved
    /// from unflushed to flushing before the statements (admission counts both), and back if
    /// they fail.
    pub async fn flush(&self) -> Result<(), PgError> {
        let pending: Vec<(String, i64)> = {
            let mut windows = self.lock();
            windows.retain(|_, w| {
                w.unflushed_tokens != 0
                    || w.flushing_tokens != 0
                    || w.in_flight_tokens != 0
                    || w.last_used.is_some_and(|t| t.elapsed() < FORGET_AFTER)
            });
            windows
                .iter_mut()
                .filter(|(_, w)| w.counts_tokens)
                .map(|(key_id, w)| {
                    let tokens = std::mem::take(&mut w.unflushed_tokens);
                    w.flushing_tokens += tokens;
                    (key_id.clone(), tokens)
                })
                .collect()
        };
        if pending.is_empty() {
            return Ok(());
        }
        let mut written = 0;
        let result = self.write_tokens(&pending, &mut written).await;
        // What was not written goes back from flushing to unflushed.
        let mut windows = self.lock();
        for (key_id, tokens) in &pending[written..] {
            let w = windows.entry(key_id.clone()).or_default();
            w.flushing_tokens -= tokens;
            w.unflushed_tokens += tokens;
        }
        result
    }

    /// Write `pending` in order, counting in `written` those the database took.
    async fn write_tokens(&self, pending: &[(String, i64)], written: &mut usize) -> Result<(), PgError> {
        let client = self.pg.client().await?;
        for (key_id, tokens) in pending {
            let sent = Instant::now();
            let row = client
                .query_one(
                    "INSERT INTO rate_windows (key_id, window_start, tokens)
                     VALUES ($1, floor(extract(epoch FROM now()) / 60)::BIGINT, $2)
                     ON CONFLICT (key_id, window_start) DO UPDATE SET tokens = rate_windows.tokens + EXCLUDED.tokens
                     RETURNING window_start, tokens, 60 - (extract(epoch FROM now())::numeric % 60)::float8",
                    &[key_id, tokens],
                )
                .await?;
            *written += 1;
            self.pg.count(1);
            let (number, fleet, secs_left): (i64, i64, f64) = (row.get(0), row.get(1), row.get(2));
            let mut windows = self.lock();
            let w = windows.entry(key_id.clone()).or_default();
            w.flushing_tokens -= tokens;
            if w.at(number, sent, secs_left) {
                w.fleet_tokens = fleet;
            }
        }
        Ok(())
    }
}

/// The part of the previous minute's `granted` requests still inside the sliding minute that
/// ends now, with `secs_left` of the current minute to go (rounded down: the estimate's error is
/// the tolerance the module doc states).
fn sliding_share(granted: i64, secs_left: f64) -> i64 {
    let inside = (secs_left / 60.0).clamp(0.0, 1.0);
    (granted as f64 * inside).floor() as i64
}

/// `max_concurrent` for the sum of all nodes: each node leases request slots of a key (an
/// eighth of what is free, at least one) under a per-key advisory lock, admits locally while
/// its slots last, gives back slots it has not used for half a lease, and renews its leases;
/// slots of a lease that expired (a dead node) are free again, by the database's clock. A lease
/// is used only until half its lifetime after the statement that extended it was sent
/// (fencing). Bound: requests still running on a node whose lease expired (it was cut off from
/// the database) can exceed the limit by that node's requests in flight; otherwise in flight ≤
/// `max_concurrent` across the fleet.
pub struct FleetSlots {
    pg: Pg,
    node: String,
    lease_for: Duration,
    /// This node's slots, locked only for memory work.
    keys: std::sync::Mutex<HashMap<String, SlotLease>>,
    /// Lease requests and renewals one at a time, so their local updates apply in the order
    /// their statements ran.
    leasing: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default, Clone, Copy)]
struct SlotLease {
    granted: i64,
    in_flight: i64,
    fresh_until: Option<Instant>,
    last_used: Option<Instant>,
}

impl SlotLease {
    fn take(&mut self) -> bool {
        let fresh = self.fresh_until.is_some_and(|t| Instant::now() < t);
        if fresh && self.in_flight < self.granted {
            self.in_flight += 1;
            return true;
        }
        false
    }
}

impl FleetSlots {
    pub fn new(pg: Pg, node: &str, lease_for: Duration) -> Self {
        FleetSlots {
            pg,
            node: node.to_string(),
            lease_for,
            keys: std::sync::Mutex::new(HashMap::new()),
            leasing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SlotLease>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_locally(&self, key_id: &str) -> bool {
        let mut keys = self.lock();
        let lease = keys.entry(key_id.to_string()).or_default();
        lease.last_used = Some(Instant::now());
        lease.take()
    }

    /// Take a slot of `key_id` under `max` for the fleet; false when all are taken.
    pub async fn enter(&self, key_id: &str, max: u32) -> Result<bool, PgError> {
        if self.take_locally(key_id) {
            return Ok(true);
        }
        let _leasing = self.leasing.lock().await;
        if self.take_locally(key_id) {
            return Ok(true);
        }
        let sent = Instant::now();
        let lease_ms = self.lease_for.as_millis() as f64;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key_id]).await?;
        let others: i64 = tx
            .query_one(
                "SELECT COALESCE(SUM(slots), 0)::BIGINT FROM concurrency_leases WHERE key_id = $1 AND node_id <> $2 AND expires_at > now()",
                &[&key_id, &self.node],
            )
            .await?
            .get(0);
        // A stale lease of this node counts only for what is in flight on it; slots that
        // come free meanwhile are not counted here, so the lease written is never too small.
        let mine = self.lock().get(key_id).map_or(0, |l| l.in_flight);
        let free = i64::from(max) - others - mine;
        let grant = if free > 0 { (free / 8).max(1) } else { 0 };
        tx.execute(
            "INSERT INTO concurrency_leases (key_id, node_id, slots, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
             ON CONFLICT (key_id, node_id) DO UPDATE SET slots = EXCLUDED.slots, expires_at = EXCLUDED.expires_at",
            &[&key_id, &self.node, &(mine + grant), &lease_ms],
        )
        .await?;
        tx.commit().await?;
        self.pg.count(4);
        let mut keys = self.lock();
        let lease = keys.entry(key_id.to_string()).or_default();
        lease.granted = mine + grant;
        lease.fresh_until = Some(sent + self.lease_for / 2);
        Ok(lease.take())
    }

    /// A request of `key_id` that [`Self::enter`] admitted ended.
    pub fn exit(&self, key_id: &str) {
        if let Some(lease) = self.lock().get_mut(key_id) {
            lease.in_flight = (lease.in_flight - 1).max(0);
        }
    }

    /// Renew this node's slot leases to what it needs now: what is in flight, plus the
    /// unused slots of keys used within half a lease (quieter keys give theirs back). The
    /// local grant is cut to what is renewed before the statement, so no request takes a slot
    /// the database is about to lose.
    pub async fn renew(&self) -> Result<(), PgError> {
        let _leasing = self.leasing.lock().await;
        let sent = Instant::now();
        let lease_ms = self.lease_for.as_millis() as f64;
        let renewals: Vec<(String, i64)> = {
            let mut keys = self.lock();
            keys.retain(|_, l| l.in_flight > 0 || l.granted > 0 || l.last_used.is_some_and(|t| t.elapsed() < self.lease_for));
            keys.iter_mut()
                .map(|(key_id, lease)| {
                    let quiet = lease.last_used.is_none_or(|t| t.elapsed() >= self.lease_for / 2);
                    let keep = if quiet { lease.in_flight } else { lease.granted.max(lease.in_flight) };
                    lease.granted = keep;
                    (key_id.clone(), keep)
                })
                .collect()
        };
        let client = self.pg.client().await?;
        for (key_id, keep) in &renewals {
            client
                .execute(
                    "UPDATE concurrency_leases SET slots = $3, expires_at = now() + $4 * interval '1 millisecond'
                     WHERE key_id = $1 AND node_id = $2",
                    &[key_id, &self.node, keep, &lease_ms],
                )
                .await?;
            self.pg.count(1);
            if let Some(lease) = self.lock().get_mut(key_id) {
                lease.fresh_until = Some(sent + self.lease_for / 2);
            }
        }
        client.execute("DELETE FROM concurrency_leases WHERE expires_at < now() - interval '1 hour'", &[]).await?;
        self.pg.count(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_minute_counts_for_the_part_still_inside_the_sliding_minute() {
        assert_eq!(sliding_share(30, 60.0), 30, "at a boundary, the whole previous minute");
        assert_eq!(sliding_share(30, 30.0), 15);
        assert_eq!(sliding_share(30, 1.0), 0);
        assert_eq!(sliding_share(0, 59.0), 0);
    }
}
