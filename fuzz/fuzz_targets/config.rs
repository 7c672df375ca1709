//! Any configuration text: loaded or refused with a message, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = tollgate::config::Config::parse(text, &|_| None) {
            assert!(!e.to_string().is_empty());
        }
    }
});
