"""Resume planning at scale: plan a large input against an output folder of committed shards.

For each input format (jsonl: shards located by byte offset; parquet: by row count from the footer)
and each scale, the script writes the input, then measures `plan_job(spec)` (the same call
`fleetllm run` makes: list files, plan shards, check columns, fingerprint, prepare the folder,
read the manifest, decide which shards are pending) against an output folder with 0, half and all
shards committed through the real commit path (`assemble.commit_shard`: data part written
whole, then its commit object). Each measurement runs in a fresh subprocess so its peak RSS
is its own; the model is a placeholder folder (plan_job only stats model files, never loads them:
the child checks that torch/transformers/vllm/ray were not imported).

Scales: 100k rows in 100 shards, 1M rows in 100 shards and 1M rows in 1,000 shards, so memory
can be seen to follow shards, not rows.

    .venv/bin/python benchmarks/resume_planning.py [--rows 1000000] [--shard-rows 1000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAVY = ("torch", "transformers", "vllm", "ray")


# --- the measured child ---------------------------------------------------------------------------

def _status_mib(key: str) -> float | None:
    """VmRSS / VmHWM of this process from /proc (Linux), in MiB."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0), so the next VmHWM is this step's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure(spec_dict: dict) -> dict:
    """Run in a fresh process: time and memory of plan_job and of its resume steps."""
    import gc
    import tracemalloc

    from fleetllm.batch.inputs import input_files as bio
    from fleetllm.batch.output.commit import OutputFolder
    from fleetllm.batch.planning.shards import plan_shards
    from fleetllm.batch.planning.job_prepare import plan_and_prepare
    from fleetllm.spec import JobSpec

    spec = JobSpec.model_validate(spec_dict)
    gc.collect()
    before_modules = set(sys.modules)
    ru_base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    reset = _reset_peak_rss()
    rss_base = _status_mib("VmRSS") if reset else ru_base
    t0 = time.perf_counter()
    plan = plan_and_prepare(spec)
    plan_s = time.perf_counter() - t0
    rss_peak = _status_mib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    repeats = []
    for _ in range(3):  # the same call again: the spread shows the machine's noise
        t0 = time.perf_counter()
        plan_and_prepare(spec)
        repeats.append(time.perf_counter() - t0)
    loaded = sorted(m for m in HEAVY if m in sys.modules and m not in before_modules)

    # the steps of resume on their own (warm: the same files, just read by plan_job)
    t0 = time.perf_counter()
    files = bio.describe_files(spec.input.path, spec.input.format, spec.output.shard_rows)
    describe_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    shards = plan_shards(files, spec.output.shard_rows, spec.input.limit)
    shards_s = time.perf_counter() - t0
    out = OutputFolder(spec.output.path, spec.output.format)
    t0 = time.perf_counter()
    out.read_manifest()
    manifest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pending, committed = out.pending(shards, plan.fingerprint)
    pending_s = time.perf_counter() - t0

    # Python allocations of a second plan_job: peak while planning, and what the plan keeps
    del files, shards, pending, committed
    gc.collect()
    tracemalloc.start()
    plan2 = plan_and_prepare(spec)
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(plan2.pending) == len(plan.pending)
    return {
        "shards": len(plan.shards), "rows": plan.total_rows, "committed": len(plan.committed),
        "pending": len(plan.pending), "rows_skipped": plan.skipped_rows,
        "plan_job_s": plan_s, "plan_job_repeat_median_s": sorted(repeats)[1],
        "describe_files_s": describe_s, "plan_shards_s": shards_s,
        "read_manifest_s": manifest_s, "pending_s": pending_s,
        "rss_baseline_mib": rss_base, "rss_peak_mib": rss_peak, "rss_delta_mib": max(0.0, rss_peak - rss_base),
        "rss_method": "VmHWM after clear_refs, minus VmRSS before" if reset else "ru_maxrss delta",
        "py_peak_mib": peak / 2**20, "py_retained_mib": retained / 2**20,
        "heavy_modules_imported": loaded,
    }


