//! The end of a process: a graceful stop, or the old process of an upgrade, drained.

use crate::billing::ledger::Ledger;
use crate::observe::metrics::Metrics;
use crate::store::sled::SledDb;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;

/// Graceful shutdown (SIGTERM, or the old process of an upgrade): once Pingora stops accepting,
/// wait until no request is in flight (Pingora's `grace_period_seconds` is the bound), flush the
/// database and exit. The video poller stops on the same signal. In an upgrade the database is
/// released first, so the new process can open it; the requests still finishing here write
/// through the hand-over socket (see `handover`).
pub struct Drain {
    /// Spans still queued are exported before the exit (at most `SPAN_FLUSH_WAIT`).
    pub tracer: Option<Arc<crate::observe::telemetry::Tracer>>,
    pub metrics: Arc<Metrics>,
    pub local: SledDb,
    pub ledger: Arc<Ledger>,
    pub phases: tokio::sync::Mutex<tokio::sync::broadcast::Receiver<pingora_core::server::ExecutionPhase>>,
    /// The gateway's "answers close their connections" flag, set when an upgrade begins.
    pub closing: Arc<std::sync::atomic::AtomicBool>,
}

/// How long an exit waits for the last spans to reach the collector.
const SPAN_FLUSH_WAIT: Duration = Duration::from_secs(5);

impl Drain {
    async fn flush_spans(&self) {
        if let Some(tracer) = self.tracer.clone() {
            let flushed = tokio::task::spawn_blocking(move || tracer.flush(SPAN_FLUSH_WAIT)).await.unwrap_or(false);
            if !flushed {
                log::warn!("shutting down: the last spans were not all exported within {}s", SPAN_FLUSH_WAIT.as_secs());
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let upgrading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut phases = self.phases.lock().await;
        let mut watching = true;
        loop {
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                phase = phases.recv(), if watching => match phase {
                    Ok(pingora_core::server::ExecutionPhase::GracefulUpgradeTransferringFds) => {
                        upgrading.store(true, std::sync::atomic::Ordering::SeqCst);
                        self.closing.store(true, std::sync::atomic::Ordering::Relaxed);
                        log::info!("upgrade: handing the listeners over; answers close their connections from now on");
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => watching = false,
                },
            }
        }
        if upgrading.load(std::sync::atomic::Ordering::SeqCst) {
            // Bookings made from here on go to the new process; the queued ones are committed.
            if let Err(e) = self.ledger.hand_over().await {
                log::error!("upgrade: committing queued usage records before hand-over failed: {e}");
            }
            // The new process opens an empty journal: nothing is applied again.
            if let Err(e) = self.ledger.checkpoint().await {
                log::error!("upgrade: checkpoint before hand-over failed (the new process applies the journal): {e}");
            }
            if let Err(e) = self.local.flush() {
                log::error!("upgrade: database flush before hand-over failed: {e}");
            }
            self.local.db().release();
            log::info!("upgrade: database released to the new process; draining in-flight requests");
            loop {
                if self.metrics.in_flight.load(std::sync::atomic::Ordering::SeqCst) <= 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.ledger.leave().await;
            self.flush_spans().await;
            log::info!("upgrade: drained; exiting");
            std::process::exit(0);
        }
        log::info!("shutting down: draining in-flight requests");
        loop {
            if self.metrics.in_flight.load(std::sync::atomic::Ordering::SeqCst) <= 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Committed and checkpointed: the next start has nothing to apply again.
        if let Err(e) = self.ledger.checkpoint().await {
            log::error!("shutting down: committing queued usage records failed: {e}");
        }
        self.ledger.leave().await;
        self.flush_spans().await;
        match self.local.flush() {
            Ok(()) => log::info!("drained; database flushed; exiting"),
            Err(e) => log::error!("drained; database flush failed: {e}"),
        }
        std::process::exit(0);
    }
}
