"""Alerts (issue 66): a key's spend window crossing each threshold and its balance falling low
are decided once, written to the outbox before they are sent, and delivered as Standard
Webhooks — verified here by the Standard Webhooks library itself. The receiver is down at
first: the attempts fail, the gateway is killed (-9), the receiver comes up, the gateway starts
again and delivers what was decided before the kill, once each. A plan's renewal is sent too."""
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
import standardwebhooks

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, free_port, start_mock, start_tollgate

KEY = "sk-notify-0001-0123456789"
TOKEN = "notify-admin-token-0001"
SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"


class Receiver:
    """An HTTP receiver of webhooks: each one verified with the Standard Webhooks library."""

    def __init__(self, port):
        self.port, self.got, self.lock, self.server = port, [], threading.Lock(), None
        self.verifier = standardwebhooks.Webhook(SECRET)

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                payload = receiver.verifier.verify(body, headers)  # raises on a bad signature
                with receiver.lock:
                    receiver.got.append((headers["webhook-id"], payload))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def of(self, kind, **data):
        with self.lock:
            return [(i, p) for i, p in self.got if p["type"] == kind and all(p["data"].get(k) == v for k, v in data.items())]

    def until(self, kind, timeout=30, **data):
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.of(kind, **data)
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {kind} {data} arrived; got {self.got}")


def config(tmp, gw_port, admin_port, mock_port, hook_port):
    return f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: 127.0.0.1:{admin_port}, token: {TOKEN} }}
forward_headers: ["x-mock-*"]
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-5.5: {{ input: 0, output: 10.0 }}
plans:
  - {{ name: daily, credit: 0.25, period: day }}
notifications:
  - {{ name: ops, url: "http://127.0.0.1:{hook_port}/hook", secret_env: HOOK_SECRET, events: [budget.threshold, balance.low, plan.renewed], thresholds: [0.5, 0.9], balance_below: 0.6 }}
keys:
  - {{ key: {KEY}, name: watched, group: default, balance: 1.0, budgets: {{ day: 1.0 }} }}
"""


def spend(gw_port, output_tokens):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw_port}/v1", api_key=KEY, max_retries=0)
    client.chat.completions.create(model="alpha-5.5", max_tokens=output_tokens, messages=[{"role": "user", "content": "hi"}],
                                   extra_headers={"x-mock-usage": f"0,{output_tokens}"})


def test_alerts_are_decided_once_kept_across_a_kill_and_delivered_signed_once_the_receiver_is_up():
    tmp = tempfile.mkdtemp(prefix="tollgate-notify-")
    gw_port, admin_port, hook_port = free_port(), free_port(), free_port()
    receiver = Receiver(hook_port)
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        text = config(tmp, gw_port, admin_port, mock_port, hook_port)
        gw = start_tollgate(BIN_DIR, tmp, text, [gw_port, admin_port], env={"HOOK_SECRET": SECRET})
        admin = f"http://127.0.0.1:{admin_port}"
        key_id = next(k["id"] for k in admin_json(admin, TOKEN, "GET", "/admin/keys")["data"] if k["name"] == "watched")
        # $0.55 of the $1 day: past 50 %, and the balance below $0.60.
        spend(gw_port, 55_000)
        # Decided and tried while the receiver is down: kept, failing.
        deadline = time.time() + 30
        while True:
            alerts = admin_json(admin, TOKEN, "GET", f"/admin/alerts?owner={key_id}")["data"]
            kinds = sorted(a["type"] for a in alerts if a["attempts"] >= 1)
            if kinds == ["balance.low", "budget.threshold"]:
                break
            assert time.time() < deadline, alerts
            time.sleep(0.1)
        assert all(a["status"] == "pending" and a["last_error"] == "unreachable" for a in alerts), alerts
        # Killed; the receiver comes up; started again: what was decided before is delivered.
        gw.kill()
        gw.wait()
        receiver.start()
        gw = start_tollgate(BIN_DIR, tmp, text, [gw_port, admin_port], env={"HOOK_SECRET": SECRET})
        procs.append(gw)
        threshold = receiver.until("budget.threshold", window="day", threshold=0.5)
        low = receiver.until("balance.low")
        assert threshold[0][1]["data"]["whose"]["key_id"] == key_id and threshold[0][1]["data"]["spent"] == 0.55
        assert low[0][1]["data"]["balance"] == pytest.approx(0.45)
        # Crossing 90 % later is its own alert; by the time it arrives, the others were looked at
        # again and not sent twice.
        spend(gw_port, 36_000)
        receiver.until("budget.threshold", window="day", threshold=0.9)
        assert len(receiver.of("budget.threshold", window="day", threshold=0.5)) == 1
        assert len(receiver.of("balance.low")) == 1
        ids = [i for i, _ in receiver.got]
        assert len(ids) == len(set(ids)), "each alert delivered once"
        delivered = admin_json(admin, TOKEN, "GET", f"/admin/alerts?owner={key_id}")["data"]
        first = [a for a in delivered if a["type"] == "budget.threshold" and a["data"]["threshold"] == 0.5]
        assert first[0]["status"] == "delivered" and first[0]["attempts"] >= 2, first
        # A plan assigned: its credit granted, its renewal sent.
        admin_json(admin, TOKEN, "PATCH", f"/admin/keys/{key_id}", {"plan": "daily"})
        renewed = receiver.until("plan.renewed", plan="daily")
        assert renewed[0][1]["data"]["credit"] == 0.25
    finally:
        receiver.stop()
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_bad_notification_is_refused_naming_its_field():
    import subprocess
    tmp = tempfile.mkdtemp(prefix="tollgate-notify-bad-")
    try:
        text = config(tmp, free_port(), free_port(), 1, 2).replace("events: [budget.threshold", "events: [budget.thresh")
        path = os.path.join(tmp, "bad.yaml")
        with open(path, "w") as f:
            f.write(text)
        checked = subprocess.run([os.path.join(BIN_DIR, "tollgate"), "-t", "-c", path], env={**os.environ, "HOOK_SECRET": SECRET},
                                 capture_output=True, text=True)
        assert checked.returncode != 0 and "notifications[0].events" in checked.stderr + checked.stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
