//! The fleet's request log: table `request_log`, every node's entries. A node writes its
//! entries to its own sled tree first (the commit writer's batches, as on one node) and its
//! sync round ships them here in one statement per round; a node's entry is known by its
//! node and local number, so a round retried after a lost reply stores nothing twice.

use super::{Pg, PgError};
use crate::records::log::{stored_entries, Cursor, EntryHead, Filter, LogEntry, Page};

/// Store the entries of stored batches `batches` of node `node` (their binary form as it is,
/// with what the table indexes read from each entry's head); how many were new, and how many
/// were shipped.
pub async fn ship(pg: &Pg, node: &str, batches: &[impl AsRef<[u8]>]) -> Result<(u64, usize), PgError> {
    let (mut seqs, mut ids, mut times, mut keys, mut bins) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for entry in batches.iter().flat_map(|b| stored_entries(b.as_ref())) {
        let Some(head) = EntryHead::read(entry) else {
            log::warn!("request log: an unreadable entry was not shipped");
            continue;
        };
        seqs.push(i64::try_from(head.seq).unwrap_or(i64::MAX));
        ids.push(head.id);
        times.push(i64::try_from(head.time_ms).unwrap_or(i64::MAX));
        keys.push(head.key_id);
        bins.push(entry);
    }
    if seqs.is_empty() {
        return Ok((0, 0));
    }
    let client = pg.client().await?;
    let n = client
        .execute(
            "INSERT INTO request_log (node_id, node_seq, id, time_ms, key_id, bin)
             SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::BYTEA[])
             ON CONFLICT (node_id, node_seq) DO NOTHING",
            &[&node, &seqs, &ids, &times, &keys, &bins],
        )
        .await?;
    pg.count(1);
    Ok((n, seqs.len()))
}

/// The entry of a row whose first two columns are `record, bin`: its binary form (schema 10
/// on), else the JSON that earlier versions wrote; None (logged) if it does not read.
fn read(row: &tokio_postgres::Row) -> Option<LogEntry> {
    let (text, bin): (Result<&str, _>, Result<Option<&[u8]>, _>) = (row.try_get(0), row.try_get(1));
    let entry = match (text, bin) {
        (_, Ok(Some(bin))) => LogEntry::decode(bin).ok_or_else(|| "a binary entry does not read".to_string()),
        (Ok(text), Ok(None)) => serde_json::from_str(text).map_err(|e| e.to_string()),
        (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
    };
    entry.map_err(|e| log::warn!("request log: an unreadable entry was skipped: {e}")).ok()
}

/// Matching entries of every node, newest first, and where the next page starts.
pub async fn query(pg: &Pg, filter: &Filter) -> Result<Page, PgError> {
    let client = pg.client().await?;
    let (start, end) = (i64::try_from(filter.start_ms).unwrap_or(i64::MAX), i64::try_from(filter.end_ms).unwrap_or(i64::MAX));
    let (before_t, before_s) = filter
        .before
        .map_or((i64::MAX, i64::MAX), |c| (i64::try_from(c.time_ms).unwrap_or(i64::MAX), i64::try_from(c.seq).unwrap_or(i64::MAX)));
    // Filtered by what the table indexes (time, key, id); the rest (model, status class) as
    // rows are read, a bounded number of them per page.
    let mut out = Vec::new();
    let mut last = Cursor { time_ms: 0, seq: 0 };
    let mut cursor = (before_t, before_s);
    loop {
        let rows = client
            .query(
                "SELECT record, bin, time_ms, seq FROM request_log
                 WHERE time_ms >= $1 AND time_ms < $2 AND (time_ms, seq) < ($3, $4)
                   AND ($5::TEXT IS NULL OR key_id = $5) AND ($6::TEXT IS NULL OR id = $6)
                 ORDER BY time_ms DESC, seq DESC LIMIT 500",
                &[&start, &end, &cursor.0, &cursor.1, &filter.key_id, &filter.id],
            )
            .await?;
        pg.count(1);
        let fetched = rows.len();
        for row in rows {
            let (t, s): (i64, i64) = (row.try_get(2)?, row.try_get(3)?);
            cursor = (t, s);
            let Some(entry) = read(&row) else { continue };
            if !filter.matches(&entry) {
                continue;
            }
            if out.len() == filter.limit {
                return Ok((out, Some(last)));
            }
            out.push(entry);
            last = Cursor { time_ms: u64::try_from(t).unwrap_or(0), seq: u64::try_from(s).unwrap_or(0) };
        }
        if fetched < 500 {
            return Ok((out, None));
        }
    }
}

/// Delete entries older than `before_ms`, then the oldest beyond `max`. How many.
pub async fn prune(pg: &Pg, before_ms: u64, max: usize) -> Result<u64, PgError> {
    let client = pg.client().await?;
    let mut n = client.execute("DELETE FROM request_log WHERE time_ms < $1", &[&i64::try_from(before_ms).unwrap_or(i64::MAX)]).await?;
    n += client
        .execute(
            "DELETE FROM request_log WHERE (time_ms, seq) <=
               (SELECT time_ms, seq FROM request_log ORDER BY time_ms DESC, seq DESC OFFSET $1 LIMIT 1)",
            &[&i64::try_from(max).unwrap_or(i64::MAX)],
        )
        .await?;
    pg.count(2);
    Ok(n)
}
