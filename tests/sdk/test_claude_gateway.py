"""Claude Code signs in to tollgate (issue 68): the gateway protocol (version 1) with a real
OpenID Connect provider (`oidc-provider` from npm), driven first over HTTP as the client and a
browser drive it, then by the real Claude Code client — its interactive `/login` in a
pseudo-terminal with the managed-settings file given to its process alone (a private mount
namespace), `$BROWSER` a script that approves in the page — then `claude -p` answered and
billed to the person's key, the token refreshed, managed settings fetched and a 304 after,
a team's model rules and a disabled person refused in the protocol's terms, and the client's
OTLP exports arriving at a collector with the person's identity."""
import base64
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import pytest
import requests

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, claude_code, free_port, start_mock, start_tollgate
from pysupport.oidc import MODULES, OidcProvider

if not os.path.isdir(os.path.join(MODULES, "oidc-provider")) and not os.environ.get("TOLLGATE_OIDC_REQUIRED"):
    pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)", allow_module_level=True)

AUDIENCE = "https://tollgate.test/api"
ADMIN_TOKEN = "claude-gateway-admin-token-0123456789"
PEOPLE = {
    "ada": {"email": "ada@example.com", "roles": ["member"], "teams": ["research"]},
    "bob": {"email": "bob@example.com", "roles": ["member"], "teams": ["nowhere"]},
    "cy": {"email": "cy@example.com", "roles": ["member"], "teams": ["research"]},
    "dee": {"email": "dee@example.com", "roles": ["member"], "teams": ["ops"]},
}
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class Collector:
    """An OTLP/HTTP collector: keeps what is posted to /v1/{logs,metrics,traces}."""

    def __init__(self):
        self.posts = []
        self.arrived = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with outer.arrived:
                    outer.posts.append((self.path, self.headers.get("content-type", ""), body))
                    outer.arrived.notify_all()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, predicate, timeout=60):
        with self.arrived:
            return self.arrived.wait_for(lambda: any(predicate(p) for p in self.posts), timeout)


class Env:
    def __init__(self, gateway, admin, idp, collector, mock):
        self.gateway, self.admin, self.idp, self.collector, self.mock = gateway, admin, idp, collector, mock

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)

    def key_of(self, login):
        return next(k for k in self.admin_json("GET", "/admin/keys")["data"] if k["name"].endswith(f"[{login}]"))

    def metric(self, name, **labels):
        text = requests.get(f"{self.admin}/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).text
        want = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(w in line for w in want):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def approve(self, verification_uri_complete, login, session=None):
        """What a person does in the browser: open the link, check the code, continue, sign in
        at the provider; the gateway's last page."""
        s = session or requests.Session()
        page = s.get(verification_uri_complete)
        assert page.status_code == 200, page.text
        code = re.search(r'name="user_code" value="([^"]*)"', page.text).group(1)
        r = s.post(f"{self.gateway}/device", data={"user_code": code}, headers={"sec-fetch-site": "same-origin"}, allow_redirects=False)
        assert r.status_code == 303, r.text
        back = self.idp.follow_to(r.headers["location"], login, f"{self.gateway}/oauth/callback", s)
        return s.get(back)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-claude-gateway-")
    gw_port, admin_port = free_port(), free_port()
    procs = []
    idp = OidcProvider(PEOPLE, AUDIENCE, extra_redirects=[f"http://127.0.0.1:{gw_port}/oauth/callback"])
    collector = Collector()
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-haiku-4-5] }}
groups:
  default: {{ platforms: [anthropic] }}
