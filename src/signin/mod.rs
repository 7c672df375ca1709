//! Claude Code's gateway sign-in (`identity.claude_code`, gateway protocol version 1): the
//! state of the OAuth device flow, tollgate's own access and refresh tokens, and the managed
//! settings and telemetry relay they open. The HTTP side is the gateway's
//! (`edge::gateway::signin`); this floor keeps what every node of a fleet must agree on in
//! the shared store, written once each so that two nodes can never both decide:
//!
//! * the signing key ([`token`]): a row of the job store, made by the first node that needs it;
//! * a user code: the money store's mark `devuser:<code>` (its expiry), made at the device
//!   authorization; the device code is sealed with the signing key and names its user code;
//! * the decision: the mark `devdecide:<code>` (0: denied; else the number of the job-store
//!   row `devok_<code>_<n>` that holds who approved, written before the mark);
//! * the one exchange of an approved device code for tokens: the mark `devused:<code>`;
//! * a refresh token: a row `rt_<sha256>` of who it is for and until when (kept hashed).
//!
//! Whether the person may still call is never in a token: it is their key's state and their
//! teams, checked at every request and every refresh.

pub mod relay;
pub mod settings;
pub mod token;

use crate::config::claude_code::ClaudeCodeConfig;
use crate::identity::Person;
use crate::store::{JobRow, JobStore, MoneyStore, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use token::{Claims, Keys, StoredKey, TokenError};

/// How long a device code and its user code live (seconds).
pub const DEVICE_SECS: u64 = 600;
/// The polling interval the client is given (seconds).
pub const INTERVAL_SECS: u64 = 5;
/// Device authorizations one address may begin per minute.
pub const DEVICES_PER_MINUTE: u32 = 10;
/// The user code's alphabet (RFC 8628 §6.1: base-20, no vowels).
const USER_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";
/// The job store's kinds of what sign-in keeps.
const KIND: &str = "signin";
const SIGNING_KEY_ID: &str = "signin_ed25519_key";

/// Why sign-in could not go on.
#[derive(Debug)]
pub enum SigninError {
    Store(StoreError),
    Key(TokenError),
}

impl std::fmt::Display for SigninError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SigninError::Store(e) => write!(f, "sign-in store: {e}"),
            SigninError::Key(e) => write!(f, "sign-in: {e}"),
        }
    }
}

impl From<StoreError> for SigninError {
    fn from(e: StoreError) -> Self {
        SigninError::Store(e)
    }
}

impl From<TokenError> for SigninError {
    fn from(e: TokenError) -> Self {
        SigninError::Key(e)
    }
}

/// Who signed in, as the provider said at sign-in (and operators added).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Someone {
    pub subject: String,
    pub display: String,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub teams: Vec<String>,
    #[serde(default)]
    pub admin_of: Vec<String>,
    #[serde(default)]
    pub operator: bool,
}

impl Someone {
    pub fn of(p: &Person) -> Someone {
        Someone {
            subject: p.subject.clone(),
            display: p.display.clone(),
            email: p.email.clone(),
            teams: p.teams.clone(),
            admin_of: p.admin_of.clone(),
            operator: p.roles.contains(&crate::identity::Role::Operator),
        }
    }

    pub fn of_claims(c: &Claims) -> Someone {
        Someone {
            subject: c.sub.clone(),
            display: if c.name.is_empty() { c.sub.clone() } else { c.name.clone() },
            email: c.email.clone(),
            teams: c.groups.clone(),
            admin_of: c.admin_of.clone(),
            operator: c.roles.iter().any(|r| r == "operator"),
        }
    }

    /// As a person (roles: operator, else none; team admin comes from `admin_of`).
    pub fn person(&self) -> Person {
        Person {
            subject: self.subject.clone(),
            display: self.display.clone(),
            email: self.email.clone(),
            roles: if self.operator { vec![crate::identity::Role::Operator] } else { Vec::new() },
            teams: self.teams.clone(),
            admin_of: self.admin_of.clone(),
        }
    }
}

/// A new device authorization.
pub struct DeviceGrant {
    pub device_code: String,
    pub user_code: String,
}

/// What a poll of the token endpoint with a device code finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Poll {
    Pending,
    SlowDown,
    Denied,
    /// Unknown, expired or already exchanged.
    Expired,
    Approved(Someone),
}

#[derive(Serialize, Deserialize)]
struct DeviceCode {
    /// The user code.
    u: String,
    /// When it expires (unix s).
    e: u64,
    /// Randomness (the code is opaque and unguessable on its own, RFC 8628 §5.2).
    r: String,
}

