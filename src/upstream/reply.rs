//! An upstream's answer as the gateway reads it: the HTTP session, and where the provider's
//! seam frames the answer otherwise than its wire protocol (Bedrock's event stream), the
//! header and every body chunk decoded into the wire protocol's framing first — so metering,
//! translation and the client see one framing whatever the kind of upstream. A relayed answer
//! of a model the provider knows by another name names the model as the client does
//! (`"model":"<upstream name>"` — generate-content's `"modelVersion"` too — written back to the
//! client's name, whole and streamed; a name cut between two chunks stays the upstream's).

use super::seam::{Decode, Seam};
use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_http::ResponseHeader;

/// A model's upstream name and the client's, as JSON string contents.
type Renames = (Vec<u8>, Vec<u8>);

pub struct Reply {
    http: HttpSession,
    /// The decoded header (None: the session's own, undecoded).
    header: Option<Box<ResponseHeader>>,
    decoder: Option<Box<dyn Decode>>,
    /// The model's upstream name and the client's (see [`replaced`]).
    rename: Option<Box<Renames>>,
    /// A first chunk read ahead (see [`Reply::keep_length`]), already renamed, or its error.
    ahead: Option<pingora_error::Result<Option<Bytes>>>,
}

/// A renamed whole answer up to this long is read ahead to keep an exact length.
const KEEP_LENGTH_MAX: usize = 64 << 10;

/// Most bytes [`Reply::read_gathered`] joins, and most chunks it takes, in one call.
const GATHER_MAX_BYTES: usize = 64 << 10;
const GATHER_MAX_CHUNKS: usize = 64;

impl Reply {
    /// The answer of `http` (its header read) for `model` (the provider's name) from a provider
    /// with seam `seam`; `renamed`: the model's (upstream, client) names when they differ and the
    /// answer is relayed as is.
    pub fn new(http: HttpSession, seam: &dyn Seam, model: &str, renamed: Option<(&str, &str)>) -> Reply {
        let decoder = http.response_header().and_then(|h| seam.decoder(model, h));
        let rename = renamed.map(|(theirs, ours)| Box::new((theirs.as_bytes().to_vec(), ours.as_bytes().to_vec())));
        let header = match (&decoder, http.response_header()) {
            (Some(_), Some(h)) | (None, Some(h)) if decoder.is_some() || rename.is_some() => {
                let mut header = Box::new(h.clone());
                match &decoder {
                    Some(d) => d.header(&mut header),
                    // The body's length changes with the name.
                    None => {
                        header.remove_header(&http::header::CONTENT_LENGTH);
                    }
                }
                Some(header)
            }
            _ => None,
        };
        Reply { http, header, decoder, rename, ahead: None }
    }

    /// A whole answer whose model is renamed would lose its `Content-Length` (the name's
    /// length changes) and go chunked: two more writes to the client for every call. When it
    /// is small and its body comes in the first read (as small answers do), that read is made
    /// now and the renamed body's exact length kept; else it goes chunked as before. Nothing is
    /// held beyond the one read the relay makes anyway.
    pub async fn keep_length(&mut self) {
        let whole = |h: &ResponseHeader| {
            let sse = h.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let len = h.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
            len.filter(|l| !sse && (1..=KEEP_LENGTH_MAX).contains(l))
        };
        let Some(len) = self.http.response_header().and_then(whole).filter(|_| self.rename.is_some() && self.decoder.is_none()) else {
            return;
        };
        let first = self.http.read_response_body().await;
        let (first, whole) = match first {
            Ok(Some(data)) => {
                let came = data.len();
                let renamed = match &self.rename {
                    Some(n) => replaced(data, &n.0, &n.1),
                    None => data,
                };
                let done = came == len && self.http.response_done();
                (Ok(Some(renamed)), done)
            }
            other => (other, false),
        };
        if let (true, Ok(Some(body)), Some(header)) = (whole, &first, self.header.as_mut()) {
            let _ = header.insert_header(http::header::CONTENT_LENGTH, body.len());
        }
        self.ahead = Some(first);
    }

    pub fn response_header(&self) -> Option<&ResponseHeader> {
        self.header.as_deref().or_else(|| self.http.response_header())
    }

    /// The next chunk of the body, decoded (possibly empty while a frame is incomplete).
    pub async fn read_response_body(&mut self) -> pingora_error::Result<Option<Bytes>> {
        if let Some(ahead) = self.ahead.take() {
            return ahead;
        }
        let chunk = self.http.read_response_body().await?;
        let chunk = match &mut self.decoder {
            None => chunk,
            Some(d) => {
                let decoded = chunk.as_deref().map(|data| d.decode(data));
                // The body's end (the callers stop reading when the session says it is done).
                if decoded.is_none() || self.http.response_done() {
                    let rest = d.finish();
                    match decoded {
                        Some(data) if !rest.is_empty() => Some(Bytes::from([&data[..], &rest[..]].concat())),
                        Some(data) => Some(data),
                        None => Some(rest).filter(|rest| !rest.is_empty()),
                    }
                } else {
                    decoded
                }
            }
        };
        Ok(match (&self.rename, chunk) {
            (Some(names), Some(data)) => Some(replaced(data, &names.0, &names.1)),
            (_, chunk) => chunk,
        })
    }

