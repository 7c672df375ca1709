"""The MCP gateway (issue 52) with the official MCP Python SDK on both sides: two real servers
behind tollgate (`mcp_server.py`, MCPServer over Streamable HTTP; `docs` wants a bearer token,
`calc` does not and goes down mid-test) and a real client through tollgate's `/mcp` with a
gateway key. Shown: the handshake, the union of tools named server__tool (each server's and
each key's rules applied), calls with the server's credentials (never the client's key),
progress notifications as they come, resources and prompts per server, per-call billing to
the nano-dollar, a denied tool, a tool rate limit, another key's view and sessions, a server
that is down left out while the other's tools are listed, the client's session going on
across a server's restart, and each call in the request log and the metrics."""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import shutil
import urllib.error
import urllib.request

import httpx2
import mcp
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, claude_code, free_port, start_mock, start_tollgate, wait_listening

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "sk-mcp-all-0001-0123456789"
CALC_ONLY = "sk-mcp-calc-0001-0123456789"
SOME_TOOLS = "sk-mcp-some-0001-0123456789"
ADMIN_TOKEN = "mcp-admin-token-0123456789abcdef"
DOCS_TOKEN = "docs-server-secret-token-42"
PER_CALL = 0.0125
# A plain `initialize` of the 2025-06-18 revision, for tests that speak the protocol by hand.
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def start_server(name, port, token=None, transport="streamable-http", chatty=False):
    args = [sys.executable, os.path.join(HERE, "mcp_server.py"), name, str(port), "--transport", transport]
    if chatty:
        args.append("--chatty")
    if token:
        args += ["--token", token]
    proc = subprocess.Popen(args)
    wait_listening(port, proc, f"MCP server {name}")
    return proc


class Env:
    def __init__(self, gateway, admin, calc_port):
        self.gateway, self.admin, self.calc_port = gateway, admin, calc_port
        self.calc = None

    def client(self, key=KEY, mode="auto"):
        """The SDK's client with `key`: mode `auto` probes and takes the stateless 2026-07-28,
        `legacy` makes the initialize handshake (2025-11-25, with a session)."""
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
        return mcp.Client(streamable_http_client(self.gateway + "/mcp", http_client=http), mode=mode)

    def balance(self, key=KEY):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-mcp-")
    docs_port, calc_port, gw_port, admin_port = free_port(), free_port(), free_port(), free_port()
    procs = []
    e = None
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        procs.append(start_server("docs", docs_port, token=DOCS_TOKEN))
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-haiku-4-5] }}
prices:
  alpha-5.5: {{ input: 1.0, output: 4.0 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  beta-haiku-4-5: {{ input: 1.0, output: 5.0 }}
mcp:
  allowed_origins: ["http://localhost:5173"]
  servers:
    - name: docs
      url: http://127.0.0.1:{docs_port}/mcp
      auth: {{ bearer_env: DOCS_TOKEN }}
      tools: {{ deny: [drop_everything] }}
      prices: {{ per_call: {PER_CALL} }}
    - {{ name: calc, url: "http://127.0.0.1:{calc_port}/mcp", timeout_secs: 20 }}
keys:
  - {{ key: {KEY}, name: all-tools, balance: 1.0 }}
  - {{ key: {CALC_ONLY}, name: calc-only, balance: 1.0, tools: {{ allow: ["calc__*"], deny: [calc__drop_everything] }} }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port], env={"DOCS_TOKEN": DOCS_TOKEN}))
        e = Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", calc_port)
        e.calc = start_server("calc", calc_port)
        yield e
    finally:
        if e is not None and e.calc is not None:
            procs.append(e.calc)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=["auto", "legacy"])
def mode(request):
    """Both eras of the protocol: the stateless revision and the handshake."""
    return request.param


def texts(result):
    return [c.text for c in result.content]


