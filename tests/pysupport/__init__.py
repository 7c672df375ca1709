"""What the Python suites (tests/sdk, tests/console) share: free ports, waiting for a
listener, starting the mock and the gateway, and the admin API's answers."""
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port}")


def start_mock(bin_dir, key):
    """tollgate-mock on a free port, accepting `key`: the process and its port."""
    import os
    import subprocess

    port = free_port()
    proc = subprocess.Popen([os.path.join(bin_dir, "tollgate-mock"), "--listen", f"127.0.0.1:{port}", "--key", key])
    wait_listening(port, proc, "tollgate-mock")
    return proc, port


def start_tollgate(bin_dir, tmp, config, ports, env=None, name="tollgate.yaml"):
    """tollgate on `config` (written to `tmp/name`), once it listens on every port of `ports`."""
    import os
    import subprocess

    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(config)
    proc = subprocess.Popen([os.path.join(bin_dir, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn", **(env or {})})
    try:
        for port in ports:
            wait_listening(port, proc, "tollgate")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def admin_json(admin, token, method, path, body=None):
    """The admin API's JSON answer to `method path` (with `body` as JSON)."""
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(admin + path, data=data, method=method, headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def claude_code(tmp_path, base_url, auth):
    """Claude Code (installed by tests/run_all.sh) ready to run in a fresh home and working
    directory against `base_url`, with `auth` ({"ANTHROPIC_API_KEY": key} or
    {"ANTHROPIC_AUTH_TOKEN": token}) and the mock's models: its path, the working directory and
    the environment. Skipped when it is not installed (failed when TOLLGATE_AGENT_CLIS_REQUIRED)."""
    import os

    import pytest

    clis = os.environ.get("TOLLGATE_AGENT_CLIS", os.path.expanduser("~/.cache/tollgate/agent-clis/node_modules/.bin"))
    claude = os.path.join(clis, "claude")
    if not os.path.exists(claude):
        if os.environ.get("TOLLGATE_AGENT_CLIS_REQUIRED"):
            pytest.fail(f"TOLLGATE_AGENT_CLIS_REQUIRED=1 but {claude} is missing")
        pytest.skip("Claude Code is not installed (tests/run_all.sh installs it)")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(home), "TERM": "dumb", "NO_COLOR": "1",
        "ANTHROPIC_BASE_URL": base_url, **auth,
        "ANTHROPIC_MODEL": "beta-opus-4-7", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "beta-haiku-4-5",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    }
    return claude, work, env
