//! A file read back in chunks from its start, each read on a blocking thread at its offset (so
//! many readers may share one handle): how a spooled upload goes on to an upstream or a store.

use bytes::Bytes;
use futures_util::Stream;
use std::sync::Arc;

/// The first `len` bytes of `file`, `chunk` bytes at a time.
pub fn chunks(file: Arc<std::fs::File>, len: u64, chunk: u64) -> impl Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static {
    Box::pin(futures_util::stream::unfold(0u64, move |at| {
        let file = file.clone();
        async move {
            if at >= len {
                return None;
            }
            let n = (len - at).min(chunk.max(1));
            let read = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; n as usize];
                std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, at).map(|()| Bytes::from(buf))
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            Some((read, at + n))
        }
    }))
}

/// A blocking reader of a shared file from its start, at its own offset (the file's position,
/// which other readers share, is left alone).
pub struct Reader {
    file: Arc<std::fs::File>,
    at: u64,
}

impl Reader {
    pub fn new(file: Arc<std::fs::File>) -> Reader {
        Reader { file, at: 0 }
    }
}

impl std::io::Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(&*self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::io::Write;

    #[tokio::test]
    async fn a_file_comes_back_whole_in_chunks_and_only_its_first_len_bytes() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        f.write_all(&data).unwrap();
        let got: Vec<Bytes> = chunks(Arc::new(f), 900, 256).map(|c| c.unwrap()).collect().await;
        assert_eq!(got.iter().map(Bytes::len).collect::<Vec<_>>(), [256, 256, 256, 132]);
        assert_eq!(got.concat(), data[..900]);
    }

    #[test]
    fn a_reader_reads_from_the_start_whatever_the_files_position() {
        use std::io::Read;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"one\ntwo\n").unwrap();
        let mut text = String::new();
        Reader::new(Arc::new(f)).read_to_string(&mut text).unwrap();
        assert_eq!(text, "one\ntwo\n");
    }
}