def test_a_client_lists_calls_with_progress_reads_and_gets_through_one_endpoint(env, mode):
    async def run():
        progress = []

        async def on_progress(done, total, message):
            progress.append((done, total, message))

        async with env.client(mode=mode) as client:
            assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            # What the servers can do together (their sessions made at once), no change notices.
            caps = client.server_capabilities
            assert caps.tools is not None and caps.prompts is not None and caps.resources is not None
            assert not caps.tools.list_changed and not caps.resources.subscribe
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            # docs hides drop_everything (its server's rules); calc shows it.
            assert tools == ["calc__broken", "calc__count_calls", "calc__drop_everything", "calc__search", "calc__slow",
                             "docs__broken", "docs__count_calls", "docs__search", "docs__slow"], tools
            found = await client.call_tool("docs__search", {"query": "toll roads"})
            assert texts(found) == ["docs found 'toll roads'"] and not found.is_error
            slow = await client.call_tool("calc__slow", {"n": 3}, progress_callback=on_progress)
            assert texts(slow) == ["calc did 3 steps"]
            resources = sorted(str(r.uri) for r in (await client.list_resources()).resources)
            assert resources == ["calc://readme", "docs://readme"]
            read = await client.read_resource("docs://readme")
            assert read.contents[0].text == "The readme of docs."
            prompts = sorted(p.name for p in (await client.list_prompts()).prompts)
            assert prompts == ["calc__summarize", "docs__summarize"]
            prompt = await client.get_prompt("docs__summarize", {"topic": "tolls"})
            assert prompt.messages[0].content.text == "Summarize tolls for docs."
        return progress

    progress = asyncio.run(run())
    assert [(d, t) for d, t, _ in progress] == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)], progress


def test_each_server_gets_its_own_credentials_and_never_the_clients_key(env):
    async def run():
        async with env.client() as client:
            docs = json.loads(texts(await client.call_tool("docs__count_calls", {}))[0])
            calc = json.loads(texts(await client.call_tool("calc__count_calls", {}))[0])
        return docs, calc

    docs, calc = asyncio.run(run())
    assert docs["authorization"] == [f"Bearer {DOCS_TOKEN}"], docs
    assert calc["authorization"] == [""], calc


def test_a_call_is_billed_its_servers_price_exactly_and_a_free_servers_nothing(env, mode):
    async def run():
        async with env.client(mode=mode) as client:
            before = env.balance()
            await client.call_tool("docs__search", {"query": "one"})
            await client.call_tool("docs__search", {"query": "two"})
            after_docs = env.balance()
            await client.call_tool("calc__search", {"query": "free"})
            after_calc = env.balance()
            # A tool that ran and failed is answered (isError) and billed: it ran.
            broken = await client.call_tool("docs__broken", {})
            assert broken.is_error and "the index is gone" in texts(broken)[0]
            return before, after_docs, after_calc, env.balance()

    before, after_docs, after_calc, after_broken = asyncio.run(run())
    assert before - after_docs == 2 * round(PER_CALL * 1e9)
    assert after_calc == after_docs
    assert after_calc - after_broken == round(PER_CALL * 1e9)
    req = urllib.request.Request(env.gateway + "/v1/usage?group_by=model", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req) as r:
        usage = json.load(r)
    rows = {row["model"]: row for row in usage["models"]}
    assert rows["docs__search"]["requests"] >= 2 and round(rows["docs__search"]["cost"] * 1e9) == rows["docs__search"]["requests"] * round(PER_CALL * 1e9), rows


