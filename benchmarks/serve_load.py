"""Serving load benchmark: N concurrent streaming clients against fleetllm's Ray Serve app (transformers
engine) -> output tokens/s and TTFT p50/p99, side by side with the engine's bare batch throughput
(TransformersEngine.generate on the same prompts, same machine, same run).

    PYTHONPATH=$PWD python benchmarks/serve_load.py [--model smollm2-135m-instruct] [--concurrency 1,8,32]
        [--repeats 3] [--stream-messages-per-s 40]

Bare and served runs alternate (bare, then each concurrency level, `--repeats` times) so that both
sides see the same machine load; the ratio is the median of the per-repeat ratios at 32 clients.
Ray and the Serve app are started after each bare run and stopped after its served runs, so that the
bare engine never shares the CPU with Ray's background processes.
The 1-minute load average is recorded with each run. Prints a table and writes
benchmarks/results/serve_load.json. Every request generates exactly --max-tokens tokens (ignore_eos),
so served and bare runs do the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

TOPICS = ["a lighthouse", "the moon", "a lost key", "rain in Paris", "a robot chef", "an old map", "a quiet forest",
          "a paper boat", "the last train", "a snow fox", "a clockmaker", "a red kite", "a desert well",
          "a library cat", "the northern lights", "a broken violin"]


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} (#{i})."}]
            for i in range(n)]


def load1() -> float:
    return round(os.getloadavg()[0], 2)


class Bare:
    """The engine's own batch throughput: one TransformersEngine.generate over all prompts."""

    def __init__(self, path: str, threads: int) -> None:
        from fleetllm.engines.base import GenerationRequest
        from fleetllm.engines.transformers_engine import TransformersEngine

        self.request = GenerationRequest
        self.engine = TransformersEngine(path, engine_kwargs={"num_threads": threads})
        self.engine.start()
        self.engine.generate([GenerationRequest(messages=m, sampling={"max_tokens": 4}) for m in prompts(2)])

    def run(self, n: int, max_tokens: int) -> dict:
        sampling = {"max_tokens": max_tokens, "ignore_eos": True}
        reqs = [self.request(messages=m, sampling=sampling) for m in prompts(n)]
        before = load1()
        t0 = time.perf_counter()
        results = self.engine.generate(reqs)
        wall = time.perf_counter() - t0
        tokens = sum(r.num_generated_tokens for r in results)
        return {"requests": n, "output_tokens": tokens, "wall_s": round(wall, 3),
                "tokens_per_s": round(tokens / wall, 2), "load1": [before, load1()]}


async def client_run(url: str, concurrency: int, max_tokens: int) -> dict:
    import httpx

    ttfts: list[float] = []
    tokens = chunks = 0

    async def one(client: httpx.AsyncClient, messages: list[dict]) -> None:
        nonlocal tokens, chunks
        body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first = None
        async with client.stream("POST", f"{url}/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {await resp.aread()!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks += 1
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]
        ttfts.append(first if first is not None else time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=concurrency + 4)
    before = load1()
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*[one(client, m) for m in prompts(concurrency)])
        wall = time.perf_counter() - t0
    ttfts.sort()
    return {"concurrency": concurrency, "requests": concurrency, "output_tokens": tokens, "sse_chunks": chunks,
            "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_p99_s": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 3), "load1": [before, load1()]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model alias or folder")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts (32 is the ratio's)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="bare/served rounds; the ratio is their median")
    ap.add_argument("--stream-messages-per-s", type=float, default=None,
                    help="the replica's streaming message budget (default: the spec's CPU default)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs (torch threads) for the engine")
    ap.add_argument("--ingress", default="auto", choices=["auto", "direct", "separate"],
                    help="the served app's path (auto: direct for this one model)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_load.json"))
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from fleetllm import models
    from fleetllm.serve.run import run_serve, stop_serve
    from fleetllm.serve.spec import ServeSpec
    from fleetllm.testing.serve_process import free_port

    path = models.resolve(args.model).path
    ratio_n = 32 if 32 in levels else max(levels)
    bare_engine = Bare(path, args.cpus)

    import ray

    def make_spec():
        return ServeSpec.model_validate({"name": "bench", "port": free_port(), "ingress": args.ingress, "models": [{
            "model_id": "bench", "source": path, "engine": "transformers",
            "engine_kwargs": {"num_threads": args.cpus, "max_batch_size": max(levels)},
            "max_ongoing_requests": max(levels), "max_queued_requests": max(levels),
            "cpus_per_replica": args.cpus, "stream_messages_per_s": args.stream_messages_per_s}]})

    budget = make_spec().llm_configs()[0].stream_budget()
    bare: list[dict] = []
    served: list[dict] = []
    try:
        for rep in range(args.repeats):
            # the bare run sees no Ray processes: Ray's own background work counts against serving only
            print(f"round {rep + 1}/{args.repeats}: bare engine, {ratio_n} prompts x {args.max_tokens} tokens ...",
                  flush=True)
            bare.append({"round": rep, **bare_engine.run(ratio_n, args.max_tokens)})
            ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
            try:
                url = run_serve(make_spec())
                asyncio.run(client_run(url, 1, 4))  # warm-up
                for c in levels:
                    print(f"round {rep + 1}/{args.repeats}: served, {c} concurrent streaming clients ...", flush=True)
                    served.append({"round": rep, **asyncio.run(client_run(url, c, args.max_tokens))})
            finally:
                stop_serve()
    finally:
        bare_engine.engine.stop()
    pairs = [round(s["tokens_per_s"] / b["tokens_per_s"], 3)
             for b in bare for s in served if s["round"] == b["round"] and s["concurrency"] == ratio_n]
    ratio = statistics.median(pairs)

    print(f"\nmodel {args.model}, {args.cpus} CPU threads, {args.max_tokens} output tokens per request, "
          f"stream budget {budget:g} messages/s")
    print(f"{'run':<24}{'tokens':>8}{'chunks':>8}{'wall s':>9}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
          f"{'load1':>12}")
    for rep in range(args.repeats):
        b = bare[rep]
        label = f"{rep + 1}: bare engine batch"
        print(f"{label:<24}{b['output_tokens']:>8}{'-':>8}{b['wall_s']:>9}"
              f"{b['tokens_per_s']:>9}{'-':>10}{'-':>10}{str(b['load1'][0]):>12}")
        for s in (s for s in served if s["round"] == rep):
            label = f"{rep + 1}: served, {s['concurrency']} clients"
            print(f"{label:<24}{s['output_tokens']:>8}"
                  f"{s['sse_chunks']:>8}{s['wall_s']:>9}{s['tokens_per_s']:>9}{s['ttft_p50_s']:>10}"
                  f"{s['ttft_p99_s']:>10}{str(s['load1'][0]):>12}")
    print(f"served/bare throughput at {ratio_n} clients: per round {pairs}, median {ratio}")
    out = {"model": args.model, "cpus": args.cpus, "max_tokens": args.max_tokens, "machine": platform.platform(),
           "python": sys.version.split()[0], "stream_messages_per_s": None if budget == float("inf") else budget, "repeats": args.repeats,
           "bare": bare, "served": served, "ratio_per_round": pairs, "ratio_served_over_bare": ratio,
           "ratio_concurrency": ratio_n, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
