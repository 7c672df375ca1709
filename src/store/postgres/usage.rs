//! Usage records from every node in one table, so that `/v1/usage` on any node counts them
//! all. A node writes its records to its local journal first (sled, group commit) and books
//! them in batches with their money ([`super::accounts::FleetAccounts::book`]), in one
//! multi-row statement. A record is identified by `(node_id, seq)` — the journal's id and the
//! record's number in it — and each journal's mark (the highest number booked, table
//! `journal_marks`) tells new records from those of a batch retried after a lost reply, which
//! add nothing twice (see `insert`). The owners of stored
//! responses are booked with the records that created them. Totals are counted by the
//! ledger's own rule ([`crate::records::usage::Totals::add`]).

use super::{Pg, PgError};
use crate::records::usage::{ResponseOwner, Totals, UsageRecord};
use crate::store::usage_codec::RecordHead;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// One usage record on its way from a node's journal to the database, where it debits its cost:
/// its stored form as the journal holds it (stored as it is) and what booking reads of it.
#[derive(Debug, Clone)]
pub struct Journaled<'a> {
    /// Its number in the node's journal; with the journal's id, its key in the database.
    pub seq: i64,
    pub stored: Cow<'a, [u8]>,
    pub head: RecordHead<'a>,
    /// The response it created and that response's owner (read from the whole record, which
    /// only these few are).
    pub owner: Option<(String, ResponseOwner)>,
    /// Its cost was settled in this process (and is part of what this node owes).
    pub owed_here: bool,
}

impl Journaled<'static> {
    /// A record at hand, numbered `seq`.
    pub fn of(seq: i64, record: &UsageRecord, owed_here: bool) -> Self {
        Journaled {
            seq,
            stored: Cow::Owned(crate::store::usage_codec::value(record)),
            head: RecordHead::of(record),
            owner: record.owner().zip(record.response_id.clone()).map(|(o, id)| (id, o)),
            owed_here,
        }
    }
}

impl<'a> Journaled<'a> {
    /// A record's stored form from a journal; None if it does not read. Records numbered from
    /// `owed_from` on were settled in this process.
    pub fn read(stored: &'a [u8], owed_from: u64) -> Option<Self> {
        let head = RecordHead::read(stored)?;
        let owner = match head.response {
            true => crate::store::usage_codec::decode_records(stored)
                .ok()?
                .pop()
                .and_then(|r| r.owner().zip(r.response_id))
                .map(|(o, id)| (id, o)),
            false => None,
        };
        Some(Journaled {
            seq: i64::try_from(head.seq).unwrap_or(i64::MAX),
            owed_here: head.seq >= owed_from,
            stored: Cow::Borrowed(stored),
            head,
            owner,
        })
    }

    /// The purses it debits: its key, then those it was charged besides.
    pub(super) fn purses(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.head.key_id).chain(self.head.charged.iter().map(|c| &**c))
    }
}

pub struct FleetRecords {
    pg: Pg,
}

/// Store `records` of journal `journal` (numbered by the journal); the numbers that were new,
/// and the statements sent.
///
/// The journal's mark is the highest number it has booked: a record numbered above it is new
/// (a committed batch raises the mark past all its records). One at or below it was booked
/// already — a batch sent again after its reply was lost — or, rarely, reached the journal
/// after a higher-numbered one was booked (numbers are drawn before records are queued): those
/// few are looked up one by one. The mark's row is locked until the transaction ends.
pub(super) async fn insert<'a, 'b: 'a>(
    tx: &tokio_postgres::Transaction<'_>,
    journal: &str,
    records: impl Iterator<Item = &'a Journaled<'b>>,
) -> Result<(Vec<i64>, u64), PgError> {
    let records: Vec<&Journaled> = records.collect();
    let Some(highest) = records.iter().map(|j| j.seq).max() else { return Ok((Vec::new(), 0)) };
    let mark: i64 = tx
        .query_one(
            "INSERT INTO journal_marks (node_id, booked_through) VALUES ($1, -1)
             ON CONFLICT (node_id) DO UPDATE SET booked_through = journal_marks.booked_through RETURNING booked_through",
            &[&journal],
        )
        .await?
        .get(0);
    let mut statements = 2;
    let (maybe_booked, mut new): (Vec<_>, Vec<_>) = records.into_iter().partition(|j| j.seq <= mark);
    if !maybe_booked.is_empty() {
        let (mut seqs, mut keys, mut times) = (Vec::new(), Vec::new(), Vec::new());
        for j in &maybe_booked {
            seqs.push(j.seq);
            keys.push(&*j.head.key_id);
            times.push(time(j.head.time_ms));
        }
        let booked: std::collections::HashSet<i64> = tx
            .query(
                "SELECT c.seq FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[]) AS c (seq, key_id, time_ms)
                 WHERE EXISTS (SELECT 1 FROM usage_records u
                               WHERE u.key_id = c.key_id AND u.time_ms = c.time_ms AND u.node_id = $1 AND u.seq = c.seq)",
                &[&journal, &seqs, &keys, &times],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        statements += 1;
        new.extend(maybe_booked.into_iter().filter(|j| !booked.contains(&j.seq)));
    }
    let (mut seqs, mut keys, mut times, mut forms) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for j in &new {
        seqs.push(j.seq);
        keys.push(&*j.head.key_id);
        times.push(time(j.head.time_ms));
        forms.push(&*j.stored);
    }
    tx.execute(
        "WITH stored AS (
             INSERT INTO usage_records (node_id, seq, key_id, time_ms, bin)
             SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BYTEA[]))
         UPDATE journal_marks SET booked_through = GREATEST(booked_through, $6) WHERE node_id = $1",
        &[&journal, &seqs, &keys, &times, &forms, &highest],
    )
    .await?;
    Ok((seqs, statements))
}

