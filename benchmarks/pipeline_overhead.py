"""Pipeline overhead: the same prompts through the bare engine in one process and through `fleetllm run`.

Both legs use the same model, prompts, sampling (fixed lengths via min_tokens), batch size and CPU
threads; throughput is output tokens/s after engine start. The bare vLLM leg is `vllm.LLM.generate`
on the same token ids; the bare transformers leg is fleetllm's engine called in one process. Prints a
table, writes JSON.

    .venv/bin/python benchmarks/pipeline_overhead.py [--engine transformers|vllm] [--prompts 64] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_prompts(n: int) -> list[str]:
    lines = (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["instruction"] for x in lines]
    return [prompts[i % len(prompts)] for i in range(n)]


def engine_kwargs_for(engine: str, threads: int) -> dict:
    if engine == "transformers":
        return {"num_threads": threads}
    # what fleetllm's vLLM engine uses on CPU by default, spelled out so the bare leg gets the same
    return {"enforce_eager": True, "max_model_len": 2048, "kv_cache_memory_bytes": 1 << 30}


def bare_vllm(model_path: str, prompts: list[str], sampling: dict, threads: int) -> dict:
    """`vllm.LLM.generate` on the token ids fleetllm's chat template produces for these prompts."""
    from vllm import LLM, SamplingParams

    from fleetllm.engines import GenerationRequest
    from fleetllm.engines.chat import render_prompt

    llm = LLM(model=model_path, **engine_kwargs_for("vllm", threads))
    tok = llm.get_tokenizer()
    ids = []
    for p in prompts:
        req = GenerationRequest(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                          {"role": "user", "content": p}])
        ids.append({"prompt_token_ids": tok(render_prompt(tok, req, {}), add_special_tokens=False)["input_ids"]})
    params = SamplingParams(max_tokens=sampling["max_tokens"], min_tokens=sampling["min_tokens"], temperature=0.0)
    t0 = time.perf_counter()
    outs = llm.generate(ids, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    return {"output_tokens": tokens, "wall_s": wall, "output_tokens_per_s": tokens / wall, "bare": "vllm.LLM"}


def bare(engine_name: str, model_path: str, prompts: list[str], sampling: dict, batch: int, threads: int) -> dict:
    if engine_name == "vllm":
        return bare_vllm(model_path, prompts, sampling, threads)
    from fleetllm.engines import GenerationRequest, create_engine

    engine = create_engine(engine_name, model_path, engine_kwargs=engine_kwargs_for(engine_name, threads))
    engine.start()
    requests = [GenerationRequest(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                            {"role": "user", "content": p}], sampling=sampling) for p in prompts]
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(requests), batch):
        tokens += sum(r.num_generated_tokens for r in engine.generate(requests[i:i + batch]))
    wall = time.perf_counter() - t0
    engine.stop()
    return {"output_tokens": tokens, "wall_s": wall, "output_tokens_per_s": tokens / wall}


def pipeline(engine_name: str, model_source: str, prompts: list[str], sampling: dict, batch: int,
             threads: int, workdir: Path) -> dict:
    from fleetllm.batch.runner import run_job
    from fleetllm.spec import JobSpec

    src = workdir / "prompts.jsonl"
    src.write_text("".join(json.dumps({"instruction": p}) + "\n" for p in prompts))
    spec = JobSpec.model_validate({
        "name": "bench", "model": {"source": model_source, "engine": engine_name,
                                   "engine_kwargs": engine_kwargs_for(engine_name, threads)},
        "input": {"path": str(src)}, "prompt": {"system": "You are a helpful assistant.", "template": "{instruction}"},
        "sampling": {"max_tokens": sampling["max_tokens"], "extra": {"min_tokens": sampling["min_tokens"]}},
        "output": {"path": str(workdir / "out"), "shard_rows": max(batch, 32)},
        # vllm: batch_size left out, so the replica takes whole shards (fleetllm's default for vllm)
        "compute": {"replicas": 1, "cpus_per_replica": threads,
                    **({"batch_size": batch} if engine_name == "transformers" else {})},
    })
    t0 = time.perf_counter()
    report = run_job(spec, overwrite=True)
    return {"output_tokens": report["output_tokens_computed"], "wall_s": report["generation_wall_s"],
            "output_tokens_per_s": report["output_tokens_per_s_after_engine_start"],
            "end_to_end_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pipeline_overhead.json"))
    args = parser.parse_args()

    from fleetllm import models

    model_path = models.resolve(args.model).path
    prompts = load_prompts(args.prompts)
    sampling = {"max_tokens": args.tokens, "min_tokens": args.tokens, "temperature": 0.0}
    batch = args.batch_size if args.engine == "transformers" else args.prompts
    with tempfile.TemporaryDirectory() as tmp:
        bare_res = bare(args.engine, model_path, prompts, sampling, batch, args.threads)
        pipe_res = pipeline(args.engine, args.model, prompts, sampling, batch, args.threads, Path(tmp))
    ratio = pipe_res["output_tokens_per_s"] / bare_res["output_tokens_per_s"]
    rows = [("bare engine", bare_res), ("fleetllm run (1 replica)", pipe_res)]
    print(f"\npipeline overhead: {args.engine}, {args.model}, {args.prompts} prompts x {args.tokens} tokens, "
          f"batch {batch}, {args.threads} threads, {platform.node()}")
    print(f"{'leg':28s} {'output tokens':>13s} {'seconds':>9s} {'tokens/s':>9s}")
    for name, r in rows:
        print(f"{name:28s} {r['output_tokens']:13d} {r['wall_s']:9.2f} {r['output_tokens_per_s']:9.1f}")
    print(f"ratio fleetllm / bare: {ratio:.3f}")
    result = {"engine": args.engine, "model": args.model, "prompts": args.prompts, "tokens": args.tokens,
              "batch_size": batch, "threads": args.threads, "bare": bare_res, "fleetllm": pipe_res,
              "ratio": ratio, "machine": {"node": platform.node(), "cpus": os.cpu_count()},
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(out.read_text()) if out.exists() else {}
    existing[args.engine] = result
    out.write_text(json.dumps(existing, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