#[derive(Serialize, Deserialize)]
struct RefreshRow {
    someone: Someone,
    expires_at: u64,
}

/// The sign-in of one gateway process (state shared through the store).
pub struct Signin {
    pub cfg: arc_swap::ArcSwap<ClaudeCodeConfig>,
    jobs: Arc<dyn JobStore>,
    money: Arc<dyn MoneyStore>,
    keys: tokio::sync::OnceCell<Arc<Keys>>,
    /// The last poll of each user code (this node's), for `slow_down`.
    polls: Mutex<HashMap<String, u64>>,
    /// Device authorizations per address in the current minute (this node's).
    begun: Mutex<(u64, HashMap<IpAddr, u32>)>,
    /// Telemetry exports relayed to the collector.
    pub relay: relay::Relay,
    /// Tokens whose signature was verified here, by their SHA-256: a client's next request with
    /// the same token skips the signature (about half of a small call's CPU, measured). Their
    /// expiry is checked each time; whether the person may still call never comes from here.
    verified: Mutex<Verified>,
}

/// Verified tokens remembered at most (then forgotten all at once).
const MAX_VERIFIED: usize = 16_384;

/// Tokens whose signature held, by their SHA-256, with their claims.
#[derive(Default)]
struct Verified(HashMap<[u8; 32], Arc<Claims>>);

/// What the memory of verified tokens says of one.
#[derive(Debug, PartialEq)]
enum Seen {
    Valid(Arc<Claims>),
    Expired,
    Unknown,
}

impl Verified {
    fn digest(token: &str) -> [u8; 32] {
        <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into()
    }

    fn seen(&self, token: &str, now: u64) -> Seen {
        match self.0.get(&Self::digest(token)) {
            Some(c) if c.exp > now => Seen::Valid(c.clone()),
            Some(_) => Seen::Expired,
            None => Seen::Unknown,
        }
    }

    fn remember(&mut self, token: &str, claims: Arc<Claims>) {
        if self.0.len() >= MAX_VERIFIED {
            self.0.clear();
        }
        self.0.insert(Self::digest(token), claims);
    }
}

/// A user code as typed (any case, spaces, with or without its dash), in its canonical form.
pub fn normalize_user_code(typed: &str) -> Option<String> {
    let letters: String = typed.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_uppercase()).collect();
    (letters.len() == 8 && letters.bytes().all(|b| USER_ALPHABET.contains(&b))).then(|| format!("{}-{}", &letters[..4], &letters[4..]))
}

fn new_user_code() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let mut s: String = (0..8).map(|_| USER_ALPHABET[rng.gen_range(0..USER_ALPHABET.len())] as char).collect();
    s.insert(4, '-');
    s
}

impl Signin {
    pub fn new(cfg: ClaudeCodeConfig, jobs: Arc<dyn JobStore>, money: Arc<dyn MoneyStore>) -> Result<Signin, String> {
        let relay = relay::Relay::new(&cfg)?;
        Ok(Signin {
            cfg: arc_swap::ArcSwap::from_pointee(cfg),
            jobs,
            money,
            keys: tokio::sync::OnceCell::new(),
            polls: Mutex::new(HashMap::new()),
            begun: Mutex::new((0, HashMap::new())),
            relay,
            verified: Mutex::new(Verified::default()),
        })
    }

    /// The signing key: read from the store, or made and written by the first node.
    pub async fn keys(&self) -> Result<Arc<Keys>, SigninError> {
        self.keys
            .get_or_try_init(|| async {
                if let Some(stored) = self.stored_key().await? {
                    return Ok(Arc::new(Keys::from_stored(&stored)?));
                }
                let made = StoredKey::generate()?;
                let row = JobRow {
                    kind: KIND,
                    id: SIGNING_KEY_ID.into(),
                    owner: "tollgate".into(),
                    created_at: crate::base::clock::now_unix(),
                    open: false,
                    record: serde_json::to_string(&made).unwrap_or_default(),
                };
                // Another node may have written one first: its key is the one.
                if let Err(e) = self.jobs.put(&row).await {
                    log::info!("sign-in: the signing key was written by another node ({e})");
                }
                let stored = self.stored_key().await?.ok_or_else(|| TokenError::Key("the signing key could not be stored".into()))?;
                log::info!("sign-in: signing key {} in use", stored.kid);
                Ok(Arc::new(Keys::from_stored(&stored)?))
            })
            .await
            .cloned()
    }

