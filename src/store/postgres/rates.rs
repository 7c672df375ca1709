//! Rate limits that hold for the sum of all nodes, over one-minute windows by the database's
//! clock (as the single node counts one-minute windows).
//!
//! * **Requests per minute: exact.** Like money, a node leases a share of the key's window —
//!   an eighth of what is left, at least one request — in one locked transaction, and admits
//!   locally while its share lasts; the database never grants more than `rpm` in a window. A
//!   request refused while other nodes still hold unused shares is the only error: at most the
//!   unused part of their shares (each at most an eighth of the window's allowance when taken).
//! * **Tokens per minute: within one sync interval.** Tokens are known only after a request,
//!   so each node adds its spend to the window's shared counter in batches ([`FleetRates::flush`],
//!   every `sync_ms`) and admits while the fleet's total it last read plus its own unflushed
//!   spend is under `tpm`. The fleet can overrun `tpm` by what the other nodes spent since
//!   their last flush: at most one `sync_ms` of their traffic.

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
}

impl Window {
    fn current(&self) -> bool {
        self.ends.is_some_and(|t| Instant::now() < t)
    }

    fn secs_left(&self) -> u64 {
        self.ends.map_or(1, |t| t.saturating_duration_since(Instant::now()).as_secs().max(1))
    }
}

pub struct FleetRates {
    pg: Pg,
    windows: tokio::sync::Mutex<HashMap<String, Window>>,
}

impl FleetRates {
    pub fn new(pg: Pg) -> Self {
        FleetRates { pg, windows: tokio::sync::Mutex::new(HashMap::new()) }
    }

    /// Count one request of `key_id` against `rpm` for the fleet.
    pub async fn admit_request(&self, key_id: &str, rpm: u32) -> Result<Admission, PgError> {
        let mut windows = self.windows.lock().await;
        let w = windows.entry(key_id.to_string()).or_default();
        if w.current() && w.admitted < w.granted {
            w.admitted += 1;
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
        let left = i64::from(rpm) - granted_so_far;
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
        if w.number != number {
            *w = Window { number, ..Window::default() };
        }
        w.ends = Some(sent + Duration::from_secs_f64(secs_left.clamp(0.0, 60.0)));
        w.granted += grant;
        if w.admitted < w.granted {
            w.admitted += 1;
            Ok(Admission::Admitted)
        } else {
            Ok(Admission::Refused { retry_after_secs: w.secs_left() })
        }
    }

    /// Whether `key_id` may make another request under `tpm` (the fleet's spend as last read
    /// plus this node's unflushed spend).
    pub async fn admit_tokens(&self, key_id: &str, tpm: u64) -> Admission {
        let windows = self.windows.lock().await;
        match windows.get(key_id) {
            Some(w) if w.current() && (w.fleet_tokens + w.unflushed_tokens).max(0) as u64 >= tpm => {
                Admission::Refused { retry_after_secs: w.secs_left() }
            }
            _ => Admission::Admitted,
        }
    }

    /// Tokens a request of `key_id` used.
    pub async fn spend_tokens(&self, key_id: &str, tokens: u64) {
        let mut windows = self.windows.lock().await;
        let w = windows.entry(key_id.to_string()).or_default();
        w.unflushed_tokens = w.unflushed_tokens.saturating_add(i64::try_from(tokens).unwrap_or(i64::MAX));
    }

    /// Add this node's token spend to the fleet's windows and read their totals back.
    pub async fn flush(&self) -> Result<(), PgError> {
        let mut windows = self.windows.lock().await;
        let keys: Vec<String> = windows.keys().cloned().collect();
        if keys.is_empty() {
            return Ok(());
        }
        let client = self.pg.client().await?;
        for key_id in keys {
            let Some(w) = windows.get_mut(&key_id) else { continue };
            let sent = Instant::now();
            let row = client
                .query_one(
                    "INSERT INTO rate_windows (key_id, window_start, tokens)
                     VALUES ($1, floor(extract(epoch FROM now()) / 60)::BIGINT, $2)
                     ON CONFLICT (key_id, window_start) DO UPDATE SET tokens = rate_windows.tokens + EXCLUDED.tokens
                     RETURNING window_start, tokens, 60 - (extract(epoch FROM now())::numeric % 60)::float8",
                    &[&key_id, &w.unflushed_tokens],
                )
                .await?;
            self.pg.count(1);
            let (number, tokens, secs_left): (i64, i64, f64) = (row.get(0), row.get(1), row.get(2));
            if w.number != number {
                *w = Window { number, ..Window::default() };
            }
            w.ends = Some(sent + Duration::from_secs_f64(secs_left.clamp(0.0, 60.0)));
            w.fleet_tokens = tokens;
            w.unflushed_tokens = 0;
        }
        Ok(())
    }
}
