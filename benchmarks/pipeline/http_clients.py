"""Raw HTTP clients against one vLLM server: why `eagle3 generate` and `eagle3 evaluate` use aiohttp.

    python -m benchmarks.pipeline.http_clients --rounds 4

The same 96 raw completion prompts (the tiny target, greedy, 128 tokens, 8 in flight) sent by
httpx and by aiohttp, each without and with streaming, and by `vllm bench serve` (aiohttp,
streaming), in turn within every round. Prints one JSON line: each client's tokens/s per round
and the medians. The numbers of the switch from httpx are in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from benchmarks.pipeline.generate_throughput import (
    SERVED,
    bench_serve,
    completion_prompts,
    parse_args,
    write_raw,
)
from eagle3_runtime.evaluate.rounds import load_average, utc_now
from eagle3_runtime.tiny_target import ensure_tiny_target
from eagle3_runtime.vllm_server import VLLMServer


async def _httpx(url: str, bodies: list[dict], concurrency: int, stream: bool) -> None:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def worker() -> None:
            while bodies:
                body = bodies.pop()
                if stream:
                    async with client.stream("POST", "/v1/completions", json=body) as response:
                        async for _ in response.aiter_bytes():
                            pass
                else:
                    (await client.post("/v1/completions", json=body)).json()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _aiohttp(url: str, bodies: list[dict], concurrency: int, stream: bool) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker() -> None:
            while bodies:
                async with session.post("/v1/completions", json=bodies.pop()) as response:
                    if stream:
                        async for _ in response.content.iter_any():
                            pass
                    else:
                        await response.json()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def tokens_per_second(client, url: str, prompts: list[str], args, stream: bool, tokens: int) -> float:
    bodies = [
        {"model": SERVED, "prompt": p, "max_tokens": args.max_tokens, "temperature": 0.0, "stream": stream}
        for p in prompts
    ]
    started = time.monotonic()
    asyncio.run(client(url, bodies, args.concurrency, stream))
    return round(tokens / (time.monotonic() - started), 1)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], num_prompts=96)
    target = ensure_tiny_target()
    started, load_before = utc_now(), load_average()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prompts_file = completion_prompts(tmp, args.num_prompts)
        prompts = [json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines()]
        per_client: dict[str, list[float]] = {}
        load = [os.getloadavg()[0]]
        with VLLMServer(target, log_path=tmp / "vllm.log", served_model_name=SERVED) as server:
            bench_serve(server.url, target, prompts_file, args, tmp, -1)  # warm-up
            # Every client generates the same greedy tokens: count them once, from the bench.
            tokens = json.loads((tmp / "bench--1.json").read_text())["total_output_tokens"]
            for run in range(args.rounds):
                per_client.setdefault("vllm bench serve", []).append(
                    round(bench_serve(server.url, target, prompts_file, args, tmp, run), 1)
                )
                for name, client in (("httpx", _httpx), ("aiohttp", _aiohttp)):
                    for stream in (False, True):
                        per_client.setdefault(f"{name}{' stream' if stream else ''}", []).append(
                            tokens_per_second(client, server.url, prompts, args, stream, tokens)
                        )
        load.append(os.getloadavg()[0])
    result = {
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "tokens_per_second": per_client,
        "median": {name: statistics.median(values) for name, values in per_client.items()},
        "load_average_before_after": [round(x, 1) for x in load],
    }
    print(json.dumps(result))
    write_raw(args.out, result, started, load_before)


if __name__ == "__main__":
    main()
