//! The OTLP wire form of spans: an `ExportTraceServiceRequest` in protobuf (opentelemetry-proto,
//! `collector/trace/v1` and `trace/v1`), written by hand — the few messages tollgate sends do
//! not justify a code generator in the build.
//!
//! A request's spans are encoded while it is served, straight into one buffer ([`Spans`]):
//! each span there is already the `ScopeSpans.spans` entry the collector receives, so the
//! exporter only copies a batch's bytes between the resource's and the scope's headers.

use super::context::{SpanId, TraceId};
use super::Kind;
use std::ops::Range;

/// An attribute's value, borrowed while it is encoded.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Double(f64),
    Bool(bool),
    Strs(&'a [String]),
}

/// Attributes encoded ahead of the spans they go on (`Span.attributes`, field 9): an upstream's
/// are encoded once, when the configuration is loaded, and copied onto each attempt's span.
#[derive(Debug, Clone, Default)]
pub struct Attrs(Pb);

impl Attrs {
    pub fn add(&mut self, key: &str, value: Value<'_>) {
        self.0.key_value(9, key, value);
    }

    /// An attribute's value, read back (tests).
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<Decoded> {
        decode::attributes(&self.0 .0).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// `SpanFlags`: sampled, and whether the parent was remote is known (and if it was).
const FLAG_SAMPLED: u32 = 0x01;
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// How a span begins: what is known of it when it opens.
pub struct Opening<'a> {
    pub trace_id: &'a TraceId,
    pub span_id: &'a SpanId,
    pub parent: Option<&'a SpanId>,
    /// The parent is the client's span (another process).
    pub remote_parent: bool,
    pub state: Option<&'a str>,
    /// The name's two words (`chat gpt-5`, `POST models`).
    pub name: [&'a str; 2],
    pub kind: Kind,
    pub start_ns: u64,
}

/// A request's spans, encoded one after another as `ScopeSpans.spans` entries (field 2,
/// length first). The last one may be open: attributes go onto it until it is closed.
#[derive(Debug, Default)]
pub struct Spans {
    pb: Pb,
    /// The open span: where its length goes, and its start (its end is never before it).
    open: Option<(usize, u64)>,
}

impl Spans {
    /// Open a span (closing the one open, if any, at its start).
    pub fn open(&mut self, o: &Opening<'_>) {
        if let Some((_, start)) = self.open {
            self.close(start, None);
        }
        if self.pb.0.is_empty() {
            self.pb.0.reserve(1536);
        }
        let v = &mut self.pb.0;
        // The entry's tag, then room for a two-byte length: a span is most often 128 bytes to
        // 16 KiB (see `close`). Then the trace id (1) and the span id (2), of fixed lengths.
        v.extend_from_slice(&[0x12, 0, 0, 0x0a, 16]);
        let at = v.len() - 4;
        v.extend_from_slice(o.trace_id);
        v.extend_from_slice(&[0x12, 8]);
        v.extend_from_slice(o.span_id);
        self.open = Some((at, o.start_ns));
        if let Some(state) = o.state {
            self.pb.string(3, state);
        }
        if let Some(parent) = o.parent {
            self.pb.0.extend_from_slice(&[0x22, 8]);
            self.pb.0.extend_from_slice(parent);
        }
        let [a, b] = o.name;
        self.pb.tag(5, 2);
        self.pb.varint((a.len() + 1 + b.len()) as u64);
        self.pb.0.extend_from_slice(a.as_bytes());
        self.pb.0.push(b' ');
        self.pb.0.extend_from_slice(b.as_bytes());
        self.pb.uint(
            6,
            match o.kind {
                Kind::Server => 2,
                Kind::Client => 3,
            },
        );
        self.pb.fixed64(7, o.start_ns);
        let remote = if o.remote_parent { FLAG_IS_REMOTE } else { 0 };
        self.pb.fixed32(16, FLAG_SAMPLED | FLAG_HAS_IS_REMOTE | remote);
    }

    /// An attribute of the open span (inlined: see [`Pb::key_value`]).
    #[inline(always)]
    pub fn add(&mut self, key: &str, value: Value<'_>) {
        self.pb.key_value(9, key, value);
    }

    /// Attributes encoded ahead, onto the open span.
    pub fn append(&mut self, attrs: &Attrs) {
        self.pb.0.extend_from_slice(&attrs.0 .0);
    }

    /// Where the next attribute goes: attributes added from here to a later mark can be copied
    /// onto another span ([`Self::copy`]).
    pub fn mark(&self) -> usize {
        self.pb.0.len()
    }

    /// Attributes added between two marks (of this or an earlier span), onto the open span.
    pub fn copy(&mut self, added: Range<usize>) {
        self.pb.0.extend_from_within(added);
    }

    /// Close the open span: its end, and status ERROR with `error` as its message when given
    /// (None leaves the status unset).
    pub fn close(&mut self, end_ns: u64, error: Option<&str>) {
        let Some((at, start_ns)) = self.open.take() else { return };
        self.pb.fixed64(8, end_ns.max(start_ns));
        // Status: message = 2, code = 3 (UNSET 0, OK 1, ERROR 2).
        if let Some(message) = error {
            self.pb.message(15, |pb| {
                pb.string(2, message);
                pb.uint(3, 2);
            });
        }
        self.pb.end_length(at, 2);
    }

    /// The spans closed so far, as the collector receives them.
    pub fn bytes(&self) -> &[u8] {
        match self.open {
            Some((at, _)) => &self.pb.0[..at - 1],
            None => &self.pb.0,
        }
    }
}

/// The end of each span in `bytes` (as [`Spans::bytes`] gives them), from its start.
pub fn span_ends(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        // Each entry: the tag byte (field 2, length-delimited), the length, the span.
        let mut len = 0usize;
        let mut i = at + 1;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(i)?;
            i += 1;
            len |= usize::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
        }
        at = i.checked_add(len).filter(|end| *end <= bytes.len())?;
        Some(at)
    })
}

