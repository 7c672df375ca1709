//! The request log on one node (and a fleet node's outbox): tree `request_log`, keyed by the
//! entry's time and a sequence number (big-endian, so newest last) → the entry as JSON,
//! written by the store's commit writer.

use crate::request_log::{Cursor, Filter, LogEntry, Page};
use crate::store::{DbSlot, StoreError};

pub const TREE: &str = "request_log";

fn key(time_ms: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&time_ms.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn cursor_of(k: &[u8]) -> Option<Cursor> {
    let time_ms = u64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let seq = u64::from_be_bytes(k.get(8..16)?.try_into().ok()?);
    Some(Cursor { time_ms, seq })
}

/// Queue `entry` to `writer` (written with the next batch; nobody waits).
pub fn append(slot: &DbSlot, writer: &crate::commit::Writer, entry: &LogEntry) -> Result<(), StoreError> {
    let seq = slot.db()?.generate_id()?;
    let value = serde_json::to_vec(entry).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    writer.insert(crate::commit::TreeName::RequestLog, key(entry.time_ms, seq).to_vec(), value, false)?;
    Ok(())
}

/// Entries matching `filter`, newest first, and where the next page starts (run it on a
/// blocking thread: a filter that matches little reads much).
pub fn query(slot: &DbSlot, filter: &Filter) -> Result<Page, StoreError> {
    let tree = slot.tree(TREE)?;
    let hi = match filter.before {
        Some(c) => key(c.time_ms, c.seq).to_vec(),
        None => key(filter.end_ms, 0).to_vec(),
    };
    let lo = key(filter.start_ms, 0).to_vec();
    let mut out = Vec::new();
    let mut last = None;
    for item in tree.range(lo..hi).rev() {
        let (k, v) = item?;
        let entry: LogEntry = match serde_json::from_slice(&v) {
            Ok(e) => e,
            Err(e) => {
                log::warn!("request log: an unreadable entry was skipped: {e}");
                continue;
            }
        };
        if !filter.matches(&entry) {
            continue;
        }
        if out.len() == filter.limit {
            // A match beyond the page: the next page starts after the last one shown.
            return Ok((out, last));
        }
        out.push(entry);
        last = cursor_of(&k);
    }
    Ok((out, None))
}

/// Delete entries older than `before_ms`, then the oldest beyond `max`. How many.
pub fn prune(slot: &DbSlot, before_ms: u64, max: usize) -> Result<usize, StoreError> {
    let tree = slot.tree(TREE)?;
    let mut n = 0;
    for item in tree.range(..key(before_ms, 0).to_vec()) {
        let (k, _) = item?;
        tree.remove(k)?;
        n += 1;
    }
    let len = tree.len();
    if len > max {
        for item in tree.iter().take(len - max) {
            let (k, _) = item?;
            tree.remove(k)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The oldest `limit` entries with their keys (a fleet node ships them to the database).
pub fn oldest(slot: &DbSlot, limit: usize) -> Result<Vec<(sled::IVec, u64, LogEntry)>, StoreError> {
    let mut out = Vec::new();
    for item in slot.tree(TREE)?.iter().take(limit) {
        let (k, v) = item?;
        let seq = cursor_of(&k).map_or(0, |c| c.seq);
        match serde_json::from_slice(&v) {
            Ok(e) => out.push((k, seq, e)),
            Err(e) => log::warn!("request log: an unreadable entry was dropped: {e}"),
        }
    }
    Ok(out)
}

/// Remove shipped entries.
pub fn remove(slot: &DbSlot, keys: &[sled::IVec]) -> Result<(), StoreError> {
    let tree = slot.tree(TREE)?;
    for k in keys {
        tree.remove(k)?;
    }
    Ok(())
}
