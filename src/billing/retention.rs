//! Retention: usage records and request-log entries older than their keeping period are
//! deleted, hourly.

use crate::base::clock::now_ms;
use crate::billing::ledger::Ledger;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;

/// Deletes usage records older than the retention period, hourly.
pub struct Retention {
    pub ledger: Arc<Ledger>,
    pub keep: Duration,
    pub requests: Arc<dyn crate::store::RequestLogStore>,
    pub console: crate::config::ConsoleConfig,
}

#[async_trait]
impl BackgroundService for Retention {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let before = now_ms().saturating_sub(self.keep.as_millis() as u64);
            match self.ledger.prune(before).await {
                Ok(0) => {}
                Ok(n) => log::info!("usage retention: deleted {n} record(s)"),
                Err(e) => log::error!("usage retention: {e}"),
            }
            let log_before = now_ms().saturating_sub(self.console.request_log_days.saturating_mul(86_400_000));
            match self.requests.prune_log(log_before, self.console.request_log_max).await {
                Ok(0) => {}
                Ok(n) => log::info!("request log retention: deleted {n} entr(y/ies)"),
                Err(e) => log::error!("request log retention: {e}"),
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    }
}