def test_a_tool_outside_the_keys_rules_or_its_servers_is_neither_listed_nor_called(env, mode):
    async def run():
        async with env.client(CALC_ONLY, mode=mode) as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            assert tools == ["calc__broken", "calc__count_calls", "calc__search", "calc__slow"], tools
            for name in ("docs__search", "calc__drop_everything", "nope"):
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(name, {"query": "x"})
                assert refused.value.error.code == -32602 and "Unknown tool" in refused.value.error.message
            # Prompts follow the same rules by name; resources are the servers' the key has whole.
            assert [p.name for p in (await client.list_prompts()).prompts] == ["calc__summarize"]
            with pytest.raises(MCPError):
                await client.get_prompt("docs__summarize", {"topic": "x"})
            assert [str(r.uri) for r in (await client.list_resources()).resources] == ["calc://readme"]
            with pytest.raises(MCPError):
                await client.read_resource("docs://readme")
        async with env.client(mode=mode) as client:
            with pytest.raises(MCPError):
                await client.call_tool("docs__drop_everything", {})

    before = env.balance(CALC_ONLY)
    asyncio.run(run())
    assert env.balance(CALC_ONLY) == before


def test_tool_calls_are_rate_limited_and_listings_are_not(env, mode):
    # A key of its own, made with the admin API: two tool calls a minute.
    made = env.admin_json("POST", "/admin/keys", {"name": f"two-a-minute-{mode}", "balance": 1.0, "tool_rpm": 2, "tools": {"allow": ["calc__*", "docs__*"]}})
    assert made["tool_rpm"] == 2 and made["tools"] == {"allow": ["calc__*", "docs__*"]}

    async def run():
        async with env.client(made["key"], mode=mode) as client:
            for _ in range(2):
                await client.call_tool("calc__search", {"query": "ok"})
            with pytest.raises(MCPError) as refused:
                await client.call_tool("calc__search", {"query": "third"})
            assert "2 tool calls per minute" in refused.value.error.message
            assert refused.value.error.data["type"] == "rate_limited" and refused.value.error.data["retry_after"] >= 1
            for _ in range(3):
                assert len((await client.list_tools()).tools) == 9

    asyncio.run(run())


def test_a_key_that_cannot_cover_a_call_is_refused_and_nothing_is_sent(env, mode):
    made = env.admin_json("POST", "/admin/keys", {"name": f"nearly-empty-{mode}", "balance": PER_CALL / 2})

    async def run():
        async with env.client(made["key"], mode=mode) as client:
            before = json.loads(texts(await client.call_tool("calc__count_calls", {}))[0])["calls"]
            with pytest.raises(MCPError) as refused:
                await client.call_tool("docs__search", {"query": "costly"})
            assert refused.value.error.data["type"] == "insufficient_balance", refused.value.error
            assert texts(await client.call_tool("calc__search", {"query": "free"})) == ["calc found 'free'"]
            return before

    asyncio.run(run())
    assert env.balance(made["key"]) == round(PER_CALL / 2 * 1e9)


def test_a_session_is_the_keys_own(env):
    async def run():
        async with env.client() as client:
            await client.list_tools()
            return client.session


    def post(key, body, session=None):
        headers = {"Authorization": f"Bearer {key}", "content-type": "application/json", "accept": "application/json, text/event-stream"}
        if session:
            headers["mcp-session-id"] = session
        req = urllib.request.Request(env.gateway + "/mcp", data=json.dumps(body).encode(), headers=headers)
        return urllib.request.urlopen(req)

    with post(KEY, INIT) as r:
        session = r.headers["mcp-session-id"]
        assert json.load(r)["result"]["protocolVersion"] == "2025-06-18"
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    with post(KEY, listing, session) as r:
        assert len(json.load(r)["result"]["tools"]) == 9
    with pytest.raises(urllib.error.HTTPError) as other:
        post(CALC_ONLY, listing, session)
    assert other.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as no_key:
        post("sk-not-a-key-0000000000", listing, session)
    assert no_key.value.code == 401


