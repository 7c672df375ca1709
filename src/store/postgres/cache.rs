//! The response cache of a fleet: table `response_cache` in the shared database, so an answer
//! one node kept is served by every node. Bounded like the one-node cache: after each write,
//! the least recently used answers past `max_bytes` go (one statement); reading an answer marks
//! it used.

use super::{Pg, PgError};
use crate::store::{CacheFilter, CacheMeta, CacheStore, StoreError};

pub struct FleetCache {
    pg: Pg,
    max_bytes: i64,
}

impl FleetCache {
    pub fn new(pg: Pg, max_bytes: u64) -> FleetCache {
        FleetCache { pg, max_bytes: i64::try_from(max_bytes).unwrap_or(i64::MAX) }
    }
}

fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl CacheStore for FleetCache {
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.pg.client().await?;
        let row = client
            .query_opt("UPDATE response_cache SET used_ms = $2 WHERE key = $1 AND expires_ms > $2 RETURNING value", &[&key, &ms(now_ms)])
            .await
            .map_err(PgError::from)?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    async fn put(&self, key: &str, meta: CacheMeta<'_>, value: &[u8]) -> Result<bool, StoreError> {
        let bytes = i64::try_from(value.len()).unwrap_or(i64::MAX);
        if bytes > self.max_bytes {
            return Ok(false);
        }
        let client = self.pg.client().await?;
        let now = ms(crate::base::clock::now_ms());
        client
            .execute(
                "INSERT INTO response_cache (key, key_id, model, expires_ms, used_ms, bytes, value)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (key) DO UPDATE SET key_id = EXCLUDED.key_id, model = EXCLUDED.model,
                        expires_ms = EXCLUDED.expires_ms, used_ms = EXCLUDED.used_ms, bytes = EXCLUDED.bytes, value = EXCLUDED.value",
                &[&key, &meta.key_id, &meta.model, &ms(meta.expires_ms), &now, &bytes, &value],
            )
            .await
            .map_err(PgError::from)?;
        // The least recently used past the bound: every answer whose running total, newest use
        // first, passes it.
        client
            .execute(
                "DELETE FROM response_cache WHERE key IN (
                     SELECT key FROM (SELECT key, (SUM(bytes) OVER (ORDER BY used_ms DESC, key))::BIGINT AS held FROM response_cache) t
                     WHERE held > $1)",
                &[&self.max_bytes],
            )
            .await
            .map_err(PgError::from)?;
        self.pg.count(2);
        Ok(true)
    }

    async fn clear(&self, filter: &CacheFilter) -> Result<usize, StoreError> {
        let client = self.pg.client().await?;
        let n = client
            .execute(
                "DELETE FROM response_cache WHERE ($1::TEXT IS NULL OR key_id = $1) AND ($2::TEXT IS NULL OR model = $2)",
                &[&filter.key_id, &filter.model],
            )
            .await
            .map_err(PgError::from)?;
        self.pg.count(1);
        Ok(n as usize)
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let client = self.pg.client().await?;
        let n = client.execute("DELETE FROM response_cache WHERE expires_ms <= $1", &[&ms(now_ms)]).await.map_err(PgError::from)?;
        self.pg.count(1);
        Ok(n as usize)
    }

    async fn bytes(&self) -> Result<u64, StoreError> {
        let client = self.pg.client().await?;
        let row = client.query_one("SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM response_cache", &[]).await.map_err(PgError::from)?;
        self.pg.count(1);
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}
