"""A real PostgreSQL server for the Python fleet tests, as tests/common/postgres.rs starts one:
Debian's `postgresql` package, a cluster in a temporary directory on a free loopback port, run
as the `postgres` user when the tests run as root (the server refuses root)."""
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

from pysupport import free_port


def bin_dir():
    if os.environ.get("TOLLGATE_PG_BIN"):
        return os.environ["TOLLGATE_PG_BIN"]
    found = sorted((int(p.split("/")[-2]), p) for p in glob.glob("/usr/lib/postgresql/*/bin") if os.path.exists(os.path.join(p, "initdb")))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (tests/run_all.sh does)")
    return found[-1][1]


def _cmd(program, *args):
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", program, *args]
    return [program, *args]


class Postgres:
    def __init__(self):
        b = bin_dir()
        self.dir = tempfile.mkdtemp(prefix="tollgate-pg-")
        data = os.path.join(self.dir, "data")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(_cmd(os.path.join(b, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"), check=True, capture_output=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            _cmd(os.path.join(b, "postgres"), "-D", data, "-p", str(self.port), "-k", self.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.data = data
        deadline = time.monotonic() + 30
        while subprocess.run(_cmd(os.path.join(b, "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)), capture_output=True).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.1)
        subprocess.run(_cmd(os.path.join(b, "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "tollgate"), check=True, capture_output=True)

    @property
    def url(self):
        return f"postgres://postgres@127.0.0.1:{self.port}/tollgate"

    def stop(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                os.kill(int(f.readline()), signal.SIGINT)
        except (OSError, ValueError):
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
