"""Price multipliers (issue 66): a group's `price_multiplier` of 1.25 charges exactly 1.25 times
the price table on every kind of call — an image, a realtime turn, an MCP tool call, a batch
line, a chat completion — while the records keep the list cost; an account's multiplier (0.8)
replaces its keys' group's. Each call is made twice, by a key at the price table and by a key
of the group, with the real SDKs; the client's `/v1/usage` shows what it was charged, the
admin usage view the list cost and the margin, the audit trail a multiplier changed."""
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import httpx2
import mcp
import openai
import pytest
from mcp.client.streamable_http import streamable_http_client
from websockets.sync.client import connect as ws_connect

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, free_port, start_mock, start_tollgate, wait_listening

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN = "sk-multiplier-plain-0001"
RESALE = "sk-multiplier-resale-0001"
PARTNER = "sk-multiplier-partner-01"
TOKEN = "multiplier-admin-token-0001"
PER_CALL = 0.0125


def charged(list_nanos, ppm):
    """What a list cost is charged at a multiplier of `ppm` millionths (half away from zero)."""
    v = abs(list_nanos) * ppm
    c = (v + 500_000) // 1_000_000
    return -c if list_nanos < 0 else c


class Env:
    def __init__(self, gateway, admin):
        self.gateway, self.admin = gateway, admin

    def client(self, key):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=key, max_retries=0)

    def usage(self, key):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return json.load(r)

    def balance(self, key):
        return round(self.usage(key)["balance"] * 1e9)

    def api(self, method, path, body=None):
        return admin_json(self.admin, TOKEN, method, path, body)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-multipliers-")
    docs_port, gw_port, admin_port = free_port(), free_port(), free_port()
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        docs = subprocess.Popen([sys.executable, os.path.join(HERE, "mcp_server.py"), "docs", str(docs_port), "--transport", "streamable-http"])
        procs.append(docs)
        wait_listening(docs_port, docs, "MCP server docs")
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: 127.0.0.1:{admin_port}, token: {TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-realtime, alpha-dall-e] }}
groups:
  default: {{ platforms: [openai] }}
  resale: {{ platforms: [openai], price_multiplier: 1.25 }}
prices:
  alpha-5.5: {{ input: 1.0, output: 4.0 }}
  alpha-realtime: {{ input: 4.0, output: 16.0 }}
  alpha-dall-e: {{ input: 0, output: 0, per_image: {{ standard: {{ "1024x1024": 0.04 }} }} }}
limits: {{ batch_poll_secs: 1 }}
mcp:
  servers:
    - {{ name: docs, url: "http://127.0.0.1:{docs_port}/mcp", prices: {{ per_call: {PER_CALL} }} }}
accounts:
  - {{ name: partner, balance: 20, price_multiplier: 0.8 }}
keys:
  - {{ key: {PLAIN}, name: plain, group: default, balance: 20.0 }}
  - {{ key: {RESALE}, name: resale, group: resale, balance: 20.0 }}
  - {{ key: {PARTNER}, name: partner, group: resale, balance: 20.0, account: partner }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port]))
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def spent(env, key, call):
    """What `call(key)` took from `key`'s balance."""
    before = env.balance(key)
    call(key)
    return before - env.balance(key)


def both(env, call):
    """The same call by the key at the price table and the key of the 1.25 group."""
    plain, resale = spent(env, PLAIN, call), spent(env, RESALE, call)
    assert plain > 0
    return plain, resale


def test_an_image_is_charged_exactly_the_groups_multiplier_of_its_list_price(env):
    plain, resale = both(env, lambda key: env.client(key).images.generate(model="alpha-dall-e", prompt="a red fox", n=1, size="1024x1024", quality="standard"))
    assert plain == 40_000_000
    assert resale == charged(plain, 1_250_000) == 50_000_000


def test_a_realtime_turn_is_charged_exactly_the_groups_multiplier(env):
    def turn(key):
        url = env.gateway.replace("http://", "ws://") + "/v1/realtime?model=alpha-realtime"
        with ws_connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            assert json.loads(ws.recv())["type"] == "session.created"
            ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
            ws.send(json.dumps({"type": "response.create"}))
            while True:
                event = json.loads(ws.recv())
                assert event["type"] != "error", event
                if event["type"] == "response.done":
                    return
    plain, resale = both(env, turn)
    assert resale == charged(plain, 1_250_000)


