//! A client's request body as a borrowed JSON view, the form every request decoder reads (and
//! the form a messages provider's answers, and chat-completions and messages stream events, are
//! read in).
//!
//! It reads like a `serde_json::Value`, but a string without escapes points into the body, an
//! object is its list of members (read by name; a repeated name reads as its last, as a `Value`
//! map keeps it), and the values are counted as they are parsed, within
//! [`MAX_PARSED_VALUES`](crate::protocol::MAX_PARSED_VALUES) (no counting pass before it). A
//! translated request used to be parsed into a `Value` tree, decoded from it and the tree
//! dropped: that tree cost more than the decoding (issue 71, `benches/relay/instructions.sh`).

use crate::protocol::{ApiError, ErrorKind, MAX_PARSED_VALUES};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

/// One JSON value of a request body.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Object<'a>),
}

/// A JSON object's members, in the order they came.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

/// `null`, for a member that is missing.
pub static NULL: Json<'static> = Json::Null;

impl<'a> Object<'a> {
    /// The member named `name` (the last one, if the name is repeated).
    pub fn get(&self, name: &str) -> Option<&Json<'a>> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Take the member named `name` out (every member of that name; the last one is returned).
    pub fn remove(&mut self, name: &str) -> Option<Json<'a>> {
        let at = self.0.iter().rposition(|(k, _)| k == name)?;
        let (_, value) = self.0.remove(at);
        self.0.retain(|(k, _)| k != name);
        Some(value)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The members, in the order they came (a repeated name more than once).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Json<'a>)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }
}

impl<'a> Json<'a> {
    /// A member of an object (`None` for anything else), as `Value::get`.
    pub fn get(&self, name: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(o) => o.get(name),
            _ => None,
        }
    }

    /// The value at a JSON pointer of member names and array indexes (`/function/name`).
    pub fn pointer(&self, path: &str) -> Option<&Json<'a>> {
        path.strip_prefix('/')?.split('/').try_fold(self, |v, step| match v {
            Json::Object(o) => o.get(step),
            Json::Array(items) => step.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Number(n) => n.as_f64(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json<'a>]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object<'a>> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// An owned `Value` of it (what the internal form keeps as JSON: a tool's schema).
    pub fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => Value::Number(n.clone()),
            Json::String(s) => Value::String(s.to_string()),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(o) => Value::Object(o.0.iter().map(|(k, v)| (k.to_string(), v.to_value())).collect()),
        }
    }

    /// Its compact JSON text, written as a `Value` writes it (members in name order, a repeated
    /// name once).
    pub fn to_json_text(&self) -> String {
        self.to_value().to_string()
    }
}

/// Parse `raw` (a client's body or part of it, named `what` in errors) into a view, refused past
/// [`MAX_PARSED_VALUES`] values as [`crate::protocol::check_value_count`] refuses them.
pub fn parse<'a>(raw: &'a str, what: &str) -> Result<Json<'a>, ApiError> {
    let count = Cell::new(0);
    let mut de = serde_json::Deserializer::from_str(raw);
    let parsed = Seed { count: &count }.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    parsed.map_err(|e| {
        let message = if count.get() > MAX_PARSED_VALUES {
            format!("{what}: at most {MAX_PARSED_VALUES} JSON values")
        } else {
            format!("{what}: {e}")
        };
        ApiError::new(ErrorKind::BadRequest, message).with_param(what)
    })
}

/// Parses one value, counting it and every value inside it.
#[derive(Clone, Copy)]
struct Seed<'c> {
    count: &'c Cell<usize>,
}

