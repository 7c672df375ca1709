//! `tollgate -c FILE` start-up validation as an operator sees it: exit status and a message
//! naming the offending key.

mod common;

use common::*;

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
