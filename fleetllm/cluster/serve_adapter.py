"""Adapter from a serve spec (YAML mapping) to the few fields the Kubernetes manifests need.

fleetllm.serve.spec.ServeSpec is written on another branch; until it is merged this reads the plain
mapping of the documented YAML shape. After the merge, `serve_view` can validate through ServeSpec and
read the same attributes; nothing else in fleetllm.cluster reads serve specs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fleetllm.errors import SpecError


def parallel_gpus(engine_kwargs: dict[str, Any]) -> int:
    """GPUs one engine replica spans: tensor_parallel_size x pipeline_parallel_size."""
    tp = int(engine_kwargs.get("tensor_parallel_size", 1) or 1)
    pp = int(engine_kwargs.get("pipeline_parallel_size", 1) or 1)
    if tp < 1 or pp < 1:
        raise SpecError(f"tensor_parallel_size {tp} x pipeline_parallel_size {pp}: both must be >= 1")
    return tp * pp



@dataclass(frozen=True)
class ServedModel:
    """The fields of one served model the manifests need."""

    model_id: str
    engine: str
    gpus_per_replica: int
    cpus_per_replica: float
    replicas: int
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class ServeView:
    """What the manifests read from a serve spec."""

    name: str
    models: list[ServedModel]
    raw: dict[str, Any]


def serve_view(data: dict[str, Any]) -> ServeView:
    """Adapter from a serve spec to what the manifests need.

    Reads the plain YAML mapping (the shape of fleetllm.serve.spec.ServeSpec: name, models[*].model_id,
    engine, engine_kwargs, replicas, autoscaling{min_replicas,max_replicas}, cpus_per_replica,
    gpus_per_replica). After ServeSpec is merged, swap the body for
    `spec = ServeSpec.model_validate(data)` and read the same attributes.
    """
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise SpecError("serve spec: `models` must be a non-empty list of models to serve")
    out = []
    for i, model in enumerate(models):
        if not isinstance(model, dict) or not model.get("model_id"):
            raise SpecError(f"serve spec: models[{i}] needs a model_id")
        engine = model.get("engine", "auto")
        gpus = math.ceil(float(model.get("gpus_per_replica") or 0))
        if gpus == 0 and engine in ("vllm", "auto") and parallel_gpus(model.get("engine_kwargs") or {}) > 1:
            gpus = parallel_gpus(model["engine_kwargs"])
        replicas = int(model.get("replicas") or 1)
        auto = model.get("autoscaling") or {}
        low = int(auto.get("min_replicas", replicas)) if auto else replicas
        high = int(auto.get("max_replicas", replicas)) if auto else replicas
        out.append(
            ServedModel(
                model_id=str(model["model_id"]),
                engine=str(engine),
                gpus_per_replica=gpus,
                cpus_per_replica=float(model.get("cpus_per_replica") or 1),
                replicas=max(replicas, low),
                min_replicas=low,
                max_replicas=max(high, replicas),
            )
        )
    return ServeView(name=str(data.get("name") or "fleetllm"), models=out, raw=data)