# --- the driver -----------------------------------------------------------------------------------

def write_inputs(folder: Path, rows: int, row_group_rows: int) -> dict[str, Path]:
    """The same rows (~110 bytes each) as JSONL, as Parquet with pyarrow's default row groups (up to
    1,048,576 rows: one group here) and as Parquet with row groups of `row_group_rows`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    paths = {"jsonl": folder / f"rows-{rows}.jsonl", "parquet": folder / f"rows-{rows}.parquet",
             f"parquet-rg{row_group_rows}": folder / f"rows-{rows}-rg{row_group_rows}.parquet"}

    def row(i: int) -> dict:
        return {"id": f"q{i:08d}", "question": f"In one sentence, what is item {i} of the catalogue used for?",
                "topic": ("tools", "food", "books")[i % 3]}

    if not paths["jsonl"].exists():
        with open(paths["jsonl"], "w") as fh:
            for start in range(0, rows, 100_000):
                fh.write("".join(json.dumps(row(i)) + "\n" for i in range(start, min(start + 100_000, rows))))
    if not all(p.exists() for p in paths.values()):
        table = pa.Table.from_pylist([row(i) for i in range(rows)])
        pq.write_table(table, paths["parquet"])
        pq.write_table(table, paths[f"parquet-rg{row_group_rows}"], row_group_size=row_group_rows)
    return paths


def job_spec(input_path: Path, out: Path, model: Path, shard_rows: int, engine: str = "transformers") -> dict:
    return {
        "name": "resume-planning", "model": {"source": str(model), "engine": engine},
        "input": {"path": str(input_path)}, "prompt": {"template": "{question}"},
        "sampling": {"max_tokens": 16}, "output": {"path": str(out), "format": "parquet", "shard_rows": shard_rows},
        "compute": {"replicas": 1},
    }


def commit_shards(spec_dict: dict, upto: int) -> float:
    """Commit shards [already committed, upto) through the runner's own commit path; seconds taken."""
    import pyarrow as pa

    from fleetllm.batch.output.commit import OutputFolder
    from fleetllm.batch.output.assemble import commit_shard
    from fleetllm.batch.planning.job_prepare import plan_and_prepare
    from fleetllm.batch.output.writers import shard_writer
    from fleetllm.spec import JobSpec

    spec = JobSpec.model_validate(spec_dict)
    plan = plan_and_prepare(spec)
    out = OutputFolder(spec.output.path, spec.output.format)
    writer = shard_writer(spec.output.format)
    t0 = time.perf_counter()
    for shard in plan.pending:
        if shard.shard_id >= upto:
            break
        n = shard.rows
        lines = list(range(shard.start, shard.stop))
        table = pa.table({
            "id": [f"q{i:08d}" for i in lines], "row_id": [f"{shard.rel}:{i}" for i in lines],
            "generated_text": ["ok"] * n, "num_input_tokens": [20] * n, "num_generated_tokens": [1] * n,
            "finish_reason": ["stop"] * n, "error": pa.nulls(n, pa.string()), "attempts": [1] * n,
            "_shard": [shard.shard_id] * n, "_line": lines,
        })
        commit_shard(out, plan, shard, table, writer)
    return time.perf_counter() - t0


def _row_groups(path: Path) -> int | None:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_row_groups if path.suffix == ".parquet" else None


def measure_case(spec: dict, fmt: str, path: Path, shards: int, committed: int) -> dict:
    r = run_child(spec)
    if r["committed"] != committed or r["pending"] != shards - committed:
        raise RuntimeError(f"expected {committed} committed of {shards}, got {r}")
    r.update(format=fmt, engine=spec["model"]["engine"], shard_rows=spec["output"]["shard_rows"],
             input_bytes=path.stat().st_size, row_groups=_row_groups(path))
    print(f"{fmt:15s} {r['rows']:>9,} rows {shards:>5,} shards {committed:>5,} committed, engine {r['engine']}: "
          f"plan_job {r['plan_job_s']:.2f}s, RSS +{r['rss_delta_mib']:.1f} MiB, "
          f"python peak {r['py_peak_mib']:.1f} MiB", flush=True)
    return r


