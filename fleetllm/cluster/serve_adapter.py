"""The serve spec as the Kubernetes manifests see it, and the Ray Serve builder the RayService runs.

A serve YAML is validated by fleetllm.serve.spec.ServeSpec, the same model `fleetllm serve` loads, so
`fleetllm k8s render serve.yaml` refuses exactly what `fleetllm serve serve.yaml` refuses. `ServeView`
adds what only the manifests need (whole GPUs per pod, the worker group's replica bounds), and
`app_from_spec` is the Ray Serve application builder named in the RayService's serveConfigV2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fleetllm.errors import SpecError
from fleetllm.serve.spec import ServeModelSpec, ServeSpec
from fleetllm.sizing import replica_gpus
from fleetllm.spec import parse_spec


@dataclass(frozen=True)
class ServedModel:
    """One served model, sized for pods."""

    spec: ServeModelSpec
    gpus_per_replica: int  # whole GPUs for the pod: gpus_per_replica rounded up, or tp x pp on vllm/auto
    replicas: int  # the worker group's initial replicas
    min_replicas: int
    max_replicas: int

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def cpus_per_replica(self) -> float:
        return self.spec.cpus_per_replica


@dataclass(frozen=True)
class ServeView:
    """A validated ServeSpec plus the per-model pod sizes."""

    spec: ServeSpec
    models: list[ServedModel]

    @property
    def name(self) -> str:
        return self.spec.name

    def spec_dict(self, model_id: str | None = None) -> dict[str, Any]:
        """The spec as plain data (JSON types), or for `model_id` a spec serving that model alone with
        one fixed replica (a fleet replica is one whole Ray cluster)."""
        data = self.spec.model_dump(mode="json")
        if model_id is not None:
            data["models"] = [
                {**m, "replicas": 1, "autoscaling": None} for m in data["models"] if m["model_id"] == model_id
            ]
        return data


def _served(model: ServeModelSpec) -> ServedModel:
    # gpus_per_replica 0 (the default) with tensor parallelism: vLLM places its own workers, one GPU each.
    gpus = math.ceil(replica_gpus(model.engine, model.engine_kwargs, model.gpus_per_replica or None,
                                  gpus_present=False))
    if model.autoscaling is None:
        low = high = initial = model.replicas
    else:
        low, high = model.autoscaling.min_replicas, model.autoscaling.max_replicas
        initial = min(max(model.replicas, low), high)
    return ServedModel(model, gpus, initial, low, high)


def serve_view(data: dict[str, Any] | ServeSpec, source: str = "serve spec") -> ServeView:
    """Validate `data` as a ServeSpec (the model `fleetllm serve` runs) and size its models for pods."""
    spec = data if isinstance(data, ServeSpec) else parse_spec(ServeSpec, data, source)
    if spec.http == "replica":
        raise SpecError(f"{source}: http: replica needs a Ray started by `fleetllm serve`; a RayService's Ray is "
                        "KubeRay's and its Serve answers through the HTTP proxy: use http: auto or proxy")
    return ServeView(spec, [_served(m) for m in spec.models])


def app_from_spec(args: dict[str, Any]):
    """Ray Serve application builder: `args = {"spec": <a serve spec>}` -> the OpenAI app.

    The RayService's serveConfigV2 names it (`import_path: fleetllm.cluster.serve_adapter:app_from_spec`),
    so the cluster builds the same application `fleetllm serve` would from that spec.
    """
    from fleetllm.serve.app import build_openai_app

    unknown = sorted(set(args) - {"spec"})
    if unknown or "spec" not in args:
        raise SpecError(f"app_from_spec takes args {{spec: <serve spec>}}; got keys {sorted(args)}")
    spec = parse_spec(ServeSpec, args["spec"], "serveConfigV2 args.spec")
    return build_openai_app({"llm_configs": spec.llm_configs(), "api_key": spec.effective_api_key(),
                             "ingress": spec.ingress})
