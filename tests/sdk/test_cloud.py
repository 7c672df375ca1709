"""Cloud upstreams checked with the clouds' own client libraries: every SigV4 signature tollgate
sent to Bedrock recomputed with botocore from the same credentials; the mock's event-stream
frames (which tollgate decodes) read by botocore's own parser; the Vertex AI assertion verified
with google-auth against the service account's public key, and google-auth's own sign-in
accepted by the same token endpoint; Azure OpenAI's URL forms and headers as the openai SDK's
AzureOpenAI client sends them. Then the openai, anthropic and google-genai SDKs streaming
through tollgate to each cloud."""
import base64
import datetime
import json
import os
import subprocess
import tempfile
import urllib.request

import anthropic
import openai
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer
from google import genai
from google.genai import types as genai_types

from conftest import BIN_DIR, ROOT, UPSTREAM_KEY
from pysupport import free_port, wait_listening

KEY = "sk-sdk-cloud-0001"
AWS_ID, AWS_SECRET, AWS_TOKEN = "AKIDMOCKTOLLGATE", "mock-aws-secret-access-key", "session-token-sdk"
ENTRA_SECRET = "mock-entra-client-secret"
SONNET = "anthropic.claude-sonnet-4-6-v1:0"
LLAMA = "us.meta.llama4-maverick-17b-instruct-v1:0"
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
# The throwaway service account of the bundled demo (its public key the mock knows).
DEMO = os.path.join(ROOT, "conf", "demo")
EXPECTED_3 = "Hello from the"


class Cloud:
    """The mock (every cloud) and tollgate in front of it."""

    def __init__(self, mock_url, gateway_url, sa_path):
        self.mock, self.gateway, self.sa_path = mock_url, gateway_url, sa_path

    def mock_get(self, path):
        with urllib.request.urlopen(self.mock + path) as r:
            return json.load(r)

    def requests(self):
        return self.mock_get("/__mock/requests")


@pytest.fixture(scope="module")
def cloud():
    tmp = tempfile.mkdtemp(prefix="tollgate-cloud-")
    mock_port, gw_port = free_port(), free_port()
    mock_url = f"http://127.0.0.1:{mock_port}"
    mock = subprocess.Popen([
        os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY,
        "--google-public-key", os.path.join(DEMO, "vertex-sa.pub.pem"),
    ])
    wait_listening(mock_port, mock, "tollgate-mock")
    with open(os.path.join(DEMO, "vertex-sa.json")) as f:
        sa = json.load(f)
    sa["token_uri"] = mock_url + "/token"
    sa_path = os.path.join(tmp, "sa.json")
    with open(sa_path, "w") as f:
        json.dump(sa, f)
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: br, protocol: bedrock, region: us-east-1, endpoint_url: "{mock_url}/br",
      aws: {{ access_key_id_env: SDK_AWS_ID, secret_access_key_env: SDK_AWS_SECRET, session_token_env: SDK_AWS_TOKEN }},
      models: [ {{ name: beta-sonnet-4-6, upstream: "{SONNET}" }}, {{ name: delta-llama-4, upstream: "{LLAMA}" }} ] }}
  - {{ name: vx, protocol: vertex, project: proj-sdk, location: us-east5, credentials_file: {sa_path}, base_url: "{mock_url}/vx",
      models: [ gamma-3.5-flash, {{ name: beta-opus-4-7, upstream: "claude-opus-4-7@20260101" }} ] }}
  - {{ name: az, protocol: azure-openai, base_url: "{mock_url}/az", api_version: "2024-10-21", api_key: {UPSTREAM_KEY},
      models: [ {{ name: alpha-5.5, upstream: dep-gpt }} ] }}
  - {{ name: az1, protocol: azure-openai, base_url: "{mock_url}/az1",
      entra: {{ tenant_id: tenant-sdk, client_id: client-sdk, client_secret_env: SDK_ENTRA_SECRET, authority_host: "{mock_url}/login" }},
      models: [ {{ name: alpha-4o-mini, upstream: v1-gpt }} ] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini], translate: true }}
