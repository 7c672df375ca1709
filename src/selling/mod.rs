//! Selling access: what lets a customer pay and an operator sell, on the notify floor (above
//! the charge floor, whose marked top-ups make each credit once whatever the nodes).
//!
//! * [`codes`]: redemption codes, made by batch and redeemed once into a key's account.
//! * [`stripe`]: card top-ups through Stripe Checkout, credited by its signed webhook once.
//! * [`signup`]: open sign-up, an account of their own for people who sign in with no team.
//! * [`feed`]: prices that follow a published table (LiteLLM's, OpenRouter's).
//! * [`statement`]: an account's month, line by line, to the nano-dollar.

pub mod codes;
pub mod feed;
pub mod signup;
pub mod statement;
pub mod stripe;

/// What the gateway, the admin API and the console sell with.
pub struct Selling {
    pub codes: codes::Codes,
    /// `payments.stripe` (None: no card top-ups).
    pub stripe: Option<stripe::Stripe>,
    /// Accounts for people who sign up (`identity.signup`, read from the routing in force).
    pub signup: signup::Signup,
    /// Prices from a feed (`price_feed`).
    pub feed: Option<std::sync::Arc<feed::PriceFeed>>,
    /// Accounts' monthly statements.
    pub statements: statement::Statements,
}
