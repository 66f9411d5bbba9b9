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

import asyncio
import logging
from typing import Any, AsyncIterator, get_args

from fleetllm.serve.spec import LLMConfig

RETRY_AFTER_S = 1.0
STATS_TIMEOUT_S = 5.0
log = logging.getLogger("fleetllm.serve")


def _deployments():
    """Define the deployment classes (imports Ray Serve, so only when an app is built)."""
    from ray import serve

    from fleetllm.serve.api import make_api
    from fleetllm.serve.backend import ModelServer

    @serve.deployment(name="LLMServer", health_check_period_s=5, graceful_shutdown_timeout_s=5)
    class LLMServer:
        """One replica of one model: the engine and its streaming loop."""

        def __init__(self, config: dict[str, Any]) -> None:
            self.server = ModelServer(LLMConfig.model_validate(config))
            self.server.replica_id = serve.get_replica_context().replica_id.unique_id
            self.server.publish_metrics()  # vLLM's metrics, merged across replicas by /metrics

        async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
            async for items in self.server.stream(payload):
                yield items

        async def embed(self, payload: dict[str, Any]) -> dict[str, Any]:
            return await self.server.embed(payload)

        def info(self) -> dict[str, Any]:
            return {"model_id": self.server.model_id, "max_model_len": self.server.max_model_len,
                    "task": self.server.task, "adapters": list(self.server.adapters),
                    "reads_images": self.server.reads_images}

        def stats(self) -> dict[str, Any]:
            return self.server.stats()

        def healthy(self) -> bool:
            return self.server.healthy()

        def check_health(self) -> None:  # Ray Serve restarts a replica whose engine died
            if not self.server.healthy():
                raise RuntimeError(f"engine of {self.server.model_id!r} is dead: {self.server.fatal}")

    @serve.deployment(name="OpenAIIngress", ray_actor_options={"num_cpus": 0})
    @serve.ingress()
    class OpenAIIngress:
        """The OpenAI HTTP API over the model deployments' handles."""

        def __init__(self, handles: dict[str, Any], api_key: str | None = None,
                     batch_store: str | None = None) -> None:
            self.handles = handles
            self.api_key = api_key
            self.batch_store = batch_store

        async def __serve_build_asgi_app__(self):
            backends = {}
            for model_id, handle in self.handles.items():
                info = await handle.info.remote()
                backends[model_id] = HandleBackend(model_id, handle, info.get("max_model_len"),
                                                   info.get("task", "generate"))
                backends[model_id].adapters = tuple(info.get("adapters") or ())
                backends[model_id].reads_images = bool(info.get("reads_images"))
            return make_api(backends, api_key=self.api_key, batch_store=self.batch_store)

    return LLMServer, OpenAIIngress


class HandleBackend:
    """A model deployment seen through its DeploymentHandle (streaming)."""

    def __init__(self, model_id: str, handle: Any, max_model_len: int | None, task: str = "generate") -> None:
        self.model_id = model_id
        self.task = task
        self.handle = handle
        self.stream_handle = handle.options(stream=True)
        self.max_model_len = max_model_len

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        from ray.serve.exceptions import BackPressureError

        from fleetllm.serve.protocol import overloaded

        gen, started, finished = None, False, False
        try:  # Serve may refuse at .remote() (queue full) or at the first item
            gen = self.stream_handle.stream.remote(payload)
            async for items in gen:
                started = True
                yield items
            finished = True
        except BackPressureError as exc:
            finished = True
            status = getattr(exc, "status_code", 429)
            raise overloaded(f"model {self.model_id!r} is at capacity (queue full); retry later",
                             429 if status not in (429, 503) else status,
                             getattr(exc, "retry_after_s", None) or RETRY_AFTER_S) from None
        finally:
            if gen is not None and started and not finished:
                # the client went away mid-stream: cancel the replica's generator and the engine request
                try:
                    gen.cancel()
                except Exception:  # noqa: BLE001 - already finished or failed
                    pass

    async def embed(self, payload: dict[str, Any]) -> dict[str, Any]:
        from ray.serve.exceptions import BackPressureError

        from fleetllm.serve.protocol import overloaded

        try:
            return await self.handle.embed.remote(payload)
        except BackPressureError as exc:
            status = getattr(exc, "status_code", 429)
            raise overloaded(f"model {self.model_id!r} is at capacity (queue full); retry later",
                             429 if status not in (429, 503) else status,
                             getattr(exc, "retry_after_s", None) or RETRY_AFTER_S) from None

    async def stats(self) -> dict[str, Any] | None:
        """The sampled replica's engine counters; None when every replica is busy to its limit."""
        from ray.serve.exceptions import BackPressureError

        try:
            return await asyncio.wait_for(self.handle.stats.remote(), STATS_TIMEOUT_S)
        except (BackPressureError, asyncio.TimeoutError):
            return None

    async def healthy(self) -> bool:
        """False when the engine is dead; a replica busy to its limit counts as alive."""
        from ray.serve.exceptions import BackPressureError

        try:
            return await asyncio.wait_for(self.handle.healthy.remote(), STATS_TIMEOUT_S)
        except (BackPressureError, asyncio.TimeoutError):
            return True


