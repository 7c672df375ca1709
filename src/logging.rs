//! Process logging: env_logger (`RUST_LOG`), with messages that report routine events at a
//! level that pages an operator lowered to `debug`.
//!
//! Pingora logs `failed to acquire reusable stream` at ERROR whenever a pooled upstream
//! connection was closed by its peer while idle (the pool's watcher still holds it); the
//! request then opens a new connection and nothing failed. A request that does fail is logged
//! by the relay itself.

use log::{Level, Log, Metadata, Record};

/// Messages logged at a higher level than what they report deserves: (target, message).
const ROUTINE: &[(&str, &str)] = &[("pingora_core::connectors", "failed to acquire reusable stream")];

/// The level a record is logged at.
pub fn level_for(record: &Record<'_>) -> Level {
    let routine = record.level() <= Level::Warn
        && ROUTINE.iter().any(|(target, message)| record.target() == *target && record.args().as_str().is_some_and(|m| m == *message));
    if routine {
        Level::Debug
    } else {
        record.level()
    }
}

struct Filtered(env_logger::Logger);

impl Log for Filtered {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let level = level_for(record);
        if level == record.level() {
            self.0.log(record);
            return;
        }
        let meta = Metadata::builder().level(level).target(record.target()).build();
        if self.0.enabled(&meta) {
            self.0.log(
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
        self.0.flush()
    }
}

/// Install the logger; `default_filter` applies when `RUST_LOG` is unset.
pub fn init(default_filter: &str) {
    let logger = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter)).build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(Filtered(logger))).is_ok() {
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
        assert_eq!(level("tollgate::gateway", Level::Error, format_args!("failed to acquire reusable stream")), Level::Error);
        assert_eq!(level(target, Level::Info, format_args!("failed to acquire reusable stream")), Level::Info);
    }
}
