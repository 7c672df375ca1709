//! The request log's pages: the list (filtered) and one request.

use super::html::{self, count, enc, esc, nanos};
use super::page::*;
use super::{Form, Request};
use crate::admin::api::AdminApi;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::log::{Filter, LogEntry};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Every request-log entry the filter matches (newest first), up to [`MAX_LOG_SCAN`].
pub(super) async fn for_log(api: &AdminApi, mut filter: Filter, mut each: impl FnMut(&LogEntry)) -> Result<(), ApiError> {
    filter.limit = 5000;
    let mut seen = 0;
    loop {
        let (entries, next) = api.store.requests().query(&filter).await.map_err(internal)?;
        seen += entries.len();
        entries.iter().for_each(&mut each);
        match next {
            Some(cursor) if seen < MAX_LOG_SCAN => filter.before = Some(cursor),
            _ => return Ok(()),
        }
    }
}

pub(super) fn request_row(e: &LogEntry, names: &BTreeMap<String, String>, tz: &jiff::tz::TimeZone) -> Vec<String> {
    let status = match &e.refusal {
        Some(r) => format!("{} <small>{}</small>", e.status, esc(r)),
        None => e.status.to_string(),
    };
    vec![
        crate::base::clock::time_in(e.time_ms, tz),
        e.key_id.as_deref().map_or("—".to_string(), |k| key_link(k, names)),
        esc(e.model.as_deref().unwrap_or("—")),
        esc(&e.route),
        esc(e.provider.as_deref().unwrap_or("—")),
        status,
        format!("{} / {}", count(e.input_tokens), count(e.output_tokens)),
        format!("{}{}", nanos(e.cost_nanos), if e.estimated { " <small>est.</small>" } else { "" }),
        format!("{} ms", count(e.latency_ms)),
        format!("<a href=\"/console/requests/{}\" class=\"mono\">{}</a>", enc(&e.id), esc(&e.id)),
    ]
}

pub(super) async fn requests(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let q = Form::parse(&req.query);
    let mut filter = Filter { end_ms: u64::MAX, limit: 50, ..Default::default() };
    let checked = (|| -> Result<(), ApiError> {
        if !q.get("key").is_empty() {
            filter.key_id = Some(q.get("key").to_string());
        }
        if !q.get("model").is_empty() {
            filter.model = Some(q.get("model").to_string());
        }
        if !q.get("route").is_empty() {
            filter.route = Some(q.get("route").to_string());
        }
        match q.get("status") {
            "" => {}
            s @ ("2xx" | "3xx" | "4xx" | "5xx") => filter.status_class = s[..1].parse().ok(),
            other => return Err(bad("status", format!("status: 2xx, 3xx, 4xx or 5xx, not '{other}'"))),
        }
        match q.get("guardrail") {
            "" => {}
            a @ ("block" | "mask" | "monitor" | "error") => filter.guardrail_action = Some(a.to_string()),
            other => return Err(bad("guardrail", format!("guardrail: block, mask, monitor or error, not '{other}'"))),
        }
        if !q.get("from").is_empty() {
            filter.start_ms =
                clock.calendar.day_start(q.get("from")).ok_or_else(|| bad("from", "from: a date YYYY-MM-DD"))?.saturating_mul(1000);
        }
        if !q.get("to").is_empty() {
            filter.end_ms = clock.range_ms(q.get("to"), q.get("to")).ok_or_else(|| bad("to", "to: a date YYYY-MM-DD"))?.1;
        }
        if !q.get("cursor").is_empty() {
            filter.before =
                Some(crate::records::log::Cursor::parse(q.get("cursor")).ok_or_else(|| bad("cursor", "cursor: a page's next"))?);
        }
        Ok(())
    })();
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let mut key_options = String::from("<option value=\"\">any</option>");
    for k in &keys {
        let sel = if q.get("key") == k.id { " selected" } else { "" };
        let _ = write!(key_options, "<option value=\"{}\"{sel}>{}</option>", esc(&k.id), esc(&k.name));
    }
    let mut status_options = String::from("<option value=\"\">any</option>");
    for s in ["2xx", "3xx", "4xx", "5xx"] {
        let sel = if q.get("status") == s { " selected" } else { "" };
        let _ = write!(status_options, "<option value=\"{s}\"{sel}>{s}</option>");
    }
    let mut guard_options = String::from("<option value=\"\">any</option>");
    for a in ["block", "mask", "monitor", "error"] {
        let sel = if q.get("guardrail") == a { " selected" } else { "" };
        let _ = write!(guard_options, "<option value=\"{a}\"{sel}>{a}</option>");
    }
    let err = checked.as_ref().err().map(|e| (e.param.as_deref().unwrap_or("form"), e.message.as_str()));
    let status_error = match err {
        Some(("status", m)) => format!("<span class=\"error\">{}</span>", esc(m)),
        _ => String::new(),
    };
    let filters = format!(
        "<form method=\"get\" action=\"/console/requests\" class=\"filters\"><label>Key<select name=\"key\">{key_options}</select></label>{}\
{}<label>Status<select name=\"status\">{status_options}</select>{status_error}</label><label>Guardrail<select name=\"guardrail\">{guard_options}</select></label>{}{}<button type=\"submit\" class=\"secondary\">Filter</button></form>",
        html::field("model", "Model", q.get("model"), err, ""),
        html::field("route", "Route", q.get("route"), err, "chat_completions"),
        html::field("from", "From", q.get("from"), err, "YYYY-MM-DD"),
        html::field("to", "To (inclusive)", q.get("to"), err, "YYYY-MM-DD"),
    );
    if checked.is_err() {
        let mut page = clock.page("Requests", "/console/requests", &req.csrf, &filters);
        page.status = 400;
        return Ok(page);
    }
    let (entries, next) = api.store.requests().query(&filter).await.map_err(internal)?;
    let rows: Vec<Vec<String>> = entries.iter().map(|e| request_row(e, &names, clock.tz())).collect();
    let pager = match next {
        Some(cursor) => {
            let mut params: Vec<String> = ["key", "model", "route", "status", "guardrail", "from", "to"]
                .iter()
                .filter(|n| !q.get(n).is_empty())
                .map(|n| format!("{n}={}", enc(q.get(n))))
                .collect();
            params.push(format!("cursor={}", enc(&cursor.to_string())));
            format!("<p class=\"pager\"><a href=\"/console/requests?{}\" id=\"older\">Older requests</a></p>", esc(&params.join("&")))
        }
        None => String::new(),
    };
    let body = format!(
        "{filters}<p><small>Kept {} days (at most {} entries); never a prompt or an answer.</small></p>{}{pager}",
        api.request_log_days,
        count(api.request_log_max as u64),
        html::table("requests", &REQUEST_HEAD, &rows, None)
    );
    Ok(clock.page("Requests", "/console/requests", &req.csrf, &body))
}

