"""Bounded load test of `tunesmith serve` on loopback: concurrent requests, none lost, latency and throughput.

    python benchmarks/serve_load.py                                   # an in-process server on tiny:qwen3
    python benchmarks/serve_load.py --requests 200 --concurrency 16 --max_concurrent 4 --out r.json
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --model my-model   # a server already running

Without --url the script starts the server itself (the same build as `tunesmith serve`: engine, FastAPI app,
uvicorn) on 127.0.0.1 at a free port, with --model_name_or_path, --max_concurrent and --max_queue, and stops
it at the end. --url must be a loopback address: this is a load test of a server on this machine only.

It sends --requests chat completions (alternately streamed and whole, each asking for --max_tokens tokens with
greedy decoding) from --concurrency clients at once, each with a --timeout, the whole run
bounded by --max_seconds. A request counts as done when it returned 200 with a finish_reason (and, streamed,
the closing [DONE]); every other outcome is counted by kind (HTTP status, timeout, connection error) and the
run fails (exit 1) if any request was lost. Reported: latency p50/p95/max (whole request), time to first
token p50/p95 (streamed ones), requests/s, completion tokens/s, and the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import platform
import statistics
import sys
import threading
import time
from urllib.parse import urlparse


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _one(client, url: str, model: str, i: int, args) -> dict:
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Request {i}: tell me about the sky."}]}
    stream = i % 2 == 0
    start = time.perf_counter()
    try:
        if not stream:
            response = await client.post(url, json=body, timeout=args.timeout)
            done = response.status_code == 200 and response.json()["choices"][0]["finish_reason"] is not None
            tokens = response.json()["usage"]["completion_tokens"] if done else 0
            return {"ok": done, "status": response.status_code, "latency": time.perf_counter() - start,
                    "tokens": tokens, "stream": False}
        body.update(stream=True, stream_options={"include_usage": True})
        first, finished, closed, tokens = None, False, False, 0
        async with client.stream("POST", url, json=body, timeout=args.timeout) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    closed = True
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    if first is None and choice["delta"].get("content"):
                        first = time.perf_counter() - start
                    finished = finished or choice["finish_reason"] is not None
            status = response.status_code
        return {"ok": status == 200 and finished and closed, "status": status, "latency": time.perf_counter() - start,
                "ttft": first, "tokens": tokens, "stream": True}
    except Exception as err:  # counted, never silently dropped
        return {"ok": False, "status": type(err).__name__, "latency": time.perf_counter() - start, "stream": stream}


async def _load(base: str, model: str, args) -> tuple[list[dict], float]:
    import httpx

    url = base.rstrip("/") + "/v1/chat/completions"
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(args.requests):
        queue.put_nowait(i)
    results: list[dict] = []
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)

    async def client_loop(client):
        while not queue.empty():
            results.append(await _one(client, url, model, queue.get_nowait(), args))

    async with httpx.AsyncClient(limits=limits) as client:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client_loop(client) for _ in range(args.concurrency))),
                               args.max_seconds)
        return results, time.perf_counter() - start


def summarize(results: list[dict], wall: float, args) -> dict:
    done = [r for r in results if r["ok"]]
    lost: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            lost[str(r["status"])] = lost.get(str(r["status"]), 0) + 1
    latencies = [r["latency"] for r in done]
    ttfts = [r["ttft"] for r in done if r.get("ttft") is not None]
    tokens = sum(r.get("tokens", 0) for r in done)

    def ms(value):
        return None if value is None else round(value * 1000, 1)

    return {"requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
            "done": len(done), "lost": sum(lost.values()), "lost_by_kind": lost,
            "wall_s": round(wall, 2), "requests_per_s": round(len(done) / wall, 2),
            "completion_tokens": tokens, "completion_tokens_per_s": round(tokens / wall, 1),
            "latency_ms": {"p50": ms(_percentile(latencies, 0.5)), "p95": ms(_percentile(latencies, 0.95)),
                           "max": ms(max(latencies, default=None)),
                           "mean": ms(statistics.fmean(latencies)) if latencies else None},
            "ttft_ms": {"p50": ms(_percentile(ttfts, 0.5)), "p95": ms(_percentile(ttfts, 0.95))}}


def _start_server(args):
    """The `tunesmith serve` build on 127.0.0.1 at a free port, in a thread: (url, model name, stop)."""
    import uvicorn

    from tunesmith.infer.options import serve_options
    from tunesmith.serve.server import build

    options = serve_options({"model_name_or_path": args.model_name_or_path, "max_concurrent": args.max_concurrent,
                             "max_queue": args.max_queue})
    engine, app, _, _ = build(options, env={})
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop():
        server.should_exit = True
        thread.join(timeout=30)

    return f"http://127.0.0.1:{port}", engine.default, stop


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        raise SystemExit(f"--url {url}: this load test only targets a server on this machine (127.0.0.0/8, ::1)")


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("tunesmith", "torch", "transformers", "fastapi", "uvicorn", "httpx"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server on loopback (default: start one here)")
    parser.add_argument("--model", help="model name to request (default: the server's first)")
    parser.add_argument("--model_name_or_path", default="tiny:qwen3", help="model of the in-process server")
    parser.add_argument("--max_concurrent", type=int, default=4, help="in-process server's max_concurrent")
    parser.add_argument("--max_queue", type=int, default=100, help="in-process server's max_queue")
    parser.add_argument("--requests", type=int, default=64, help="requests in all (default 64)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients sending at once (default 8)")
    parser.add_argument("--max_tokens", type=int, default=32, help="tokens each answer asks for (default 32)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    parser.add_argument("--max_seconds", type=float, default=600, help="seconds the whole run may take (default 600)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)

    stop = None
    if args.url:
        _check_loopback(args.url)
        base, model = args.url, args.model
        if model is None:
            import httpx

            model = httpx.get(base.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]["id"]
    else:
        base, model, stop = _start_server(args)
        model = args.model or model
    try:
        results, wall = asyncio.run(_load(base, model, args))
    finally:
        if stop:
            stop()
    result = {"summary": summarize(results, wall, args), "model": model, "server": "in-process" if stop else base,
              "server_limits": None if args.url else {"max_concurrent": args.max_concurrent,
                                                      "max_queue": args.max_queue},
              "versions": versions()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["summary"]["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
