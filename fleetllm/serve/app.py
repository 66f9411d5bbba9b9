"""The Ray Serve application. One model with the default routing: the direct path (direct.py), its
deployment is the ingress. Otherwise (or `ingress: separate`): one `LLMServer` deployment per model, one
`OpenAIIngress` in front:

    client --HTTP--> Serve proxy --> OpenAIIngress (FastAPI, api.py) --DeploymentHandle, streaming--> LLMServer
                                                                                   (one deployment per model:
                                                                                    replicas, autoscaling)
The ingress routes by `model`, speaks the OpenAI protocol and maps Ray Serve's backpressure
(`max_queued_requests` exceeded: BackPressureError) to 429 + Retry-After. Replicas, autoscaling,
queueing and request routing are Ray Serve's.
"""

from __future__ import annotations

import logging
from typing import Any, get_args

from fleetllm.serve.deployments import RETRY_AFTER_S, deployment_name
from fleetllm.serve.spec import LLMConfig

log = logging.getLogger("fleetllm.serve")


def _deployments():
    """The deployment classes (imports Ray Serve, so only when an app is built): Ray Serve LLM's LLMServer and
    OpenAiIngress (fleetllm.serve.deployments) under the deployment names fleetllm's apps use."""
    from ray import serve

    from fleetllm.serve.deployments import LLMServer, OpenAiIngress, make_fastapi_ingress

    server = serve.deployment(name="LLMServer", health_check_period_s=5, graceful_shutdown_timeout_s=5)(LLMServer)
    ingress = serve.deployment(name="OpenAIIngress", ray_actor_options={"num_cpus": 0})(
        make_fastapi_ingress(OpenAiIngress))
    return server, ingress


def build_openai_app(builder_config: dict[str, Any]):
    """Build the Ray Serve application serving `llm_configs` behind an OpenAI-compatible API.

    Args:
        builder_config: {"llm_configs": [LLMConfig | dict, ...], "api_key": str | None,
            "ingress": "auto" | "direct" | "separate" (default auto: direct for one model with the default
            routing, its replicas answering HTTP themselves; else an OpenAIIngress deployment in front),
            "batch_store": a folder or object-store URL: serve /v1/files and /v1/batches over it (the batches
            run where a fleetllm.batch.api_service.BatchService runs, as `fleetllm serve` starts one),
            "listen": {"host", "port"}: on the direct path with one replica, that replica answers HTTP there itself
            (fleetllm.serve.replica_http; `fleetllm serve`'s `http: replica`),
            "router_cls": Ray's PrefixCacheAffinityRouter (class or import path): `routing: prefix_affinity` for
            every model, "router_config": that router's keyword arguments (imbalanced_threshold, ...)}.

    Returns:
        A bound Ray Serve application; start it with `ray.serve.run(app)`.

    Example:
        >>> app = build_openai_app({"llm_configs": [LLMConfig(
        ...     model_loading_config=dict(model_id="smollm2", model_source="smollm2-135m-instruct"),
        ...     engine="transformers")]})
        >>> serve.run(app, route_prefix="/")     # then POST http://127.0.0.1:8000/v1/chat/completions
    """
    from ray.serve.config import BackpressureConfig

    builder_config, configs, router_kwargs = _read_builder_config(builder_config)
    path = _choose_path(builder_config.get("ingress") or "auto", configs)
    batch_store = builder_config.get("batch_store")
    if path == "direct":
        from fleetllm.serve.direct import direct_deployment, direct_options

        cfg = configs[0]
        return direct_deployment().options(
            name=deployment_name(cfg.model_id),
            backpressure_config=BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S),
            **direct_options(cfg)).bind(cfg.model_dump(), builder_config.get("api_key"), RETRY_AFTER_S,
                                        batch_store, builder_config.get("listen"))
    return _separate_app(configs, router_kwargs, builder_config.get("api_key"), batch_store)


def _read_builder_config(builder_config: dict[str, Any]) -> tuple[dict[str, Any], list[LLMConfig], Any]:
    """The builder config with Ray's names read (LLMServingArgs, router_cls / router_config), checked: the
    config, its LLMConfigs (every one prefix_affinity with a router) and the router's keyword arguments."""
    from fleetllm.errors import SpecError
    from fleetllm.secrets import check_api_key
    from fleetllm.serve.ray_names import builder_router, serving_args

    builder_config = serving_args(builder_config)  # Ray's LLMServingArgs too
    try:
        router_kwargs = builder_router(builder_config)  # Ray's router_cls / router_config
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    unknown = sorted(set(builder_config) - {"llm_configs", "api_key", "ingress", "batch_store", "listen"})
    if unknown:
        raise SpecError(f"build_openai_app: unknown keys {unknown}; give llm_configs (and optionally api_key, "
                        "ingress, batch_store, listen, router_cls, router_config)")
    if builder_config.get("api_key") is not None:  # refused at start, not a 401 to every client
        try:
            check_api_key(builder_config["api_key"], "build_openai_app: api_key")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    configs = [c if isinstance(c, LLMConfig) else LLMConfig.model_validate(c)
               for c in builder_config.get("llm_configs") or []]
    if not configs:
        raise SpecError("build_openai_app needs at least one LLMConfig in llm_configs")
    if router_kwargs is not None:
        configs = [c.model_copy(update={"routing": "prefix_affinity"}) for c in configs]
    ids = [c.model_id for c in configs]
    if len(set(ids)) != len(ids):
        raise SpecError(f"model ids {ids} repeat; give each LLMConfig its own model_id")
    return builder_config, configs, router_kwargs


def _choose_path(ingress: str, configs: list[LLMConfig]) -> str:
    """"direct" or "separate" (fleetllm.serve.spec.choose_ingress), logged with the reason."""
    from fleetllm.errors import SpecError
    from fleetllm.serve.spec import IngressMode, choose_ingress

    if ingress not in get_args(IngressMode):
        raise SpecError(f"build_openai_app: ingress {ingress!r} is not one of {', '.join(get_args(IngressMode))}")
    try:
        path, why = choose_ingress(ingress, configs)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    log.info("fleetllm serve: %s ingress (%s)", path, why)
    return path


def _separate_app(configs: list[LLMConfig], router_kwargs: Any, api_key: str | None, batch_store: str | None):
    """One LLMServer deployment per model behind one OpenAIIngress deployment."""
    from fleetllm.serve import deployments

    LLMServer, OpenAIIngress = _deployments()
    handles = {}
    for cfg in configs:
        opts = deployments.LLMServer.get_deployment_options(cfg)
        if cfg.routing == "prefix_affinity":
            from fleetllm.serve.routing import router_config

            opts["request_router_config"] = router_config(opts["max_ongoing_requests"], router_kwargs)
        handles[cfg.model_id] = LLMServer.options(**opts).bind(cfg.model_dump())
    front = OpenAIIngress.options(**deployments.OpenAiIngress.get_deployment_options(configs))
    return front.bind(handles, api_key, batch_store)