pub(super) async fn request_detail(api: &AdminApi, req: &Request, id: &str) -> Page {
    let clock = Clock::now(api);
    let filter = Filter { id: Some(id.to_string()), end_ms: u64::MAX, limit: 1, ..Default::default() };
    let (entries, _) = api.store.requests().query(&filter).await.map_err(internal)?;
    let Some(e) = entries.first() else {
        return Err(ApiError::new(ErrorKind::NotFound, format!("No request with id '{id}' in the log.")));
    };
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let opt = |v: &Option<String>| v.as_deref().map_or("—".to_string(), esc);
    let outcome = match (&e.refusal, e.status) {
        (Some(r), _) => format!(
            "Refused or failed by tollgate: <strong>{}</strong>{}",
            esc(r),
            e.param.as_deref().map_or(String::new(), |p| format!(" (about <code>{}</code>)", esc(p)))
        ),
        (None, s) if s >= 400 => format!("The upstream answered <strong>{s}</strong>"),
        (None, s) => format!("Answered {s}"),
    };
    let rows = vec![
        vec!["Id".to_string(), format!("<span class=\"mono\">{}</span>", esc(&e.id))],
        vec!["Time".to_string(), crate::base::clock::time_in(e.time_ms, clock.tz())],
        vec!["Outcome".to_string(), outcome],
        vec!["Key".to_string(), e.key_id.as_deref().map_or("—".to_string(), |k| key_link(k, &names))],
        vec!["Model".to_string(), opt(&e.model)],
        vec!["Route".to_string(), esc(&e.route)],
        vec!["Client protocol".to_string(), esc(&e.protocol)],
        vec!["Upstream protocol".to_string(), opt(&e.upstream_protocol)],
        vec!["Provider".to_string(), opt(&e.provider)],
        vec!["Attempts".to_string(), e.attempts.to_string()],
        vec!["Tokens".to_string(), format!("{} in, {} out", count(e.input_tokens), count(e.output_tokens))],
        vec!["Cost".to_string(), format!("{}{}", nanos(e.cost_nanos), if e.estimated { " (estimated)" } else { "" })],
        vec!["Latency".to_string(), format!("{} ms", count(e.latency_ms))],
        vec!["First byte".to_string(), e.first_byte_ms.map_or("—".to_string(), |ms| format!("{} ms", count(ms)))],
        vec!["Upstream request id".to_string(), opt(&e.upstream_request_id)],
        vec!["Upstream model".to_string(), opt(&e.upstream_model)],
        vec!["Guardrails".to_string(), opt(&e.guardrail)],
        vec!["Fallbacks".to_string(), opt(&e.fallbacks)],
        vec![
            "Response cache".to_string(),
            match (&e.cache, e.cache_saved_nanos) {
                (Some(c), Some(saved)) => format!("{} (saved {})", esc(c), nanos(saved)),
                (c, _) => opt(c),
            },
        ],
    ];
    let body = format!("{}<p><a href=\"/console/requests\">All requests</a></p>", html::table("request", &["Field", "Value"], &rows, None));
    Ok(clock.page(&format!("Request {}", e.id), "/console/requests", &req.csrf, &body))
}

pub(super) const REQUEST_HEAD: [&str; 10] =
    ["Time", "Key", "Model", "Route", "Provider", "Status", "Tokens in/out", "Cost", "Latency", "Id"];
