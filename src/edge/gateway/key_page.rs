//! The key holder's page, `/me` on the public listener (`console.key_page: true`): a static
//! page whose script asks `/me/data` with the key as a header. `/me/data` answers the calling
//! key's own balance, windows, usage and last requests, and nothing of any other key.

use crate::base::money::usd;
use crate::billing::ledger::Ledger;
use crate::protocol::response::LocalResponse;
use crate::records::key::KeyRecord;
use crate::records::usage::Grouping;
use crate::store::{RequestLogStore, StoreError};
use serde_json::{json, Value};

const PAGE: &str = include_str!("../../admin/console/assets/me.html");
const SCRIPT: &str = include_str!("../../admin/console/assets/me.js");
const STYLE: &str = include_str!("../../admin/console/assets/console.css");
/// Requests the page lists.
const RECENT: usize = 20;

/// `/me` (`file` ""), `/me/app.js` or `/me/app.css`.
pub fn page(file: &str) -> LocalResponse {
    let (text, content_type) = match file {
        "app.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "app.css" => (STYLE, "text/css; charset=utf-8"),
        _ => (PAGE, "text/html; charset=utf-8"),
    };
    let mut r = LocalResponse { status: 200, body: bytes::Bytes::from_static(text.as_bytes()), content_type, headers: Vec::new() };
    r.headers.push(("cache-control", "no-cache".into()));
    r.headers.push(("x-content-type-options", "nosniff".into()));
    r.headers.push(("x-frame-options", "DENY".into()));
    r.headers.push(("referrer-policy", "no-referrer".into()));
    r.headers.push((
        "content-security-policy",
        "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'".into(),
    ));
    r
}

/// What `/me/data` answers for `key`: the last 30 days (in the billing time zone).
pub async fn data(
    ledger: &Ledger,
    requests: Option<&dyn RequestLogStore>,
    key: &KeyRecord,
    calendar: &crate::policy::budget::Calendar,
) -> Result<Value, StoreError> {
    let now = crate::base::clock::now_unix();
    let today = crate::base::clock::date_in(now, calendar.tz());
    let first = crate::policy::budget::Calendar::add_days(&today, -29).unwrap_or_else(|| today.clone());
    let start_ms = calendar.day_start(&first).unwrap_or(0).saturating_mul(1000);
    let end_ms = crate::base::clock::now_ms().saturating_add(1);
    ledger.commit_now().await?;
    let (total, days) = ledger.usage_grouped(&key.id, start_ms, end_ms, &Grouping::Day(calendar.tz().clone())).await?;
    let (_, models) = ledger.usage_grouped(&key.id, start_ms, end_ms, &Grouping::Model).await?;
    let balance = ledger.balance(&key.id).await?;
    let budgets =
        crate::billing::ledger::window_report(ledger, crate::records::purse::window_owner(key), &key.policy.budgets, calendar).await?;
    let recent = match requests {
        Some(log) => {
            let filter =
                crate::records::log::Filter { key_id: Some(key.id.clone()), end_ms: u64::MAX, limit: RECENT, ..Default::default() };
            log.query(&filter).await?.0
        }
        None => Vec::new(),
    };
    let tz = calendar.tz();
    Ok(json!({
        "object": "key_page",
        "name": key.name,
        "timezone": calendar.name(),
        "balance": usd(balance),
        "total": total.to_json(),
        "budgets": budgets,
        "days": days.iter().rev().map(|(day, t)| json!({"day": day, "requests": t.requests, "cost": usd(t.cost_nanos)})).collect::<Vec<_>>(),
        "models": models.iter().map(|(model, t)| {
            let mut row = t.to_json();
            row["model"] = json!(model);
            row
        }).collect::<Vec<_>>(),
        "requests": recent.iter().map(|e| json!({
            "id": e.id,
            "time": crate::base::clock::time_in(e.time_ms, tz),
            "model": e.model,
            "route": e.route,
            "status": e.status,
            "refusal": e.refusal,
            "input_tokens": e.input_tokens,
            "output_tokens": e.output_tokens,
            "cost": usd(e.cost_nanos),
            "latency_ms": e.latency_ms,
        })).collect::<Vec<_>>(),
    }))
}
