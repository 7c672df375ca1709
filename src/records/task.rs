//! The video task and its state machine (the video API's states and transitions). Pure: events in, a new task out.
//!
//! submitting → queued (WAIT) → in_progress (RUN) → completed (DONE) | failed (FAIL or any
//! unrecoverable error). Terminal states absorb every later event; progress never decreases;
//! `completed_at` is set once.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Stored, upstream not yet confirmed. Shown to clients as `queued`.
    Submitting,
    Queued,
    InProgress,
    Completed,
    Failed,
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed)
    }

    /// The name clients see.
    pub fn public(self) -> &'static str {
        match self {
            Status::Submitting | Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskError {
    pub code: String,
    pub message: String,
}

impl TaskError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        TaskError { code: code.to_string(), message: message.into() }
    }
}

/// A task as stored. `owner`, `job_id`, `action` and the upstream model stay internal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    /// Key id of the creator.
    pub owner: String,
    pub api_model: String,
    pub upstream_model: String,
    pub capability: Capability,
    pub duration: u32,
    pub off_peak: bool,
    pub status: Status,
    pub progress: u8,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    pub updated_at: u64,
    /// Last time the upstream was asked about this task.
    pub last_polled_at: u64,
    pub job_id: Option<String>,
    /// The result URL clients get.
    pub url: Option<String>,
    pub error: Option<TaskError>,
    /// Price charged at submission (nano-USD).
    pub cost_nanos: i64,
    /// The price was debited.
    #[serde(default)]
    pub charged: bool,
    /// The price was given back (the task failed).
    #[serde(default)]
    pub refunded: bool,
    /// The purses charged besides the owner's balance (its account, spend windows): a refund
    /// credits the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub charged_to: Vec<String>,
    /// SHA-256 of the submitted body (its JSON, re-encoded), kept with an `Idempotency-Key`'s
    /// task: the key sent again with another body is refused (422), not answered with this task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_digest: Option<String>,
    /// The price multiplier its owner paid at submission (its refund gives back at the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_multiplier: Option<crate::base::money::Multiplier>,
    /// The owner's tags at submission, copied onto its charge and refund records.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// Object-storage key of the copied result, once copied.
    #[serde(default)]
    pub storage_key: Option<String>,
    /// The upstream's result URL (valid 24 hours after completion).
    #[serde(default)]
    pub upstream_url: Option<String>,
    /// The copy to object storage failed and is retried in the background.
    #[serde(default)]
    pub copy_pending: bool,
    #[serde(default)]
    pub copy_attempts: u32,
    #[serde(default)]
    pub next_copy_at: u64,
    /// Uploaded base64 inputs, deleted once the task ends.
    #[serde(default)]
    pub temp_objects: Vec<String>,
}

impl Task {
    /// A task not yet submitted, of no model and no duration yet: `video::request`'s
    /// `Submission::task` fills them in from what it validated.
    pub fn new(id: String, owner: String, capability: Capability, now: u64, cost_nanos: i64) -> Task {
        Task {
            id,
            owner,
            api_model: String::new(),
            upstream_model: String::new(),
            capability,
            duration: 0,
            off_peak: false,
            status: Status::Submitting,
            progress: 0,
            created_at: now,
            completed_at: None,
            updated_at: now,
            last_polled_at: now,
            job_id: None,
            url: None,
            error: None,
            cost_nanos,
            charged: false,
            refunded: false,
            charged_to: Vec::new(),
            request_digest: None,
            price_multiplier: None,
            tags: Default::default(),
            storage_key: None,
            upstream_url: None,
            copy_pending: false,
            copy_attempts: 0,
            next_copy_at: 0,
            temp_objects: Vec::new(),
        }
    }
}

/// What the upstream says of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamStatus {
    Wait,
    Run,
    Done,
    Fail,
}

