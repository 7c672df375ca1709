"""The response cache through the official SDKs, unchanged (issue 70): each protocol's SDK gets
the same answer twice, whole and streamed, the second from the gateway (`x-tollgate-cache: hit`)
never reaching the mock; a hit is billed at its hit price (`cache_hit_ratio` 0.5 for alpha-5.5, 0
for the others) to the nano-dollar; a call translated to another protocol is cached in the
client's shape; a request's `x-tollgate-cache: ttl=` opens the cache for a key no entry covers."""
import os
import tempfile
import time

import anthropic
import openai
import pytest
import requests
from google import genai
from google.genai import types as genai_types

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, free_port, start_mock, start_tollgate

ADMIN_TOKEN = "cache-admin-token-0123456789"
KEY = "sk-cache-sdk-000000000001"
TRANSLATING = "sk-cache-sdk-translate-01"
PLAIN = "sk-cache-sdk-plain-000001"
PRICES = {"alpha-5.5": (2.0, 8.0), "alpha-embed-3": (0.1, 0.0), "beta-sonnet-4-6": (3.0, 15.0), "gamma-3.5-flash": (0.5, 1.5)}


def cost(model, inp, out):
    return inp * round(PRICES[model][0] * 1000) + out * round(PRICES[model][1] * 1000)


class Env:
    def __init__(self, gateway, admin, mock):
        self.gateway, self.admin, self.mock = gateway, admin, mock

    def balance(self, key):
        return round(requests.get(f"{self.gateway}/v1/usage", headers={"authorization": f"Bearer {key}"}).json()["balance"] * 1e9)

    def seen(self, tag):
        return requests.get(f"{self.mock}/__mock/requests", params={"tag": tag}).json()


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-cache-")
    gw_port, admin_port = free_port(), free_port()
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        prices = "".join(f"  {m}: {{ input: {i}, output: {o}{', cache_hit_ratio: 0.5' if m == 'alpha-5.5' else ''} }}\n"
                         for m, (i, o) in PRICES.items())
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-embed-3] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini], cache: {{ ttl: 600 }} }}
  translating: {{ platforms: [openai], translate: true, cache: {{ ttl: 600 }} }}
  plain: {{ platforms: [openai] }}
cache: {{ max_bytes: 16777216 }}
forward_headers: ["x-mock-*", x-test-tag]
prices:
{prices}keys:
  - {{ key: {KEY}, name: sdk, group: default, balance: 5.0 }}
  - {{ key: {TRANSLATING}, name: translating, group: translating, balance: 5.0 }}
  - {{ key: {PLAIN}, name: plain, group: plain, balance: 5.0 }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port]))
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{mock_port}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def settled(env, key, before, want):
    """The key's balance moved by exactly `want` (the hit is settled before its last byte; the
    wait covers the miss's record)."""
    deadline = time.time() + 10
    while before - env.balance(key) != want and time.time() < deadline:
        time.sleep(0.05)
    assert before - env.balance(key) == want


def tagged(tag, usage="120,9"):
    return {"x-test-tag": tag, "x-mock-usage": usage}


def test_openai_sdk_chat_whole_and_streamed_answered_again_from_the_gateway(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=KEY, max_retries=0)
    before = env.balance(KEY)
    ask = dict(model="alpha-5.5", messages=[{"role": "user", "content": "What is 2+2?"}], temperature=0)
    first = oa.chat.completions.with_raw_response.create(**ask, extra_headers=tagged("oa-chat"))
    again = oa.chat.completions.with_raw_response.create(**ask, extra_headers=tagged("oa-chat"))
    assert (first.headers["x-tollgate-cache"], again.headers["x-tollgate-cache"]) == ("miss", "hit")
    a, b = first.parse(), again.parse()
    assert b.choices[0].message.content == a.choices[0].message.content and b.usage == a.usage
    assert b.id != a.id and b.model == a.model
    assert int(again.headers["age"]) >= 0
    # Streamed, with the SDK's own stream reader, usage asked for.
    texts = []
    for _ in range(2):
        with oa.chat.completions.stream(**ask, stream_options={"include_usage": True}, extra_headers=tagged("oa-stream")) as s:
            final = s.get_final_completion()
        texts.append((final.choices[0].message.content, final.usage.prompt_tokens))
    assert texts[0] == texts[1] and texts[0][0]
    assert len(env.seen("oa-chat")) == 1 and len(env.seen("oa-stream")) == 1
    half = cost("alpha-5.5", 120, 9) // 2
    settled(env, KEY, before, 2 * cost("alpha-5.5", 120, 9) + 2 * half)


