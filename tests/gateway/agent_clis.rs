//! The real coding-agent CLIs, headless, through tollgate to `tollgate-mock`: Claude Code
//! (`claude -p`, messages), Codex (`codex exec`, responses) and Gemini CLI (`gemini -p`,
//! generate-content). Each does a plain turn, then a turn in which the mock's streamed answer
//! calls the CLI's own file-reading tool and the CLI sends the tool result back; the mock then
//! answers with that result, so the printed answer holds a nonce only the file had.
//!
//! The CLIs come from npm: tests/run_all.sh installs them (pinned versions) and sets
//! `TOLLGATE_AGENT_CLIS` to their `node_modules/.bin`, and `TOLLGATE_AGENT_CLIS_REQUIRED=1`
//! once the install worked. Without them the tests say so and pass only when not required.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const AGENT_KEY: &str = "sk-agent-test-0001";
/// A key of a translating group (`translate: true`): every model through every protocol.
const BRIDGE_KEY: &str = "sk-agent-bridge-0001";

/// The directory holding `claude`, `codex` and `gemini`, or None (with the reason printed).
fn clis() -> Option<PathBuf> {
    let required = std::env::var("TOLLGATE_AGENT_CLIS_REQUIRED").is_ok_and(|v| v == "1");
    let dir = std::env::var("TOLLGATE_AGENT_CLIS").map(PathBuf::from).ok();
    let found = dir.filter(|d| ["claude", "codex", "gemini"].iter().all(|c| d.join(c).exists()));
    if found.is_none() {
        assert!(!required, "TOLLGATE_AGENT_CLIS_REQUIRED=1 but claude, codex and gemini are not in TOLLGATE_AGENT_CLIS");
        eprintln!("SKIPPED: the agent CLIs are not installed (tests/run_all.sh installs them with npm into a cache directory)");
    }
    found
}

fn config(mock_port: u16) -> String {
    format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-haiku-4-5] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini] }}
  bridge: {{ platforms: [openai, anthropic, gemini], translate: true }}
prices:
  alpha-5.5: {{ input: 1, output: 2 }}
  beta-opus-4-7: {{ input: 1, output: 2 }}
  beta-haiku-4-5: {{ input: 1, output: 2 }}
  gamma-3.5-flash: {{ input: 1, output: 2 }}
keys:
  - {{ key: {AGENT_KEY}, name: agent, group: default, balance: 5.0 }}
  - {{ key: {BRIDGE_KEY}, name: bridge, group: bridge, balance: 5.0 }}
"#
    )
}

/// A CLI's sandbox: a home of its own and a working directory holding `secret.txt`.
struct Workspace {
    dir: tempfile::TempDir,
    nonce: String,
}

impl Workspace {
    fn new() -> Workspace {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        std::fs::create_dir_all(dir.path().join("work")).expect("work");
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let nonce = format!("nonce-{}-{}", std::process::id(), since_epoch.as_nanos());
        std::fs::write(dir.path().join("work/secret.txt"), format!("{nonce}\n")).expect("secret");
        Workspace { dir, nonce }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Codex's home with `config.toml`: `model` from a provider at `base_url` over the responses
    /// API, its key in `TOLLGATE_API_KEY`. Returns the home (`CODEX_HOME`).
    fn codex_config(&self, model: &str, base_url: &str) -> PathBuf {
        let codex_home = self.home().join(".codex");
        std::fs::create_dir_all(&codex_home).expect("codex home");
        std::fs::write(
            codex_home.join("config.toml"),
            format!(
                "model = \"{model}\"\nmodel_provider = \"tollgate\"\n\n[model_providers.tollgate]\nname = \"tollgate\"\nbase_url = \"{base_url}\"\nenv_key = \"TOLLGATE_API_KEY\"\nwire_api = \"responses\"\n"
            ),
        )
        .expect("config.toml");
        codex_home
    }

    /// Gemini CLI's settings in the home: API-key auth, no telemetry, no update checks.
    fn gemini_settings(&self) {
        let settings = self.home().join(".gemini");
        std::fs::create_dir_all(&settings).expect("settings dir");
        std::fs::write(
            settings.join("settings.json"),
            r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false}, "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}"#,
        )
        .expect("settings.json");
    }

    /// The prompt that makes the mock call the CLI's file-reading tool on `secret.txt`.
    fn tool_prompt(&self) -> String {
        format!("What does [[read:{}]] say?", self.work().join("secret.txt").display())
    }
}

/// Run a CLI to completion (at most three minutes); returns its stdout, after checking it
/// exited 0.
fn run(program: &Path, args: &[&str], env: &[(&str, String)], ws: &Workspace) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(ws.work())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", ws.home())
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(180)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("{} {args:?} did not finish within 3 minutes", program.display());
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}", program.display(), out.status);
    stdout
}

