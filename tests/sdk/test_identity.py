"""Clients authenticated by the identity provider (issue 51, point 4): the official `openai`
SDK with an access token of a real OpenID Connect provider (`oidc-provider` from the npm
registry, signed in through its authorization-code flow with PKCE) as its key, billed to the
person's own key and their team's account exactly; tokens that are tampered with, expired,
for another audience, from another issuer, unsigned or HMAC-signed refused; a person of no
team refused; a disabled person refused."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import openai
import pytest

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, claude_code, free_port, start_mock, start_tollgate
from pysupport.oidc import MODULES, OidcProvider

if not os.path.isdir(os.path.join(MODULES, "oidc-provider")) and not os.environ.get("TOLLGATE_OIDC_REQUIRED"):
    pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)", allow_module_level=True)

AUDIENCE = "https://tollgate.test/api"
ADMIN_TOKEN = "identity-admin-token-0123456789abcdef"
PEOPLE = {
    "ada": {"email": "ada@example.com", "roles": ["member"], "teams": ["research"]},
    "bob": {"email": "bob@example.com", "roles": ["member"], "teams": ["no-such-team"]},
    "cy": {"email": "cy@example.com", "roles": ["member"], "teams": ["research"]},
    "eve": {"email": "eve@example.com", "roles": ["member"], "teams": ["research"]},
    "fay": {"email": "fay@example.com", "roles": [], "teams": []},
    # Impostors of fay: her address as a name, or as an email the provider did not verify.
    "mallory": {"name": "FAY@EXAMPLE.COM", "roles": [], "teams": []},
    "trudy": {"email": "fay@example.com", "email_verified": False, "roles": [], "teams": []},
}


class Env:
    def __init__(self, gateway, admin, idp, mock):
        self.gateway, self.admin, self.idp, self.mock = gateway, admin, idp, mock

    def client(self, token):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=token, max_retries=0)

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)

    def key_of(self, name):
        """A person's key: named after what they show and their subject (`ada@example.com [ada]`)."""
        return next(k for k in self.admin_json("GET", "/admin/keys")["data"] if k["name"].split(" [")[0] == name)

    def account_balance(self, name):
        return round(self.admin_json("GET", f"/admin/accounts/{name}")["balance"] * 1e9)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-identity-")
    mock_port, gw_port, admin_port = free_port(), free_port(), free_port()
    procs = []
    idp = OidcProvider(PEOPLE, AUDIENCE)
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-haiku-4-5] }}
groups:
  default: {{ platforms: [openai, anthropic] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  beta-haiku-4-5: {{ input: 1.0, output: 5.0 }}
accounts:
  - {{ name: research, balance: 10.0 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, audience: "{AUDIENCE}", allowance: 1.0, clock_skew_secs: 0 }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port])
        procs.append(gw)
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", idp, f"http://127.0.0.1:{mock_port}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def nanos(tokens, usd_per_million):
    return (tokens * round(usd_per_million * 1e9) + 500_000) // 1_000_000


def b64(obj):
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def test_the_openai_sdk_with_an_access_token_is_billed_to_the_person_and_their_team(env):
    token = env.idp.access_token("ada")
    research_before = env.account_balance("research")
    client = env.client(token)
    r = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=20)
    cost = nanos(r.usage.prompt_tokens, 2.0) + nanos(r.usage.completion_tokens, 8.0)
    key = env.key_of("ada@example.com")
    assert key["account"] == "research" and key["group"] == "default", key
    assert key["tags"] == {"person": "ada@example.com [ada]", "team": "research"}, key
    # The person's key spent it, and their team's account with it.
    assert round(key["balance"] * 1e9) == 1_000_000_000 - cost
    assert env.account_balance("research") == research_before - cost
    audit = env.admin_json("GET", "/admin/audit")["data"]
    assert any(e["id"] == key["id"] and "ada@example.com [ada]" in (e.get("reason") or "") for e in audit), audit[:3]
    # The same person again: the same key, not a second one.
    client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "again"}], max_tokens=5)
    assert [k["name"] for k in env.admin_json("GET", "/admin/keys")["data"]].count("ada@example.com [ada]") == 1
    # Their usage, read with the token like any key.
    req = urllib.request.Request(env.gateway + "/v1/usage", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req) as u:
        usage = json.load(u)
    assert usage["key"]["name"] == "ada@example.com [ada]" and usage["total"]["requests"] == 2
    # The person's token never goes upstream: the provider's key does.
    with urllib.request.urlopen(env.mock + "/__mock/requests") as r:
        sent = json.load(r)
    assert sent and all(req["headers"]["authorization"] == [f"Bearer {UPSTREAM_KEY}"] for req in sent)
    assert token not in json.dumps(sent)


