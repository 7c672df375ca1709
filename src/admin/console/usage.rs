//! The usage page: totals grouped by key, model, provider or day (and CSV), and the rows the
//! overview and a key's page show.

use super::html::{self, count, esc};
use super::page::*;
use super::requests::*;
use super::{Form, Request};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::ApiError;
use crate::records::log::{Filter, LogEntry};
use crate::records::usage::{Grouping, Totals};
use std::collections::BTreeMap;
use std::fmt::Write;

/// What usage rows are grouped by.
#[derive(Clone, PartialEq)]
pub(super) enum Group {
    Key,
    Model,
    Provider,
    Day,
    Tag(String),
}

impl Group {
    pub(super) fn parse(text: &str, tag: &str) -> Result<Group, ApiError> {
        Ok(match text {
            "" | "key" => Group::Key,
            "model" => Group::Model,
            "provider" => Group::Provider,
            "day" => Group::Day,
            "tag" if !tag.is_empty() => Group::Tag(tag.to_string()),
            "tag" => return Err(bad("tag", "tag: name the tag to group by")),
            other => return Err(bad("group", format!("group: key, model, provider, day or tag, not '{other}'"))),
        })
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Group::Key => "key",
            Group::Model => "model",
            Group::Provider => "provider",
            Group::Day => "day",
            Group::Tag(_) => "tag",
        }
    }

    pub(super) fn grouping(&self, tz: &jiff::tz::TimeZone) -> Grouping {
        match self {
            Group::Key | Group::Model => Grouping::Model,
            Group::Provider => Grouping::Provider,
            Group::Day => Grouping::Day(tz.clone()),
            Group::Tag(name) => Grouping::Tag(name.clone()),
        }
    }

    /// The row a request-log entry counts in (None: this grouping cannot place it).
    pub(super) fn of_entry(&self, e: &LogEntry, tz: &jiff::tz::TimeZone) -> Option<String> {
        match self {
            Group::Key => e.key_id.clone(),
            Group::Model => Some(e.model.clone().unwrap_or_default()),
            Group::Provider => Some(e.provider.clone().unwrap_or_default()),
            Group::Day => Some(crate::base::clock::date_in(e.time_ms / 1000, tz)),
            Group::Tag(_) => None,
        }
    }
}

/// One row of the usage table.
#[derive(Default, Clone)]
pub(super) struct Row {
    pub(super) totals: Totals,
    /// Requests that failed or were refused and cost nothing.
    pub(super) failed: u64,
}

/// Usage of `keys` (every key when None) in `[start_ms, end_ms)`, grouped, from the records.
/// Rows by their label (a key id for `Group::Key`).
pub(super) async fn usage_rows(
    api: &AdminApi,
    keys: Option<&[crate::records::key::KeyRecord]>,
    group: &Group,
    (start_ms, end_ms): (u64, u64),
    tz: &jiff::tz::TimeZone,
) -> Result<BTreeMap<String, Row>, ApiError> {
    api.ledger.commit_now().await.map_err(internal)?;
    let all;
    let keys = match keys {
        Some(keys) => keys,
        None => {
            all = api.keys.all_keys().await.map_err(internal)?;
            &all[..]
        }
    };
    let by = group.grouping(tz);
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for key in keys {
        let (total, by_label) = api.ledger.usage_grouped(&key.id, start_ms, end_ms, &by).await.map_err(internal)?;
        if *group == Group::Key {
            if total.requests > 0 || total.cost_nanos != 0 || total.refunds > 0 {
                rows.entry(key.id.clone()).or_default().totals.merge(&total);
            }
            continue;
        }
        for (label, t) in by_label {
            rows.entry(label).or_default().totals.merge(&t);
        }
    }
    Ok(rows)
}

/// Count into `rows` the requests of `keys` that failed or were refused and cost nothing (from
/// the request log; a tag grouping cannot place them).
pub(super) async fn add_failures(
    api: &AdminApi,
    rows: &mut BTreeMap<String, Row>,
    keys: &[crate::records::key::KeyRecord],
    group: &Group,
    (start_ms, end_ms): (u64, u64),
    tz: &jiff::tz::TimeZone,
) -> Result<(), ApiError> {
    if matches!(group, Group::Tag(_)) {
        return Ok(());
    }
    // One key's page reads only that key's entries.
    let key_id = match keys {
        [one] => Some(one.id.clone()),
        _ => None,
    };
    // Requests refused before a key was known are no key's usage.
    let ids: std::collections::HashSet<&str> = keys.iter().map(|k| k.id.as_str()).collect();
    for_log(api, Filter { key_id, start_ms, end_ms, ..Default::default() }, |e| {
        if e.status >= 400 && e.cost_nanos == 0 && e.key_id.as_deref().is_some_and(|k| ids.contains(k)) {
            if let Some(label) = group.of_entry(e, tz) {
                rows.entry(label).or_default().failed += 1;
            }
        }
    })
    .await
}

/// The 95th percentile of `values` (0 when empty).
pub(super) fn p95(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[((values.len() - 1) as f64 * 0.95).round() as usize]
}

