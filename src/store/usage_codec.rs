//! The stored form of usage records: a node's `usage_records` tree and journal, and the `bin`
//! column of the fleet's `usage_records` table (one record each).
//!
//! An entry of the tree holds the records of one key committed in one batch (see
//! [`crate::store::commit::Writer::insert_grouped`]): `[` records separated by `,` `]`. A record is
//! written in binary: the mark [`BINARY_V1`] (a byte no JSON text starts with), its length
//! (u32, little-endian), then its fields in the order of [`encode`], in the compact form of
//! [`crate::base::codec`]. Every relayed request writes one: its JSON took ~7 K instructions.
//!
//! Entries written by earlier versions are read alike: a JSON array of records, or (before
//! batches were grouped) one JSON object.

use crate::base::codec::{put_signed, put_str, put_varint, Reader};
use crate::records::usage::UsageRecord;
use crate::store::StoreError;
use std::borrow::Cow;

/// First byte of a binary record (version 1 of its fields).
const BINARY_V1: u8 = 0xB1;
/// First byte of a record with fields version 1 has no place for (a call that fell back to
/// another model): version 1's fields to the tags, then their count and each field as its tag
/// ([`Field`]) and its bytes (length-prefixed, so a reader steps over a tag it does not know).
/// Only such records are written so; a new field is a new tag.
const BINARY_V2: u8 = 0xB2;

/// The tags of version 2's fields.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Field {
    ListCost = 1,
    RequestedModel = 2,
    Fallbacks = 3,
    Cache = 4,
    CacheSaved = 5,
}