prices:
  beta-sonnet-4-6: {{ input: 3.0, output: 15.0 }}
  delta-llama-4: {{ input: 0.2, output: 0.6 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5 }}
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  alpha-4o-mini: {{ input: 0.15, output: 0.6 }}
forward_headers: ["x-mock-*"]
keys:
  - {{ key: {KEY}, name: sdk-cloud, group: default, balance: 5.0 }}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    env = {**os.environ, "RUST_LOG": "warn", "SDK_AWS_ID": AWS_ID, "SDK_AWS_SECRET": AWS_SECRET,
           "SDK_AWS_TOKEN": AWS_TOKEN, "SDK_ENTRA_SECRET": ENTRA_SECRET}
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env=env)
    try:
        wait_listening(gw_port, gw, "tollgate")
        yield Cloud(mock_url, f"http://127.0.0.1:{gw_port}", sa_path)
    finally:
        for p in (gw, mock):
            p.kill()
            p.wait()


def anthropic_client(cloud):
    return anthropic.Anthropic(base_url=cloud.gateway, api_key=KEY, max_retries=0)


def openai_client(cloud):
    return openai.OpenAI(base_url=cloud.gateway + "/v1", api_key=KEY, max_retries=0)


def genai_client(cloud):
    return genai.Client(api_key=KEY, http_options=genai_types.HttpOptions(base_url=cloud.gateway))


# ---------------------------------------------------------------- SDKs through tollgate

def test_anthropic_sdk_streams_from_bedrock_and_vertex(cloud):
    c = anthropic_client(cloud)
    for model in ["beta-sonnet-4-6", "beta-opus-4-7"]:
        with c.messages.stream(model=model, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == EXPECTED_3, model
        assert final.model == model, "the client's name for the model"
        assert final.usage.output_tokens == 3
        whole = c.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        assert whole.content[0].text == EXPECTED_3


def test_openai_sdk_streams_from_azure_and_through_translation_from_bedrock_and_vertex(cloud):
    c = openai_client(cloud)
    for model in ["alpha-5.5", "alpha-4o-mini", "beta-sonnet-4-6", "beta-opus-4-7", "gamma-3.5-flash", "delta-llama-4"]:
        stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
                                           stream_options={"include_usage": True})
        text, usage = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text == EXPECTED_3, model
        assert usage is not None and usage.completion_tokens == 3, model


def test_genai_sdk_streams_from_vertex_and_from_bedrock_through_translation(cloud):
    c = genai_client(cloud)
    for model in ["gamma-3.5-flash", "beta-sonnet-4-6", "delta-llama-4"]:
        chunks = list(c.models.generate_content_stream(model=model, contents="hi"))
        assert "".join(ch.text or "" for ch in chunks) == EXPECTED_3, model
        assert chunks[-1].usage_metadata.candidates_token_count == 3, model


# ---------------------------------------------------------------- Bedrock: botocore

def botocore_signature(record):
    """The signature botocore computes for a recorded request from the same credentials, at the
    date the request carries, over the headers it names as signed."""
    headers = {k: v[0] for k, v in record["headers"].items()}
    auth = headers["authorization"]
    signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    url = f"http://{headers['host']}{record['path']}" + (f"?{record['query']}" if record["query"] else "")
    request = AWSRequest(method=record["method"], url=url, data=record["body"].encode(),
                         headers={h: headers[h] for h in signed})
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials(AWS_ID, AWS_SECRET, AWS_TOKEN), "bedrock", "us-east-1")
    canonical = signer.canonical_request(request)
    return signer.signature(signer.string_to_sign(request, canonical), request), auth.split("Signature=")[1]


