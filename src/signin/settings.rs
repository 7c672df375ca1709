//! Managed settings (`GET /managed/settings`): the object Claude Code applies as its
//! `managed-settings.json`, chosen for a person — `default`, then their team's (the file's, then
//! what the console or the admin API set for the team), then their role's, each merged over the one before (objects key by key, anything else replaced) —
//! with `availableModels` and `model` from their key's model rules unless set; and its
//! checksum, computed exactly as the client computes the one it sends in `If-None-Match`
//! (keys sorted at every depth, compact JSON as JavaScript writes it, SHA-256). Pure.

use crate::config::claude_code::ManagedSettings;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// `b` merged over `a`.
fn merge(a: &mut Map<String, Value>, b: &Map<String, Value>) {
    for (k, v) in b {
        match (a.get_mut(k), v) {
            (Some(Value::Object(mine)), Value::Object(theirs)) => merge(mine, theirs),
            _ => {
                a.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The settings of a person on `team` with `role`; None when nothing applies to them (the
/// client's "no managed policy", 404). `stored`: the team's own, set in the console or the
/// admin API (over the file's for the team). `models`: the models their key may call, in the
/// catalog's order (for `availableModels` and `model` when the settings set neither).
pub fn for_person(
    cfg: &ManagedSettings,
    team: Option<&str>,
    stored: Option<&Map<String, Value>>,
    role: &str,
    models: &[String],
) -> Option<Map<String, Value>> {
    let layers = [cfg.default.as_ref(), team.and_then(|t| cfg.teams.get(t)), stored, cfg.roles.get(role)];
    if layers.iter().all(Option::is_none) {
        return None;
    }
    let mut settings = Map::new();
    for layer in layers.into_iter().flatten() {
        merge(&mut settings, layer);
    }
    if !models.is_empty() {
        if !settings.contains_key("availableModels") {
            settings.insert("availableModels".into(), Value::from(models.to_vec()));
        }
        if !settings.contains_key("model") {
            settings.insert("model".into(), Value::from(models[0].clone()));
        }
    }
    Some(settings)
}

/// A number as JavaScript writes it: a float with no fraction as an integer.
fn js_numbers(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(js_numbers).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), js_numbers(v))).collect()),
        _ => v.clone(),
    }
}

/// The checksum Claude Code computes of settings: `sha256:` and the hex SHA-256 of their
/// compact JSON with keys sorted at every depth (serde_json's maps are sorted).
pub fn checksum(settings: &Map<String, Value>) -> String {
    let canonical = js_numbers(&Value::Object(settings.clone())).to_string();
    format!("sha256:{}", crate::access::auth::hex(&Sha256::digest(canonical.as_bytes())))
}

/// A stable id of the policy a person gets: a UUID made of the checksum.
pub fn uuid(checksum: &str) -> String {
    let h = Sha256::digest(checksum.as_bytes());
    let hex = crate::access::auth::hex(&h[..16]);
    format!("{}-{}-4{}-8{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn layers_merge_default_team_role_and_models_come_from_the_key_unless_set() {
        let mut cfg =
            ManagedSettings { default: Some(obj(json!({"env": {"A": "1", "B": "2"}, "cleanupPeriodDays": 30}))), ..Default::default() };
        cfg.teams.insert("research".into(), obj(json!({"env": {"B": "team"}, "permissions": {"deny": ["WebFetch"]}})));
        cfg.roles.insert("team_admin".into(), obj(json!({"cleanupPeriodDays": 7})));
        let models = ["beta-opus".to_string(), "beta-haiku".to_string()];
        let s = for_person(&cfg, Some("research"), None, "team_admin", &models).unwrap();
        assert_eq!(
            Value::Object(s),
            json!({"env": {"A": "1", "B": "team"}, "cleanupPeriodDays": 7, "permissions": {"deny": ["WebFetch"]},
                   "availableModels": ["beta-opus", "beta-haiku"], "model": "beta-opus"})
        );
        let s = for_person(&cfg, Some("ops"), None, "member", &[]).unwrap();
        assert_eq!(Value::Object(s), json!({"env": {"A": "1", "B": "2"}, "cleanupPeriodDays": 30}));
        cfg.default = None;
        assert_eq!(for_person(&cfg, Some("ops"), None, "member", &models), None, "nothing applies: 404");
        // The team's stored settings alone apply too, over the file's for the team.
        let stored = obj(json!({"env": {"B": "console"}}));
        let s = for_person(&cfg, Some("research"), Some(&stored), "member", &[]).unwrap();
        assert_eq!(s["env"], json!({"B": "console"}));
        cfg.teams.insert("ops".into(), obj(json!({"model": "beta-haiku", "availableModels": []})));
        let s = for_person(&cfg, Some("ops"), None, "member", &models).unwrap();
        assert_eq!(Value::Object(s), json!({"model": "beta-haiku", "availableModels": []}));
    }

    #[test]
    fn the_checksum_is_the_clients_sorted_compact_json_sha256() {
        // The client's computation, in Node: `"sha256:" + createHash("sha256").update(JSON.stringify(sorted)).digest("hex")`
        // of {"b":1,"a":{"d":[1,2.5,"é"],"c":true}} gives this (checked with node 20).
        let s = obj(json!({"b": 1.0, "a": {"d": [1, 2.5, "é"], "c": true}}));
        let text = js_numbers(&Value::Object(s.clone())).to_string();
        assert_eq!(text, r#"{"a":{"c":true,"d":[1,2.5,"é"]},"b":1}"#);
        assert_eq!(checksum(&s), "sha256:9c299379cd59206ab16b7f63bef162a92331c54642b718ae91159be771f17a85");
        assert_eq!(uuid(&checksum(&s)).len(), 36);
        assert_ne!(checksum(&s), checksum(&obj(json!({"b": 2}))));
    }
}