    async fn stored_key(&self) -> Result<Option<StoredKey>, SigninError> {
        match self.jobs.get(SIGNING_KEY_ID).await? {
            None => Ok(None),
            Some(text) => {
                serde_json::from_str(&text).map(Some).map_err(|e| TokenError::Key(format!("the stored key is unreadable: {e}")).into())
            }
        }
    }

    /// Whether `address` may begin another device authorization this minute.
    pub fn may_begin(&self, address: Option<IpAddr>, now: u64) -> bool {
        let Some(ip) = address else { return true };
        let mut begun = self.begun.lock().unwrap_or_else(|p| p.into_inner());
        let minute = now / 60;
        if begun.0 != minute {
            *begun = (minute, HashMap::new());
        }
        let n = begun.1.entry(ip).or_insert(0);
        *n += 1;
        *n <= DEVICES_PER_MINUTE
    }

    /// `POST /oauth/device_authorization`: a new user code, unique while it lives.
    pub async fn authorize(&self, now: u64) -> Result<DeviceGrant, SigninError> {
        let keys = self.keys().await?;
        for _ in 0..8 {
            let user_code = new_user_code();
            if self.money.put_mark(&format!("devuser:{user_code}"), i64::try_from(now + DEVICE_SECS).unwrap_or(i64::MAX)).await? {
                let code = DeviceCode { u: user_code.clone(), e: now + DEVICE_SECS, r: crate::base::secrets::random_base62(22) };
                let device_code = keys.seal_bytes(&serde_json::to_vec(&code).unwrap_or_default());
                return Ok(DeviceGrant { device_code, user_code });
            }
        }
        Err(StoreError::Shared("no free user code after eight tries".into()).into())
    }

    /// Whether `user_code` is waiting for its person (issued, not expired, not decided).
    pub async fn waiting(&self, user_code: &str, now: u64) -> Result<bool, SigninError> {
        let Some(expires) = self.money.mark(&format!("devuser:{user_code}")).await? else { return Ok(false) };
        if u64::try_from(expires).unwrap_or(0) <= now {
            return Ok(false);
        }
        Ok(self.money.mark(&format!("devdecide:{user_code}")).await?.is_none())
    }

    /// The person approved `user_code` (false: it was decided before).
    pub async fn approve(&self, user_code: &str, someone: &Someone, now: u64) -> Result<bool, SigninError> {
        let n: i64 = rand::Rng::gen_range(&mut rand::thread_rng(), 1..i64::MAX);
        let row = JobRow {
            kind: KIND,
            id: format!("devok_{user_code}_{n}"),
            owner: someone.subject.clone(),
            created_at: now,
            open: false,
            record: serde_json::to_string(someone).unwrap_or_default(),
        };
        self.jobs.put(&row).await?;
        Ok(self.money.put_mark(&format!("devdecide:{user_code}"), n).await?)
    }

    /// `user_code` is refused (false: it was decided before).
    pub async fn deny(&self, user_code: &str) -> Result<bool, SigninError> {
        Ok(self.money.put_mark(&format!("devdecide:{user_code}"), 0).await?)
    }

    /// A poll of the token endpoint with `device_code`.
    pub async fn poll(&self, device_code: &str, now: u64) -> Result<Poll, SigninError> {
        let keys = self.keys().await?;
        let Some(code) = keys.open_bytes(device_code).and_then(|b| serde_json::from_slice::<DeviceCode>(&b).ok()) else {
            return Ok(Poll::Expired);
        };
        if code.e <= now {
            return Ok(Poll::Expired);
        }
        {
            let mut polls = self.polls.lock().unwrap_or_else(|p| p.into_inner());
            polls.retain(|_, at| now.saturating_sub(*at) < DEVICE_SECS);
            let last = polls.insert(code.u.clone(), now);
            if last.is_some_and(|at| now.saturating_sub(at) + 1 < INTERVAL_SECS) {
                return Ok(Poll::SlowDown);
            }
        }
        match self.money.mark(&format!("devdecide:{}", code.u)).await? {
            None => Ok(Poll::Pending),
            Some(0) => Ok(Poll::Denied),
            Some(n) => {
                if !self.money.put_mark(&format!("devused:{}", code.u), 1).await? {
                    return Ok(Poll::Expired);
                }
                let row = self.jobs.get(&format!("devok_{}_{n}", code.u)).await?;
                match row.and_then(|r| serde_json::from_str::<Someone>(&r).ok()) {
                    Some(someone) => Ok(Poll::Approved(someone)),
                    None => Ok(Poll::Expired),
                }
            }
        }
    }

