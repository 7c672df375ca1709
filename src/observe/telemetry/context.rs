//! W3C Trace Context: the `traceparent` and `tracestate` headers a client's trace arrives in and
//! the upstream request carries on.

use rand::RngCore;

/// A trace id (16 bytes) and a span id (8 bytes), both never all zero.
pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

/// The trace a request belongs to, as a client's `traceparent` named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller recorded its span (flag 01).
    pub sampled: bool,
    /// The client's `tracestate`, passed on unchanged (at most 512 bytes, as the spec allows
    /// a vendor to cut).
    pub state: Option<String>,
}

/// Longest `tracestate` carried on: the W3C spec lets a platform drop longer ones.
const MAX_STATE: usize = 512;

/// A client's `traceparent` (and `tracestate`), when well formed: version `00` exactly as
/// specified, a later version by its first four fields (the spec's forward compatibility);
/// an all-zero id, a version `ff` or anything malformed starts a new trace instead.
pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Parent> {
    let t = traceparent.trim().as_bytes();
    if t.len() < 55 || (t.len() > 55 && t[55] != b'-') {
        return None;
    }
    let version = hex::<1>(&t[0..2])?;
    if version[0] == 0xff || (version[0] == 0 && t.len() != 55) {
        return None;
    }
    if t[2] != b'-' || t[35] != b'-' || t[52] != b'-' {
        return None;
    }
    let trace_id = hex::<16>(&t[3..35]).filter(|id| id != &[0; 16])?;
    let span_id = hex::<8>(&t[36..52]).filter(|id| id != &[0; 8])?;
    let flags = hex::<1>(&t[53..55])?[0];
    let state = tracestate.map(str::trim).filter(|s| !s.is_empty() && s.len() <= MAX_STATE && s.is_ascii()).map(str::to_string);
    Some(Parent { trace_id, span_id, sampled: flags & 1 == 1, state })
}

/// Lower-case hex only (the spec's `HEXDIGLC`).
fn hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// A `traceparent` header's value, written without allocating.
#[derive(Debug, Clone, Copy)]
pub struct Traceparent([u8; 55]);

impl Traceparent {
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written (see `traceparent`).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// `00-<trace id>-<span id>-<flags>`.
pub fn traceparent(trace_id: &TraceId, span_id: &SpanId, sampled: bool) -> Traceparent {
    let mut out = [b'-'; 55];
    out[..2].copy_from_slice(b"00");
    crate::base::text::hex_into(trace_id, &mut out[3..35]);
    crate::base::text::hex_into(span_id, &mut out[36..52]);
    out[53..].copy_from_slice(if sampled { b"01" } else { b"00" });
    Traceparent(out)
}

pub fn new_trace_id() -> TraceId {
    let mut id = [0u8; 16];
    while id == [0; 16] {
        rand::thread_rng().fill_bytes(&mut id);
    }
    id
}

pub fn new_span_id() -> SpanId {
    let mut id = [0u8; 8];
    while id == [0; 8] {
        rand::thread_rng().fill_bytes(&mut id);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_as_the_w3c_spec_writes_it() {
        let p = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(traceparent(&p.trace_id, &p.span_id, p.sampled).as_str(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(traceparent(&[0xff; 16], &[0x0a; 8], false).as_str(), "00-ffffffffffffffffffffffffffffffff-0a0a0a0a0a0a0a0a-00");
        assert!(p.sampled);
        assert_eq!(p.state.as_deref(), Some("congo=t61rcWkgMzE"));
        let unsampled = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", None).unwrap();
        assert!(!unsampled.sampled && unsampled.state.is_none());
        // A later version: its first four fields, whatever follows.
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever", None).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad, None).is_none(), "{bad}");
        }
        assert!(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some(&"a=b,".repeat(200))).unwrap().state.is_none());
    }

    #[test]
    fn new_ids_are_never_zero_and_differ() {
        assert_ne!(new_trace_id(), new_trace_id());
        assert_ne!(new_span_id(), [0; 8]);
    }
}