/// What the upstream saw: no client key anywhere, every generation streamed; the key was
/// billed once per generation call. Returns the generation calls.
async fn check_upstream_and_bill(mock: &Proc, gw: &Gateway, generation_path: &str, key: &str) -> Vec<Value> {
    let seen = mock_requests_all(mock).await;
    let all = serde_json::to_string(&seen).expect("json");
    assert!(!all.contains(key), "a client key reached the upstream: {all}");
    let generations: Vec<Value> = seen.into_iter().filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with(generation_path))).collect();
    let paths: Vec<&str> = generations.iter().filter_map(|r| r["path"].as_str()).collect();
    assert!(generations.len() >= 3, "a plain turn and the two calls of the tool turn: {paths:?}");
    assert!(generations.iter().all(|r| r["stream"] == true), "every turn was streamed: {generations:?}");
    let usage = wait_requests(gw, key, generations.len() as u64).await;
    assert_eq!(usage["total"]["requests"].as_u64(), Some(generations.len() as u64), "one bill per call: {usage}");
    generations
}

/// Every request the mock recorded (any tag).
async fn mock_requests_all(mock: &Proc) -> Vec<Value> {
    client().get(mock.url("/__mock/requests")).send().await.expect("mock").json().await.expect("json")
}

/// Gemini CLI with `key` on `model`: a plain turn and a read_file-tool turn, streamed; every
/// generation reached `generation_path` and was billed once.
async fn gemini_cli_on(key: &str, model: &str, generation_path: &str) {
    let Some(bin) = clis() else { return };
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let ws = Workspace::new();
    ws.gemini_settings();
    let env =
        [("GOOGLE_GEMINI_BASE_URL", gw.url("")), ("GEMINI_API_KEY", key.to_string()), ("GEMINI_CLI_TRUST_WORKSPACE", "true".to_string())];
    let gemini = bin.join("gemini");
    let plain = run(&gemini, &["-m", model, "-p", "Say hello"], &env, &ws);
    assert!(plain.contains("Hello from the"), "{plain}");
    let tool = run(&gemini, &["-m", model, "-p", &ws.tool_prompt()], &env, &ws);
    assert!(tool.contains("The tool answered") && tool.contains(&ws.nonce), "the read_file tool's result came back: {tool}");
    let calls = check_upstream_and_bill(&mock, &gw, generation_path, key).await;
    assert!(calls.iter().all(|c| c["model"] == model || generation_path.contains(model)), "{calls:?}");
}

#[tokio::test]
async fn gemini_cli_plain_and_tool_turns() {
    gemini_cli_on(AGENT_KEY, "gamma-3.5-flash", "/ge/v1beta/models/gamma-3.5-flash:streamGenerateContent").await;
}

/// Claude Code with `key` on `model` (`haiku` for its small tasks): a plain turn and a Read-tool
/// turn, streamed; every generation reached `generation_path` and was billed once.
async fn claude_code_on(key: &str, model: &str, haiku: &str, generation_path: &str) {
    let Some(bin) = clis() else { return };
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let expected = if generation_path.contains(model) { vec![] } else { vec![model, haiku] };
    claude_code_through(&bin, &mock, &gw, key, [model, haiku], generation_path, &expected).await;
}

