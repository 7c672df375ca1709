// Both of the openai JavaScript SDK's realtime clients (OpenAIRealtimeWS over the `ws` package,
// OpenAIRealtimeWebSocket over the runtime's WebSocket) open a session through tollgate, close
// it with a code of their own, and report the close code their socket saw (issue 72: 1006 when
// the gateway ended the session without answering the close).
// Env: NODE_PATH (the SDK's node_modules), BASE (the gateway), KEY, MODEL.
import { createRequire } from "node:module";

// ES modules do not read NODE_PATH: the SDK is resolved from it.
const require = createRequire(import.meta.url);
const from = (name) => require(require.resolve(name, { paths: [process.env.NODE_PATH] }));
const { default: OpenAI } = from("openai");
const { OpenAIRealtimeWS } = from("openai/realtime/ws");
const { OpenAIRealtimeWebSocket } = from("openai/realtime/websocket");

const client = new OpenAI({ apiKey: process.env.KEY, baseURL: `${process.env.BASE}/v1` });

function session(Kind, code, reason) {
  return new Promise((resolve, reject) => {
    const rt = new Kind({ model: process.env.MODEL }, client);
    const timer = setTimeout(() => reject(new Error(`${Kind.name}: no close within 10 s`)), 10000);
    const done = (code, reason) => {
      clearTimeout(timer);
      resolve({ code, reason: String(reason) });
    };
    // `ws` passes (code, reason); the runtime's WebSocket a CloseEvent.
    const socket = rt.socket;
    if (typeof socket.on === "function") socket.on("close", (c, r) => done(c, r));
    else socket.addEventListener("close", (ev) => done(ev.code, ev.reason));
    rt.on("error", (e) => reject(e));
    rt.on("session.created", () => rt.close({ code, reason }));
  });
}

const out = {
  ws: await session(OpenAIRealtimeWS, 1000, "done"),
  websocket: await session(OpenAIRealtimeWebSocket, 4001, "going"),
};
console.log(JSON.stringify(out));
