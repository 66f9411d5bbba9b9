"""A shared-prefix chat workload for benchmarks/serve_gpu.py's routing leg: multi-turn conversations.

Each of `conversations` clients holds one conversation: a system message of `doc_tokens` tokens (its
own document, distinct per conversation), then `turns` user turns, each sent with the whole history
(the previous replies included), so every turn's prompt extends the last one's: the prefix a replica's
vLLM prefix cache can reuse when the turn lands where the conversation was. The conversations run at
once, their turns one after another. Each streamed answer's `x-fleetllm-replica` header and usage
(`prompt_tokens_details.cached_tokens`: the prompt tokens vLLM found in its prefix cache) give each
replica's prefix cache hit rate (cached / prompt tokens).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Any


def conversations(tokenizer, n: int, doc_tokens: int, turns: int, question_tokens: int, seed: int = 0):
    """[(system text, [user text per turn])] per conversation, deterministic."""
    from gpu_workloads import _text_of_tokens

    rng = random.Random(f"chat-{n}-{doc_tokens}-{turns}-{seed}")
    return [(f"Conversation {c}. Read this document and answer questions about it.\n"
             + _text_of_tokens(tokenizer, rng, doc_tokens),
             [f"Question {t}: " + _text_of_tokens(tokenizer, rng, question_tokens) for t in range(turns)])
            for c in range(n)]


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def run_chat(url: str, model: str, convs: list, output_tokens: int, timeout_s: float = 600,
                   stagger_s: float = 0.05) -> dict[str, Any]:
    """Run every conversation (turns in order, conversations at once, the c-th starting c x stagger_s later:
    users do not arrive in the same millisecond, and a router placing a new prefix needs to have seen the
    previous one); per-request records and a summary."""
    import httpx

    records: list[dict[str, Any]] = []

    async def one(client, c: int, system: str, questions: list[str]) -> None:
        await asyncio.sleep(c * stagger_s)
        history = [{"role": "system", "content": system}]
        for t, q in enumerate(questions):
            history.append({"role": "user", "content": q})
            body = {"model": model, "messages": history, "max_tokens": output_tokens, "ignore_eos": True,
                    "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            ttft, reply, usage, rec = None, [], {}, {"conversation": c, "turn": t}
            try:
                async with client.stream("POST", f"{url}/chat/completions", json=body) as resp:
                    rec["replica"] = resp.headers.get("x-fleetllm-replica")
                    if resp.status_code != 200:
                        raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            ttft = ttft if ttft is not None else time.perf_counter() - t0
                            reply.append(chunk["choices"][0]["delta"]["content"])
                        usage = chunk.get("usage") or usage
            except Exception as exc:  # noqa: BLE001 - recorded, the conversation stops
                records.append({**rec, "error": f"{type(exc).__name__}: {exc}"})
                return
            details = usage.get("prompt_tokens_details") or {}
            records.append({**rec, "ttft_s": ttft, "e2e_s": time.perf_counter() - t0,
                            "prompt_tokens": usage.get("prompt_tokens"), "output_tokens": usage.get("completion_tokens"),
                            "cached_tokens": details.get("cached_tokens")})
            history.append({"role": "assistant", "content": "".join(reply)})

    limits = httpx.Limits(max_connections=len(convs) + 8, max_keepalive_connections=len(convs) + 8)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*[one(client, c, s, qs) for c, (s, qs) in enumerate(convs)])
        wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), **summarize(records, wall), "requests": records}


def summarize(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in records if "error" not in r]
    ttfts = [r["ttft_s"] * 1000 for r in ok if r.get("ttft_s") is not None]
    later = [r["ttft_s"] * 1000 for r in ok if r.get("ttft_s") is not None and r["turn"] > 0]
    replicas: dict[str, dict[str, Any]] = {}
    for r in ok:
        rep = replicas.setdefault(str(r.get("replica")), {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0})
        rep["requests"] += 1
        rep["prompt_tokens"] += r.get("prompt_tokens") or 0
        rep["cached_tokens"] += r.get("cached_tokens") or 0
    for rep in replicas.values():
        rep["prefix_cache_hit_rate"] = round(rep["cached_tokens"] / rep["prompt_tokens"], 3) if rep["prompt_tokens"] else None
    by_conv: dict[int, set] = {}
    for r in ok:
        by_conv.setdefault(r["conversation"], set()).add(r.get("replica"))
    prompt = sum(r.get("prompt_tokens") or 0 for r in ok)
    cached = sum(r.get("cached_tokens") or 0 for r in ok)
    out = sum(r.get("output_tokens") or 0 for r in ok)
    return {"completed": len(ok), "failed": len(records) - len(ok),
            "errors": sorted({r["error"] for r in records if "error" in r})[:5],
            "output_throughput": round(out / wall, 1) if wall else None,
            "prompt_tokens": prompt, "cached_tokens": cached,
            "prefix_cache_hit_rate": round(cached / prompt, 3) if prompt else None,
            "median_ttft_ms": round(statistics.median(ttfts), 1) if ttfts else None,
            "p99_ttft_ms": round(pct(ttfts, 99), 1) if ttfts else None,
            "median_ttft_later_turns_ms": round(statistics.median(later), 1) if later else None,
            "conversations_on_one_replica": round(sum(len(v) == 1 for v in by_conv.values()) / len(by_conv), 3)
            if by_conv else None,
            "replicas": replicas}
