"""Traces over OTLP, received and decoded by a real receiver (opentelemetry-proto): a server span
per request and a client span per upstream attempt with the GenAI attributes, for every protocol
streamed and not; retries as sibling spans; a client's trace continued and carried upstream;
refusals on the span; and a dead collector that costs no request."""
import json
import os
import subprocess
import tempfile

import anthropic
import requests as httpx
import openai
import pytest
from google import genai
from google.genai import types as genai_types
from opentelemetry.proto.trace.v1 import trace_pb2
from websockets.sync.client import connect as ws_connect

from conftest import CLIENT_KEY, COLLECTOR_TOKEN, POOR_KEY, UPSTREAM_KEY, start_gateway

SERVER, CLIENT = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_CLIENT
PROMPT = "the-secret-prompt-words 7f3a"


def attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = list(x.string_value for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)
    return out


def request_spans(receiver, request_id, clients=1):
    """The server span whose tollgate.request_id is `request_id` and its client spans."""
    def found(spans):
        server = [s for s in spans if s.kind == SERVER and attrs(s).get("tollgate.request_id") == request_id]
        if not server:
            return None
        children = [s for s in spans if s.kind == CLIENT and s.parent_span_id == server[0].span_id]
        return (server[0], children) if len(children) >= clients else None
    return receiver.wait_for(found)


def check_model_call(stack, request_id, operation, provider, model, response_model, finish, usage):
    server, clients = request_spans(stack.receiver, request_id)
    assert len(clients) == 1
    client = clients[0]
    a, c = attrs(server), attrs(client)
    assert server.name == f"{operation} {model}" and client.name == f"{operation} {model}"
    assert client.trace_id == server.trace_id and server.parent_span_id == b""
    for span_attrs in (a, c):
        assert span_attrs["gen_ai.operation.name"] == operation
        assert span_attrs["gen_ai.provider.name"] == provider
        assert span_attrs["gen_ai.request.model"] == model
        assert span_attrs["gen_ai.response.model"] == response_model
        assert span_attrs["gen_ai.response.finish_reasons"] == [finish]
        assert span_attrs["gen_ai.usage.input_tokens"] == usage[0]
        assert span_attrs["gen_ai.usage.output_tokens"] == usage[1]
        assert "gen_ai.usage.cache_read.input_tokens" not in span_attrs  # none were cached
    assert c["server.address"] == "127.0.0.1" and c["http.response.status_code"] == 200
    assert a["http.response.status_code"] == 200 and "error.type" not in a and "error.type" not in c
    assert a["tollgate.key.name"] == "otlp-team" and a["tollgate.key.tags"] == ["team=research"]
    assert a["tollgate.estimated"] is False and a["tollgate.cost_usd"] > 0
    assert server.start_time_unix_nano <= client.start_time_unix_nano <= client.end_time_unix_nano <= server.end_time_unix_nano
    return server, client


def no_content_or_secret(stack, *texts):
    raw = b"".join(r for _, r, _ in stack.receiver.exports)
    for text in (PROMPT, CLIENT_KEY, UPSTREAM_KEY, *texts):
        assert text.encode() not in raw, text


