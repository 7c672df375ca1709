//! Records the commit the binary is built from (`tollgate --version`, the start-up line) as
//! `TOLLGATE_COMMIT`: `git rev-parse --short=10 HEAD`, or "unknown" outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    String::from_utf8(out.stdout).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=10", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TOLLGATE_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // Built again when the checked-out commit changes: the git directory's HEAD, the branch it
    // names (a loose ref, or the packed refs), wherever the git directory is (a worktree's too).
    // Only paths that exist are named: a missing one would make every build run this again.
    let Some(dir) = git(&["rev-parse", "--git-dir"]) else { return };
    let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or_else(|| dir.clone());
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut paths = vec![format!("{dir}/HEAD"), format!("{common}/packed-refs")];
    if let Some(branch) = branch {
        paths.push(format!("{common}/{branch}"));
    }
    for path in paths.iter().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}
