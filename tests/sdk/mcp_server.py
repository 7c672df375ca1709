"""A real MCP server for the MCP gateway's tests, made with the official SDK (`mcp`'s
MCPServer): `python mcp_server.py NAME PORT [--token T] [--transport streamable-http|sse]`.

Tools: `search` (answers with the server's name and how many sessions' calls it has seen),
`slow` (reports progress n times), `drop_everything` (which the gateway's configuration hides),
`count_calls` (calls of every tool so far); a resource `NAME://readme` and a prompt
`summarize`. With `--token`, every request must carry `Authorization: Bearer T` (else 401),
and the server counts what it was sent with and without it."""
import argparse
import json

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

parser = argparse.ArgumentParser()
parser.add_argument("name")
parser.add_argument("port", type=int)
parser.add_argument("--token")
parser.add_argument("--transport", default="streamable-http")
args = parser.parse_args()

server = MCPServer(args.name)
calls = {"n": 0}
seen = {"authorization": []}


@server.tool()
def search(query: str) -> str:
    """Search the server's documents."""
    calls["n"] += 1
    return f"{args.name} found '{query}'"


@server.tool()
async def slow(n: int, ctx: Context) -> str:
    """Work in n steps, reporting each."""
    calls["n"] += 1
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return f"{args.name} did {n} steps"


@server.tool()
def drop_everything() -> str:
    """A tool the gateway's configuration hides."""
    calls["n"] += 1
    return "dropped"


@server.tool()
def broken() -> str:
    """A tool that runs and fails (a result with isError)."""
    calls["n"] += 1
    raise ToolError("the index is gone")


@server.tool()
def count_calls() -> str:
    """How many tool calls this process answered, and the credentials it was sent."""
    return json.dumps({"calls": calls["n"], "authorization": sorted(set(seen["authorization"])),
                       "x-api-key": sorted(set(seen.get("x-api-key", [])))})


@server.resource(f"{args.name}://readme")
def readme() -> str:
    return f"The readme of {args.name}."


@server.prompt()
def summarize(topic: str) -> str:
    return f"Summarize {topic} for {args.name}."


if args.transport == "sse":
    app = server.sse_app()
else:
    app = server.streamable_http_app()


def guarded(inner):
    """Refuse what does not carry the token (when there is one); note what was sent."""

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict((k.decode().lower(), v.decode()) for k, v in scope["headers"])
            got = headers.get("authorization", "")
            seen["authorization"].append(got)
            seen.setdefault("x-api-key", []).append(headers.get("x-api-key", ""))
            if args.token and got != f"Bearer {args.token}":
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await inner(scope, receive, send)

    return asgi


uvicorn.run(guarded(app), host="127.0.0.1", port=args.port, log_level="warning")
