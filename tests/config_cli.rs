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
    let body = standard_config(1).replacen(
        &format!("api_key: {UPSTREAM_KEY}"),
        "api_key_env: TOLLGATE_CLI_TEST_UNSET_KEY",
        1,
    );
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