def test_tokens_that_are_not_the_providers_own_for_this_gateway_are_refused(env):
    good = env.idp.access_token("cy")
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    other_idp = OidcProvider(PEOPLE, AUDIENCE)
    try:
        foreign_issuer = other_idp.access_token("cy")
    finally:
        other_idp.stop()
    wrong_audience = env.idp.access_token("cy", resource="https://other.test/api")
    expiring = env.idp.access_token("cy", scope="openid email profile api short")
    time.sleep(2)
    forged = {
        "tampered": f"{header}.{b64({**claims, 'teams': ['research'], 'sub': 'ada'})}.{signature}",
        "expired": expiring,
        "wrong audience": wrong_audience,
        "wrong issuer": foreign_issuer,
        "unsigned": f"{b64({'alg': 'none', 'typ': 'JWT'})}.{payload}.",
        "hmac with the client secret": hmac_token(claims, env.idp.secret),
    }
    for what, token in forged.items():
        with pytest.raises(openai.AuthenticationError) as refused:
            env.client(token).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert "not accepted" in str(refused.value), what
    # The genuine one works, and only the genuine one made a key.
    env.client(good).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    names = [k["name"] for k in env.admin_json("GET", "/admin/keys")["data"]]
    assert names.count("cy@example.com [cy]") == 1


def hmac_token(claims, secret):
    import hashlib
    import hmac

    head = b64({"alg": "HS256", "typ": "JWT", "kid": "keystore-CHANGE-ME"})
    body = b64(claims)
    sig = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"


def test_a_person_of_no_team_here_is_refused_and_a_disabled_person_too(env):
    with pytest.raises(openai.PermissionDeniedError) as refused:
        env.client(env.idp.access_token("bob")).models.list()
    assert "no team" in str(refused.value)
    token = env.idp.access_token("ada")
    env.client(token).models.list()
    key = env.key_of("ada@example.com")
    env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"enabled": False})
    try:
        with pytest.raises(openai.AuthenticationError) as refused:
            env.client(token).models.list()
        assert "disabled" in str(refused.value)
    finally:
        env.admin_json("PATCH", f"/admin/keys/{key['id']}", {"enabled": True})


def test_claude_code_with_an_access_token_as_its_auth_token_is_billed_to_the_person(env, tmp_path):
    token = env.idp.access_token("eve")
    claude, work, run_env = claude_code(tmp_path, env.gateway, {"ANTHROPIC_AUTH_TOKEN": token})
    research = env.account_balance("research")
    out = subprocess.run([claude, "-p", "Say hello", "--model", "beta-opus-4-7"], cwd=work, env=run_env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "Hello from the" in out.stdout, out.stdout
    key = env.key_of("eve@example.com")
    spent = 1_000_000_000 - round(key["balance"] * 1e9)
    assert spent > 0 and env.account_balance("research") == research - spent, (key, spent)
    req = urllib.request.Request(env.gateway + "/v1/usage", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req) as u:
        usage = json.load(u)
    assert usage["key"]["name"] == "eve@example.com [eve]" and round(usage["total"]["cost"] * 1e9) == spent, usage


def test_a_person_an_operator_put_in_a_team_calls_on_it_without_a_claim(env):
    token = env.idp.access_token("fay")
    with pytest.raises(openai.PermissionDeniedError):
        env.client(token).models.list()
    env.admin_json("PATCH", "/admin/accounts/research", {"people": {"fay@example.com": "member"}})
    research = env.account_balance("research")
    r = env.client(token).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    cost = r.usage.prompt_tokens * 2000 + r.usage.completion_tokens * 8000
    assert env.key_of("fay@example.com")["account"] == "research"
    assert env.account_balance("research") == research - cost
    # Someone who only names themselves fay — a `name` claim, an email the provider did not
    # verify — is not her: refused, no key made for them on her team.
    for impostor in ("mallory", "trudy"):
        with pytest.raises(openai.PermissionDeniedError):
            env.client(env.idp.access_token(impostor)).models.list()
    assert not [k for k in env.admin_json("GET", "/admin/keys")["data"] if k["name"].endswith(("[mallory]", "[trudy]"))]
    # Taken out: refused again.
    env.admin_json("PATCH", "/admin/accounts/research", {"people": {"fay@example.com": None}})
    with pytest.raises(openai.PermissionDeniedError):
        env.client(token).models.list()


def test_a_members_key_without_an_allowance_draws_on_the_team_alone():
    # No `identity.oidc.allowance`: a person's key holds no money of its own and spends the
    # team's account (it was refused 402 "the key has $0.000000 available" before).
    tmp = tempfile.mkdtemp(prefix="tollgate-identity-team-")
    gw_port, admin_port = free_port(), free_port()
    idp = OidcProvider(PEOPLE, AUDIENCE)
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
accounts:
  - {{ name: research, balance: 0.10 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, audience: "{AUDIENCE}", clock_skew_secs: 0 }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port])
        procs.append(gw)
        env = Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", idp, f"http://127.0.0.1:{mock_port}")
        token = idp.access_token("ada")
        r = env.client(token).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        cost = nanos(r.usage.prompt_tokens, 2.0) + nanos(r.usage.completion_tokens, 8.0)
        assert env.account_balance("research") == 100_000_000 - cost
        key = env.key_of("ada@example.com")
        assert round(key["balance"] * 1e9) == -cost, "the key's own balance counts what it spent"
        # What the key can spend is the team's: /v1/usage says so.
        req = urllib.request.Request(env.gateway + "/v1/usage", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req) as u:
            assert round(json.load(u)["balance"] * 1e9) == 100_000_000 - cost
        # The team's account bounds it: emptied, the member is refused.
        env.admin_json("PATCH", "/admin/accounts/research", {"balance_delta": -0.10})
        with pytest.raises(openai.APIStatusError) as refused:
            env.client(token).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert refused.value.status_code == 402
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)
