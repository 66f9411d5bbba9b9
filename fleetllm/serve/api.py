"""The OpenAI-compatible HTTP API (FastAPI), over any set of `Backend`s.

`make_api(backends, api_key)` returns the FastAPI app; the Ray Serve ingress (app.py) builds it in
its replica over DeploymentHandles, and tests build it in-process over `LocalBackend`s and drive it
through httpx's ASGITransport. Routes: POST /v1/chat/completions, POST /v1/completions,
POST /v1/embeddings (fleetllm.engines.openai_api.embeddings), GET /v1/models, GET /health, GET /metrics. A model
serves one task: an embedding model refuses chat and completions with a 400, and the others embeddings.
With a batch store, OpenAI's /v1/files and /v1/batches too (fleetllm.serve.batch_routes); a request carrying
the header x-fleetllm-batch is a Batch API row: engine priority 1 (interactive 0), its own metric series.
The routes are registered here; what a request does is fleetllm.serve.handlers.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetllm.serve.backend import Backend
from fleetllm.serve.handlers import Handlers, error_response
from fleetllm.serve.metrics import ServeMetrics
from fleetllm.engines.openai_api.protocol import APIError, ModelCard, ModelList, validation_message
from fleetllm.serve.vllm_metrics import gather


def make_api(backends: dict[str, Backend], api_key: str | None = None, metrics: ServeMetrics | None = None,
             batch_store: str | None = None):
    """Build the FastAPI app serving `backends` (model_id -> backend); with `batch_store` (a folder or
    object-store URL) also OpenAI's /v1/files and /v1/batches (fleetllm.serve.batch_routes)."""

    app = FastAPI(title="fleetllm OpenAI-compatible API", docs_url=None, redoc_url=None)
    handlers = Handlers(backends, api_key, metrics or ServeMetrics())
    app.state.metrics = handlers.metrics
    app.state.backends = backends
    app.state.admissions = handlers.admissions
    add_error_handlers(app)
    if batch_store is not None:
        from fleetllm.batches.store import BatchStore
        from fleetllm.serve.batch_routes import add_batch_routes

        add_batch_routes(app, BatchStore(batch_store), handlers.check_key)
    add_model_routes(app, handlers)
    add_generation_routes(app, handlers)
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, a body FastAPI refused, an unknown route, a bug's 500."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error_response(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return error_response(APIError(exc.status_code, str(exc.detail),
                                       type="not_found_error" if exc.status_code == 404 else "invalid_request_error"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # a bug's 500 still has OpenAI's shape
        return error_response(APIError(500, f"internal error ({type(exc).__name__}); the server log has "
                                       "the details", type="server_error"))


def add_model_routes(app: FastAPI, handlers: Handlers) -> None:
    """GET /v1/models, /health and /metrics: what is served and how it is doing."""
    backends, adapters, metrics = handlers.backends, handlers.adapters, handlers.metrics

    @app.get("/v1/models")
    async def list_models(request: Request):
        handlers.check_key(request)
        cards = [ModelCard(id=m, max_model_len=b.max_model_len) for m, b in backends.items()]
        # every id a request may name: vLLM lists an adapter by name, Ray Serve LLM as `<base>:<name>`
        cards += [ModelCard(id=m, max_model_len=backends[base].max_model_len, parent=base)
                  for m, (base, _) in adapters.items()]
        return JSONResponse(ModelList(data=cards).model_dump())

    @app.get("/health")
    async def health():
        bad = [m for m, b in backends.items() if not await _healthy(b)]
        if bad:
            return JSONResponse({"status": "unhealthy", "models": bad}, status_code=503)
        return JSONResponse({"status": "ok", "models": sorted(backends)})

    @app.get("/metrics")
    async def prometheus():
        for m, b in backends.items():
            try:
                stats = await b.stats()
            except Exception:  # noqa: BLE001 - an unreachable model shows as unhealthy
                metrics.set_engine(m, None)
                continue
            if stats is not None:  # None: replicas too busy to answer now; keep the last values
                metrics.set_engine(m, stats)
            # vLLM's metrics of every replica (published to Ray), else of the one that answered
            published = await asyncio.to_thread(gather, m)
            metrics.set_vllm(m, published or ([stats["vllm_metrics"]] if stats and "vllm_metrics" in stats else None))
        for m, gate in handlers.admissions.items():
            metrics.batch_window.labels(m).set(gate.window.limit)
            metrics.batch_waiting.labels(m).set(gate.waiting)
            metrics.batch_rebaselines.labels(m).set(gate.rebaselines)
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)


def add_generation_routes(app: FastAPI, handlers: Handlers) -> None:
    """POST /v1/chat/completions, /v1/completions and /v1/embeddings."""

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handlers.serve_request(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handlers.serve_request(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await handlers.embeddings(request)


async def _healthy(backend: Backend) -> bool:
    try:
        return bool(await backend.healthy())
    except Exception:  # noqa: BLE001
        return False
