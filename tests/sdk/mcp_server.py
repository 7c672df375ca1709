"""A real MCP server for the MCP gateway's tests, made with the official SDK (`mcp`'s
MCPServer): `python mcp_server.py NAME PORT [--token T] [--transport streamable-http|sse]`.

Tools: `search` (answers with the server's name and how many sessions' calls it has seen),
`slow` (reports progress n times), `drop_everything` (which the gateway's configuration hides),
`count_calls` (calls of every tool so far), with `--chatty` `chatty` (logs two messages while it works) and `ask` (asks the client for a
sampling and an elicitation) and `change` (says on its own stream that the tools changed and
the readme was updated), with `--issuer` `reject_token` (the token of this
call is refused from now on); a resource `NAME://readme` and a prompt `summarize` (its `topic` completed). With `--token`, every
request must carry `Authorization: Bearer T` (else 401); with `--issuer I --audience A`, a JWT
access token of issuer I for A, checked against I's keys (`I/jwks`). The server notes what it
was sent."""
import argparse
import json

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Completion, SamplingMessage, TextContent
from pydantic import BaseModel

parser = argparse.ArgumentParser()
parser.add_argument("name")
parser.add_argument("port", type=int)
parser.add_argument("--token")
parser.add_argument("--transport", default="streamable-http")
parser.add_argument("--issuer")
parser.add_argument("--audience")
parser.add_argument("--chatty", action="store_true")
args = parser.parse_args()

server = MCPServer(args.name)
calls = {"n": 0}
seen = {"authorization": []}
rejected = set()
current = {"authorization": ""}


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


def reject_token() -> str:
    """Refuse the token this call came with from now on (as a revoked one would be)."""
    rejected.add(current["authorization"])
    return "rejected"


if args.issuer:
    server.tool()(reject_token)


@server.tool()
def count_calls() -> str:
    """How many tool calls this process answered, and the credentials it was sent."""
    return json.dumps({"calls": calls["n"], "authorization": sorted(set(seen["authorization"])),
                       "x-api-key": sorted(set(seen.get("x-api-key", [])))})


async def chatty(ctx: Context) -> str:
    """Log two messages (info, then warning) while it works."""
    calls["n"] += 1
    await ctx.info(f"{args.name} is starting")
    await ctx.warning(f"{args.name} is nearly done")
    return f"{args.name} talked"


async def ask(ctx: Context) -> str:
    """Ask the client: a model's answer (sampling), then the user's pick (elicitation)."""
    calls["n"] += 1
    sampled = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text="name a toll road"))],
        max_tokens=16, related_request_id=ctx.request_id)

    class Pick(BaseModel):
        road: str

    picked = await ctx.elicit("Which road?", Pick)
    road = picked.data.road if picked.action == "accept" and picked.data else "-"
    return f"{sampled.content.text} / {picked.action} {road}"


async def change(ctx: Context) -> str:
    """Say, on the server's own stream (related to no request), that the tools changed and that
    the readme was updated."""
    calls["n"] += 1
    await ctx.session.send_tool_list_changed()
    await ctx.session.send_resource_updated(f"{args.name}://readme")
    return "changed"


if args.chatty:
    server.tool()(chatty)
    server.tool()(ask)
    server.tool()(change)


@server.completion()
async def complete(ref, argument, context):
    """The `summarize` prompt's `topic`: the topics that start with what was typed."""
    if getattr(ref, "name", None) == "summarize" and argument.name == "topic":
        return Completion(values=[t for t in ["tolls", "toll roads", "traffic"] if t.startswith(argument.value)])
    return None


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


def jwt_ok(header):
    """A JWT access token of `--issuer` for `--audience`, signed with one of the issuer's keys."""
    import jwt

    token = header.removeprefix("Bearer ")
    try:
        key = jwt.PyJWKClient(f"{args.issuer}/jwks").get_signing_key_from_jwt(token)
        jwt.decode(token, key.key, algorithms=["RS256", "PS256", "ES256"], audience=args.audience, issuer=args.issuer)
        return True
    except Exception:  # noqa: BLE001 - any failure is a refusal
        return False


def guarded(inner):
    """Refuse what does not carry the token (when there is one); note what was sent."""

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict((k.decode().lower(), v.decode()) for k, v in scope["headers"])
            got = headers.get("authorization", "")
            seen["authorization"].append(got)
            seen.setdefault("x-api-key", []).append(headers.get("x-api-key", ""))
            current["authorization"] = got
            refused = (args.token and got != f"Bearer {args.token}") or (args.issuer and not jwt_ok(got)) or got in rejected
            if refused:
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await inner(scope, receive, send)

    return asgi


uvicorn.run(guarded(app), host="127.0.0.1", port=args.port, log_level="warning")