/// The usage page (or its CSV: exactly the rows of the table).
pub(super) async fn usage(api: &AdminApi, req: &Request, csv: bool) -> Page {
    let clock = Clock::now(api);
    let q = Form::parse(&req.query);
    let from = if q.get("from").is_empty() { clock.days_before(29) } else { q.get("from").to_string() };
    let to = if q.get("to").is_empty() { clock.today.clone() } else { q.get("to").to_string() };
    let checked = (|| -> Result<(Group, u64, u64), ApiError> {
        let group = Group::parse(q.get("group"), q.get("tag"))?;
        clock.calendar.day_start(&from).ok_or_else(|| bad("from", format!("from: a date YYYY-MM-DD, not '{from}'")))?;
        clock.calendar.day_start(&to).ok_or_else(|| bad("to", format!("to: a date YYYY-MM-DD, not '{to}'")))?;
        let (start_ms, end_ms) = clock.range_ms(&from, &to).ok_or_else(|| bad("to", "to: a date YYYY-MM-DD"))?;
        if end_ms <= start_ms {
            return Err(bad("to", "to: on or after from"));
        }
        if (end_ms - start_ms) / DAY_MS > MAX_RANGE_DAYS as u64 {
            return Err(bad("to", format!("to: at most {MAX_RANGE_DAYS} days after from")));
        }
        Ok((group, start_ms, end_ms))
    })();
    let (group, start_ms, end_ms) = match checked {
        Ok(c) => c,
        Err(e) if !csv => {
            let form = usage_form(&from, &to, q.get("group"), q.get("tag"), q.get("key"), Some(&e));
            let mut page = clock.page("Usage", "/console/usage", &req.csrf, &form);
            page.status = 400;
            return Ok(page);
        }
        Err(e) => return Err(e),
    };
    let only_key = q.get("key");
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let only = if only_key.is_empty() { None } else { Some(vec![api.key(only_key).await?]) };
    let mut rows = usage_rows(api, only.as_deref(), &group, (start_ms, end_ms), clock.tz()).await?;
    add_failures(api, &mut rows, only.as_deref().unwrap_or(&keys), &group, (start_ms, end_ms), clock.tz()).await?;
    let mut total = Row::default();
    for r in rows.values() {
        total.totals.merge(&r.totals);
        total.failed += r.failed;
    }
    let label_text = |label: &str| -> String {
        match group {
            Group::Key => names.get(label).map_or(label.to_string(), |n| format!("{n} ({label})")),
            _ if label.is_empty() => "(none)".to_string(),
            _ => label.to_string(),
        }
    };
    let head = [
        group_title(&group),
        "Requests",
        "Input tokens",
        "Output tokens",
        "Billed",
        "Refunds",
        "Refunded",
        "Failed, not billed",
        "Spend (net)",
        "At list price",
        "Margin",
        "Cache hits",
        "Saved by the cache",
    ];
    if csv {
        return Ok(usage_csv(&head, &rows, &label_text, group.name(), (&from, &to)));
    }
    // One precision for every amount of the table.
    let digits =
        html::money_digits(rows.values().chain([&total]).flat_map(|r| {
            [r.billed(), r.totals.refunded_nanos, r.spend(), r.totals.list_cost_nanos, r.margin(), r.totals.cache_saved_nanos]
        }));
    let cells = |label: String, r: &Row| {
        vec![
            label,
            count(r.totals.requests),
            count(r.totals.input_tokens),
            count(r.totals.output_tokens),
            html::nanos_at(r.billed(), digits),
            count(r.totals.refunds),
            html::nanos_at(r.totals.refunded_nanos, digits),
            count(r.failed),
            html::nanos_at(r.spend(), digits),
            html::nanos_at(r.totals.list_cost_nanos, digits),
            html::nanos_at(r.margin(), digits),
            count(r.totals.cache_hits),
            html::nanos_at(r.totals.cache_saved_nanos, digits),
        ]
    };
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, r)| {
            let shown = match group {
                Group::Key => key_link(label, &names),
                _ => esc(&label_text(label)),
            };
            cells(shown, r)
        })
        .collect();
    let foot = cells("Total".to_string(), &total);
    let csv_link = format!("/console/usage.csv?{}", req.query.replace('"', ""));
    let note = if matches!(group, Group::Tag(_)) {
        "<p><small>Failed requests carry no tags: with a tag grouping they are not counted.</small></p>"
    } else {
        ""
    };
    let body = format!(
        "{}<p><small>{} to {} inclusive, days in {}. Billed: what requests cost; refunds are credits given back (failed video tasks); \
failed, not billed: requests answered with an error that cost nothing (from the request log, kept {} days); \
spend (net): billed less refunds, the spend of every other page; at list price: what the same spend costs at the price table \
(without the groups', accounts' or plans' price multipliers); margin: spend less that; cache hits: answers from the response cache, \
and what they saved at list price.</small></p>{note}\
{}<p><a href=\"{}\" id=\"csv\">Download CSV</a> (exactly these rows)</p>",
        usage_form(&from, &to, q.get("group"), q.get("tag"), only_key, None),
        esc(&from),
        esc(&to),
        esc(clock.calendar.name()),
        api.request_log_days,
        html::table("usage", &head, &table_rows, Some(foot)),
        esc(&csv_link),
    );
    Ok(clock.page("Usage", "/console/usage", &req.csrf, &body))
}

