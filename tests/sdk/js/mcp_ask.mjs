// The MCP TypeScript SDK's client (@modelcontextprotocol/sdk 1.x) through tollgate's /mcp: it
// declares sampling and elicitation, calls a tool that asks it for both (answering each), and
// a tool that logs while it works (at the level it set). Prints what it was asked, the
// results and the log messages, as JSON.
// Env: NODE_PATH (node_modules with the SDK), MCP_URL (the gateway's /mcp), KEY.
import { createRequire } from "node:module";

// ES modules do not read NODE_PATH: the SDK is resolved from it.
const require = createRequire(import.meta.url);
const from = (name) => require(require.resolve(name, { paths: [process.env.NODE_PATH] }));
const { Client } = from("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = from("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { CreateMessageRequestSchema, ElicitRequestSchema, LoggingMessageNotificationSchema } = from("@modelcontextprotocol/sdk/types.js");

const client = new Client({ name: "ts-through-tollgate", version: "1.0.0" }, { capabilities: { sampling: {}, elicitation: {} } });
const asked = [];
const logged = [];
client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
  asked.push(["sampling", req.params.messages[0].content.text, req.params.maxTokens]);
  return { role: "assistant", content: { type: "text", text: "the M6 toll" }, model: "alpha-5.5" };
});
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  asked.push(["elicitation", req.params.message]);
  return { action: "accept", content: { road: "A1" } };
});
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logged.push([n.params.level, n.params.data]));

const transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.KEY}` } },
});
await client.connect(transport);
await client.setLoggingLevel("info");
const ask = await client.callTool({ name: "ask", arguments: {} });
const chatty = await client.callTool({ name: "chatty", arguments: {} });
await client.close();
console.log(JSON.stringify({ asked, logged, ask: ask.content.map((c) => c.text), chatty: chatty.content.map((c) => c.text) }));
