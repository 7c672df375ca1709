"""Guardrails (issue 65) as the real SDKs see them: a secret masked before it leaves (the mock
echoes what it received after `[[echo]]`) in whole and streamed calls of each protocol, a card
number blocked (the SDK's 400 with code content_policy_violation), an answer blocked as it
streams (the protocol's own error event; the key split across events is still found), a
realtime item and an MCP tool call blocked, and a webhook whose signature a receiver verifies
with the Standard Webhooks library and whose answer masks the text."""
import asyncio
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

import anthropic
import httpx2
import mcp
import openai
import pytest
import standardwebhooks
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from websockets.sync.client import connect as ws_connect

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, start_mock, start_tollgate, wait_listening

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "sk-guard-sdk-0001-0123456789"
OUT_KEY = "sk-guard-sdk-out-0123456789"
HOOK_KEY = "sk-guard-sdk-hook-012345678"
HOOK_OUT_KEY = "sk-guard-sdk-hook-out-0123456"
RESTORE_KEY = "sk-guard-sdk-restore-01234567"
SECRET = "AKIAIOSFODNN7EXAMPLE"
CARD = "4111 1111 1111 1111"
HOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver(http.server.BaseHTTPRequestHandler):
    """The operator's guardrail service: verifies each call with the Standard Webhooks library
    (a bad signature is answered 401, which the gateway treats as a failure), masks the word
    'confidential' and blocks a text holding 'forbidden'."""

    verified = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        try:
            asked = standardwebhooks.Webhook(HOOK_SECRET).verify(body, dict(self.headers.items()))
        except standardwebhooks.WebhookVerificationError:
            self.send_response(401)
            self.end_headers()
            return
        Receiver.verified.append(asked)
        texts = asked["texts"]
        if any("forbidden" in t for t in texts):
            answer = {"action": "block", "reason": "forbidden"}
        elif any("confidential" in t for t in texts):
            answer = {"action": "mask", "reason": "confidential", "replacements": [t.replace("confidential", "[REDACTED]") for t in texts]}
        else:
            answer = {"action": "allow"}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Env:
    def __init__(self, gateway, mock):
        self.gateway, self.mock = gateway, mock

    def openai(self, key=KEY):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=key, max_retries=0)

    def anthropic(self, key=KEY):
        return anthropic.Anthropic(base_url=self.gateway, api_key=key, max_retries=0)

    def genai(self, key=KEY):
        return genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=self.gateway))

    def balance(self, key=KEY):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)

    def upstream_saw(self, text):
        with urllib.request.urlopen(self.mock + "/__mock/requests") as r:
            return text in json.dumps(json.load(r))


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-guard-")
    docs_port, gw_port = free_port(), free_port()
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        docs = subprocess.Popen([sys.executable, os.path.join(HERE, "mcp_server.py"), "docs", str(docs_port), "--transport", "streamable-http"])
        procs.append(docs)
        wait_listening(docs_port, docs, "MCP server docs")
        base = f"http://127.0.0.1:{mock_port}"
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "{base}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-realtime] }}
  - {{ name: an, protocol: anthropic, base_url: "{base}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7] }}
  - {{ name: ge, protocol: gemini, base_url: "{base}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
prices:
  alpha-5.5: {{ input: 1.0, output: 4.0 }}
  alpha-realtime: {{ input: 4.0, output: 16.0 }}
  beta-opus-4-7: {{ input: 1.0, output: 4.0 }}
  gamma-3.5-flash: {{ input: 1.0, output: 4.0 }}
mcp:
  servers:
    - {{ name: docs, url: "http://127.0.0.1:{docs_port}/mcp" }}
guardrails:
  - {{ name: secrets, kind: secrets, action: mask }}
  - {{ name: secrets-back, kind: secrets, action: mask, restore: true }}
  - {{ name: cards, kind: pii, recognisers: [card], action: block }}
  - {{ name: answers, kind: secrets, phase: output, action: block }}
  - {{ name: hook, kind: webhook, url: "http://127.0.0.1:{hook.server_address[1]}/check", secret_env: GUARD_HOOK_SECRET, on_error: closed }}
  - {{ name: hook-out, kind: webhook, phase: output, action: mask, url: "http://127.0.0.1:{hook.server_address[1]}/check", secret_env: GUARD_HOOK_SECRET }}
keys:
  - {{ key: {KEY}, name: guarded, balance: 5.0, guardrails: [secrets, cards] }}
  - {{ key: {OUT_KEY}, name: output, balance: 5.0, guardrails: [answers] }}
  - {{ key: {HOOK_KEY}, name: hooked, balance: 5.0, guardrails: [hook] }}
  - {{ key: {HOOK_OUT_KEY}, name: hooked-out, balance: 5.0, guardrails: [hook-out] }}
  - {{ key: {RESTORE_KEY}, name: restored, balance: 5.0, guardrails: [secrets-back] }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port], env={"GUARD_HOOK_SECRET": HOOK_SECRET}))
        yield Env(f"http://127.0.0.1:{gw_port}", base)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        hook.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


PROMPT = f"[[echo]] my key {SECRET} works"
MASKED = "my key [AWS_KEY_1] works"


def test_chat_completions_masked_whole_and_streamed_and_blocked(env):
    client = env.openai()
    whole = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": PROMPT}])
    assert whole.choices[0].message.content == MASKED
    stream = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": PROMPT}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == MASKED
    before = env.balance()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": f"card {CARD}"}])
    assert refused.value.code == "content_policy_violation" and "'cards'" in refused.value.message and "4111" not in refused.value.message
    assert env.balance() == before, "a blocked call costs nothing"
    assert not env.upstream_saw("4111") and not env.upstream_saw(SECRET)


def test_messages_masked_whole_and_streamed_and_blocked(env):
    client = env.anthropic()
    whole = client.messages.create(model="beta-opus-4-7", max_tokens=50, messages=[{"role": "user", "content": PROMPT}])
    assert whole.content[0].text == MASKED
    with client.messages.stream(model="beta-opus-4-7", max_tokens=50, messages=[{"role": "user", "content": PROMPT}]) as stream:
        assert "".join(stream.text_stream) == MASKED
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="beta-opus-4-7", max_tokens=50, messages=[{"role": "user", "content": f"card {CARD}"}])
    assert "content_policy_violation" in str(refused.value.body) and "'cards'" in refused.value.message


def test_generate_content_masked_whole_and_streamed_and_blocked(env):
    client = env.genai()
    whole = client.models.generate_content(model="gamma-3.5-flash", contents=PROMPT)
    assert whole.text == MASKED
    streamed = "".join(c.text or "" for c in client.models.generate_content_stream(model="gamma-3.5-flash", contents=PROMPT))
    assert streamed == MASKED
    with pytest.raises(genai_errors.ClientError) as refused:
        client.models.generate_content(model="gamma-3.5-flash", contents=f"card {CARD}")
    assert refused.value.code == 400 and "'cards'" in refused.value.message


def test_an_answer_is_blocked_as_it_streams_in_each_protocol(env):
    # The key comes back in pieces of 4 characters: found across events, none of it sent.
    prompt = f"[[echo:4]] here it is: {SECRET} and the rest of the answer"
    with pytest.raises(openai.APIError) as cut:
        for _ in env.openai(OUT_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": prompt}], stream=True):
            pass
    assert "'answers'" in str(cut.value)
    with pytest.raises(anthropic.APIStatusError) as cut:
        with env.anthropic(OUT_KEY).messages.stream(model="beta-opus-4-7", max_tokens=50, messages=[{"role": "user", "content": prompt}]) as stream:
            text = "".join(stream.text_stream)
            assert "AKIA" not in text
    assert "'answers'" in str(cut.value)
    with pytest.raises(openai.BadRequestError) as whole:
        env.openai(OUT_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": prompt}])
    assert whole.value.code == "content_policy_violation"
    gemini = env.genai(OUT_KEY)
    with pytest.raises(genai_errors.ClientError):
        gemini.models.generate_content(model="gamma-3.5-flash", contents=prompt)


def test_a_realtime_item_is_blocked_and_the_session_goes_on_and_a_secret_goes_masked(env):
    url = env.gateway.replace("http://", "ws://") + "/v1/realtime?model=alpha-realtime"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        item = lambda text: json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        ws.send(item(f"my card is {CARD}"))
        refused = json.loads(ws.recv())
        assert refused["type"] == "error" and "'cards'" in refused["error"]["message"], refused
        ws.send(item(f"my key is {SECRET}"))
        created = json.loads(ws.recv())
        # The mock echoes the item as it received it: masked.
        assert created["type"] == "conversation.item.created" and created["item"]["content"][0]["text"] == "my key is [AWS_KEY_1]", created


def test_an_mcp_tool_call_is_blocked_unrun(env):
    async def run():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        async with mcp.Client(streamable_http_client(env.gateway + "/mcp", http_client=http)) as client:
            async def calls():
                return json.loads((await client.call_tool("docs__count_calls", {})).content[0].text)["calls"]
            ran = await calls()
            with pytest.raises(MCPError) as refused:
                await client.call_tool("docs__search", {"query": f"card {CARD}"})
            assert "'cards'" in str(refused.value) and "4111" not in str(refused.value)
            assert await calls() == ran, "the tool never ran"
            masked = await client.call_tool("docs__search", {"query": f"key {SECRET}"})
            assert masked.content[0].text == "docs found 'key [AWS_KEY_1]'"
    asyncio.run(run())


def test_a_webhook_verified_with_the_standard_webhooks_library_masks_the_text(env):
    Receiver.verified.clear()
    answer = env.openai(HOOK_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "[[echo]] this is confidential stuff"}])
    assert answer.choices[0].message.content == "this is [REDACTED] stuff"
    asked = Receiver.verified[-1]
    assert asked["phase"] == "input" and asked["route"] == "chat_completions" and asked["model"] == "alpha-5.5"
    assert any("confidential" in t for t in asked["texts"])
    assert KEY not in json.dumps(asked), "the client's key is never sent to the webhook"


STREAMED = "[[echo:4]] The first sentence of this answer is long enough to be read on its own and it is confidential. "


def test_a_webhook_reads_a_streamed_answer_segment_by_segment(env):
    Receiver.verified.clear()
    # Masked: the segment holding the word reaches each SDK with the webhook's replacement.
    sentence = STREAMED.removeprefix("[[echo:4]] ").strip()
    chunks = env.openai(HOOK_OUT_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": STREAMED + "Then calm."}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == sentence.replace("confidential", "[REDACTED]") + " Then calm."
    with env.anthropic(HOOK_OUT_KEY).messages.stream(model="beta-opus-4-7", max_tokens=200, messages=[{"role": "user", "content": STREAMED}]) as stream:
        assert "".join(stream.text_stream).strip() == sentence.replace("confidential", "[REDACTED]")
    gemini = env.genai(HOOK_OUT_KEY)
    streamed = gemini.models.generate_content_stream(model="gamma-3.5-flash", contents=STREAMED)
    assert "".join(c.text or "" for c in streamed).strip() == sentence.replace("confidential", "[REDACTED]")
    # The webhook was asked about segments of the answer, never the whole of it at once.
    asked = [a for a in Receiver.verified if a["phase"] == "output"]
    assert len(asked) >= 2 and all(len("".join(a["texts"])) <= 512 for a in asked)
    # Blocked: the first segment went; the one holding the word never reaches the client.
    got = []
    with pytest.raises(openai.APIError) as cut:
        for c in env.openai(HOOK_OUT_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": STREAMED + "This part is forbidden to read."}], stream=True):
            got.append(c.choices[0].delta.content or "" if c.choices else "")
    assert "'hook-out'" in str(cut.value)
    assert "".join(got).startswith(sentence.replace("confidential", "[REDACTED]")) and "forbidden" not in "".join(got)
    with pytest.raises(openai.BadRequestError) as whole:
        env.openai(HOOK_OUT_KEY).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "[[echo]] a forbidden answer"}])
    assert whole.value.code == "content_policy_violation"


