//! Process logging: env_logger (`RUST_LOG`), with messages that report routine events at a
//! level that pages an operator lowered to `debug`.
//!
//! Pingora logs `failed to acquire reusable stream` at ERROR whenever a pooled upstream
//! connection was closed by its peer while idle (the pool's watcher still holds it); the
//! request then opens a new connection and nothing failed. A request that does fail is logged
//! by the relay itself. During an upgrade the new process logs `No incoming socket transfer`
//! at ERROR once a second until the old one sends its listeners (tollgate says once, at INFO,
//! what it waits for); at start Pingora names every service it starts at INFO, where tollgate's
//! one summary line says what runs.

use log::{Level, Log, Metadata, Record};
use std::sync::atomic::{AtomicBool, Ordering};

/// `log: { format: json }`: every line one JSON object (set once the configuration is read).
static JSON: AtomicBool = AtomicBool::new(false);

/// Write JSON lines from now on (`log.format: json`), or text.
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// Whether lines are JSON objects.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// One JSON log line: time, level and target, then the access line's own fields (its message
/// is a JSON object already) or `message`.
fn json_line(buf: &mut env_logger::fmt::Formatter, record: &Record<'_>) -> std::io::Result<()> {
    use std::io::Write;
    let message = record.args().to_string();
    let target = serde_json::Value::from(record.target());
    let head = format!("{{\"ts\":\"{}\",\"level\":\"{}\",\"target\":{target}", buf.timestamp_millis(), record.level());
    match message.strip_prefix('{') {
        Some(fields) if record.target() == "access" => writeln!(buf, "{head},{fields}"),
        _ => writeln!(buf, "{head},\"message\":{}}}", serde_json::Value::from(message)),
    }
}

/// Pingora's messages logged at a higher level than what they report deserves: (target, how
/// the message begins). Each is logged at debug.
const ROUTINE: &[(&str, &str)] = &[
    ("pingora_core::connectors", "failed to acquire reusable stream"),
    ("pingora_core::server::transfer_fd", "No incoming socket transfer"),
    ("pingora_core::server", "Starting service"),
    ("pingora_core::server", "Service '"),
    ("pingora_core::server", "Server starting"),
    ("pingora_core::server::bootstrap_services", "Bootstrap"),
];

/// The level a record is logged at.
pub fn level_for(record: &Record<'_>) -> Level {
    // Only Pingora's records are looked at (and formatted) here.
    if record.level() > Level::Info || !record.target().starts_with("pingora_core") {
        return record.level();
    }
    let mut candidates = ROUTINE.iter().filter(|(target, _)| record.target() == *target).peekable();
    if candidates.peek().is_none() {
        return record.level();
    }
    let message = match record.args().as_str() {
        Some(text) => std::borrow::Cow::Borrowed(text),
        None => std::borrow::Cow::Owned(record.args().to_string()),
    };
    if candidates.any(|(_, begins)| message.starts_with(begins)) {
        Level::Debug
    } else {
        record.level()
    }
}

/// The process's logger: the text one, or the JSON one once `log.format: json` is read.
struct Filtered {
    text: env_logger::Logger,
    json: env_logger::Logger,
}

impl Filtered {
    fn current(&self) -> &env_logger::Logger {
        if json() {
            &self.json
        } else {
            &self.text
        }
    }
}

impl Log for Filtered {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.current().enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let logger = self.current();
        let level = level_for(record);
        if level == record.level() {
            logger.log(record);
            return;
        }
        let meta = Metadata::builder().level(level).target(record.target()).build();
        if logger.enabled(&meta) {
            logger.log(
                &Record::builder()
                    .metadata(meta)
                    .args(*record.args())
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            );
        }
    }

    fn flush(&self) {
        self.current().flush()
    }
}

/// Install the logger; `default_filter` applies when `RUST_LOG` is unset.
pub fn init(default_filter: &str) {
    let env = || env_logger::Env::default().default_filter_or(default_filter);
    let text = env_logger::Builder::from_env(env()).build();
    let json = env_logger::Builder::from_env(env()).format(json_line).build();
    let max = text.filter();
    if log::set_boxed_logger(Box::new(Filtered { text, json })).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(target: &str, level: Level, args: std::fmt::Arguments<'_>) -> Level {
        level_for(&Record::builder().target(target).level(level).args(args).build())
    }

    #[test]
    fn the_pooled_connection_message_is_debug_and_everything_else_keeps_its_level() {
        let target = "pingora_core::connectors";
        assert_eq!(level(target, Level::Error, format_args!("failed to acquire reusable stream")), Level::Debug);
        assert_eq!(level(target, Level::Error, format_args!("connect failed: {}", 1)), Level::Error);
        assert_eq!(level("tollgate::edge::gateway", Level::Error, format_args!("failed to acquire reusable stream")), Level::Error);
        assert_eq!(level(target, Level::Info, format_args!("failed to acquire reusable stream")), Level::Debug);
        // The upgrade's wait and the start's service list.
        let wait = format_args!("No incoming socket transfer, sleep {:?} and try again", std::time::Duration::from_secs(1));
        assert_eq!(level("pingora_core::server::transfer_fd", Level::Error, wait), Level::Debug);
        assert_eq!(
            level("pingora_core::server::transfer_fd", Level::Error, format_args!("Error accepting socket transfer: x")),
            Level::Error
        );
        assert_eq!(level("pingora_core::server", Level::Info, format_args!("Starting service: {}", "tollgate")), Level::Debug);
        assert_eq!(level("pingora_core::server", Level::Info, format_args!("SIGTERM received, gracefully exiting")), Level::Info);
    }
}
