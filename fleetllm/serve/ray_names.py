"""Ray Serve LLM's field names and shapes on fleetllm's LLMConfig and build_openai_app (docs/ray-compat.md).

`llm_engine` is fleetllm's `engine` ("vLLM" -> vllm); `runtime_env` goes to the replicas' actor options;
`deployment_config.request_router_config` naming Ray's PrefixCacheAffinityRouter is `routing:
prefix_affinity`; `accelerator_type` and `placement_group_config` are accepted and logged (fleetllm
reserves GPUs by count, `ray_actor_options.num_gpus`); `LLMServingArgs` is the builder's argument.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("fleetllm.serve")

LOGGED = ("accelerator_type", "placement_group_config", "log_engine_metrics")
PREFIX_ROUTER = "PrefixCacheAffinityRouter"


class LLMServingArgs(BaseModel):
    """Ray Serve LLM's argument of build_openai_app: the configs (LLMConfig, dicts or YAML paths not read)."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)
    llm_configs: list[Any]


def serving_args(value: Any) -> dict[str, Any]:
    """build_openai_app's argument as a dict (Ray's LLMServingArgs or a dict)."""
    return value.model_dump() if isinstance(value, BaseModel) else dict(value)


def _router(deployment: dict[str, Any], data: dict[str, Any]) -> None:
    router = deployment.pop("request_router_config", None)
    if router is None:
        return
    cls = router.get("request_router_class", "") if isinstance(router, dict) else getattr(
        router, "request_router_class", "")
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    if name.rsplit(":", 1)[-1].rsplit(".", 1)[-1] == PREFIX_ROUTER:
        data.setdefault("routing", "prefix_affinity")
    elif name and "PowerOfTwo" not in name:
        raise ValueError(f"deployment_config.request_router_config: router {name!r} is not one fleetllm runs; use "
                         f"{PREFIX_ROUTER} (routing: prefix_affinity) or leave it out (power of two)")


def normalize(data: Any) -> Any:
    """An LLMConfig's input with Ray Serve LLM's names turned into fleetllm's (a before-validator)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "llm_engine" in data:
        engine = str(data.pop("llm_engine")).lower()
        if "engine" in data and data["engine"] != engine:
            raise ValueError(f"give llm_engine (Ray's name) or engine, not both ({engine!r} vs {data['engine']!r})")
        data["engine"] = engine
    for key in LOGGED:
        if data.get(key) is not None:
            log.warning("LLMConfig %s=%r: accepted; fleetllm reserves GPUs by count "
                        "(deployment_config.ray_actor_options.num_gpus)", key, data[key])
        data.pop(key, None)
    deployment = dict(data.get("deployment_config") or {})
    _router(deployment, data)
    env = data.pop("runtime_env", None)
    if env:
        deployment["ray_actor_options"] = {**deployment.get("ray_actor_options", {}), "runtime_env": env}
    if "deployment_config" in data or deployment:
        data["deployment_config"] = deployment
    return data
