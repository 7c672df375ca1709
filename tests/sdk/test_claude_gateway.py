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
    bad = requests.post(f"{env.gateway}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": "tgr_" + "x" * 43})
    assert (bad.status_code, bad.json()) == (401, {"error": "invalid_grant"})

    # A person in no team here is refused with a page that says so, and the device too.
    grant = device_flow(env)
    refused = env.approve(grant["verification_uri_complete"], "bob")
    assert refused.status_code == 403 and "no team" in refused.text
    assert poll(env, grant["device_code"]).json() == {"error": "access_denied"}
    # A device code that is not one of this gateway's.
    assert poll(env, "not-a-code").json() == {"error": "expired_token"}
