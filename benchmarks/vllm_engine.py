"""Bare vLLM vs fleetllm's VLLMEngine, and a sync (vllm.LLM) vs async (AsyncLLM) replica.

Same chats, same token ids, same sampling (greedy, ignore_eos, so every row generates exactly
--max-tokens tokens) on the embedded model. Both engines are started once and warmed up, then the
legs run interleaved, --repeats times (median reported; the machine may be shared, so compare ratios
within one run):

  bare LLM.generate, all rows     vllm.LLM.generate on all rows in one call (the baseline)
  VLLMEngine.generate, all rows   fleetllm's engine (AsyncLLM inside) on the same rows in one call
  sync replica, batches           vllm.LLM fed --batch-size rows at a time, one batch after the other
                                  (what a replica built on vllm.LLM does with the runner's batches)
  async replica, batches          VLLMEngine fed the same batches from --concurrency threads at once
                                  (a replica actor with max_concurrency > 1)

Prints a table and writes benchmarks/results/vllm_engine.json. Run:
    PYTHONPATH=$PWD python benchmarks/vllm_engine.py [--rows 64 --max-tokens 64 --batch-size 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "bees", "trains", "glass", "music", "salt",
          "clouds", "paper", "bridges", "tea", "maps", "owls"]
ASKS = ["Explain {} in two sentences.", "Write a short poem about {}.", "Give three facts about {}.",
        "Why do people care about {}?"]


def chats(rows: int) -> list[list[dict]]:
    return [[{"role": "user", "content": ASKS[i % len(ASKS)].format(TOPICS[i // len(ASKS) % len(TOPICS)])}]
            for i in range(rows)]


def engine_kwargs(max_model_len: int) -> dict:
    return {"max_model_len": max_model_len, "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30,
            "disable_log_stats": True}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class Bare:
    """vllm.LLM, the baseline, on token ids."""

    def __init__(self, model: str, token_ids: list[list[int]], args) -> None:
        from vllm import LLM, SamplingParams

        self.llm, self.start_s = timed(lambda: LLM(model=model, **engine_kwargs(args.max_model_len)))
        self.params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        self.prompts = [{"prompt_token_ids": ids} for ids in token_ids]
        self.batch_size = args.batch_size
        self.llm.generate(self.prompts[:2], self.params, use_tqdm=False)  # warm-up

    def all_rows(self) -> int:
        out = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        return sum(len(c.token_ids) for o in out for c in o.outputs)

    def batches(self) -> int:
        out = [o for b in batches(self.prompts, self.batch_size)
               for o in self.llm.generate(b, self.params, use_tqdm=False)]
        return sum(len(c.token_ids) for o in out for c in o.outputs)

    def stop(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


class Ours:
    """fleetllm's VLLMEngine on the same chats."""

    def __init__(self, model: str, messages: list, args) -> None:
        from fleetllm.engines.base import GenerationRequest
        from fleetllm.engines.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model, engine_kwargs=engine_kwargs(args.max_model_len))
        _, self.start_s = timed(self.engine.start)
        sampling = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
        self.requests = [GenerationRequest(messages=m, sampling=sampling) for m in messages]
        self.token_ids = [self.engine.prompt_token_ids(r) for r in self.requests]
        self.args = args
        self.engine.generate(self.requests[:2])  # warm-up

    @staticmethod
    def _tokens(results) -> int:
        errors = [r.error for r in results if r.error]
        if errors:
            raise SystemExit(f"VLLMEngine returned row errors: {errors[:3]}")
        return sum(r.num_generated_tokens for r in results)

    def all_rows(self) -> int:
        return self._tokens(self.engine.generate(self.requests))

    def batches(self) -> int:
        with ThreadPoolExecutor(self.args.concurrency) as pool:
            parts = pool.map(self.engine.generate, batches(self.requests, self.args.batch_size))
            return self._tokens([r for part in parts for r in part])

    def stop(self) -> None:
        self.engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each leg; the median is reported")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "vllm_engine.json"))
    args = parser.parse_args()

    import vllm

    from fleetllm import models

    model = models.resolve(models.EMBEDDED_DEFAULT).path
    ours = Ours(model, chats(args.rows), args)
    bare = Bare(model, ours.token_ids, args)  # both stay up; the legs interleave, repeat by repeat
    plan = [
        ("bare LLM.generate, all rows", bare.all_rows),
        ("VLLMEngine.generate, all rows", ours.all_rows),
        (f"sync replica (vllm.LLM), batches of {args.batch_size} one after the other", bare.batches),
        (f"async replica (VLLMEngine), batches of {args.batch_size} from {args.concurrency} threads", ours.batches),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _ in plan}
    tokens: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, fn in plan:
            tokens[name], seconds = timed(fn)
            samples[name].append(seconds)
    bare_start_s, engine_start_s = bare.start_s, ours.start_s
    ours.stop()
    bare.stop()
    legs = [{"leg": name, "tokens": tokens[name], "seconds": statistics.median(samples[name]),
             "samples_s": samples[name]} for name, _ in plan]
    base = legs[0]["tokens"] / legs[0]["seconds"]
    for leg in legs:
        leg["tokens_per_s"] = leg["tokens"] / leg["seconds"]
        leg["vs_bare"] = leg["tokens_per_s"] / base

    print(f"\nvLLM {vllm.__version__}, {args.rows} chats x {args.max_tokens} tokens, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, median of {args.repeats}; start-up: LLM {bare_start_s:.0f} s, VLLMEngine {engine_start_s:.0f} s\n")
    print(f"{'leg':<72} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs bare':>8}")
    for leg in legs:
        print(f"{leg['leg']:<72} {leg['tokens']:>7} {leg['seconds']:>8.1f} {leg['tokens_per_s']:>7.1f} "
              f"{leg['vs_bare']:>8.2f}")
    result = {"vllm": vllm.__version__, "rows": args.rows, "max_tokens": args.max_tokens,
              "batch_size": args.batch_size, "concurrency": args.concurrency, "cpus": os.cpu_count(), "repeats": args.repeats,
              "start_s": {"vllm.LLM": bare_start_s, "VLLMEngine": engine_start_s}, "legs": legs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