pub(super) fn group_title(group: &Group) -> &'static str {
    match group {
        Group::Key => "Key",
        Group::Model => "Model",
        Group::Provider => "Provider",
        Group::Day => "Day",
        Group::Tag(_) => "Tag value",
    }
}

/// A CSV cell (quoted when it must be; a cell a spreadsheet could read as a formula — one that
/// begins with `=`, `+`, `-`, `@`, a tab or a carriage return, OWASP's list — gets a leading `'`,
/// except a plain number such as a refund's negative cost).
pub(super) fn csv_cell(text: &str) -> String {
    let number = text.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) && text.parse::<f64>().is_ok();
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) && !number { format!("'{text}") } else { text.to_string() };
    if text.contains([',', '"', '\n', '\r', '\t']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

pub(super) fn usage_form(from: &str, to: &str, group: &str, tag: &str, key: &str, error: Option<&ApiError>) -> String {
    let err = error.map(|e| (e.param.as_deref().unwrap_or("form"), e.message.as_str()));
    let mut options = String::new();
    for g in ["key", "model", "provider", "day", "tag"] {
        let sel = if g == group || (group.is_empty() && g == "key") { " selected" } else { "" };
        let _ = write!(options, "<option value=\"{g}\"{sel}>{g}</option>");
    }
    let group_error = match err {
        Some(("group", m)) => format!("<span class=\"error\">{}</span>", esc(m)),
        _ => String::new(),
    };
    let key_field = if key.is_empty() { String::new() } else { format!("<input type=\"hidden\" name=\"key\" value=\"{}\">", esc(key)) };
    format!(
        "<form method=\"get\" action=\"/console/usage\" class=\"filters\">{key_field}<label>Group by<select name=\"group\">{options}</select>{group_error}</label>{}{}{}\
<button type=\"submit\" class=\"secondary\">Show</button></form>",
        html::field("tag", "Tag name (group by tag)", tag, err, ""),
        html::field("from", "From", from, err, "YYYY-MM-DD"),
        html::field("to", "To (inclusive)", to, err, "YYYY-MM-DD"),
    )
}

impl Row {
    /// What was charged before credits: the usage table's "Billed" column (its "Refunded" column
    /// beside it).
    pub(super) fn billed(&self) -> i64 {
        self.totals.cost_nanos.saturating_sub(self.totals.refunded_nanos)
    }

    /// Spend, the one definition every page, chart and CSV uses, as `/v1/usage` and
    /// `/admin/usage` (`cost`) do: charges net of refunds and credits.
    pub(super) fn spend(&self) -> i64 {
        self.totals.cost_nanos
    }

    /// What the spend was charged beyond the price table (negative: below it).
    pub(super) fn margin(&self) -> i64 {
        self.totals.cost_nanos.saturating_sub(self.totals.list_cost_nanos)
    }
}

/// The usage table's rows as CSV (exactly the page's rows, amounts to the nano-dollar).
fn usage_csv(
    head: &[&str],
    rows: &BTreeMap<String, Row>,
    label_text: &dyn Fn(&str) -> String,
    group: &str,
    (from, to): (&str, &str),
) -> LocalResponse {
    let mut out = String::new();
    out.push_str(&head.iter().map(|h| csv_cell(h)).collect::<Vec<_>>().join(","));
    out.push('\n');
    for (label, r) in rows {
        let cells = [
            label_text(label),
            r.totals.requests.to_string(),
            r.totals.input_tokens.to_string(),
            r.totals.output_tokens.to_string(),
            format!("{:.9}", crate::base::money::usd(r.billed())),
            r.totals.refunds.to_string(),
            format!("{:.9}", crate::base::money::usd(r.totals.refunded_nanos)),
            r.failed.to_string(),
            format!("{:.9}", crate::base::money::usd(r.spend())),
            format!("{:.9}", crate::base::money::usd(r.totals.list_cost_nanos)),
            format!("{:.9}", crate::base::money::usd(r.margin())),
            r.totals.cache_hits.to_string(),
            format!("{:.9}", crate::base::money::usd(r.totals.cache_saved_nanos)),
        ];
        out.push_str(&cells.iter().map(|c| csv_cell(c)).collect::<Vec<_>>().join(","));
        out.push('\n');
    }
    let mut resp = LocalResponse { status: 200, body: out.into(), content_type: "text/csv; charset=utf-8", headers: Vec::new() };
    resp.headers.push(("content-disposition", format!("attachment; filename=\"usage-{}-{from}-{to}.csv\"", group)));
    resp.headers.push(("cache-control", "no-store".into()));
    resp
}
