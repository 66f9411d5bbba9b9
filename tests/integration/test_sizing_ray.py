"""Sizing and placement on a real local Ray cluster with 4 logical GPUs."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from fleetllm.errors import PlanError
from fleetllm.sizing import cluster_resources, plan_replicas


@pytest.fixture(scope="module")
def gpu_cluster():
    """A local Ray with num_gpus=4 (logical); restores a session cluster that was running before."""
    import ray

    was_running = ray.is_initialized()
    if was_running:
        ray.shutdown()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=5, num_gpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()
    if was_running:  # the session fixture `ray_local` (tests/conftest.py) expects its cluster back
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)


def live_groups(ray) -> dict:
    return {k: v for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"}


def plan(tp: int, replicas="auto"):
    return plan_replicas("vllm", {"tensor_parallel_size": tp}, replicas, 1.0, None, cluster_resources())


def test_replica_counts_follow_the_cluster(gpu_cluster):
    assert cluster_resources()["GPU"] == 4.0
    assert [plan(tp).replicas for tp in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(PlanError, match="needs 8 GPUs per replica; the cluster has 4"):
        plan(8)
    assert live_groups(gpu_cluster) == {}  # refused before reserving anything


def test_replicas_whose_workers_take_every_gpu_in_placement_groups_still_get_rows(gpu_cluster):
    """The arrangement a TP=2 plan runs with on Ray Data: plain replica actors (CPUs only), each making
    the {GPU: 1} x 2 placement group its vLLM workers run in, as vLLM's Ray executor does, until every
    GPU of the cluster is held. All rows pass, on both replicas, each on two distinct GPUs."""
    ray = gpu_cluster
    p = plan(2)
    assert p.replicas == 2 and p.bundles == ({"GPU": 1.0}, {"GPU": 1.0})

    @ray.remote(num_cpus=0, num_gpus=1)
    def worker_gpu() -> list:
        return ray.get_gpu_ids()

    class Replica:
        def __init__(self, bundles):
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.pg = placement_group(list(bundles), strategy=p.strategy)
            ray.get(self.pg.ready(), timeout=60)
            on_pg = PlacementGroupSchedulingStrategy(placement_group=self.pg)
            self.gpus = sorted(g for ids in ray.get([worker_gpu.options(scheduling_strategy=on_pg).remote()
                                                     for _ in bundles]) for g in ids)

        def __call__(self, batch):
            time.sleep(0.1)  # long enough for both replicas to be up while rows flow
            batch["gpus"] = [",".join(map(str, self.gpus))] * len(batch["id"])
            batch["free_gpus"] = [ray.available_resources().get("GPU", 0.0)] * len(batch["id"])
            return batch

    ds = ray.data.from_items([{"id": i} for i in range(40)], override_num_blocks=20)
    ds = ds.map(lambda r: r, num_cpus=0.25).map_batches(
        Replica, fn_constructor_kwargs={"bundles": p.bundles}, batch_size=2, num_cpus=p.cpus_per_replica,
        compute=ray.data.ActorPoolStrategy(size=p.replicas))
    ctx = ray.data.DataContext.get_current()
    before, ctx.wait_for_min_actors_s = ctx.wait_for_min_actors_s, 120  # both replicas up before rows flow
    try:
        rows = ds.take_all()
    finally:
        ctx.wait_for_min_actors_s = before
    assert sorted(r["id"] for r in rows) == list(range(40))  # no stall: every row passed
    assert all(len(set(r["gpus"].split(","))) == 2 for r in rows)  # each replica's workers on 2 distinct GPUs
    assert min(r["free_gpus"] for r in rows) == 0  # rows kept flowing while the groups held every GPU


def _job(tmp_path, model: str, **compute):
    from fleetllm.spec import JobSpec

    src = tmp_path / "in.jsonl"
    src.write_text('{"q": "hi"}\n' * 10)
    return JobSpec.model_validate({
        "model": {"source": model, "engine": "vllm", "engine_kwargs": {"tensor_parallel_size": compute.pop("tp", 1)}},
        "input": {"path": str(src)}, "prompt": {"template": "{q}"},
        "output": {"path": str(tmp_path / "out")}, "compute": compute})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_batch_runner_plans_replicas_and_placement_from_the_cluster(gpu_cluster, embedded_model, tmp_path):
    from fleetllm.batch.planning.job_plan import engine_pool, plan_job

    plan = plan_job(_job(tmp_path, embedded_model, replicas="auto", tp=2), resources=cluster_resources())
    assert (plan.replicas, plan.resources) == (2, {"CPU": 1.0, "GPU": 2})
    assert plan.engine_kwargs["distributed_executor_backend"] == "ray"  # vLLM's workers go on Ray
    kwargs = engine_pool(plan).map_batches_kwargs()
    assert kwargs["compute"].max_concurrent_calls_per_actor >= 2  # vLLM keeps several calls in flight
    assert "num_gpus" not in kwargs and kwargs["num_cpus"] == 1.0  # the GPUs are held by vLLM's workers
    with pytest.raises(PlanError, match="replicas: 3 needs 6 GPUs"):
        plan_job(_job(tmp_path, embedded_model, replicas=3, tp=2), resources=cluster_resources())


def test_wait_for_more_gpus_than_the_cluster_has_fails_with_what_it_saw(gpu_cluster, embedded_model, tmp_path):
    from rich.console import Console

    from fleetllm.batch.execution.stream import wait_for_cluster
    from fleetllm.ray_resources import ResourceTimeout

    spec = _job(tmp_path, embedded_model, wait_for={"gpus": 4}, wait_timeout_s=5)
    wait_for_cluster(spec, Console(quiet=True))  # there: returns at once
    spec = _job(tmp_path, embedded_model, wait_for={"gpus": 8}, wait_timeout_s=2)
    with pytest.raises(ResourceTimeout, match="4 GPU"):
        wait_for_cluster(spec, Console(quiet=True))


def test_wait_for_asks_the_autoscaler_for_the_resources_and_the_job_withdraws_it(gpu_cluster, embedded_model,
                                                                                 tmp_path):
    """ray.autoscaler.sdk.request_resources: the standing request an autoscaler reads (here the cluster's
    key-value store, where Ray's autoscaler looks), withdrawn at the job's end."""
    import json

    from rich.console import Console
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    from fleetllm.batch.execution.stream import release_cluster_request, wait_for_cluster

    spec = _job(tmp_path, embedded_model, wait_for={"gpus": 2, "cpus": 3}, wait_timeout_s=5)
    wait_for_cluster(spec, Console(quiet=True))
    asked = json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL))
    assert sorted(map(json.dumps, asked)) == sorted(map(json.dumps, [{"CPU": 1}] * 3 + [{"GPU": 1.0}] * 2))
    release_cluster_request(spec)
    assert json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == []
