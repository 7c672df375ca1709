//! Observing the gateway: Prometheus metrics ([`metrics`]), the process log ([`logging`]),
//! OpenTelemetry traces ([`telemetry`]) and the request id every answer carries
//! ([`request_id`]). The request log's entries are records (`records::log`).

pub mod logging;
pub mod metrics;
pub mod request_id;
pub mod telemetry;