    /// A new access token for `someone` and its lifetime (seconds).
    pub async fn access_token(&self, someone: &Someone, now: u64) -> Result<(String, u64), SigninError> {
        let ttl = self.cfg.load().token_ttl_secs;
        let claims = Claims {
            iss: token::ISSUER.into(),
            aud: token::AUDIENCE.into(),
            sub: someone.subject.clone(),
            email: someone.email.clone(),
            name: someone.display.clone(),
            groups: someone.teams.clone(),
            admin_of: someone.admin_of.clone(),
            roles: if someone.operator { vec!["operator".into()] } else { Vec::new() },
            iat: now,
            exp: now + ttl,
            jti: crate::base::secrets::random_base62(16),
        };
        Ok((self.keys().await?.sign(&claims)?, ttl))
    }

    /// A new refresh token for `someone`.
    pub async fn refresh_token(&self, someone: &Someone, now: u64) -> Result<String, SigninError> {
        let token = format!("tgr_{}", crate::base::secrets::random_base62(43));
        let row = RefreshRow { someone: someone.clone(), expires_at: now + self.cfg.load().refresh_ttl_secs };
        self.jobs
            .put(&JobRow {
                kind: KIND,
                id: refresh_id(&token),
                owner: someone.subject.clone(),
                created_at: now,
                open: false,
                record: serde_json::to_string(&row).unwrap_or_default(),
            })
            .await?;
        Ok(token)
    }

    /// Who a refresh token is for, while it lives.
    pub async fn redeem_refresh(&self, token: &str, now: u64) -> Result<Option<Someone>, SigninError> {
        if !token.starts_with("tgr_") || token.len() > 64 {
            return Ok(None);
        }
        let row = self.jobs.get(&refresh_id(token)).await?;
        Ok(row.and_then(|r| serde_json::from_str::<RefreshRow>(&r).ok()).filter(|r| r.expires_at > now).map(|r| r.someone))
    }

    /// The claims of one of this gateway's access tokens (`NotOurs` for anything else).
    pub async fn verify(&self, token: &str, now: u64) -> Result<Arc<Claims>, SigninError> {
        match self.verified.lock().unwrap_or_else(|p| p.into_inner()).seen(token, now) {
            Seen::Valid(claims) => return Ok(claims),
            Seen::Expired => return Err(TokenError::Invalid("expired".into()).into()),
            Seen::Unknown => {}
        }
        let claims = Arc::new(self.keys().await?.verify(token, now)?);
        self.verified.lock().unwrap_or_else(|p| p.into_inner()).remember(token, claims.clone());
        Ok(claims)
    }
}

fn refresh_id(token: &str) -> String {
    let h = crate::access::auth::hash_key(token);
    format!("rt_{}", &crate::access::auth::hex(&h)[..40])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_is_the_exact_one_and_only_until_it_expires() {
        let claims = |exp| {
            Arc::new(Claims {
                iss: String::new(),
                aud: String::new(),
                sub: "ada".into(),
                email: None,
                name: String::new(),
                groups: vec![],
                admin_of: vec![],
                roles: vec![],
                iat: 0,
                exp,
                jti: String::new(),
            })
        };
        let mut v = Verified::default();
        assert_eq!(v.seen("t1", 10), Seen::Unknown);
        v.remember("t1", claims(100));
        assert_eq!(v.seen("t1", 99), Seen::Valid(claims(100)));
        assert_eq!(v.seen("t1", 100), Seen::Expired);
        assert_eq!(v.seen("t1x", 10), Seen::Unknown, "another string is verified afresh");
        for i in 0..MAX_VERIFIED {
            v.remember(&format!("k{i}"), claims(100));
        }
        assert!(v.0.len() <= MAX_VERIFIED, "bounded");
    }

    #[test]
    fn user_codes_are_base20_and_typed_forms_are_normalized() {
        for _ in 0..50 {
            let c = new_user_code();
            assert_eq!(normalize_user_code(&c).as_deref(), Some(c.as_str()));
        }
        assert_eq!(normalize_user_code(" wdjb mjht ").as_deref(), Some("WDJB-MJHT"));
        assert_eq!(normalize_user_code("WDJBMJHT").as_deref(), Some("WDJB-MJHT"));
        assert_eq!(normalize_user_code("WDJB-MJHA"), None, "a vowel is never in a code");
        assert_eq!(normalize_user_code("WDJB-MJH"), None);
    }
}
