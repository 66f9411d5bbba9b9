"""What typing the input columns costs `plan_job`: the first plan of a 1M-row JSONL (every row read
to type its columns) and the resumes after it (the plan recorded in _fleetllm/columns.json is read).

Rows as in benchmarks/resume_planning.py (~110 bytes: id, question, topic), shards of 1,000.

    .venv/bin/python benchmarks/column_planning.py [--rows 1000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from fleetllm.batch.planning.job_prepare import plan_and_prepare
    from fleetllm.spec import JobSpec

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "column_planning.json"))
    a = p.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="fleetllm-columns-"))
    (work / "model").mkdir(parents=True, exist_ok=True)
    (work / "model" / "config.json").write_text('{"model_type": "llama"}')
    src = work / f"rows-{a.rows}.jsonl"
    if not src.exists():
        with src.open("w") as fh:
            for i in range(a.rows):
                fh.write(json.dumps({"id": f"q{i:08d}", "question": f"In one sentence, what is item {i} of the "
                                     "catalogue used for?", "topic": ("tools", "food", "books")[i % 3]}) + "\n")
    shutil.rmtree(work / "out", ignore_errors=True)
    spec = JobSpec.model_validate({"name": "b", "model": {"source": str(work / "model"), "engine": "transformers"},
                                   "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{question}"},
                                   "output": {"path": str(work / "out"), "shard_rows": 1000}})
    t0 = time.perf_counter()
    plan_and_prepare(spec)
    first = time.perf_counter() - t0
    again = []
    for _ in range(3):
        t0 = time.perf_counter()
        plan_and_prepare(spec)
        again.append(time.perf_counter() - t0)
    result = {"rows": a.rows, "first_plan_s": round(first, 3), "resume_plan_median_s": round(sorted(again)[1], 3),
              "load_average": os.getloadavg()[0], "cpus": os.cpu_count()}
    print(f"{'rows':>10} {'first plan s':>13} {'resume plan s':>14} {'load avg':>9}")
    print(f"{a.rows:>10,} {result['first_plan_s']:>13.2f} {result['resume_plan_median_s']:>14.2f} "
          f"{result['load_average']:>9.1f}")
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