impl UpstreamStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "WAIT" => Some(UpstreamStatus::Wait),
            "RUN" => Some(UpstreamStatus::Run),
            "DONE" => Some(UpstreamStatus::Done),
            "FAIL" => Some(UpstreamStatus::Fail),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The upstream accepted the job.
    Submitted { job_id: String },
    /// A describe answered.
    Upstream { status: UpstreamStatus, progress: Option<u8>, url: Option<String>, error: Option<TaskError> },
    /// Anything unrecoverable (submission refused, crash before submission, polled too long).
    Fail(TaskError),
}

impl Task {
    /// The task after `event` at time `now`.
    pub fn apply(&self, event: Event, now: u64) -> Task {
        let mut next = self.clone();
        if self.status.is_terminal() {
            return next;
        }
        match event {
            Event::Submitted { job_id } => {
                if self.status == Status::Submitting {
                    next.status = Status::Queued;
                    next.job_id = Some(job_id);
                }
            }
            Event::Fail(error) => {
                next.status = Status::Failed;
                next.error = Some(error);
            }
            Event::Upstream { status, progress, url, error } => {
                if self.status == Status::Submitting {
                    return next;
                }
                match status {
                    UpstreamStatus::Wait => {}
                    UpstreamStatus::Run => {
                        next.status = Status::InProgress;
                        next.progress = self.progress.max(progress.unwrap_or(0).min(99));
                    }
                    UpstreamStatus::Done => match url {
                        Some(url) if !url.is_empty() => {
                            next.status = Status::Completed;
                            next.progress = 100;
                            next.completed_at = Some(self.completed_at.unwrap_or(now));
                            next.upstream_url = Some(url.clone());
                            next.url = Some(url);
                        }
                        _ => {
                            next.status = Status::Failed;
                            next.error = Some(TaskError::new("missing_result", "The video service reported success without a result URL."));
                        }
                    },
                    UpstreamStatus::Fail => {
                        next.status = Status::Failed;
                        next.error = Some(
                            error.unwrap_or_else(|| TaskError::new("generation_failed", "The video service reported the task as failed.")),
                        );
                    }
                }
            }
        }
        if next != *self {
            next.updated_at = now;
        }
        next
    }

    /// The task object (the video API's task object); `created` adds `task_id`, `legacy` adds `result_url`.
    pub fn to_json(&self, created: bool, legacy: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "video",
            "model": self.api_model,
            "status": self.status.public(),
            "progress": self.progress,
            "created_at": self.created_at,
            "seconds": self.duration,
        });
        if created {
            v["task_id"] = json!(self.id);
        }
        if self.status == Status::Completed {
            v["completed_at"] = json!(self.completed_at);
            v["metadata"] = json!({"url": self.url});
            if legacy {
                v["result_url"] = json!(self.url);
            }
        }
        if let Some(e) = &self.error {
            v["error"] = json!({"code": e.code, "message": e.message});
        }
        v
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Capability {
    TextToVideo,
    ImageToVideo,
    ReferenceToVideo,
}

impl Capability {
    /// The part of the action name: `Submit<this><brand>Job`.
    pub fn action_part(self) -> &'static str {
        match self {
            Capability::TextToVideo => "TextToVideo",
            Capability::ImageToVideo => "ImageToVideo",
            Capability::ReferenceToVideo => "ReferenceToVideo",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Capability::TextToVideo => "text-to-video",
            Capability::ImageToVideo => "image-to-video",
            Capability::ReferenceToVideo => "reference-to-video",
        }
    }
}

/// How long an Idempotency-Key keeps returning the same task.
pub const IDEMPOTENCY_WINDOW_SECS: u64 = 24 * 3600;