def test_a_browser_page_of_an_origin_not_named_is_refused_and_one_named_is_served(env):

    def post(origin):
        headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json", "accept": "application/json, text/event-stream"}
        if origin:
            headers["Origin"] = origin
        req = urllib.request.Request(env.gateway + "/mcp", data=json.dumps(INIT).encode(), headers=headers)
        return urllib.request.urlopen(req)

    # A page elsewhere holding a valid key (DNS rebinding, a forged page): 403, nothing opened.
    for forged in ["http://evil.example", "http://localhost:5174", "null"]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(forged)
        assert refused.value.code == 403, forged
        err = json.load(refused.value)
        assert err["id"] is None and err["error"]["code"] == -32600 and "allowed_origins" in err["error"]["message"]
    # The operator's own page (however its case is written), and a client that is no browser.
    for allowed in ["http://localhost:5173", "HTTP://LOCALHOST:5173", None]:
        with post(allowed) as r:
            assert r.status == 200 and json.load(r)["result"]["protocolVersion"] == "2025-06-18"


def test_a_server_that_goes_down_is_left_out_and_a_session_goes_on_across_its_restart(env, mode):
    unreachable = 'tollgate_mcp_tool_calls_total{server="calc",tool="search",outcome="unreachable"}'
    failed_before = metric(env, unreachable)

    async def run():
        async with env.client(mode=mode) as client:
            assert len((await client.list_tools()).tools) == 9
            assert texts(await client.call_tool("calc__search", {"query": "before"})) == ["calc found 'before'"]
            env.calc.kill()
            env.calc.wait()
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            assert tools == ["docs__broken", "docs__count_calls", "docs__search", "docs__slow"], tools
            before = env.balance()
            with pytest.raises(MCPError) as down:
                await client.call_tool("calc__search", {"query": "down"})
            assert "calc" in down.value.error.message
            assert env.balance() == before, "a call no server answered is not billed"
            env.calc = start_server("calc", env.calc_port)
            # The same client session: tollgate makes a new session at the restarted server.
            assert texts(await client.call_tool("calc__search", {"query": "after"})) == ["calc found 'after'"]
            assert len((await client.list_tools()).tools) == 9

    asyncio.run(run())
    key_id = next(k["id"] for k in env.admin_json("GET", "/admin/keys")["data"] if k["name"] == "all-tools")
    calls = [e for e in env.admin_json("GET", f"/admin/requests?key={key_id}&limit=20")["data"] if e["route"] == "mcp_tool_call"]
    assert [(e["provider"], e["status"]) for e in calls[:3]] == [("calc", 200), ("calc", 502), ("calc", 200)], calls[:3]
    assert calls[1]["cost"] == 0, "the call while calc was down is logged, not billed"
    assert metric(env, unreachable) == failed_before + 1


def metrics(env):
    req = urllib.request.Request(env.admin + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req) as r:
        return r.read().decode()


def metric(env, series):
    """The value of one series of /metrics (0 before it was first counted)."""
    for line in metrics(env).splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0


def test_each_tool_call_is_in_the_request_log_and_the_metrics_without_its_arguments(env):
    secret_query = "the-arguments-stay-out-of-the-log"

    async def run():
        async with env.client() as client:
            with pytest.raises(MCPError):
                await client.call_tool("docs__drop_everything", {})
            await client.call_tool("docs__search", {"query": secret_query})

    refusals = 'tollgate_refusals_total{code="unknown_tool"}'
    refused_before = metric(env, refusals)
    asyncio.run(run())
    assert metric(env, refusals) == refused_before + 1
    key_id = next(k["id"] for k in env.admin_json("GET", "/admin/keys")["data"] if k["name"] == "all-tools")
    entries = env.admin_json("GET", f"/admin/requests?key={key_id}&limit=200")["data"]
    calls = [e for e in entries if e["route"] == "mcp_tool_call"]
    latest = calls[0]
    assert latest["model"] == "docs__search" and latest["provider"] == "docs" and latest["status"] == 200, latest
    assert latest["protocol"] == "mcp" and round(latest["cost"] * 1e9) == round(PER_CALL * 1e9)
    assert latest["request_bytes"] > 0 and latest["response_bytes"] > 0 and latest["latency_ms"] >= 0
    assert secret_query not in json.dumps(entries)
    refused = [e for e in calls if e["status"] == 403]
    assert refused and refused[0]["refusal"] == "unknown_tool" and refused[0]["cost"] == 0, "a refused tool call is logged with why"
    text = metrics(env)
    assert 'tollgate_mcp_tool_calls_total{server="docs",tool="search",outcome="ok"}' in text
    assert 'tollgate_mcp_tool_call_seconds_count{server="docs",tool="search"}' in text