def test_openai_sdk_responses_unstored_and_embeddings_are_cached(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=KEY, max_retries=0)
    ask = dict(model="alpha-5.5", input="Say hi", temperature=0, store=False)
    first = oa.responses.with_raw_response.create(**ask, extra_headers=tagged("oa-resp"))
    again = oa.responses.with_raw_response.create(**ask, extra_headers=tagged("oa-resp"))
    assert (first.headers["x-tollgate-cache"], again.headers["x-tollgate-cache"]) == ("miss", "hit")
    assert again.parse().output_text == first.parse().output_text
    streamed = []
    for _ in range(2):
        with oa.responses.stream(**ask, extra_headers=tagged("oa-resp-stream")) as s:
            streamed.append(s.get_final_response().output_text)
    assert streamed[0] == streamed[1] == first.parse().output_text
    # A stored response (the API's default) is never answered again.
    stored = oa.responses.with_raw_response.create(model="alpha-5.5", input="Say hi", temperature=0, extra_headers=tagged("oa-stored"))
    assert stored.headers["x-tollgate-cache"] == "bypass"
    vectors = [oa.embeddings.create(model="alpha-embed-3", input="tollgate", extra_headers=tagged("oa-emb")).data[0].embedding for _ in range(2)]
    assert vectors[0] == vectors[1]
    assert [len(env.seen(t)) for t in ("oa-resp", "oa-resp-stream", "oa-emb")] == [1, 1, 1]


def test_anthropic_sdk_messages_whole_and_streamed_a_free_hit(env):
    an = anthropic.Anthropic(base_url=env.gateway, api_key=KEY, max_retries=0)
    before = env.balance(KEY)
    # This SDK takes no temperature of its own: the body's, as sent.
    ask = dict(model="beta-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": "hi"}], extra_body={"temperature": 0})
    first = an.messages.with_raw_response.create(**ask, extra_headers=tagged("an-whole", "300,20"))
    again = an.messages.with_raw_response.create(**ask, extra_headers=tagged("an-whole", "300,20"))
    assert (first.headers["x-tollgate-cache"], again.headers["x-tollgate-cache"]) == ("miss", "hit")
    a, b = first.parse(), again.parse()
    assert b.content == a.content and b.usage == a.usage and b.id != a.id and b.id.startswith("msg_")
    finals = []
    for _ in range(2):
        with an.messages.stream(**ask, extra_headers=tagged("an-stream", "300,20")) as s:
            finals.append(s.get_final_message())
    assert finals[0].content == finals[1].content and finals[0].usage == finals[1].usage
    assert len(env.seen("an-whole")) == 1 and len(env.seen("an-stream")) == 1
    settled(env, KEY, before, 2 * cost("beta-sonnet-4-6", 300, 20))


def test_genai_sdk_generate_content_whole_and_streamed(env):
    g = genai.Client(api_key=KEY, http_options=genai_types.HttpOptions(base_url=env.gateway))
    config = genai_types.GenerateContentConfig(temperature=0, http_options=genai_types.HttpOptions(headers=tagged("ge-whole", "50,5")))
    texts = [g.models.generate_content(model="gamma-3.5-flash", contents="hi", config=config).text for _ in range(2)]
    assert texts[0] == texts[1] and texts[0]
    sconfig = genai_types.GenerateContentConfig(temperature=0, http_options=genai_types.HttpOptions(headers=tagged("ge-stream", "50,5")))
    streamed = ["".join(c.text or "" for c in g.models.generate_content_stream(model="gamma-3.5-flash", contents="hi", config=sconfig))
                for _ in range(2)]
    assert streamed[0] == streamed[1] == texts[0]
    assert len(env.seen("ge-whole")) == 1 and len(env.seen("ge-stream")) == 1


def test_a_translated_call_is_cached_in_the_clients_shape(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=TRANSLATING, max_retries=0)
    ask = dict(model="beta-sonnet-4-6", messages=[{"role": "user", "content": "hi"}], temperature=0)
    whole = [oa.chat.completions.with_raw_response.create(**ask, extra_headers=tagged("tr-whole")) for _ in range(2)]
    assert [w.headers["x-tollgate-cache"] for w in whole] == ["miss", "hit"]
    assert whole[1].parse().choices[0].message.content == whole[0].parse().choices[0].message.content
    finals = []
    for _ in range(2):
        with oa.chat.completions.stream(**ask, extra_headers=tagged("tr-stream")) as s:
            finals.append(s.get_final_completion().choices[0].message.content)
    assert finals[0] == finals[1] and finals[0]
    assert [s["path"] for s in env.seen("tr-whole") + env.seen("tr-stream")] == ["/an/v1/messages", "/an/v1/messages"]


def test_a_requests_ttl_opens_the_cache_for_a_key_no_entry_covers(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=PLAIN, max_retries=0)
    ask = dict(model="alpha-5.5", messages=[{"role": "user", "content": "plain"}], temperature=0)
    off = oa.chat.completions.with_raw_response.create(**ask, extra_headers=tagged("plain"))
    assert "x-tollgate-cache" not in off.headers, "no entry, no header: the cache is off for it"
    asked = {**tagged("plain"), "x-tollgate-cache": "ttl=30"}
    got = [oa.chat.completions.with_raw_response.create(**ask, extra_headers=asked).headers["x-tollgate-cache"] for _ in range(2)]
    assert got == ["miss", "hit"]
    assert len(env.seen("plain")) == 2
    with pytest.raises(openai.BadRequestError) as bad:
        oa.chat.completions.create(**ask, extra_headers={"x-tollgate-cache": "ttl=never"})
    assert "x-tollgate-cache" in bad.value.message