/// An idempotency key as `store copy` moves it: (key id, idempotency key, task id, unix time).
pub type IdempotencyRow = (String, String, String, u64);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn task() -> Task {
        let mut t = Task {
            api_model: "genq3-pro".into(),
            upstream_model: "genq3-pro".into(),
            duration: 5,
            ..Task::new("task_x".into(), "key_a".into(), Capability::TextToVideo, 100, 0)
        };
        t.last_polled_at = 0;
        t
    }

    fn up(status: UpstreamStatus, progress: Option<u8>, url: Option<&str>) -> Event {
        Event::Upstream { status, progress, url: url.map(str::to_string), error: None }
    }

    #[test]
    fn happy_path() {
        let t = task();
        assert_eq!(t.status.public(), "queued");
        let t = t.apply(Event::Submitted { job_id: "j1".into() }, 101);
        assert_eq!((t.status, t.progress, t.job_id.as_deref()), (Status::Queued, 0, Some("j1")));
        let t = t.apply(up(UpstreamStatus::Wait, None, None), 102);
        assert_eq!(t.status, Status::Queued);
        let t = t.apply(up(UpstreamStatus::Run, Some(40), None), 103);
        assert_eq!((t.status, t.progress), (Status::InProgress, 40));
        let t = t.apply(up(UpstreamStatus::Done, None, Some("https://cdn/v.mp4")), 104);
        assert_eq!((t.status, t.progress, t.completed_at), (Status::Completed, 100, Some(104)));
        let v = t.to_json(false, true);
        assert_eq!(v["metadata"]["url"], "https://cdn/v.mp4");
        assert_eq!(v["result_url"], "https://cdn/v.mp4");
        assert_eq!(v["status"], "completed");
        assert!(v.get("task_id").is_none());
    }

    #[test]
    fn progress_never_decreases_and_wait_after_run_keeps_running() {
        let t = task().apply(Event::Submitted { job_id: "j".into() }, 1);
        let t = t.apply(up(UpstreamStatus::Run, Some(60), None), 2);
        let t = t.apply(up(UpstreamStatus::Run, Some(30), None), 3);
        assert_eq!(t.progress, 60);
        let t = t.apply(up(UpstreamStatus::Wait, None, None), 4);
        assert_eq!((t.status, t.progress), (Status::InProgress, 60));
        let t = t.apply(up(UpstreamStatus::Run, Some(100), None), 5);
        assert_eq!(t.progress, 99, "only completion reaches 100");
    }

    #[test]
    fn terminal_states_absorb_and_completed_at_is_set_once() {
        let done = task().apply(Event::Submitted { job_id: "j".into() }, 1).apply(up(UpstreamStatus::Done, None, Some("u")), 7);
        let again = done.apply(up(UpstreamStatus::Done, None, Some("other")), 9);
        assert_eq!(again, done);
        let failed_after = done.apply(Event::Fail(TaskError::new("x", "y")), 10);
        assert_eq!(failed_after, done);
        let failed = task().apply(Event::Fail(TaskError::new("interrupted", "crash")), 3);
        assert_eq!(failed.status, Status::Failed);
        assert_eq!(failed.apply(Event::Submitted { job_id: "j".into() }, 4), failed);
    }

    #[test]
    fn fail_paths_carry_an_error() {
        let t = task().apply(Event::Submitted { job_id: "j".into() }, 1);
        let f = t.apply(
            Event::Upstream {
                status: UpstreamStatus::Fail,
                progress: None,
                url: None,
                error: Some(TaskError::new("FailedOperation.Moderation", "content rejected")),
            },
            2,
        );
        assert_eq!(f.status, Status::Failed);
        let v = f.to_json(false, false);
        assert_eq!(v["error"]["code"], "FailedOperation.Moderation");
        assert_eq!(v["status"], "failed");
        assert!(v.get("metadata").is_none());
        let f = t.apply(up(UpstreamStatus::Fail, None, None), 2);
        assert_eq!(f.error.as_ref().map(|e| e.code.as_str()), Some("generation_failed"));
        let f = t.apply(up(UpstreamStatus::Done, None, None), 2);
        assert_eq!(f.error.as_ref().map(|e| e.code.as_str()), Some("missing_result"));
    }

    #[test]
    fn upstream_events_before_submission_are_ignored() {
        let t = task();
        assert_eq!(t.apply(up(UpstreamStatus::Run, Some(5), None), 2), t);
    }

    #[test]
    fn internal_fields_stay_internal() {
        let t = task().apply(Event::Submitted { job_id: "secret-job".into() }, 1);
        let s = t.to_json(true, true).to_string();
        assert!(!s.contains("secret-job") && !s.contains("key_a"), "{s}");
        assert_eq!(t.to_json(true, false)["task_id"], "task_x");
    }
}