    /// The next chunk of the body (waited for), joined with every further chunk that is
    /// already here — in the session's buffer or the socket's — without waiting for more
    /// (each tried once; an unfinished read is dropped before it takes any byte). An upstream
    /// that frames every event as its own HTTP chunk and sends several in one segment is then
    /// relayed in one write instead of one per event, as a bare proxy does. An error met while
    /// gathering is kept for the next call, after the bytes before it.
    pub async fn read_gathered(&mut self) -> pingora_error::Result<Option<Bytes>> {
        use futures_util::FutureExt;
        let Some(first) = self.read_response_body().await? else { return Ok(None) };
        let mut joined: Option<Vec<u8>> = None;
        for _ in 0..GATHER_MAX_CHUNKS {
            let held = joined.as_ref().map_or(first.len(), Vec::len);
            if held >= GATHER_MAX_BYTES || self.response_done() {
                break;
            }
            match self.read_response_body().now_or_never() {
                None => break,
                Some(Ok(Some(more))) => joined.get_or_insert_with(|| first.to_vec()).extend_from_slice(&more),
                Some(end @ (Ok(None) | Err(_))) => {
                    self.ahead = Some(end);
                    break;
                }
            }
        }
        Ok(Some(joined.map_or(first, Bytes::from)))
    }

    pub fn response_done(&mut self) -> bool {
        // A chunk read ahead is still to be read.
        self.ahead.is_none() && self.http.response_done()
    }

    pub async fn shutdown(&mut self) {
        self.http.shutdown().await;
    }

    /// The session, to give back to the connection pool.
    pub fn into_inner(self) -> HttpSession {
        self.http
    }
}

/// `data` with the value of every `"model":"<theirs>"` and `"modelVersion":"<theirs>"` (a space
/// after the colon or not) made `ours`; the same bytes when there is none. One search for
/// `"model` (its searcher built once), each hit checked in place.
fn replaced(data: Bytes, theirs: &[u8], ours: &[u8]) -> Bytes {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"model"));
    let value_at = |at: usize| {
        let rest = data.get(at + 6..)?;
        let rest = rest.strip_prefix(b"Version").unwrap_or(rest).strip_prefix(b"\":")?;
        let rest = rest.strip_prefix(b" ").unwrap_or(rest).strip_prefix(b"\"")?;
        let start = data.len() - rest.len();
        (rest.starts_with(theirs) && rest.get(theirs.len()) == Some(&b'"')).then_some(start)
    };
    let mut found = KEY.find_iter(&data).filter_map(value_at).peekable();
    if found.peek().is_none() {
        return data;
    }
    let mut out = Vec::with_capacity(data.len() + ours.len());
    let mut last = 0;
    for at in found {
        out.extend_from_slice(&data[last..at]);
        out.extend_from_slice(ours);
        last = at + theirs.len();
    }
    out.extend_from_slice(&data[last..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An upstream that sends its answer's head and three chunks in one write, then (when told)
    /// a fourth chunk and half of a fifth, and hangs up.
    async fn upstream() -> (Reply, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (go_on, told) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let _ = s.read(&mut head).await;
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n6\r\nsecond\r\n5\r\nthird\r\n";
            s.write_all(answer).await.unwrap();
            let _ = told.await;
            s.write_all(b"6\r\nfourth\r\n9\r\ncut").await.unwrap();
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut h1 = pingora_core::protocols::http::v1::client::HttpSession::new(Box::new(
            pingora_core::protocols::l4::stream::Stream::from(stream),
        ));
        let req = pingora_http::RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        h1.write_request_header(Box::new(req)).await.unwrap();
        h1.read_response().await.unwrap();
        let seam = super::super::seam::openai::OpenAi::new(&[]);
        (Reply::new(HttpSession::H1(h1), &seam, "m", None), go_on)
    }

    #[tokio::test]
    async fn chunks_already_here_are_read_as_one_and_an_error_after_them_comes_next() {
        let (mut reply, go_on) = upstream().await;
        let first = reply.read_gathered().await.unwrap();
        assert_eq!(first.as_deref(), Some(&b"firstsecondthird"[..]), "the three chunks of one write, joined");
        go_on.send(()).unwrap();
        // The fourth is waited for; the cut fifth is an error, after it, never lost or reordered.
        let mut got = Vec::new();
        let err = loop {
            match reply.read_gathered().await {
                Ok(Some(more)) => got.extend_from_slice(&more),
                Ok(None) => panic!("a cut answer must not end cleanly"),
                Err(e) => break e,
            }
        };
        assert!(got.starts_with(b"fourth"), "{:?}", String::from_utf8_lossy(&got));
        assert_eq!(err.etype(), &pingora_error::ErrorType::ConnectionClosed, "{err}");
    }

    #[test]
    fn the_upstream_name_of_a_model_is_written_back_as_the_clients_and_nothing_else_changes() {
        let (from, to) = (b"anthropic.claude-x-v1:0", b"beta-x");
        let data = Bytes::from_static(
            br#"{"id":"m","model":"anthropic.claude-x-v1:0","text":"model anthropic.claude-x-v1:0","m2":{"model": "anthropic.claude-x-v1:0"},"modelVersion":"anthropic.claude-x-v1:0","model":"anthropic.claude-x-v1:00","models":"anthropic.claude-x-v1:0","model":"anthropic.claude-x"#,
        );
        assert_eq!(
            replaced(data, from, to),
            Bytes::from_static(
                br#"{"id":"m","model":"beta-x","text":"model anthropic.claude-x-v1:0","m2":{"model": "beta-x"},"modelVersion":"beta-x","model":"anthropic.claude-x-v1:00","models":"anthropic.claude-x-v1:0","model":"anthropic.claude-x"#
            )
        );
        let untouched = Bytes::from_static(b"data: {}\n\n");
        assert_eq!(replaced(untouched.clone(), from, to).as_ptr(), untouched.as_ptr(), "no copy without a match");
    }
}