/// One tagged field: its tag, its length, its bytes.
fn put_field(out: &mut Vec<u8>, tag: Field, value: &[u8]) {
    put_varint(out, tag as u64);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn is_mark(b: u8) -> bool {
    b == BINARY_V1 || b == BINARY_V2
}

/// Append `r`'s stored form (mark, length, fields) to `out`.
pub fn encode(r: &UsageRecord, out: &mut Vec<u8>) {
    let fell = r.requested_model.is_some() || r.fallbacks.is_some() || r.cache.is_some() || r.cache_saved_nanos.is_some();
    out.push(if fell { BINARY_V2 } else { BINARY_V1 });
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    put_varint(out, r.time_ms);
    for s in [&r.key_id, &r.model, &r.protocol, &r.route] {
        put_str(out, Some(s));
    }
    for n in [r.input_tokens, r.cached_tokens, r.cache_write_tokens, r.output_tokens] {
        put_varint(out, n);
    }
    put_signed(out, r.cost_nanos);
    put_varint(out, u64::from(r.status));
    put_varint(out, r.latency_ms);
    out.push(u8::from(r.estimated));
    put_varint(out, r.seq);
    put_signed(out, r.balance_after);
    put_str(out, r.provider.as_deref());
    put_varint(out, u64::from(r.attempts));
    put_str(out, r.response_id.as_deref());
    put_str(out, r.upstream_protocol.as_deref());
    put_varint(out, r.charged.len() as u64);
    for id in &r.charged {
        put_str(out, Some(id));
    }
    put_varint(out, r.tags.len() as u64);
    for (k, v) in &r.tags {
        put_str(out, Some(k));
        put_str(out, Some(v));
    }
    if fell {
        let signed = |n: Option<i64>| {
            n.map(|n| {
                let mut v = Vec::with_capacity(10);
                put_signed(&mut v, n);
                v
            })
        };
        let (list, saved) = (signed(r.list_cost_nanos), signed(r.cache_saved_nanos));
        let fields = [
            (Field::ListCost, list.as_deref()),
            (Field::RequestedModel, r.requested_model.as_deref().map(str::as_bytes)),
            (Field::Fallbacks, r.fallbacks.as_deref().map(str::as_bytes)),
            (Field::Cache, r.cache.as_deref().map(str::as_bytes)),
            (Field::CacheSaved, saved.as_deref()),
        ];
        put_varint(out, fields.iter().filter(|(_, v)| v.is_some()).count() as u64);
        for (tag, value) in fields {
            if let Some(value) = value {
                put_field(out, tag, value);
            }
        }
    } else if let Some(list) = r.list_cost_nanos {
        // Last, and only when a price multiplier made it differ from the charge: a record
        // without it reads as one charged at the price table.
        put_signed(out, list);
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// `r`'s stored form, as queued to the commit writer (which joins a batch's records of one key
/// into one entry).
pub fn value(r: &UsageRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    encode(r, &mut out);
    out
}

/// `r`'s stored form as an entry of its own (`[record]`).
pub fn entry(r: &UsageRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.push(b'[');
    encode(r, &mut out);
    out.push(b']');
    out
}

/// One record's fields (after its mark and length); None if they do not read whole.
fn decode((v2, body): (bool, &[u8])) -> Option<UsageRecord> {
    let mut r = Reader(body);
    let time_ms = r.varint()?;
    let (key_id, model, protocol, route) = (r.string()??, r.string()??, r.string()??, r.string()??);
    let (input_tokens, cached_tokens, cache_write_tokens, output_tokens) = (r.varint()?, r.varint()?, r.varint()?, r.varint()?);
    let cost_nanos = r.signed()?;
    let status = u16::try_from(r.varint()?).ok()?;
    let latency_ms = r.varint()?;
    let estimated = r.byte()? != 0;
    let seq = r.varint()?;
    let balance_after = r.signed()?;
    let provider = r.string()?;
    let attempts = u32::try_from(r.varint()?).ok()?;
    let (response_id, upstream_protocol) = (r.string()?, r.string()?);
    let charged = (0..r.varint()?).map(|_| r.string()?).collect::<Option<Vec<String>>>()?;
    let tags = (0..r.varint()?).map(|_| Some((r.string()??, r.string()??))).collect::<Option<_>>()?;
    let (mut list_cost_nanos, mut requested_model, mut fallbacks) = (None, None, None);
    let (mut cache, mut cache_saved_nanos) = (None, None);
    match (v2, r.0.is_empty()) {
        (true, _) => {
            for _ in 0..r.varint()? {
                let (tag, len) = (r.varint()?, usize::try_from(r.varint()?).ok()?);
                let (value, rest) = (r.0.get(..len)?, r.0.get(len..)?);
                r.0 = rest;
                let text = || std::str::from_utf8(value).ok().map(str::to_string);
                match tag {
                    1 => list_cost_nanos = Some(Reader(value).signed()?),
                    2 => requested_model = Some(text()?),
                    3 => fallbacks = Some(text()?),
                    4 => cache = Some(text()?),
                    5 => cache_saved_nanos = Some(Reader(value).signed()?),
                    // A field of a later version: stepped over.
                    _ => {}
                }
            }
        }
        (false, true) => {}
        (false, false) => list_cost_nanos = Some(r.signed()?),
    }
    r.0.is_empty().then_some(UsageRecord {
        time_ms,
        key_id,
        model,
        protocol,
        route,
        input_tokens,
        cached_tokens,
        cache_write_tokens,
        output_tokens,
        cost_nanos,
        list_cost_nanos,
        status,
        latency_ms,
        estimated,
        seq,
        balance_after,
        provider,
        attempts,
        response_id,
        upstream_protocol,
        charged,
        tags,
        requested_model,
        fallbacks,
        cache,
        cache_saved_nanos,
    })
}

/// What a fleet node's booking reads of a stored record ([`encode`]'s form, mark and length
/// included), borrowed from it: the rest is stepped over unread, so booking a record allocates
/// nothing for it (a full [`decode_records`] was most of what booking cost).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordHead<'a> {
    pub time_ms: u64,
    pub key_id: Cow<'a, str>,
    pub cost_nanos: i64,
    pub seq: u64,
    /// It created a stored response (its owner is read from the whole record).
    pub response: bool,
    /// The purses it was charged besides its key.
    pub charged: Vec<Cow<'a, str>>,
}

impl<'a> RecordHead<'a> {
    /// The head of one stored record; None if it is not one (or not whole).
    pub fn read(stored: &'a [u8]) -> Option<RecordHead<'a>> {
        let (_, body) = body(stored)?;
        let mut r = Reader(body);
        let time_ms = r.varint()?;
        let key_id = r.text()??;
        for _ in 0..3 {
            r.skip_str()?; // model, protocol, route
        }
        for _ in 0..4 {
            r.varint()?; // tokens
        }
        let cost_nanos = r.signed()?;
        r.varint()?; // status
        r.varint()?; // latency
        r.byte()?; // estimated
        let seq = r.varint()?;
        r.signed()?; // balance after
        r.skip_str()?; // provider
        r.varint()?; // attempts
        let response = r.text()?.is_some();
        r.skip_str()?; // upstream protocol
        let charged = (0..r.varint()?).map(|_| r.text()?).collect::<Option<Vec<_>>>()?;
        Some(RecordHead { time_ms, key_id, cost_nanos, seq, response, charged })
    }

    /// `r`'s head (owned: for a record that is at hand, not read from its stored form).
    pub fn of(r: &UsageRecord) -> RecordHead<'static> {
        RecordHead {
            time_ms: r.time_ms,
            key_id: Cow::Owned(r.key_id.clone()),
            cost_nanos: r.cost_nanos,
            seq: r.seq,
            response: r.response_id.is_some(),
            charged: r.charged.iter().map(|c| Cow::Owned(c.clone())).collect(),
        }
    }
}

/// A stored record's fields (after its mark and length), if it is one whole record, and
/// whether it is of version 2.
fn body(stored: &[u8]) -> Option<(bool, &[u8])> {
    let (&mark, after) = stored.split_first().filter(|(m, _)| is_mark(**m))?;
    let len = u32::from_le_bytes(after.get(..4)?.try_into().ok()?) as usize;
    (after.len() == 4 + len).then(|| (mark == BINARY_V2, &after[4..]))
}

/// Each record of one entry in its stored form (mark, length, fields), unread; None for an
/// entry that an earlier version wrote in JSON (read it with [`decode_records`]).
pub fn stored_forms(v: &[u8]) -> Result<Option<Vec<&[u8]>>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("usage record: {what}"));
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let entry = &v[start..];
    let mut rest = entry.strip_prefix(b"[").unwrap_or(entry);
    if !rest.first().is_some_and(|b| is_mark(*b)) {
        return Ok(None);
    }
    let mut out = Vec::new();
    while let Some(after) = rest.split_first().filter(|(m, _)| is_mark(**m)).map(|(_, after)| after) {
        let len = after.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let whole = len.and_then(|len| rest.get(..5 + len)).ok_or_else(|| corrupt("an entry is cut short"))?;
        out.push(whole);
        rest = &rest[whole.len()..];
        rest = rest.strip_prefix(b",").unwrap_or(rest);
    }
    match rest {
        b"]" | b"" => Ok(Some(out)),
        _ => Err(corrupt("an entry has bytes after its records")),
    }
}

