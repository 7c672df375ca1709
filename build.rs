//! Records the commit the binary is built from (`tollgate --version`, the start-up line) as
//! `TOLLGATE_COMMIT`: `git rev-parse --short=10 HEAD`, or "unknown" outside a git checkout.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=10", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
    // Built again when the checked-out commit changes; a path that does not exist would make
    // every build run this again, so only existing ones are named.
    let mut watched = false;
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
            watched = true;
        }
    }
    if !watched {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
