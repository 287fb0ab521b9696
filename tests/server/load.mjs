// Load generator for `augur serve`: C concurrent streaming clients, each
// sending R requests one after another; every request must complete or get
// an explicit error (none lost, none hung). Prints time to first token and
// inter-token latency (p50, p99), and output tokens a second.
//
//   node tests/server/load.mjs --augur BIN --model DIR [serve options after --]
//   node tests/server/load.mjs --base http://host:port
//   options: --clients 64 --requests 4 --prompt-words 64 --max-tokens 64 --json --expect-429
import { spawn } from "node:child_process";
import OpenAI from "openai";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf("--" + name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const clients = Number(opt("clients", 64));
const requests = Number(opt("requests", 4));
const promptWords = Number(opt("prompt-words", 64));
const maxTokens = Number(opt("max-tokens", 64));
const json = args.includes("--json");
const rest = args.includes("--") ? args.slice(args.indexOf("--") + 1) : [];

let base = opt("base", "");
let proc = null;
if (!base) {
  const augur = opt("augur", ""), model = opt("model", "");
  if (!augur || !model) {
    console.error("give --base URL, or --augur BIN --model DIR");
    process.exit(2);
  }
  proc = spawn(augur, ["serve", model, "--port", "0", ...rest], { stdio: ["ignore", "ignore", "pipe"] });
  base = await new Promise((resolve, reject) => {
    let log = "";
    proc.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(`http://127.0.0.1:${m[1]}`);
    });
    proc.on("exit", (c) => reject(new Error(`augur serve exited (${c}): ${log}`)));
  });
}
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0, timeout: 600000 });
const model = (await client.models.list()).data[0].id;

const words = "the of and to in a is that for it as was with be by on not he this are or his from at which".split(" ");
const ttft = [], itl = [];
let tokens = 0, completed = 0, errors = 0, lost = 0;
const errorKinds = {};
const t0 = performance.now();

async function one(c, r) {
  let seed = c * 7919 + r * 104729;
  const prompt = Array.from({ length: promptWords }, () => words[(seed = (seed * 1103515245 + 12345) % 2147483648) % words.length]).join(" ");
  const start = performance.now();
  let last = null, n = 0, finish = null;
  try {
    const stream = await client.completions.create({ model, prompt, max_tokens: maxTokens, temperature: 0.7, seed, stream: true,
      stream_options: { include_usage: true } });
    for await (const chunk of stream) {
      if (chunk.usage) tokens += chunk.usage.completion_tokens;
      const ch = chunk.choices[0];
      if (!ch) continue;
      if (ch.text) {
        const now = performance.now();
        if (last === null) ttft.push(now - start);
        else itl.push(now - last);
        last = now;
        n++;
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (finish) completed++;
    else lost++;
  } catch (e) {
    errors++;
    const k = e.status ? String(e.status) : e.name;
    errorKinds[k] = (errorKinds[k] ?? 0) + 1;
  }
}

await Promise.all(Array.from({ length: clients }, async (_, c) => {
  for (let r = 0; r < requests; r++) await one(c, r);
}));
const wall = (performance.now() - t0) / 1000;
const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const report = {
  clients, requests_per_client: requests, prompt_words: promptWords, max_tokens: maxTokens,
  completed, errors, error_kinds: errorKinds, lost, wall_s: wall, output_tokens: tokens,
  output_tokens_per_s: tokens / wall,
  ttft_ms: { p50: pct(ttft, 50), p99: pct(ttft, 99) },
  itl_ms: { p50: pct(itl, 50), p99: pct(itl, 99) },
};
const health = await fetch(base + "/health");
report.healthy_after = health.status === 200;
if (json) console.log(JSON.stringify(report));
else
  console.log(`${completed}/${clients * requests} completed, ${errors} errors ${JSON.stringify(errorKinds)}, ${lost} lost; ` +
    `${tokens} tokens in ${wall.toFixed(2)} s = ${(tokens / wall).toFixed(1)} tok/s; ` +
    `TTFT p50 ${report.ttft_ms.p50.toFixed(1)} ms p99 ${report.ttft_ms.p99.toFixed(1)} ms; ` +
    `ITL p50 ${report.itl_ms.p50.toFixed(2)} ms p99 ${report.itl_ms.p99.toFixed(2)} ms`);
if (proc) proc.kill("SIGTERM");
// A lost or hung request, or an unhealthy server, fails the run; explicit
// errors (429 past the queue) are allowed.
// --expect-429: the queue was meant to overflow, so some requests must have
// been refused with 429.
const want429 = !args.includes("--expect-429") || (errorKinds["429"] ?? 0) > 0;
process.exit(lost === 0 && completed + errors === clients * requests && report.healthy_after && want429 ? 0 : 1);
