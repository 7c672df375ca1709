"""Bedrock- and Vertex-format ingress (issue 68, point 4): boto3's `bedrock-runtime` client
(`invoke_model`, `invoke_model_with_response_stream`, `converse`, `converse_stream`) with a gateway key as its Bedrock API key
(`AWS_BEARER_TOKEN_BEDROCK`), the Anthropic Vertex SDK (`AnthropicVertex`, `:rawPredict` and
`:streamRawPredict`), and Claude Code set to Bedrock and to Vertex, all pointed at tollgate and
billed exactly as messages calls; model ids map through `models: [{name, upstream}]`."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest
import requests

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import admin_json, claude_code, free_port, start_mock, start_tollgate

ADMIN_TOKEN = "cloud-ingress-admin-token-0123456789"
PRICES = {"beta-opus-4-7": (3.0, 15.0), "beta-haiku-4-5": (1.0, 5.0), "gamma-3.5-flash": (0.5, 1.5)}
BEDROCK_ID = "us.anthropic.beta-haiku-4-5-20251001-v1:0"


class Env:
    def __init__(self, gateway, admin, https, ca):
        # boto3 sends a Bedrock API key only over TLS: it gets the HTTPS listener (the test CA).
        self.gateway, self.admin, self.https, self.ca = gateway, admin, https, ca

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)

    def new_key(self, name):
        return self.admin_json("POST", "/admin/keys", {"name": name, "group": "default", "balance": 5.0})

    def requests_on(self, route):
        text = requests.get(f"{self.admin}/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).text
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("tollgate_requests_total{") and f'route="{route}"' in l and 'status="200"' in l)

    def usage(self, key):
        r = requests.get(f"{self.gateway}/v1/usage", headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return r.json()


def exact_cost(u):
    return sum(m["input_tokens"] * round(PRICES[m["model"]][0] * 1000) + m["output_tokens"] * round(PRICES[m["model"]][1] * 1000) for m in u["models"])


def balance_nanos(env, key_id):
    return round(next(k for k in env.admin_json("GET", "/admin/keys")["data"] if k["id"] == key_id)["balance"] * 1e9)


@pytest.fixture(scope="module")
def env():
    import trustme

    tmp = tempfile.mkdtemp(prefix="tollgate-ingress-")
    gw_port, admin_port, tls_port = free_port(), free_port(), free_port()
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(os.path.join(tmp, "server.pem"))
    cert.private_key_pem.write_to_path(os.path.join(tmp, "key.pem"))
    ca.cert_pem.write_to_path(os.path.join(tmp, "ca.pem"))
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
tls: {{ listen: 127.0.0.1:{tls_port}, cert: {tmp}/server.pem, key: {tmp}/key.pem }}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
providers:
  - name: an
    protocol: anthropic
    base_url: "http://127.0.0.1:{mock_port}/an"
    api_key: {UPSTREAM_KEY}
    models: [beta-opus-4-7, {{ name: beta-haiku-4-5, upstream: "{BEDROCK_ID}" }}]
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [anthropic, gemini] }}
prices:
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  beta-haiku-4-5: {{ input: 1.0, output: 5.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5 }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port, tls_port, admin_port])
        procs.append(gw)
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", f"https://127.0.0.1:{tls_port}", os.path.join(tmp, "ca.pem"))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def bedrock(env, key, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", key)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    return boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=env.https, verify=env.ca)


def test_boto3_invokes_and_streams_through_tollgate_billed_exactly(env, monkeypatch):
    made = env.new_key("boto3")
    client = bedrock(env, made["key"], monkeypatch)
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 32, "messages": [{"role": "user", "content": "hello"}]}
    # By the gateway's model name, and by the provider's own id for it.
    for model_id in ("beta-opus-4-7", BEDROCK_ID):
        r = client.invoke_model(modelId=model_id, body=json.dumps(body), contentType="application/json", accept="application/json")
        answer = json.loads(r["body"].read())
        assert answer["type"] == "message" and answer["content"][0]["text"].startswith("Hello from the"), answer
    r = client.invoke_model_with_response_stream(modelId=BEDROCK_ID, body=json.dumps(body))
    events = [json.loads(e["chunk"]["bytes"]) for e in r["body"] if "chunk" in e]
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop" and "content_block_delta" in types, types
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text.startswith("Hello from the"), text
    # The Converse API: whole, and streamed.
    conversation = [{"role": "user", "content": [{"text": "hello"}]}]
    c = client.converse(modelId="beta-opus-4-7", messages=conversation, system=[{"text": "be brief"}], inferenceConfig={"maxTokens": 32})
    assert c["output"]["message"]["content"][0]["text"].startswith("Hello from the"), c
    assert c["stopReason"] == "end_turn" and c["usage"]["outputTokens"] > 0 and c["usage"]["inputTokens"] > 0, c
    s = client.converse_stream(modelId=BEDROCK_ID, messages=conversation, inferenceConfig={"maxTokens": 32})
    events = list(s["stream"])
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"] and "contentBlockDelta" in kinds, kinds
    streamed = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    assert streamed.startswith("Hello from the") and events[-1]["metadata"]["usage"]["outputTokens"] > 0, events
    u = env.usage(made["key"])
    assert u["total"]["requests"] == 5 and {m["model"] for m in u["models"]} == {"beta-opus-4-7", "beta-haiku-4-5"}, u
    spent = exact_cost(u)
    assert spent > 0 and round(u["total"]["cost"] * 1e9) == spent
    assert balance_nanos(env, made["id"]) == 5_000_000_000 - spent
    # Without a key, or with a wrong one: refused, nothing billed.
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "sk-wrong")
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as refused:
        bedrock(env, "sk-wrong", monkeypatch).invoke_model(modelId="beta-opus-4-7", body=json.dumps(body))
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException", refused.value.response
    # A model the gateway does not serve: Bedrock's not-found, by its code.
    good = bedrock(env, made["key"], monkeypatch)
    with pytest.raises(good.exceptions.ResourceNotFoundException):
        good.invoke_model(modelId="no-such-model", body=json.dumps(body))


def test_the_anthropic_vertex_sdk_raw_predicts_and_streams_through_tollgate(env):
    from anthropic import AnthropicVertex

    made = env.new_key("vertex")
    client = AnthropicVertex(region="us-east5", project_id="demo-project", base_url=f"{env.gateway}/v1",
                             access_token=made["key"], max_retries=0)
    msg = client.messages.create(model="beta-opus-4-7", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text.startswith("Hello from the"), msg
    with client.messages.stream(model="beta-haiku-4-5", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as s:
        streamed = "".join(s.text_stream)
    assert streamed.startswith("Hello from the")
    u = env.usage(made["key"])
    assert u["total"]["requests"] == 2 and round(u["total"]["cost"] * 1e9) == exact_cost(u) > 0, u
    assert balance_nanos(env, made["id"]) == 5_000_000_000 - exact_cost(u)


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_claude_code_set_to_bedrock_or_vertex_calls_through_tollgate(env, tmp_path, cloud):
    made = env.new_key(f"claude-{cloud}")
    claude, work, run_env = claude_code(tmp_path, env.gateway, {})
    run_env = {k: v for k, v in run_env.items() if not k.startswith("ANTHROPIC_BASE_URL")}
    if cloud == "bedrock":
        run_env.update({"CLAUDE_CODE_USE_BEDROCK": "1", "ANTHROPIC_BEDROCK_BASE_URL": env.https, "NODE_EXTRA_CA_CERTS": env.ca, "AWS_REGION": "us-east-1",
                        "AWS_BEARER_TOKEN_BEDROCK": made["key"], "ANTHROPIC_MODEL": BEDROCK_ID, "ANTHROPIC_DEFAULT_HAIKU_MODEL": BEDROCK_ID})
    else:
        run_env.update({"CLAUDE_CODE_USE_VERTEX": "1", "ANTHROPIC_VERTEX_BASE_URL": f"{env.gateway}/v1", "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
                        "ANTHROPIC_VERTEX_PROJECT_ID": "demo-project", "CLOUD_ML_REGION": "us-east5",
                        "ANTHROPIC_CUSTOM_HEADERS": f"x-api-key: {made['key']}"})
    route = {"bedrock": "bedrock_invoke_stream", "vertex": "vertex_stream_raw_predict"}[cloud]
    before = env.requests_on(route)
    out = subprocess.run([claude, "-p", "Say hello"], cwd=work, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "Hello from the" in out.stdout, out.stdout
    # It streamed through the cloud's own path (Bedrock: event-stream frames; Vertex: SSE).
    assert env.requests_on(route) > before
    u = env.usage(made["key"])
    assert u["total"]["requests"] >= 1 and round(u["total"]["cost"] * 1e9) == exact_cost(u) > 0, u
    assert balance_nanos(env, made["id"]) == 5_000_000_000 - exact_cost(u)


def test_gemini_under_the_vertex_prefix_is_a_generate_content_call(env):
    made = env.new_key("vertex-gemini")
    base = f"{env.gateway}/v1/projects/demo/locations/us-central1/publishers/google/models/gamma-3.5-flash"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    r = requests.post(f"{base}:generateContent", headers={"x-goog-api-key": made["key"]}, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["candidates"][0]["content"]["parts"][0]["text"].startswith("Hello from the"), r.text
    s = requests.post(f"{base}:streamGenerateContent?alt=sse", headers={"authorization": f"Bearer {made['key']}"}, json=body, stream=True)
    assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream"), s.text
    chunks = [json.loads(line[6:]) for line in s.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    text = "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert text.startswith("Hello from the"), chunks
    u = env.usage(made["key"])
    assert u["total"]["requests"] == 2 and u["models"][0]["model"] == "gamma-3.5-flash", u
    assert round(u["total"]["cost"] * 1e9) == exact_cost(u) > 0, u
