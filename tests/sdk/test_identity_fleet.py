"""People's keys across a fleet (issue 51): two tollgate nodes on one real PostgreSQL server and
a real OpenID Connect provider. A person's access token and a key they made in the console,
used concurrently through both nodes, bill their team's account and their own allowance exactly
— once per answer, whichever node served it."""
import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import openai
import pytest
import requests

from conftest import BIN_DIR, UPSTREAM_KEY
import pysupport
from pysupport import free_port, start_mock, start_tollgate
from pysupport.oidc import MODULES, OidcProvider
from pysupport.postgres import Postgres

if not os.path.isdir(os.path.join(MODULES, "oidc-provider")) and not os.environ.get("TOLLGATE_OIDC_REQUIRED"):
    pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)", allow_module_level=True)

AUDIENCE = "https://tollgate.test/api"
ADMIN_TOKEN = "identity-fleet-admin-token-0123456789"
PEOPLE = {"ada": {"email": "ada@example.com", "roles": ["member"], "teams": ["research"]}}


def admin_json(admin, method, path, body=None):
    return pysupport.admin_json(admin, ADMIN_TOKEN, method, path, body)


@pytest.fixture(scope="module")
def fleet():
    pg = Postgres()
    tmp = tempfile.mkdtemp(prefix="tollgate-identity-fleet-")
    mock_port = free_port()
    ports = [(free_port(), free_port()) for _ in range(2)]
    idp = OidcProvider(PEOPLE, AUDIENCE, console_redirect=f"http://127.0.0.1:{ports[0][1]}/console/callback")
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        nodes = []
        for i, (gw_port, admin_port) in enumerate(ports):
            config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data{i}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
pingora: {{ threads: 2, pid_file: {tmp}/pid{i}, upgrade_sock: {tmp}/upgrade{i}.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
accounts:
  - {{ name: research, balance: 3.0 }}
billing: {{ commit_interval_ms: 20, sync_commit: true }}
store: {{ postgres: {{ url: "{pg.url}", pool_size: 4 }}, node_id: node-{i}, lease_secs: 4, sync_ms: 200 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, client_secret_env: OIDC_CONSOLE_SECRET, audience: "{AUDIENCE}", allowance: 2.0 }}
"""
            gw = start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port], env={"OIDC_CONSOLE_SECRET": idp.secret}, name=f"tollgate{i}.yaml")
            procs.append(gw)
            nodes.append((f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}"))
        yield nodes, idp
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def console_key(admin, idp, name):
    """Sign ada in to node 0's console through the provider and make a key there; its secret."""
    s = requests.Session()
    s.trust_env = False
    start = s.get(admin + "/console/oidc/start", allow_redirects=False)
    back = idp.follow_to(start.headers["location"], "ada", admin + "/console/callback")
    assert s.get(back, allow_redirects=False).status_code == 200
    me = s.get(admin + "/console/me").text
    csrf = me.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    created = s.post(admin + "/console/me/keys", data={"csrf": csrf, "name": name, "team": "research"}, allow_redirects=False)
    page = s.get(admin + created.headers["location"]).text
    return page.split('id="secret" readonly value="', 1)[1].split('"', 1)[0]


def test_a_persons_token_and_their_own_key_bill_the_team_exactly_through_two_nodes_at_once(fleet):
    nodes, idp = fleet
    token = idp.access_token("ada")
    secret = console_key(nodes[0][1], idp, "ada-fleet")
    # The person's token key is made at its first call; then everything at once, on both nodes.
    openai.OpenAI(base_url=nodes[1][0] + "/v1", api_key=token, max_retries=0).models.list()

    def call(i):
        base = nodes[i % 2][0]
        cred = token if i % 3 else secret
        r = openai.OpenAI(base_url=base + "/v1", api_key=cred, max_retries=0).chat.completions.create(
            model="alpha-5.5", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=20
        )
        return cred, r.usage.prompt_tokens * 2000 + r.usage.completion_tokens * 8000

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(call, range(48)))
    by_token = sum(c for cred, c in results if cred == token)
    by_key = sum(c for cred, c in results if cred == secret)
    assert by_token > 0 and by_key > 0
    keys = admin_json(nodes[0][1], "GET", "/admin/keys")["data"]
    ada_token_key = next(k for k in keys if k["name"] == "ada@example.com [ada]")
    ada_console_key = next(k for k in keys if k["name"] == "ada-fleet")
    # Every node books into the shared database: wait for both nodes' records to arrive.
    deadline = time.monotonic() + 20
    while True:
        research = round(admin_json(nodes[1][1], "GET", "/admin/accounts/research")["balance"] * 1e9)
        token_key = round(admin_json(nodes[1][1], "GET", f"/admin/keys/{ada_token_key['id']}")["balance"] * 1e9)
        console_balance = round(admin_json(nodes[1][1], "GET", f"/admin/keys/{ada_console_key['id']}")["balance"] * 1e9)
        state = (research, token_key, console_balance)
        want = (3_000_000_000 - by_token - by_key, 2_000_000_000 - by_token, 2_000_000_000 - by_key)
        if state == want:
            break
        assert time.monotonic() < deadline, f"balances {state}, expected {want}"
        time.sleep(0.2)
