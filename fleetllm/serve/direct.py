"""The direct path: the model's own deployment is the Serve ingress (one model, default routing).

    client --HTTP--> Serve proxy --> LLMServer replica (FastAPI from api.py over `DirectBackend`: the
                                     replica's ModelServer, called in-process)

No OpenAIIngress deployment and no DeploymentHandle: each streamed chunk crosses one Ray hop (replica ->
proxy) instead of two, and no ingress process builds it (Ray Serve LLM's "direct streaming", ray #63468).

Admission. One fixed replica: the replica queues, so that clients see what the separate path gives them:
Serve sends it up to max_ongoing + max_queued requests (+ ROOM for /health, /metrics, /v1/models); the
first max_ongoing run in the engine, the next max_queued wait in the replica, and past both the API
answers 429 + Retry-After with the OpenAI error body (`DirectBackend`); /health answers under full load.
Several replicas or autoscaling: Serve's router queues (max_ongoing per replica, max_queued per replica
in its queue), as on the separate path, because only the router sees every replica: a replica that queued
for itself would take requests an idle one could run. Past the queue Serve's proxy answers 429 +
Retry-After (its backpressure_config), with a text body; /health and /metrics wait for a slot there.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.engines.openai_api.protocol import overloaded
from fleetllm.serve.spec import LLMConfig

ROOM = 16  # requests a replica takes past its model's capacity: /health, /metrics, /v1/models, refusals


class DirectBackend(LocalBackend):
    """The replica's ModelServer as the API's backend: at most max_ongoing requests in the engine, max_queued
    more waiting here, past both 429 (the separate path's answer and message)."""

    def __init__(self, server: ModelServer, max_ongoing_requests: int, max_queued_requests: int,
                 retry_after_s: float = 1.0) -> None:
        super().__init__(server, max_ongoing_requests, max_queued_requests, retry_after_s)
        self.running = asyncio.Semaphore(max_ongoing_requests)

    def _admit(self) -> None:
        if self.admitted >= self.capacity:
            raise overloaded(f"model {self.model_id!r} is at capacity (queue full); retry later", 429,
                             self.retry_after_s)
        self.admitted += 1

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        self._admit()
        try:
            async with self.running:
                async for items in self.server.stream(payload):
                    yield items
        finally:
            self.admitted -= 1

    async def embed(self, payload: dict[str, Any]) -> dict[str, Any]:
        self._admit()
        try:
            async with self.running:
                return await self.server.embed(payload)
        finally:
            self.admitted -= 1


def replica_limits(cfg: LLMConfig) -> tuple[int, int]:
    """(max_ongoing, max_queued) one replica admits itself: serve.yaml's for one fixed replica; (max_ongoing,
    0) where Serve's router queues (several replicas, autoscaling)."""
    opts = cfg.replica_options()
    return int(opts["max_ongoing_requests"]), int(opts["max_queued_requests"]) if queues_itself(cfg) else 0


def queues_itself(cfg: LLMConfig) -> bool:
    """One fixed replica: it holds the model's queue (else Serve's router does, seeing every replica)."""
    return "autoscaling_config" not in cfg.deployment_config and cfg.deployment_config.get("num_replicas", 1) == 1


def direct_options(cfg: LLMConfig) -> dict[str, Any]:
    """Serve options of the direct deployment (see the module's docstring)."""
    opts = cfg.deployment_options()
    if queues_itself(cfg):
        ongoing, queued = replica_limits(cfg)
        opts["max_ongoing_requests"] = ongoing + queued + ROOM
        opts["max_queued_requests"] = queued + ROOM  # while the replica (re)starts
    return opts


def direct_deployment():
    """The deployment class (imports Ray Serve, so only when an app is built)."""
    from ray import serve

    from fleetllm.serve.api import make_api

    @serve.deployment(name="LLMServer", health_check_period_s=5, graceful_shutdown_timeout_s=5)
    @serve.ingress()
    class DirectLLMServer:
        """One replica of the one model, answering the OpenAI API itself."""

        def __init__(self, config: dict[str, Any], api_key: str | None = None, retry_after_s: float = 1.0,
                     batch_store: str | None = None, listen: dict[str, Any] | None = None) -> None:
            cfg = LLMConfig.model_validate(config)
            self.server = ModelServer(cfg)
            self.server.replica_id = serve.get_replica_context().replica_id.unique_id
            if not queues_itself(cfg):  # several replicas: vLLM's metrics merged across them by /metrics (one
                self.server.publish_metrics()  # replica answers its own live: no snapshot every 2 s on its loop)
            self.server.stream_budget = cfg.stream_budget(direct=True)
            ongoing, queued = replica_limits(cfg)
            self.backend = DirectBackend(self.server, ongoing, queued, retry_after_s)
            self.api = make_api({self.server.model_id: self.backend}, api_key=api_key, batch_store=batch_store)
            self.listener = None
            if listen:  # http: replica: this replica answers host:port itself (fleetllm.serve.replica_http)
                from fleetllm.serve.replica_http import Listener

                self.listener = Listener(self.api, listen["host"], int(listen["port"]))

        async def __serve_build_asgi_app__(self):
            return self.api

        def __del__(self) -> None:  # Ray Serve's graceful stop: the replica's own server stops taking requests
            if getattr(self, "listener", None) is not None:
                self.listener.stop()

        def check_health(self) -> None:  # Ray Serve restarts a replica whose engine died
            if not self.server.healthy():
                raise RuntimeError(f"engine of {self.server.model_id!r} is dead: {self.server.fatal}")

    return DirectLLMServer
