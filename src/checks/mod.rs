//! The checks every kind of call goes through, as one ordered list ([`Checks`]). A check is a
//! file here and one line in [`registered`]; it says what it looks at ([`Looks`]) and it runs,
//! in the list's order, wherever a call offers that — a model call, a realtime turn, an MCP
//! tool call, a video task, a batch line ([`Kind`]) — without being placed again for each.
//!
//! Where each kind offers what:
//!
//! | kind | the request's address | its model | its output maximum | its text | its cost |
//! |---|---|---|---|---|---|
//! | every request of a key (stage 1) | ✓ | | | | |
//! | a model call | | ✓ (draft) | ✓ (draft) | ✓ the body (draft) | ✓ its hold (price) |
//! | a realtime turn | | ✓ (the session's) | | ✓ each item, instructions | |
//! | an MCP tool call | | | | ✓ its arguments | |
//! | a video task | | ✓ | | ✓ the request | |
//! | a batch line | | ✓ | ✓ | ✓ the line's body | |
//!
//! A check continues, refuses (the client gets the [`ApiError`] in its protocol's shape, or
//! the realtime `error` event, or the JSON-RPC error) or answers ([`Verdict::Answer`]: a model
//! call is answered with it; a kind that cannot be answered locally is refused instead).

mod address;
mod cost;
pub mod guard;
mod marked;
mod model;
mod output;

use crate::policy::KeyPolicy;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::Value;
use std::net::IpAddr;

/// The kinds of billable call (and every request of a key, before it is routed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    ModelCall,
    RealtimeTurn,
    ToolCall,
    VideoTask,
    BatchLine,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::ModelCall => "model_call",
            Kind::RealtimeTurn => "realtime_turn",
            Kind::ToolCall => "tool_call",
            Kind::VideoTask => "video_task",
            Kind::BatchLine => "batch_line",
        }
    }
}

/// What a check looks at; it runs on a call that offers all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Looks(u8);

impl Looks {
    pub const ADDRESS: Looks = Looks(1);
    pub const MODEL: Looks = Looks(2);
    pub const OUTPUT: Looks = Looks(4);
    pub const TEXT: Looks = Looks(8);
    pub const COST: Looks = Looks(16);

    fn within(self, offered: Looks) -> bool {
        self.0 & offered.0 == self.0
    }
}

impl std::ops::BitOr for Looks {
    type Output = Looks;
    fn bitor(self, other: Looks) -> Looks {
        Looks(self.0 | other.0)
    }
}

/// The text of a call, read only when a check looks at it.
#[derive(Clone, Copy)]
pub enum Text<'a> {
    /// A JSON body: its string values are the text.
    Json(&'a [u8]),
    /// A parsed JSON value: its string values.
    Value(&'a Value),
    Plain(&'a str),
}

impl Text<'_> {
    /// Call `f` with each piece of text until it returns true; whether one did. A body that is
    /// not JSON is read as text whole.
    pub fn any(&self, f: &mut dyn FnMut(&str) -> bool) -> bool {
        fn walk(v: &Value, f: &mut dyn FnMut(&str) -> bool) -> bool {
            match v {
                Value::String(s) => f(s),
                Value::Array(items) => items.iter().any(|v| walk(v, f)),
                Value::Object(map) => map.values().any(|v| walk(v, f)),
                _ => false,
            }
        }
        match self {
            Text::Json(bytes) => match serde_json::from_slice::<Value>(bytes) {
                Ok(v) => walk(&v, f),
                Err(_) => f(&String::from_utf8_lossy(bytes)),
            },
            Text::Value(v) => walk(v, f),
            Text::Plain(s) => f(s),
        }
    }
}

/// One call as the checks see it: what its kind offers at this point.
pub struct Subject<'a> {
    pub kind: Kind,
    pub policy: &'a KeyPolicy,
    /// The model asked for.
    pub model: Option<&'a str>,
    /// The output maximum the call names, and the field that names it.
    pub output: Option<(Option<u64>, &'a str)>,
    pub text: Option<Text<'a>>,
    /// The most it may cost (nano-USD).
    pub cost: Option<i64>,
    /// The client's address (resolved only when a check asks).
    pub address: Option<&'a dyn Fn() -> Result<IpAddr, ApiError>>,
    /// The model rules of the plans the call is under (beside the key's own).
    pub plans: &'a [crate::policy::plan::PlanModels],
}

impl<'a> Subject<'a> {
    /// A call of `kind` under `policy` that offers nothing yet.
    pub fn new(kind: Kind, policy: &'a KeyPolicy) -> Self {
        Subject { kind, policy, model: None, output: None, text: None, cost: None, address: None, plans: &[] }
    }

    pub fn model(mut self, model: &'a str) -> Self {
        self.model = Some(model);
        self
    }

    /// Under the model rules of these plans too.
    pub fn plans(mut self, plans: &'a [crate::policy::plan::PlanModels]) -> Self {
        self.plans = plans;
        self
    }

    pub fn text(mut self, text: Text<'a>) -> Self {
        self.text = Some(text);
        self
    }

    fn offers(&self) -> Looks {
        let mut offered = Looks(0);
        for (has, looks) in [
            (self.address.is_some(), Looks::ADDRESS),
            (self.model.is_some(), Looks::MODEL),
            (self.output.is_some(), Looks::OUTPUT),
            (self.text.is_some(), Looks::TEXT),
            (self.cost.is_some(), Looks::COST),
        ] {
            if has {
                offered = offered | looks;
            }
        }
        offered
    }
}

/// What a check decided.
pub enum Verdict {
    Continue,
    Refuse(ApiError),
    Answer(LocalResponse),
}

/// How a call's checks ended it.
#[derive(Debug)]
pub enum Stop {
    Refuse(ApiError),
    Answer(LocalResponse),
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        Stop::Refuse(e)
    }
}

