"""Realtime sessions through tollgate: the official `openai` SDK's `realtime.connect()` and a raw
`websockets` client (for the subprotocol form of the key and for cuts) against the mock's
scripted session. A text turn, an audio turn with its deltas in order, a tool call round trip,
turns billed exactly from their `response.done` usage, a turn refused for balance with the
session kept, a session closed once the balance is spent, a client that leaves mid-turn billed
its hold, the frame and session bounds, `max_concurrent` counting sessions, and the client's key
never reaching the upstream."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import openai
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, wait_listening

KEY = "sk-sdk-realtime-0001"
SHARED = "sk-sdk-realtime-0002"
SPENT = "sk-sdk-realtime-0003"
SOLO = "sk-sdk-realtime-0004"
CUT = "sk-sdk-realtime-0005"
MANY = "sk-sdk-realtime-0006"
LOW = "sk-sdk-realtime-0007"
VAD = "sk-sdk-realtime-0008"
CAPPED = "sk-sdk-realtime-0009"
MODEL = "alpha-realtime"
# USD per 1M tokens.
PRICE = {"input": 4.0, "output": 16.0, "cached_input": 0.4, "audio_input": 32.0, "audio_output": 64.0}
# What one turn is held for: (previous input + 4000) at the dearest input price, the default
# output allowance (4096) at the dearest output price.
FIRST_TURN_HOLD = (4000 * round(32.0 * 1e9) + 500_000) // 1_000_000 + (4096 * round(64.0 * 1e9) + 500_000) // 1_000_000


def nanos(tokens, usd):
    return (tokens * round(usd * 1e9) + 500_000) // 1_000_000


def turn_cost(u):
    """What a `response.done` usage costs (the SDK's object or a dict)."""
    get = (lambda o, k: o.get(k)) if isinstance(u, dict) else getattr
    inp, out = get(u, "input_token_details"), get(u, "output_token_details")
    cached = get(inp, "cached_tokens") or 0
    audio_in = get(inp, "audio_tokens") or 0
    text_in = get(u, "input_tokens") - cached - audio_in
    audio_out = get(out, "audio_tokens") or 0
    text_out = get(u, "output_tokens") - audio_out
    return (nanos(text_in, PRICE["input"]) + nanos(audio_in, PRICE["audio_input"]) + nanos(cached, PRICE["cached_input"])
            + nanos(text_out, PRICE["output"]) + nanos(audio_out, PRICE["audio_output"]))


class Gw:
    def __init__(self, url, mock):
        self.url, self.mock = url, mock

    def client(self, key=KEY):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def ws_url(self):
        return self.url.replace("http://", "ws://") + f"/v1/realtime?model={MODEL}"

    def balance(self, key=KEY):
        req = urllib.request.Request(self.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)

    def mock_requests(self):
        with urllib.request.urlopen(self.mock + "/__mock/requests") as r:
            return json.load(r)


def start(tmp, limits="", tls=False):
    """The mock and a gateway; with `tls`, an HTTPS listener too (a test CA's certificate: its
    URL and the CA's file in the gateway's `tls_url` and `ca`)."""
    mock_port, gw_port, tls_port = free_port(), free_port(), free_port()
    if tls:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.private_key_and_cert_chain_pem.write_to_path(os.path.join(tmp, "server.pem"))
        cert.private_key_pem.write_to_path(os.path.join(tmp, "key.pem"))
        ca.cert_pem.write_to_path(os.path.join(tmp, "ca.pem"))
        limits += f"\ntls: {{ listen: 127.0.0.1:{tls_port}, cert: {tmp}/server.pem, key: {tmp}/key.pem }}\n"
    mock = subprocess.Popen([os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY])
    wait_listening(mock_port, mock, "tollgate-mock")
    prices = ", ".join(f"{k}: {v}" for k, v in PRICE.items())
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
{limits}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [{MODEL}] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  {MODEL}: {{ {prices} }}
keys:
  - {{ key: {KEY}, name: rt, group: default, balance: 5.0 }}
  - {{ key: {SHARED}, name: shared, group: default, balance: 0.5 }}
  - {{ key: {SPENT}, name: spent, group: default, balance: 1.0 }}
  - {{ key: {SOLO}, name: solo, group: default, balance: 5.0, max_concurrent: 1 }}
  - {{ key: {CUT}, name: cut, group: default, balance: 5.0 }}
  - {{ key: {MANY}, name: many, group: default, balance: 5.0 }}
  - {{ key: {LOW}, name: low, group: default, balance: 0.2 }}
  - {{ key: {VAD}, name: vad, group: default, balance: 0.2 }}
  - {{ key: {CAPPED}, name: capped, group: default, balance: 50.0 }}
"""
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config)
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn"})
    wait_listening(gw_port, gw, "tollgate")
    g = Gw(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{mock_port}")
    if tls:
        wait_listening(tls_port, gw, "tollgate (TLS)")
        g.tls_url, g.ca = f"https://127.0.0.1:{tls_port}", os.path.join(tmp, "ca.pem")
    return [gw, mock], g


@pytest.fixture(scope="module")
def rt():
    tmp = tempfile.mkdtemp(prefix="tollgate-realtime-")
    procs, gw = start(tmp, "limits: { realtime_max_frame_bytes: 65536, realtime_sessions_per_key: 3 }")
    try:
        yield gw
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def say(conn, text):
    conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})


def until_done(conn):
    events = []
    for event in conn:
        events.append(event)
        if event.type in ("response.done", "error"):
            return events
    raise AssertionError(f"the session ended before the turn did: {[e.type for e in events]}")


def test_text_audio_and_tool_turns_are_relayed_in_order_and_billed_exactly(rt):
    before = rt.balance()
    charged = 0
    with rt.client().realtime.connect(model=MODEL) as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]})
        # A text turn.
        say(conn, "hello")
        conn.response.create()
        events = until_done(conn)
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == "Hello from realtime"
        charged += turn_cost(events[-1].response.usage)
        # An audio turn: audio in, audio and transcript deltas out, in the order sent.
        for _ in range(2):
            conn.input_audio_buffer.append(audio=base64.b64encode(b"\x00" * 4800).decode())
        conn.input_audio_buffer.commit()
        conn.response.create(response={"output_modalities": ["audio"]})
        events = until_done(conn)
        kinds = [e.type for e in events if e.type.startswith("response.output_audio")]
        assert kinds == ["response.output_audio.delta", "response.output_audio_transcript.delta"] * 3
        usage = events[-1].response.usage
        assert usage.input_token_details.audio_tokens > 0 and usage.output_token_details.audio_tokens == 90
        charged += turn_cost(usage)
        # A tool call and its result.
        say(conn, "what is the weather in Paris?")
        conn.response.create()
        events = until_done(conn)
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert json.loads(args) == {"city": "Paris"}
        charged += turn_cost(events[-1].response.usage)
        conn.conversation.item.create(item={"type": "function_call_output", "call_id": "call_mock_1", "output": "sunny"})
        conn.response.create()
        events = until_done(conn)
        charged += turn_cost(events[-1].response.usage)
        assert events[-1].response.usage.input_token_details.cached_tokens > 0, "later turns read the cache"
    assert rt.balance() == before - charged


def test_a_turn_that_cannot_be_covered_is_refused_and_the_session_stays_open(rt):
    # Two sessions of a key with $0.50: the first holds a turn, the second cannot.
    auth = {"Authorization": f"Bearer {SHARED}"}
    with ws_connect(rt.ws_url(), additional_headers=auth) as first, ws_connect(rt.ws_url(), additional_headers=auth) as second:
        for ws in (first, second):
            assert json.loads(ws.recv())["type"] == "session.created"
        first.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[hold]"}]}}))
        first.send(json.dumps({"type": "response.create"}))
        seen = [json.loads(first.recv())["type"] for _ in range(3)]
        assert seen == ["conversation.item.created", "response.created", "response.output_text.delta"]
        second.send(json.dumps({"type": "response.create"}))
        refused = json.loads(second.recv())
        assert refused["type"] == "error" and "balance" in refused["error"]["message"], refused
        # Still open: the next event is answered.
        second.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "be brief"}}))
        assert json.loads(second.recv())["type"] == "session.updated"


def test_a_session_is_closed_once_the_balance_is_spent(rt):
    with rt.client(SPENT).realtime.connect(model=MODEL) as conn:
        say(conn, "[big] tell me everything")
        conn.response.create()
        events = until_done(conn)
        assert turn_cost(events[-1].response.usage) > 1_000_000_000
        with pytest.raises(ConnectionClosed) as closed:
            conn.recv()
    assert closed.value.rcvd.code == 1008 and "balance" in closed.value.rcvd.reason
    assert rt.balance(SPENT) < 0
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {SPENT}"})
    assert refused.value.response.status_code == 402


def test_a_client_that_leaves_mid_turn_is_billed_the_turns_hold(rt):
    before = rt.balance(CUT)
    ws = ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {CUT}"})  # noqa: SIM115 (cut, never closed)
    assert json.loads(ws.recv())["type"] == "session.created"
    ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[hold]"}]}}))
    ws.send(json.dumps({"type": "response.create"}))
    assert [json.loads(ws.recv())["type"] for _ in range(3)][-1] == "response.output_text.delta"
    ws.socket.close()  # gone without a close frame
    # The session ends, its open turn billed its hold (fail closed); settled once the gateway
    # saw the connection go, which the client cannot observe: wait for the charge.
    deadline = time.monotonic() + 10
    while rt.balance(CUT) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rt.balance(CUT) == before - FIRST_TURN_HOLD


def test_the_key_subprotocol_works_and_no_client_key_reaches_the_upstream(rt):
    with ws_connect(rt.ws_url(), subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv())["type"] == "session.created"
    upgrades = [r for r in rt.mock_requests() if r["path"].endswith("/v1/realtime")]
    assert upgrades
    for r in upgrades:
        assert r["headers"]["authorization"] == [f"Bearer {UPSTREAM_KEY}"]
        assert not any(KEY in v or SHARED in v for vs in r["headers"].values() for v in vs), r["headers"]
    assert upgrades[-1]["headers"]["sec-websocket-protocol"] == ["realtime"]
    # No key at all: refused before any upgrade.
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(rt.ws_url())
    assert refused.value.response.status_code == 401


def test_frames_sessions_and_concurrency_are_bounded(rt):
    # A frame over realtime_max_frame_bytes (64 KiB here) closes the session with 1009.
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {KEY}"}, max_size=None) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 100_000}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd.code == 1009
    # max_concurrent counts open sessions.
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {SOLO}"}):
        with pytest.raises(InvalidStatus) as busy:
            ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {SOLO}"})
        assert busy.value.response.status_code == 429


@pytest.mark.parametrize("limit, reason, code", [("realtime_max_secs: 1", "session time limit", 1008), ("realtime_idle_secs: 1", "session idle", 1001)])
def test_a_session_past_its_time_or_idle_limit_is_closed(limit, reason, code):
    tmp = tempfile.mkdtemp(prefix="tollgate-realtime-limit-")
    procs, gw = start(tmp, f"limits: {{ {limit} }}")
    try:
        with ws_connect(gw.ws_url(), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert json.loads(ws.recv())["type"] == "session.created"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (code, reason)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_an_upstream_that_drops_the_session_mid_turn_ends_it_and_the_turn_is_billed_its_hold(rt):
    before = rt.balance(CUT)
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {CUT}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[cut]"}]}}))
        ws.send(json.dumps({"type": "response.create"}))
        seen = [json.loads(ws.recv())["type"] for _ in range(3)]
        assert seen[-1] == "response.output_text.delta"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd.code == 1011
    # Settled before the close frame went out.
    assert rt.balance(CUT) == before - FIRST_TURN_HOLD


def recv_until(ws, kind, n=1):
    """Events up to the `n`th of type `kind`."""
    events = []
    while sum(e["type"] == kind for e in events) < n:
        events.append(json.loads(ws.recv(timeout=30)))
    return events


def test_responses_asked_for_at_once_are_each_held_and_each_billed(rt):
    # Out-of-band responses run beside each other upstream; each is held as it is asked for and
    # each `response.done` billed from its own usage (only the first was, before).
    before = rt.balance(MANY)
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {MANY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        for _ in range(8):
            ws.send(json.dumps({"type": "response.create",
                                "response": {"conversation": "none", "output_modalities": ["text"], "metadata": {"mock": "together"}}}))
        # All eight under way at once upstream (announced), then run.
        created = recv_until(ws, "response.created", 8)
        assert [e["type"] for e in created] == ["response.created"] * 8, created
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[go]"}]}}))
        events = recv_until(ws, "response.done", 8)
        assert not [e for e in events if e["type"] == "error"], events
        done = [e for e in events if e["type"] == "response.done"]
        assert len({d["response"]["id"] for d in done}) == 8
    assert rt.balance(MANY) == before - sum(turn_cost(d["response"]["usage"]) for d in done)


def test_a_turn_asks_the_upstream_to_stop_where_its_hold_ends(rt):
    # `[big]` would write a million tokens: the upstream is told the allowance the turn was held
    # for (4096, the default), so the turn costs what was held at most.
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {CAPPED}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[big]"}]}}))
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": "inf"}}))
        done = recv_until(ws, "response.done")[-1]
    assert done["response"]["usage"]["output_tokens"] == 4096


def test_a_response_create_in_fragments_is_read_whole_and_held(rt):
    # $0.20 cannot hold a turn ($0.39): a `response.create` sent in three fragments is refused as
    # a whole one is, and never reaches the upstream.
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {LOW}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(iter(['{"type": "resp', 'onse.create", "response"', ': {}}']))
        refused = json.loads(ws.recv(timeout=30))
        assert refused["type"] == "error" and refused["error"]["code"] == "insufficient_balance", refused
        # A fragmented message that is not a turn is relayed whole.
        ws.send(iter(['{"type": "session.update", ', '"session": {"type": "realtime", "instructions": "hi"}}']))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"


def test_a_turn_the_server_starts_and_tollgate_cancels_is_billed_what_it_used(rt):
    # Server voice activity starts a turn the key cannot hold: tollgate cancels it upstream and
    # tells the client, but the upstream ran it (its `response.done` reports usage): billed.
    before = rt.balance(VAD)
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {VAD}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "turn_detection": {"type": "server_vad"}}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = recv_until(ws, "response.done")
        assert any(e["type"] == "error" and e["error"]["code"] == "insufficient_balance" for e in events), events
        done = events[-1]
        # Once a turn could not be held, the client's audio (which would start more turns the
        # server runs on its own) is not passed on: the next turn the server starts heard none.
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00" * 4800).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        later = recv_until(ws, "response.done")[-1]
        assert later["response"]["usage"]["input_token_details"]["audio_tokens"] == 0, later
    cost = turn_cost(done["response"]["usage"]) + turn_cost(later["response"]["usage"])
    assert cost > 0 and rt.balance(VAD) == before - cost


def test_a_key_holds_at_most_its_share_of_sessions(rt):
    auth = {"Authorization": f"Bearer {CAPPED}"}
    opened = [ws_connect(rt.ws_url(), additional_headers=auth) for _ in range(3)]
    try:
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(rt.ws_url(), additional_headers=auth)
        assert refused.value.response.status_code == 429
        # Another key is not affected.
        with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {MANY}"}) as other:
            assert json.loads(other.recv())["type"] == "session.created"
    finally:
        for ws in opened:
            ws.close()


def test_a_client_close_is_answered_with_a_close(rt):
    with ws_connect(rt.ws_url(), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.close(1000)
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000
    # The Python SDK's session, closed with a code of its own: the code comes back.
    with rt.client().realtime.connect(model=MODEL) as conn:
        assert conn.recv().type == "session.created"
        conn.close(code=4002, reason="done here")
        assert conn._connection.protocol.close_rcvd is not None and conn._connection.protocol.close_rcvd.code == 4002


def test_unfinished_frames_count_against_the_buffered_bytes_budget():
    # 1 MiB for every body and unfinished frame together: two sessions that each hold 700 KiB
    # of a frame cannot both be held — the one past the budget is closed (1013).
    import struct
    tmp = tempfile.mkdtemp(prefix="tollgate-realtime-budget-")
    procs, gw = start(tmp, "max_body_bytes: 262144\nmax_buffered_body_bytes: 1048576\nlimits: { realtime_max_frame_bytes: 2097152 }")
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        header = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", 1 << 20) + b"\0\0\0\0"
        with ws_connect(gw.ws_url(), additional_headers=auth) as first, ws_connect(gw.ws_url(), additional_headers=auth) as second:
            for ws in (first, second):
                assert json.loads(ws.recv())["type"] == "session.created"
            first.socket.sendall(header + b"A" * (700 << 10))
            second.socket.sendall(header + b"A" * (700 << 10))
            # The session whose frame went past the budget is closed (both may be, when each
            # grew past it while the other held its share); never are both left open.
            codes = []
            for ws in (first, second):
                try:
                    ws.recv(timeout=5)
                except ConnectionClosed as e:
                    codes.append(e.rcvd.code)
                except TimeoutError:
                    codes.append(None)
            assert 1013 in codes and set(codes) <= {1013, None}, codes
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_turns_the_server_starts_itself_are_bounded_from_the_start():
    # Voice activity detection is on from the session's start and the client never sends a
    # `session.update`: tollgate bounds the session's turns when it begins (its own update's
    # answer is not relayed), so a `[big]` turn the server starts stops at the allowance.
    tmp = tempfile.mkdtemp(prefix="tollgate-realtime-vad-")
    procs, gw = start(tmp)
    try:
        headers = {"Authorization": f"Bearer {CAPPED}", "x-stainless-mock-vad": "1"}
        with ws_connect(gw.ws_url(), additional_headers=headers) as ws:
            assert json.loads(ws.recv())["type"] == "session.created"
            ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[big]"}]}}))
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            events = recv_until(ws, "response.done")
        assert "session.updated" not in [e["type"] for e in events], "tollgate's own update is not the client's"
        assert events[-1]["response"]["usage"]["output_tokens"] == 4096
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_both_javascript_realtime_clients_see_their_close_answered():
    """The openai JavaScript SDK's two realtime clients (they connect over wss: only) close their
    sessions (1000 over `ws`, 4001 over the runtime's WebSocket): each sees its own code
    answered, never 1006."""
    sdk = os.environ.get("TOLLGATE_JS_SDK")
    if not sdk or not os.path.isdir(os.path.join(sdk, "ws")):
        if os.environ.get("TOLLGATE_JS_SDK_REQUIRED"):
            pytest.fail("the openai and ws npm packages are required (tests/run_all.sh installs them)")
        pytest.skip("the openai and ws npm packages are not installed (tests/run_all.sh installs them)")
    tmp = tempfile.mkdtemp(prefix="tollgate-realtime-js-")
    procs, gw = start(tmp, tls=True)
    try:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "realtime_close.mjs")
        env = {**os.environ, "NODE_PATH": sdk, "BASE": gw.tls_url, "KEY": KEY, "MODEL": MODEL, "NODE_EXTRA_CA_CERTS": gw.ca}
        # Node 20 has the browser's WebSocket class behind a flag (22 on its own).
        out = subprocess.run(["node", "--experimental-websocket", script], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["ws"]["code"] == 1000, got
        assert got["websocket"]["code"] == 4001, got
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