def oa(stack, **kw):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=CLIENT_KEY, max_retries=0, **kw)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_spans(stack, stream):
    client = oa(stack)
    messages = [{"role": "user", "content": PROMPT}]
    if stream:
        raw = client.chat.completions.with_raw_response.create(
            model="alpha-5.5", messages=messages, stream=True, stream_options={"include_usage": True})
        chunks = list(raw.parse())
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage, response_model = chunks[-1].usage, chunks[0].model
    else:
        raw = client.chat.completions.with_raw_response.create(model="alpha-5.5", messages=messages)
        r = raw.parse()
        answer, usage, response_model = r.choices[0].message.content, r.usage, r.model
    check_model_call(stack, raw.headers["x-request-id"], "chat", "openai", "alpha-5.5", response_model, "stop",
                     (usage.prompt_tokens, usage.completion_tokens))
    no_content_or_secret(stack, answer)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_spans(stack, stream):
    client = anthropic.Anthropic(base_url=stack.url, api_key=CLIENT_KEY, max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    if stream:
        with client.messages.stream(model="beta-opus-4-7", max_tokens=16, messages=messages) as s:
            answer = "".join(s.text_stream)
            final = s.get_final_message()
            request_id = s.response.headers["x-request-id"]
    else:
        raw = client.messages.with_raw_response.create(model="beta-opus-4-7", max_tokens=16, messages=messages)
        final, request_id = raw.parse(), raw.headers["x-request-id"]
        answer = final.content[0].text
    check_model_call(stack, request_id, "chat", "anthropic", "beta-opus-4-7", final.model, final.stop_reason,
                     (final.usage.input_tokens, final.usage.output_tokens))
    no_content_or_secret(stack, answer)


def test_a_bedrock_call_names_its_system_and_both_model_names(stack):
    client = anthropic.Anthropic(base_url=stack.url, api_key=CLIENT_KEY, max_retries=0)
    with client.messages.stream(model="beta-bedrock-4-6", max_tokens=16, messages=[{"role": "user", "content": PROMPT}]) as s:
        answer = "".join(s.text_stream)
        final = s.get_final_message()
        request_id = s.response.headers["x-request-id"]
    assert final.model == "beta-bedrock-4-6"
    server, clients = request_spans(stack.receiver, request_id)
    a, c = attrs(server), attrs(clients[0])
    assert a["gen_ai.provider.name"] == c["gen_ai.provider.name"] == "aws.bedrock"
    assert c["gen_ai.system"] == "aws.bedrock"
    # The request as the client named the model; the attempt as Bedrock knows it.
    assert a["gen_ai.request.model"] == "beta-bedrock-4-6"
    assert c["gen_ai.request.model"] == "anthropic.claude-sonnet-4-6-v1:0"
    assert a["gen_ai.usage.output_tokens"] == final.usage.output_tokens
    no_content_or_secret(stack, answer)


@pytest.mark.parametrize("stream", [False, True])
def test_generate_content_spans(stack, stream):
    tag = f"gemini-{stream}"
    c = genai.Client(api_key=CLIENT_KEY, http_options=genai_types.HttpOptions(base_url=stack.url, headers={"x-request-id": tag}))
    if stream:
        chunks = list(c.models.generate_content_stream(model="gamma-3.5-flash", contents=PROMPT))
        last = chunks[-1]
        answer = "".join(ch.text or "" for ch in chunks)
    else:
        last = c.models.generate_content(model="gamma-3.5-flash", contents=PROMPT)
        answer = last.text
    # The client's own well-formed request id is the request's id, on the span too.
    check_model_call(stack, tag, "generate_content", "gcp.gemini", "gamma-3.5-flash", last.model_version,
                     last.candidates[0].finish_reason.value,
                     (last.usage_metadata.prompt_token_count, last.usage_metadata.candidates_token_count))
    no_content_or_secret(stack, answer)


def test_export_carries_the_collector_headers_and_the_resource(stack):
    oa(stack).chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}])
    stack.receiver.wait_for(lambda spans: spans)
    headers, _, req = stack.receiver.exports[-1]
    assert headers.get("x-collector-token") == COLLECTOR_TOKEN
    resource = {kv.key: kv.value.string_value for kv in req.resource_spans[0].resource.attributes}
    assert resource["service.name"] == ("edge-grpc" if stack.protocol == "grpc" else "tollgate")
    assert req.resource_spans[0].scope_spans[0].scope.name == "tollgate"


