//! Test harness: starts the real `tollgate` and `tollgate-mock` binaries as child processes
//! on free loopback ports and kills them on drop.
#![allow(dead_code)]

pub mod postgres;

/// The mock video service's bytes: the mock binary's own file, so a test expects what it serves.
#[path = "../../src/bin/tollgate_mock/video_bytes.rs"]
pub mod mock_video;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const UPSTREAM_KEY: &str = "mock-upstream-key-7f3a";
pub const CLIENT_KEY: &str = "sk-client-test-0001";
pub const CHAT_KEY: &str = "sk-client-chat-0001";
pub const DISABLED_KEY: &str = "sk-client-off-0001";

/// A loopback port nothing listens on, never one this test process handed out before: the
/// tests of one binary run at once, each starting gateways and mocks on ports it picked, and the
/// kernel may offer a port again once the picking socket is closed (a TLS test once reached
/// another test's plain listener that way).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Wait until something accepts connections on `port`, or panic after 20 s.
pub fn wait_listening(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on {port}");
}

pub struct Proc {
    pub child: Child,
    pub port: u16,
}

impl Proc {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_mock() -> Proc {
    start_mock_with_keys(UPSTREAM_KEY)
}

/// A mock accepting any of `keys` (comma-separated).
pub fn start_mock_with_keys(keys: &str) -> Proc {
    start_mock_with(&["--key", keys])
}

/// A mock started with `args` (after `--listen`).
pub fn start_mock_with(args: &[&str]) -> Proc {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-mock"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tollgate-mock");
    wait_listening(port, &mut child, "tollgate-mock");
    Proc { child, port }
}

/// A running gateway plus the temporary directory holding its config and database.
pub struct Gateway {
    pub proc: Proc,
    pub dir: tempfile::TempDir,
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        self.proc.url(path)
    }
}

/// USD per 1M tokens (input, output) of every model the test configs serve.
pub const PRICES: &[(&str, f64, f64)] = &[
    ("alpha-5.5", 2.0, 8.0),
    ("alpha-5.4", 1.0, 4.0),
    ("alpha-4o-mini", 0.15, 0.6),
    ("alpha-big", 1.0, 1.0),
    ("alpha-embed-3", 0.1, 0.0),
    ("beta-opus-4-7", 3.0, 15.0),
    ("beta-sonnet-4-6", 3.0, 15.0),
    ("gamma-3.5-flash", 0.5, 1.5),
];

/// `(input, output)` USD per 1M tokens of a test model.
pub fn price(model: &str) -> (f64, f64) {
    PRICES.iter().find(|(m, _, _)| *m == model).map(|(_, i, o)| (*i, *o)).unwrap_or((0.0, 0.0))
}

/// Exact cost in nano-USD, as the ledger computes it (per-token rate × tokens, rounded).
pub fn cost_nanos(model: &str, input: u64, output: u64) -> i64 {
    let (i, o) = price(model);
    let part = |tokens: u64, usd_per_m: f64| ((tokens as i128 * (usd_per_m * 1e9).round() as i128 + 500_000) / 1_000_000) as i64;
    part(input, i) + part(output, o)
}

/// The `prices:` section for [`PRICES`].
pub fn prices_section() -> String {
    let rows: String = PRICES.iter().map(|(m, i, o)| format!("  {m}: {{ input: {i}, output: {o} }}\n")).collect();
    format!("prices:\n{rows}")
}

/// The standard test config body (without `listen`/`data_dir`) against a mock on `mock_port`:
/// providers `oa` (prefix /oa), `an` (/an), `ge` (/ge); groups default and chat; three keys.
pub fn standard_config(mock_port: u16) -> String {
    format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/oa", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5, alpha-4o-mini, alpha-embed-3] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY},
      models: [beta-opus-4-7, beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}/ge", api_key: {UPSTREAM_KEY},
      models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini, video] }}
  chat: {{ platforms: [openai] }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
  - {{ key: {CHAT_KEY}, name: chatter, group: chat, balance: 5.0 }}
  - {{ key: {DISABLED_KEY}, name: off, group: default, balance: 5.0, enabled: false }}
"#,
        prices = prices_section()
    )
}