/// The request body of one export: `spans` (entries as [`Spans`] writes them) under one
/// resource and one scope.
pub fn export_request(resource: &[(String, String)], scope_version: &str, spans: &[u8]) -> Vec<u8> {
    // ResourceSpans.resource = 1
    let mut head = Pb(Vec::with_capacity(256));
    head.message(1, |pb| {
        for (key, value) in resource {
            pb.key_value(1, key, Value::Str(value));
        }
    });
    // ScopeSpans.scope = 1 (InstrumentationScope: name = 1, version = 2)
    let mut scope = Pb(Vec::with_capacity(64));
    scope.message(1, |pb| {
        pb.string(1, "tollgate");
        pb.string(2, scope_version);
    });
    let scope_spans = scope.0.len() + spans.len();
    let resource_spans = head.0.len() + 1 + varint_len(scope_spans as u64) + scope_spans;
    let mut pb = Pb(Vec::with_capacity(resource_spans + 16));
    // ExportTraceServiceRequest.resource_spans = 1; ResourceSpans.scope_spans = 2
    pb.tag(1, 2);
    pb.varint(resource_spans as u64);
    pb.0.extend_from_slice(&head.0);
    pb.tag(2, 2);
    pb.varint(scope_spans as u64);
    pb.0.extend_from_slice(&scope.0);
    pb.0.extend_from_slice(spans);
    pb.0
}

