//! Any video task body: validated or refused with a 400, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let enabled: Vec<String> = ["genq3-pro", "genq2", "genq2-pro"].iter().map(|m| m.to_string()).collect();
    if let Err(e) = tollgate::video::request::parse_body(data).and_then(|v| tollgate::video::request::validate(&v, &enabled, true)) {
        assert_eq!(e.status(), 400);
    }
});
