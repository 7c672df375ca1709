//! Prometheus counters, rendered as text on the admin listener's `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

type Series = (&'static str, Vec<(&'static str, String)>);

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Counters and histograms by name and labels, and live gauges.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Series, f64>>,
    histograms: Mutex<BTreeMap<Series, Histogram>>,
    /// Requests being processed (relay subrequests included).
    pub in_flight: std::sync::atomic::AtomicI64,
    /// Event streams open to clients.
    pub open_streams: std::sync::atomic::AtomicI64,
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

    /// Record one observation in seconds.
    pub fn observe(&self, name: &'static str, labels: &[(&'static str, &str)], seconds: f64) {
        let key = (name, labels.iter().map(|(k, v)| (*k, v.to_string())).collect());
        let mut h = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        let entry = h.entry(key).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                entry.counts[i] += 1;
            }
        }
        entry.count += 1;
        entry.sum += seconds;
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
        drop(c);
        let h = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = "";
        for ((name, labels), hist) in h.iter() {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} histogram");
                last = name;
            }
            let base: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let with = |extra: String| {
                let mut all = base.clone();
                all.push(extra);
                all.join(",")
            };
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(out, "{name}_bucket{{{}}} {}", with(format!("le=\"{bound}\"")), hist.counts[i]);
            }
            let _ = writeln!(out, "{name}_bucket{{{}}} {}", with("le=\"+Inf\"".to_string()), hist.count);
            let _ = writeln!(out, "{name}_sum{{{}}} {}", base.join(","), hist.sum);
            let _ = writeln!(out, "{name}_count{{{}}} {}", base.join(","), hist.count);
        }
        use std::sync::atomic::Ordering::Relaxed;
        let live = [
            ("tollgate_in_flight_requests", self.in_flight.load(Relaxed) as f64),
            ("tollgate_open_streams", self.open_streams.load(Relaxed) as f64),
        ];
        for (name, value) in live.iter().chain(extra.iter()) {
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
        m.observe("tollgate_upstream_seconds", &[("protocol", "openai")], 0.003);
        m.observe("tollgate_upstream_seconds", &[("protocol", "openai")], 0.2);
        let text = m.render(&[]);
        assert!(text.contains("tollgate_upstream_seconds_bucket{protocol=\"openai\",le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_bucket{protocol=\"openai\",le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_count{protocol=\"openai\"} 2"), "{text}");
        assert!(text.contains("tollgate_open_streams 0"), "{text}");
    }
}
