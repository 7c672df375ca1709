"""What a realtime session costs the gateway (issue 50), against a bare WebSocket relay
(issue 71): memory per open session, with N idle sessions open at once, and CPU per relayed
frame, both directions, over many short turns — for tollgate and for a bare Pingora proxy (its
upgrade passthrough: the same Pingora, relaying the frames without reading them), against the
same mock in one run, with the ratios.

Starts the mock, the gateway (a build given as TOLLGATE_BIN, default target/release) and the bare
proxy (benches/relay/bare, built once into ~/.cache/tollgate-perf-bare-target; BARE_BIN another),
opens the sessions with the `websockets` client from .venv, and reads each proxy's resident
memory and CPU time from /proc. Usage, from the repository root:
    .venv/bin/python benches/realtime/sessions.py [sessions] [turns]
"""
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import websockets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "release", "tollgate"))
MOCK = os.environ.get("TOLLGATE_MOCK_BIN", os.path.join(os.path.dirname(BIN), "tollgate-mock"))
KEY = "sk-bench-realtime-000000000000000001"
CACHE = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
BARE = os.environ.get("BARE_BIN", os.path.join(CACHE, "tollgate-perf-bare-target", "release", "bare-pingora"))


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait(p):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", p), 0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {p} never opened")


def proc_stat(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def bare_binary():
    if not os.environ.get("BARE_BIN"):
        subprocess.run(["cargo", "build", "--release", "--manifest-path", os.path.join(ROOT, "benches", "relay", "bare", "Cargo.toml")],
                       env={**os.environ, "CARGO_TARGET_DIR": os.path.join(CACHE, "tollgate-perf-bare-target")}, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return BARE


async def measure(name, url, pid, sessions, turns):
    """Memory per idle session and CPU per relayed frame of the proxy `pid` at `url`."""
    auth = {"Authorization": f"Bearer {KEY}"}
    # Warm up: one session, one turn.
    async with websockets.connect(url, additional_headers=auth) as ws:
        await ws.recv()
    rss0, _ = proc_stat(pid)
    open_ = []
    for _ in range(sessions):
        ws = await websockets.connect(url, additional_headers=auth)
        await ws.recv()
        open_.append(ws)
    await asyncio.sleep(0.5)
    rss1, _ = proc_stat(pid)
    per = (rss1 - rss0) / sessions
    for ws in open_:
        await ws.close()
    # CPU per relayed frame: many turns on one session (each: the client's 2 frames, the
    # server's 6: item created, response created, three deltas, done).
    async with websockets.connect(url, additional_headers=auth) as ws:
        await ws.recv()
        _, cpu0 = proc_stat(pid)
        start = time.monotonic()
        frames = 0
        for _ in range(turns):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            frames += 2
            while True:
                ev = json.loads(await ws.recv())
                frames += 1
                if ev["type"] == "response.done":
                    break
        wall = time.monotonic() - start
        _, cpu1 = proc_stat(pid)
    us = (cpu1 - cpu0) / frames * 1e6
    print(f"{name:9} idle sessions {sessions}: RSS {rss0} -> {rss1} KiB = {per:.1f} KiB per open session; "
          f"{turns} turns, {frames} frames: CPU {cpu1 - cpu0:.2f} s = {us:.1f} us per frame (wall {wall:.1f} s)")
    return per, us


async def main(sessions, turns):
    tmp = tempfile.mkdtemp(prefix="tollgate-rt-bench-")
    mp, gp, bp = port(), port(), port()
    # The mock takes tollgate's upstream key and, for the bare proxy (which passes the client's
    # on), the client's.
    mock = subprocess.Popen([MOCK, "--listen", f"127.0.0.1:{mp}", "--key", f"mock-upstream-key,{KEY}"], stdout=subprocess.DEVNULL)
    procs = [mock]
    config = f"""
listen: 127.0.0.1:{gp}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/up.sock }}
limits: {{ max_connections_per_ip: 0, max_connections: 0, realtime_sessions_per_key: 100000 }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mp}", api_key: mock-upstream-key, models: [alpha-realtime] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-realtime: {{ input: 4.0, output: 16.0, cached_input: 0.4, audio_input: 32.0, audio_output: 64.0 }}
keys:
  - {{ key: {KEY}, name: bench, group: default, balance: 100000.0 }}
"""
    with open(f"{tmp}/t.yaml", "w") as f:
        f.write(config)
    path = "/v1/realtime?model=alpha-realtime"
    try:
        procs.append(subprocess.Popen([BIN, "-c", f"{tmp}/t.yaml"], env={**os.environ, "RUST_LOG": "error"}, stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen([bare_binary(), f"127.0.0.1:{bp}", f"127.0.0.1:{mp}", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        gw, bare = procs[1], procs[2]
        for p in (mp, gp, bp):
            wait(p)
        b_mem, b_cpu = await measure("bare", f"ws://127.0.0.1:{bp}{path}", bare.pid, sessions, turns)
        t_mem, t_cpu = await measure("tollgate", f"ws://127.0.0.1:{gp}{path}", gw.pid, sessions, turns)
        print(f"tollgate / bare Pingora: memory per idle session {t_mem / max(b_mem, 0.1):.2f}x, CPU per frame {t_cpu / max(b_cpu, 0.01):.2f}x")
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, int(sys.argv[2]) if len(sys.argv) > 2 else 2000))
