//! The edge: client connections and what comes in on them — the listener that bounds a
//! connection's header phase ([`listener`]), request bodies ([`body`]), the proxy of model
//! calls ([`gateway`], its request path as stages) and the listener of local answers
//! ([`local`]: the admin API and the metrics listener), and the event-stream framing of a
//! Bedrock-format stream's answer ([`framing`]).

pub mod body;
pub mod framing;
pub mod gateway;
pub mod listener;
pub mod local;
pub mod upload;
