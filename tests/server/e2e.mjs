// End-to-end tests of `augur serve`: the real server on loopback, driven by
// OpenAI's official client (the npm package `openai`) and by raw HTTP for
// what a client library would refuse to send.
//
//   node tests/server/e2e.mjs AUGUR_BINARY MODEL_DIR
//
// Each check prints "ok NAME" or "FAIL NAME: why"; the exit status is the
// number of failures.
import { spawn, execFileSync } from "node:child_process";
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { fileURLToPath } from "node:url";
import { writeByteTokenizer, writeChainModel } from "./chain_model.mjs";

const [augur, modelDir] = process.argv.slice(2);
if (!augur || !modelDir) {
  console.error("usage: node e2e.mjs AUGUR_BINARY MODEL_DIR");
  process.exit(2);
}

// Starts `augur serve` on a free port; resolves once it listens.
export function startServer(model, extra = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn(augur, ["serve", model, "--device", "cpu", "--port", "0", "--threads", "2", ...extra], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let log = "";
    const timer = setTimeout(() => reject(new Error("the server did not start:\n" + log)), 60000);
    proc.stderr.on("data", (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/([^:]+):(\d+)/);
      if (m) {
        clearTimeout(timer);
        const base = `http://127.0.0.1:${m[2]}`;
        resolve({ proc, base, log: () => log });
      }
    });
    proc.on("exit", (code) => reject(new Error(`the server exited (${code}):\n${log}`)));
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metrics(base) {
  const text = await (await fetch(base + "/metrics")).text();
  const get = (name) => {
    const m = text.match(new RegExp("^" + name + " ([0-9.e+-]+)$", "m"));
    return m ? Number(m[1]) : NaN;
  };
  return { text, get };
}

// `augur run` on the same prompt, greedy: what one request alone gives.
function runAlone(args) {
  const out = execFileSync(augur, ["run", modelDir, "--device", "cpu", "--temperature", "0", "--json", ...args], {
    encoding: "utf8",
  });
  return JSON.parse(out);
}

async function raw(base, pathName, body, headers = { "Content-Type": "application/json" }) {
  const r = await fetch(base + pathName, { method: "POST", headers, body });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: r.status, json, text };
}

const checks = [];
const check = (name, fn) => checks.push({ name, fn });

// ---- the checks (server started below) ----
let srv, client;

check("models", async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, path.basename(modelDir));
  const health = await fetch(srv.base + "/health");
  assert.equal(health.status, 200);
});

check("completion equals augur run", async () => {
  const prompt = "It was a cold morning, and";
  const r = await client.completions.create({ model: path.basename(modelDir), prompt, max_tokens: 24, temperature: 0 });
  const alone = runAlone(["-p", prompt, "-n", "24"]);
  assert.equal(r.choices[0].text, alone.text);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 24);
  assert.equal(r.usage.prompt_tokens, alone.prompt_ids.length);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

check("chat, streamed and not, equals augur run", async () => {
  const messages = [{ role: "user", content: "Tell me of the sea." }];
  const r = await client.chat.completions.create({ model: "augur-tiny", messages, max_tokens: 20, temperature: 0 });
  const alone = runAlone(["--chat", "Tell me of the sea.", "-n", "20"]);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].message.content, alone.text);
  const stream = await client.chat.completions.create({
    model: "augur-tiny", messages, max_tokens: 20, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0, role = null;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      text += ch.delta.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, alone.text);
  assert.equal(finish, "length");
  assert.ok(chunks > 3, "chunks " + chunks);
  assert.equal(usage.completion_tokens, 20);
  assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
});

// The prefix cache: a chat's second turn holds the first turn's prompt and
// reply, prefills only the rest, and answers as a server without the cache.
check("second turn of a chat resumes from the first", async () => {
  const before = (await metrics(srv.base)).get("augur_cached_prompt_tokens_total");
  const first = [{ role: "user", content: "Where does the river go?" }];
  const a = await client.chat.completions.create({ model: "augur-tiny", messages: first, max_tokens: 16, temperature: 0 });
  const second = [...first, { role: "assistant", content: a.choices[0].message.content },
    { role: "user", content: "And then?" }];
  const b = await client.chat.completions.create({ model: "augur-tiny", messages: second, max_tokens: 16, temperature: 0 });
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= a.usage.prompt_tokens, `cached ${cached} of ${b.usage.prompt_tokens}; the first turn had ${a.usage.prompt_tokens}`);
  assert.ok(cached < b.usage.prompt_tokens);
  const after = (await metrics(srv.base)).get("augur_cached_prompt_tokens_total");
  assert.ok(after - before >= cached, `metrics count ${after - before} cached tokens`);
  assert.ok((await metrics(srv.base)).get("augur_prefix_cache_blocks") > 0);
  const cold = await startServer(modelDir, ["--no-prefix-cache", "--no-warmup"]);
  try {
    const cc = new OpenAI({ baseURL: cold.base + "/v1", apiKey: "none", maxRetries: 0 });
    const c = await cc.chat.completions.create({ model: "augur-tiny", messages: second, max_tokens: 16, temperature: 0 });
    assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(c.usage.prompt_tokens, b.usage.prompt_tokens);
    assert.equal(b.choices[0].message.content, c.choices[0].message.content);
  } finally {
    cold.proc.kill("SIGTERM");
  }
});