def test_claude_code_lists_and_calls_a_tool_through_the_gateway_in_print_mode(env, tmp_path):
    claude, work, run_env = claude_code(tmp_path, env.gateway, {"ANTHROPIC_API_KEY": KEY})
    added = subprocess.run([claude, "mcp", "add", "--transport", "http", "tollgate", env.gateway + "/mcp", "--header", f"Authorization: Bearer {KEY}"],
                           cwd=work, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    listed = subprocess.run([claude, "mcp", "list"], cwd=work, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert "tollgate" in listed.stdout and "Connected" in listed.stdout, listed.stdout + listed.stderr
    before = env.balance()
    tool = "mcp__tollgate__docs__search"
    out = subprocess.run([claude, "-p", f"Search the docs: [[call:{tool}]]", "--model", "beta-opus-4-7", "--allowedTools", tool],
                         cwd=work, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    # The mock model asked for the MCP tool by the name Claude Code gave it; the answer it got back:
    # (Claude Code hands back the tool's structured content: {"result": …}.)
    assert out.stdout.startswith("The tool answered:") and "docs found 'tolls'" in out.stdout, out.stdout + out.stderr
    spent = before - env.balance()
    assert spent > round(PER_CALL * 1e9), "the model turns and the tool call are billed"
    key_id = next(k["id"] for k in env.admin_json("GET", "/admin/keys")["data"] if k["name"] == "all-tools")
    calls = [e for e in env.admin_json("GET", f"/admin/requests?key={key_id}&limit=50")["data"] if e["route"] == "mcp_tool_call"]
    assert calls[0]["model"] == "docs__search" and calls[0]["status"] == 200, calls[0]


@pytest.fixture(scope="module")
def legacy():
    """tollgate in front of a server on the 2024-11-05 transport (`transport: sse`), with a token."""
    tmp = tempfile.mkdtemp(prefix="tollgate-mcp-sse-")
    old_port, gw_port = free_port(), free_port()
    procs = []
    e = None
    try:
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers: []
mcp:
  servers:
    - {{ name: old, url: "http://127.0.0.1:{old_port}/sse", transport: sse, auth: {{ header: X-Api-Key, header_env: OLD_TOKEN }}, prices: {{ per_call: 0.001 }} }}
keys:
  - {{ key: {KEY}, name: all-tools, balance: 1.0 }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port], env={"OLD_TOKEN": DOCS_TOKEN}))
        e = Env(f"http://127.0.0.1:{gw_port}", None, old_port)
        e.calc = start_server("old", old_port, token=None, transport="sse")
        yield e
    finally:
        if e is not None and e.calc is not None:
            procs.append(e.calc)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_server_on_the_older_sse_transport_is_listed_called_with_progress_and_reconnected(legacy):
    async def run():
        progress = []

        async def on_progress(done, total, message):
            progress.append(done)

        async with legacy.client() as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            assert tools == ["old__broken", "old__count_calls", "old__drop_everything", "old__search", "old__slow"], tools
            before = legacy.balance()
            assert texts(await client.call_tool("old__search", {"query": "q"})) == ["old found 'q'"]
            assert before - legacy.balance() == 1_000_000
            assert texts(await client.call_tool("old__slow", {"n": 2}, progress_callback=on_progress)) == ["old did 2 steps"]
            sent = json.loads(texts(await client.call_tool("old__count_calls", {}))[0])
            assert sent["authorization"] == [""] and sent["x-api-key"] == [DOCS_TOKEN], "the server's header, never the client's key"
            legacy.calc.kill()
            legacy.calc.wait()
            assert (await client.list_tools()).tools == []
            legacy.calc = start_server("old", legacy.calc_port, transport="sse")
            assert texts(await client.call_tool("old__search", {"query": "again"})) == ["old found 'again'"]
        return progress

    assert asyncio.run(run()) == [1.0, 2.0]


@pytest.fixture(scope="module")
def oauth():
    """tollgate in front of a server that takes JWT access tokens of a real OpenID provider
    (`oidc-provider`), which tollgate gets with the client-credentials grant."""
    from pysupport.oidc import MODULES, OidcProvider

    if not os.path.isdir(os.path.join(MODULES, "oidc-provider")):
        if os.environ.get("TOLLGATE_OIDC_REQUIRED"):
            pytest.fail("TOLLGATE_OIDC_REQUIRED=1 but oidc-provider is missing")
        pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="tollgate-mcp-oauth-")
    audience = "https://vault.example/mcp"
    idp = OidcProvider({}, audience, mcp_secret="mcp-gateway-secret-0123456789")
    server_port, gw_port = free_port(), free_port()
    procs = []
    try:
        server = subprocess.Popen([sys.executable, os.path.join(HERE, "mcp_server.py"), "vault", str(server_port), "--issuer", idp.issuer, "--audience", audience])
        procs.append(server)
        wait_listening(server_port, server, "MCP server vault")
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers: []
mcp:
  servers:
    - name: vault
      url: http://127.0.0.1:{server_port}/mcp
      auth: {{ oauth: {{ token_url: "{idp.issuer}/token", client_id: mcp-gateway, client_secret_env: VAULT_CLIENT_SECRET }} }}
