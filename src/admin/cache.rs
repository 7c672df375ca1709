//! `DELETE /admin/cache`: empty the response cache — all of it, or the answers one key made
//! (`?key=`, its id or name), or one model's (`?model=`), or both. Answers `{"deleted": n}`.

use super::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::json;

impl AdminApi {
    pub(super) async fn cache_request(&self, method: &str, query: Option<&str>) -> Result<LocalResponse, ApiError> {
        if method != "DELETE" {
            return Err(ApiError::new(ErrorKind::NotFound, "Use DELETE /admin/cache[?key=…&model=…]."));
        }
        let cache =
            self.scrape.cache.as_ref().ok_or_else(|| ApiError::new(ErrorKind::NotFound, "No response cache is configured (cache:)."))?;
        let mut filter = crate::store::CacheFilter::default();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = crate::base::text::decode_component(value);
            match name {
                "key" => filter.key_id = Some(self.key_id_of(&value).await?),
                "model" if !value.is_empty() && value.len() <= 256 => filter.model = Some(value),
                "model" => return Err(ApiError::new(ErrorKind::BadRequest, "model: a model's name").with_param("model")),
                _ => {
                    let shown: String = name.chars().take(32).collect();
                    return Err(ApiError::new(
                        ErrorKind::BadRequest,
                        format!("Unknown parameter '{shown}': key and model pick what is emptied."),
                    ));
                }
            }
        }
        let deleted = cache.clear(&filter).await.map_err(|e| {
            log::error!("admin: the response cache could not be emptied: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while emptying the response cache.")
        })?;
        log::info!("admin: response cache emptied ({deleted} answers; key {:?}, model {:?})", filter.key_id, filter.model);
        Ok(LocalResponse::json(200, &json!({"object": "cache.deleted", "deleted": deleted})))
    }

    /// A key's id, from its id or its name.
    async fn key_id_of(&self, given: &str) -> Result<String, ApiError> {
        let keys = self.keys.all_keys().await.map_err(|e| {
            log::error!("admin: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while reading the keys.")
        })?;
        keys.iter()
            .find(|k| k.id == given)
            .or_else(|| keys.iter().find(|k| k.name == given))
            .map(|k| k.id.clone())
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, "No key with that id or name.").with_param("key"))
    }
}