def test_every_bedrock_signature_recomputed_by_botocore_matches(cloud):
    c = anthropic_client(cloud)
    c.messages.create(model="beta-sonnet-4-6", max_tokens=32, messages=[{"role": "user", "content": "sign me"}])
    with c.messages.stream(model="beta-sonnet-4-6", max_tokens=32, messages=[{"role": "user", "content": "é ü"}]) as s:
        s.get_final_message()
    bedrock = [r for r in cloud.requests() if r["path"].startswith("/br/model/")]
    assert len(bedrock) >= 2
    for r in bedrock:
        assert "%3A" in r["path"], "the model id's colon is encoded in the path"
        ours, theirs = botocore_signature(r)
        assert ours == theirs, r["path"]
        assert r["headers"]["x-amz-security-token"] == [AWS_TOKEN]


def test_boto3_reads_the_mocks_bedrock_wire_converse_and_invoke_alike(cloud):
    import boto3
    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=cloud.mock,
                          aws_access_key_id=AWS_ID, aws_secret_access_key=AWS_SECRET)
    messages = [{"role": "user", "content": [{"text": "hi"}]}]
    r = client.converse(modelId=LLAMA, messages=messages, inferenceConfig={"maxTokens": 16})
    assert r["output"]["message"]["content"][0]["text"] == EXPECTED_3
    assert r["usage"]["outputTokens"] == 3 and r["stopReason"] == "end_turn"
    events = list(client.converse_stream(modelId=LLAMA, messages=messages)["stream"])
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"], kinds
    assert "".join(e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e) == EXPECTED_3
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 3
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    chunks = list(client.invoke_model_with_response_stream(modelId=SONNET, body=body)["body"])
    types = [json.loads(c["chunk"]["bytes"])["type"] for c in chunks]
    assert types[0] == "message_start" and types[-1] == "message_stop", types