keys:
  - {{ key: {KEY}, name: all-tools, balance: 1.0 }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port], env={"VAULT_CLIENT_SECRET": "mcp-gateway-secret-0123456789"}))
        yield Env(f"http://127.0.0.1:{gw_port}", None, server_port)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_server_behind_oauth_gets_a_client_credentials_token_kept_and_fetched_again_when_refused(oauth):
    import jwt

    async def run():
        async with oauth.client() as client:
            assert texts(await client.call_tool("vault__search", {"query": "a"})) == ["vault found 'a'"]
            assert texts(await client.call_tool("vault__search", {"query": "b"})) == ["vault found 'b'"]
            first = json.loads(texts(await client.call_tool("vault__count_calls", {}))[0])["authorization"]
            # The server revokes the token: tollgate is refused (401), fetches another, goes on.
            await client.call_tool("vault__reject_token", {})
            assert texts(await client.call_tool("vault__search", {"query": "c"})) == ["vault found 'c'"]
            second = json.loads(texts(await client.call_tool("vault__count_calls", {}))[0])["authorization"]
        return first, second

    first, second = asyncio.run(run())
    assert len(first) == 1, "one token for every call while it is good"
    claims = jwt.decode(first[0].removeprefix("Bearer "), options={"verify_signature": False})
    assert claims["client_id"] == "mcp-gateway" and claims["aud"] == "https://vault.example/mcp", claims
    assert len(second) == 2 and first[0] in second, "a second token once the first was refused"


@pytest.fixture(scope="module")
def solo():
    """One server behind /mcp with `prefix: false`: its tools and prompts under their own names."""
    tmp = tempfile.mkdtemp(prefix="tollgate-mcp-solo-")
    server_port, gw_port = free_port(), free_port()
    procs = []
    try:
        procs.append(start_server("solo", server_port, chatty=True))
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers: []
mcp:
  servers:
    - {{ name: solo, url: "http://127.0.0.1:{server_port}/mcp", prefix: false, prices: {{ per_call: {PER_CALL} }} }}
