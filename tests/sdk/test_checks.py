"""One check, registered once, reaches every kind of call (issue 63): the test-only check that
`TOLLGATE_TEST_REFUSE_MARK` switches on refuses a call whose text carries the mark — a chat
completion (the SDK's 400), a realtime turn (an `error` event, the item never reaching the
upstream, the session kept), an MCP tool call (the JSON-RPC error, the tool never run, nothing
billed) and a batch line (the batch refused naming the line, nothing charged) — and lets the
same calls without the mark through."""
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import httpx2
import mcp
import openai
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from websockets.sync.client import connect as ws_connect

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, start_mock, start_tollgate, wait_listening

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "sk-checks-0001-0123456789"
MARK = "MARK-7f3a-refuse"
PER_CALL = 0.0125


class Env:
    def __init__(self, gateway, mock):
        self.gateway, self.mock = gateway, mock

    def client(self):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=KEY, max_retries=0)

    def balance(self):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)

    def upstream_saw(self, text):
        with urllib.request.urlopen(self.mock + "/__mock/requests") as r:
            return text in json.dumps(json.load(r))


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-checks-")
    docs_port, gw_port = free_port(), free_port()
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
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-realtime] }}
prices:
  alpha-5.5: {{ input: 1.0, output: 4.0 }}
  alpha-realtime: {{ input: 4.0, output: 16.0 }}
limits: {{ batch_poll_secs: 1 }}
mcp:
  servers:
    - {{ name: docs, url: "http://127.0.0.1:{docs_port}/mcp", prices: {{ per_call: {PER_CALL} }} }}
keys:
  - {{ key: {KEY}, name: checked, balance: 5.0 }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port], env={"TOLLGATE_TEST_REFUSE_MARK": MARK}))
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{mock_port}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_chat_call_with_the_mark_is_refused_before_it_reaches_the_upstream(env):
    client, before = env.client(), env.balance()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": [{"type": "text", "text": f"say {MARK}"}]}])
    assert "test_mark" in refused.value.message and "model call" in refused.value.message
    assert not env.upstream_saw(MARK)
    assert env.balance() == before, "a refused call costs nothing"
    answer = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "say hello"}])
    assert answer.choices[0].message.content and env.balance() < before


def test_a_realtime_turn_with_the_mark_is_refused_and_the_session_goes_on(env):
    url = env.gateway.replace("http://", "ws://") + "/v1/realtime?model=alpha-realtime"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        item = lambda text: json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        ws.send(item(f"tell me {MARK}"))
        refused = json.loads(ws.recv())
        assert refused["type"] == "error" and "test_mark" in refused["error"]["message"] and "realtime turn" in refused["error"]["message"], refused
        ws.send(item("tell me a joke"))
        assert json.loads(ws.recv())["type"] == "conversation.item.created"
    assert not env.upstream_saw(MARK)


def test_an_mcp_tool_call_with_the_mark_is_refused_unrun_and_unbilled(env):
    async def run():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        async with mcp.Client(streamable_http_client(env.gateway + "/mcp", http_client=http)) as client:
            async def calls():
                return json.loads((await client.call_tool("docs__count_calls", {})).content[0].text)["calls"]
            ran = await calls()
            before = env.balance()
            with pytest.raises(MCPError) as refused:
                await client.call_tool("docs__search", {"query": f"find {MARK}"})
            assert "test_mark" in str(refused.value) and "tool call" in str(refused.value)
            assert env.balance() == before, "a refused tool call costs nothing"
            assert await calls() == ran, "the tool never ran"
            before = env.balance()
            found = await client.call_tool("docs__search", {"query": "find tollgate"})
            assert not found.is_error and found.content[0].text == "docs found 'find tollgate'"
            assert before - env.balance() == round(PER_CALL * 1e9)
    asyncio.run(run())


def test_a_batch_line_with_the_mark_refuses_the_batch_naming_the_line(env):
    client, before = env.client(), env.balance()
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "alpha-5.5", "messages": [{"role": "user", "content": f"question {i}" + (f" {MARK}" if i == 2 else "")}]}}
             for i in range(1, 4)]
    file = client.files.create(file=("marked.jsonl", ("\n".join(json.dumps(l) for l in lines) + "\n").encode()), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "Line 2" in refused.value.message and "test_mark" in refused.value.message and "batch line" in refused.value.message
    assert refused.value.body["param"] == "line 2: body"
    assert env.balance() == before, "nothing charged for a refused batch"
    clean = client.files.create(file=("clean.jsonl", ("\n".join(json.dumps(l) for l in lines if l["custom_id"] != "r2") + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=clean.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.request_counts.total == 2
