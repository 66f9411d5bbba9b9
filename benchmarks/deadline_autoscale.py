"""compute.deadline growing a cluster with Ray's autoscaler (issue 37: "the job scales within the cluster's limits").

1. `calibrate` the job in process (the tiny random-weight model, transformers, one torch thread a replica);
2. a Ray cluster under Ray's fake multi-node autoscaler (ray.cluster_utils.AutoscalingCluster: its worker nodes
   are raylets started on this machine when the autoscaler decides): a head of --head-cpus logical CPUs and up
   to --workers nodes of --worker-cpus;
3. the autoscaler's node groups written to Ray's GCS where Ray's autoscaler reports them (the key
   `get_max_resources_from_cluster_config` reads; Ray 2.60's open-source autoscaler does not write it, so this
   script stands in for that one report, and only for it);
4. a first, small job on the head: its run adds a start on Ray to the profile;
5. a deadline the head alone cannot meet: the plan takes more replicas than fit now (`scale_up`), the run asks the
   autoscaler for them, the autoscaler starts nodes, and the job's replicas run on them. The wall time is set
   beside the deadline, with the nodes before and after.

    flock /tmp/fleetllm-heavy.lock python benchmarks/deadline_autoscale.py   # stops every Ray on the machine
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAKE = {"cluster_name": "fake_multinode", "max_workers": 8, "head_node_type": "ray.head.default", "auth": {},
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "upscaling_speed": 1.0, "idle_timeout_minutes": 0.2, "docker": {}, "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": []}


def fake_cluster(head_cpus: int, worker_cpus: int, workers: int):
    """Ray's AutoscalingCluster with the fake provider's config written here (the wheel lacks its example.yaml)."""
    from ray.cluster_utils import AutoscalingCluster

    class Fake(AutoscalingCluster):
        def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **kw):
            config = copy.deepcopy(FAKE)
            config["available_node_types"] = {**worker_node_types, "ray.head.default": {
                "resources": head_resources, "node_config": {}, "max_workers": 0}}
            return {**config, **kw}

    return Fake(head_resources={"CPU": head_cpus}, worker_node_types={"cpu-workers": {
        "resources": {"CPU": worker_cpus}, "node_config": {}, "min_workers": 0, "max_workers": workers}})


def report_node_groups(head_cpus: int, worker_cpus: int, workers: int) -> None:
    """The node groups as Ray's autoscaler reports them to the GCS (ClusterConfig, Ray's own key)."""
    from ray._raylet import GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, GCS_AUTOSCALER_STATE_NAMESPACE
    from ray.core.generated import autoscaler_pb2
    from ray.experimental.internal_kv import _internal_kv_put

    config = autoscaler_pb2.ClusterConfig()
    for name, cpus, count in (("ray.head.default", head_cpus, 1), ("cpu-workers", worker_cpus, workers)):
        group = config.node_group_configs.add(name=name, max_count=count)
        group.resources["CPU"] = cpus
    _internal_kv_put(GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, config.SerializeToString(),
                     namespace=GCS_AUTOSCALER_STATE_NAMESPACE)


def estimate_highs(job, most: int) -> dict[int, float]:
    """The upper end of the job's wall-time estimate with 1..most replicas on Ray (what the deadline reads)."""
    from fleetllm.batch.planning.job_plan import plan_job
    from fleetllm.batch.reports.estimate_job import job_shape, profile_key, wall_by_replicas
    from fleetllm.estimate import store

    plan = plan_job(job, resources={"CPU": most + 1.0})
    wall = wall_by_replicas(plan, job_shape(plan), store.load_profile(profile_key(plan)), in_process=False)
    return {k: wall(k)[1] for k in range(1, most + 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--head-cpus", type=int, default=2)
    p.add_argument("--worker-cpus", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleetllm-autoscale-"))
    os.environ["FLEETLLM_HOME"] = str(work / "home")
    from fleetllm.batch.reports.estimate_probe import calibrate
    from fleetllm.batch.runner import run_job
    from fleetllm.ray_resources import autoscaler_limits
    from fleetllm.spec import JobSpec
    from fleetllm.testing.tiny_model import make_tiny_model

    model = str(make_tiny_model(work / "tiny"))
    data = work / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"item {i}: " + "describe the river stone " * 6}) + "\n"
                            for i in range(a.rows)))
    first = work / "first.jsonl"
    first.write_text("".join(data.read_text().splitlines(keepends=True)[:32]))

    def spec(deadline: str | None, out: str, rows: Path = data) -> JobSpec:
        return JobSpec.model_validate({
            "name": "autoscale", "model": {"source": model, "engine": "transformers",
                                           "engine_kwargs": {"num_threads": 1}},
            "input": {"path": str(rows), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": 48, "temperature": 0.0, "extra": {"min_tokens": 48}},
            "output": {"path": str(work / out), "format": "jsonl", "shard_rows": 16},
            "compute": {"replicas": "auto", "cpus_per_replica": 1, "batch_size": 8,
                        **({"deadline": deadline} if deadline else {})}})

    probe = calibrate(spec(None, "probe-out"), 24)
    print(f"profile: {probe['profile']} (fit error {probe['fit']['rel_error']:.1%})")
    import ray

    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # Ray's `ray` CLI
    cluster = fake_cluster(a.head_cpus, a.worker_cpus, a.workers)
    cluster.start()
    result: dict = {"head_cpus": a.head_cpus, "worker_cpus": a.worker_cpus, "workers_at_most": a.workers}
    try:
        ray.init("auto", log_to_driver=False)
        report_node_groups(a.head_cpus, a.worker_cpus, a.workers)
        result["limits"] = autoscaler_limits()
        done = run_job(spec(None, "first-on-ray", first), max_error_rate=0.0)
        result["first_on_ray"] = {"replicas": done["replicas"], "wall_s": done["wall_time_s"]}
        print(f"first job on Ray: {done['replicas']} replica(s), {done['wall_time_s']} s; limits {result['limits']}")
        result["nodes_before"] = sum(1 for n in ray.nodes() if n.get("Alive"))
        highs = estimate_highs(spec(None, "dry"), 3)
        result["estimate_high_by_replicas"] = highs
        deadline = int(highs[2] + 0.5 * (highs[1] - highs[2]))  # between 1 and 2 replicas: the plan must pick 2
        t0 = time.time()
        report = run_job(spec(f"{deadline}s", "met"), max_error_rate=0.0)
        wall = time.time() - t0
        result["met"] = {"deadline_s": deadline, "replicas": report["replicas"],
                         "wall_s": round(wall, 1), "met": wall <= deadline,
                         "estimate_at_start": report["estimate"]["at_start"]["wall_s"],
                         "nodes_after": sum(1 for n in ray.nodes() if n.get("Alive"))}
        print(f"deadline {deadline}s (estimates' upper ends by replicas {highs}): {report['replicas']} replicas, "
              f"{result['nodes_before']} -> {result['met']['nodes_after']} nodes; ran {wall:.1f}s -> "
              f"{'met' if wall <= deadline else 'MISSED'}")
    finally:
        ray.shutdown()
        cluster.shutdown()
    out = Path(a.out or ROOT / "benchmarks" / "results" / "deadline_autoscale_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
