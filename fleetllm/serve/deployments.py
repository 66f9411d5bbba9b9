"""The model replica (LLMServer) and the OpenAI ingress (OpenAiIngress) as plain classes, so that Ray Serve
LLM's bind pattern runs as Ray documents it::

    from fleetllm.serve import LLMConfig
    from fleetllm.serve.deployments import LLMServer, OpenAiIngress, make_fastapi_ingress

    server = serve.deployment(LLMServer).options(**LLMServer.get_deployment_options(llm_config)).bind(llm_config)
    ingress_cls = make_fastapi_ingress(OpenAiIngress)
    app = serve.deployment(ingress_cls).options(**OpenAiIngress.get_deployment_options(
        llm_configs=[llm_config])).bind([server])

fleetllm.serve.app builds its apps from the same classes. HandleBackend: a model deployment seen by the ingress.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fleetllm.serve.spec import LLMConfig

RETRY_AFTER_S = 1.0
STATS_TIMEOUT_S = 5.0


def deployment_name(model_id: str) -> str:
    """A model's deployment name: unique per app; model ids may hold characters Serve dislikes."""
    return "LLMServer-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_id)


def _config(llm_config: Any) -> LLMConfig:
    return llm_config if isinstance(llm_config, LLMConfig) else LLMConfig.model_validate(llm_config)


def _backpressure(status_code: int):
    from ray.serve.config import BackpressureConfig

    return BackpressureConfig(status_code=status_code, retry_after_s=RETRY_AFTER_S)


class LLMServer:
    """One replica of one model: the engine and its streaming loop."""

    def __init__(self, llm_config: Any) -> None:
        from ray import serve

        from fleetllm.serve.backend import ModelServer

        from fleetllm.serve.direct import queues_itself

        cfg = _config(llm_config)
        self.server = ModelServer(cfg)
        self.server.replica_id = serve.get_replica_context().replica_id.unique_id
        if not queues_itself(cfg):  # several replicas: vLLM's metrics merged across them by /metrics (one replica
            self.server.publish_metrics()  # answers the ingress's stats call with its own, live)

    @classmethod
    def get_deployment_options(cls, llm_config: Any) -> dict[str, Any]:
        """Ray Serve options of the model's deployment (Ray Serve LLM's classmethod)."""
        cfg = _config(llm_config)
        return dict(name=deployment_name(cfg.model_id), backpressure_config=_backpressure(429),
                    health_check_period_s=5, graceful_shutdown_timeout_s=5, **cfg.deployment_options())

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


class OpenAiIngress:
    """The OpenAI HTTP API over the model deployments' handles: {model_id: handle} (fleetllm's apps) or a
    list of LLMServer handles (Ray's bind pattern: each replica names its model)."""

    def __init__(self, llm_deployments: dict[str, Any] | list[Any], api_key: str | None = None,
                 batch_store: str | None = None) -> None:
        self.handles = llm_deployments
        self.api_key = api_key
        self.batch_store = batch_store  # serve /v1/files and /v1/batches over it (fleetllm.serve.app)

    @staticmethod
    def get_deployment_options(llm_configs: list[Any]) -> dict[str, Any]:
        """The ingress admits what the models can hold (plus room for errors and /metrics), bounded: past it 503."""
        capacity = 0
        for cfg in map(_config, llm_configs):
            opts = cfg.deployment_options()
            replicas = opts.get("autoscaling_config", {}).get("max_replicas") or opts.get("num_replicas") or 1
            capacity += (opts["max_ongoing_requests"] * replicas) + opts["max_queued_requests"]
        return dict(name="OpenAIIngress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=capacity + 16,
                    max_queued_requests=capacity + 16, backpressure_config=_backpressure(503))

    async def __serve_build_asgi_app__(self):
        from fleetllm.serve.api import make_api

        handles = self.handles.items() if isinstance(self.handles, dict) else [(None, h) for h in self.handles]
        backends = {}
        for model_id, handle in handles:
            info = await handle.info.remote()
            model_id = model_id or info["model_id"]
            backends[model_id] = HandleBackend(model_id, handle, info.get("max_model_len"),
                                               info.get("task", "generate"), tuple(info.get("adapters") or ()),
                                               bool(info.get("reads_images")))
        return make_api(backends, api_key=self.api_key, batch_store=self.batch_store)


def make_fastapi_ingress(cls: type) -> type:
    """The ingress class as a Serve HTTP ingress (Ray Serve LLM's helper; the ASGI app is built per replica)."""
    from ray import serve

    return serve.ingress()(cls)


class HandleBackend:
    """A model deployment seen through its DeploymentHandle (streaming)."""

    def __init__(self, model_id: str, handle: Any, max_model_len: int | None, task: str = "generate",
                 adapters: tuple[str, ...] = (), reads_images: bool = False) -> None:
        self.model_id = model_id
        self.task = task
        self.adapters = adapters  # LoRA adapter names: model ids of their own (fleetllm.serve.handlers.adapter_ids)
        self.reads_images = reads_images  # image_url parts reach the replica (else a 400: text only)
        self.handle = handle
        self.stream_handle = handle.options(stream=True)
        self.max_model_len = max_model_len

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        from ray.serve.exceptions import BackPressureError

        from fleetllm.engines.openai_api.protocol import overloaded

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

        from fleetllm.engines.openai_api.protocol import overloaded

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


