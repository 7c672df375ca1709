//! Redemption codes in the admin API: `POST /admin/codes` makes a batch (its codes shown in
//! this answer only), `GET /admin/codes` lists the batches with what was redeemed of each,
//! `DELETE /admin/codes/{id}` withdraws a batch on every node (`selling::codes`).

use super::api::{to_nanos, AdminApi};
use crate::admin::refusal::bad;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::selling::codes::{Listed, NewBatch};
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::{json, Value};

/// `POST /admin/codes`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateCodes {
    count: u32,
    /// USD each code credits.
    #[serde(default)]
    amount: Option<f64>,
    /// Or the plan each code subscribes to.
    #[serde(default)]
    plan: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    expires_at: Option<String>,
    /// How many codes of the batch one account may redeem (none: any number).
    #[serde(default)]
    max_uses_per_account: Option<u32>,
    #[serde(default)]
    note: Option<String>,
}

fn view(b: &Listed) -> Value {
    json!({
        "object": "code_batch", "id": b.id, "created_at": crate::protocol::rfc3339(b.created_at), "count": b.count,
        "amount": (b.plan.is_none()).then(|| crate::base::money::usd(b.amount)), "plan": b.plan,
        "expires_at": b.expires_at.map(crate::protocol::rfc3339), "max_uses_per_account": (b.max_uses_per_account > 0).then_some(b.max_uses_per_account),
        "note": b.note, "redeemed": b.redeemed, "disabled": b.disabled,
    })
}

impl AdminApi {
    /// `/admin/codes` and `/admin/codes/{id}`.
    pub(super) async fn codes_request(&self, session: &mut Session, method: &str, path: &str) -> Result<LocalResponse, ApiError> {
        let codes = &self.selling.codes;
        match (method, path) {
            ("GET", "/admin/codes") => {
                let data: Vec<Value> = codes.list().await.map_err(ApiError::from)?.iter().map(view).collect();
                Ok(LocalResponse::json(200, &json!({"object": "list", "data": data})))
            }
            ("POST", "/admin/codes") => {
                let body: CreateCodes = Self::read_json(session).await?;
                let (batch, made) = codes.create(self.new_batch(body)?).await.map_err(ApiError::from)?;
                let mut out = view(&batch);
                out["codes"] = json!(made);
                Ok(LocalResponse::json(201, &out))
            }
            ("DELETE", p) if p.starts_with("/admin/codes/") => {
                let id = p.trim_start_matches("/admin/codes/");
                if !codes.disable(id).await.map_err(ApiError::from)? {
                    return Err(ApiError::new(ErrorKind::NotFound, format!("No batch of codes '{}'.", crate::base::text::clip(id, 40))));
                }
                Ok(LocalResponse::json(200, &json!({"object": "code_batch", "id": id, "disabled": true})))
            }
            _ => Err(ApiError::new(ErrorKind::NotFound, format!("Unknown admin endpoint: {method} {path}"))),
        }
    }

    fn new_batch(&self, body: CreateCodes) -> Result<NewBatch, ApiError> {
        let amount = match body.amount {
            Some(a) => to_nanos("amount", a)?,
            None => 0,
        };
        let expires_at = match body.expires_at.as_deref() {
            None => None,
            Some(t) => Some(crate::policy::rfc3339_unix(t).ok_or_else(|| bad("expires_at: an RFC 3339 time").with_param("expires_at"))?),
        };
        if expires_at.is_some_and(|t| t <= crate::base::clock::now_unix()) {
            return Err(bad("expires_at: in the future").with_param("expires_at"));
        }
        Ok(NewBatch {
            count: body.count,
            amount,
            plan: body.plan,
            expires_at,
            max_uses_per_account: body.max_uses_per_account.unwrap_or(0),
            note: body.note.unwrap_or_default(),
        })
    }
}
