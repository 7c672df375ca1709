"""The latency a webhook guardrail adds to a call (issue 65: its own round trip plus at most
0.2 ms): the same small chat completion through tollgate with a key whose guardrail asks a
webhook and with a key without guardrails, and the webhook's own round trip asked directly —
the three interleaved (each sees the same moments of the machine), over kept-alive
connections, in one run; p50 and p99 of each, and of (with − without) − round trip.

The webhook answers `allow` at once (a Python server: its own time is in its round trip, which
the figure subtracts). The gateway is TOLLGATE_BIN (default target/release/tollgate), the
upstream tollgate-mock beside it. Usage, from the repository root:
    .venv/bin/python benches/guardrails/webhook_latency.py [calls]
"""
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "release", "tollgate"))
MOCK = os.environ.get("TOLLGATE_MOCK_BIN", os.path.join(os.path.dirname(BIN), "tollgate-mock"))
HOOKED, PLAIN = "sk-bench-guard-hooked-0000000000000001", "sk-bench-guard-plain-00000000000000001"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


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


class Allow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Its header and body go in two writes: without this, Nagle's algorithm and the
        # client's delayed ACK hold the body 40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        data = b'{"action":"allow"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def timed(conn, path, body, headers):
    start = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
    return (time.perf_counter() - start) * 1e6


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Allow)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    hook_port = hook.server_address[1]
    mock_port, gw_port = port(), port()
    tmp = tempfile.mkdtemp(prefix="tollgate-guard-bench-")
    mock = subprocess.Popen([MOCK, "--listen", f"127.0.0.1:{mock_port}", "--key", "up"], stderr=subprocess.DEVNULL)
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/sock }}
providers: [{{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: up, models: [alpha-5.5] }}]
prices: {{ alpha-5.5: {{ input: 1, output: 2 }} }}
guardrails: [{{ name: hook, kind: webhook, url: "http://127.0.0.1:{hook_port}/check", secret_env: BENCH_HOOK_SECRET }}]
keys:
  - {{ key: {HOOKED}, name: hooked, balance: 1000000, guardrails: [hook] }}
  - {{ key: {PLAIN}, name: plain, balance: 1000000 }}
"""
    with open(f"{tmp}/tollgate.yaml", "w") as f:
        f.write(config)
    gw = subprocess.Popen([BIN, "-c", f"{tmp}/tollgate.yaml"], env={**os.environ, "RUST_LOG": "error", "BENCH_HOOK_SECRET": SECRET})
    try:
        wait(mock_port)
        wait(gw_port)
        body = json.dumps({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8})
        hooked, plain, direct = (http.client.HTTPConnection("127.0.0.1", p) for p in (gw_port, gw_port, hook_port))
        asked = json.dumps({"phase": "input", "protocol": "openai", "route": "chat_completions", "texts": ["hello there"]})
        series = {"with": [], "without": [], "round trip": []}
        for i in range(calls + 200):
            a = timed(hooked, "/v1/chat/completions", body, {"authorization": f"Bearer {HOOKED}", "content-type": "application/json"})
            b = timed(plain, "/v1/chat/completions", body, {"authorization": f"Bearer {PLAIN}", "content-type": "application/json"})
            c = timed(direct, "/check", asked, {"content-type": "application/json"})
            if i >= 200:  # warmed
                series["with"].append(a)
                series["without"].append(b)
                series["round trip"].append(c)
        added = [w - o - r for w, o, r in zip(series["with"], series["without"], series["round trip"])]
        for name, xs in [*series.items(), ("added beyond the round trip", added)]:
            print(f"{name:>28}: p50 {pct(xs, 50):8.1f} µs   p99 {pct(xs, 99):8.1f} µs")
    finally:
        gw.kill()
        mock.kill()
        hook.shutdown()


if __name__ == "__main__":
    main()
