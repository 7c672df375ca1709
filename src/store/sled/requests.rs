//! The request log on one node (and a fleet node's outbox): tree `request_log`. The entries a
//! commit batch writes are one sled entry (their stored form, `LogEntry::encode`, framed as the
//! writer frames a group), keyed by its first entry's time and number (big-endian, so newest
//! last): one insert per batch, not per request. Entries are
//! numbered as they are queued (`LogEntry::seq`), in the order they end, so the tree is in
//! time order and a page's position is an entry's (time, number).

use crate::records::log::{Cursor, Filter, LogEntry, LogLine, Page};
use crate::store::commit::GROUP_SPAN_MS;
use crate::store::{DbSlot, StoreError};

pub const TREE: &str = crate::store::commit::REQUEST_LOG;

fn key(time_ms: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&time_ms.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn decode(v: &[u8]) -> Vec<LogEntry> {
    LogEntry::decode_batch(v)
}

/// Number `entry` and queue it to `writer` (written with the next batch; nobody waits).
pub fn append(slot: &DbSlot, writer: &crate::store::commit::Writer, mut entry: LogLine<'_>) -> Result<(), StoreError> {
    let seq = slot.db()?.generate_id()?;
    entry.seq = seq;
    let mut value = Vec::with_capacity(192);
    entry.encode(&mut value);
    writer.insert_grouped(
        crate::store::commit::TreeName::RequestLog,
        b"log".to_vec(),
        entry.time_ms,
        key(entry.time_ms, seq).to_vec(),
        value,
        false,
    )?;
    Ok(())
}

/// Entries matching `filter`, newest first, and where the next page starts (run it on a
/// blocking thread: a filter that matches little reads much).
pub fn query(slot: &DbSlot, filter: &Filter) -> Result<Page, StoreError> {
    let tree = slot.tree(TREE)?;
    let upto = filter.before.map_or(Cursor { time_ms: filter.end_ms, seq: 0 }, |c| c.min(Cursor { time_ms: filter.end_ms, seq: 0 }));
    // A batch starts at most GROUP_SPAN_MS before its entries.
    let lo = key(filter.start_ms.saturating_sub(GROUP_SPAN_MS), 0).to_vec();
    let hi = key(upto.time_ms, upto.seq).to_vec();
    let mut out: Vec<LogEntry> = Vec::new();
    let mut last = None;
    for item in tree.range(lo..hi).rev() {
        let (_, v) = item?;
        for entry in decode(&v).into_iter().rev() {
            let at = Cursor { time_ms: entry.time_ms, seq: entry.seq };
            if at >= upto || !filter.matches(&entry) {
                continue;
            }
            if out.len() == filter.limit {
                // A match beyond the page: the next page starts after the last one shown.
                return Ok((out, last));
            }
            last = Some(at);
            out.push(entry);
        }
    }
    Ok((out, None))
}

/// Delete batches whose entries are all older than `before_ms`, then the oldest batches
/// beyond `max` entries. How many entries.
pub fn prune(slot: &DbSlot, before_ms: u64, max: usize) -> Result<usize, StoreError> {
    let tree = slot.tree(TREE)?;
    let mut n = 0;
    let mut kept = 0usize;
    for item in tree.iter().rev() {
        let (k, v) = item?;
        let entries = decode(&v);
        let old = entries.iter().all(|e| e.time_ms < before_ms);
        if old || kept >= max {
            tree.remove(k)?;
            n += entries.len();
        } else {
            kept += entries.len();
        }
    }
    Ok(n)
}

/// Batches on their way to the shared database: their keys, and their stored forms (unread:
/// [`crate::records::log::stored_entries`] walks one).
pub type Outbox = (Vec<sled::IVec>, Vec<sled::IVec>);

/// The oldest batches, up to about `limit` entries (a fleet node ships them to the database).
pub fn oldest(slot: &DbSlot, limit: usize) -> Result<Outbox, StoreError> {
    let (mut keys, mut batches, mut n) = (Vec::new(), Vec::new(), 0);
    for item in slot.tree(TREE)?.iter() {
        if n >= limit {
            break;
        }
        let (k, v) = item?;
        n += crate::records::log::stored_entries(&v).count();
        keys.push(k);
        batches.push(v);
    }
    Ok((keys, batches))
}

/// Remove shipped batches.
pub fn remove(slot: &DbSlot, keys: &[sled::IVec]) -> Result<(), StoreError> {
    let mut done = sled::Batch::default();
    keys.iter().for_each(|k| done.remove(k));
    slot.tree(TREE)?.apply_batch(done)?;
    Ok(())
}
