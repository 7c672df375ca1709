//! The providers' page (health, cooldowns, keys), and the read-only pages of video tasks, batches,
//! files and MCP servers.

use super::html::{self, count, esc, nanos};
use super::page::*;
use super::requests::*;
use super::{Form, Request};
use crate::admin::api::AdminApi;
use crate::records::log::Filter;
use std::collections::BTreeMap;
use std::fmt::Write;

pub(super) fn state_name(state: crate::upstream::health::State) -> &'static str {
    match state {
        crate::upstream::health::State::Healthy => "healthy",
        crate::upstream::health::State::Cooling(_) => "cooling",
        crate::upstream::health::State::HalfOpen { .. } => "half-open",
    }
}

pub(super) fn health_strip(api: &AdminApi) -> String {
    let mut out = String::from("<div class=\"strip\" id=\"health\">");
    for (name, state, _) in api.health.states() {
        let s = state_name(state);
        let _ = write!(out, "<a href=\"/console/providers\" class=\"state {s}\">{}: {s}</a>", esc(&name));
    }
    out.push_str("</div>");
    out
}

pub(super) async fn providers(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let now_ms = crate::base::clock::now_ms();
    let since = now_ms.saturating_sub(15 * 60 * 1000);
    #[derive(Default)]
    struct Recent {
        n: u64,
        ok: u64,
        latency: Vec<u64>,
        first_byte: Vec<u64>,
    }
    let mut recent: BTreeMap<String, Recent> = BTreeMap::new();
    for_log(api, Filter { start_ms: since, end_ms: u64::MAX, ..Default::default() }, |e| {
        if let Some(p) = &e.provider {
            let r = recent.entry(p.clone()).or_default();
            r.n += 1;
            r.ok += u64::from((200..400).contains(&e.status));
            r.latency.push(e.latency_ms);
            r.first_byte.extend(e.first_byte_ms);
        }
    })
    .await?;
    let states: BTreeMap<String, (crate::upstream::health::State, Vec<crate::upstream::health::State>)> =
        api.health.states().into_iter().map(|(n, s, k)| (n, (s, k))).collect();
    let routing = api.routing.load();
    let mut rows = Vec::new();
    for u in &routing.catalog.upstreams {
        let c = &u.config;
        let (state, pool) = states.get(&c.name).cloned().unwrap_or((crate::upstream::health::State::Healthy, Vec::new()));
        let s = state_name(state);
        let pool = if pool.is_empty() {
            "—".to_string()
        } else {
            pool.iter()
                .enumerate()
                .map(|(i, k)| format!("#{i} <span class=\"state {0}\">{0}</span>", state_name(*k)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let r = recent.remove(&c.name).unwrap_or_default();
        let median = |v: &mut Vec<u64>| -> String {
            if v.is_empty() {
                return "—".to_string();
            }
            v.sort_unstable();
            format!("{} ms", count(v[v.len() / 2]))
        };
        let (mut latency, mut first_byte) = (r.latency, r.first_byte);
        rows.push(vec![
            esc(&c.name),
            // What the file configured (a cloud by its name), and the wire protocol when it differs.
            match c.kind.as_str() == c.protocol.as_str() {
                true => esc(c.kind.as_str()),
                false => format!("{} <small>({})</small>", esc(c.kind.as_str()), esc(c.protocol.as_str())),
            },
            format!("<span class=\"state {s}\">{s}</span>"),
            if r.n == 0 { "—".to_string() } else { format!("{:.1}% of {}", r.ok as f64 * 100.0 / r.n as f64, count(r.n)) },
            median(&mut latency),
            median(&mut first_byte),
            // Each model as clients call it, with the upstream's own name when it differs.
            c.models
                .iter()
                .map(|m| match c.upstream_names.get(m) {
                    Some(theirs) => format!("{} → <small>{}</small>", esc(m), esc(theirs)),
                    None => esc(m),
                })
                .collect::<Vec<_>>()
                .join(", "),
            pool,
        ]);
    }
    let body = format!(
        "<p><small>Success rate, latency and time to first byte: medians of the last 15 minutes' requests (request log).</small></p>{}{}",
        html::table(
            "providers",
            &["Provider", "Kind", "State", "Success", "Latency p50", "First byte p50", "Models (→ upstream name)", "Key pool"],
            &rows,
            None
        ),
        prices(api, &routing).await?
    );
    Ok(clock.page("Providers", "/console/providers", &req.csrf, &body))
}

/// The served models' token prices and where each comes from (the file, or the feed), the
/// feed's last reads and its latest changes (from the audit trail).
async fn prices(api: &AdminApi, routing: &crate::upstream::Routing) -> Result<String, crate::protocol::ApiError> {
    let feed = api.selling.feed.as_ref();
    let fed = feed.map(|f| f.current()).unwrap_or_default();
    let mut rows = Vec::new();
    for u in &routing.catalog.upstreams {
        for m in &u.config.models {
            let Some(p) = routing.prices.price(m) else { continue };
            let source = if fed.contains_key(m) { "feed" } else { "file" };
            let per_m = |n: i64| format!("${:.4}", n as f64 / 1e9);
            rows.push(vec![esc(m), per_m(p.input), per_m(p.output), per_m(p.cached_input), source.to_string()]);
        }
    }
    let mut out = format!(
        "<h2>Prices</h2>{}",
        html::table("prices", &["Model", "Input /1M", "Output /1M", "Cached input /1M", "Source"], &rows, None)
    );
    let Some(feed) = feed else { return Ok(out) };
    let status = feed.status();
    let when = |t: u64| crate::protocol::rfc3339(t);
    out.push_str(&format!(
        "<p id=\"price-feed\">Price feed ({}): last applied {}{}.</p>",
        esc(&crate::base::text::redact_url(&feed.cfg.url)),
        status.last_applied.map_or("never".to_string(), when),
        status.last_failure.filter(|(t, _)| Some(*t) > status.last_applied).map_or(String::new(), |(t, e)| format!(
            "; <span class=\"state down\">the read at {} failed ({}): the last good prices stay</span>",
            when(t),
            esc(&e)
        )),
    ));
    let changes: Vec<Vec<String>> = api
        .ledger
        .audit(500, None)
        .await
        .map_err(internal)?
        .iter()
        .filter(|e| e.id == "price_feed")
        .take(20)
        .map(|e| vec![when(e.time_ms / 1000), esc(e.reason.as_deref().unwrap_or_default())])
        .collect();
    if !changes.is_empty() {
        out.push_str(&html::table("price-changes", &["When", "Change"], &changes, None));
    }
    Ok(out)
}

pub(super) async fn video(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let Some(video) = &api.video else {
        let body = "<p>No video service is configured (<code>video:</code>).</p>";
        return Ok(clock.page("Video tasks", "/console/video", &req.csrf, body));
    };
    let q = Form::parse(&req.query);
    let wanted = q.get("status");
    let keys = api.keys.all_keys().await.map_err(internal)?;
    let names = key_names(&keys);
    let tasks = video.recent_tasks(VIDEO_TASKS).await.map_err(internal)?;
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows = Vec::new();
    let when = |secs: u64| if secs == 0 { "—".to_string() } else { crate::base::clock::time_in(secs * 1000, clock.tz()) };
    for t in &tasks {
        let status = t.status.public();
        *by_status.entry(status).or_default() += 1;
        if !wanted.is_empty() && wanted != status {
            continue;
        }
        let took = t.completed_at.map_or("—".to_string(), |done| format!("{} s", count(done.saturating_sub(t.created_at))));
        let outcome = match (&t.error, t.refunded) {
            (Some(e), true) => format!("{} <small>refunded</small>", esc(&e.code)),
            (Some(e), false) => esc(&e.code),
            (None, _) => String::new(),
        };
        rows.push(vec![
            format!("<span class=\"mono\">{}</span>", esc(&t.id)),
            key_link(&t.owner, &names),
            esc(&t.api_model),
            format!("<span class=\"state {status}\">{status}</span> {}% {outcome}", t.progress),
            esc(t.job_id.as_deref().unwrap_or("—")),
            when(t.created_at),
            when(t.last_polled_at),
            took,
            nanos(t.cost_nanos),
        ]);
    }
    let (completed, failed) = video.finished_counts();
    let mut links = String::from("<p><a href=\"/console/video\">all</a>");
    for (s, n) in &by_status {
        let _ = write!(links, " · <a href=\"/console/video?status={s}\">{s} ({n})</a>");
    }
    links.push_str("</p>");
    let body = format!(
        "{links}<p><small>The {VIDEO_TASKS} most recently updated tasks. Finished since this process started: {completed} completed, {failed} failed.</small></p>{}",
        html::table("video", &["Task", "Key", "Model", "Status", "Upstream job", "Created", "Last polled", "Took", "Price"], &rows, None)
    );
    Ok(clock.page("Video tasks", "/console/video", &req.csrf, &body))
}

/// Tasks the video page lists (the most recently updated).
pub(super) const VIDEO_TASKS: usize = 500;

/// `/console/mcp` (read-only): each MCP server behind `/mcp` — its address (credentials
/// redacted), transport, how it is signed in to (never the secret), its price per call and
/// timeout — and its last 24 hours of tool calls from the request log: calls, failures (the
/// server unreachable or refusing), what they were billed, the last failure's time.
pub(super) async fn mcp(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let Some(hub) = &api.mcp else {
        let body = "<p>No MCP server is configured (<code>mcp.servers</code>).</p>";
        return Ok(clock.page("MCP servers", "/console/mcp", &req.csrf, body));
    };
    #[derive(Default)]
    struct Calls {
        n: u64,
        failed: u64,
        cost: i64,
        last_failed: Option<u64>,
    }
    let since = crate::base::clock::now_ms().saturating_sub(24 * 3600 * 1000);
    let mut calls: BTreeMap<String, Calls> = BTreeMap::new();
    for_log(api, Filter { start_ms: since, end_ms: u64::MAX, route: Some("mcp_tool_call".into()), ..Default::default() }, |e| {
        if let Some(server) = &e.provider {
            let c = calls.entry(server.clone()).or_default();
            c.n += 1;
            c.cost += e.cost_nanos;
            if e.status >= 500 {
                c.failed += 1;
                c.last_failed = c.last_failed.max(Some(e.time_ms));
            }
        }
    })
    .await?;
    let rows: Vec<Vec<String>> = hub
        .upstreams
        .iter()
        .map(|u| {
            let c = &u.config;
            let auth = match &c.auth {
                crate::config::McpAuth::None => "none".to_string(),
                crate::config::McpAuth::Headers(h) => format!("headers: {}", h.iter().map(|(k, _)| esc(k)).collect::<Vec<_>>().join(", ")),
                crate::config::McpAuth::ClientCredentials { .. } => "OAuth client credentials".to_string(),
            };
            let seen = calls.remove(&c.name).unwrap_or_default();
            let last = seen.last_failed.map_or("—".to_string(), |ms| crate::base::clock::time_in(ms, clock.tz()));
            vec![
                esc(&c.name),
                format!("<span class=\"mono\">{}</span>", esc(&crate::base::text::redact_url(&c.url))),
                esc(&format!("{:?}", c.transport)),
                auth,
                nanos(c.per_call_nanos),
                format!("{} s", c.timeout_secs),
                count(seen.n),
                count(seen.failed),
                nanos(seen.cost),
                last,
            ]
        })
        .collect();
    let body = format!(
        "<p><small>Tool calls, failures and what they were billed: the last 24 hours of the request log.</small></p>{}",
        html::table(
            "mcp",
            &["Server", "URL", "Transport", "Signed in with", "Per call", "Timeout", "Calls (24 h)", "Failed", "Billed", "Last failure"],
            &rows,
            None
        )
    );
    Ok(clock.page("MCP servers", "/console/mcp", &req.csrf, &body))
}

/// At most this many batches or files of each key on their read-only pages (newest first).
const PER_KEY: usize = 50;

/// `/console/batches` (read-only): every key's batches, newest first — status, requests done and
/// failed, the worst case held and what it came to, its provider and last errors.
pub(super) async fn batches(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let Some(service) = &api.batches else {
        return Ok(clock.page("Batches", "/console/batches", &req.csrf, "<p>Batches are not available on this gateway.</p>"));
    };
    let mut all = Vec::new();
    for key in api.keys.all_keys().await.map_err(internal)? {
        let (list, _) = service.list(&key, None, PER_KEY).await?;
        all.extend(list.into_iter().map(|b| (key.name.clone(), b)));
    }
    all.sort_by_key(|e| std::cmp::Reverse(e.1.created_at));
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(key, b)| {
            let errors = b.errors.as_ref().map_or("—".to_string(), |e| esc(&crate::base::text::clip(&e.to_string(), 120)));
            vec![
                format!("<span class=\"mono\">{}</span>", esc(&b.id)),
                esc(key),
                esc(&b.model),
                esc(&b.provider),
                esc(&b.status),
                format!("{} / {} ({} failed)", count(b.counts.completed), count(b.counts.total), count(b.counts.failed)),
                nanos(b.hold_nanos),
                if b.settled { nanos(b.cost_nanos) } else { "—".to_string() },
                crate::base::clock::time_in(b.created_at.saturating_mul(1000), clock.tz()),
                errors,
            ]
        })
        .collect();
    let body = format!(
        "<p><small>Every key's batches (the newest {PER_KEY} of each), newest first. Held: the worst case charged at creation; came to: what it was billed once settled.</small></p>{}",
        html::table("batches", &["Batch", "Key", "Model", "Provider", "Status", "Done", "Held", "Came to", "Created", "Errors"], &rows, None)
    );
    Ok(clock.page("Batches", "/console/batches", &req.csrf, &body))
}

/// `/console/files` (read-only): every key's files, newest first — name, purpose, size, when it
/// was uploaded and when it is gone.
pub(super) async fn files(api: &AdminApi, req: &Request) -> Page {
    let clock = Clock::now(api);
    let Some(service) = &api.files else {
        return Ok(clock.page("Files", "/console/files", &req.csrf, "<p>Files are not available on this gateway.</p>"));
    };
    let mut all = Vec::new();
    for key in api.keys.all_keys().await.map_err(internal)? {
        let (list, _) = service.list(&key.id, None, PER_KEY).await?;
        all.extend(list.into_iter().map(|f| (key.name.clone(), f)));
    }
    all.sort_by_key(|e| std::cmp::Reverse(e.1.created_at));
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(key, f)| {
            vec![
                format!("<span class=\"mono\">{}</span>", esc(&f.id)),
                esc(key),
                esc(&f.filename),
                esc(&f.purpose),
                count(f.bytes),
                crate::base::clock::time_in(f.created_at.saturating_mul(1000), clock.tz()),
                f.expires_at.map_or("—".to_string(), |at| crate::base::clock::time_in(at.saturating_mul(1000), clock.tz())),
            ]
        })
        .collect();
    let body = format!(
        "<p><small>Every key's files (the newest {PER_KEY} of each), newest first.</small></p>{}",
        html::table("files", &["File", "Key", "Name", "Purpose", "Bytes", "Uploaded", "Gone at"], &rows, None)
    );
    Ok(clock.page("Files", "/console/files", &req.csrf, &body))
}