fn any_value(pb: &mut Pb, value: Value<'_>) {
    match value {
        Value::Str(s) => pb.string(1, s),
        Value::Bool(b) => pb.uint(2, u64::from(b)),
        Value::Int(i) => pb.uint(3, i as u64),
        Value::Double(d) => {
            pb.tag(4, 1);
            pb.0.extend_from_slice(&d.to_le_bytes());
        }
        Value::Strs(items) => pb.message(5, |pb| {
            for item in items {
                pb.message(1, |pb| pb.string(1, item));
            }
        }),
    }
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A protobuf writer: fields in order, nested messages length-prefixed in place.
#[derive(Debug, Clone, Default)]
struct Pb(Vec<u8>);

impl Pb {
    /// A KeyValue (key = 1, value = 2; AnyValue: string 1, bool 2, int 3, double 4, array 5)
    /// as field `field` (the attributes are most of a span's bytes).
    ///
    /// Inlined where it is called: there the key (a constant) is copied by a few moves, and
    /// when every length fits in one byte, as for almost every attribute, the tags and lengths
    /// are stored whole ([`Self::key_value_any`] writes the others).
    #[inline(always)]
    fn key_value(&mut self, field: u32, key: &str, value: Value<'_>) {
        let any_len = match value {
            Value::Str(text) => 2 + text.len(),
            Value::Bool(_) => 2,
            Value::Int(i) => 1 + varint_len(i as u64),
            Value::Double(_) => 9,
            Value::Strs(_) => return self.key_value_any(field, key, value),
        };
        let kv_len = 2 + key.len() + 2 + any_len;
        if field >= 16 || key.len() >= 0x80 || any_len >= 0x80 || kv_len >= 0x80 {
            return self.key_value_any(field, key, value);
        }
        let v = &mut self.0;
        v.reserve(2 + kv_len);
        v.extend_from_slice(&[(field << 3 | 2) as u8, kv_len as u8, 0x0a, key.len() as u8]);
        v.extend_from_slice(key.as_bytes());
        match value {
            Value::Str(text) => {
                v.extend_from_slice(&[0x12, any_len as u8, 0x0a, text.len() as u8]);
                v.extend_from_slice(text.as_bytes());
            }
            Value::Bool(b) => v.extend_from_slice(&[0x12, 2, 0x10, u8::from(b)]),
            Value::Int(i) => {
                v.extend_from_slice(&[0x12, any_len as u8, 0x18]);
                self.varint(i as u64);
            }
            Value::Double(d) => {
                v.extend_from_slice(&[0x12, 9, 0x21]);
                v.extend_from_slice(&d.to_le_bytes());
            }
            Value::Strs(_) => {}
        }
    }

    /// [`Self::key_value`] with lengths of any size, and lists: written nested, its lengths
    /// fixed after (rare: a long key or value, or a list).
    #[inline(never)]
    fn key_value_any(&mut self, field: u32, key: &str, value: Value<'_>) {
        self.message(field, |pb| {
            pb.string(1, key);
            pb.message(2, |pb| any_value(pb, value));
        });
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn uint(&mut self, field: u32, v: u64) {
        self.tag(field, 0);
        self.varint(v);
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.tag(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn fixed32(&mut self, field: u32, v: u32) {
        self.tag(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    /// A nested message: one byte is kept for its length (see [`Self::end_length`]).
    fn message(&mut self, field: u32, write: impl FnOnce(&mut Pb)) {
        self.tag(field, 2);
        let at = self.0.len();
        self.0.push(0);
        write(self);
        self.end_length(at, 1);
    }

    /// The length of what was written after the `kept` bytes at `at`, written there: in place
    /// when it takes that many bytes as a varint, else with the content moved by the
    /// difference.
    fn end_length(&mut self, at: usize, kept: usize) {
        let len = self.0.len() - at - kept;
        match (kept, len) {
            (1, 0..=0x7f) => return self.0[at] = len as u8,
            (2, 0x80..=0x3fff) => {
                self.0[at] = len as u8 | 0x80;
                self.0[at + 1] = (len >> 7) as u8;
                return;
            }
            _ => {}
        }
        let mut prefix = Pb(Vec::with_capacity(10));
        prefix.varint(len as u64);
        if prefix.0.len() == kept {
            self.0[at..at + kept].copy_from_slice(&prefix.0);
        } else {
            self.0.splice(at..at + kept, prefix.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_long_messages_are_encoded_as_protobuf_reads_them() {
        let mut pb = Pb(Vec::new());
        pb.uint(1, 300);
        assert_eq!(pb.0, [0x08, 0xac, 0x02]);
        let mut pb = Pb(Vec::new());
        pb.message(2, |pb| pb.string(1, &"x".repeat(200)));
        // tag 2/LEN, length 203 as a two-byte varint, then tag 1/LEN, length 200 (two bytes).
        assert_eq!(&pb.0[..5], &[0x12, 0xcb, 0x01, 0x0a, 0xc8]);
        assert_eq!(pb.0.len(), 3 + 3 + 200);
        for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut pb = Pb(Vec::new());
            pb.varint(v);
            assert_eq!(pb.0.len(), varint_len(v), "{v}");
        }
        // A key-value written with its lengths known equals one written nested.
        let long = "x".repeat(300);
        for value in [Value::Str(&long), Value::Str("chat"), Value::Int(-3), Value::Bool(true), Value::Double(0.5)] {
            let (mut known, mut nested) = (Pb(Vec::new()), Pb(Vec::new()));
            known.key_value(9, "gen_ai.request.model", value);
            nested.message(9, |pb| {
                pb.string(1, "gen_ai.request.model");
                pb.message(2, |pb| any_value(pb, value));
            });
            assert_eq!(known.0, nested.0);
        }
        // And every kind reads back as written.
        let mut attrs = Attrs::default();
        let reasons = vec!["stop".to_string(), "length".to_string()];
        attrs.add("s", Value::Str(&long));
        attrs.add("i", Value::Int(-3));
        attrs.add("d", Value::Double(0.25));
        attrs.add("b", Value::Bool(true));
        attrs.add("l", Value::Strs(&reasons));
        assert_eq!(attrs.get("s"), Some(Decoded::Str(long.clone())));
        assert_eq!(attrs.get("i"), Some(Decoded::Int(-3)));
        assert_eq!(attrs.get("d"), Some(Decoded::Double(0.25)));
        assert_eq!(attrs.get("b"), Some(Decoded::Bool(true)));
        assert_eq!(attrs.get("l"), Some(Decoded::Strs(reasons)));
    }

    #[test]
    fn spans_of_any_length_are_written_whole_found_and_wrapped() {
        let opening = |name: &'static str, start_ns| Opening {
            trace_id: &[1; 16],
            span_id: &[2; 8],
            parent: None,
            remote_parent: false,
            state: None,
            name: [name, "x"],
            kind: Kind::Client,
            start_ns,
        };
        let mut spans = Spans::default();
        // Under 128 bytes (its length takes one byte), 128 to 16 KiB (two), and more (three).
        for (i, size) in [0usize, 200, 20_000].into_iter().enumerate() {
            spans.open(&opening("s", 10));
            spans.add("pad", Value::Str(&"p".repeat(size)));
            spans.close(if i == 1 { 5 } else { 20 }, (i == 2).then_some("boom"));
        }
        // A span left open is not among the bytes.
        let closed = spans.bytes().len();
        spans.open(&opening("open", 30));
        assert_eq!(spans.bytes().len(), closed);
        let bytes = spans.bytes();
        let read = decode::spans(bytes);
        assert_eq!(read.len(), 3);
        for (span, size) in read.iter().zip([0usize, 200, 20_000]) {
            assert_eq!(span.name, "s x");
            assert_eq!(span.attrs, vec![("pad".to_string(), Decoded::Str("p".repeat(size)))]);
        }
        // An end before the start is written as the start.
        assert_eq!((read[0].end_ns, read[1].end_ns), (20, 10));
        assert_eq!((read[1].status.clone(), read[2].status.clone()), (None, Some(("boom".into(), 2))));
        let ends: Vec<usize> = span_ends(bytes).collect();
        assert_eq!(ends.len(), 3);
        assert_eq!(ends[2], bytes.len());
        assert_eq!(decode::spans(&bytes[ends[0]..ends[1]]).len(), 1);
        // Cut short, the last span is not found.
        assert_eq!(span_ends(&bytes[..bytes.len() - 1]).count(), 2);
        // The export wraps them under the resource and the scope.
        let body = export_request(&[("service.name".into(), "gw".into())], "1.2.3", bytes);
        let request = decode::fields(&body);
        assert_eq!(request.len(), 1);
        let resource_spans = decode::fields(request[0].2);
        assert_eq!(decode::attributes(resource_spans[0].2), vec![("service.name".to_string(), Decoded::Str("gw".into()))]);
        let scope_spans = decode::fields(resource_spans[1].2);
        assert_eq!(decode::fields(scope_spans[0].2)[1].2, b"1.2.3");
        // The scope, then the three spans as they were.
        assert_eq!(scope_spans.len(), 4);
        assert_eq!(decode::spans(&body[body.len() - bytes.len()..]).len(), 3);
    }
}

/// An attribute read back from its bytes (tests).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
    Strs(Vec<String>),
}

/// A protobuf reader for what [`Attrs`] and [`Spans`] write, to check it (tests).
#[cfg(test)]
pub mod decode {
    use super::Decoded;

    /// A field: (number, varint or fixed64 value, length-delimited bytes).
    pub type Field<'a> = (u64, u64, &'a [u8]);

    fn varint(buf: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        while let Some((&b, rest)) = buf.split_first() {
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        v
    }

    pub fn fields(mut buf: &[u8]) -> Vec<Field<'_>> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let tag = varint(&mut buf);
            match tag & 7 {
                0 => out.push((tag >> 3, varint(&mut buf), &[][..])),
                1 => {
                    let (v, rest) = buf.split_at(8);
                    buf = rest;
                    out.push((tag >> 3, u64::from_le_bytes(v.try_into().expect("8 bytes")), &[][..]));
                }
                5 => {
                    let (v, rest) = buf.split_at(4);
                    buf = rest;
                    out.push((tag >> 3, u64::from(u32::from_le_bytes(v.try_into().expect("4 bytes"))), &[][..]));
                }
                2 => {
                    let n = varint(&mut buf) as usize;
                    let (v, rest) = buf.split_at(n);
                    buf = rest;
                    out.push((tag >> 3, 0, v));
                }
                other => panic!("wire type {other}"),
            }
        }
        out
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    fn any(buf: &[u8]) -> Decoded {
        match fields(buf)[0] {
            (1, _, s) => Decoded::Str(text(s)),
            (2, v, _) => Decoded::Bool(v != 0),
            (3, v, _) => Decoded::Int(v as i64),
            (4, v, _) => Decoded::Double(f64::from_bits(v)),
            (5, _, list) => Decoded::Strs(
                fields(list)
                    .into_iter()
                    .map(|(_, _, item)| match any(item) {
                        Decoded::Str(s) => s,
                        other => panic!("{other:?} in a string list"),
                    })
                    .collect(),
            ),
            other => panic!("AnyValue field {other:?}"),
        }
    }

    /// A span as the collector reads it.
    #[derive(Debug)]
    pub struct Span {
        pub trace_id: Vec<u8>,
        pub span_id: Vec<u8>,
        pub state: Option<String>,
        pub parent: Option<Vec<u8>>,
        pub name: String,
        pub kind: u64,
        pub start_ns: u64,
        pub end_ns: u64,
        pub flags: u64,
        pub attrs: Vec<(String, Decoded)>,
        /// Status: (message, code).
        pub status: Option<(String, u64)>,
    }

    /// The spans of `ScopeSpans.spans` entries, one after another.
    pub fn spans(buf: &[u8]) -> Vec<Span> {
        fields(buf)
            .into_iter()
            .map(|(field, _, span)| {
                assert_eq!(field, 2, "a ScopeSpans.spans entry");
                let mut s = Span {
                    trace_id: Vec::new(),
                    span_id: Vec::new(),
                    state: None,
                    parent: None,
                    name: String::new(),
                    kind: 0,
                    start_ns: 0,
                    end_ns: 0,
                    flags: 0,
                    attrs: Vec::new(),
                    status: None,
                };
                for (n, v, b) in fields(span) {
                    match n {
                        1 => s.trace_id = b.to_vec(),
                        2 => s.span_id = b.to_vec(),
                        3 => s.state = Some(text(b)),
                        4 => s.parent = Some(b.to_vec()),
                        5 => s.name = text(b),
                        6 => s.kind = v,
                        7 => s.start_ns = v,
                        8 => s.end_ns = v,
                        9 => s.attrs.push(key_value(b)),
                        15 => {
                            let (mut message, mut code) = (String::new(), 0);
                            for (n, v, b) in fields(b) {
                                match n {
                                    2 => message = text(b),
                                    3 => code = v,
                                    other => panic!("Status field {other}"),
                                }
                            }
                            s.status = Some((message, code));
                        }
                        16 => s.flags = v,
                        other => panic!("Span field {other}"),
                    }
                }
                s
            })
            .collect()
    }

    /// A KeyValue's key and value.
    fn key_value(kv: &[u8]) -> (String, Decoded) {
        let parts = fields(kv);
        (text(parts[0].2), any(parts[1].2))
    }

    /// The (key, value) of each KeyValue field.
    pub fn attributes(buf: &[u8]) -> Vec<(String, Decoded)> {
        fields(buf).into_iter().map(|(_, _, kv)| key_value(kv)).collect()
    }
}
