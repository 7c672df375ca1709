//! Selling access: what lets a customer pay and an operator sell, on the notify floor (above
//! the charge floor, whose marked top-ups make each credit once whatever the nodes).
//!
//! * [`codes`]: redemption codes, made by batch and redeemed once into a key's account.

pub mod codes;

/// What the gateway, the admin API and the console sell with.
pub struct Selling {
    pub codes: codes::Codes,
}
