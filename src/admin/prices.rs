//! Prices in the admin API: `GET /admin/prices` (every served model's token prices and
//! whether the file or the feed sets them, with the feed's last reads) and `POST
//! /admin/prices/refresh` (the feed read now, instead of at its next `refresh`).

use super::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::{json, Value};

impl AdminApi {
    pub(super) async fn prices_request(&self, method: &str, path: &str) -> Result<LocalResponse, ApiError> {
        match (method, path) {
            ("GET", "/admin/prices") => Ok(LocalResponse::json(200, &self.price_table())),
            ("POST", "/admin/prices/refresh") => {
                let feed = self.selling.feed.as_ref().ok_or_else(|| ApiError::new(ErrorKind::NotFound, "No price_feed is configured."))?;
                match feed.refresh().await {
                    Ok(missing) => {
                        let mut out = self.price_table();
                        out["missing_from_feed"] = json!(missing);
                        Ok(LocalResponse::json(200, &out))
                    }
                    Err(e) => {
                        Err(ApiError::new(ErrorKind::BadGateway, format!("The feed was not applied ({e}); the last good prices stay.")))
                    }
                }
            }
            _ => Err(ApiError::new(ErrorKind::NotFound, format!("Unknown admin endpoint: {method} {path}"))),
        }
    }

    fn price_table(&self) -> Value {
        let routing = self.routing.load();
        let feed = self.selling.feed.as_ref();
        let fed = feed.map(|f| f.current()).unwrap_or_default();
        let usd = |n: i64| n as f64 / 1e9;
        let mut data = Vec::new();
        for u in &routing.catalog.upstreams {
            for m in &u.config.models {
                let Some(p) = routing.prices.price(m) else { continue };
                data.push(json!({
                    "model": m, "input": usd(p.input), "output": usd(p.output), "cached_input": usd(p.cached_input),
                    "cache_write_input": usd(p.cache_write_input), "max_output_tokens": p.max_output_tokens,
                    "source": if fed.contains_key(m) { "feed" } else { "file" },
                }));
            }
        }
        let status = feed.map(|f| {
            let s = f.status();
            json!({
                "url": crate::base::text::redact_url(&f.cfg.url),
                "last_applied": s.last_applied.map(crate::protocol::rfc3339),
                "last_failure": s.last_failure.map(|(t, e)| json!({"at": crate::protocol::rfc3339(t), "error": e})),
            })
        });
        json!({"object": "list", "data": data, "feed": status})
    }
}