/// The record of a row whose first two columns are `record, bin`: its binary form (`bin`,
/// schema 10 on), else the JSON that earlier versions wrote (`record`).
pub(super) fn read(row: &tokio_postgres::Row) -> Result<UsageRecord, PgError> {
    let bad = |e: String| PgError::Query(format!("usage record: {e}"));
    let text: &str = row.try_get(0).map_err(|e| bad(e.to_string()))?;
    let bin: Option<&[u8]> = row.try_get(1).map_err(|e| bad(e.to_string()))?;
    match bin {
        Some(bin) => crate::store::usage_codec::decode_records(bin)
            .map_err(|e| bad(e.to_string()))?
            .pop()
            .ok_or_else(|| bad("an empty stored form".into())),
        None => serde_json::from_str(text).map_err(|e| bad(e.to_string())),
    }
}

fn time(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Make the key of each record that created a stored response (its id, its owner) that
/// response's owner; statements sent.
pub(super) async fn insert_owners<'a>(
    tx: &tokio_postgres::Transaction<'_>,
    owners: impl Iterator<Item = &'a (String, ResponseOwner)>,
) -> Result<u64, PgError> {
    let (mut ids, mut texts, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for (id, owner) in owners {
        ids.push(id.as_str());
        texts.push(serde_json::to_string(owner).map_err(|e| PgError::Query(format!("response owner: {e}")))?);
        times.push(time(owner.time_ms));
    }
    if ids.is_empty() {
        return Ok(0);
    }
    tx.execute(
        "INSERT INTO response_owners (id, owner, time_ms) SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[])
         ON CONFLICT (id) DO NOTHING",
        &[&ids, &texts, &times],
    )
    .await?;
    Ok(1)
}

impl FleetRecords {
    pub fn new(pg: Pg) -> Self {
        FleetRecords { pg }
    }

    /// Who created the stored response `id`.
    pub async fn owner(&self, id: &str) -> Result<Option<ResponseOwner>, PgError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT owner FROM response_owners WHERE id = $1", &[&id]).await?;
        self.pg.count(1);
        match row {
            Some(row) => {
                let text: String = row.get(0);
                serde_json::from_str(&text).map(Some).map_err(|e| PgError::Query(format!("response owner {id}: {e}")))
            }
            None => Ok(None),
        }
    }

    /// The response `id` was deleted upstream.
    pub async fn forget_owner(&self, id: &str) -> Result<(), PgError> {
        let client = self.pg.client().await?;
        client.execute("DELETE FROM response_owners WHERE id = $1", &[&id]).await?;
        self.pg.count(1);
        Ok(())
    }

    /// Delete every node's records (and response owners) older than `before_ms`; how many
    /// records. Balances live in `accounts`, so pruning never changes one.
    pub async fn prune(&self, before_ms: u64) -> Result<u64, PgError> {
        let before = i64::try_from(before_ms).unwrap_or(i64::MAX);
        let client = self.pg.client().await?;
        let n = client.execute("DELETE FROM usage_records WHERE time_ms < $1", &[&before]).await?;
        client.execute("DELETE FROM response_owners WHERE time_ms < $1", &[&before]).await?;
        self.pg.count(2);
        Ok(n)
    }

    /// A key's totals over `[start_ms, end_ms)`, all nodes' records, overall and by model.
    pub async fn summary(
        &self,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
        by: &crate::records::usage::Grouping,
    ) -> Result<(Totals, BTreeMap<String, Totals>), PgError> {
        let client = self.pg.client().await?;
        let (lo, hi) = (i64::try_from(start_ms).unwrap_or(i64::MAX), i64::try_from(end_ms).unwrap_or(i64::MAX));
        let rows = client
            .query("SELECT record, bin FROM usage_records WHERE key_id = $1 AND time_ms >= $2 AND time_ms < $3", &[&key_id, &lo, &hi])
            .await?;
        self.pg.count(1);
        let mut total = Totals::default();
        let mut by_model: BTreeMap<String, Totals> = BTreeMap::new();
        for row in rows {
            let record = read(&row)?;
            total.add(&record);
            by_model.entry(by.label(&record).into_owned()).or_default().add(&record);
        }
        Ok((total, by_model))
    }
}
