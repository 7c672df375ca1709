//! Usage records from every node in one table, so that `/v1/usage` on any node counts them
//! all. A node numbers its records itself — from its start time in ms × 65,536, so a restarted
//! node (same `node_id`) never reuses a number — and books them in batches (group commit, as
//! with sled) in one multi-row statement; `(node_id, seq)` is the key, so a batch retried after
//! a lost reply adds nothing twice. Totals are counted by the ledger's own rule
//! ([`crate::ledger::Totals::add`]).

use super::{Pg, PgError};
use crate::ledger::{Totals, UsageRecord};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

pub struct FleetRecords {
    pg: Pg,
    node: String,
    next_seq: AtomicI64,
}

impl FleetRecords {
    pub fn new(pg: Pg, node: &str) -> Self {
        let start_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        FleetRecords { pg, node: node.to_string(), next_seq: AtomicI64::new(start_ms.saturating_mul(65_536)) }
    }

    /// Give each record its number on this node, once: a retry books the same numbers.
    pub fn numbered(&self, records: Vec<UsageRecord>) -> Vec<(i64, UsageRecord)> {
        let first = self.next_seq.fetch_add(records.len() as i64, Ordering::Relaxed);
        records.into_iter().enumerate().map(|(i, r)| (first + i as i64, r)).collect()
    }

    /// Book a batch in one statement; how many records were new.
    pub async fn book(&self, batch: &[(i64, UsageRecord)]) -> Result<u64, PgError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut seqs = Vec::with_capacity(batch.len());
        let mut keys = Vec::with_capacity(batch.len());
        let mut times = Vec::with_capacity(batch.len());
        let mut texts = Vec::with_capacity(batch.len());
        for (seq, r) in batch {
            seqs.push(*seq);
            keys.push(r.key_id.clone());
            times.push(i64::try_from(r.time_ms).unwrap_or(i64::MAX));
            texts.push(serde_json::to_string(r).map_err(|e| PgError::Query(format!("usage record: {e}")))?);
        }
        let client = self.pg.client().await?;
        let n = client
            .execute(
                "INSERT INTO usage_records (node_id, seq, key_id, time_ms, record)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[])
                 ON CONFLICT (node_id, seq) DO NOTHING",
                &[&self.node, &seqs, &keys, &times, &texts],
            )
            .await?;
        self.pg.count(1);
        Ok(n)
    }

    /// A key's totals over `[start_ms, end_ms)`, all nodes' records, overall and by model.
    pub async fn summary(&self, key_id: &str, start_ms: u64, end_ms: u64) -> Result<(Totals, BTreeMap<String, Totals>), PgError> {
        let client = self.pg.client().await?;
        let (lo, hi) = (i64::try_from(start_ms).unwrap_or(i64::MAX), i64::try_from(end_ms).unwrap_or(i64::MAX));
        let rows = client
            .query("SELECT record FROM usage_records WHERE key_id = $1 AND time_ms >= $2 AND time_ms < $3", &[&key_id, &lo, &hi])
            .await?;
        self.pg.count(1);
        let mut total = Totals::default();
        let mut by_model: BTreeMap<String, Totals> = BTreeMap::new();
        for row in rows {
            let text: String = row.get(0);
            let record: UsageRecord = serde_json::from_str(&text).map_err(|e| PgError::Query(format!("usage record: {e}")))?;
            total.add(&record);
            by_model.entry(record.model.clone()).or_default().add(&record);
        }
        Ok((total, by_model))
    }
}