prices:
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  beta-haiku-4-5: {{ input: 1.0, output: 5.0 }}
accounts:
  - {{ name: research, balance: 10.0 }}
  - {{ name: ops, balance: 10.0 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, client_secret_env: OIDC_SECRET, audience: "{AUDIENCE}", clock_skew_secs: 0 }}
  claude_code:
    token_ttl: 3m
    settings:
      default: {{ cleanupPeriodDays: 20, env: {{ TOLLGATE_POLICY: default }} }}
      teams:
        research: {{ env: {{ TOLLGATE_POLICY: research }}, permissions: {{ deny: [WebFetch] }} }}
    telemetry: {{ endpoint: "{collector.url}" }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port], env={"OIDC_SECRET": idp.secret})
        procs.append(gw)
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", idp, collector, f"http://127.0.0.1:{mock_port}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        collector.server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def device_flow(env):
    r = requests.post(f"{env.gateway}/oauth/device_authorization", data="", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    return r.json()


def poll(env, device_code):
    return requests.post(f"{env.gateway}/oauth/token", data={"grant_type": DEVICE_GRANT, "device_code": device_code})


def test_the_protocols_device_flow_refresh_and_refusals_over_http(env):
    meta = requests.get(f"{env.gateway}/.well-known/oauth-authorization-server").json()
    assert meta["gateway_protocol_version"] == 1
    assert meta["device_authorization_endpoint"] == f"{env.gateway}/oauth/device_authorization"
    assert meta["token_endpoint"] == f"{env.gateway}/oauth/token"
    assert meta["token_endpoint_auth_methods_supported"] == ["none"]
    assert set(meta["grant_types_supported"]) == {DEVICE_GRANT, "refresh_token"}

    grant = device_flow(env)
    assert re.fullmatch(r"[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}", grant["user_code"]), grant
    assert (grant["expires_in"], grant["interval"]) == (600, 5)
    assert grant["verification_uri_complete"].endswith(urllib.parse.quote(grant["user_code"]))
    assert poll(env, grant["device_code"]).json() == {"error": "authorization_pending"}
    # Polling faster than the interval: slow down.
    assert poll(env, grant["device_code"]).json() == {"error": "slow_down"}

    # The page: the code pre-filled in a form that nothing submits by itself.
    page = requests.get(grant["verification_uri_complete"])
    assert f'value="{grant["user_code"]}"' in page.text and "<script" not in page.text.lower()
    # A form posted from another site is refused, and a code that was never issued too.
    cross = requests.post(f"{env.gateway}/device", data={"user_code": grant["user_code"]}, headers={"sec-fetch-site": "cross-site"}, allow_redirects=False)
    assert cross.status_code == 400 and "another site" in cross.text
    unknown = requests.post(f"{env.gateway}/device", data={"user_code": "BCDF-GHJK"}, headers={"sec-fetch-site": "same-origin"}, allow_redirects=False)
    assert unknown.status_code == 400 and "not recognized" in unknown.text
    # The callback in a browser that did not begin the sign-in is refused.
    s = requests.Session()
    r = s.post(f"{env.gateway}/device", data={"user_code": grant["user_code"]}, headers={"sec-fetch-site": "same-origin"}, allow_redirects=False)
    back = env.idp.follow_to(r.headers["location"], "ada", f"{env.gateway}/oauth/callback", s)
    stranger = requests.get(back)
    assert stranger.status_code == 400 and "another browser" in stranger.text
    done = s.get(back)
    assert done.status_code == 200 and "signed in" in done.text.lower(), done.text
    time.sleep(5)  # the client's interval between polls (RFC 8628 §3.5)
    tokens = poll(env, grant["device_code"])
    assert tokens.status_code == 200, tokens.text
    t = tokens.json()
    assert (t["token_type"], t["expires_in"]) == ("Bearer", 180) and t["refresh_token"].startswith("tgr_")
    claims = json.loads(base64.urlsafe_b64decode(t["access_token"].split(".")[1] + "=="))
    assert (claims["sub"], claims["email"], claims["groups"]) == ("ada", "ada@example.com", ["research"])
    assert claims["exp"] - claims["iat"] == 180
    # An approved code is exchanged once.
    time.sleep(5)
    assert poll(env, grant["device_code"]).json() == {"error": "expired_token"}

    # The token calls as ada's own key; a refresh gives a new token.
    headers = {"authorization": f"Bearer {t['access_token']}", "anthropic-version": "2023-06-01"}
    msg = requests.post(f"{env.gateway}/v1/messages", headers=headers, json={"model": "beta-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert msg.status_code == 200, msg.text
    r = requests.post(f"{env.gateway}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": t["refresh_token"]})
    assert r.status_code == 200, r.text
    assert r.json()["access_token"] != t["access_token"]
    # The team's settings set through the admin API (the console's form) go over the file's.
    fresh = {"authorization": f"Bearer {r.json()['access_token']}"}
    before = requests.get(f"{env.gateway}/managed/settings", headers=fresh)
    assert before.json()["settings"]["env"] == {"TOLLGATE_POLICY": "research"}
    env.admin_json("PATCH", "/admin/accounts/research", {"claude_code": {"env": {"TOLLGATE_POLICY": "console"}, "includeCoAuthoredBy": False}})
    after = requests.get(f"{env.gateway}/managed/settings", headers={**fresh, "if-none-match": before.headers["etag"]})
    assert after.status_code == 200 and after.headers["etag"] != before.headers["etag"], after.text
    assert after.json()["settings"]["env"] == {"TOLLGATE_POLICY": "console"} and after.json()["settings"]["includeCoAuthoredBy"] is False
    assert after.json()["settings"]["permissions"] == {"deny": ["WebFetch"]}
    env.admin_json("PATCH", "/admin/accounts/research", {"claude_code": None})
    assert requests.get(f"{env.gateway}/managed/settings", headers={**fresh, "if-none-match": before.headers["etag"]}).status_code == 304
    bad = requests.post(f"{env.gateway}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": "tgr_" + "x" * 43})
    assert (bad.status_code, bad.json()) == (401, {"error": "invalid_grant"})

    # A person in no team here is refused with a page that says so, and the device too.
    grant = device_flow(env)
    refused = env.approve(grant["verification_uri_complete"], "bob")
    assert refused.status_code == 403 and "no team" in refused.text
    assert poll(env, grant["device_code"]).json() == {"error": "access_denied"}
    # A device code that is not one of this gateway's.
    assert poll(env, "not-a-code").json() == {"error": "expired_token"}


# --- The real client -------------------------------------------------------------------------

def as_root_in_a_mount_namespace():
    """`unshare` arguments that give a process a private mount namespace (as root, or in a user
    namespace where it is root)."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is missing")
    return ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-r", "-m", "--propagation", "private"]


class Terminal:
    """Claude Code's TUI in a pseudo-terminal: what it drew (escape sequences removed) and keys."""

    def __init__(self, argv, env, cwd):
        import fcntl
        import pty
        import struct
        import termios

        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.seen = b""

    def text(self):
        t = re.sub(rb"\x1b\[[0-9]*C", b" ", self.seen)
        t = re.sub(rb"\x1b\[[0-9;?<>]*[a-zA-Z]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>]", b"", t)
        return re.sub(r"\s+", "", t.decode("utf-8", "replace"))

    def wait_for(self, words, timeout=60):
        """Read until the screen shows `words` (compared without spaces); the screen text."""
        import select

        want = re.sub(r"\s+", "", words)
        end = time.time() + timeout
        while time.time() < end:
            if want in self.text():
                return self.text()
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:
                    break
        raise AssertionError(f"the terminal never showed {words!r}; it shows: ...{self.text()[-1500:]}")

    def press(self, keys):
        self.seen = b""
        os.write(self.fd, keys.encode())

    def close(self):
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        os.close(self.fd)


def login(env, tmp_path, who):
    """The interactive `/login` of Claude Code, as `who`: the managed-settings file that names
    the gateway is given to this process alone (bind-mounted over /etc/claude-code in a private
    mount namespace), `$BROWSER` approves in the page. Its home, working directory and the
    environment of later runs."""
    claude, work, run_env = claude_code(tmp_path, env.gateway, {})
    home = tmp_path / "home"
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "managed-settings.json").write_text(json.dumps({"forceLoginMethod": "gateway", "forceLoginGatewayUrl": env.gateway}))
    # No onboarding: the client's connectivity check of its own service has no network here.
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True, "theme": "dark", "numStartups": 1}))
    browser = tmp_path / "browser.sh"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    browser.write_text(f"#!/bin/sh\nexec {sys.executable} {here}/pysupport/browser_approve.py \"$@\"\n")
    browser.chmod(0o755)
    log = tmp_path / "browser.log"
    unshare = as_root_in_a_mount_namespace()
    try:
        # The mount point (an empty folder): what is mounted on it is seen by this process alone.
        os.makedirs("/etc/claude-code", exist_ok=True)
    except PermissionError:
        pytest.skip("/etc/claude-code is missing and cannot be made (not root): the managed-settings file has no mount point")
    tui_env = {k: v for k, v in run_env.items() if not k.startswith("ANTHROPIC_")}
    tui_env.update({"TERM": "xterm-256color", "BROWSER": str(browser), "TOLLGATE_TEST_LOGIN": who, "TOLLGATE_TEST_BROWSER_LOG": str(log)})
    tui_env.pop("NO_COLOR", None)
    term = Terminal(unshare + ["sh", "-c", f"mount --bind {policy} /etc/claude-code && exec {claude}"], tui_env, work)
    try:
        term.wait_for("Yes, I trust this folder")
        term.press("\r")
        term.wait_for("Run /login")
        term.press("/login")
        term.wait_for("/login")
        term.press("\r")
        term.wait_for(f"set by managed settings")
        term.wait_for(env.gateway)
        term.press("\r")
        # First contact: the client asks to trust the gateway (plain http on loopback: no certificate).
        term.wait_for("Trust gateway 127.0.0.1?")
        term.wait_for("No, go back")
        # "No" is chosen first: up to "Yes" (pressed again until the selection is seen on it).
        for _ in range(10):
            term.press("\x1b[A")
            try:
                term.wait_for("❯ Yes, trust this gateway", timeout=2)
                break
            except AssertionError:
                continue
        term.press("\r")
        term.wait_for("Connected to Cloud gateway", timeout=90)
    finally:
        term.close()
    assert log.read_text().split()[-1] == "200", log.read_text()
    creds = json.loads((home / ".claude" / ".credentials.json").read_text())
    assert creds["enterpriseGateway"]["url"] == env.gateway
    run_env = {k: v for k, v in run_env.items() if k not in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")}
    return claude, work, run_env, creds


def usage(env, token):
    r = requests.get(f"{env.gateway}/v1/usage", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()


PRICES = {"beta-opus-4-7": (3.0, 15.0), "beta-haiku-4-5": (1.0, 5.0)}


def exact_cost(u):
    return sum(m["input_tokens"] * round(PRICES[m["model"]][0] * 1000) + m["output_tokens"] * round(PRICES[m["model"]][1] * 1000) for m in u["models"])


def resource_attributes(path, body):
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    kind = {"/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, "resource_logs"),
            "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, "resource_metrics"),
            "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, "resource_spans")}[path]
    msg = kind[0]()
    msg.ParseFromString(body)
    return [{a.key: a.value.string_value for a in r.resource.attributes} for r in getattr(msg, kind[1])]


def test_claude_code_signs_in_through_the_browser_and_calls_refreshes_fetches_settings_and_sends_telemetry(env, tmp_path):
    claude, work, run_env, creds = login(env, tmp_path, "ada")
    research = round(env.admin_json("GET", "/admin/accounts/research")["balance"] * 1e9)
    before = usage(env, creds["enterpriseGateway"]["jwt"])
    refreshes = env.metric("tollgate_signin_total", step="refresh", outcome="issued")
    settings_200 = env.metric("tollgate_requests_total", route="managed_settings", status="200")
    # The operator's settings push the telemetry switches (the exporter itself is locked to the gateway).
    telemetry = {"CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "otlp",
                 "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_LOGS_EXPORT_INTERVAL": "1000"}
    out = subprocess.run([claude, "-p", "Say hello", "--model", "beta-opus-4-7"], cwd=work, env={**run_env, **telemetry},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "Hello from the" in out.stdout, out.stdout
    # (b) The token lives 3 minutes, inside the client's 5-minute margin: it refreshed before calling.
    assert env.metric("tollgate_signin_total", step="refresh", outcome="issued") > refreshes
    stored = json.loads((tmp_path / "home" / ".claude" / ".credentials.json").read_text())["enterpriseGateway"]
    assert stored["jwt"] != creds["enterpriseGateway"]["jwt"]
    # Billed to ada's own key and her team, exactly.
    u = usage(env, stored["jwt"])
    assert u["key"]["name"] == "ada@example.com [ada]", u
    spent = exact_cost(u) - exact_cost(before)
    assert spent > 0 and round(u["total"]["cost"] * 1e9) - round(before["total"]["cost"] * 1e9) == spent, u
    assert round(env.admin_json("GET", "/admin/accounts/research")["balance"] * 1e9) == research - spent
    # (c) Managed settings: research's, with the models from ada's key; the client saved them.
    assert env.metric("tollgate_requests_total", route="managed_settings", status="200") == settings_200 + 1
    saved = json.loads((tmp_path / "home" / ".claude" / "remote-settings.json").read_text())
    assert saved["env"] == {"TOLLGATE_POLICY": "research"} and saved["permissions"] == {"deny": ["WebFetch"]}, saved
    assert saved["availableModels"] == ["beta-opus-4-7", "beta-haiku-4-5"] and saved["cleanupPeriodDays"] == 20
    # (f) The client's exports reached the collector, each resource naming ada.
    assert env.collector.wait_for(lambda p: p[0] in ("/v1/logs", "/v1/metrics")), env.collector.posts
    for path, ctype, body in list(env.collector.posts):
        assert ctype == "application/x-protobuf"
        for attrs in resource_attributes(path, body):
            assert (attrs["enduser.id"], attrs["user.email"], attrs["tollgate.team"]) == ("ada", "ada@example.com", "research"), attrs
            assert attrs.get("service.name") == "claude-code", attrs
    # A second run: the settings are unchanged, the client's checksum matches ours: 304.
    not_modified = env.metric("tollgate_requests_total", route="managed_settings", status="304")
    out = subprocess.run([claude, "-p", "Say hello again", "--model", "beta-haiku-4-5"], cwd=work, env=run_env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert env.metric("tollgate_requests_total", route="managed_settings", status="304") == not_modified + 1

    # (d) ada's rules allow haiku only: opus is refused in the protocol's terms.
    key = env.key_of("ada")
    env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"models": {"allow": ["beta-haiku-4-5"]}})
    token = json.loads((tmp_path / "home" / ".claude" / ".credentials.json").read_text())["enterpriseGateway"]["jwt"]
    headers = {"authorization": f"Bearer {token}", "anthropic-version": "2023-06-01"}
    body = {"model": "beta-opus-4-7", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = requests.post(f"{env.gateway}/v1/messages", headers=headers, json=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    # The managed settings follow the rules: the signed-in client offers haiku alone.
    settings = requests.get(f"{env.gateway}/managed/settings", headers=headers).json()["settings"]
    assert settings["availableModels"] == ["beta-haiku-4-5"] and settings["model"] == "beta-haiku-4-5"
    # The client in gateway mode with ada's token (no settings to hold it back) asks for opus:
    # the gateway's 400 reaches the person as the protocol's error, with the gateway's message.
    refused = env.metric("tollgate_requests_total", route="messages", status="400")
    gateway_mode = {**run_env, "CLAUDE_CODE_USE_GATEWAY": "1", "ANTHROPIC_BASE_URL": env.gateway, "ANTHROPIC_AUTH_TOKEN": token}
    out = subprocess.run([claude, "-p", "Say hello", "--model", "beta-opus-4-7"], cwd=work, env=gateway_mode,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "may not call the model 'beta-opus-4-7'" in out.stdout, (out.stdout, out.stderr)
    assert env.metric("tollgate_requests_total", route="messages", status="400") > refused
    # A spent window: 429 billing_error, not to be retried.
    env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"models": None, "budgets": {"day": 0.000001}})
    body["model"] = "beta-haiku-4-5"
    requests.post(f"{env.gateway}/v1/messages", headers=headers, json=body)
    r = requests.post(f"{env.gateway}/v1/messages", headers=headers, json=body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "billing_error" and r.headers["x-should-retry"] == "false", r.text
    env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"budgets": None})


def test_a_disabled_person_is_refused_at_the_next_request_and_cannot_refresh(env, tmp_path):
    claude, work, run_env, creds = login(env, tmp_path, "cy")
    out = subprocess.run([claude, "-p", "Say hello", "--model", "beta-haiku-4-5"], cwd=work, env=run_env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "Hello from the" in out.stdout, (out.stdout, out.stderr)
    stored = json.loads((tmp_path / "home" / ".claude" / ".credentials.json").read_text())["enterpriseGateway"]
    key = env.key_of("cy")
    env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"enabled": False})
    # The token has not expired; the next request is refused all the same.
    headers = {"authorization": f"Bearer {stored['jwt']}", "anthropic-version": "2023-06-01"}
    r = requests.post(f"{env.gateway}/v1/messages", headers=headers, json={"model": "beta-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    r = requests.post(f"{env.gateway}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": stored["idpRefreshToken"]})
    assert (r.status_code, r.json()) == (401, {"error": "invalid_grant"})
    out = subprocess.run([claude, "-p", "Say hello", "--model", "beta-haiku-4-5"], cwd=work, env=run_env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "Hello from the" not in out.stdout, (out.stdout, out.stderr)
