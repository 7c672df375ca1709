//! Database hand-over during a Pingora graceful upgrade (`-u`, then SIGQUIT to the old process).
//!
//! sled keeps an exclusive lock, so only one process can have the database. The new process
//! starts, receives the listening sockets, then waits for the lock. When the old process stops
//! accepting (Pingora's shutdown broadcast), it releases the database at once; the new process
//! opens it and starts serving. The requests the old process is still finishing (a long stream,
//! a video submission) write through this module instead: one JSON line per write on the unix
//! socket `<data_dir>/handover.sock`, applied by the new process, which answers `ok` once the
//! write is durable. Nothing is lost: a booking is acknowledged only after the new process
//! flushed it.
//!
//! Only the process that replaced this one can be the other end: the new process writes a fresh
//! secret to `<data_dir>/handover.secret` (0600) before it listens; the socket is 0600 before
//! its name appears (bound under a temporary name, then renamed); each side checks the other's
//! user (`SO_PEERCRED`); a connection opens with `auth <secret>`; lines are at most
//! [`MAX_LINE`] bytes; anything else is refused and logged.

use crate::billing::ledger::Ledger;
use crate::records::task::Task;
use crate::records::usage::UsageRecord;
use crate::store::StoreError;
use crate::video::VideoService;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The socket's name inside `data_dir`.
pub const SOCKET: &str = "handover.sock";
/// The per-process secret's file name, next to the socket.
pub const SECRET: &str = "handover.secret";
/// The longest line either side reads (a task with its stored payload fits many times over).
pub const MAX_LINE: usize = 4 << 20;

/// How long the old process keeps trying to reach the new one.
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum Message {
    Booking(Box<UsageRecord>),
    Task(Box<Task>),
}

/// Read one message line (without its newline).
pub fn decode(line: &[u8]) -> Result<Message, String> {
    serde_json::from_slice::<Message>(line).map_err(|e| format!("bad message: {e}"))
}

/// Send one write to the process that has the database; returns once it is durable there.
pub async fn send(socket: &Path, message: &Message) -> Result<(), StoreError> {
    let line = serde_json::to_string(message).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let deadline = Instant::now() + PATIENCE;
    loop {
        match try_send(socket, &line).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                log::debug!("handover: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                log::error!("handover: gave up sending a write to the new process: {e}");
                return Err(StoreError::Released);
            }
        }
    }
}

async fn try_send(socket: &Path, line: &str) -> std::io::Result<()> {
    let secret = std::fs::read_to_string(socket.with_file_name(SECRET))?;
    let stream = tokio::net::UnixStream::connect(socket).await?;
    check_peer(&stream)?;
    let (read, mut write) = stream.into_split();
    write.write_all(format!("auth {}\n", secret.trim()).as_bytes()).await?;
    write.write_all(line.as_bytes()).await?;
    write.write_all(b"\n").await?;
    write.flush().await?;
    let mut reader = BufReader::new(read);
    let answer = read_line(&mut reader).await?.unwrap_or_default();
    if answer == b"ok" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("new process answered {:?}", String::from_utf8_lossy(&answer))))
    }
}

/// The other end of a hand-over connection must run as this process's user.
fn check_peer(stream: &tokio::net::UnixStream) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let own = unsafe { libc::geteuid() };
    if cred.uid() == own {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("hand-over peer runs as uid {} (pid {:?}), not {own}", cred.uid(), cred.pid()),
        ))
    }
}

/// One line without its newline, at most [`MAX_LINE`] bytes; `None` at the end of the stream.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let n = (&mut *reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_LINE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a line longer than {MAX_LINE} bytes")));
    }
    Ok(Some(line))
}

/// A fresh random secret, written (0600) where the old process will read it.
fn write_secret(path: &Path) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(secret.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(secret)
}

/// Listen on `path` with the socket 0600 before the name exists: bound under a temporary name,
/// its mode set, then renamed into place.
fn listen_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = tokio::net::UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(listener)
}

/// Constant-time comparison (the secret must not leak through timing).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The old process's side: sends its late writes to the new process over the socket.
pub struct Client {
    pub socket: PathBuf,
}

#[async_trait]
impl crate::store::ForwardBookings for Client {
    async fn forward_booking(&self, record: &UsageRecord) -> Result<(), StoreError> {
        send(&self.socket, &Message::Booking(Box::new(record.clone()))).await
    }
}

#[async_trait]
impl crate::store::ForwardTasks for Client {
    async fn forward_task(&self, task: &Task) -> Result<(), StoreError> {
        send(&self.socket, &Message::Task(Box::new(task.clone()))).await
    }
}

/// Applies writes handed over by the process this one replaced. Runs in every process (any of
/// them may be the new one of a later upgrade); binds only once the database is open.
pub struct HandoverServer {
    pub socket: PathBuf,
    pub ledger: Arc<Ledger>,
    pub video: Option<Arc<VideoService>>,
}

impl HandoverServer {
    async fn apply(&self, message: Message) -> Result<(), String> {
        match message {
            Message::Booking(record) => self.ledger.book_forwarded(*record).await.map(|_| ()).map_err(|e| e.to_string()),
            Message::Task(task) => match &self.video {
                Some(v) => v.accept_forwarded_task(*task).await.map_err(|e| e.to_string()),
                None => Err("video is not configured here".into()),
            },
        }
    }

