//! Which conversation a request continues: a hash of its system prompt and first user turn,
//! whatever the protocol, so that every turn of a conversation goes to the same provider
//! (`upstream::affinity`) and its prompt cache.

use super::*;

/// What keeps the turns of one conversation on one provider: the client's `prompt_cache_key`,
/// else a digest of how the conversation begins (its system prompt and its items up to the
/// first user message, which every later turn repeats). None for a body with neither.
pub fn conversation_key(f: &BodyFields<'_>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Some(key) = f.prompt_cache_key.as_deref().filter(|k| !k.is_empty()) {
        ("prompt_cache_key", key).hash(&mut h);
        return Some(h.finish());
    }
    let list = f.messages.or(f.input).or(f.contents)?;
    for part in [f.system, f.instructions, f.system_instruction].into_iter().flatten() {
        // Hashed as its text (`str`'s hash: the bytes, then 0xFF), as before the scan kept bytes.
        h.write(part.bytes());
        h.write_u8(0xFF);
    }
    let mut any = false;
    leading_items(list.bytes(), MAX_LEADING_ITEMS, &mut |item| {
        any = true;
        item.get().hash(&mut h);
        !is_user_item(item)
    });
    any.then(|| h.finish())
}

/// Whether a conversation item is the user's (chat, messages and responses: `role: user`;
/// generate-content: `role: user` or no role).
pub(super) fn is_user_item(item: &serde_json::value::RawValue) -> bool {
    #[derive(Deserialize)]
    struct Role<'a> {
        #[serde(default, borrow)]
        role: Option<std::borrow::Cow<'a, str>>,
        #[serde(default, borrow, rename = "parts")]
        parts: Option<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_str::<Role>(item.get()) {
        Ok(r) => r.role.as_deref() == Some("user") || (r.role.is_none() && r.parts.is_some()),
        // Not an object (a plain string input): it is the user's.
        Err(_) => true,
    }
}

/// Call `each` with the raw text of an array's items in order, until it returns false or
/// `max` were seen; the rest of the array is never read. A value that is not an array is
/// passed whole, once.
pub fn leading_items<'a>(raw: &'a [u8], max: usize, each: &mut dyn FnMut(&'a serde_json::value::RawValue) -> bool) {
    use serde::de::{Deserializer as _, Error as _, SeqAccess, Visitor};
    struct Lead<'f, 'a> {
        max: usize,
        each: &'f mut dyn FnMut(&'a serde_json::value::RawValue) -> bool,
    }
    impl<'de> Visitor<'de> for Lead<'_, 'de> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            for _ in 0..self.max {
                match seq.next_element::<&'de serde_json::value::RawValue>()? {
                    Some(item) if (self.each)(item) => {}
                    Some(_) => break,
                    None => return Ok(()),
                }
            }
            // Enough was read: stop here rather than scan the rest.
            Err(A::Error::custom("stopped"))
        }
    }
    if raw.trim_ascii_start().first() != Some(&b'[') {
        if let Ok(whole) = serde_json::from_slice::<&serde_json::value::RawValue>(raw) {
            each(whole);
        }
        return;
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    // An early stop ends in an error by design; the items seen were passed on already.
    let _ = (&mut de).deserialize_seq(Lead { max, each });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn key_of(v: Value) -> Option<u64> {
        let text = v.to_string();
        conversation_key(&body_fields(text.as_bytes()).expect("parse"))
    }

    #[test]
    fn a_conversation_keeps_its_key_from_turn_to_turn() {
        let sys = json!({"role": "system", "content": "be brief"});
        let first = json!({"role": "user", "content": "hello"});
        let turn1 = key_of(json!({"model": "m", "messages": [sys, first]}));
        let turn2 = key_of(
            json!({"model": "m", "messages": [sys, first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]}),
        );
        assert!(turn1.is_some());
        assert_eq!(turn1, turn2, "later turns repeat the beginning");
        let other = key_of(json!({"model": "m", "messages": [sys, {"role": "user", "content": "another"}]}));
        assert_ne!(turn1, other, "another conversation with the same system prompt");
        // Messages: the system prompt is a field of its own.
        let m1 = key_of(json!({"system": "s", "messages": [first]}));
        assert_ne!(m1, key_of(json!({"system": "t", "messages": [first]})));
        assert_eq!(m1, key_of(json!({"system": "s", "messages": [first, {"role": "assistant", "content": "x"}]})));
        // Generate-content: the first content has the user's role, or none.
        let g = key_of(json!({"contents": [{"parts": [{"text": "a"}]}]}));
        assert_eq!(g, key_of(json!({"contents": [{"parts": [{"text": "a"}]}, {"role": "model", "parts": [{"text": "b"}]}]})));
        // Responses: a plain string input; a prompt_cache_key wins over everything.
        assert!(key_of(json!({"model": "m", "input": "hi"})).is_some());
        let keyed = key_of(json!({"model": "m", "input": "hi", "prompt_cache_key": "conv-1"}));
        assert_eq!(keyed, key_of(json!({"model": "m", "input": "other", "prompt_cache_key": "conv-1"})));
        assert_ne!(keyed, key_of(json!({"model": "m", "input": "hi"})));
        assert_eq!(key_of(json!({"model": "m"})), None);
    }

    #[test]
    fn leading_items_stop_without_reading_the_rest() {
        let raw = br#"[{"role":"user"},2,3]"#;
        let mut seen = Vec::new();
        leading_items(raw, 8, &mut |item| {
            seen.push(item.get().to_string());
            !is_user_item(item)
        });
        assert_eq!(seen, [r#"{"role":"user"}"#]);
        let mut n = 0;
        leading_items(raw, 2, &mut |_| {
            n += 1;
            true
        });
        assert_eq!(n, 2, "at most max items");
        let scalar = br#""text""#;
        let mut whole = Vec::new();
        leading_items(scalar, 8, &mut |item| {
            whole.push(item.get().to_string());
            true
        });
        assert_eq!(whole, [r#""text""#], "not an array: passed whole");
    }
}
