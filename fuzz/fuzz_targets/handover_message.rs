//! Any hand-over line: decoded or refused, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tollgate::handover::decode(data);
});