impl Stop {
    /// For a kind that cannot be answered locally: the refusal, or an answer turned into one.
    pub fn refusal(self) -> ApiError {
        match self {
            Stop::Refuse(e) => e,
            Stop::Answer(r) => {
                log::error!("a check answered a call that cannot be answered here (status {}); refused", r.status);
                ApiError::new(ErrorKind::BadRequest, "This call was refused by the gateway's checks.")
            }
        }
    }
}

/// One check of the list.
pub trait Check: Send + Sync {
    /// Its name, for the log and the refusal.
    fn name(&self) -> &'static str;
    /// What it looks at: it runs on every call that offers all of it.
    fn looks_at(&self) -> Looks;
    fn check(&self, call: &Subject) -> Verdict;
}

/// The registered checks, in the order they run.
pub struct Checks {
    list: Vec<Box<dyn Check>>,
}

/// The list: a new check is a file in this folder and a line here.
fn registered() -> Vec<Box<dyn Check>> {
    let mut list: Vec<Box<dyn Check>> =
        vec![Box::new(address::Address), Box::new(model::ModelRules), Box::new(output::OutputLimit), Box::new(cost::CostCap)];
    list.extend(marked::from_env());
    list
}

impl Default for Checks {
    fn default() -> Self {
        Checks { list: registered() }
    }
}

impl Checks {
    /// The registered list with `extra` after it (tests).
    pub fn with(extra: Vec<Box<dyn Check>>) -> Self {
        let mut list = registered();
        list.extend(extra);
        Checks { list }
    }

    /// Whether a registered check looks at `looks` (a caller may skip gathering what none reads).
    pub fn read(&self, looks: Looks) -> bool {
        self.list.iter().any(|c| c.looks_at().0 & looks.0 != 0)
    }

    /// The checks' names in order, with what each looks at.
    pub fn names(&self) -> Vec<&'static str> {
        self.list.iter().map(|c| c.name()).collect()
    }

    /// Run every check that looks at what `call` offers, in order; the first that does not
    /// continue ends the call.
    pub fn run(&self, call: &Subject) -> Result<(), Stop> {
        let offered = call.offers();
        for check in &self.list {
            if !check.looks_at().within(offered) {
                continue;
            }
            match check.check(call) {
                Verdict::Continue => {}
                Verdict::Refuse(e) => return Err(Stop::Refuse(e)),
                Verdict::Answer(r) => return Err(Stop::Answer(r)),
            }
        }
        Ok(())
    }

    /// [`run`](Self::run) for a kind that is only refused, never answered.
    pub fn vet(&self, call: &Subject) -> Result<(), ApiError> {
        self.run(call).map_err(Stop::refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Shouts;
    impl Check for Shouts {
        fn name(&self) -> &'static str {
            "shouts"
        }
        fn looks_at(&self) -> Looks {
            Looks::TEXT
        }
        fn check(&self, call: &Subject) -> Verdict {
            match call.text.is_some_and(|t| t.any(&mut |s| s.contains("LOUD"))) {
                true => Verdict::Refuse(ApiError::new(ErrorKind::BadRequest, "loud")),
                false => Verdict::Continue,
            }
        }
    }

    #[test]
    fn a_check_runs_where_what_it_looks_at_is_offered_and_stops_the_call() {
        let checks = Checks::with(vec![Box::new(Shouts)]);
        let policy = KeyPolicy::default();
        let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a LOUD one"}]}]}"#;
        for kind in [Kind::ModelCall, Kind::RealtimeTurn, Kind::ToolCall, Kind::BatchLine] {
            let refused = checks.vet(&Subject::new(kind, &policy).text(Text::Json(body))).expect_err("refused");
            assert_eq!(refused.message, "loud", "{kind:?}");
        }
        // Without text offered the check does not run; quiet text passes.
        assert!(checks.vet(&Subject::new(Kind::ModelCall, &policy).model("m")).is_ok());
        assert!(checks.vet(&Subject::new(Kind::ModelCall, &policy).text(Text::Plain("quiet"))).is_ok());
        assert!(checks.vet(&Subject::new(Kind::ModelCall, &policy).text(Text::Json(b"not json LOUD"))).is_err());
    }

    #[test]
    fn the_key_rules_run_in_the_documented_order() {
        let checks = Checks::default();
        assert_eq!(&checks.names()[..4], ["address", "model_rules", "output_limit", "cost_cap"]);
        let policy = KeyPolicy {
            models: Some(crate::policy::ModelRules { allow: None, deny: vec!["m".into()] }),
            max_output_tokens: Some(10),
            ..KeyPolicy::default()
        };
        let both = Subject { output: Some((Some(1000), "max_tokens")), ..Subject::new(Kind::ModelCall, &policy).model("m") };
        assert_eq!(checks.vet(&both).expect_err("refused").kind, ErrorKind::ModelNotAllowed);
        let output = Subject { output: Some((Some(1000), "max_tokens")), ..Subject::new(Kind::ModelCall, &policy).model("n") };
        assert_eq!(checks.vet(&output).expect_err("refused").param.as_deref(), Some("max_tokens"));
    }
}