def test_a_tool_call_is_charged_exactly_the_groups_multiplier(env):
    def call(key):
        async def run():
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
            async with mcp.Client(streamable_http_client(env.gateway + "/mcp", http_client=http)) as client:
                found = await client.call_tool("docs__search", {"query": "find tollgate"})
                assert not found.is_error
        asyncio.run(run())
    plain, resale = both(env, call)
    assert plain == round(PER_CALL * 1e9)
    assert resale == charged(plain, 1_250_000) == 15_625_000


def test_a_batch_is_charged_the_multiplier_of_its_worst_case_and_settles_at_exactly_the_multiplier_of_its_cost(env):
    def batch(key):
        client = env.client(key)
        lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "alpha-5.5", "max_tokens": 50, "messages": [{"role": "user", "content": f"question {i}"}]}}
                 for i in range(1, 3)]
        file = client.files.create(file=("lines.jsonl", ("\n".join(json.dumps(l) for l in lines) + "\n").encode()), purpose="batch")
        before = env.balance(key)
        created = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        held = before - env.balance(key)
        deadline = time.time() + 60
        while client.batches.retrieve(created.id).status != "completed":
            assert time.time() < deadline, "the batch did not complete"
            time.sleep(0.2)
        return held
    held = {}
    plain, resale = both(env, lambda key: held.__setitem__(key, batch(key)))
    # Its worst case was charged at the multiplier at creation; settled, the total is exactly it.
    assert held[RESALE] == charged(held[PLAIN], 1_250_000)
    assert resale == charged(plain, 1_250_000)


def test_an_accounts_multiplier_replaces_the_groups_and_the_operator_sees_list_cost_and_margin(env):
    chat = lambda key: env.client(key).chat.completions.create(model="alpha-5.5", max_tokens=20, messages=[{"role": "user", "content": "hello"}])
    plain, partner = spent(env, PLAIN, chat), spent(env, PARTNER, chat)
    assert partner == charged(plain, 800_000), "the account's 0.8, not the group's 1.25"
    view = env.api("GET", "/admin/keys")["data"]
    by_name = {k["name"]: k for k in view}
    assert (by_name["partner"]["price_multiplier"], by_name["partner"]["price_multiplier_from"]) == (0.8, "account")
    assert (by_name["resale"]["price_multiplier"], by_name["resale"]["price_multiplier_from"]) == (1.25, "group")
    assert by_name["plain"]["price_multiplier_from"] == "none"
    # The client sees what it was charged, never the list cost.
    mine = env.usage(RESALE)
    assert "list_cost" not in json.dumps(mine)
    # The operator: per key, the charge, the list cost and the margin; the resale key's list
    # cost is what the plain key paid for the same calls.
    rows = {r["key"]["name"]: r for r in env.api("GET", "/admin/usage?group_by=key")["data"]}
    resale, plain_row = rows["resale"], rows["plain"]
    nanos = lambda usd: round(usd * 1e9)
    assert nanos(resale["cost"]) == nanos(mine["total"]["cost"])
    assert nanos(resale["list_cost"]) < nanos(resale["cost"])
    assert nanos(resale["margin"]) == nanos(resale["cost"]) - nanos(resale["list_cost"])
    assert nanos(plain_row["margin"]) == 0
    accounts = {r["account"]: r for r in env.api("GET", "/admin/usage?group_by=account")["data"]}
    assert nanos(accounts["partner"]["margin"]) == partner - plain
    # An account's multiplier changed through the admin API applies at once and is audited.
    assert env.api("PATCH", "/admin/accounts/partner", {"price_multiplier": 2})["price_multiplier"] == 2.0
    assert spent(env, PARTNER, chat) == charged(plain, 2_000_000)
    audit = json.dumps(env.api("GET", "/admin/audit?limit=20"))
    assert "price multiplier of account partner set to 2" in audit
    # A multiplier out of bounds is refused naming it.
    with pytest.raises(urllib.error.HTTPError) as refused:
        env.api("PATCH", "/admin/accounts/partner", {"price_multiplier": 0})
    assert refused.value.code == 400 and "price_multiplier" in refused.value.read().decode()
