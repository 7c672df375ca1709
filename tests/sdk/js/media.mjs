// The official `openai` npm package against tollgate (run by tests/sdk/test_media.py with
// NODE_PATH at the package): images generated and edited with a mask, and speech read as a
// stream whose first bytes must arrive while the mock upstream still holds the rest back.
// Prints one JSON line of what it saw; the Python side checks the bill.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { default: OpenAI, toFile } = require(require.resolve("openai", { paths: [process.env.NODE_PATH] }));

const client = new OpenAI({ baseURL: `${process.env.BASE}/v1`, apiKey: process.env.KEY, maxRetries: 0 });
const out = {};

const generated = await client.images.generate({ model: "alpha-image", prompt: "a fox from node", n: 2 });
out.generate = { n: generated.data.length, usage: generated.usage };

const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(3000, 7)]);
const edited = await client.images.edit({
  model: "alpha-image",
  prompt: "add a hat",
  image: [await toFile(png, "a.png", { type: "image/png" }), await toFile(png, "b.png", { type: "image/png" })],
  mask: await toFile(png, "mask.png", { type: "image/png" }),
});
out.edit = { image_tokens: edited.usage.input_tokens_details.image_tokens, usage: edited.usage };

const token = `js-speech-${process.pid}`;
const speech = await client.audio.speech.create(
  { model: "alpha-tts", voice: "alloy", input: process.env.TEXT },
  { headers: { "x-mock-hold": token, "x-mock-speech-bytes": "65536" } },
);
const reader = speech.body.getReader();
const late = new Promise((resolve) => setTimeout(() => resolve("late"), 10_000));
const first = await Promise.race([reader.read(), late]);
out.first_in_time = first !== "late";
await fetch(`${process.env.MOCK}/__mock/release?token=${token}`, { method: "POST" });
let total = first === "late" ? 0 : first.value.length;
if (first === "late") {
  const again = await reader.read();
  total += again.value ? again.value.length : 0;
}
for (;;) {
  const { done, value } = await reader.read();
  if (done) break;
  total += value.length;
}
out.speech_bytes = total;
console.log(JSON.stringify(out));
