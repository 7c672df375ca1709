"""Batches through tollgate with the official `openai` Python SDK: an input file uploaded,
a batch created, polled to completion, its output and error files downloaded; billed exactly
at the batch prices line by line from the output's usage; an invalid input file refused naming
its line; a cancelled batch refunded what was not done; another key's batches and files
unreachable."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import openai
import pytest

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, start_mock, start_tollgate

KEY = "sk-sdk-batch-0001"
OTHER = "sk-sdk-batch-0002"
# USD per 1M tokens at the batch prices: explicit for alpha-batch, half of input/output for alpha-half.
BATCH_INPUT, BATCH_OUTPUT = 0.5, 3.0


class Batches:
    def __init__(self, mock, gateway):
        self.mock, self.gateway = mock, gateway

    def client(self, key=KEY):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=key, max_retries=0)

    def balance(self, key=KEY):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)


@pytest.fixture(scope="module")
def batches():
    tmp = tempfile.mkdtemp(prefix="tollgate-batches-")
    mock_port, gw_port = free_port(), free_port()
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-batch, alpha-half] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-batch: {{ input: 2.0, output: 8.0, batch_input: {BATCH_INPUT}, batch_output: {BATCH_OUTPUT} }}
  alpha-half: {{ input: 1.0, output: 4.0 }}
limits: {{ batch_poll_secs: 1 }}
keys:
  - {{ key: {KEY}, name: batcher, group: default, balance: 50.0 }}
  - {{ key: {OTHER}, name: other, group: default, balance: 5.0 }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port])
        procs.append(gw)
        yield Batches(f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{gw_port}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def nanos(tokens, usd_per_million):
    return (tokens * round(usd_per_million * 1e9) + 500_000) // 1_000_000


def jsonl(model, n, url="/v1/chat/completions", fail=()):
    lines = []
    for i in range(n):
        body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}]} if url != "/v1/embeddings" else {"model": model, "input": f"text {i}"}
        if i in fail:
            body["mock_fail"] = True
        lines.append(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(lines) + "\n").encode()


def wait_for(client, batch_id, status):
    deadline = time.monotonic() + 30
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status == status:
            return b
        assert time.monotonic() < deadline, f"batch stayed {b.status}"
        time.sleep(0.2)


def cost_of(output, batch_input, batch_output):
    total = 0
    for line in output.splitlines():
        usage = json.loads(line)["response"]["body"]["usage"]
        total += nanos(usage.get("prompt_tokens", 0), batch_input) + nanos(usage.get("completion_tokens", 0), batch_output)
    return total


def test_a_batch_is_uploaded_created_polled_and_downloaded_and_billed_at_the_batch_price(batches):
    client = batches.client()
    before = batches.balance()
    file = client.files.create(file=("eval.jsonl", jsonl("alpha-batch", 5, fail={3})), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"suite": "eval"})
    assert batch.id.startswith("batch_") and batch.status in ("validating", "in_progress")
    assert batch.request_counts.total == 5 and batch.metadata == {"suite": "eval"}
    held = before - batches.balance()
    assert held > 0, "the worst case is charged when the batch is accepted"
    done = wait_for(client, batch.id, "completed")
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 1)
    output = client.files.content(done.output_file_id).text
    errors = client.files.content(done.error_file_id).text
    assert sorted(json.loads(l)["custom_id"] for l in output.splitlines()) == ["req-0", "req-1", "req-2", "req-4"]
    assert [json.loads(l)["custom_id"] for l in errors.splitlines()] == ["req-3"]
    cost = cost_of(output, BATCH_INPUT, BATCH_OUTPUT)
    assert 0 < cost < held
    assert before - batches.balance() == cost, "settled line by line at the batch prices, the rest of the hold given back"
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    # Another key sees none of it.
    other = batches.client(OTHER)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id).text
    assert [b.id for b in other.batches.list()] == []


def test_without_batch_prices_a_batch_costs_half_of_input_and_output(batches):
    client = batches.client()
    before = batches.balance()
    file = client.files.create(file=("half.jsonl", jsonl("alpha-half", 3)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, batch.id, "completed")
    output = client.files.content(done.output_file_id).text
    assert before - batches.balance() == cost_of(output, 0.5, 2.0)
    # An embeddings batch: input only.
    before = batches.balance()
    file = client.files.create(file=("emb.jsonl", jsonl("alpha-half", 2, url="/v1/embeddings")), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    output = client.files.content(wait_for(client, batch.id, "completed").output_file_id).text
    assert '"embedding"' in output
    assert before - batches.balance() == cost_of(output, 0.5, 2.0) > 0


def test_an_invalid_input_file_is_refused_naming_its_line(batches):
    client = batches.client()
    before = batches.balance()
    lines = jsonl("alpha-batch", 2) + json.dumps({"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "alpha-batch"}}).encode() + b"\n"
    file = client.files.create(file=("bad.jsonl", lines), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "Line 3" in str(refused.value) and refused.value.body["param"] == "line 3: custom_id"
    assert batches.balance() == before


def test_a_cancelled_batch_is_refunded_what_was_not_done(batches):
    client = batches.client()
    before = batches.balance()
    file = client.files.create(file=("slow.jsonl", jsonl("alpha-batch", 6)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"mock_seconds": "600"})
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_for(client, batch.id, "cancelled")
    output = client.files.content(done.output_file_id).text
    assert len(output.splitlines()) == 3
    assert before - batches.balance() == cost_of(output, BATCH_INPUT, BATCH_OUTPUT)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