def test_a_retry_shows_two_sibling_client_spans(stack):
    raw = oa(stack).chat.completions.with_raw_response.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-mock-only": "/p1", "x-mock-status": "500"})
    assert raw.parse().choices[0].message.content
    server, clients = request_spans(stack.receiver, raw.headers["x-request-id"], clients=2)
    clients.sort(key=lambda s: s.start_time_unix_nano)
    failed, answered = attrs(clients[0]), attrs(clients[1])
    assert failed["tollgate.provider"] == "oa-primary" and failed["http.response.status_code"] == 500
    assert failed["error.type"] == "500" and clients[0].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert answered["tollgate.provider"] == "oa-backup" and answered["http.response.status_code"] == 200
    assert "error.type" not in answered
    assert clients[0].end_time_unix_nano <= clients[1].start_time_unix_nano
    assert all(c.parent_span_id == server.span_id for c in clients)


def test_a_client_trace_is_continued_and_carried_upstream(stack):
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    tag = f"traced-{stack.protocol.replace('/', '-')}"
    raw = oa(stack).chat.completions.with_raw_response.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": f"00-{trace_id}-{parent}-01", "tracestate": "vendor=abc", "x-test-tag": tag})
    server, clients = request_spans(stack.receiver, raw.headers["x-request-id"])
    assert server.trace_id.hex() == trace_id and server.parent_span_id.hex() == parent
    assert server.trace_state == "vendor=abc"
    seen = httpx.get(f"{stack.mock}/__mock/requests", params={"tag": tag}).json()
    assert len(seen) == 1
    headers = seen[0]["headers"]
    assert headers["traceparent"] == [f"00-{trace_id}-{clients[0].span_id.hex()}-01"]
    assert headers["tracestate"] == ["vendor=abc"]


def test_without_a_client_trace_tollgate_starts_one(stack):
    tag = f"untraced-{stack.protocol.replace('/', '-')}"
    raw = oa(stack).chat.completions.with_raw_response.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-test-tag": tag})
    server, clients = request_spans(stack.receiver, raw.headers["x-request-id"])
    assert server.parent_span_id == b"" and len(server.trace_id) == 16
    sent = httpx.get(f"{stack.mock}/__mock/requests", params={"tag": tag}).json()[0]["headers"]["traceparent"][0]
    assert sent == f"00-{server.trace_id.hex()}-{clients[0].span_id.hex()}-01"


@pytest.mark.parametrize("case", ["no_key", "no_balance", "unknown_model"])
def test_a_refused_request_has_its_refusal_on_the_span(stack, case):
    key = {"no_key": "sk-wrong-key-0000", "no_balance": POOR_KEY}.get(case, CLIENT_KEY)
    model = "no-such-model" if case == "unknown_model" else "alpha-5.5"
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code in (401, 402, 404)
    server, clients = request_spans(stack.receiver, r.headers["x-request-id"], clients=0)
    a = attrs(server)
    assert clients == []
    assert a["http.response.status_code"] == r.status_code
    assert a["tollgate.refusal"] == a["error.type"] and a["tollgate.refusal"]
    # A client error is not the server's: the span's status stays unset.
    assert server.status.code == trace_pb2.Status.STATUS_CODE_UNSET
    if case == "no_balance":
        assert a["tollgate.key.name"] == "otlp-poor" and a["gen_ai.request.model"] == "alpha-5.5"
    if case == "no_key":
        assert "tollgate.key.name" not in a
    no_content_or_secret(stack, "sk-wrong-key-0000")