def run_child(spec_dict: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--measure", json.dumps(spec_dict)],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="resume planning: plan_and_prepare(spec) in a fresh process (warm page cache)")
    for col in ("input", "engine", "row groups", "rows", "shards", "committed", "pending", "plan_job s",
                "again s", "scan s", "skip s", "RSS Δ MiB", "py peak MiB", "plan keeps MiB"):
        t.add_column(col, justify="left" if col in ("input", "engine") else "right")
    for r in results:
        t.add_row(r["format"].split("-")[0], r["engine"], str(r["row_groups"] or "-"), f"{r['rows']:,}",
                  f"{r['shards']:,}", f"{r['committed']:,}", f"{r['pending']:,}", f"{r['plan_job_s']:.2f}",
                  f"{r['plan_job_repeat_median_s']:.2f}", f"{r['describe_files_s']:.2f}",
                  f"{r['read_manifest_s'] + r['pending_s']:.3f}", f"{r['rss_delta_mib']:.1f}",
                  f"{r['py_peak_mib']:.1f}", f"{r['py_retained_mib']:.2f}")
    Console(width=180).print(t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--row-group-rows", type=int, default=10_000, help="Parquet row group size of the input")
    parser.add_argument("--workdir", help="keep inputs and outputs here (default: a temporary folder)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "resume_planning.json"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fleetllm-resume-bench-"))
    model = work / "model"  # plan_job stats a model folder's files; it never loads them
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    small = max(args.rows // 10, args.shard_rows)
    # (rows, shard_rows): 100 shards of small rows, 100 shards of big ones, then the full shard count
    scales = [(small, args.shard_rows), (args.rows, args.rows // (small // args.shard_rows)),
              (args.rows, args.shard_rows)]
    results, commit_s = [], {}
    try:
        t0 = time.perf_counter()
        inputs = {rows: write_inputs(work / "input", rows, args.row_group_rows) for rows in {r for r, _ in scales}}
        print(f"wrote inputs in {time.perf_counter() - t0:.1f}s under {work}")
        for fmt in inputs[args.rows]:
            for rows, shard_rows in scales:
                path = inputs[rows][fmt]
                out = work / "out" / f"{fmt}-{rows}-{shard_rows}"
                if out.exists():
                    shutil.rmtree(out)
                spec = job_spec(path, out, model, shard_rows)
                shards = -(-rows // shard_rows)
                for committed in (0, shards // 2, shards):
                    if committed:
                        commit_s[f"{fmt}-{rows}-{shard_rows}"] = commit_shards(spec, committed)
                    results.append(measure_case(spec, fmt, path, shards, committed))
        # engine auto looks for a GPU before planning (fleetllm/batch/resources.py): its own cost
        path = inputs[args.rows]["jsonl"]
        shutil.rmtree(work / "out" / "jsonl-auto", ignore_errors=True)
        spec = job_spec(path, work / "out" / "jsonl-auto", model, args.shard_rows, engine="auto")
        results.append(measure_case(spec, "jsonl", path, -(-args.rows // args.shard_rows), 0))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    for engine in sorted({r["engine"] for r in results}):
        loaded = sorted({m for r in results if r["engine"] == engine for m in r["heavy_modules_imported"]})
        print(f"engine {engine}: modules plan_job imported among {HEAVY}: {', '.join(loaded) or 'none'}")
    print("scan s: listing and counting the input; skip s: reading the manifest and choosing pending shards")
    doc = {"rows": args.rows, "shard_rows": args.shard_rows, "parquet_row_group_rows": args.row_group_rows,
           "cases": results, "commit_seconds_last_batch": commit_s,
           "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform()},
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
