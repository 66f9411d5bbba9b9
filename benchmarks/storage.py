"""Commit throughput and resume planning of the output folder, on the local disk and on an S3 API server.

For each store, a job of SHARDS shards (each a small parquet part of ROWS rows) is committed through
`OutputFolder.commit` (data whole under its final name, then one commit object per shard), and
then planned for resume (`OutputFolder.pending`: list `_fleetllm/commits/`, read the commit
objects, list the data parts) with all shards committed. Locally, two other write paths are timed
beside it on the same shards: the previous protocol (data through tmp + rename, then a fsynced
line appended to `_fleetllm/manifest.jsonl`), and data written straight under its final name
(no tmp + rename: not atomic on a file system, the figure shows what the rename costs).

The S3 server is moto's server mode on 127.0.0.1 (fleetllm.testing.s3_server), a Python process:
its figures are a floor for request counts and shapes, not a forecast of AWS or MinIO latency.

    .venv/bin/python benchmarks/storage.py [--shards 1000] [--rows 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from fleetllm.batch.output import store  # noqa: E402
from fleetllm.batch.output.commit import META, ManifestEntry, OutputFolder, part_name  # noqa: E402
from fleetllm.batch.planning.shards import InputFile, plan_shards, shard_fingerprint  # noqa: E402

FP = "benchmark-job"


def shard_table(rows: int) -> pa.Table:
    return pa.table({"row_id": [f"r{i}" for i in range(rows)], "generated_text": ["x" * 200] * rows,
                     "num_generated_tokens": list(range(rows))})


def entry(shard, rows: int) -> ManifestEntry:
    return ManifestEntry(shard=shard.shard_id, file=part_name(shard.shard_id, "parquet"), rows=rows, errors=0,
                         input_tokens=rows, output_tokens=rows, fingerprint=shard_fingerprint(FP, shard), nodes=[])


def commit_all(url: str, shards, table: pa.Table, how: str) -> float:
    """Seconds to commit every shard into a fresh folder, `how` being the write path."""
    out = OutputFolder(url, "parquet")
    out.prepare(FP, {"bench": 1}, overwrite=False)
    write = lambda fh: pq.write_table(table, fh)  # noqa: E731
    t0 = time.perf_counter()
    for shard in shards:
        e = entry(shard, table.num_rows)
        if how == "commit objects":
            out.commit(e, write)
        elif how == "manifest append (previous)":
            store.write_atomic(out.fs, out.p(e.file), write)
            with open(out.p(META, "manifest.jsonl"), "a") as fh:
                fh.write(e.to_json() + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        else:  # data straight under its final name, then its commit object
            with open(out.p(e.file), "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            out._write_commit(e)
    return time.perf_counter() - t0


def plan_all(url: str, shards) -> tuple[float, int]:
    out = OutputFolder(url, "parquet")
    t0 = time.perf_counter()
    todo, valid = out.pending(shards, FP)
    return time.perf_counter() - t0, len(valid)


def measure(store_name: str, base: str, shards, table, repeats: int, hows: list[str]) -> list[dict]:
    results = []
    for how in hows:
        commit_s, plan_s, found = [], [], 0
        for k in range(repeats):
            url = f"{base}/{how.split()[0]}-{k}"
            commit_s.append(commit_all(url, shards, table, how))
            seconds, found = plan_all(url, shards)
            plan_s.append(seconds)
        results.append({"store": store_name, "write_path": how, "shards": len(shards), "rows_per_shard": table.num_rows,
                        "commit_s_median": statistics.median(commit_s), "commit_s": commit_s,
                        "shards_per_s": len(shards) / statistics.median(commit_s),
                        "plan_resume_s_median": statistics.median(plan_s), "plan_resume_s": plan_s,
                        "committed_found": found})
        print(f"  {store_name:6s} {how:28s} {results[-1]['shards_per_s']:8.1f} shards/s  "
              f"plan {results[-1]['plan_resume_s_median']:.3f} s", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=16, help="rows per shard")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "storage.json"))
    args = ap.parse_args()
    shards = plan_shards([InputFile("in.jsonl", "in.jsonl", 1, "1", args.shards * args.rows)], args.rows)
    table = shard_table(args.rows)
    results = []
    with tempfile.TemporaryDirectory(prefix="fleetllm-storage-") as tmp:
        results += measure("local", tmp, shards, table, args.repeats,
                           ["commit objects", "manifest append (previous)", "direct data write"])
    from fleetllm.testing.s3_server import S3Server

    with S3Server() as s3:
        s3.apply_env()
        s3.make_bucket("bench")
        results += measure("s3", "s3://bench/out", shards, table, args.repeats, ["commit objects"])

    print(f"\n{'store':6s} {'write path':28s} {'shards':>6s} {'commit s':>9s} {'shards/s':>9s} {'plan resume s':>14s}")
    for r in results:
        print(f"{r['store']:6s} {r['write_path']:28s} {r['shards']:6d} {r['commit_s_median']:9.2f} "
              f"{r['shards_per_s']:9.1f} {r['plan_resume_s_median']:14.3f}")
    print("medians of", args.repeats, "repeats; plan resume: OutputFolder.pending with every shard committed")
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "s3_server": "moto server mode on 127.0.0.1", "repeats": args.repeats}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