def build_openai_app(builder_config: dict[str, Any]):
    """Build the Ray Serve application serving `llm_configs` behind an OpenAI-compatible API.

    Args:
        builder_config: {"llm_configs": [LLMConfig | dict, ...], "api_key": str | None,
            "ingress": "auto" | "direct" | "separate" (default auto: direct for one model with the default
            routing, its replicas answering HTTP themselves; else an OpenAIIngress deployment in front),
            "batch_store": a folder or object-store URL: serve /v1/files and /v1/batches over it (the batches
            run where a fleetllm.batch.api_service.BatchService runs, as `fleetllm serve` starts one)}.

    Returns:
        A bound Ray Serve application; start it with `ray.serve.run(app)`.

    Example:
        >>> app = build_openai_app({"llm_configs": [LLMConfig(
        ...     model_loading_config=dict(model_id="smollm2", model_source="smollm2-135m-instruct"),
        ...     engine="transformers")]})
        >>> serve.run(app, route_prefix="/")     # then POST http://127.0.0.1:8000/v1/chat/completions
    """
    from ray.serve.config import BackpressureConfig

    from fleetllm.errors import SpecError
    from fleetllm.secrets import check_api_key
    from fleetllm.serve.spec import IngressMode, choose_ingress

    unknown = sorted(set(builder_config) - {"llm_configs", "api_key", "ingress", "batch_store"})
    if unknown:
        raise SpecError(f"build_openai_app: unknown keys {unknown}; give llm_configs (and optionally api_key, "
                        "ingress, batch_store)")
    batch_store = builder_config.get("batch_store")
    if builder_config.get("api_key") is not None:  # refused at start, not a 401 to every client
        try:
            check_api_key(builder_config["api_key"], "build_openai_app: api_key")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    configs = [c if isinstance(c, LLMConfig) else LLMConfig.model_validate(c)
               for c in builder_config.get("llm_configs") or []]
    if not configs:
        raise SpecError("build_openai_app needs at least one LLMConfig in llm_configs")
    ids = [c.model_id for c in configs]
    if len(set(ids)) != len(ids):
        raise SpecError(f"model ids {ids} repeat; give each LLMConfig its own model_id")
    ingress = builder_config.get("ingress") or "auto"
    if ingress not in get_args(IngressMode):
        raise SpecError(f"build_openai_app: ingress {ingress!r} is not one of {', '.join(get_args(IngressMode))}")
    try:
        path, why = choose_ingress(ingress, configs)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    log.info("fleetllm serve: %s ingress (%s)", path, why)
    if path == "direct":
        from fleetllm.serve.direct import direct_deployment, direct_options

        cfg = configs[0]
        return direct_deployment().options(
            name=deployment_name(cfg.model_id),
            backpressure_config=BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S),
            **direct_options(cfg)).bind(cfg.model_dump(), builder_config.get("api_key"), RETRY_AFTER_S,
                                        batch_store)
    LLMServer, OpenAIIngress = _deployments()
    handles, capacity = {}, 0
    for cfg in configs:
        opts = cfg.deployment_options()
        replicas = opts.get("autoscaling_config", {}).get("max_replicas") or opts.get("num_replicas") or 1
        capacity += (opts["max_ongoing_requests"] * replicas) + opts["max_queued_requests"]
        name = deployment_name(cfg.model_id)
        if cfg.routing == "prefix_affinity":
            from fleetllm.serve.routing import router_config

            opts["request_router_config"] = router_config(opts["max_ongoing_requests"])
        handles[cfg.model_id] = LLMServer.options(
            name=name, backpressure_config=BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S),
            **opts).bind(cfg.model_dump())
    # the ingress admits what the models can hold (plus room for errors and /metrics), bounded: past it 503
    front = OpenAIIngress.options(
        max_ongoing_requests=capacity + 16, max_queued_requests=capacity + 16,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=RETRY_AFTER_S))
    return front.bind(handles, builder_config.get("api_key"), batch_store)


def deployment_name(model_id: str) -> str:
    """A model's deployment name: unique per app; model ids may hold characters Serve dislikes."""
    return "LLMServer-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_id)