/// Write `body` (plus listen/data_dir/pingora settings) as a config file in a new temp dir.
pub fn write_config(body: &str) -> (tempfile::TempDir, PathBuf, u16) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let path = dir.path().join("tollgate.yaml");
    let mut f = std::fs::File::create(&path).expect("config file");
    write!(
        f,
        "listen: 127.0.0.1:{port}\ndata_dir: {}\npingora: {{ threads: 2, pid_file: {}, upgrade_sock: {} }}\n{}{body}",
        dir.path().join("data").display(),
        dir.path().join("tollgate.pid").display(),
        dir.path().join("upgrade.sock").display(),
        // The mock is steered by these request headers; tollgate relays only allowlisted ones.
        if body.contains("forward_headers:") { "" } else { "forward_headers: [\"x-mock-*\", x-test-tag]\n" },
    )
    .expect("write config");
    (dir, path, port)
}

fn spawn_gateway(path: &std::path::Path, port: u16) -> Proc {
    spawn_gateway_env(path, port, &[])
}

/// Like `start_gateway_logged`, with `env` added to the daemon's environment (the variables
/// its config names for credentials).
pub fn start_gateway_env(body: &str, env: &[(&str, &str)]) -> Gateway {
    let (dir, path, port) = write_config(body);
    std::fs::File::create(dir.path().join("tollgate.log")).expect("log file");
    let proc = spawn_gateway_env(&path, port, env);
    Gateway { proc, dir }
}

fn spawn_gateway_env(path: &std::path::Path, port: u16, env: &[(&str, &str)]) -> Proc {
    // When a tollgate.log file exists next to the config, the log (RUST_LOG=info) goes there.
    let log = path.with_file_name("tollgate.log");
    let (level, stderr) = if log.exists() {
        let file = std::fs::OpenOptions::new().append(true).open(&log).expect("log file");
        (std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "info".into()), Stdio::from(file))
    } else {
        ("warn".to_string(), Stdio::inherit())
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("-c")
        .arg(path)
        .env("RUST_LOG", level)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn tollgate");
    wait_listening(port, &mut child, "tollgate");
    Proc { child, port }
}

pub fn start_gateway(body: &str) -> Gateway {
    let (dir, path, port) = write_config(body);
    start_written(dir, &path, port)
}

/// Start a gateway on a config [`write_config`] wrote (after preparing its data directory).
pub fn start_written(dir: tempfile::TempDir, path: &std::path::Path, port: u16) -> Gateway {
    let proc = spawn_gateway(path, port);
    Gateway { proc, dir }
}

/// Like `start_gateway`, with `RUST_LOG=info` written to `tollgate.log` in the gateway's dir.
pub fn start_gateway_logged(body: &str) -> Gateway {
    let (dir, path, port) = write_config(body);
    std::fs::File::create(dir.path().join("tollgate.log")).expect("log file");
    let proc = spawn_gateway(&path, port);
    Gateway { proc, dir }
}

impl Gateway {
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tollgate.log")).unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("tollgate.yaml")
    }

    /// Send a signal to the daemon.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([&format!("-{sig}"), &self.proc.child.id().to_string()]).status().expect("kill");
        assert!(ok.success());
    }

    /// SIGKILL the daemon (no shutdown path runs), as a crash or power loss would.
    pub fn kill_hard(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
    }

    /// Start the daemon again on the same config, data directory and port.
    pub fn start_again(&mut self) {
        let path = self.dir.path().join("tollgate.yaml");
        self.proc = spawn_gateway(&path, self.proc.port);
    }

    /// Start the daemon again on the same config, data directory and port, with `env`.
    pub fn start_again_env(&mut self, env: &[(&str, &str)]) {
        let path = self.dir.path().join("tollgate.yaml");
        self.proc = spawn_gateway_env(&path, self.proc.port, env);
    }
}

