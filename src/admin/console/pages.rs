//! The console's router and its overview page; the other pages are files of their own (keys,
//! usage, requests, providers). Each reads what it shows from the same store as the admin API; the
//! key forms go through `AdminApi::create_key` and `AdminApi::patch_key`.

use super::html::{self, count, esc, nanos};
use super::keys::*;
use super::page::*;
use super::providers::*;
use super::requests::*;
use super::reveal::Reveals;
use super::usage::*;
use super::{html as reply, Request};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::log::Filter;
use std::collections::BTreeMap;
use std::fmt::Write;

pub(super) async fn route(api: &AdminApi, reveals: &Reveals, req: &Request) -> LocalResponse {
    let path = req.path.trim_end_matches('/');
    let path = if path.is_empty() { "/console" } else { path };
    let result = match (req.method.as_str(), path) {
        ("GET", "/console") => overview(api, req).await,
        ("GET", "/console/keys") => keys(api, req, None).await,
        ("POST", "/console/keys") => create_key(api, reveals, req).await,
        ("GET", p) if p.starts_with("/console/keys/created/") => key_created(api, reveals, req, &p["/console/keys/created/".len()..]),
        ("GET", "/console/usage") => usage(api, req, false).await,
        ("GET", "/console/usage.csv") => usage(api, req, true).await,
        ("GET", "/console/requests") => requests(api, req).await,
        ("GET", "/console/providers") => providers(api, req).await,
        ("GET", "/console/video") => video(api, req).await,
        ("GET", "/console/mcp") => super::providers::mcp(api, req).await,
        ("GET", "/console/batches") => super::providers::batches(api, req).await,
        ("GET", "/console/files") => super::providers::files(api, req).await,
        ("GET", "/console/accounts") => super::accounts::accounts(api, req).await,
        ("GET", "/console/groups") => super::accounts::groups(api, req).await,
        ("GET", p) if p.starts_with("/console/accounts/") => {
            super::accounts::account(api, req, &p["/console/accounts/".len()..], None).await
        }
        ("POST", p) if p.starts_with("/console/accounts/") => {
            super::accounts::account_action(api, req, &p["/console/accounts/".len()..]).await
        }
        ("GET", "/console/people") => super::roster::people(api, req).await,
        ("POST", "/console/people") => super::roster::set_person(api, req).await,
        ("GET", p) if p.starts_with("/console/requests/") => request_detail(api, req, &p["/console/requests/".len()..]).await,
        ("GET", p) if p.starts_with("/console/keys/") => key_detail(api, req, &p["/console/keys/".len()..], None).await,
        ("POST", p) if p.starts_with("/console/keys/") => key_action(api, reveals, req, &p["/console/keys/".len()..]).await,
        _ => Err(ApiError::new(ErrorKind::NotFound, format!("No console page at {} {}.", req.method, req.path))),
    };
    match result {
        Ok(r) => r,
        Err(e) => {
            let tz = api.routing.load().calendar.name().to_string();
            let body = format!("<p class=\"alert\" role=\"alert\">{}</p><p><a href=\"/console\">Overview</a></p>", esc(&e.message));
            reply(e.status(), html::page(if e.status() == 404 { "Not found" } else { "Error" }, "", &req.csrf, &tz, &body))
        }
    }
}

/// Whether a logged request counts as an error: a 4xx or 5xx, but not the MCP protocol's own
/// `405` to a `GET /mcp` (a client asking for a stream the server does not offer, as the
/// protocol lets it).
fn failed(route: &str, status: u16) -> bool {
    status >= 400 && !(route == "mcp" && status == 405)
}