keys:
  - {{ key: {KEY}, name: all-tools, balance: 1.0 }}
  - {{ key: {CALC_ONLY}, name: no-drop, balance: 1.0, tools: {{ deny: [drop_everything, "summ*"] }} }}
  - {{ key: {SOME_TOOLS}, name: some-tools, balance: 1.0, tools: {{ allow: [search, change] }} }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port]))
        yield Env(f"http://127.0.0.1:{gw_port}", None, None)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_one_server_without_a_prefix_keeps_its_own_names_under_the_keys_rules(solo, mode):
    async def run(key):
        async with solo.client(key=key, mode=mode) as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            found = await client.call_tool("search", {"query": "toll roads"})
            prompt = await client.get_prompt("summarize", {"topic": "tolls"}) if "summarize" in prompts else None
            try:
                await client.call_tool("drop_everything", {})
                dropped = True
            except MCPError:
                dropped = False
            return tools, prompts, texts(found), prompt, dropped

    before = solo.balance()
    tools, prompts, found, prompt, dropped = asyncio.run(run(KEY))
    assert tools == ["ask", "broken", "change", "chatty", "count_calls", "drop_everything", "search", "slow"], tools
    assert prompts == ["summarize"] and prompt.messages[0].content.text == "Summarize tolls for solo."
    assert found == ["solo found 'toll roads'"] and dropped
    # Two calls (search, drop_everything) at the server's price.
    assert before - solo.balance() == 2 * round(PER_CALL * 1e9)
    # The key's rules read the names the client sees.
    tools, prompts, found, prompt, dropped = asyncio.run(run(CALC_ONLY))
    assert "drop_everything" not in tools and prompts == [] and not dropped and found == ["solo found 'toll roads'"]


def test_log_messages_arrive_during_a_call_at_the_level_set_and_arguments_are_completed(solo):
    """`logging/setLevel` reaches the server, its `notifications/message` come to the client
    while the call runs (the answer then goes as SSE), and `completion/complete` reaches the
    server that owns the prompt."""
    from mcp.types import PromptReference

    async def run():
        logged = []

        async def on_log(params):
            logged.append((params.level, params.data))

        async with mcp.Client(streamable_http_client(solo.gateway + "/mcp", http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {KEY}"}, timeout=30)), mode="legacy", logging_callback=on_log) as client:
            # The SDK's server offers completions (and logs without saying it does logging).
            assert client.server_capabilities.completions is not None
            await client.set_logging_level("info")
            said = texts(await client.call_tool("chatty", {}))
            done = await client.complete(PromptReference(type="ref/prompt", name="summarize"), {"name": "topic", "value": "toll"})
            return logged, said, done.completion.values

    logged, said, values = asyncio.run(run())
    assert said == ["solo talked"]
    assert logged == [("info", "solo is starting"), ("warning", "solo is nearly done")], logged
    assert values == ["tolls", "toll roads"]


def test_a_servers_sampling_and_elicitation_requests_reach_the_client_and_its_answers_the_server(solo):
    """A tool that asks the client (sampling, then elicitation) during its call: the requests
    come to the client through tollgate (the sessions at the server declare what the client
    declared), its answers go back to the server that asked, and the call completes. A client
    that declared neither gets its call answered (the server is told at once, never left
    waiting)."""
    from mcp.types import CreateMessageResult, ElicitResult, TextContent

    asked = []

    async def sample(context, params):
        asked.append(("sampling", params.messages[0].content.text, params.max_tokens))
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="the M6 toll"), model="alpha-5.5")

    async def elicit(context, params):
        asked.append(("elicitation", params.message))
        return ElicitResult(action="accept", content={"road": "A1"})

    async def run(**callbacks):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        async with mcp.Client(streamable_http_client(solo.gateway + "/mcp", http_client=http), mode="legacy", **callbacks) as client:
            try:
                return await client.call_tool("ask", {})
            except MCPError as e:
                return e

    done = asyncio.run(run(sampling_callback=sample, elicitation_callback=elicit))
    assert texts(done) == ["the M6 toll / accept A1"] and not done.is_error, done
    assert asked == [("sampling", "name a toll road", 16), ("elicitation", "Which road?")], asked
    # Declared nothing: the server is told at once, naming what is missing, and the call ends
    # (this server answers it as the call's error).
    refused = asyncio.run(run())
    assert isinstance(refused, MCPError) and refused.code == -32601, refused
    assert "did not declare the 'sampling' capability" in str(refused), refused