/// A `video:` section against the mock's video service on `mock_port`.
pub fn video_section(mock_port: u16) -> String {
    format!(
        r#"
video:
  upstream: {{ base_url: "http://127.0.0.1:{mock_port}", secret_id: mock-tc-secret-id, secret_key: mock-tc-secret-key,
              region: ap-guangzhou, version: "2024-05-23", brand: Gen, rate_per_sec: 100 }}
  poll_interval_secs: 1
  prices: {{ genq3-pro: 0.05, genq2: 0.02, genq3-turbo: 0, genq3-pro-fast: 0, genq2-pro: 0, genq2-turbo: 0, genq2-pro-fast: 0 }}
"#
    )
}

/// Run `tollgate` with `args` to completion; returns (exit code, stderr+stdout).
pub fn run_tollgate(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run tollgate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    (out.status.code().unwrap_or(-1), text)
}

/// The S3-compatible server the storage tests run against (moto's server, installed into
/// `.venv` by tests/run_all.sh; or the command in TOLLGATE_S3_SERVER).
pub fn s3_server_command() -> PathBuf {
    if let Ok(cmd) = std::env::var("TOLLGATE_S3_SERVER") {
        return PathBuf::from(cmd);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    assert!(
        venv.exists(),
        "no S3-compatible server: run `bash tests/run_all.sh` once (it installs moto[server] into .venv), or set TOLLGATE_S3_SERVER"
    );
    venv
}

/// Start a real S3-compatible server on `port`.
pub fn start_s3_on(port: u16) -> Proc {
    let mut child = Command::new(s3_server_command())
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the S3 server");
    wait_listening(port, &mut child, "S3 server");
    Proc { child, port }
}

/// A `storage:` section for an S3 server on `port`.
pub fn storage_section(port: u16) -> String {
    format!(
        "storage:\n  s3: {{ endpoint: \"http://127.0.0.1:{port}\", region: us-east-1, bucket: tollgate-test, access_key: testing, secret_key: testing, url_ttl_secs: 3600 }}\n"
    )
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client")
}

/// The requests the mock received with this `x-test-tag`.
/// The smallest chat completion (`alpha-5.5`, no messages) with `key` as a bearer token.
pub async fn post_chat(gw: &Gateway, key: &str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&serde_json::json!({"model": "alpha-5.5", "messages": []}))
        .send()
        .await
        .expect("chat request")
}

