"""compute.deadline on a CPU Ray cluster of logical resources (issue 37, must-show 3).

1. `calibrate` the job (one replica, 1 torch thread, the tiny random-weight model, transformers);
2. a local Ray cluster of --cpus logical CPUs (in this process);
3. a first, smaller job on Ray (no deadline): its run adds a start on Ray to the profile;
4. a deadline no replica count the cluster allows can meet: refused at plan time, with the figures;
5. a deadline that needs more than one replica: the plan picks the fewest that meet it, the job runs,
   and the actual wall time is set beside the deadline.

    flock /tmp/fleetllm-heavy.lock python benchmarks/estimate_deadline.py [--rows 320] [--cpus 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=320)
    p.add_argument("--cpus", type=int, default=4, help="logical CPUs of the Ray cluster (1 per replica)")
    p.add_argument("--first-rows", type=int, default=64, help="rows of the first job on Ray (it measures Ray's start)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleetllm-deadline-"))
    os.environ["FLEETLLM_HOME"] = str(work / "home")
    from fleetllm.batch.reports.estimate_job import job_shape, profile_key, wall_by_replicas
    from fleetllm.batch.reports.estimate_probe import calibrate
    from fleetllm.batch.planning.job_plan import plan_job
    from fleetllm.batch.runner import run_job
    from fleetllm.errors import PlanError
    from fleetllm.estimate import store
    from fleetllm.sizing import cluster_resources
    from fleetllm.spec import JobSpec
    from fleetllm.testing.tiny_model import make_tiny_model

    model = str(make_tiny_model(work / "tiny"))
    rows = data = work / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "text": f"item {i}: " + "describe the river stone " * 6}) + "\n"
                            for i in range(a.rows)))

    first_rows = work / "first.jsonl"
    first_rows.write_text("".join(rows.read_text().splitlines(keepends=True)[:a.first_rows]))

    def spec(deadline: str | None, out: str, rows: int | None = None) -> JobSpec:
        return JobSpec.model_validate({
            "name": "deadline",
            "model": {"source": model, "engine": "transformers", "engine_kwargs": {"num_threads": 1}},
            "input": {"path": str(first_rows if rows else data), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": 48, "temperature": 0.0, "extra": {"min_tokens": 48}},
            "output": {"path": str(work / out), "format": "jsonl", "shard_rows": 16},
            "compute": {"replicas": "auto", "cpus_per_replica": 1, "batch_size": 8,
                        **({"deadline": deadline} if deadline else {})}})

    probe = calibrate(spec(None, "probe-out"), 24)
    print(f"profile: {probe['profile']} (fit error {probe['fit']['rel_error']:.1%})")
    import ray

    ray.init(address="local", num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)
    result: dict = {"cpus": a.cpus, "rows": a.rows}
    # a first, smaller job on Ray: its run adds what a start on Ray costs (the replicas' actors and imports, which
    # the in-process probe never sees) to the profile; the estimates below take it
    first = run_job(spec(None, "first-on-ray", rows=a.first_rows), max_error_rate=0.0)
    prof = store.load_profile(profile_key(plan_job(spec(None, "dry"), resources=cluster_resources())))
    result["first_on_ray"] = {"rows": a.first_rows, "replicas": first["replicas"], "wall_s": first["wall_time_s"],
                              "startup_ray_s": prof.startup_ray_s, "overhead_ray_s": prof.overhead_ray_s,
                              "startup_in_process_s": prof.startup_s}
    print(f"first job on Ray ({a.first_rows} rows, {first['replicas']} replicas): {first['wall_time_s']} s; the "
          f"profile's start on Ray {prof.startup_ray_s} s (in process: {prof.startup_s} s)")
    one = run_job(spec(None, "dry"), dry_run=True, as_json=True)  # sized for the Ray cluster
    plan = plan_job(spec(None, "dry"), resources=cluster_resources())
    wall = wall_by_replicas(plan, job_shape(plan), store.load_profile(profile_key(plan)), in_process=False)
    by_k = {k: wall(k) for k in range(1, a.cpus + 1)}  # what the plan's deadline reads
    result["estimate_by_replicas"] = by_k
    print("estimated wall by replicas (mid, high):", by_k)
    tight = max(1, int(by_k[a.cpus][1] * 0.5))
    try:
        run_job(spec(f"{tight}s", "refused"), as_json=True)
        result["refused"] = None
    except PlanError as exc:
        result["refused"] = {"deadline": f"{tight}s", "error": str(exc)}
        print(f"deadline {tight}s: refused at plan time:\n  {exc}")
    target = 2  # a deadline between the estimates of 1 and 2 replicas: the plan must pick 2
    deadline = int(by_k[target][1] + 0.5 * (by_k[target - 1][1] - by_k[target][1]))  # between k-1 and k
    t0 = time.time()
    report = run_job(spec(f"{deadline}s", "met"), max_error_rate=0.0)
    wall = time.time() - t0
    result["met"] = {"deadline_s": deadline, "replicas": report["replicas"], "wall_s": round(wall, 1),
                     "run_json_wall_s": report["wall_time_s"], "met": wall <= deadline,
                     "estimate_at_start": report["estimate"]["at_start"]["wall_s"]}
    print(f"deadline {deadline}s: plan chose {report['replicas']} of {a.cpus} replicas; estimated "
          f"{report['estimate']['at_start']['wall_s']}s, ran {wall:.1f}s -> {'met' if wall <= deadline else 'MISSED'}")
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"estimate_deadline_{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "dry_run_all_replicas": one.get("estimate")}, indent=1, default=str))
    print(json.dumps(result, default=str))
    ray.shutdown()


if __name__ == "__main__":
    main()
