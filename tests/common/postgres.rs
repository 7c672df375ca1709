//! A real PostgreSQL server for the fleet tests: Debian's `postgresql` package (installed by
//! tests/run_all.sh), a cluster made in a temporary directory and started on a free loopback
//! port, as the `postgres` user when the tests run as root (the server refuses root). Stopped
//! (fast shutdown) and removed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The newest installed server's binaries (`/usr/lib/postgresql/<version>/bin`), or the
/// directory in `TOLLGATE_PG_BIN`.
pub fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("TOLLGATE_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

pub struct Postgres {
    child: Child,
    pub port: u16,
    data: PathBuf,
    dir: tempfile::TempDir,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

/// `program args…`, as the `postgres` user when this process is root.
fn command(program: PathBuf, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

impl Postgres {
    /// A new server with a database `tollgate` that user `postgres` may use without a password
    /// from loopback. Panics (naming the package) when no server is installed.
    pub fn start() -> Postgres {
        let bin = bin_dir().expect("PostgreSQL is not installed: apt-get install postgresql (tests/run_all.sh does)");
        let dir = tempfile::Builder::new().prefix("tollgate-pg").tempdir().expect("tempdir");
        let data = dir.path().join("data");
        if is_root() {
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().expect("chown");
            assert!(ok.success(), "chown the cluster directory to postgres");
        }
        let data_s = data.to_str().expect("utf-8 path").to_string();
        let out = command(bin.join("initdb"), &["-D", &data_s, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
            .output()
            .expect("initdb");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = super::free_port();
        let mut child = spawn(&bin, &data_s, dir.path(), port);
        wait_ready(&bin, port, &mut child);
        let port_s = port.to_string();
        let out =
            command(bin.join("createdb"), &["-h", "127.0.0.1", "-p", &port_s, "-U", "postgres", "tollgate"]).output().expect("createdb");
        assert!(out.status.success(), "createdb: {}", String::from_utf8_lossy(&out.stderr));
        Postgres { child, port, data, dir }
    }

    /// Stop the server (fast shutdown: clients are disconnected), as an outage would.
    pub fn stop(&mut self) {
        self.shut_down();
    }

    /// Start the stopped server again on the same data and port.
    pub fn start_again(&mut self) {
        let bin = bin_dir().expect("PostgreSQL is installed");
        let data_s = self.data.to_str().expect("utf-8 path").to_string();
        self.child = spawn(&bin, &data_s, self.dir.path(), self.port);
        wait_ready(&bin, self.port, &mut self.child);
    }

    fn shut_down(&mut self) {
        // SIGINT to the server itself (under root it is runuser's child): fast shutdown.
        let server = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string))
            .unwrap_or_else(|| self.child.id().to_string());
        let _ = Command::new("kill").args(["-INT", &server]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(bin: &std::path::Path, data_s: &str, socket_dir: &std::path::Path, port: u16) -> Child {
    let socket_dir = socket_dir.to_str().expect("utf-8 path").to_string();
    let port_s = port.to_string();
    command(
        bin.join("postgres"),
        &[
            "-D",
            data_s,
            "-p",
            &port_s,
            "-k",
            &socket_dir,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start postgres")
}

fn wait_ready(bin: &std::path::Path, port: u16, child: &mut Child) {
    let port_s = port.to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = command(bin.join("pg_isready"), &["-h", "127.0.0.1", "-p", &port_s, "-U", "postgres"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("postgres exited before accepting connections: {status}");
        }
        assert!(Instant::now() < deadline, "postgres did not accept connections within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Postgres {
    /// The connection URL of the `tollgate` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/tollgate", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.shut_down();
    }
}