check("completion stream", async () => {
  const stream = await client.completions.create({ model: "augur-tiny", prompt: "The king", max_tokens: 12, temperature: 0, stream: true });
  let text = "";
  for await (const c of stream) text += c.choices[0]?.text ?? "";
  assert.equal(text, runAlone(["-p", "The king", "-n", "12"]).text);
});

check("stop strings", async () => {
  const prompt = "It was a cold morning, and";
  const full = runAlone(["-p", prompt, "-n", "24"]).text;
  // A stop string from the middle of the greedy output.
  const stop = full.slice(10, 14);
  const cut = full.indexOf(stop);
  const r = await client.completions.create({ model: "augur-tiny", prompt, max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, "stop");
  const s = await client.completions.create({ model: "augur-tiny", prompt, max_tokens: 24, temperature: 0, stop, stream: true });
  let text = "";
  for await (const c of s) text += c.choices[0]?.text ?? "";
  assert.equal(text, full.slice(0, cut));
});

check("logprobs", async () => {
  const r = await client.chat.completions.create({
    model: "augur-tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 6);
  for (const t of lp) {
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.logprob <= 0);
    // greedy: the chosen token is the most likely
    assert.equal(t.logprob, t.top_logprobs[0].logprob);
  }
  assert.equal(lp.map((t) => t.token).join(""), r.choices[0].message.content);
  // bytes are each token's own, so they join to the text (also where a
  // token holds part of a character)
  assert.equal(Buffer.from(lp.flatMap((t) => t.bytes)).toString("utf8"), r.choices[0].message.content);
  const c = await client.completions.create({ model: "augur-tiny", prompt: "Hello", max_tokens: 4, temperature: 0, logprobs: 2 });
  assert.equal(c.choices[0].logprobs.tokens.length, 4);
  assert.equal(Object.keys(c.choices[0].logprobs.top_logprobs[0]).length, 2);
});

check("n > 1", async () => {
  const r = await client.chat.completions.create({
    model: "augur-tiny", messages: [{ role: "user", content: "Sing" }], max_tokens: 12, temperature: 1, seed: 7, n: 3,
  });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, r.choices.length * 12);
  const texts = new Set(r.choices.map((c) => c.message.content));
  assert.ok(texts.size > 1, "three samples all equal");
  // Seeded: the same request gives the same choices.
  const again = await client.chat.completions.create({
    model: "augur-tiny", messages: [{ role: "user", content: "Sing" }], max_tokens: 12, temperature: 1, seed: 7, n: 3,
  });
  assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
  const greedy = await client.chat.completions.create({
    model: "augur-tiny", messages: [{ role: "user", content: "Sing" }], max_tokens: 8, temperature: 0, n: 2, stream: true,
  });
  const got = ["", ""];
  for await (const c of greedy) for (const ch of c.choices) got[ch.index] += ch.delta.content ?? "";
  assert.equal(got[0], got[1]);
  assert.ok(got[0].length > 0);
});

check("a batch of prompts: n choices each, indexed prompt by prompt", async () => {
  const prompts = ["The sea", "A king of the night"];
  const one = await Promise.all(prompts.map((prompt) =>
    client.completions.create({ model: "augur-tiny", prompt, max_tokens: 6, temperature: 0 })));
  const r = await client.completions.create({ model: "augur-tiny", prompt: prompts, max_tokens: 6, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(r.choices.map((c) => c.text), [one[0].choices[0].text, one[0].choices[0].text,
    one[1].choices[0].text, one[1].choices[0].text]);
  assert.equal(r.usage.prompt_tokens, one[0].usage.prompt_tokens + one[1].usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 4 * 6);
  // Token-id prompts, streamed.
  const ids = [[100, 101, 102], [200, 201]];
  const s = await client.completions.create({ model: "augur-tiny", prompt: ids, max_tokens: 3, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  const got = ["", ""];
  let usage = null;
  for await (const c of s) {
    for (const ch of c.choices) got[ch.index] += ch.text;
    if (c.usage) usage = c.usage;
  }
  assert.equal(usage.prompt_tokens, 5);
  for (let i = 0; i < 2; i++) {
    const alone = await client.completions.create({ model: "augur-tiny", prompt: ids[i], max_tokens: 3, temperature: 0 });
    assert.equal(got[i], alone.choices[0].text);
  }
  const tooMany = await raw(srv.base, "/v1/completions", JSON.stringify({ prompt: Array(40).fill("x"), n: 2 }));
  assert.equal(tooMany.status, 400, tooMany.text);
});

check("32 concurrent requests each equal augur run", async () => {
  const words = ["sea", "king", "night", "bread", "river", "stone", "wind", "fire"];
  const prompts = Array.from({ length: 32 }, (_, i) => `The ${words[i % 8]} of ${words[(i * 3 + 1) % 8]} and ${i}`);
  const lengths = prompts.map((_, i) => 8 + (i % 5) * 4);
  const answers = await Promise.all(prompts.map((prompt, i) =>
    client.completions.create({ model: "augur-tiny", prompt, max_tokens: lengths[i], temperature: 0 })));
  for (let i = 0; i < prompts.length; i++) {
    const alone = runAlone(["-p", prompts[i], "-n", String(lengths[i])]);
    assert.equal(answers[i].choices[0].text, alone.text, `request ${i} (${prompts[i]})`);
  }
});

check("cancellation mid-stream frees its memory", async () => {
  const ac = new AbortController();
  const stream = await client.completions.create(
    { model: "augur-tiny", prompt: "Long ago", max_tokens: 1500, temperature: 0, stream: true },
    { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) {
      if (++n === 5) ac.abort();
    }
  } catch (e) {
    assert.ok(e.name === "APIUserAbortError" || e.name === "AbortError", e.name);
  }
  let m;
  for (let t = 0; t < 50; t++) {
    m = await metrics(srv.base);
    if (m.get("augur_running_requests") === 0 && m.get("augur_kv_cache_blocks_used") === 0) break;
    await sleep(100);
  }
  assert.equal(m.get("augur_running_requests"), 0);
  assert.equal(m.get("augur_kv_cache_blocks_used"), 0);
  assert.ok(m.get("augur_cancelled_requests_total") >= 1);
  // A socket closed mid-stream: libevent sees the end of file itself and
  // hands the unfinished request back to the server to free (the server's
  // exit check below finds it in the sanitizer build if it leaked).
  for (let k = 0; k < 3; k++) {
    await new Promise((resolve, reject) => {
      const body = JSON.stringify({ prompt: "Long ago", max_tokens: 1500, temperature: 0, stream: true });
      const s = net.connect(Number(new URL(srv.base).port), "127.0.0.1", () =>
        s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`));
      let chunks = 0;
      s.on("data", () => { if (++chunks === 5) { s.destroy(); resolve(); } });
      s.on("error", reject);
    });
  }
  // A non-streamed request whose client goes away is cancelled too.
  const ac2 = new AbortController();
  const p = client.completions.create({ model: "augur-tiny", prompt: "Long ago", max_tokens: 1500 }, { signal: ac2.signal });
  await sleep(300);
  ac2.abort();
  await p.catch(() => {});
  for (let t = 0; t < 50; t++) {
    m = await metrics(srv.base);
    if (m.get("augur_running_requests") === 0) break;
    await sleep(100);
  }
  assert.equal(m.get("augur_running_requests"), 0);
  assert.equal(m.get("augur_kv_cache_blocks_used"), 0);
});

check("bad requests get OpenAI errors and the server keeps serving", async () => {
  const b = srv.base;
  const cases = [
    ["/v1/chat/completions", "{not json", 400, null],
    ["/v1/chat/completions", JSON.stringify({ messages: "hi" }), 400, "messages"],
    ["/v1/chat/completions", JSON.stringify({ messages: [] }), 400, "messages"],
    ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: 3 }] }), 400, "messages[0].content"],
    ["/v1/chat/completions", JSON.stringify({ model: "gpt-5", messages: [{ role: "user", content: "x" }] }), 404, "model"],
    ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], max_tokens: -1 }), 400, "max_tokens"],
    ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], max_tokens: 1e9 }), 400, "max_tokens"],
    ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], temperature: "hot" }), 400, "temperature"],
    ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], frobnicate: 1 }), 400, "frobnicate"],
    ["/v1/completions", JSON.stringify({ prompt: "x ".repeat(3000), max_tokens: 10 }), 400, null],
    ["/v1/completions", JSON.stringify({ prompt: [1, 2, 99999999] }), 400, null],
    ["/v1/completions", JSON.stringify({ prompt: "" }), 400, "prompt"],
  ];
  for (const [p, body, status, param] of cases) {
    const r = await raw(b, p, body);
    assert.equal(r.status, status, `${body.slice(0, 60)}: ${r.text.slice(0, 200)}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", r.text);
    if (param) assert.equal(r.json.error.param, param, r.text);
  }
  // Codes clients act on: a prompt beyond the context (they trim and retry),
  // an unknown model.
  let e = await raw(b, "/v1/completions", JSON.stringify({ prompt: "x ".repeat(3000), max_tokens: 10 }));
  assert.equal(e.json.error.code, "context_length_exceeded", e.text);
  assert.match(e.json.error.message, /maximum context length/);
  e = await raw(b, "/v1/chat/completions", JSON.stringify({ model: "gpt-5", messages: [{ role: "user", content: "x" }] }));
  assert.equal(e.json.error.code, "model_not_found", e.text);
  e = await raw(b, "/v1/completions", JSON.stringify({ prompt: "x", max_tokens: 0 }));
  assert.equal(e.status, 400, e.text);
  assert.equal(e.json.error.param, "max_tokens", e.text);
  // Ids differ from one server to the next (a random prefix).
  const one = await client.completions.create({ model: "augur-tiny", prompt: "Id", max_tokens: 1 });
  assert.match(one.id, /^cmpl-[0-9a-f]{16}-\d+$/);
  // Invalid UTF-8 inside a string.
  const bad = Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
  assert.equal((await raw(b, "/v1/completions", bad)).status, 400);
  // An oversized body (the limit is 8 MiB).
  const big = JSON.stringify({ prompt: "a".repeat(9 << 20) });
  const r = await raw(b, "/v1/completions", big);
  assert.equal(r.status, 413, r.text.slice(0, 200));
  assert.equal((await fetch(b + "/v1/nothing")).status, 404);
  assert.equal((await fetch(b + "/v1/completions")).status, 405);
  // The client library surfaces them as its error types.
  await assert.rejects(client.chat.completions.create({ model: "augur-tiny", messages: [] }), (e) => e.status === 400);
  const ok = await client.completions.create({ model: "augur-tiny", prompt: "Still", max_tokens: 3 });
  assert.equal(ok.choices.length, 1);
});

check("edge values: deep nesting, nulls, a tiny temperature, wrong methods, unknown paths, a prompt near the context", async () => {
  const b = srv.base;
  const msg = [{ role: "user", content: "x" }];
  const cases = [
    // Copies of values nested this deep recurse: refused before parsing.
    ["/v1/chat/completions", '{"messages": ' + "[".repeat(200000) + "]".repeat(200000) + "}", 400, null],
    ["/v1/chat/completions", JSON.stringify({ messages: msg, tools: [{ type: 5, function: { name: "f" } }] }), 400, "tools[0]"],
    ["/v1/chat/completions", JSON.stringify({ messages: msg, top_p: 0 }), 400, "top_p"],
  ];
  for (const [p, body, status, param] of cases) {
    const r = await raw(b, p, body);
    assert.equal(r.status, status, `${body.slice(0, 60)}: ${r.text.slice(0, 200)}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", r.text);
    if (param) assert.equal(r.json.error.param, param, r.text);
  }
  // null stands for absent.
  let r = await raw(b, "/v1/completions", JSON.stringify({ prompt: "Hi", max_tokens: 3, temperature: null, top_p: null,
    top_k: null, min_p: null, presence_penalty: null, repetition_penalty: null, ignore_eos: null }));
  assert.equal(r.status, 200, r.text);
  // A temperature whose inverse overflows a float samples the argmax.
  const tiny = await raw(b, "/v1/completions", JSON.stringify({ prompt: "Long ago", max_tokens: 8, temperature: 1e-40 }));
  const greedy = await raw(b, "/v1/completions", JSON.stringify({ prompt: "Long ago", max_tokens: 8, temperature: 0 }));
  assert.equal(tiny.status, 200, tiny.text);
  assert.equal(tiny.json.choices[0].text, greedy.json.choices[0].text);
  // Wrong methods and unknown paths get JSON; unknown paths count under one label.
  const put = await fetch(b + "/v1/completions", { method: "PUT", body: "{}" });
  assert.equal(put.status, 405);
  assert.equal(put.headers.get("allow"), "POST");
  assert.ok((await put.json()).error);
  // HEAD: the headers alone, so a kept-alive connection's next response
  // starts where it should.
  const raw2 = await new Promise((resolve, reject) => {
    const s = net.connect(Number(new URL(b).port), "127.0.0.1", () =>
      s.write("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    let got = "";
    s.on("data", (d) => { got += d.toString(); });
    s.on("end", () => resolve(got));
    s.on("error", reject);
  });
  const parts = raw2.split("HTTP/1.1 ");
  assert.equal(parts.length, 3, raw2);
  assert.match(parts[1], /^200 /);
  assert.ok(parts[1].endsWith("\r\n\r\n"), `HEAD sent a body: ${JSON.stringify(parts[1])}`);
  assert.match(parts[2], /^200 [\s\S]*\{"status":"ok"\}$/);
  const del = await fetch(b + "/v1/models", { method: "DELETE" });
  assert.equal(del.status, 405);
  assert.equal(del.headers.get("allow"), "GET, HEAD");
  const lost = await fetch(b + "/no-such-path-" + Date.now());
  assert.equal(lost.status, 404);
  assert.ok((await lost.json()).error);
  const m = await metrics(b);
  assert.match(m.text, /augur_requests_total\{endpoint="other",status="404"\} \d+/);
  assert.ok(!m.text.includes("no-such-path"));
  // A prompt that leaves less room than the default max_tokens, none asked
  // for: generates what fits, not an error naming max_tokens.
  const ctx = (await (await fetch(b + "/v1/models")).json()).data[0].max_model_len;
  const ids = Array.from({ length: ctx - 6 }, (_, i) => 100 + (i % 200));
  r = await raw(b, "/v1/completions", JSON.stringify({ prompt: ids, temperature: 0, ignore_eos: true }));
  assert.equal(r.status, 200, r.text.slice(0, 300));
  assert.equal(r.json.usage.completion_tokens, 6, JSON.stringify(r.json.usage));
  assert.equal(r.json.choices[0].finish_reason, "length");
});

check("fuzzed requests leave the server healthy", async () => {
  // Mutations of valid bodies: cut short, bytes flipped, fields swapped to
  // other types. Each must get a status, never a hang or a crash.
  const seeds = [
    { model: "augur-tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0.5, stop: ["a"] },
    { model: "augur-tiny", prompt: "Hi", max_tokens: 4, logprobs: 1, n: 2 },
  ];
  let rnd = 12345;
  const next = () => ((rnd = (rnd * 1103515245 + 12345) & 0x7fffffff), rnd);
  const values = [null, -1, 1e308, "x", [], {}, true, [1, "a"], { a: 1 }, 0, 2 ** 53];
  for (let i = 0; i < 150; i++) {
    const base = structuredClone(seeds[i % 2]);
    const keys = Object.keys(base);
    let body;
    switch (next() % 3) {
      case 0:
        base[keys[next() % keys.length]] = values[next() % values.length];
        body = JSON.stringify(base);
        break;
      case 1:
        body = JSON.stringify(base);
        body = body.slice(0, next() % body.length);
        break;
      default: {
        const buf = Buffer.from(JSON.stringify(base));
        buf[next() % buf.length] = next() % 256;
        body = buf;
      }
    }
    const p = i % 2 ? "/v1/completions" : "/v1/chat/completions";
    const r = await raw(srv.base, p, body);
    assert.ok([200, 400, 404, 413, 429].includes(r.status), `status ${r.status} for ${body}`);
    if (r.status !== 200) assert.ok(r.json?.error, r.text);
  }
  assert.equal((await fetch(srv.base + "/health")).status, 200);
  const ok = await client.completions.create({ model: "augur-tiny", prompt: "Still", max_tokens: 3 });
  assert.equal(ok.usage.completion_tokens, 3);
});

check("metrics", async () => {
  const m = await metrics(srv.base);
  for (const name of ["augur_requests_total", "augur_prompt_tokens_total", "augur_generation_tokens_total",
    "augur_cached_prompt_tokens_total", "augur_queue_depth", "augur_running_requests", "augur_kv_cache_bytes_used",
    "augur_state_bytes_used", "augur_prefix_cache_hit_ratio", "augur_prefix_cache_blocks", "augur_prefix_cache_states", "augur_time_to_first_token_seconds_bucket",
    "augur_inter_token_latency_seconds_count"])
    assert.ok(m.text.includes(name), name);
  assert.ok(m.get("augur_generation_tokens_total") > 100);
  assert.ok(m.get("augur_time_to_first_token_seconds_count") > 10);
  assert.match(m.text, /augur_requests_total\{endpoint="\/v1\/completions",status="200"\} \d+/);
  // One request of three choices is one time to first token, and its
  // choices' later tokens are inter-token gaps.
  await client.completions.create({ model: "augur-tiny", prompt: "Count", max_tokens: 4, n: 3, temperature: 0.7, seed: 5, ignore_eos: true });
  const after = await metrics(srv.base);
  assert.equal(after.get("augur_time_to_first_token_seconds_count"), m.get("augur_time_to_first_token_seconds_count") + 1);
  assert.equal(after.get("augur_inter_token_latency_seconds_count"), m.get("augur_inter_token_latency_seconds_count") + 9);
});

// ---- run ----
let failures = 0;
try {
  srv = await startServer(modelDir);
  client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "none", maxRetries: 0, timeout: 120000 });
  for (const { name, fn } of checks) {
    const t0 = Date.now();
    try {
      await fn();
      console.log(`ok ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failures++;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  // Tools: a chat template that renders them (Qwen's form), on the same weights.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "augur-tools-"));
  for (const f of ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"])
    if (fs.existsSync(path.join(modelDir, f))) fs.symlinkSync(path.resolve(modelDir, f), path.join(dir, f));
  const cfg = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
  cfg.chat_template = fs.readFileSync(new URL("./tools_template.jinja", import.meta.url), "utf8");
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
  const t0 = Date.now();
  const tools = await startServer(dir, ["--served-model-name", "augur-tiny"]);
  try {
    const tc = new OpenAI({ baseURL: tools.base + "/v1", apiKey: "none", maxRetries: 0 });
    const messages = [{ role: "user", content: "What is the weather in Paris?" }];
    const weather = [{ type: "function", function: { name: "get_weather", description: "The weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
    const plain = await tc.chat.completions.create({ model: "augur-tiny", messages, max_tokens: 4, temperature: 0 });
    const withTools = await tc.chat.completions.create({ model: "augur-tiny", messages, tools: weather, max_tokens: 4, temperature: 0 });
    // The rendered prompt carries the tool's schema.
    assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
      `${withTools.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
    const none = await tc.chat.completions.create({ model: "augur-tiny", messages, tools: weather, tool_choice: "none", max_tokens: 4, temperature: 0 });
    assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
    // A conversation with a tool call and its result renders and runs.
    const turn = await tc.chat.completions.create({
      model: "augur-tiny", tools: weather, max_tokens: 4, temperature: 0,
      messages: [...messages,
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
        { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" }],
    });
    assert.ok(turn.usage.prompt_tokens > withTools.usage.prompt_tokens);
    // The history's call arguments (JSON text, as OpenAI sends them) reach
    // the template as a mapping (this one iterates them, as Qwen3.5's does).
    assert.equal(turn.choices[0].message.role, "assistant");
    // A developer message is the system's (the template knows no other role).
    const asSystem = await tc.chat.completions.create({ model: "augur-tiny", max_tokens: 2, temperature: 0,
      messages: [{ role: "system", content: "Be brief." }, ...messages] });
    const asDeveloper = await tc.chat.completions.create({ model: "augur-tiny", max_tokens: 2, temperature: 0,
      messages: [{ role: "developer", content: "Be brief." }, ...messages] });
    assert.equal(asDeveloper.usage.prompt_tokens, asSystem.usage.prompt_tokens);
    assert.equal(asDeveloper.choices[0].message.content, asSystem.choices[0].message.content);
    // Parameters frameworks send at values that change nothing are taken;
    // other values are refused by name.
    const neutral = await tc.chat.completions.create({ model: "augur-tiny", messages, max_tokens: 4, temperature: 0,
      response_format: { type: "text" }, logit_bias: {}, store: false, metadata: { run: "e2e" }, service_tier: "auto",
      reasoning_effort: null, stream_options: null });
    assert.equal(neutral.choices[0].message.content, plain.choices[0].message.content);
    await assert.rejects(tc.chat.completions.create({ model: "augur-tiny", messages, max_tokens: 2,
      response_format: { type: "json_object" } }), (e) => e.status === 400 && e.param === "response_format");
    await assert.rejects(tc.chat.completions.create({ model: "augur-tiny", messages, max_tokens: 2,
      logit_bias: { "5": 100 } }), (e) => e.status === 400 && e.param === "logit_bias");
    await assert.rejects(tc.chat.completions.create({ model: "augur-tiny", messages, tools: weather,
      tool_choice: { type: "function", function: { name: "get_weather" } } }), (e) => e.status === 400);
    console.log(`ok tools on a template that renders them (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL tools: ${e.stack || e}`);
  } finally {
    tools.proc.kill("SIGTERM");
    fs.rmSync(dir, { recursive: true, force: true });
  }
  // Tool calls in the model's output: a checkpoint whose greedy reply is a
  // call (chain_model.mjs), through the same tools template; in Qwen3's JSON
  // form and in Qwen3.5's parameter form.
  for (const [form, call] of [["json", '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'],
    ["parameters", "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"]]) {
  const chainDir = fs.mkdtempSync(path.join(os.tmpdir(), "augur-chain-"));
  writeChainModel(chainDir, ["<tool_call>", call, "</tool_call>"],
    fs.readFileSync(new URL("./tools_template.jinja", import.meta.url), "utf8"));
  const t1 = Date.now();
  const chain = await startServer(chainDir, ["--served-model-name", "chain"]);
  try {
    const cc = new OpenAI({ baseURL: chain.base + "/v1", apiKey: "none", maxRetries: 0 });
    const messages = [{ role: "user", content: "What is the weather in Paris?" }];
    const weather = [{ type: "function", function: { name: "get_weather", description: "The weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
    // Without tools the reply is the text itself.
    const text = await cc.chat.completions.create({ model: "chain", messages, max_tokens: 16, temperature: 0 });
    assert.equal(text.choices[0].message.content, "<tool_call>" + call + "</tool_call>");
    assert.equal(text.choices[0].finish_reason, "stop");
    assert.equal(text.choices[0].message.tool_calls, undefined);
    // The reply ends on EOS, which has no logprob: the tokens spell the content.
    const lp = await cc.chat.completions.create({ model: "chain", messages, max_tokens: 16, temperature: 0, logprobs: true });
    assert.equal(lp.choices[0].finish_reason, "stop");
    assert.equal(lp.choices[0].logprobs.content.map((t) => t.token).join(""), lp.choices[0].message.content);
    assert.equal(lp.choices[0].logprobs.content.length, lp.usage.completion_tokens - 1);
    // With tools it is a call.
    const r = await cc.chat.completions.create({ model: "chain", messages, tools: weather, max_tokens: 16, temperature: 0 });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].type, "function");
    assert.ok(m.tool_calls[0].id.length > 0);
    assert.equal(m.tool_calls[0].function.name, "get_weather");
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: "Paris" });
    // Streamed: the call comes as tool_calls deltas, none of its text as content.
    const stream = await cc.chat.completions.create({ model: "chain", messages, tools: weather, max_tokens: 16,
      temperature: 0, stream: true });
    let content = "", name = "", args = "", finish = null, ids = new Set();
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta?.content ?? "";
      for (const tc of c.delta?.tool_calls ?? []) {
        assert.equal(tc.index, 0);
        if (tc.id) ids.add(tc.id);
        name += tc.function?.name ?? "";
        args += tc.function?.arguments ?? "";
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(content, "");
    assert.equal(name, "get_weather");
    assert.deepEqual(JSON.parse(args), { city: "Paris" });
    assert.equal(ids.size, 1);
    assert.equal(finish, "tool_calls");
    // The call and its result go back as the next turn's history.
    const next = await cc.chat.completions.create({ model: "chain", tools: weather, max_tokens: 16, temperature: 0,
      messages: [...messages, m, { role: "tool", tool_call_id: m.tool_calls[0].id, content: "sunny, 21 C" }] });
    assert.ok(next.usage.prompt_tokens > r.usage.prompt_tokens);
    assert.equal(next.choices[0].finish_reason, "tool_calls");
    console.log(`ok tool calls in the model's output, ${form} form (${Date.now() - t1} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL tool calls in the model's output, ${form} form: ${e.stack || e}`);
  } finally {
    chain.proc.kill("SIGTERM");
    fs.rmSync(chainDir, { recursive: true, force: true });
  }
  }
  // The prefix cache on a hybrid fixture (Gated DeltaNet + gated attention,
  // random weights) with a byte-level tokenizer: a second turn resumes from
  // the first's recurrent state and answers as a cold server does.
  const hybridDir = fs.mkdtempSync(path.join(os.tmpdir(), "augur-qwen3_5-"));
  const fixture = fileURLToPath(new URL("../data/qwen3_5/", import.meta.url));
  for (const f of ["config.json", "model.safetensors"]) fs.symlinkSync(path.join(fixture, f), path.join(hybridDir, f));
  writeByteTokenizer(hybridDir, [], fs.readFileSync(new URL("./tools_template.jinja", import.meta.url), "utf8"));
  const t2 = Date.now();
  const warm = await startServer(hybridDir, ["--served-model-name", "qwen3_5"]);
  try {
    const wc = new OpenAI({ baseURL: warm.base + "/v1", apiKey: "none", maxRetries: 0 });
    const first = [{ role: "user", content: "Where does the river go?" }];
    const a = await wc.chat.completions.create({ model: "qwen3_5", messages: first, max_tokens: 16, temperature: 0 });
    const second = [...first, { role: "assistant", content: a.choices[0].message.content },
      { role: "user", content: "And then?" }];
    const b = await wc.chat.completions.create({ model: "qwen3_5", messages: second, max_tokens: 16, temperature: 0 });
    const cached = b.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= a.usage.prompt_tokens && cached < b.usage.prompt_tokens,
      `cached ${cached} of ${b.usage.prompt_tokens}; the first turn had ${a.usage.prompt_tokens}`);
    const m = await metrics(warm.base);
    assert.equal(m.get("augur_cached_prompt_tokens_total"), cached);
    assert.ok(m.get("augur_prefix_cache_states") > 0);
    const cold = await startServer(hybridDir, ["--no-prefix-cache", "--no-warmup", "--served-model-name", "qwen3_5"]);
    try {
      const cc = new OpenAI({ baseURL: cold.base + "/v1", apiKey: "none", maxRetries: 0 });
      const c = await cc.chat.completions.create({ model: "qwen3_5", messages: second, max_tokens: 16, temperature: 0 });
      assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(c.usage.prompt_tokens, b.usage.prompt_tokens);
      assert.equal(b.choices[0].message.content, c.choices[0].message.content);
    } finally {
      cold.proc.kill("SIGTERM");
    }
    console.log(`ok second turn on the qwen3_5 fixture resumes from the first (cached ${cached} of ${b.usage.prompt_tokens}; ${Date.now() - t2} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL second turn on the qwen3_5 fixture: ${e.stack || e}`);
  } finally {
    warm.proc.kill("SIGTERM");
    fs.rmSync(hybridDir, { recursive: true, force: true });
  }
  // SIGTERM with requests in flight: a stream ends with an error event and
  // [DONE], a request not streamed gets a 503, and the process exits 0 (in
  // the sanitizer build: reporting nothing).
  const t3 = Date.now();
  const busy = await startServer(modelDir, ["--no-warmup"]);
  try {
    const post = (stream) => fetch(busy.base + "/v1/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "augur-tiny", prompt: "Once", max_tokens: 1500, ignore_eos: true, temperature: 0, stream }),
    });
    const plain = post(false).catch((e) => ({ status: `no reply (${e.cause?.code ?? e.message})` }));
    const res = await post(true);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let sse = dec.decode((await reader.read()).value);
    for (let t = 0; t < 50 && (await metrics(busy.base)).get("augur_running_requests") < 2; t++) await sleep(50);
    const exited = new Promise((r) => busy.proc.on("exit", (code) => r(code)));
    busy.proc.kill("SIGTERM");
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      sse += dec.decode(value);
    }
    assert.match(sse, /"error":\{[^}]*shutting down/);
    assert.ok(sse.trimEnd().endsWith("data: [DONE]"), sse.slice(-200));
    const p = await plain;
    assert.equal(p.status, 503);
    assert.match((await p.json()).error.message, /shutting down/);
    assert.equal(await exited, 0);
    const report = busy.log().split("\n").filter((l) => /Sanitizer|runtime error/.test(l));
    assert.deepEqual(report, []);
    console.log(`ok SIGTERM with requests in flight ends them with a 503 and exits cleanly (${Date.now() - t3} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL SIGTERM with requests in flight: ${e.stack || e}`);
    busy.proc.kill("SIGKILL");
  }
} catch (e) {
  failures++;
  console.log(`FAIL setup: ${e.stack || e}`);
} finally {
  if (srv) {
    // A clean exit: in the sanitizer build (which runs this file too) a leak
    // or a bad access of all the above is reported now, on its stderr.
    const exited = new Promise((r) => srv.proc.on("exit", r));
    srv.proc.kill("SIGTERM");
    const code = await exited;
    const report = srv.log().split("\n").filter((l) => /Sanitizer|runtime error/.test(l));
    if (code !== 0) report.push(`exit code ${code}`);
    if (report.length) {
      failures++;
      console.log(`FAIL the server's exit: ${report.slice(0, 6).join(" | ")}`);
    } else {
      console.log("ok the server exits cleanly");
    }
  }
}
console.log(failures ? `${failures} failed` : "all passed");
process.exit(failures);