/// Claude Code through `gw` (see [`claude_code_on`]); the mock records each generation's model
/// as one of `upstream_models` (none: the model is in the path, not the body).
async fn claude_code_through(
    bin: &Path,
    mock: &Proc,
    gw: &Gateway,
    key: &str,
    [model, haiku]: [&str; 2],
    generation_path: &str,
    upstream_models: &[&str],
) {
    let ws = Workspace::new();
    let env = [
        ("ANTHROPIC_BASE_URL", gw.url("")),
        ("ANTHROPIC_AUTH_TOKEN", key.to_string()),
        ("ANTHROPIC_MODEL", model.to_string()),
        ("ANTHROPIC_DEFAULT_HAIKU_MODEL", haiku.to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
        ("DISABLE_AUTOUPDATER", "1".to_string()),
    ];
    let claude = bin.join("claude");
    let plain = run(&claude, &["-p", "Say hello", "--model", model], &env, &ws);
    assert!(plain.contains("Hello from the"), "{plain}");
    let tool = run(&claude, &["-p", &ws.tool_prompt(), "--allowedTools", "Read", "--model", model], &env, &ws);
    assert!(tool.contains("The tool answered") && tool.contains(&ws.nonce), "the Read tool's result came back: {tool}");
    let calls = check_upstream_and_bill(mock, gw, generation_path, key).await;
    let served_here = |c: &Value| upstream_models.is_empty() || upstream_models.iter().any(|m| c["model"] == *m);
    assert!(calls.iter().all(served_here), "{:?}", calls.iter().map(|c| &c["model"]).collect::<Vec<_>>());
}

/// Claude Code on a Bedrock provider (SigV4, event stream) and on a Vertex AI provider
/// (service-account token, `streamRawPredict`), its models under their cloud names.
#[tokio::test]
async fn claude_code_on_bedrock_and_vertex() {
    let Some(bin) = clis() else { return };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo");
    let public = root.join("vertex-sa.pub.pem").display().to_string();
    let mock = start_mock_with(&["--key", UPSTREAM_KEY, "--google-public-key", &public]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sa: Value = serde_json::from_slice(&std::fs::read(root.join("vertex-sa.json")).expect("fixture")).expect("json");
    sa["token_uri"] = Value::String(mock.url("/token"));
    let sa_path = dir.path().join("sa.json");
    std::fs::write(&sa_path, sa.to_string()).expect("write");
    let clouds = format!(
        "  - {{ name: br, protocol: bedrock, region: us-east-1, endpoint_url: \"{}\", aws: {{ access_key_id_env: CC_AWS_ID, secret_access_key_env: CC_AWS_SECRET }},\n      models: [{{ name: beta-bedrock-4-6, upstream: \"anthropic.claude-sonnet-4-6-v1:0\" }}] }}\n  - {{ name: vx, protocol: vertex, project: proj-cc, location: us-east5, credentials_file: \"{}\", base_url: \"{}\",\n      models: [{{ name: beta-vertex-4-7, upstream: \"claude-opus-4-7@20260101\" }}] }}\n",
        mock.url("/br"),
        sa_path.display(),
        mock.url("/vx")
    );
    let body = config(mock.port)
        .replace("providers:\n", &format!("providers:\n{clouds}"))
        .replace("prices:\n", "prices:\n  beta-bedrock-4-6: { input: 1, output: 2 }\n  beta-vertex-4-7: { input: 1, output: 2 }\n");
    let gw = start_gateway_env(&body, &[("CC_AWS_ID", "AKIDMOCKTOLLGATE"), ("CC_AWS_SECRET", "mock-aws-secret-access-key")]);
    let bedrock_path = "/br/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream";
    let sonnet = ["anthropic.claude-sonnet-4-6-v1:0"];
    claude_code_through(&bin, &mock, &gw, AGENT_KEY, ["beta-bedrock-4-6", "beta-bedrock-4-6"], bedrock_path, &sonnet).await;
    let gw = start_gateway_env(&body, &[("CC_AWS_ID", "AKIDMOCKTOLLGATE"), ("CC_AWS_SECRET", "mock-aws-secret-access-key")]);
    let vertex_path = "/vx/v1/projects/proj-cc/locations/us-east5/publishers/anthropic/models/claude-opus-4-7@20260101:streamRawPredict";
    let opus = ["claude-opus-4-7@20260101"];
    claude_code_through(&bin, &mock, &gw, AGENT_KEY, ["beta-vertex-4-7", "beta-vertex-4-7"], vertex_path, &opus).await;
}

#[tokio::test]
async fn claude_code_plain_and_tool_turns() {
    claude_code_on(AGENT_KEY, "beta-opus-4-7", "beta-haiku-4-5", "/an/v1/messages").await;
}

#[tokio::test]
async fn claude_code_on_a_chat_completions_model() {
    claude_code_on(BRIDGE_KEY, "alpha-5.5", "alpha-5.5", "/oa/v1/chat/completions").await;
}

#[tokio::test]
async fn claude_code_on_a_generate_content_model() {
    claude_code_on(BRIDGE_KEY, "gamma-3.5-flash", "gamma-3.5-flash", "/ge/v1beta/models/gamma-3.5-flash:streamGenerateContent").await;
}

#[tokio::test]
async fn gemini_cli_on_a_chat_completions_model() {
    gemini_cli_on(BRIDGE_KEY, "alpha-5.5", "/oa/v1/chat/completions").await;
}

/// Codex with `key` on `model` over the responses API: a plain turn and a shell-tool turn,
/// streamed; every generation reached `generation_path` (as the provider's protocol) and was
/// billed once.
async fn codex_on(key: &str, model: &str, generation_path: &str) {
    let Some(bin) = clis() else { return };
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let ws = Workspace::new();
    let codex_home = ws.codex_config(model, &gw.url("/v1"));
    let env = [("CODEX_HOME", codex_home.display().to_string()), ("TOLLGATE_API_KEY", key.to_string())];
    let codex = bin.join("codex");
    let plain = run(&codex, &["exec", "--skip-git-repo-check", "Say hello"], &env, &ws);
    assert!(plain.contains("Hello from the"), "{plain}");
    // The shell tool runs `cat`; the sandbox is not what this test is about (and needs
    // namespaces a CI container may not give).
    let args = ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", &ws.tool_prompt()];
    let tool = run(&codex, &args, &env, &ws);
    assert!(tool.contains("The tool answered") && tool.contains(&ws.nonce), "the shell tool's result came back: {tool}");
    let calls = check_upstream_and_bill(&mock, &gw, generation_path, key).await;
    assert!(calls.iter().all(|c| c["model"] == model), "{calls:?}");
}

#[tokio::test]
async fn codex_plain_and_tool_turns() {
    codex_on(AGENT_KEY, "alpha-5.5", "/oa/v1/responses").await;
}

#[tokio::test]
async fn codex_on_a_messages_model() {
    codex_on(BRIDGE_KEY, "beta-opus-4-7", "/an/v1/messages").await;
}