    async fn serve(self: &Arc<Self>, stream: tokio::net::UnixStream, secret: &str) {
        if let Err(e) = check_peer(&stream) {
            log::warn!("handover: refused a connection: {e}");
            return;
        }
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let authenticated = match read_line(&mut reader).await {
            Ok(Some(line)) => line.strip_prefix(b"auth ").is_some_and(|given| same(given, secret.as_bytes())),
            _ => false,
        };
        if !authenticated {
            log::warn!("handover: refused a connection without the hand-over secret");
            let _ = write.write_all(b"error: unauthenticated\n").await;
            return;
        }
        loop {
            let line = match read_line(&mut reader).await {
                Ok(Some(line)) => line,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("handover: {e}; connection closed");
                    let _ = write.write_all(format!("error: {e}\n").as_bytes()).await;
                    return;
                }
            };
            let answer = match decode(&line) {
                Ok(message) => self.apply(message).await,
                Err(e) => Err(e),
            };
            let answer = match answer {
                Ok(()) => "ok\n".to_string(),
                Err(e) => {
                    log::error!("handover: {e}");
                    format!("error: {e}\n")
                }
            };
            if write.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// Background-service wrapper (the server needs an `Arc` of itself per connection).
pub struct HandoverService(pub Arc<HandoverServer>);

#[async_trait]
impl BackgroundService for HandoverService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let server = self.0.clone();
        let secret = match write_secret(&server.socket.with_file_name(SECRET)) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                log::error!("handover: cannot write the hand-over secret next to {}: {e}", server.socket.display());
                return;
            }
        };
        let listener = match listen_private(&server.socket) {
            Ok(l) => l,
            Err(e) => {
                log::error!("handover: cannot listen on {}: {e}", server.socket.display());
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let (server, secret) = (server.clone(), secret.clone());
                        tokio::spawn(async move { server.serve(stream, &secret).await });
                    }
                    Err(e) => log::warn!("handover: accept failed: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn booking(key: &str) -> UsageRecord {
        crate::billing::ledger::tests::record(key, "m", 10, crate::base::clock::now_ms())
    }

    struct Running {
        _dir: tempfile::TempDir,
        socket: PathBuf,
        db: sled::Db,
        _stop: tokio::sync::watch::Sender<bool>,
    }

    async fn start() -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path().join("db")).expect("sled");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        ledger.open_account("k", 1_000_000).await.expect("account");
        let socket = dir.path().join(SOCKET);
        let (stop, watch) = tokio::sync::watch::channel(false);
        let service = HandoverService(Arc::new(HandoverServer { socket: socket.clone(), ledger: ledger.clone(), video: None }));
        tokio::spawn(async move { service.start(watch).await });
        // The socket's name appears only once it listens.
        while !socket.exists() {
            tokio::task::yield_now().await;
        }
        Running { _dir: dir, socket, db, _stop: stop }
    }

    /// Send raw lines on a new connection; the answer line (empty if the connection closed).
    async fn raw(socket: &Path, lines: &[&[u8]]) -> String {
        let stream = tokio::net::UnixStream::connect(socket).await.expect("connect");
        let (read, mut write) = stream.into_split();
        for l in lines {
            // The server may close early; a failed write shows as the answer.
            if write.write_all(l).await.is_err() {
                break;
            }
        }
        let mut answer = String::new();
        let _ = BufReader::new(read).read_line(&mut answer).await;
        answer.trim().to_string()
    }

    #[tokio::test]
    async fn socket_and_secret_are_private_and_a_booking_with_the_secret_is_applied() {
        let r = start().await;
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&r.socket), 0o600);
        assert_eq!(mode(&r.socket.with_file_name(SECRET)), 0o600);
        send(&r.socket, &Message::Booking(Box::new(booking("k")))).await.expect("delivered");
        assert_eq!(crate::billing::ledger::tests::records(&r.db, "k").expect("records").len(), 1);
    }

    #[tokio::test]
    async fn without_the_secret_nothing_is_applied() {
        let r = start().await;
        let line = format!("{}\n", serde_json::to_string(&Message::Booking(Box::new(booking("k")))).expect("json"));
        for first in [b"auth wrong-secret\n".as_slice(), b"auth \n", line.as_bytes()] {
            let answer = raw(&r.socket, &[first, line.as_bytes()]).await;
            assert_eq!(answer, "error: unauthenticated");
        }
        assert!(crate::billing::ledger::tests::records(&r.db, "k").expect("records").is_empty());
    }

    #[tokio::test]
    async fn malformed_and_overlong_lines_are_refused() {
        let r = start().await;
        let secret = std::fs::read_to_string(r.socket.with_file_name(SECRET)).expect("secret");
        let auth = format!("auth {secret}\n");
        let answer = raw(&r.socket, &[auth.as_bytes(), b"{\"kind\":\"booking\",\"payload\":{\"cost_nanos\":-5}}\n"]).await;
        assert!(answer.starts_with("error: bad message"), "{answer}");
        let long = vec![b'x'; MAX_LINE + 10];
        let answer = raw(&r.socket, &[auth.as_bytes(), &long]).await;
        assert!(answer.starts_with("error:") && answer.contains("longer than"), "{answer}");
        assert!(crate::billing::ledger::tests::records(&r.db, "k").expect("records").is_empty());
    }
}
