"""Ray Serve LLM's field names and shapes on fleetllm's LLMConfig and build_openai_app (docs/ray-compat.md).

`llm_engine` is fleetllm's `engine` ("vLLM" -> vllm); `deployment_config.request_router_config` naming Ray's
PrefixCacheAffinityRouter is `routing: prefix_affinity`; `placement_group_config` and `log_engine_metrics` are
accepted and logged (fleetllm reserves GPUs by count, `ray_actor_options.num_gpus`, and always serves vLLM's
metrics); `accelerator_type` and `runtime_env` are LLMConfig fields (to the replicas' actor options);
`LLMServingArgs` is the builder's argument; its `router_cls` naming PrefixCacheAffinityRouter is
`routing: prefix_affinity` for every model, tuned by `router_config` (the router's keyword arguments).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("fleetllm.serve")

LOGGED = {  # accepted and not used: why
    "placement_group_config": "fleetllm reserves GPUs by count (deployment_config.ray_actor_options.num_gpus)",
    "log_engine_metrics": "vLLM's metrics are always on /metrics",
}
PREFIX_ROUTER = "PrefixCacheAffinityRouter"
ROUTER_KWARGS = {"imbalanced_threshold", "match_rate_threshold", "do_eviction", "eviction_threshold_chars",
                 "eviction_target_chars", "eviction_interval_secs"}  # PrefixCacheAffinityRouter's


class LLMServingArgs(BaseModel):
    """Ray Serve LLM's argument of build_openai_app: the configs (LLMConfig, dicts or YAML paths not read)."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)
    llm_configs: list[Any]


def serving_args(value: Any) -> dict[str, Any]:
    """build_openai_app's argument as a dict (Ray's LLMServingArgs or a dict)."""
    return value.model_dump() if isinstance(value, BaseModel) else dict(value)


def _routing(cls: Any, where: str) -> str | None:
    """The routing a Ray router class (a class or its import path) asks for: prefix_affinity, None (the
    default, power of two); another router is refused, named."""
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    if name.rsplit(":", 1)[-1].rsplit(".", 1)[-1] == PREFIX_ROUTER:
        return "prefix_affinity"
    if name and "PowerOfTwo" not in name:
        raise ValueError(f"{where}: router {name!r} is not one fleetllm runs; use {PREFIX_ROUTER} "
                         "(routing: prefix_affinity) or leave it out (power of two)")
    return None


def _router(deployment: dict[str, Any], data: dict[str, Any]) -> None:
    router = deployment.pop("request_router_config", None)
    if router is None:
        return
    cls = router.get("request_router_class", "") if isinstance(router, dict) else getattr(
        router, "request_router_class", "")
    if _routing(cls, "deployment_config.request_router_config") == "prefix_affinity":
        data.setdefault("routing", "prefix_affinity")


def builder_router(builder_config: dict[str, Any]) -> dict[str, Any] | None:
    """Pop build_openai_app's `router_cls` / `router_config` (Ray's LLMServingArgs): the prefix router's keyword
    arguments when `router_cls` names PrefixCacheAffinityRouter, None for the default router. Another router,
    `router_config` without it or a keyword the router does not take is refused, named."""
    cls, kwargs = builder_config.pop("router_cls", None), dict(builder_config.pop("router_config", None) or {})
    routing = _routing(cls, "build_openai_app router_cls") if cls is not None else None
    if routing is None:
        if kwargs:
            raise ValueError(f"build_openai_app router_config {sorted(kwargs)}: give router_cls={PREFIX_ROUTER} "
                             "with it (the default router takes no router_config)")
        return None
    unknown = sorted(set(kwargs) - ROUTER_KWARGS)
    if unknown:
        raise ValueError(f"build_openai_app router_config keys {unknown} are not {PREFIX_ROUTER}'s; use "
                         f"{sorted(ROUTER_KWARGS)}")
    return kwargs


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
    for key, why in LOGGED.items():
        if data.get(key) is not None:
            log.warning("LLMConfig %s=%r: accepted and not used; %s", key, data[key], why)
        data.pop(key, None)
    if "deployment_config" in data:
        deployment = dict(data["deployment_config"] or {})
        _router(deployment, data)
        data["deployment_config"] = deployment
    return data
