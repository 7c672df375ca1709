"""Fallbacks across models through the official SDKs, unchanged (issue 69): the openai SDK's
chat completions (a prompt too long for the model's `context_window` served by the next without
a call to the first; a content-policy refusal of both OpenAI models falling to an Anthropic one,
streamed with its tool call), a client's `models` list (`extra_body`) refused outside its key's
rules, the anthropic SDK falling from a rate-limited model to a Gemini one by
`x-tollgate-fallbacks`, and the google-genai SDK falling from a context-length error to an OpenAI
model; each billed at the serving model's price to the nano-dollar, the hold released exactly."""
import json
import os
import tempfile

import anthropic
import openai
import pytest
import requests
from google import genai
from google.genai import types as genai_types

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, free_port, start_mock, start_tollgate

ADMIN_TOKEN = "fallbacks-admin-token-0123456789"
KEY = "sk-fallbacks-sdk-0001"
RULED = "sk-fallbacks-ruled-0001"
PRICES = {"alpha-5.5": (2.0, 8.0), "alpha-4o-mini": (0.15, 0.6), "beta-opus-4-7": (3.0, 15.0),
          "beta-sonnet-4-6": (3.0, 15.0), "gamma-3.5-flash": (0.5, 1.5)}


def cost(model, inp, out):
    return inp * round(PRICES[model][0] * 1000) + out * round(PRICES[model][1] * 1000)


class Env:
    def __init__(self, gateway, admin, mock):
        self.gateway, self.admin, self.mock = gateway, admin, mock

    def balance(self, key):
        return round(requests.get(f"{self.gateway}/v1/usage", headers={"authorization": f"Bearer {key}"}).json()["balance"] * 1e9)

    def seen(self, tag):
        return requests.get(f"{self.mock}/__mock/requests", params={"tag": tag}).json()

    def logged(self, model):
        page = admin_json(self.admin, ADMIN_TOKEN, "GET", f"/admin/requests?limit=1&model={model}")
        return page["data"][0] if page["data"] else None


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-fallbacks-")
    gw_port, admin_port = free_port(), free_port()
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        prices = "".join(f"  {m}: {{ input: {i}, output: {o}{', context_window: 200' if m == 'alpha-5.5' else ''} }}\n"
                         for m, (i, o) in PRICES.items())
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-4o-mini] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini] }}
routing:
  fallbacks:
    alpha-5.5: {{ to: [alpha-4o-mini, beta-sonnet-4-6] }}
forward_headers: ["x-mock-*", x-test-tag]
prices:
{prices}keys:
  - {{ key: {KEY}, name: sdk, group: default, balance: 5.0 }}
  - {{ key: {RULED}, name: ruled, group: default, balance: 5.0, models: {{ deny: [gamma-3.5-flash] }} }}
"""
        procs.append(start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port]))
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{mock_port}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def settled(env, key, before, want):
    """The key's balance moved by exactly `want` (waits for the settlement, after the answer)."""
    import time

    deadline = time.time() + 10
    while before - env.balance(key) != want and time.time() < deadline:
        time.sleep(0.05)
    assert before - env.balance(key) == want


def test_openai_sdk_a_prompt_too_long_is_served_by_the_next_model_never_sent_to_the_first(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=KEY, max_retries=0)
    before = env.balance(KEY)
    raw = oa.chat.completions.with_raw_response.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "tell me more " * 80}],
        extra_headers={"x-test-tag": "sdk-window", "x-mock-usage": "700,12"})
    r = raw.parse()
    assert raw.headers["x-tollgate-served-model"] == "alpha-4o-mini"
    assert r.model == "alpha-4o-mini" and r.choices[0].message.content
    assert [s["model"] for s in env.seen("sdk-window")] == ["alpha-4o-mini"]
    settled(env, KEY, before, cost("alpha-4o-mini", 700, 12))


