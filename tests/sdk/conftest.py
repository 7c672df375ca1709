"""Starts tollgate-mock and tollgate (built by `cargo test`) for the SDK compatibility suite."""
import os
import ssl
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport import free_port, wait_listening  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "debug"))
UPSTREAM_KEY = "mock-upstream-key-sdk"
CLIENT_KEY = "sk-sdk-client-0001"
CHAT_KEY = "sk-sdk-chat-0001"
# A key of a translating group: every model through every protocol.
BRIDGE_KEY = "sk-sdk-bridge-0001"


class GatewayURL(str):
    """The gateway's base URL; `https` and `ca` tell clients how to reach it."""

    https = False
    ca = None


def http_client(gateway, module):
    """Client options for an SDK module: HTTP/2 and the test CA when the gateway is HTTPS."""
    if not gateway.https:
        return {}
    return {"http_client": module.DefaultHttpxClient(http2=True, verify=ssl.create_default_context(cafile=gateway.ca))}


@pytest.fixture(scope="session", params=["http", "https-h2"])
def gateway(request):
    tmp = tempfile.mkdtemp(prefix="tollgate-sdk-")
    mock_port, gw_port = free_port(), free_port()
    tls_port = free_port()
    tls_section = ""
    if request.param == "https-h2":
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.private_key_and_cert_chain_pem.write_to_path(os.path.join(tmp, "server.pem"))
        cert.private_key_pem.write_to_path(os.path.join(tmp, "key.pem"))
        ca.cert_pem.write_to_path(os.path.join(tmp, "ca.pem"))
        tls_section = f"tls: {{ listen: 127.0.0.1:{tls_port}, cert: {tmp}/server.pem, key: {tmp}/key.pem }}\n"
    mock = subprocess.Popen(
        [os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY]
    )
    wait_listening(mock_port, mock, "tollgate-mock")
    config = tls_section + f"""
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
  bridge: {{ platforms: [openai, anthropic, gemini], translate: true }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  alpha-embed-3: {{ input: 0.1, output: 0.0 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0, cache_write_input: 3.75 }}
  beta-sonnet-4-6: {{ input: 3.0, output: 15.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5 }}
# The mock is steered by x-mock-* headers (the translation tests ask it for tool calls).
forward_headers: ["x-mock-*"]
keys:
  - {{ key: {CLIENT_KEY}, name: sdk, group: default, balance: 5.0 }}
  - {{ key: {CHAT_KEY}, name: sdk-chat, group: chat, balance: 5.0 }}
  - {{ key: {BRIDGE_KEY}, name: sdk-bridge, group: bridge, balance: 5.0 }}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait_listening(gw_port, gw, "tollgate")
        if request.param == "https-h2":
            wait_listening(tls_port, gw, "tollgate https")
            url = GatewayURL(f"https://127.0.0.1:{tls_port}")
            url.https, url.ca = True, os.path.join(tmp, "ca.pem")
        else:
            url = GatewayURL(f"http://127.0.0.1:{gw_port}")
        yield url
    finally:
        for p in (gw, mock):
            p.kill()
            p.wait()
