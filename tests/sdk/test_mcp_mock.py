"""The bundled mock's MCP server (issue 52, point 5: what the MCP gateway's tests and the
README's offline example run against), driven by the official MCP Python SDK (`mcp`): the
client's era probe falls back to the initialize handshake, then tools are listed and called
(with progress notifications streamed over SSE), resources read and prompts got, and a call
outside a session is refused."""
import asyncio
import json
import os
import subprocess
import urllib.error
import urllib.request

import mcp
import pytest

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, wait_listening


@pytest.fixture(scope="module")
def mock_url():
    port = free_port()
    proc = subprocess.Popen([os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{port}", "--key", UPSTREAM_KEY])
    try:
        wait_listening(port, proc, "tollgate-mock")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


def test_the_official_client_lists_calls_reads_and_gets_from_the_mocks_mcp_server(mock_url):
    async def run():
        progress = []

        async def on_progress(done, total, message):
            progress.append((done, total))

        async with mcp.Client(mock_url) as client:
            tools = await client.list_tools()
            assert sorted(t.name for t in tools.tools) == ["add", "count", "echo", "fail"]
            added = await client.call_tool("add", {"a": 2, "b": 3})
            assert added.content[0].text == "5" and added.structured_content == {"result": 5} and not added.is_error
            counted = await client.call_tool("count", {"n": 4}, progress_callback=on_progress)
            assert counted.content[0].text == "counted to 4"
            failed = await client.call_tool("fail", {})
            assert failed.is_error
            resources = await client.list_resources()
            assert [str(r.uri) for r in resources.resources] == ["mock://readme"]
            read = await client.read_resource("mock://readme")
            assert read.contents[0].text == "The mock's readme."
            prompt = await client.get_prompt("greet", {"name": "Ada"})
            assert prompt.messages[0].content.text == "Say hello to Ada."
        return progress

    progress = asyncio.run(run())
    assert progress == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)], progress


def test_a_request_outside_a_session_is_refused(mock_url):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()
    req = urllib.request.Request(mock_url, data=body, headers={"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-session-id": "nope"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req)
    assert refused.value.code == 404
