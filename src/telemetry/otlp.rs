//! The OTLP wire form of finished spans: an `ExportTraceServiceRequest` in protobuf
//! (opentelemetry-proto, `collector/trace/v1` and `trace/v1`), written by hand — the few
//! messages tollgate sends do not justify a code generator in the build.

use super::{Kind, SpanData};

/// An attribute's value, borrowed while it is encoded.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Double(f64),
    Bool(bool),
    Strs(&'a [String]),
}

/// A span's attributes (`Span.attributes`, field 9), encoded as they are added: a traced
/// request makes no value, string or list of its own for them, and the exporter only copies
/// their bytes into the span.
#[derive(Debug, Clone, Default)]
pub struct Attrs(Pb);

impl Attrs {
    pub fn add(&mut self, key: &str, value: Value<'_>) {
        if self.0 .0.is_empty() {
            self.0 .0.reserve(512);
        }
        self.0.key_value(9, key, value);
    }

    /// Another list's attributes after these.
    pub fn append(&mut self, other: &Attrs) {
        self.0 .0.extend_from_slice(&other.0 .0);
    }

    /// An attribute's value, read back (tests).
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<Decoded> {
        decode::attributes(&self.0 .0).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// `SpanFlags`: the context says whether its parent was remote, and it was.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// The request body of one export: every span under one resource and one scope.
pub fn export_request(resource: &[(String, String)], scope_version: &str, spans: &[SpanData]) -> Vec<u8> {
    let mut pb = Pb(Vec::with_capacity(256 + spans.len() * 768));
    // ExportTraceServiceRequest.resource_spans = 1
    pb.message(1, |pb| {
        // ResourceSpans.resource = 1
        pb.message(1, |pb| {
            for (key, value) in resource {
                pb.key_value(1, key, Value::Str(value));
            }
        });
        // ResourceSpans.scope_spans = 2
        pb.message(2, |pb| {
            // ScopeSpans.scope = 1 (InstrumentationScope: name = 1, version = 2)
            pb.message(1, |pb| {
                pb.string(1, "tollgate");
                pb.string(2, scope_version);
            });
            for span in spans {
                pb.message(2, |pb| encode_span(pb, span));
            }
        });
    });
    pb.0
}

fn encode_span(pb: &mut Pb, s: &SpanData) {
    pb.bytes(1, &s.trace_id);
    pb.bytes(2, &s.span_id);
    if let Some(state) = &s.state {
        pb.string(3, state);
    }
    if let Some(parent) = &s.parent {
        pb.bytes(4, parent);
    }
    pb.string(5, &s.name);
    pb.uint(
        6,
        match s.kind {
            Kind::Server => 2,
            Kind::Client => 3,
        },
    );
    pb.fixed64(7, s.start_ns);
    pb.fixed64(8, s.end_ns.max(s.start_ns));
    pb.0.extend_from_slice(&s.attrs.0 .0);
    // Status: message = 2, code = 3 (UNSET 0, OK 1, ERROR 2).
    if let Some(message) = &s.error {
        pb.message(15, |pb| {
            pb.string(2, message);
            pb.uint(3, 2);
        });
    }
    let remote = if s.remote_parent { FLAG_IS_REMOTE } else { 0 };
    pb.fixed32(16, 1 | FLAG_HAS_IS_REMOTE | remote);
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

/// The few bytes of tags and lengths between two strings, gathered to be appended at once.
#[derive(Default)]
struct Head {
    buf: [u8; 32],
    len: usize,
}

impl Head {
    fn byte(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    /// An AnyValue's `string_value` tag and length.
    fn string_start(&mut self, len: usize) {
        self.byte(0x0a);
        self.varint(len as u64);
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
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
    /// as field `field`. Its lengths are known before it is written for every value but an
    /// array (the attributes are most of a span's bytes).
    fn key_value(&mut self, field: u32, key: &str, value: Value<'_>) {
        let any_len = match value {
            Value::Str(text) => 1 + varint_len(text.len() as u64) + text.len(),
            Value::Bool(_) => 2,
            Value::Int(i) => 1 + varint_len(i as u64),
            Value::Double(_) => 9,
            Value::Strs(_) => {
                self.message(field, |pb| {
                    pb.string(1, key);
                    pb.message(2, |pb| any_value(pb, value));
                });
                return;
            }
        };
        let kv_len = 1 + varint_len(key.len() as u64) + key.len() + 1 + varint_len(any_len as u64) + any_len;
        self.0.reserve(kv_len + 6);
        // The bytes around the key and the value go in whole: field tag and length, the key's
        // tag and length; then the value's tag and length and the AnyValue's tag.
        let mut head = Head::default();
        head.varint(u64::from(field) << 3 | 2);
        head.varint(kv_len as u64);
        head.byte(0x0a);
        head.varint(key.len() as u64);
        self.0.extend_from_slice(head.bytes());
        self.0.extend_from_slice(key.as_bytes());
        let mut head = Head::default();
        head.byte(0x12);
        head.varint(any_len as u64);
        match value {
            Value::Str(text) => head.string_start(text.len()),
            Value::Bool(b) => {
                head.byte(0x10);
                head.byte(u8::from(b));
            }
            Value::Int(i) => {
                head.byte(0x18);
                head.varint(i as u64);
            }
            Value::Double(d) => {
                head.byte(0x21);
                d.to_le_bytes().into_iter().for_each(|b| head.byte(b));
            }
            Value::Strs(_) => {}
        }
        self.0.extend_from_slice(head.bytes());
        if let Value::Str(text) = value {
            self.0.extend_from_slice(text.as_bytes());
        }
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

    /// A nested message: one byte is kept for its length, widened after it is written when it
    /// is 128 bytes or more (the content moves up by the extra bytes).
    fn message(&mut self, field: u32, write: impl FnOnce(&mut Pb)) {
        self.tag(field, 2);
        let at = self.0.len();
        self.0.push(0);
        write(self);
        let len = self.0.len() - at - 1;
        if len < 0x80 {
            self.0[at] = len as u8;
        } else {
            let mut prefix = Pb(Vec::with_capacity(10));
            prefix.varint(len as u64);
            self.0.splice(at..at + 1, prefix.0);
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

/// A protobuf reader for what [`Attrs`] writes, to check it (tests).
#[cfg(test)]
mod decode {
    use super::Decoded;

    /// A field: (number, varint or fixed64 value, length-delimited bytes).
    type Field<'a> = (u64, u64, &'a [u8]);

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

    fn fields(mut buf: &[u8]) -> Vec<Field<'_>> {
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

    /// The (key, value) of each KeyValue field.
    pub fn attributes(buf: &[u8]) -> Vec<(String, Decoded)> {
        fields(buf)
            .into_iter()
            .map(|(_, _, kv)| {
                let parts = fields(kv);
                (text(parts[0].2), any(parts[1].2))
            })
            .collect()
    }
}
