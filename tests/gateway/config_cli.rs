//! `tollgate -c FILE` start-up validation as an operator sees it: exit status and a message
//! naming the offending key.

use crate::common::*;

fn check(body: &str, env: &[(&str, &str)]) -> (i32, String) {
    let (_dir, path, _port) = write_config(body);
    let path = path.to_string_lossy().into_owned();
    run_tollgate(&["-t", "-c", &path], env)
}

#[test]
fn a_valid_config_passes_the_test_flag() {
    let (code, out) = check(&standard_config(1), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("is valid"), "{out}");
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let (code, out) = check(&format!("{}\nlisten_port: 9\n", standard_config(1)), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("listen_port"), "{out}");
    let body = standard_config(1).replace("models: [gamma-3.5-flash]", "models: [gamma-3.5-flash], region: x");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("region"), "{out}");
}

#[test]
fn a_missing_env_variable_is_named() {
    let body = standard_config(1).replacen(&format!("api_key: {UPSTREAM_KEY}"), "api_key_env: TOLLGATE_CLI_TEST_UNSET_KEY", 1);
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("TOLLGATE_CLI_TEST_UNSET_KEY") && out.contains("providers[0].api_key_env"), "{out}");
    let (code, out) = check(&body, &[("TOLLGATE_CLI_TEST_UNSET_KEY", "sk-from-env")]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn bad_values_are_named() {
    let body = standard_config(1).replace("group: chat", "group: nobody");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2);
    assert!(out.contains("keys[1].group") && out.contains("nobody"), "{out}");
    let body = standard_config(1).replace("protocol: gemini", "protocol: palm");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2);
    assert!(out.contains("palm"), "{out}");
    let (code, out) = run_tollgate(&["-c", "/nonexistent/tollgate.yaml"], &[]);
    assert_eq!(code, 2);
    assert!(out.contains("/nonexistent/tollgate.yaml"), "{out}");
}

/// Billing fails closed: a config serving a model without a price, or enabling an unpriced
/// video model, is refused at `-t` and at start, naming the model.
#[test]
fn unpriced_models_are_refused_by_name() {
    let body = standard_config(1).replace("  alpha-4o-mini: { input: 0.15, output: 0.6 }\n", "");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("prices.alpha-4o-mini: no price for a served model"), "{out}");
    let (code, out) = run_tollgate(&["-c", &write_config(&body).1.to_string_lossy()], &[]);
    assert_eq!(code, 2, "start is refused too: {out}");
    assert!(out.contains("prices.alpha-4o-mini"), "{out}");
    let video = video_section(1).replace(", genq2-pro-fast: 0", "");
    let (code, out) = check(&format!("{}{video}", standard_config(1)), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("video.prices.genq2-pro-fast: no price for an enabled video model"), "{out}");
    let (code, out) = check(&format!("{}{}", standard_config(1), video_section(1)), &[]);
    assert_eq!(code, 0, "{out}");
}

/// The admin token is at least 16 characters; an empty one would mean no authentication.
#[test]
fn a_short_or_empty_admin_token_is_refused() {
    for token in ["\"\"", "change-me"] {
        let body = format!("{}admin: {{ listen: 127.0.0.1:1, token: {token} }}\n", standard_config(1));
        let (code, out) = check(&body, &[]);
        assert_eq!(code, 2, "{token}: {out}");
        assert!(out.contains("admin.token: at least 16 characters"), "{out}");
    }
    let body = format!("{}admin: {{ listen: 127.0.0.1:1, token_env: TOLLGATE_CLI_ADMIN }}\n", standard_config(1));
    let (code, out) = check(&body, &[("TOLLGATE_CLI_ADMIN", "short")]);
    assert_eq!(code, 2, "{out}");
    let (code, out) = check(&body, &[("TOLLGATE_CLI_ADMIN", "a-long-enough-admin-token")]);
    assert_eq!(code, 0, "{out}");
}

/// Issue 27: `--version` names the version and the commit; `--help` is tollgate's own (the
/// default file, the flags, the environment), not Pingora's generic text; the mock has both.
#[test]
fn version_and_help_are_tollgates_own() {
    let (code, out) = run_tollgate(&["--version"], &[]);
    assert_eq!(code, 0, "{out}");
    let line = out.trim();
    assert!(line.starts_with(&format!("tollgate {} (", env!("CARGO_PKG_VERSION"))) && line.ends_with(')'), "{out}");
    let (code, out) = run_tollgate(&["--help"], &[]);
    assert_eq!(code, 0, "{out}");
    for needle in ["conf/tollgate.yaml", "-t, --test", "-u, --upgrade", "RUST_LOG", "TOLLGATE_ADMIN_TOKEN", "store copy", "admin API"] {
        assert!(out.contains(needle), "--help lacks {needle}: {out}");
    }
    assert!(!out.contains("base set of command line arguments"), "Pingora's text: {out}");
    // Anywhere on the line (issue 46, point 9).
    let (code, out) = run_tollgate(&["-c", "conf/tollgate.yaml", "--help"], &[]);
    assert!(code == 0 && out.contains("-t, --test") && !out.contains("base set of command line arguments"), "{out}");
    let (code, out) = run_tollgate(&["-t", "--version"], &[]);
    assert!(code == 0 && out.trim().starts_with("tollgate "), "{out}");
    let mock = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-mock")).arg("--version").output().expect("mock");
    assert!(String::from_utf8_lossy(&mock.stdout).starts_with("tollgate-mock "), "{mock:?}");
}