def test_openai_sdk_a_refusal_falls_to_another_protocol_streamed_with_its_tool_call(env):
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=KEY, max_retries=0)
    before = env.balance(KEY)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    headers = {"x-test-tag": "sdk-policy", "x-mock-error": "content_policy", "x-mock-only-model": "alpha-5.5,alpha-4o-mini",
               "x-mock-tool-calls": "1", "x-mock-usage": "40,9"}
    with oa.chat.completions.stream(model="alpha-5.5", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=tools, extra_headers=headers) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "unit": "celsius"})
    assert final.choices[0].finish_reason == "tool_calls" and final.model == "beta-sonnet-4-6"
    paths = [s["path"] for s in env.seen("sdk-policy")]
    assert paths == ["/oa/v1/chat/completions", "/oa/v1/chat/completions", "/an/v1/messages"]
    settled(env, KEY, before, cost("beta-sonnet-4-6", 40, 9))


def test_openai_sdk_a_models_list_outside_the_keys_rules_is_refused(env):
    body = {"models": ["alpha-4o-mini", "gamma-3.5-flash"]}
    ruled = openai.OpenAI(base_url=env.gateway + "/v1", api_key=RULED, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        ruled.chat.completions.create(model="alpha-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                      extra_body=body, extra_headers={"x-test-tag": "sdk-ruled"})
    assert refused.value.body["param"] == "models" and "gamma-3.5-flash" in refused.value.message
    assert env.seen("sdk-ruled") == []
    # The same list from a key that may call both: the first serves it.
    oa = openai.OpenAI(base_url=env.gateway + "/v1", api_key=KEY, max_retries=0)
    raw = oa.chat.completions.with_raw_response.create(model="alpha-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                                       extra_body=body)
    assert raw.headers["x-tollgate-served-model"] == "alpha-4o-mini"


def test_anthropic_sdk_falls_from_a_rate_limited_model_to_a_gemini_one(env):
    an = anthropic.Anthropic(base_url=env.gateway, api_key=KEY, max_retries=0)
    before = env.balance(KEY)
    headers = {"x-tollgate-fallbacks": "gamma-3.5-flash", "x-mock-status": "429", "x-mock-only-model": "beta-opus-4-7",
               "x-test-tag": "sdk-429", "x-mock-usage": "21,4"}
    m = an.messages.create(model="beta-opus-4-7", max_tokens=64, messages=[{"role": "user", "content": "hi"}], extra_headers=headers)
    assert m.model == "gamma-3.5-flash" and m.content[0].text
    with an.messages.stream(model="beta-opus-4-7", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                            extra_headers={**headers, "x-test-tag": "sdk-429s"}) as stream:
        streamed = stream.get_final_message()
    assert streamed.model == "gamma-3.5-flash" and streamed.content[0].text == m.content[0].text
    assert env.seen("sdk-429s")[-1]["path"].startswith("/ge/")
    settled(env, KEY, before, 2 * cost("gamma-3.5-flash", 21, 4))
    entry = env.logged("gamma-3.5-flash")
    assert entry["fallbacks"] == "beta-opus-4-7:rate_limited", entry


def test_genai_sdk_falls_from_a_context_length_error_to_an_openai_model(env):
    g = genai.Client(api_key=KEY, http_options=genai_types.HttpOptions(base_url=env.gateway))
    headers = {"x-tollgate-fallbacks": "alpha-4o-mini", "x-mock-error": "context_length", "x-mock-only-model": "gamma-3.5-flash",
               "x-test-tag": "sdk-genai", "x-mock-usage": "33,5"}
    before = env.balance(KEY)
    r = g.models.generate_content(model="gamma-3.5-flash", contents="hi",
                                  config=genai_types.GenerateContentConfig(http_options=genai_types.HttpOptions(headers=headers)))
    assert r.text and r.model_version == "alpha-4o-mini"
    assert [s["path"].split("/")[1] for s in env.seen("sdk-genai")] == ["ge", "oa"]
    settled(env, KEY, before, cost("alpha-4o-mini", 33, 5))
