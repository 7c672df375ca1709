"""tollgate beside Anthropic's own gateway for Claude Code (`claude gateway`, in the `claude`
binary) on the same upstream (tollgate-mock): both serve a person signed in through the same
OpenID provider (the mock's), with spend limits on (tollgate: a day budget on the person's key;
Anthropic's: its spend meter, which needs its `admin:` block), PostgreSQL for Anthropic's (its
only store). wrk drives `POST /v1/messages` with each gateway's own token; rounds interleave
the mock itself (the baseline), tollgate and Anthropic's gateway. Reported: throughput at
c=32, median latency added to the mock's at c=1, and CPU per request of each gateway's
processes (Anthropic's with its PostgreSQL's), each as tollgate's ratio.

    python3 benches/claude-gateway/bench.py [--secs 5] [--rounds 3]

TOLLGATE_BIN_DIR: where tollgate and tollgate-mock are (default target/release); CLAUDE_BIN: the
`claude` binary (default ~/.cache/tollgate/agent-clis/node_modules/.bin/claude). Needs wrk and
Debian's postgresql."""
import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import http.cookiejar

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from pysupport import free_port, wait_listening  # noqa: E402
from pysupport.postgres import Postgres  # noqa: E402

KEY = "bench-upstream-key-0000000000000001"
SECRET = "bench-session-secret-0123456789abcdef-0123456789"


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def anthropic_token():
    """A token of Anthropic's gateway: HS256 with its session secret, audience claude-gateway."""
    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "cy", "email": "cy@example.com", "groups": ["research"], "aud": "claude-gateway", "iat": now, "exp": now + 3600}).encode())
    sig = b64(hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def tollgate_token(gateway):
    """tollgate's token for cy: the device flow, approved through the mock's provider."""
    grant = json.load(urllib.request.urlopen(urllib.request.Request(f"{gateway}/oauth/device_authorization", data=b"", method="POST")))
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.request.Request(f"{gateway}/device", data=urllib.parse.urlencode({"user_code": grant["user_code"]}).encode(), headers={"Sec-Fetch-Site": "same-origin"})
    page = browser.open(form)
    cy = re.search(r'href="([^"]*login_hint=cy)"', page.read().decode()).group(1).replace("&amp;", "&")
    browser.open(urllib.parse.urljoin(page.url, cy)).read()
    time.sleep(grant["interval"])
    poll = urllib.parse.urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": grant["device_code"]}).encode()
    return json.load(urllib.request.urlopen(f"{gateway}/oauth/token", poll))["access_token"]


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total


def tree(pid):
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for child in open(f"/proc/{p}/task/{p}/children").read().split():
                todo.append(int(child))
        except OSError:
            pass
    return out


def wrk(url, token, conns, secs):
    env = {**os.environ, "BENCH_TOKEN": token, "BENCH_API_KEY": "1" if token == KEY else "0"}
    out = subprocess.run(["wrk", "-t", "2" if conns > 1 else "1", "-c", str(conns), "-d", f"{secs}s", "-s", os.path.join(HERE, "messages.lua"), f"{url}/v1/messages"],
                         env=env, capture_output=True, text=True, check=True).stdout
    m = re.search(r"RESULT rps=([\d.]+) p50_us=(\d+) p99_us=(\d+) errors=(\d+) non2xx=(\d+)", out)
    rps, p50, p99, errors, non2xx = float(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
    if errors or non2xx:
        raise SystemExit(f"{url}: {errors} errors, {non2xx} non-2xx answers: the run does not count\n{out}")
    return rps, p50


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    bins = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "release"))
    claude = os.environ.get("CLAUDE_BIN", os.path.expanduser("~/.cache/tollgate/agent-clis/node_modules/.bin/claude"))
    tmp = tempfile.mkdtemp(prefix="tollgate-bench-cc-")
    procs = []
    pg = Postgres()
    try:
        mock_port, tg_port, cc_port = free_port(), free_port(), free_port()
        mock = subprocess.Popen([os.path.join(bins, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", KEY], stdout=subprocess.DEVNULL)
        procs.append(mock)
        wait_listening(mock_port, mock, "tollgate-mock")
        issuer = f"http://127.0.0.1:{mock_port}/oidc"
        with open(f"{tmp}/tollgate.yaml", "w") as f:
            f.write(f"""listen: 127.0.0.1:{tg_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {KEY}, models: [beta-opus-4-7] }}
prices:
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
accounts:
  - {{ name: research, balance: 1000000.0, budgets: {{ day: 100000.0 }} }}
identity:
  oidc: {{ issuer: "{issuer}", client_id: tollgate }}
  claude_code: {{}}
console: {{ request_log: false }}
""")
        tg = subprocess.Popen([os.path.join(bins, "tollgate"), "-c", f"{tmp}/tollgate.yaml"], stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/tollgate.log", "w"))
        procs.append(tg)
        wait_listening(tg_port, tg, "tollgate")
        with open(f"{tmp}/gateway.yaml", "w") as f:
            f.write(f"""listen: {{ host: 127.0.0.1, port: {cc_port} }}
store: {{ postgres_url: "postgres://postgres@127.0.0.1:{pg.port}/postgres" }}
session: {{ jwt_secret: "{SECRET}" }}
oidc: {{ issuer: "{issuer}", client_id: tollgate, client_secret: bench-client-secret }}
upstreams:
  - {{ name: an, provider: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", auth: {{ api_key: {KEY} }} }}
auto_include_builtin_models: false
models:
  - {{ id: beta-opus-4-7, upstream_model: {{ an: beta-opus-4-7 }} }}
admin:
  write_keys: [{{ id: bench, key: "bench-admin-write-key-0123456789abcdef" }}]
""")
        # Its upstream and provider are on loopback here: it refuses them unless told.
        cc = subprocess.Popen([claude, "gateway", "--config", f"{tmp}/gateway.yaml"], stdout=open(f"{tmp}/gateway.log", "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "CLAUDE_GATEWAY_ALLOW_LOOPBACK": "1"})
        procs.append(cc)
        try:
            wait_listening(cc_port, cc, "claude gateway", timeout=90)
        except RuntimeError:
            raise SystemExit("claude gateway did not start:\n" + open(f"{tmp}/gateway.log").read()[-3000:])
        targets = {
            "mock": (f"http://127.0.0.1:{mock_port}/an", KEY, [mock.pid]),
            "tollgate": (f"http://127.0.0.1:{tg_port}", tollgate_token(f"http://127.0.0.1:{tg_port}"), [tg.pid]),
            "anthropic": (f"http://127.0.0.1:{cc_port}", anthropic_token(), tree(cc.pid) + tree(pg.proc.pid)),
        }
        for name, (url, token, _) in targets.items():
            wrk(url, token, 1, 1)  # warm-up; also fails fast on a refusal
        results = {name: {"rps": [], "p50": [], "cpu": []} for name in targets}
        tick = os.sysconf("SC_CLK_TCK")
        for r in range(args.rounds):
            for name, (url, token, pids) in targets.items():
                before = cpu_ticks(pids if name != "anthropic" else tree(cc.pid) + tree(pg.proc.pid))
                rps, _ = wrk(url, token, 32, args.secs)
                used = cpu_ticks(pids if name != "anthropic" else tree(cc.pid) + tree(pg.proc.pid)) - before
                results[name]["rps"].append(rps)
                results[name]["cpu"].append(used / tick / (rps * args.secs) * 1e6)
                _, p50 = wrk(url, token, 1, args.secs)
                results[name]["p50"].append(p50)
            print(f"round {r + 1}: " + ", ".join(f"{n} {results[n]['rps'][-1]:.0f} rps" for n in targets), flush=True)
        med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in results.items()}
        added = {n: med[n]["p50"] - med["mock"]["p50"] for n in ("tollgate", "anthropic")}
        print(json.dumps({"median": med, "added_p50_us": added}, indent=1))
        print(f"throughput at c=32: Anthropic's gateway {med['anthropic']['rps'] / med['tollgate']['rps']:.2f}x tollgate's")
        print(f"added median latency at c=1: Anthropic's {added['anthropic'] / max(added['tollgate'], 1):.1f}x tollgate's ({added['anthropic']} us vs {added['tollgate']} us)")
        print(f"CPU per request: Anthropic's (with PostgreSQL) {med['anthropic']['cpu'] / med['tollgate']['cpu']:.1f}x tollgate's ({med['anthropic']['cpu']:.0f} us vs {med['tollgate']['cpu']:.0f} us)")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
