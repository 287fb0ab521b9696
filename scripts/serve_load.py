#!/usr/bin/env python3
"""Throughput of an OpenAI-compatible server (augur serve) under C concurrent
streaming clients, for machines without node (tests/server/load.mjs is the
test suite's load generator, on OpenAI's own client). Standard library only.

Each client sends R completions one after another: a prompt of P random token
ids (no two requests share a prefix, so no prefix-cache hits) and G tokens
generated whatever the model says (ignore_eos). Prints, per concurrency:
output tokens a second, prompt + output tokens a second, time to first token
and inter-token latency (p50, p99), requests completed and failed.

  scripts/serve_load.py --base http://127.0.0.1:8080 --clients 64,256 \\
      --requests 2 --prompt-tokens 128 --max-tokens 128 --vocab 151936 [--json]
"""
import argparse
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse


async def post_stream(host, port, path, body):
    """POSTs body; yields (arrival time, parsed SSE data) per event."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    writer.write(
        (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    await writer.drain()
    status = (await reader.readline()).decode().split()
    headers = {}
    while True:
        line = (await reader.readline()).decode().strip()
        if not line:
            break
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if len(status) < 2 or status[1] != "200":
        rest = await reader.read()
        writer.close()
        raise RuntimeError(f"HTTP {' '.join(status[1:])}: {rest[:200]!r}")
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    buf = b""
    try:
        while True:
            if chunked:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                piece = await reader.readexactly(size)
                await reader.readline()
            else:
                piece = await reader.read(65536)
                if not piece:
                    break
            buf += piece
            now = time.perf_counter()
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data: "):
                        payload = line[6:].strip()
                        if payload == b"[DONE]":
                            return
                        yield now, json.loads(payload)
    finally:
        writer.close()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def run_level(args, host, port, model, clients):
    ttft, itl = [], []
    stats = {"completed": 0, "failed": 0, "prompt_tokens": 0, "output_tokens": 0, "errors": {}}

    async def one(c, r):
        rng = random.Random(f"{c} {r} {clients} {args.prompt_tokens}")  # prompts of one run share nothing
        body = {"model": model, "prompt": [rng.randrange(args.vocab) for _ in range(args.prompt_tokens)],
                "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": c * 1000 + r,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        last = None
        usage = None
        try:
            async for t, ev in post_stream(host, port, "/v1/completions", body):
                if ev.get("usage"):
                    usage = ev["usage"]
                if ev.get("choices"):
                    if last is None:
                        ttft.append(t - start)
                    else:
                        itl.append(t - last)
                    last = t
            if usage is None:
                raise RuntimeError("no usage chunk")
            stats["completed"] += 1
            stats["prompt_tokens"] += usage["prompt_tokens"]
            stats["output_tokens"] += usage["completion_tokens"]
        except Exception as e:  # counted and reported: every request completes or fails explicitly
            stats["failed"] += 1
            kind = str(e)[:80]
            stats["errors"][kind] = stats["errors"].get(kind, 0) + 1

    async def client(c):
        for r in range(args.requests):
            await one(c, r)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": clients * args.requests, "prompt_tokens_each": args.prompt_tokens,
            "max_tokens": args.max_tokens, "completed": stats["completed"], "failed": stats["failed"],
            "errors": stats["errors"], "wall_s": round(wall, 3),
            "output_tok_s": round(stats["output_tokens"] / wall, 1),
            "total_tok_s": round((stats["prompt_tokens"] + stats["output_tokens"]) / wall, 1),
            "ttft_p50_s": round(pct(ttft, 50), 4), "ttft_p99_s": round(pct(ttft, 99), 4),
            "itl_p50_ms": round(1000 * pct(itl, 50), 2), "itl_p99_ms": round(1000 * pct(itl, 99), 2)}


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--clients", default="64", help="concurrency levels, comma-separated")
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends in turn")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn from [0, vocab)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    u = urlparse(args.base)
    host, port = u.hostname, u.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    model = json.loads(raw.split(b"\r\n\r\n", 1)[1])["data"][0]["id"]
    failed = 0
    for clients in [int(c) for c in args.clients.split(",")]:
        res = await run_level(args, host, port, model, clients)
        failed += res["failed"]
        if args.json:
            print(json.dumps(res), flush=True)
        else:
            print(f"{clients} clients x {args.requests}, {args.prompt_tokens} in / {args.max_tokens} out: "
                  f"{res['completed']}/{res['requests']} completed, {res['failed']} failed {res['errors'] or ''}; "
                  f"{res['output_tok_s']} output tok/s, {res['total_tok_s']} total tok/s; "
                  f"TTFT p50 {res['ttft_p50_s']} s p99 {res['ttft_p99_s']} s; "
                  f"ITL p50 {res['itl_p50_ms']} ms p99 {res['itl_p99_ms']} ms", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    asyncio.run(main())