/// Poll a video task as the calling key until `done(task)` holds; fails on a task that failed
/// unless that is what `done` waits for, or after 60 s.
pub async fn poll_task(gw: &Gateway, key: &str, id: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let v: serde_json::Value =
            client().get(gw.url(&format!("/v1/videos/{id}"))).bearer_auth(key).send().await.expect("get").json().await.expect("json");
        if done(&v) {
            return v;
        }
        assert!(v["status"] != "failed", "{v}");
        assert!(std::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

pub async fn mock_requests(mock: &Proc, tag: &str) -> Vec<serde_json::Value> {
    client().get(mock.url(&format!("/__mock/requests?tag={tag}"))).send().await.expect("mock requests").json().await.expect("json")
}

/// The admin listener's `/metrics` text.
/// An admin API call with `token`: its status and JSON body (null when it has none).
pub async fn admin_call(
    port: u16,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut r = client().request(method, format!("http://127.0.0.1:{port}{path}")).bearer_auth(token);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("admin");
    (resp.status().as_u16(), resp.json().await.unwrap_or(serde_json::Value::Null))
}

pub async fn admin_metrics(admin_port: u16, token: &str) -> String {
    client()
        .get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of one metric line (name with its labels) in Prometheus text, 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}

/// `GET /v1/usage` for a key.
pub async fn usage(gw: &Gateway, key: &str) -> serde_json::Value {
    client().get(gw.url("/v1/usage")).bearer_auth(key).send().await.expect("usage").json().await.expect("json")
}

/// USD (a JSON number) in nano-USD.
pub fn nanos(usd: &serde_json::Value) -> i64 {
    (usd.as_f64().expect("number") * 1e9).round() as i64
}

/// The key's balance in nano-USD.
pub async fn balance(gw: &Gateway, key: &str) -> i64 {
    nanos(&usage(gw, key).await["balance"])
}

/// Wait until the key's usage shows `n` requests (settlement happens after the response).
pub async fn wait_requests(gw: &Gateway, key: &str, n: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let u = usage(gw, key).await;
        if u["total"]["requests"].as_u64() == Some(n) {
            return u;
        }
        assert!(Instant::now() < deadline, "expected {n} requests: {u}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The unit's `ExecReload` command line (systemd/tollgate.service), with the installed paths
/// replaced by this build's binary, the repository's reload script and `gw`'s files, and
/// `$MAINPID` by `gw`'s process id.
pub fn reload_command(gw: &Gateway) -> Command {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tollgate.service")).expect("unit");
    let line = unit.lines().find_map(|l| l.strip_prefix("ExecReload=")).expect("ExecReload");
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| match w {
            "/usr/local/lib/tollgate/tollgate-reload" => concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tollgate-reload").to_string(),
            "/usr/local/bin/tollgate" => env!("CARGO_BIN_EXE_tollgate").to_string(),
            "/etc/tollgate/tollgate.yaml" => gw.config_path().display().to_string(),
            "/run/tollgate/upgrade.sock" => gw.dir.path().join("upgrade.sock").display().to_string(),
            "$MAINPID" | "${MAINPID}" => gw.proc.child.id().to_string(),
            other => panic!("ExecReload has a word this test does not know how to map: {other}"),
        })
        .collect();
    let mut cmd = Command::new(&words[0]);
    cmd.args(&words[1..]).env("RUST_LOG", "warn");
    cmd
}

/// Wait (polling, as a child process offers no event to await) until `child` exits, failing
/// after `within` with `what` in the message.
pub async fn wait_exit(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills, when dropped, the process a reload started: the reload script names it in the line
/// `tollgate-reload: process PID is taking over …` of its stderr, written to `log`.
pub struct ReloadedGuard(pub PathBuf);

impl Drop for ReloadedGuard {
    fn drop(&mut self) {
        let log = std::fs::read_to_string(&self.0).unwrap_or_default();
        let pid = log.lines().find_map(|l| l.strip_prefix("tollgate-reload: process ")?.split(' ').next().map(str::to_string));
        if let Some(pid) = pid {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

/// `config` (one whose `keys:` list starts with a line `keys:`) with `entry` as its first key.
pub fn with_key(config: &str, entry: &str) -> String {
    assert!(config.contains("keys:\n"), "the config has a keys list");
    config.replacen("keys:\n", &format!("keys:\n  - {entry}\n"), 1)
}

/// How one short chat request through a loader ended.
pub enum Outcome {
    /// 200 and the whole body.
    Answered,
    /// No answer at all: the request could not be sent or its connection closed first.
    Unanswered(String),
    /// An answer that was not a 200 with its whole body.
    Failed(String),
}

/// One short (non-streamed) chat completion with `c` to `url`, as the load generators send.
pub async fn short_chat(c: &reqwest::Client, url: &str) -> Outcome {
    let r = c.post(url).bearer_auth(CLIENT_KEY).json(&serde_json::json!({"model": "alpha-5.5", "messages": []})).send().await;
    match r {
        Ok(r) if r.status() == 200 => match r.bytes().await {
            Ok(_) => Outcome::Answered,
            Err(e) => Outcome::Failed(format!("body: {e:?}")),
        },
        Ok(r) => Outcome::Failed(format!("status {}", r.status())),
        Err(e) => Outcome::Unanswered(format!("{e:?}")),
    }
}

/// A `multipart/form-data` body: text fields, then files `(name, filename, type, bytes)`.
pub fn form(fields: &[(&str, &str)], files: &[(&str, &str, &str, Vec<u8>)]) -> (String, Vec<u8>) {
    let boundary = "test-boundary-5c2f";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes());
    }
    for (name, filename, kind, bytes) in files {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: {kind}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Poll `check` until it holds (20 s at most): for what the gateway writes where no event
/// tells of it, such as a line of its log file.
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The faked wall clock (libfaketime) of a gateway started with [`FakeClock::env`]: frozen at
/// the time written to its file, moved by writing another.
pub struct FakeClock {
    pub file: std::path::PathBuf,
}

impl FakeClock {
    const LIBFAKETIME: &'static str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

    /// A clock whose file lives in `dir`.
    pub fn new(dir: &std::path::Path) -> FakeClock {
        assert!(std::path::Path::new(Self::LIBFAKETIME).exists(), "libfaketime is needed (Debian package faketime; .ci/run installs it)");
        FakeClock { file: dir.join("now") }
    }

    /// Freeze the clock at `unix`.
    pub fn set(&self, unix: u64) {
        let at = jiff::Timestamp::from_second(unix as i64).expect("time").strftime("%Y-%m-%d %H:%M:%S").to_string();
        std::fs::write(&self.file, at).expect("write the fake time");
    }

    /// The environment that makes a process read this clock.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LD_PRELOAD", Self::LIBFAKETIME.to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.to_string_lossy().into_owned()),
            ("FAKETIME_NO_CACHE", "1".to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ]
    }
}

/// A `Stripe-Signature` header for `payload` signed with `secret` at `timestamp`, made by the
/// official `stripe` npm package's test-header helper (`stripe.webhooks.generateTestHeaderString`),
/// installed by `tests/run_all.sh` (`TOLLGATE_STRIPE_MODULES`, else `~/.cache/tollgate/stripe`).
pub fn stripe_signature(payload: &str, secret: &str, timestamp: u64) -> String {
    let modules = std::env::var("TOLLGATE_STRIPE_MODULES")
        .unwrap_or_else(|_| format!("{}/.cache/tollgate/stripe/node_modules", std::env::var("HOME").unwrap_or_default()));
    let script = "const s = require('stripe')('sk_test_unused'); \
        process.stdout.write(s.webhooks.generateTestHeaderString({payload: process.env.P, secret: process.env.S, timestamp: Number(process.env.T)}));";
    let out = Command::new("node")
        .arg("-e")
        .arg(script)
        .env("NODE_PATH", &modules)
        .env("P", payload)
        .env("S", secret)
        .env("T", timestamp.to_string())
        .output()
        .expect("node (tests/run_all.sh installs it with the stripe package)");
    assert!(out.status.success(), "the stripe npm package signs (install: tests/run_all.sh): {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// An HTTP server on a free port that answers every request with the bytes `body` holds at that
/// moment (a feed the test changes): its port. It lives as long as the test process.
pub fn serve_bytes(body: std::sync::Arc<std::sync::Mutex<Vec<u8>>>) -> u16 {
    use std::io::{BufRead, Write as _};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(&stream);
                let mut line = String::new();
                // The request's head, up to its empty line.
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let bytes = body.lock().expect("body").clone();
                let mut out = &stream;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    bytes.len()
                );
                let _ = out.write_all(head.as_bytes()).and_then(|()| out.write_all(&bytes));
            });
        }
    });
    port
}

/// LiteLLM's `model_prices_and_context_window` table as its PyPI package ships it, extracted by
/// `tests/run_all.sh` (`TOLLGATE_LITELLM_PRICES`, else `~/.cache/tollgate/litellm/…`).
pub fn litellm_prices() -> Vec<u8> {
    let path = std::env::var("TOLLGATE_LITELLM_PRICES").unwrap_or_else(|_| {
        format!("{}/.cache/tollgate/litellm/model_prices_and_context_window_backup.json", std::env::var("HOME").unwrap_or_default())
    });
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("LiteLLM's price table at {path} (tests/run_all.sh extracts it from the litellm wheel): {e}"))
}
