"""Starts tollgate-mock, tollgate (its clock a few seconds before a UTC midnight, through
libfaketime) and headless Chromium for the console's browser tests."""
import datetime
import email.utils
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pysupport import free_port, wait_listening  # noqa: E402

from console_env import (  # noqa: E402
    ADMIN_TOKEN,
    BIN_DIR,
    DAY_AFTER,
    DAY_BEFORE,
    FAKETIME_LIB,
    MIDNIGHT,
    OTHER_KEY,
    SHOTS,
    START,
    TEAM_KEY,
    UPSTREAM_KEY,
)


class Gateway:
    def __init__(self, port, admin_port):
        self.url = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        self.console = f"{self.admin}/console"
        # Filled by the fixture: (day, request id) of the chat requests made around midnight.
        self.midnight_requests = []

    def admin_json(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.admin + path, data=data, method=method)
        req.add_header("authorization", f"Bearer {ADMIN_TOKEN}")
        if data is not None:
            req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def key_by_name(self, name):
        return next(k for k in self.admin_json("GET", "/admin/keys")["data"] if k["name"] == name)

    def clock(self):
        """The gateway's clock (its `Date` header)."""
        with urllib.request.urlopen(self.admin + "/healthz", timeout=5) as r:
            return email.utils.parsedate_to_datetime(r.headers["Date"])

    def video(self, key, prompt):
        body = json.dumps({"model": "genq3-pro", "prompt": prompt}).encode()
        req = urllib.request.Request(self.url + "/v1/videos", data=body, method="POST")
        req.add_header("authorization", f"Bearer {key}")
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["id"]

    def chat(self, key, content="hi"):
        body = json.dumps({"model": "alpha-5.5", "messages": [{"role": "user", "content": content}]}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=body, method="POST")
        req.add_header("authorization", f"Bearer {key}")
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.headers["x-request-id"]


@pytest.fixture(scope="session")
def gateway():
    if not os.path.exists(FAKETIME_LIB):
        pytest.fail(f"libfaketime is needed ({FAKETIME_LIB}, Debian package faketime; tests/run_all.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="tollgate-console-")
    mock_port, gw_port, admin_port = free_port(), free_port(), free_port()
    # The wall clock starts at START and runs on; timers (the monotonic clock) stay real. The
    # mock's video service checks request signatures' times: it runs on the same clock.
    env = {**os.environ, "RUST_LOG": "warn", "LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"@{START}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    mock = subprocess.Popen(
        [os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY], env=env
    )
    wait_listening(mock_port, mock, "tollgate-mock")
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
billing: {{ timezone: UTC }}
console: {{ key_page: true }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai, video] }}
  resale: {{ platforms: [openai], price_multiplier: 1.25 }}
plans:
  - {{ name: starter, credit: 2.0, period: month, budgets: {{ "5h": 1.5 }} }}
accounts:
  - {{ name: acme, balance: 20.0, budgets: {{ "5h": 3.0, day: 8.0 }}, rpm: 100 }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
video:
  upstream: {{ base_url: "http://127.0.0.1:{mock_port}", secret_id: mock-tc-secret-id, secret_key: mock-tc-secret-key,
              region: ap-guangzhou, version: "2024-05-23", brand: Gen, rate_per_sec: 100 }}
  poll_interval_secs: 1
  prices: {{ genq3-pro: 0.05, genq2: 0.02, genq3-turbo: 0, genq3-pro-fast: 0, genq2-pro: 0, genq2-turbo: 0, genq2-pro-fast: 0 }}
keys:
  - {{ key: {TEAM_KEY}, name: team-a, group: default, balance: 10.0, tags: {{ team: a }}, budgets: {{ day: 5 }} }}
  - {{ key: {OTHER_KEY}, name: other-team, group: default, balance: 4.0, tags: {{ team: b }}, guardrails: [cards] }}
guardrails:
  - {{ name: cards, kind: pii, recognisers: [card], action: block }}
cache: {{}}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env=env)
    try:
        wait_listening(gw_port, gw, "tollgate")
        wait_listening(admin_port, gw, "tollgate admin")
        g = Gateway(gw_port, admin_port)
        # Requests on both sides of the UTC midnight: three before it, two after.
        for key in (TEAM_KEY, TEAM_KEY, OTHER_KEY):
            if g.clock() >= MIDNIGHT - datetime.timedelta(seconds=1):
                pytest.fail("the gateway reached midnight before the first requests were made")
            g.midnight_requests.append((DAY_BEFORE, g.chat(key)))
        while g.clock() < MIDNIGHT + datetime.timedelta(seconds=1):
            time.sleep(0.1)
        for key in (TEAM_KEY, OTHER_KEY):
            g.midnight_requests.append((DAY_AFTER, g.chat(key)))
        # Two video tasks of the other team: one that completes, one the upstream fails (and
        # tollgate refunds).
        g.video_ok = g.video(OTHER_KEY, "a lighthouse at dawn")
        g.video_failed = g.video(OTHER_KEY, "bad [fail]")
        yield g
    finally:
        for p in (gw, mock):
            p.kill()
            p.wait()


@pytest.fixture(scope="session")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    profile = tempfile.mkdtemp(prefix="tollgate-chromium-")
    options = Options()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    # The page itself (not the window around it) is 1280×800.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    os.makedirs(SHOTS, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
