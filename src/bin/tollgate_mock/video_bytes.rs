//! The mock video service's video bytes: what a test expects a download to be.
//! Included by the integration tests too (`tests/common`).

/// Size of the mock result video.
pub(crate) const MOCK_VIDEO_LEN: usize = 300_000;

/// Size of the mock result of a `[big]` job (several multipart parts).
pub(crate) const MOCK_BIG_VIDEO_LEN: usize = 20 * 1024 * 1024 + 123;

/// The mock result video's bytes: an MP4 `ftyp` box, then a pattern.
#[allow(dead_code)] // the download the tests expect (tests/common includes this file)
pub(crate) fn mock_video_bytes() -> Vec<u8> {
    mock_video_of(MOCK_VIDEO_LEN)
}

/// A mock video of `len` bytes.
pub(crate) fn mock_video_of(len: usize) -> Vec<u8> {
    let mut v = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom".to_vec();
    v.extend((v.len()..len).map(|i| (i % 251) as u8));
    v
}
