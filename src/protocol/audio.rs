//! How long an uploaded audio file plays, read from its container without decoding it
//! (`symphonia`'s demuxers: Ogg — Opus, Vorbis, FLAC —, WebM/Matroska, MP4/M4A, WAV, MP3 and
//! FLAC): what a transcription is held for and, when the answer reports nothing to bill by, billed
//! for. A file none of them reads has no duration here (the caller falls back to a bound by
//! size). Reads at offsets of the spooled file; never changes its position.

use std::sync::Arc;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSource, MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

/// The spooled file as a seekable source of `len` bytes, read at its own offset.
struct Spooled {
    file: Arc<std::fs::File>,
    len: u64,
    at: u64,
}

impl std::io::Read for Spooled {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.at);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = std::os::unix::fs::FileExt::read_at(&*self.file, &mut buf[..want], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for Spooled {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            std::io::SeekFrom::Start(n) => Some(n),
            std::io::SeekFrom::End(d) => self.len.checked_add_signed(d),
            std::io::SeekFrom::Current(d) => self.at.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start"))?;
        self.at = target;
        Ok(target)
    }
}

impl MediaSource for Spooled {
    fn is_seekable(&self) -> bool {
        true
    }

    fn byte_len(&self) -> Option<u64> {
        Some(self.len)
    }
}

/// The seconds the first `len` bytes of `file` play (the longest audio track's duration), if a
/// demuxer reads its container; `filename` (its extension) hints at which.
pub fn seconds(file: Arc<std::fs::File>, len: u64, filename: Option<&str>) -> Option<f64> {
    let source = Spooled { file, len, at: 0 };
    let stream = MediaSourceStream::new(Box::new(source), MediaSourceStreamOptions::default());
    let mut hint = Hint::new();
    if let Some(ext) = filename.and_then(|f| f.rsplit_once('.')).map(|(_, ext)| ext) {
        hint.with_extension(ext);
    }
    let format = symphonia::default::get_probe().probe(&hint, stream, FormatOptions::default(), MetadataOptions::default()).ok()?;
    let mut longest: Option<f64> = None;
    for track in format.tracks() {
        let audio = track.codec_params.as_ref().is_none_or(|p| p.audio().is_some());
        let (Some(tb), Some(duration)) = (track.time_base, track.duration) else { continue };
        if !audio {
            continue;
        }
        if let Some(t) = tb.calc_duration(duration) {
            let secs = t.as_secs_f64();
            longest = Some(longest.map_or(secs, |l| l.max(secs)));
        }
    }
    longest.filter(|s| s.is_finite() && *s >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A WAV file of `secs` seconds of 16 kHz mono 16-bit silence.
    pub(crate) fn wav(secs: u32) -> Vec<u8> {
        let data = secs * 16_000 * 2;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16_000u32.to_le_bytes());
        out.extend_from_slice(&32_000u32.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data.to_le_bytes());
        out.resize(out.len() + data as usize, 0);
        out
    }

    fn spooled(bytes: &[u8]) -> Arc<std::fs::File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        Arc::new(f)
    }

    #[test]
    fn a_wav_files_duration_is_read_from_its_header_and_noise_has_none() {
        let bytes = wav(7);
        let secs = seconds(spooled(&bytes), bytes.len() as u64, Some("a.wav")).unwrap();
        assert!((secs - 7.0).abs() < 0.01, "{secs}");
        assert_eq!(seconds(spooled(&[7u8; 5000]), 5000, Some("a.mp3")), None);
    }

    #[test]
    fn ogg_opus_and_mp3_at_rates_under_any_size_bound_are_read_as_they_play() {
        // 20 s each: Opus at 3 kbit/s (~600 bytes a second), MP3 at 8 kbit/s (opusenc, lame).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/audio");
        for name in ["tone-20s-3kbps.opus", "tone-20s-8kbps.mp3"] {
            let bytes = std::fs::read(dir.join(name)).unwrap();
            let secs = seconds(spooled(&bytes), bytes.len() as u64, Some(name));
            assert!(secs.is_some_and(|s| (s - 20.0).abs() < 0.2), "{name}: {secs:?}");
            // Without a name to hint at the container: found by its content.
            let secs = seconds(spooled(&bytes), bytes.len() as u64, None);
            assert!(secs.is_some_and(|s| (s - 20.0).abs() < 0.2), "{name} unnamed: {secs:?}");
        }
    }
}