def test_a_dead_collector_leaves_every_request_served(mock):
    """A collector that is not there (refused connections), and one that accepts and never
    answers: every request is served, and the spans that could not wait are counted."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts into its backlog, never reads, never answers
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    for endpoint in (f"http://127.0.0.1:{closed_port}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
        tmp = tempfile.mkdtemp(prefix="tollgate-otlp-dead-")
        telemetry = f"telemetry: {{ otlp: {{ endpoint: \"{endpoint}\" }} }}"
        env = {"OTEL_BSP_SCHEDULE_DELAY": "10", "OTEL_BSP_MAX_QUEUE_SIZE": "8", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4",
               "OTEL_EXPORTER_OTLP_TIMEOUT": "30000"}
        gw, url, admin = start_gateway(tmp, mock, telemetry, env)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=10)
            for i in range(40):
                r = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": f"hi {i}"}])
                assert r.choices[0].message.content
            metrics = httpx.get(f"{admin}/metrics", headers={"authorization": "Bearer admin-otlp-token"}).text
            dropped = [l for l in metrics.splitlines() if l.startswith('tollgate_otlp_spans_total{outcome="dropped_queue_full"}')]
            assert dropped and float(dropped[0].split()[-1]) > 0, metrics
        finally:
            gw.kill()
            gw.wait()
    silent.close()


def test_a_realtime_session_has_a_client_span_per_turn_with_its_usage(stack):
    url = stack.url.replace("http://", "ws://") + "/v1/realtime?model=alpha-realtime"
    usages = []
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as ws:
        request_id = ws.response.headers["x-request-id"]
        assert json.loads(ws.recv())["type"] == "session.created"
        for _ in range(2):
            ws.send(json.dumps({"type": "response.create"}))
            while True:
                event = json.loads(ws.recv())
                if event["type"] == "response.done":
                    usages.append(event["response"]["usage"])
                    break
    server, clients = request_spans(stack.receiver, request_id, clients=2)
    turns = sorted(clients, key=lambda s: s.start_time_unix_nano)
    assert [s.name for s in turns] == ["realtime alpha-realtime"] * 2
    for span, usage in zip(turns, usages):
        a = attrs(span)
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])
        assert a["gen_ai.provider.name"] == "openai" and a["tollgate.estimated"] is False
        assert server.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano <= server.end_time_unix_nano
    assert attrs(server)["http.response.status_code"] == 101


def test_a_media_call_is_traced_under_its_endpoint_with_its_cost(stack):
    raw = oa(stack).images.with_raw_response.generate(model="alpha-image", prompt=PROMPT, n=1)
    image = raw.parse()
    server, clients = request_spans(stack.receiver, raw.headers["x-request-id"])
    a, c = attrs(server), attrs(clients[0])
    assert a["http.route"] == "image_generation" and a["http.response.status_code"] == 200
    assert c["gen_ai.request.model"] == "alpha-image" and c["http.response.status_code"] == 200
    assert a["tollgate.cost_usd"] > 0 and a["tollgate.estimated"] is False
    assert a["gen_ai.usage.output_tokens"] == image.usage.output_tokens
    no_content_or_secret(stack, image.data[0].b64_json[:64])


def test_a_tool_call_has_a_client_span_with_the_mcp_attributes(stack):
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", "accept": "application/json, text/event-stream"}
    init = httpx.post(stack.url + "/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    headers["mcp-session-id"] = init.headers["mcp-session-id"]
    secret = "the-secret-tool-argument"
    r = httpx.post(stack.url + "/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                   "params": {"name": "mock__echo", "arguments": {"text": secret}}})
    assert r.json()["result"]["content"][0]["text"] == secret
    server, clients = request_spans(stack.receiver, r.headers["x-request-id"])
    a, c = attrs(server), attrs(clients[0])
    assert server.name == "execute_tool mock__echo" and clients[0].name == "tools/call echo"
    assert a["http.route"] == "mcp_tool_call" and a["gen_ai.operation.name"] == "execute_tool" and a["tollgate.cost_usd"] == 0.002
    assert c["mcp.method.name"] == "tools/call" and c["gen_ai.tool.name"] == "echo" and c["gen_ai.operation.name"] == "execute_tool"
    assert c["mcp.protocol.version"] == "2025-06-18" and c["mcp.session.id"] and c["tollgate.mcp.server"] == "mock"
    assert c["server.address"] == "127.0.0.1" and "error.type" not in c
    assert server.start_time_unix_nano <= clients[0].start_time_unix_nano <= clients[0].end_time_unix_nano <= server.end_time_unix_nano
    no_content_or_secret(stack, secret)