async fn overview(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let first = clock.days_before(29);
    let (start, end) = clock.range_ms(&first, &clock.today).ok_or_else(|| internal("calendar"))?;
    let day_rows = usage_rows(api, None, &Group::Day, (start, end), clock.tz()).await?;
    let periods = [("Today", clock.today.clone()), ("7 days", clock.days_before(6)), ("30 days", first.clone())];
    // Error rate and latency from the request log (kept `console.request_log_days`).
    let mut latencies: [Vec<u64>; 3] = Default::default();
    let mut logged = [(0u64, 0u64); 3];
    for_log(api, Filter { start_ms: start, end_ms: end, ..Default::default() }, |e| {
        let day = crate::base::clock::date_in(e.time_ms / 1000, clock.tz());
        for (i, (_, from)) in periods.iter().enumerate() {
            if day >= *from {
                logged[i].0 += 1;
                logged[i].1 += u64::from(failed(&e.route, e.status));
                latencies[i].push(e.latency_ms);
            }
        }
    })
    .await?;
    let mut tiles = String::from("<div class=\"tiles\">");
    for (i, (name, from)) in periods.iter().enumerate() {
        let mut t = Row::default();
        for (_, row) in day_rows.range(from.clone()..) {
            t.totals.merge(&row.totals);
        }
        let (n, errors) = logged[i];
        // The rate says the counts it is computed over (the request log's, refusals included).
        let rate = if n == 0 {
            "—".to_string()
        } else {
            format!("{:.1}% <small>({} of {} logged)</small>", errors as f64 * 100.0 / n as f64, count(errors), count(n))
        };
        let p95 = if n == 0 { "—".to_string() } else { format!("{} ms", count(p95(&mut latencies[i]))) };
        let _ = write!(
            tiles,
            "<section class=\"tile\" id=\"period-{i}\"><h2>{name} <small>since {from}</small></h2><dl>\
<dt>Spend</dt><dd class=\"spend\">{}</dd><dt>Billed requests</dt><dd>{}</dd><dt>Tokens</dt><dd>{}</dd>\
<dt>Error rate</dt><dd>{rate}</dd><dt>p95 latency</dt><dd>{p95}</dd></dl></section>",
            nanos(t.spend()),
            count(t.totals.requests),
            count(t.totals.input_tokens.saturating_add(t.totals.output_tokens)),
        );
    }
    tiles.push_str("</div>");
    let mut days = Vec::with_capacity(30);
    for i in (0..30).rev() {
        let day = clock.days_before(i);
        let spend = day_rows.get(&day).map_or(0, Row::spend);
        days.push((day, spend));
    }
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let top_keys = usage_rows(api, None, &Group::Key, (start, end), clock.tz()).await?;
    let top_models = usage_rows(api, None, &Group::Model, (start, end), clock.tz()).await?;
    let top = |rows: &BTreeMap<String, Row>, label: &dyn Fn(&str) -> String| {
        let mut sorted: Vec<(&String, &Row)> = rows.iter().filter(|(_, r)| r.totals.requests > 0 || r.spend() != 0).collect();
        sorted.sort_by_key(|(_, r)| std::cmp::Reverse(r.spend()));
        sorted.iter().take(10).map(|(l, r)| vec![label(l), nanos(r.spend()), count(r.totals.requests)]).collect::<Vec<_>>()
    };
    let key_rows = top(&top_keys, &|id| key_link(id, &names));
    let model_rows = top(&top_models, &|m| esc(m));
    let body = format!(
        "{tiles}<h2>Spend per day, last 30 days</h2>{}<div class=\"cols\"><div><h2>Top keys (30 days)</h2>{}</div><div><h2>Top models (30 days)</h2>{}</div></div>\
<h2>Providers</h2>{}",
        html::spend_chart(&days),
        html::table("top-keys", &["Key", "Spend", "Requests"], &key_rows, None),
        html::table("top-models", &["Model", "Spend", "Requests"], &model_rows, None),
        health_strip(api),
    );
    Ok(clock.page("Overview", "/console", &req.csrf, &body))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mcp_protocols_own_405_is_no_error() {
        assert!(super::failed("chat_completions", 429) && super::failed("mcp", 500) && super::failed("mcp", 403));
        assert!(!super::failed("mcp", 405) && !super::failed("chat_completions", 200));
    }
}
