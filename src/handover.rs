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

use crate::ledger::{Ledger, UsageRecord};
use crate::store::StoreError;
use crate::video::task::Task;
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

/// How long the old process keeps trying to reach the new one.
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", content = "payload", rename_all = "snake_case")]
pub enum Message {
    Booking(UsageRecord),
    Task(Box<Task>),
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
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let (read, mut write) = stream.into_split();
    write.write_all(line.as_bytes()).await?;
    write.write_all(b"\n").await?;
    write.flush().await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    if answer.trim() == "ok" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("new process answered {answer:?}")))
    }
}

/// The old process's side: sends its late writes to the new process over the socket.
pub struct Client {
    pub socket: PathBuf,
}

#[async_trait]
impl crate::ledger::ForwardBookings for Client {
    async fn forward_booking(&self, record: &UsageRecord) -> Result<(), StoreError> {
        send(&self.socket, &Message::Booking(record.clone())).await
    }
}

#[async_trait]
impl crate::video::store::ForwardTasks for Client {
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
    async fn apply(&self, line: &str) -> Result<(), String> {
        match serde_json::from_str::<Message>(line).map_err(|e| format!("bad message: {e}"))? {
            Message::Booking(record) => self.ledger.book_forwarded(record).await.map(|_| ()).map_err(|e| e.to_string()),
            Message::Task(task) => match &self.video {
                Some(v) => v.accept_forwarded_task(*task).await.map_err(|e| e.to_string()),
                None => Err("video is not configured here".into()),
            },
        }
    }

    async fn serve(self: &Arc<Self>, stream: tokio::net::UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let answer = match self.apply(&line).await {
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
        let _ = std::fs::remove_file(&server.socket);
        let listener = match tokio::net::UnixListener::bind(&server.socket) {
            Ok(l) => l,
            Err(e) => {
                log::error!("handover: cannot listen on {}: {e}", server.socket.display());
                return;
            }
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&server.socket, std::fs::Permissions::from_mode(0o600));
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let server = server.clone();
                        tokio::spawn(async move { server.serve(stream).await });
                    }
                    Err(e) => log::warn!("handover: accept failed: {e}"),
                }
            }
        }
    }
}