impl Seed<'_> {
    fn tick<E: de::Error>(self) -> Result<(), E> {
        let n = self.count.get() + 1;
        self.count.set(n);
        if n > MAX_PARSED_VALUES {
            return Err(E::custom("too many values"));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Json<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json<'de>, E> {
        self.tick()?;
        // As a `Value` reads it: a number JSON cannot write is null.
        Ok(Number::from_f64(n).map_or(Json::Null, Json::Number))
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::String(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::String(Cow::Owned(s.to_string())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::String(Cow::Owned(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json<'de>, E> {
        self.tick()?;
        Ok(Json::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Json<'de>, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        self.tick()?;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        self.tick()?;
        let mut members = Vec::new();
        while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
            members.push((name, map.next_value_seed(self)?));
        }
        Ok(Json::Object(Object(members)))
    }
}

/// A member's name: borrowed from the body unless it has escapes.
#[derive(serde::Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn strings_without_escapes_point_into_the_body_and_a_repeated_name_reads_as_its_last() {
        let raw = r#"{"a": "plain", "b": "esc\"aped", "a": "again", "n": [1, -2, 2.5, null, true]}"#;
        let v = parse(raw, "body").expect("parses");
        let Some(Json::String(Cow::Borrowed(s))) = v.get("b").and(v.get("a")) else { panic!("borrowed: {v:?}") };
        assert_eq!(*s, "again");
        assert!(matches!(v.get("b"), Some(Json::String(Cow::Owned(s))) if s == "esc\"aped"));
        assert_eq!(v.pointer("/n/2").and_then(Json::as_f64), Some(2.5));
        assert_eq!(v.pointer("/n/1").and_then(Json::as_i64), Some(-2));
        assert_eq!(v.pointer("/n/0").and_then(Json::as_u64), Some(1));
        assert_eq!(v.to_json_text(), r#"{"a":"again","b":"esc\"aped","n":[1,-2,2.5,null,true]}"#);
        let mut o = v.as_object().expect("an object").clone();
        assert_eq!(o.remove("a").and_then(|a| a.as_str().map(str::to_string)).as_deref(), Some("again"));
        assert_eq!(o.get("a"), None, "every member of the name is taken out");
    }

    #[test]
    fn values_past_the_bound_are_refused_as_the_counting_pass_refuses_them() {
        let at_bound = format!("[{}]", vec!["0"; MAX_PARSED_VALUES - 1].join(","));
        assert_eq!(crate::protocol::json_value_count(at_bound.as_bytes(), usize::MAX), MAX_PARSED_VALUES);
        assert!(parse(&at_bound, "body").is_ok());
        let over = format!("[{}]", vec!["{}"; MAX_PARSED_VALUES].join(","));
        let err = parse(&over, "body").expect_err("refused");
        assert!(err.message.contains("at most 10000 JSON values"), "{}", err.message);
        assert!(crate::protocol::check_value_count(&over, "body").is_err());
        let broken = parse("{\"a\": ", "body").expect_err("refused");
        assert!(broken.message.starts_with("body: "), "{}", broken.message);
    }

    /// The values the counting pass sees: each value once, and an empty array or object one more
    /// (the pass counts an opening as its first item).
    fn count(v: &Json<'_>) -> usize {
        1 + match v {
            Json::Array(items) if items.is_empty() => 1,
            Json::Object(o) if o.is_empty() => 1,
            Json::Array(items) => items.iter().map(count).sum(),
            Json::Object(o) => o.iter().map(|(_, v)| count(v)).sum(),
            _ => 0,
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            "[a-z\"\\\\é\u{1F600}\n]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\"]{0,4}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The view reads every document as a `Value` does, and counts each value once (the counting
        /// pass also counts an empty container's phantom item): it holds no more than the pass allows.
        #[test]
        fn it_reads_what_a_value_reads(v in json()) {
            let text = v.to_string();
            let view = parse(&text, "body").expect("parses");
            let tree: Value = serde_json::from_str(&text).expect("parses");
            prop_assert_eq!(view.to_json_text(), tree.to_string());
            prop_assert_eq!(view.to_value(), tree);
            prop_assert_eq!(crate::protocol::json_value_count(text.as_bytes(), usize::MAX), count(&view));
        }
    }
}
