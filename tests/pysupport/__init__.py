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