def test_a_realtime_answer_is_blocked_as_it_streams_and_the_session_goes_on(env):
    url = env.gateway.replace("http://", "ws://") + "/v1/realtime?model=alpha-realtime"
    item = lambda text: json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})

    def turn(ws, text):
        ws.send(item(text))
        assert json.loads(ws.recv())["type"] == "conversation.item.created"
        ws.send(json.dumps({"type": "response.create"}))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv()))
        return events

    with ws_connect(url, additional_headers={"Authorization": f"Bearer {OUT_KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        # The mock says the key back in pieces of 4 characters: found across them, none sent.
        events = turn(ws, f"[[echo]] the key is {SECRET} and then some more words to say")
        errors = [e for e in events if e["type"] == "error"]
        assert errors and "'answers'" in errors[0]["error"]["message"], events
        assert "AKIA" not in json.dumps(events) and "EXAMPLE" not in json.dumps(events)
        # The session goes on: the next answer streams whole.
        events = turn(ws, "[[echo]] all is calm here")
        text = "".join(e.get("delta", "") for e in events if e["type"] == "response.output_text.delta")
        assert text == "all is calm here", events
    # A webhook reads a realtime answer too: masked in its deltas and in the events that
    # repeat the text; a forbidden answer blocked and the session still open.
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {HOOK_OUT_KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        events = turn(ws, "[[echo]] this answer is confidential")
        text = "".join(e.get("delta", "") for e in events if e["type"] == "response.output_text.delta")
        assert text == "this answer is [REDACTED]", events
        assert "confidential" not in json.dumps(events), events
        events = turn(ws, "[[echo]] a forbidden answer")
        errors = [e for e in events if e["type"] == "error"]
        assert errors and "'hook-out'" in errors[0]["error"]["message"], events
        assert "forbidden" not in json.dumps([e for e in events if e["type"] != "error"]), events
        events = turn(ws, "[[echo]] all is calm here")
        assert "".join(e.get("delta", "") for e in events if e["type"] == "response.output_text.delta") == "all is calm here"
    # Restored: a secret masked on its way up comes back to the same client in the answer.
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {RESTORE_KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(item(f"[[echo]] my key is {SECRET}"))
        created = json.loads(ws.recv())
        # The upstream got the placeholder (the mock echoes the item as it received it).
        assert created["item"]["content"][0]["text"] == "[[echo]] my key is [AWS_KEY_1]", created
        ws.send(json.dumps({"type": "response.create"}))
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv()))
        text = "".join(e.get("delta", "") for e in events if e["type"] == "response.output_text.delta")
        assert text == f"my key is {SECRET}", events
        assert "[AWS_KEY_1]" not in json.dumps(events[-1]), events[-1]
