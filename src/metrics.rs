//! Prometheus counters, rendered as text on the admin listener's `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

type Series = (&'static str, Vec<(&'static str, String)>);

/// Counters by name and labels.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Series, f64>>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    pub fn add(&self, name: &'static str, labels: &[(&'static str, &str)], value: f64) {
        let key = (name, labels.iter().map(|(k, v)| (*k, v.to_string())).collect());
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        *c.entry(key).or_insert(0.0) += value;
    }

    pub fn get(&self, name: &'static str, labels: &[(&'static str, &str)]) -> f64 {
        let key = (name, labels.iter().map(|(k, v)| (*k, v.to_string())).collect());
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&key).copied().unwrap_or(0.0)
    }

    /// Prometheus text format; `extra` lines (gauges computed at scrape time) are appended.
    pub fn render(&self, extra: &[(&str, f64)]) -> String {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        let mut last = "";
        for ((name, labels), value) in c.iter() {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} counter");
                last = name;
            }
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = writeln!(out, "{name}{{{}}} {value}", labels.join(","));
        }
        for (name, value) in extra {
            let _ = writeln!(out, "# TYPE {name} gauge\n{name} {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.add("tollgate_requests_total", &[("route", "chat"), ("status", "200")], 1.0);
        m.add("tollgate_requests_total", &[("route", "chat"), ("status", "200")], 1.0);
        m.add("tollgate_tokens_total", &[("model", "a\"b"), ("kind", "input")], 5.0);
        let text = m.render(&[("tollgate_keys", 3.0)]);
        assert!(text.contains("tollgate_requests_total{route=\"chat\",status=\"200\"} 2"), "{text}");
        assert!(text.contains("tollgate_tokens_total{model=\"a\\\"b\",kind=\"input\"} 5"), "{text}");
        assert!(text.contains("# TYPE tollgate_keys gauge\ntollgate_keys 3"), "{text}");
        assert_eq!(m.get("tollgate_requests_total", &[("route", "chat"), ("status", "200")]), 2.0);
    }
}