def test_change_notices_and_resource_updates_reach_the_clients_own_stream(solo):
    """What a server says on its own stream (tools changed, a subscribed resource updated)
    reaches the client on its own stream (GET /mcp), filtered by the key's rules."""

    async def run(key):
        got = []
        changed, updated = asyncio.Event(), asyncio.Event()

        async def on_message(message):
            root = getattr(message, "root", message)
            method = getattr(root, "method", None)
            got.append(method)
            if method == "notifications/tools/list_changed":
                changed.set()
            if method == "notifications/resources/updated":
                updated.set()

        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
        async with mcp.Client(streamable_http_client(solo.gateway + "/mcp", http_client=http), mode="legacy", message_handler=on_message) as client:
            assert texts(await client.call_tool("change", {})) == ["changed"]
            await asyncio.wait_for(changed.wait(), 10)
            if key == KEY:
                await asyncio.wait_for(updated.wait(), 10)
            else:
                # The resource is of a server it does not have whole: a call made after the
                # notices were sent shows the stream went on without it.
                await client.call_tool("search", {"query": "after"})
            return got

    got = asyncio.run(run(KEY))
    assert "notifications/tools/list_changed" in got and "notifications/resources/updated" in got, got
    got = asyncio.run(run(SOME_TOOLS))
    assert "notifications/tools/list_changed" in got and "notifications/resources/updated" not in got, got


def test_the_typescript_sdks_client_is_asked_through_the_gateway_and_gets_the_log(solo):
    """The MCP TypeScript SDK's client (1.x, from npm): a sampling and an elicitation during a
    tool call reach it and its answers complete the call; a tool's log messages reach it."""
    sdk = os.environ.get("TOLLGATE_JS_SDK")
    if not sdk or not os.path.isdir(os.path.join(sdk, "@modelcontextprotocol", "sdk")):
        if os.environ.get("TOLLGATE_JS_SDK_REQUIRED"):
            pytest.fail("the @modelcontextprotocol/sdk npm package is required (tests/run_all.sh installs it)")
        pytest.skip("the @modelcontextprotocol/sdk npm package is not installed (tests/run_all.sh installs it)")
    script = os.path.join(HERE, "js", "mcp_ask.mjs")
    env = {**os.environ, "NODE_PATH": sdk, "MCP_URL": solo.gateway + "/mcp", "KEY": KEY}
    out = subprocess.run(["node", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["asked"] == [["sampling", "name a toll road", 16], ["elicitation", "Which road?"]], got
    assert got["ask"] == ["the M6 toll / accept A1"], got
    assert got["logged"] == [["info", "solo is starting"], ["warning", "solo is nearly done"]], got
    assert got["chatty"] == ["solo talked"], got


def test_a_sessions_own_stream_is_one_and_ends_with_the_session(solo):
    """GET /mcp: one stream per session (a second is 409); DELETE of the session ends it."""

    async def run():
        headers = {"Authorization": f"Bearer {KEY}", "accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(base_url=solo.gateway, headers=headers, timeout=30) as http:
            r = await http.post("/mcp", json=INIT)
            sid = r.headers["mcp-session-id"]
            async with http.stream("GET", "/mcp", headers={"mcp-session-id": sid, "accept": "text/event-stream"}) as stream:
                assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream"
                second = await http.get("/mcp", headers={"mcp-session-id": sid, "accept": "text/event-stream"})
                assert second.status_code == 409
                assert (await http.delete("/mcp", headers={"mcp-session-id": sid})).status_code == 200
                # The stream ends (read to its end), well before its first keep-alive.
                rest = await asyncio.wait_for(stream.aread(), 10)
                return rest

    assert asyncio.run(run()) == b""
