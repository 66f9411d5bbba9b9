"""Structured vs free generation on the same prompts: what a grammar costs per output token.

fleetllm's engine (transformers with xgrammar, or vLLM with its own structured output backend) runs
the same chats in legs, interleaved --repeats times (median reported; the machine may be shared,
so compare ratios within one run):

  free          no constraint (the baseline)
  json_schema   response_format json_schema (an object of strings, a list and a number)
  json_object   response_format json_object (any JSON object)
  choice        structured_outputs choice (one label out of four)

Each leg's figure is its own output tokens / wall seconds (structured outputs end where the grammar
does, so legs generate different counts); `ratio` is the median over rounds of a leg's tokens/s over the
same round's free leg. `valid`
is the share of rows whose text parses as JSON (the JSON legs; the free leg is asked for JSON too).
The engine and the grammars are warmed up before timing (a grammar compiles once per schema).

Prints a table and writes benchmarks/results/structured-<engine>[-<tag>].json. Run:
    PYTHONPATH=$PWD python benchmarks/structured.py --engine transformers [--rows 16 --max-tokens 64]
    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=$PWD python benchmarks/structured.py --engine vllm
    # GPU (vLLM): --engine vllm --model /path/to/model --rows 512 --max-tokens 256 --tag h200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "bees", "trains", "glass", "music", "salt",
          "clouds", "paper", "bridges", "tea", "maps", "owls"]
SCHEMA = {"type": "object", "additionalProperties": False, "properties": {  # bounded, as labelling schemas are
    "topic": {"type": "string", "maxLength": 40}, "summary": {"type": "string", "maxLength": 160},
    "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 4},
    "interest": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["topic", "summary", "keywords", "interest"]}
LABELS = ["science", "food", "nature", "culture"]
LEGS = {
    "free": {},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "note", "schema": SCHEMA}}},
    "json_object": {"response_format": {"type": "json_object"}},
    "choice": {"structured_outputs": {"choice": LABELS}},
}


def chats(rows: int) -> list[list[dict]]:
    ask = ("Describe {} as a JSON object with the keys topic, summary, keywords (a list) and interest "
           "(a number from 1 to 10).")
    return [[{"role": "user", "content": ask.format(TOPICS[i % len(TOPICS)])}] for i in range(rows)]


def run_leg(engine, leg: str, rows: int, max_tokens: int) -> dict:
    from fleetllm.engines.base import GenerationRequest

    requests = [GenerationRequest(messages=m, sampling={"max_tokens": max_tokens, "temperature": 0.0, **LEGS[leg]})
                for m in chats(rows)]
    start = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    if errors:
        raise SystemExit(f"leg {leg}: {len(errors)} row(s) failed, e.g. {errors[0]}")
    tokens = sum(r.num_generated_tokens for r in results)
    valid = sum(1 for r in results if _is_json(r.text))
    return {"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall, "valid_json": valid / rows}


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
        return True
    except json.JSONDecodeError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="alias, folder or hub id")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engine-kwargs", default="{}", help="JSON, passed to the engine (e.g. max_model_len)")
    ap.add_argument("--tag", default="", help="suffix of the result file (e.g. the machine)")
    args = ap.parse_args()

    from fleetllm import models
    from fleetllm.engines.base import create_engine

    kwargs = {"max_model_len": 2048, **json.loads(args.engine_kwargs)}
    if args.engine == "transformers":
        kwargs.setdefault("max_batch_size", args.rows)
    path = models.resolve(args.model).path
    engine = create_engine(args.engine, path, engine_kwargs=kwargs)
    t0 = time.perf_counter()
    engine.start()
    start_s = time.perf_counter() - t0
    for leg in LEGS:  # warm-up: the engine, and each grammar compiled once
        run_leg(engine, leg, 2, 8)
    runs: dict[str, list[dict]] = {leg: [] for leg in LEGS}
    for _ in range(args.repeats):
        for leg in LEGS:
            runs[leg].append(run_leg(engine, leg, args.rows, args.max_tokens))
    engine.stop()

    legs = {}
    for leg, rs in runs.items():
        legs[leg] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                     "output_tokens": statistics.median(r["output_tokens"] for r in rs),
                     "wall_s": statistics.median(r["wall_s"] for r in rs),
                     "valid_json": statistics.median(r["valid_json"] for r in rs) if leg != "choice" else None,
                     "runs": rs}
    for name, leg in legs.items():  # each round's leg over the same round's free leg, then the median
        leg["ratios"] = [r["tokens_per_s"] / f["tokens_per_s"] for r, f in zip(runs[name], runs["free"])]
        leg["ratio"] = statistics.median(leg["ratios"])
    print(f"engine {args.engine} ({engine.version}), model {args.model}, {args.rows} rows x <= {args.max_tokens} "
          f"tokens, greedy, median of {args.repeats}")
    print(f"{'leg':<12} {'out tokens':>10} {'wall s':>8} {'tok/s':>8} {'ratio':>6} {'valid JSON':>10}")
    for name, leg in legs.items():
        print(f"{name:<12} {leg['output_tokens']:>10.0f} {leg['wall_s']:>8.2f} {leg['tokens_per_s']:>8.1f} "
              f"{leg['ratio']:>6.2f} {'-' if leg['valid_json'] is None else format(leg['valid_json'], '.0%'):>10}")
    out = Path(__file__).parent / "results" / f"structured-{args.engine}{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({
        "engine": args.engine, "engine_version": engine.version, "model": args.model, "rows": args.rows,
        "max_tokens": args.max_tokens, "repeats": args.repeats, "engine_kwargs": kwargs,
        "engine_start_s": start_s, "legs": legs, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                             "node": platform.node()},
        "note": "tokens/s of each leg over its own output tokens; ratio: the median over rounds of the leg's tokens/s "
                "over the same round's free leg; the machine may be shared", "load1": os.getloadavg()[0],
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