/// The records of one entry of the `usage_records` tree, whichever version wrote it.
pub fn decode_records(v: &[u8]) -> Result<Vec<UsageRecord>, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("usage record: {what}"));
    match stored_forms(v)? {
        Some(forms) => {
            forms.into_iter().map(|f| body(f).and_then(decode).ok_or_else(|| corrupt("a binary record does not read".into()))).collect()
        }
        None => {
            let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
            match v.get(start) {
                Some(b'[') => serde_json::from_slice(v).map_err(|e| corrupt(e.to_string())),
                _ => serde_json::from_slice(v).map(|r| vec![r]).map_err(|e| corrupt(e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every field set, none at its default.
    fn full() -> UsageRecord {
        UsageRecord {
            protocol: "anthropic".into(),
            route: "messages".into(),
            input_tokens: 120_000,
            cache_write_tokens: 300,
            latency_ms: 812,
            estimated: true,
            seq: 99,
            balance_after: -42,
            provider: Some("oa-primary".into()),
            attempts: 2,
            response_id: Some("resp_1".into()),
            upstream_protocol: Some("openai".into()),
            charged: vec!["acct:team".into(), "win:day:1".into()],
            list_cost_nanos: Some(-1_200),
            tags: BTreeMap::from([("team".into(), "research".into()), ("env".into(), "prod".into())]),
            ..bare()
        }
    }

    /// The optional fields absent.
    fn bare() -> UsageRecord {
        crate::billing::ledger::tests::record("key_1", "alpha-5.5", -1_500, 1_764_000_000_123)
    }

    /// A call that fell back (written in version 2), with and without a list cost.
    fn fell(list: Option<i64>) -> UsageRecord {
        UsageRecord {
            requested_model: Some("alpha-4o".into()),
            fallbacks: Some("alpha-4o:context_length".into()),
            list_cost_nanos: list,
            ..full()
        }
    }

    #[test]
    fn every_field_reads_back_alone_and_in_a_batch() {
        let hit = UsageRecord { cache: Some("hit".into()), cache_saved_nanos: Some(1_234), ..full() };
        for r in [full(), bare(), fell(Some(7)), fell(None), hit, UsageRecord { cache_saved_nanos: Some(-1), ..fell(Some(3)) }] {
            assert_eq!(decode_records(&entry(&r)).expect("decode"), vec![r.clone()]);
        }
        // As the commit writer joins a batch of one key's records.
        let mut batch = vec![b'['];
        encode(&full(), &mut batch);
        batch.push(b',');
        encode(&bare(), &mut batch);
        batch.push(b',');
        encode(&fell(None), &mut batch);
        batch.push(b']');
        assert_eq!(decode_records(&batch).expect("decode"), vec![full(), bare(), fell(None)]);
        // Only a call that fell back is written in version 2; its head reads alike.
        let (v1, v2) = (value(&full()), value(&fell(Some(7))));
        assert_eq!((v1[0], v2[0]), (BINARY_V1, BINARY_V2));
        assert_eq!(RecordHead::read(&v2), Some(RecordHead::of(&fell(Some(7)))));
        // A field of a later version is stepped over.
        let mut later = Vec::new();
        encode(&fell(None), &mut later);
        let count_at = later.len() - (1 + 2 + 8 + 2 + 23);
        assert_eq!(later[count_at], 2, "two fields follow the tags");
        later[count_at] = 3;
        later.extend_from_slice(&[9, 3, b'x', b'y', b'z']);
        let len = (later.len() - 5) as u32;
        later[1..5].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode_records(&later).expect("decode"), vec![fell(None)]);
    }

    #[test]
    fn a_head_reads_what_booking_needs_and_matches_the_whole_record() {
        let mut batch = vec![b'['];
        encode(&full(), &mut batch);
        batch.push(b',');
        encode(&bare(), &mut batch);
        batch.push(b']');
        let forms = stored_forms(&batch).expect("walk").expect("binary");
        assert_eq!(forms, vec![&value(&full())[..], &value(&bare())[..]], "each record's form, unread");
        for (form, r) in forms.iter().zip([full(), bare()]) {
            assert_eq!(RecordHead::read(form), Some(RecordHead::of(&r)));
            assert!(RecordHead::read(&form[..form.len() - 1]).is_none(), "a cut record has no head");
        }
        let json = serde_json::to_vec(&vec![full()]).expect("json");
        assert_eq!(stored_forms(&json).expect("walk"), None, "JSON entries are read whole");
    }

    #[test]
    fn json_entries_of_earlier_versions_still_read() {
        let (a, b) = (full(), bare());
        let array = serde_json::to_vec(&vec![a.clone(), b.clone()]).expect("json");
        assert_eq!(decode_records(&array).expect("array"), vec![a.clone(), b]);
        let object = serde_json::to_vec(&a).expect("json");
        assert_eq!(decode_records(&object).expect("object"), vec![a]);
    }

    #[test]
    fn a_damaged_entry_is_an_error_not_a_panic_or_a_wrong_record() {
        let whole = entry(&full());
        for cut in 2..whole.len() - 1 {
            assert!(decode_records(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.insert(whole.len() - 1, b'x');
        assert!(decode_records(&longer).is_err());
    }
}
