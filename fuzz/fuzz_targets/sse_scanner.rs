//! Any upstream bytes, cut anywhere: the scanner never panics, passes the bytes on unchanged
//! when it withholds nothing, and in withhold mode never emits more than it was given.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tollgate::billing::meter::{Shape, UsageScanner};

fuzz_target!(|data: &[u8]| {
    let Some((&cut_seed, body)) = data.split_first() else { return };
    let step = usize::from(cut_seed).max(1);
    for withhold in [false, true] {
        let mut s = UsageScanner::new(Shape::Chat, true, withhold);
        let mut out = Vec::new();
        for chunk in body.chunks(step) {
            let chunk = Bytes::copy_from_slice(chunk);
            match s.feed(&chunk) {
                Some(replaced) => out.extend_from_slice(&replaced),
                None => out.extend_from_slice(&chunk),
            }
        }
        if let Some(rest) = s.take_pending() {
            out.extend_from_slice(&rest);
        }
        let r = s.finish();
        assert_eq!(r.body_bytes, out.len() as u64);
        if withhold {
            assert!(out.len() <= body.len());
        } else {
            assert_eq!(out, body);
        }
    }
});
