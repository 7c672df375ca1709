//! Any request body: the fields are read or refused, never a panic; for a valid JSON body
//! that is read, the include_usage splice gives valid JSON. (The scan checks every string's
//! escapes, control characters and UTF-8, but not whether a `\u` escape is half a surrogate
//! pair, as serde_json's skip did not: a body invalid only that way is read and relayed, and
//! the upstream refuses it. In the target's first version, which asserted on every body, such
//! bodies were the first crash it found.)
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(fields) = tollgate::protocol::body_fields(data) {
        if let Ok(out) = tollgate::protocol::openai::with_include_usage(data, &fields) {
            if serde_json::from_slice::<serde_json::Value>(data).is_ok() {
                assert!(serde_json::from_slice::<serde_json::Value>(&out).is_ok(), "the splice broke valid JSON");
            }
        }
    }
});
