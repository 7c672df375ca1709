"""What a realtime session costs the gateway (issue 50): memory per open session, with N idle
sessions open at once, and CPU per relayed frame, both directions, over many short turns.

Starts the mock and the gateway (a build given as TOLLGATE_BIN, default target/release), opens
the sessions with the `websockets` client from .venv, and reads the gateway's resident memory
and CPU time from /proc. Usage, from the repository root:
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


async def main(sessions, turns):
    tmp = tempfile.mkdtemp(prefix="tollgate-rt-bench-")
    mp, gp = port(), port()
    mock = subprocess.Popen([MOCK, "--listen", f"127.0.0.1:{mp}", "--key", "mock-upstream-key"])
    wait(mp)
    config = f"""
listen: 127.0.0.1:{gp}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/up.sock }}
limits: {{ max_connections_per_ip: 0, max_connections: 0 }}
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
    gw = subprocess.Popen([BIN, "-c", f"{tmp}/t.yaml"], env={**os.environ, "RUST_LOG": "error"})
    wait(gp)
    url = f"ws://127.0.0.1:{gp}/v1/realtime?model=alpha-realtime"
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        # Warm up: one session, one turn.
        async with websockets.connect(url, additional_headers=auth) as ws:
            await ws.recv()
        rss0, _ = proc_stat(gw.pid)
        open_ = []
        for _ in range(sessions):
            ws = await websockets.connect(url, additional_headers=auth)
            await ws.recv()
            open_.append(ws)
        await asyncio.sleep(0.5)
        rss1, _ = proc_stat(gw.pid)
        per = (rss1 - rss0) / sessions
        print(f"idle sessions: {sessions}  gateway RSS {rss0} KiB -> {rss1} KiB  = {per:.1f} KiB per open session")
        for ws in open_:
            await ws.close()
        # CPU per relayed frame: many turns on one session (each: the client's 2 frames, the
        # server's 6: item created, response created, three deltas, done).
        async with websockets.connect(url, additional_headers=auth) as ws:
            await ws.recv()
            _, cpu0 = proc_stat(gw.pid)
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
            _, cpu1 = proc_stat(gw.pid)
        print(f"turns: {turns}  frames relayed: {frames}  gateway CPU {cpu1 - cpu0:.2f} s = {(cpu1 - cpu0) / frames * 1e6:.1f} us per frame (wall {wall:.1f} s, {frames / wall:.0f} frames/s, each turn billed)")
    finally:
        for p in (gw, mock):
            p.kill()
            p.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, int(sys.argv[2]) if len(sys.argv) > 2 else 2000))
