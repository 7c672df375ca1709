"""Starts tollgate-mock and tollgate (built by `cargo test`) for the SDK compatibility suite."""
import os
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "debug"))
UPSTREAM_KEY = "mock-upstream-key-sdk"
CLIENT_KEY = "sk-sdk-client-0001"
CHAT_KEY = "sk-sdk-chat-0001"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, what):
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port}")


@pytest.fixture(scope="session")
def gateway():
    tmp = tempfile.mkdtemp(prefix="tollgate-sdk-")
    mock_port, gw_port = free_port(), free_port()
    mock = subprocess.Popen(
        [os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY]
    )
    wait_listening(mock_port, mock, "tollgate-mock")
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5, alpha-embed-3] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [beta-opus-4-7, beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini] }}
  chat: {{ platforms: [openai] }}
keys:
  - {{ key: {CLIENT_KEY}, name: sdk, group: default, balance: 5.0 }}
  - {{ key: {CHAT_KEY}, name: sdk-chat, group: chat, balance: 5.0 }}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait_listening(gw_port, gw, "tollgate")
        yield f"http://127.0.0.1:{gw_port}"
    finally:
        for p in (gw, mock):
            p.kill()
            p.wait()
