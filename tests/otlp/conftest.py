"""Starts an OTLP receiver (HTTP/protobuf or gRPC, decoding with the official
opentelemetry-proto definitions), tollgate-mock and tollgate (built by `cargo test`) exporting
its traces to the receiver."""
import os
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport import free_port, wait_listening  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "debug"))
UPSTREAM_KEY = "mock-upstream-key-otlp"
CLIENT_KEY = "sk-otlp-client-0001"
POOR_KEY = "sk-otlp-poor-0001"
COLLECTOR_TOKEN = "collector-token-1"


class Receiver:
    """What the collector received: every export's raw bytes, headers and decoded spans."""

    def __init__(self):
        self.cond = threading.Condition()
        self.exports = []  # (headers dict, raw bytes)
        self.spans = []

    def add(self, headers, raw):
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(raw)
        with self.cond:
            self.exports.append((headers, raw, req))
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    self.spans.extend(ss.spans)
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=20):
        """Wait until `predicate(spans)` returns something truthy (checked at every export)."""
        with self.cond:
            result = self.cond.wait_for(lambda: predicate(list(self.spans)), timeout=timeout)
        assert result, f"the receiver did not get the expected spans in {timeout}s; got {[s.name for s in self.spans]}"
        return result

    def trace(self, trace_id, count):
        """The spans of one trace, once `count` of them arrived."""
        return self.wait_for(lambda spans: (lambda mine: mine if len(mine) >= count else None)(
            [s for s in spans if s.trace_id == trace_id]))


def start_http_receiver(receiver):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add({k.lower(): v for k, v in self.headers.items()}, raw)
            body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1], server.shutdown


def start_grpc_receiver(receiver):
    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            receiver.add(dict(context.invocation_metadata()), request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, lambda: server.stop(0)


def config_text(tmp, gw_port, admin_port, mock_port, telemetry):
    return f"""
listen: 127.0.0.1:{gw_port}
admin: {{ listen: 127.0.0.1:{admin_port}, token: admin-otlp-token }}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa-primary, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/p1", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5, alpha-realtime, alpha-image], priority: 0 }}
  - {{ name: oa-backup, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/p2", api_key: {UPSTREAM_KEY},
      models: [alpha-5.5], priority: 1 }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [beta-opus-4-7] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [gamma-3.5-flash] }}
  - {{ name: br, protocol: bedrock, region: us-east-1, endpoint_url: "http://127.0.0.1:{mock_port}",
      aws: {{ access_key_id_env: OTLP_AWS_ID, secret_access_key_env: OTLP_AWS_SECRET }},
      models: [{{ name: beta-bedrock-4-6, upstream: "anthropic.claude-sonnet-4-6-v1:0" }}] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  alpha-realtime: {{ input: 4.0, output: 16.0, cached_input: 0.4, audio_input: 32.0, audio_output: 64.0 }}
  alpha-image: {{ input: 5.0, output: 10.0, image_input: 10.0, image_output: 40.0 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5 }}
  beta-bedrock-4-6: {{ input: 3.0, output: 15.0 }}
forward_headers: ["x-mock-*", "x-test-tag"]
mcp:
  servers:
    - {{ name: mock, url: "http://127.0.0.1:{mock_port}/mcp", prices: {{ per_call: 0.002 }} }}
keys:
  - {{ key: {CLIENT_KEY}, name: otlp-team, group: default, balance: 5.0, tags: {{ team: research }} }}
  - {{ key: {POOR_KEY}, name: otlp-poor, group: default, balance: 0.0 }}
{telemetry}
"""


class Stack:
    def __init__(self, url, admin, mock, receiver, protocol):
        self.url, self.admin, self.mock, self.receiver, self.protocol = url, admin, mock, receiver, protocol


def start_gateway(tmp, mock_port, telemetry, env):
    gw_port, admin_port = free_port(), free_port()
    path = os.path.join(tmp, "tollgate.yaml")
    with open(path, "w") as f:
        f.write(config_text(tmp, gw_port, admin_port, mock_port, telemetry))
    gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn", "OTLP_AWS_ID": "AKIDMOCKTOLLGATE",
                                                                          "OTLP_AWS_SECRET": "mock-aws-secret-access-key", **env})
    wait_listening(gw_port, gw, "tollgate")
    return gw, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}"


@pytest.fixture(scope="module")
def mock():
    port = free_port()
    proc = subprocess.Popen([os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{port}", "--key", UPSTREAM_KEY])
    wait_listening(port, proc, "tollgate-mock")
    yield port
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module", params=["http/protobuf", "grpc"])
def stack(request, mock):
    """A gateway exporting to a receiver: over http/protobuf configured in the file, over grpc
    configured only by the standard OTEL_* variables."""
    receiver = Receiver()
    tmp = tempfile.mkdtemp(prefix="tollgate-otlp-")
    env = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
    if request.param == "grpc":
        port, stop = start_grpc_receiver(receiver)
        telemetry = ""
        env.update({
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_HEADERS": f"x-collector-token={COLLECTOR_TOKEN}",
            "OTEL_SERVICE_NAME": "edge-grpc",
        })
    else:
        port, stop = start_http_receiver(receiver)
        telemetry = (f"telemetry: {{ otlp: {{ endpoint: \"http://127.0.0.1:{port}\", protocol: http/protobuf, "
                     f"headers: {{ x-collector-token: {COLLECTOR_TOKEN} }}, sample_ratio: 1.0 }} }}")
    gw, url, admin = start_gateway(tmp, mock, telemetry, env)
    try:
        yield Stack(url, admin, f"http://127.0.0.1:{mock}", receiver, request.param)
    finally:
        gw.kill()
        gw.wait()
        stop()
