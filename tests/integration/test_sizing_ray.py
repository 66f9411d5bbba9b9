"""Sizing and placement on a real local Ray cluster with 4 logical GPUs."""

from __future__ import annotations

import importlib.util
import os

import pytest

from fleetllm.errors import PlanError
from fleetllm.sizing import (
    cluster_resources,
    plan_replicas,
    ray_remote_args,
    ray_remote_args_fn,
    release_placement_groups,
    reserve_placement_groups,
)


@pytest.fixture(scope="module")
def gpu_cluster():
    """A local Ray with num_gpus=4 (logical); restores a session cluster that was running before."""
    import ray

    was_running = ray.is_initialized()
    if was_running:
        ray.shutdown()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False,
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


def test_tp2_reserves_one_packed_group_per_replica_and_places_workers_on_its_gpus(gpu_cluster):
    ray = gpu_cluster
    p = plan(2)
    groups = reserve_placement_groups(p, timeout_s=60)
    try:
        table = live_groups(ray)
        assert len(groups) == 2 and set(table) == {pg.id.hex() for pg in groups}
        for entry in table.values():
            assert entry["state"] == "CREATED" and entry["strategy"] == "PACK"
            assert list(entry["bundles"].values()) == [{"CPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]
        assert ray.available_resources().get("GPU", 0) == 0

        @ray.remote(num_cpus=0, num_gpus=1)
        def worker_gpu() -> list:
            return ray.get_gpu_ids()

        @ray.remote
        class Replica:  # stands in for the replica actor; vLLM's Ray workers are its child tasks
            def where(self):
                ctx = ray.get_runtime_context()
                return ctx.get_placement_group_id(), ray.get([worker_gpu.remote() for _ in range(2)])

        actor = Replica.options(**ray_remote_args(p, groups[0])).remote()
        pg_id, gpu_ids = ray.get(actor.where.remote(), timeout=60)
        assert pg_id == groups[0].id.hex()
        assert len({g for ids in gpu_ids for g in ids}) == 2  # two distinct GPUs of the group's bundles
        ray.kill(actor)

        with pytest.raises(PlanError, match="could only place 0 of 1 placement groups"):
            reserve_placement_groups(p, timeout_s=2, count=1)
        assert len(live_groups(ray)) == 2  # the failed reservation was cleaned up
    finally:
        release_placement_groups(groups)
    assert live_groups(ray) == {}


def test_remote_args_fn_uses_reserved_groups_then_reserves_more(gpu_cluster):
    ray = gpu_cluster
    p = plan(4)
    fn = ray_remote_args_fn(p, reserve_placement_groups(p, timeout_s=60), timeout_s=5)
    first = fn()["scheduling_strategy"].placement_group
    assert len(live_groups(ray)) == 1
    release_placement_groups([first])
    second = fn()["scheduling_strategy"].placement_group  # the pool is empty: a new one is reserved
    assert second.id != first.id and len(live_groups(ray)) == 1
    release_placement_groups([second])
    assert ray_remote_args(plan(1)) == {"num_cpus": 1.0, "num_gpus": 1}


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
    from fleetllm.batch.runner import engine_pool, plan_job

    plan = plan_job(_job(tmp_path, embedded_model, replicas="auto", tp=2), resources=cluster_resources())
    assert (plan.replicas, plan.resources) == (2, {"CPU": 1.0, "GPU": 2})
    assert plan.engine_kwargs["distributed_executor_backend"] == "ray"  # workers go on the group's GPUs
    groups = reserve_placement_groups(plan.replica_plan, timeout_s=60)
    try:
        kwargs = engine_pool(plan, groups).map_batches_kwargs()
        assert kwargs["compute"].max_concurrent_calls_per_actor >= 2  # vLLM keeps several calls in flight
        assert "num_gpus" not in kwargs  # the replica actor sits in bundle 0; vLLM's workers take the GPUs
        placed = {kwargs["ray_remote_args_fn"]()["scheduling_strategy"].placement_group.id for _ in range(2)}
        assert placed == {g.id for g in groups}
    finally:
        release_placement_groups(groups)
    with pytest.raises(PlanError, match="replicas: 3 needs 6 GPUs"):
        plan_job(_job(tmp_path, embedded_model, replicas=3, tp=2), resources=cluster_resources())


def test_wait_for_more_gpus_than_the_cluster_has_fails_with_what_it_saw(gpu_cluster, embedded_model, tmp_path):
    from rich.console import Console

    from fleetllm.batch.runner import wait_for_cluster
    from fleetllm.cluster.wait import ResourceTimeout

    spec = _job(tmp_path, embedded_model, wait_for={"gpus": 4}, wait_timeout_s=5)
    wait_for_cluster(spec, Console(quiet=True))  # there: returns at once
    spec = _job(tmp_path, embedded_model, wait_for={"gpus": 8}, wait_timeout_s=2)
    with pytest.raises(ResourceTimeout, match="4 GPU"):
        wait_for_cluster(spec, Console(quiet=True))
