"""The latency a tool call relayed through tollgate's /mcp adds (issue 52): the same
`tools/call` sent to an MCP server directly and through the gateway, one after the other
(interleaved, so both see the same moments of the machine), over kept-alive connections, in one
run; p50 and p99 of each and of the difference.

Servers: the mock's (`tollgate-mock`, Rust: the gateway's own cost shows) or, with `--sdk`, a
real one of the official Python SDK (`tests/sdk/mcp_server.py`). The gateway is the build
TOLLGATE_BIN names (default target/release/tollgate). Usage, from the repository root:
    .venv/bin/python benches/mcp/latency.py [calls] [--sdk]
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "release", "tollgate"))
MOCK = os.environ.get("TOLLGATE_MOCK_BIN", os.path.join(os.path.dirname(BIN), "tollgate-mock"))
KEY = "sk-bench-mcp-000000000000000000000001"


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait(p):
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", p), 0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {p} never opened")


class Peer:
    """One MCP endpoint over one kept-alive connection, with its session."""

    def __init__(self, port, path, headers):
        self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.path, self.headers = path, {"content-type": "application/json", "accept": "application/json, text/event-stream", **headers}
        self.n = 0
        init = self.post("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        self.headers["mcp-session-id"] = init[1]
        self.headers["mcp-protocol-version"] = "2025-06-18"
        self.post("notifications/initialized", None, notify=True)

    def post(self, method, params, notify=False):
        self.n += 1
        msg = {"jsonrpc": "2.0", "method": method}
        if not notify:
            msg["id"] = self.n
        if params is not None:
            msg["params"] = params
        self.conn.request("POST", self.path, body=json.dumps(msg), headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if r.status >= 300:
            raise SystemExit(f"{method}: HTTP {r.status} {body[:200]!r}")
        return body, r.getheader("mcp-session-id")

    def call(self, name, args):
        t = time.perf_counter()
        body, _ = self.post("tools/call", {"name": name, "arguments": args})
        took = time.perf_counter() - t
        text = body.decode()
        if not text.lstrip().startswith("{"):
            # An SSE answer: the message among its events that is the response.
            datas = [l[5:].strip() for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
            text = next(d for d in datas if '"result"' in d)
        assert json.loads(text)["result"]["isError"] is False, text
        return took


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(calls, sdk):
    tmp = tempfile.mkdtemp(prefix="tollgate-mcp-bench-")
    sp, gp = port(), port()
    if sdk:
        server = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "sdk", "mcp_server.py"), "docs", str(sp)])
        tool, args = "search", {"query": "tolls"}
    else:
        server = subprocess.Popen([MOCK, "--listen", f"127.0.0.1:{sp}", "--key", "mock-upstream-key"])
        tool, args = "echo", {"text": "tolls"}
    wait(sp)
    config = f"""
listen: 127.0.0.1:{gp}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers: []
mcp:
  servers:
    - {{ name: s, url: "http://127.0.0.1:{sp}/mcp", prices: {{ per_call: 0.0001 }} }}
keys:
  - {{ key: {KEY}, name: bench, balance: 1000.0 }}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    gw = subprocess.Popen([BIN, "-c", path], env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait(gp)
        direct = Peer(sp, "/mcp", {})
        relayed = Peer(gp, "/mcp", {"authorization": f"Bearer {KEY}"})
        for _ in range(min(200, calls // 10)):
            direct.call(tool, args)
            relayed.call(f"s__{tool}", args)
        d, r = [], []
        for i in range(calls):
            # Interleaved, alternating which goes first.
            if i % 2:
                d.append(direct.call(tool, args))
                r.append(relayed.call(f"s__{tool}", args))
            else:
                r.append(relayed.call(f"s__{tool}", args))
                d.append(direct.call(tool, args))
        ms = lambda x: f"{x * 1000:.3f} ms"  # noqa: E731
        print(f"server: {'official Python SDK' if sdk else 'tollgate-mock'}; {calls} calls each, interleaved; gateway {BIN}")
        print(f"{'':10} {'p50':>12} {'p99':>12}")
        print(f"{'direct':10} {ms(pct(d, 0.5)):>12} {ms(pct(d, 0.99)):>12}")
        print(f"{'relayed':10} {ms(pct(r, 0.5)):>12} {ms(pct(r, 0.99)):>12}")
        print(f"{'added':10} {ms(pct(r, 0.5) - pct(d, 0.5)):>12} {ms(pct(r, 0.99) - pct(d, 0.99)):>12}")
    finally:
        gw.kill()
        server.kill()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(int(args[0]) if args else 2000, "--sdk" in sys.argv)