/// Issue 27: a base URL written with the protocol's version segment, as the `openai` SDK and
/// other gateways write it, would reach the upstream as `/v1/v1/…`: `-t` refuses it and says
/// what to write.
#[test]
fn a_base_url_ending_in_the_version_segment_is_refused_with_the_fix() {
    let body = standard_config(1).replace("base_url: \"http://127.0.0.1:1/oa\"", "base_url: \"https://api.openai.com/v1\"");
    assert!(body.contains("api.openai.com/v1"), "the fixture changed");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("providers[0].base_url: ends in /v1") && out.contains("write base_url: https://api.openai.com"), "{out}");
    let body = standard_config(1)
        .replace("base_url: \"http://127.0.0.1:1/ge\"", "base_url: \"https://generativelanguage.googleapis.com/v1beta/\"");
    let (code, out) = check(&body, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("ends in /v1beta") && out.contains("write base_url: https://generativelanguage.googleapis.com"), "{out}");
}

/// Issue 27: a listener whose address is taken is one fatal line and exit 2, not a retry every
/// second for ever.
#[test]
fn a_taken_port_is_one_fatal_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let (_dir, path, _port) = write_config(&standard_config(1));
    let text = std::fs::read_to_string(&path).expect("read");
    let text = text
        .lines()
        .map(|l| if l.starts_with("listen: ") { format!("listen: 127.0.0.1:{port}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&path, text).expect("write");
    let path = path.to_string_lossy().into_owned();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["-c", &path])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("tollgate kept running on a taken port");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("listen 127.0.0.1:{port}: address already in use")), "{err}");
    drop(taken);
}

/// Issue 27: the start-up line says what is served where.
#[tokio::test]
async fn the_start_up_line_says_what_is_served_where() {
    let mock = start_mock();
    let gw = start_gateway_logged(&standard_config(mock.port));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = loop {
        if let Some(l) = gw.log().lines().find(|l| l.contains("enabled key(s)")) {
            break l.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no start-up line: {}", gw.log());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for needle in [
        format!("tollgate {} (", env!("CARGO_PKG_VERSION")),
        format!("listening on http://127.0.0.1:{}", gw.proc.port),
        "store sled in".to_string(),
        "3 provider(s) serving".to_string(),
    ] {
        assert!(line.contains(&needle), "{needle} missing from: {line}");
    }
}

/// Issue 46, point 4: a copy from a mistyped path is refused (exit 2) and creates nothing.
#[test]
fn store_copy_from_nothing_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (from, to) = (dir.path().join("no-such-store"), dir.path().join("target"));
    let (code, out) =
        run_tollgate(&["store", "copy", "--from", &format!("sled:{}", from.display()), "--to", &format!("sled:{}", to.display())], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("holds no tollgate store") && !out.contains("copied 0"), "{out}");
    assert!(!from.exists() && !to.exists(), "nothing was created");
    // The postgres:URL spelling is read as a URL (here unreachable: refused for that, not the spelling).
    let (code, out) =
        run_tollgate(&["store", "copy", "--from", "postgres:postgres://nobody@127.0.0.1:1/none", "--to", "sled:/nonexistent"], &[]);
    assert_eq!(code, 2);
    assert!(!out.contains("give sled:DIR"), "{out}");
}

/// Issue 46, point 9: `-t` with an unreachable database names the server and the cause.
#[test]
fn t_with_an_unreachable_database_names_host_port_and_cause() {
    let closed = free_port();
    let body =
        format!("store: {{ postgres: {{ url: \"postgres://tollgate:secret-pw@127.0.0.1:{closed}/tollgate\" }} }}\n{}", standard_config(1));
    let (dir, path, _) = write_config(&body);
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(&format!("127.0.0.1:{closed}")), "the server: {out}");
    assert!(out.to_lowercase().contains("connection refused"), "the cause: {out}");
    assert!(!out.contains("secret-pw"), "no password: {out}");
    drop(dir);
}

#[test]
fn the_console_off_loopback_is_refused_by_the_test_flag_without_the_providers_sign_in_and_tls() {
    let admin = format!("admin: {{ listen: \"127.0.0.1:{}\" }}\n", free_port());
    let listen = "console: { listen: \"0.0.0.0:8443\", public_url: \"https://console.example.com\" }\n";
    let (code, out) = check(&format!("{}{admin}{listen}", standard_config(1)), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("console.listen") && out.contains("identity.oidc"), "{out}");
    let oidc = "identity:\n  oidc: { issuer: \"https://idp.example.com\", client_id: tollgate }\n";
    let (code, out) = check(&format!("{}{admin}{oidc}{listen}", standard_config(1)), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("console.tls"), "{out}");
    // With both (and a certificate that loads), it passes, without calling the provider.
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["console.example.com".to_string()]).unwrap();
    let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&c, cert.cert.pem()).unwrap();
    std::fs::write(&k, cert.signing_key.serialize_pem()).unwrap();
    let tls = format!(
        "console: {{ listen: \"0.0.0.0:{}\", public_url: \"https://console.example.com\", tls: {{ cert: {}, key: {} }} }}\n",
        free_port(),
        c.display(),
        k.display()
    );
    let (code, out) = check(&format!("{}{admin}{oidc}{tls}", standard_config(1)), &[]);
    assert_eq!(code, 0, "{out}");
    // The console needs the admin section: its token is the break-glass sign-in.
    let (code, out) = check(&format!("{}{oidc}{tls}", standard_config(1)), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("admin"), "{out}");
}
