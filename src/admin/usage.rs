//! The operator's usage view, `GET /admin/usage`: every key's usage summed by key, account,
//! model, day or tag value, with what it cost at the price table and the margin.

use super::api::{internal, AdminApi};
use crate::admin::refusal::bad;
use crate::protocol::response::LocalResponse;
use crate::protocol::ApiError;
use serde_json::{json, Value};

/// Most days `GET /admin/usage?group_by=day` reports at once.
const MAX_USAGE_DAYS: u64 = 366;
/// Days `GET /admin/usage?group_by=day` reports without `start`: the last 30, today included.
const DEFAULT_USAGE_DAYS: u64 = 30;

impl AdminApi {
    /// `GET /admin/usage?group_by=key|account|model|day|tag:<name>&start=&end=`: every key's
    /// usage in the window, one row per key, account, model, UTC day or tag value (with
    /// `/v1/usage`'s counters, what they cost at the price table and the margin).
    pub(super) async fn usage_by(&self, query: Option<&str>) -> std::result::Result<LocalResponse, ApiError> {
        let (start, end) = crate::billing::ledger::usage_window(query)?;
        let group_by = query.unwrap_or_default().split('&').find_map(|p| p.strip_prefix("group_by=")).unwrap_or("key").to_string();
        self.ledger.commit_now().await.map_err(internal)?;
        let keys = self.keys.all_keys().await.map_err(internal)?;
        let mut total = crate::records::usage::Totals::default();
        let mut rows: std::collections::BTreeMap<String, (Value, crate::records::usage::Totals)> = std::collections::BTreeMap::new();
        let mut add = |label: String, tag: Value, t: &crate::records::usage::Totals| {
            let row = rows.entry(label).or_insert_with(|| (tag, crate::records::usage::Totals::default()));
            row.1.merge(t);
        };
        match group_by.as_str() {
            "key" | "model" | "account" => {
                for rec in &keys {
                    let (t, by_model) = self.ledger.usage_summary(&rec.id, start, end).await.map_err(internal)?;
                    total.merge(&t);
                    let used = t.requests > 0 || t.cost_nanos != 0;
                    if group_by == "key" {
                        if used {
                            add(rec.id.clone(), json!({"key": {"id": rec.id, "name": rec.name, "group": rec.group}}), &t);
                        }
                    } else if group_by == "account" {
                        // Keys of no account are one row (`account: null`).
                        if used {
                            let account = rec.policy.account.clone();
                            add(account.clone().unwrap_or_default(), json!({"account": account}), &t);
                        }
                    } else {
                        for (model, t) in &by_model {
                            add(model.clone(), json!({"model": model}), t);
                        }
                    }
                }
            }
            "day" => {
                const DAY_MS: u64 = 86_400_000;
                let end = end.min(crate::base::clock::now_ms().div_ceil(DAY_MS) * DAY_MS);
                // Without `start`: the last DEFAULT_USAGE_DAYS days up to `end`.
                let start = if start == 0 { (end.div_ceil(DAY_MS).saturating_sub(DEFAULT_USAGE_DAYS)) * DAY_MS } else { start };
                let first = start / DAY_MS;
                let days = end.div_ceil(DAY_MS).saturating_sub(first);
                if days > MAX_USAGE_DAYS {
                    return Err(bad(format!("group_by=day: at most {MAX_USAGE_DAYS} days from start to end")).with_param("start"));
                }
                // One read per key, its records grouped by UTC day (not one per key and day).
                let by_day = crate::records::usage::Grouping::Day(jiff::tz::TimeZone::UTC);
                for rec in &keys {
                    let (t, days) = self.ledger.usage_grouped(&rec.id, start, end, &by_day).await.map_err(internal)?;
                    total.merge(&t);
                    for (day, t) in &days {
                        if t.requests > 0 || t.cost_nanos != 0 {
                            add(day.clone(), json!({"day": day}), t);
                        }
                    }
                }
            }
            other => {
                let Some(ref by @ crate::records::usage::Grouping::Tag(ref name)) = crate::records::usage::Grouping::parse(other) else {
                    return Err(bad(format!("group_by: key, account, model, day or tag:<name>, not '{other}'")).with_param("group_by"));
                };
                for rec in &keys {
                    let (t, by_value) = self.ledger.usage_grouped(&rec.id, start, end, by).await.map_err(internal)?;
                    total.merge(&t);
                    for (value, t) in &by_value {
                        let shown = if value.is_empty() { Value::Null } else { json!(value) };
                        add(value.clone(), json!({"tag": name, "value": shown}), t);
                    }
                }
            }
        }
        let data: Vec<Value> = rows
            .into_values()
            .map(|(mut tag, t)| {
                if let (Some(tag), Value::Object(counters)) = (tag.as_object_mut(), t.to_json_with_margin()) {
                    tag.extend(counters);
                }
                tag
            })
            .collect();
        Ok(LocalResponse::json(200, &json!({"object": "usage", "group_by": group_by, "total": total.to_json_with_margin(), "data": data})))
    }
}
