"""The OpenAI-compatible HTTP API (FastAPI), over any set of `Backend`s.

`make_api(backends, api_key)` returns the FastAPI app; the Ray Serve ingress (app.py) builds it in
its replica over DeploymentHandles, and tests build it in-process over `LocalBackend`s and drive it
through httpx's ASGITransport. Routes: POST /v1/chat/completions, POST /v1/completions,
POST /v1/embeddings (fleetllm.engines.openai_embeddings), GET /v1/models, GET /health, GET /metrics. A model
serves one task: an embedding model refuses chat and completions with a 400, and the others embeddings.
With a batch store, OpenAI's /v1/files and /v1/batches too (fleetllm.serve.batch_routes); a request carrying
the header x-fleetllm-batch is a Batch API row: engine priority 1 (interactive 0), its own metric series.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetllm.serve.backend import Backend, raise_item_error
from fleetllm.serve.batch_admission import BatchAdmission, is_batch, priority_of
from fleetllm.engines.openai_embeddings import EmbeddingsRequest, embeddings_response, wrong_task_message
from fleetllm.serve.metrics import ServeMetrics
from fleetllm.serve.vllm_metrics import gather
from fleetllm.unicode_text import lone_surrogate, lone_surrogate_in_json, refusal
from fleetllm.serve.protocol import (
    APIError, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
    CompletionChoice, CompletionRequest, CompletionResponse, DeltaMessage, ModelCard, ModelList,
    ResponseMessage, Usage, chat_logprobs, completion_logprobs, new_id, validation_message,
)



def make_api(backends: dict[str, Backend], api_key: str | None = None, metrics: ServeMetrics | None = None,
             batch_store: str | None = None):
    """Build the FastAPI app serving `backends` (model_id -> backend); with `batch_store` (a folder or
    object-store URL) also OpenAI's /v1/files and /v1/batches (fleetllm.serve.batch_routes)."""

    app = FastAPI(title="fleetllm OpenAI-compatible API", docs_url=None, redoc_url=None)
    metrics = metrics or ServeMetrics()
    app.state.metrics = metrics
    app.state.backends = backends
    admissions: dict[str, BatchAdmission] = {}  # batch rows' window per served model id (batch_admission)
    app.state.admissions = admissions

    def admission(model: str) -> BatchAdmission:
        """The window of the engine that answers `model`: an adapter id shares its base model's."""
        base = adapters[model][0] if model in adapters else model
        return admissions.setdefault(base, BatchAdmission())

    def error_response(exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

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

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                           type="authentication_error", code="invalid_api_key")

    async def parse(request: Request, model_cls):
        raw = await request.body()
        with not_too_deep():
            return parse_body(raw, model_cls)

    def parse_body(raw: bytes, model_cls):
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc}); send a JSON object") from None
        if not isinstance(data, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}")
        bad_text = lone_surrogate_in_json(raw, data)
        if bad_text:  # no tokenizer takes it: refused here, naming the field, not as a tokenizer's message
            param = next((k for k, v in data.items() if lone_surrogate(v) or lone_surrogate(k)), None)
            raise APIError(400, refusal(bad_text), param=param)
        try:
            return model_cls.model_validate(data)
        except ValidationError as exc:
            message, param = validation_message(exc.errors())
            raise APIError(400, message, param=param) from None

    adapters = adapter_ids(backends)  # LoRA adapter model ids -> (base model id, adapter name)

    def pick(model: str | None) -> tuple[str, Backend]:
        if model is None:
            if len(backends) == 1:
                return next(iter(backends.items()))
            raise APIError(400, f"`model` is required; this server serves {sorted(backends)}", param="model")
        if model in adapters:
            return model, backends[adapters[model][0]]
        if model not in backends:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                           f"{sorted([*backends, *adapters])}", type="not_found_error", param="model",
                           code="model_not_found")
        return model, backends[model]

    if batch_store is not None:
        from fleetllm.batches.store import BatchStore
        from fleetllm.serve.batch_routes import add_batch_routes

        add_batch_routes(app, BatchStore(batch_store), check_key)

    @app.get("/v1/models")
    async def list_models(request: Request):
        check_key(request)
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
        for m, gate in admissions.items():
            metrics.batch_window.labels(m).set(gate.window.limit)
            metrics.batch_waiting.labels(m).set(gate.waiting)
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await serve_request(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve_request(request, "completions")

    def check_task(model: str, backend: Backend, task: str, endpoint: str) -> None:
        have = getattr(backend, "task", "generate")
        if have != task:
            raise APIError(400, wrong_task_message(model, have, endpoint), param="model", code="wrong_model_task")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        model_label = "unknown"
        ms = metrics.of(is_batch(request))
        try:
            check_key(request)
            req = await parse(request, EmbeddingsRequest)
            model_label, backend = pick(req.model)
            check_task(model_label, backend, "embed", "/v1/embeddings")
            t0 = time.monotonic()
            ms.in_flight.labels(model_label).inc()
            try:
                out = await backend.embed({"items": req.items(), "dimensions": req.dimensions,
                                           "request_id": new_id("emb"), "priority": priority_of(request)})
            finally:
                ms.in_flight.labels(model_label).dec()
            if "error" in out:
                raise_item_error([out])
            ms.latency.labels(model_label).observe(time.monotonic() - t0)
            ms.requests.labels(model_label, "embeddings", "200").inc()
            ms.prompt_tokens.labels(model_label).inc(out["prompt_tokens"])
            return JSONResponse(embeddings_response(model_label, out["vectors"], out["prompt_tokens"],
                                                    req.encoding_format))
        except APIError as exc:
            if exc.status == 400 and "dimensions" in exc.message and exc.param is None:
                exc.param = "dimensions"
            ms.requests.labels(model_label, "embeddings", str(exc.status)).inc()
            return error_response(exc)

    async def serve_request(request: Request, endpoint: str):
        model_label = "unknown"
        ms = metrics.of(is_batch(request))
        try:
            check_key(request)
            req = await parse(request, ChatCompletionRequest if endpoint == "chat" else CompletionRequest)
            model_label, backend = pick(req.model)
            check_task(model_label, backend, "generate",
                       "/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
            with not_too_deep():  # a deep value in a field the engine reads (response_format, extras)
                payload = build_payload(req, endpoint, getattr(backend, "reads_images", False))
            if model_label in adapters:
                payload["adapter"] = adapters[model_label][1]
            payload["priority"] = priority_of(request)
            if not is_batch(request):
                return await run(req, endpoint, model_label, backend, payload, ms)
            async with admission(model_label).slot():  # batch rows wait while interactive latency is high
                return await run(req, endpoint, model_label, backend, payload, ms)
        except APIError as exc:
            ms.requests.labels(model_label, endpoint, str(exc.status)).inc()
            return error_response(exc)

    async def run(req, endpoint: str, model: str, backend: Backend, payload: dict[str, Any], ms):
        t0 = time.monotonic()
        stream = backend.stream(payload)
        ms.in_flight.labels(model).inc()
        done = False
        try:
            try:
                first = await stream.__anext__()
            except StopAsyncIteration:
                raise APIError(500, "the engine returned no output", type="server_error") from None
            raise_item_error(first)
            ms.ttft.labels(model).observe(time.monotonic() - t0)
            replica = first[0].get("replica") if first else None  # which replica answers
            headers = {"x-fleetllm-replica": str(replica)} if replica else {}
            if req.stream:
                done = True  # the generator below owns the stream from here
                return StreamingResponse(sse(req, endpoint, model, first, stream, t0, ms),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", **headers})
            acc = Accumulator(req.n)
            acc.add(first)
            async for items in stream:
                raise_item_error(items)
                acc.add(items)
            finished(model, endpoint, ms, t0, acc)
            return JSONResponse(acc.response(req, endpoint, model, payload.get("prompt", "")).model_dump(
                exclude_none=True), headers=headers)
        finally:
            if not done:
                ms.in_flight.labels(model).dec()
                await stream.aclose()

    def finished(model: str, endpoint: str, ms, t0: float, acc: "Accumulator") -> None:
        """A generation answered: its latency and usage recorded; an interactive one's latency steers the
        batch rows' admission window."""
        latency = time.monotonic() - t0
        ms.latency.labels(model).observe(latency)
        if ms is metrics.interactive:
            admission(model).interactive(t0, latency, acc.completion_tokens)
        record_usage(model, endpoint, acc, ms)

    def record_usage(model: str, endpoint: str, acc: "Accumulator", ms) -> None:
        ms.requests.labels(model, endpoint, "200").inc()
        ms.prompt_tokens.labels(model).inc(acc.prompt_tokens)
        ms.output_tokens.labels(model).inc(acc.completion_tokens)

    async def sse(req, endpoint: str, model: str, first: list[dict], stream: AsyncIterator, t0: float, ms):
        rid = new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        acc = Accumulator(req.n)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # vLLM's continuous_usage_stats: the usage so far on every chunk (with include_usage)
        continuous = include_usage and bool(req.stream_options.continuous_usage_stats)
        try:
            if endpoint == "chat":
                prompt = max((d.get("num_input_tokens") or 0 for d in first), default=0)
                for i in range(req.n):  # the role first, one chunk per choice (as vLLM streams)
                    start = [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))]
                    yield _event(ChatCompletionChunk(id=rid, model=model, choices=start,
                                                     usage=Usage.of(prompt, 0) if continuous else None))
            items = first
            while True:
                raise_item_error(items)
                acc.add(items)
                for chunk in acc.chunks(rid, endpoint, model, items):  # one per choice, as vLLM streams
                    if continuous:
                        chunk.usage = Usage.of(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)
                    yield _event(chunk)
                items = await stream.__anext__()
        except StopAsyncIteration:
            pass
        except APIError as exc:  # failed mid-stream: an error event, then the end
            yield f"data: {json.dumps(exc.body())}\n\n"
        finally:
            ms.in_flight.labels(model).dec()
            await stream.aclose()
        finished(model, endpoint, ms, t0, acc)
        if include_usage:
            usage = Usage.of(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)
            cls = ChatCompletionChunk if endpoint == "chat" else CompletionResponse
            yield _event(cls(id=rid, model=model, choices=[], usage=usage))
        yield "data: [DONE]\n\n"

    return app


@contextlib.contextmanager
def not_too_deep():
    """A RecursionError (JSON nested past what Python's parser, a validator or a walk over the body
    recurses through) is the request's 400, not the server's 500."""
    try:
        yield
    except RecursionError:
        raise APIError(400, "the request body nests JSON arrays or objects too deeply to be read; send a body "
                       "nested a few levels, as the API's fields are") from None


async def _healthy(backend: Backend) -> bool:
    try:
        return bool(await backend.healthy())
    except Exception:  # noqa: BLE001
        return False


def _event(model) -> str:
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"


def adapter_ids(backends: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The model ids of the backends' LoRA adapters (fleetllm.adapters.model_ids), mapped to (base, name)."""
    from fleetllm.adapters import model_ids

    return model_ids({base: getattr(backend, "adapters", ()) for base, backend in backends.items()})


def build_payload(req, endpoint: str, images: bool = False) -> dict[str, Any]:
    """The backend payload: messages or prompt, the engine's sampling dict, chat template variables. `images`:
    the model reads images, so image_url parts stay (else they are a 400: the model reads text only)."""
    payload: dict[str, Any] = {"sampling": req.engine_sampling(), "request_id": new_id("req")}
    if endpoint == "chat":
        payload["messages"] = [m.plain(i, images) for i, m in enumerate(req.messages)]
        payload["chat_template_kwargs"] = req.chat_template_kwargs or {}
    elif req.token_ids() is not None:  # the engine takes the ids as they are; echo shows their text
        payload.update(prompt="", prompt_token_ids=req.token_ids())
    else:
        payload["prompt"] = req.prompt
    if getattr(req, "echo", False):
        payload["echo"] = True
    return payload


class Accumulator:
    """Collects delta dicts into per-choice text, token counts, finish reasons and logprobs."""

    def __init__(self, n: int) -> None:
        self.texts = [""] * n
        self.tokens = [0] * n
        self.finish: list[str | None] = [None] * n
        self.logprobs: list[list[dict]] = [[] for _ in range(n)]
        self.prompt_tokens = 0
        self.cached_tokens: int | None = None  # prompt tokens from the engine's prefix cache (vLLM says)
        self.echo: dict[str, Any] | None = None  # {prompt_text, prompt_logprobs} for completions' echo

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens)

    def add(self, items: list[dict]) -> None:
        for d in items:
            i = d["index"]
            self.echo = d.get("echo") or self.echo
            self.texts[i] += d["text"]
            self.tokens[i] = max(self.tokens[i], d["num_generated_tokens"])
            self.finish[i] = d.get("finish_reason") or self.finish[i]
            self.prompt_tokens = max(self.prompt_tokens, d.get("num_input_tokens") or 0)
            if d.get("num_cached_tokens") is not None:
                self.cached_tokens = max(self.cached_tokens or 0, d["num_cached_tokens"])
            self.logprobs[i].extend(d.get("logprobs") or [])

    def chunks(self, rid: str, endpoint: str, model: str, items: list[dict]) -> list:
        """The SSE chunks for a batch of deltas: one per choice index (its deltas merged), so a client reading
        choices[0] of each chunk sees every choice, one whose first token was the stop token included."""
        merged: dict[int, dict[str, Any]] = {}
        for d in items:
            m = merged.setdefault(d["index"], {"text": "", "finish": None, "logprobs": []})
            m["text"] += d["text"]
            m["finish"] = d.get("finish_reason") or m["finish"]
            m["logprobs"].extend(d.get("logprobs") or [])
        if endpoint == "chat":
            return [ChatCompletionChunk(id=rid, model=model, choices=[ChatChunkChoice(
                index=i, delta=DeltaMessage(content=m["text"]), finish_reason=m["finish"],
                logprobs=chat_logprobs(m["logprobs"]))]) for i, m in sorted(merged.items())]
        return [CompletionResponse(id=rid, model=model, choices=[CompletionChoice(
            index=i, text=m["text"], finish_reason=m["finish"],
            logprobs=completion_logprobs(m["logprobs"], offset=len(self.texts[i]) - len(m["text"])))])
            for i, m in sorted(merged.items())]

    def response(self, req, endpoint: str, model: str, prompt: str):
        usage = Usage.of(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
        if endpoint == "chat":
            choices = [ChatChoice(index=i, message=ResponseMessage(content=t), finish_reason=self.finish[i],
                                  logprobs=chat_logprobs(self.logprobs[i])) for i, t in enumerate(self.texts)]
            return ChatCompletionResponse(id=new_id("chatcmpl"), model=model, choices=choices, usage=usage)
        echo = (self.echo or {}).get("prompt_text", prompt) if getattr(req, "echo", False) else ""
        head = (self.echo or {}).get("prompt_logprobs") or []  # the prompt's tokens, before the generated ones
        choices = [CompletionChoice(index=i, text=echo + t, finish_reason=self.finish[i],
                                    logprobs=completion_logprobs(head + self.logprobs[i] if self.logprobs[i] else None))
                   for i, t in enumerate(self.texts)]
        return CompletionResponse(id=new_id("cmpl"), model=model, choices=choices, usage=usage)