def test_tollgates_converse_requests_pass_botocores_own_validation(cloud):
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    c = openai_client(cloud)
    c.chat.completions.create(
        model="delta-llama-4", extra_headers={"x-mock-tool-calls": "1"},
        tools=[{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                               {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
                  {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    shapes = get_session().get_service_model("bedrock-runtime")
    sent = [r for r in cloud.requests() if r["path"].startswith("/br/model/") and "/converse" in r["path"]]
    assert sent
    for r in sent:
        params = json.loads(r["body"])
        for m in params.get("messages", []):
            for block in m["content"]:
                if "image" in block:
                    block["image"]["source"]["bytes"] = base64.b64decode(block["image"]["source"]["bytes"])
        params["modelId"] = r["model"]
        operation = "ConverseStream" if r["path"].endswith("/converse-stream") else "Converse"
        report = ParamValidator().validate(params, shapes.operation_model(operation).input_shape)
        assert not report.has_errors(), report.generate_report()
    last = json.loads(sent[-1]["body"])
    assert last["system"] == [{"text": "be brief"}]
    assert [next(iter(b)) for b in last["messages"][0]["content"]] == ["text", "image"]
    assert last["messages"][1]["content"][0]["toolUse"]["input"] == {"city": "Paris"}
    assert last["messages"][2]["content"][0]["toolResult"]["toolUseId"] == "call_1"


def test_the_event_stream_tollgate_decodes_is_what_botocores_parser_reads(cloud):
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 16,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    url = cloud.mock + "/model/" + SONNET.replace(":", "%3A") + "/invoke-with-response-stream"
    request = AWSRequest(method="POST", url=url, data=body, headers={"content-type": "application/json"})
    SigV4Auth(Credentials(AWS_ID, AWS_SECRET), "bedrock", "us-east-1").add_auth(request)
    prepared = request.prepare()
    req = urllib.request.Request(url, data=body, headers=dict(prepared.headers), method="POST")
    with urllib.request.urlopen(req) as r:
        assert r.headers["content-type"] == "application/vnd.amazon.eventstream"
        raw = r.read()
    parser = EventStreamBuffer()
    parser.add_data(raw)
    events = []
    for message in parser:
        assert message.headers[":message-type"] == "event"
        assert message.headers[":event-type"] == "chunk"
        events.append(json.loads(base64.b64decode(json.loads(message.payload)["bytes"])))
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 3


# ---------------------------------------------------------------- Vertex AI: google-auth

def test_the_vertex_assertion_verifies_with_google_auth_and_google_auths_own_sign_in_works(cloud):
    from google.auth import jwt as google_jwt
    from google.oauth2 import service_account
    from google.auth.transport.requests import Request

    c = genai_client(cloud)  # keep a reference: a dropped Client closes its connection
    c.models.generate_content(model="gamma-3.5-flash", contents="hi")
    tokens = [t for t in cloud.mock_get("/__mock/tokens") if t["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"]
    assert tokens and all(t["ok"] for t in tokens), tokens
    with open(os.path.join(DEMO, "vertex-sa.pub.pem"), "rb") as f:
        public = f.read()
    claims = google_jwt.decode(tokens[0]["assertion"], certs=public, audience=cloud.mock + "/token")
    assert claims["iss"] == "tollgate-test@tollgate-test.iam.gserviceaccount.com"
    assert claims["scope"] == "https://www.googleapis.com/auth/cloud-platform"
    assert claims["exp"] - claims["iat"] == 3600
    # google-auth signing in with the same key file at the same endpoint: the mock checks
    # google-auth's assertion exactly as it checks tollgate's.
    creds = service_account.Credentials.from_service_account_file(
        cloud.sa_path, scopes=["https://www.googleapis.com/auth/cloud-platform"])
    creds.refresh(Request())
    assert creds.token.startswith("ya29.mock-")
    assert creds.expiry > datetime.datetime.utcnow()


# ---------------------------------------------------------------- Azure OpenAI: the SDK's own forms

def test_tollgate_calls_azure_as_the_azure_openai_client_does(cloud):
    sdk = openai.AzureOpenAI(azure_endpoint=cloud.mock + "/az", api_version="2024-10-21", api_key=UPSTREAM_KEY, max_retries=0)
    r = sdk.chat.completions.create(model="dep-gpt", messages=[{"role": "user", "content": "direct"}],
                                    extra_headers={"x-mock-usage": "5,3"})
    assert r.choices[0].message.content == EXPECTED_3
    openai_client(cloud).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "via"}])
    azure = [r for r in cloud.requests() if r["path"].startswith("/az/")]
    direct, via = azure[-2], azure[-1]
    assert direct["path"] == via["path"] == "/az/openai/deployments/dep-gpt/chat/completions"
    assert direct["query"] == via["query"] == "api-version=2024-10-21"
    assert direct["headers"]["api-key"] == via["headers"]["api-key"] == [UPSTREAM_KEY]
    assert "authorization" not in via["headers"]
    # Entra ID: a bearer token from the tenant's token endpoint, as AzureOpenAI sends one.
    sdk = openai.AzureOpenAI(azure_endpoint=cloud.mock + "/az1", api_version="2024-10-21",
                             azure_ad_token="entra-not-issued", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        sdk.chat.completions.create(model="v1-gpt", messages=[{"role": "user", "content": "x"}])
    openai_client(cloud).chat.completions.create(model="alpha-4o-mini", messages=[{"role": "user", "content": "via"}])
    v1 = [r for r in cloud.requests() if r["path"].startswith("/az1/openai/v1/")][-1]
    assert v1["path"] == "/az1/openai/v1/chat/completions"
    assert v1["model"] == "v1-gpt"
    assert v1["headers"]["authorization"][0].startswith("Bearer entra-mock-")
    tokens = [t for t in cloud.mock_get("/__mock/tokens") if t["path"].endswith("/oauth2/v2.0/token")]
    assert tokens and tokens[0]["path"] == "/login/tenant-sdk/oauth2/v2.0/token" and tokens[0]["ok"]
