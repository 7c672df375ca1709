//! Any request body: the fields are read or refused, never a panic; for a valid JSON body
//! that is read, the include_usage splice gives valid JSON. (serde_json skips the fields
//! tollgate does not read without checking their strings, so a body that is invalid only
//! inside such a field is read and relayed, and the upstream refuses it: the first crash this
//! target found, in the target's first version that asserted on every body.)
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
