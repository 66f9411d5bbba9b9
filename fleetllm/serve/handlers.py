"""What the OpenAI-compatible API does with one request (the routes of fleetllm.serve.api call it).

`Handlers` holds the served backends, the API key, the metrics and the batch rows' admission windows,
and answers a request: the key checked, the body parsed (`parse_body`: a 400 naming the field), the
model picked (an adapter id answered by its base model's backend), the task checked, then the engine's
stream turned into one JSON response or an SSE stream (fleetllm.serve.accumulator), metrics recorded.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import time
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from fleetllm.engines.openai_api.embeddings import EmbeddingsRequest, embeddings_response, wrong_task_message
from fleetllm.serve.accumulator import Accumulator
from fleetllm.serve.backend import Backend, raise_item_error
from fleetllm.serve.batch_admission import BatchAdmission, gaps_of, is_batch, priority_of, signal_from_env
from fleetllm.serve.metrics import ServeMetrics
from fleetllm.engines.openai_api.protocol import (
    APIError, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse,
    DeltaMessage, Usage, new_id, validation_message,
)
from fleetllm.unicode_text import lone_surrogate, lone_surrogate_in_json, refusal


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class Handlers:
    """The request handling of one API app over `backends` (model_id -> backend)."""

    def __init__(self, backends: dict[str, Backend], api_key: str | None, metrics: ServeMetrics) -> None:
        self.backends = backends
        self.api_key = api_key
        self.metrics = metrics
        self.admissions: dict[str, BatchAdmission] = {}  # batch rows' window per served model id (batch_admission)
        self.admission_signal = signal_from_env()  # what steers that window (batch_admission.SIGNALS)
        self.adapters = adapter_ids(backends)  # LoRA adapter model ids -> (base model id, adapter name)

    def admission(self, model: str) -> BatchAdmission:
        """The window of the engine that answers `model`: an adapter id shares its base model's."""
        base = self.adapters[model][0] if model in self.adapters else model
        return self.admissions.setdefault(base, BatchAdmission(signal=self.admission_signal))

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                           type="authentication_error", code="invalid_api_key")

    async def parse(self, request: Request, model_cls):
        raw = await request.body()
        with not_too_deep():
            return parse_body(raw, model_cls)

    def pick(self, model: str | None) -> tuple[str, Backend]:
        backends, adapters = self.backends, self.adapters
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

    def check_task(self, model: str, backend: Backend, task: str, endpoint: str) -> None:
        have = getattr(backend, "task", "generate")
        if have != task:
            raise APIError(400, wrong_task_message(model, have, endpoint), param="model", code="wrong_model_task")

    async def embeddings(self, request: Request):
        model_label = "unknown"
        ms = self.metrics.of(is_batch(request))
        try:
            self.check_key(request)
            req = await self.parse(request, EmbeddingsRequest)
            model_label, backend = self.pick(req.model)
            self.check_task(model_label, backend, "embed", "/v1/embeddings")
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

    async def serve_request(self, request: Request, endpoint: str):
        """POST /v1/chat/completions (`endpoint` "chat") or /v1/completions ("completions")."""
        model_label = "unknown"
        ms = self.metrics.of(is_batch(request))
        try:
            self.check_key(request)
            req = await self.parse(request, ChatCompletionRequest if endpoint == "chat" else CompletionRequest)
            model_label, backend = self.pick(req.model)
            self.check_task(model_label, backend, "generate",
                            "/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
            with not_too_deep():  # a deep value in a field the engine reads (response_format, extras)
                payload = build_payload(req, endpoint, getattr(backend, "reads_images", False))
            if model_label in self.adapters:
                payload["adapter"] = self.adapters[model_label][1]
            payload["priority"] = priority_of(request)
            if not is_batch(request):
                return await self.run(req, endpoint, model_label, backend, payload, ms)
            async with self.admission(model_label).slot():  # batch rows wait while interactive latency is high
                return await self.run(req, endpoint, model_label, backend, payload, ms)
        except APIError as exc:
            ms.requests.labels(model_label, endpoint, str(exc.status)).inc()
            return error_response(exc)

    async def run(self, req, endpoint: str, model: str, backend: Backend, payload: dict[str, Any], ms):
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
                return StreamingResponse(self.sse(req, endpoint, model, first, stream, t0, ms),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", **headers})
            acc = Accumulator(req.n)
            acc.add(first)
            async for items in stream:
                raise_item_error(items)
                acc.add(items)
            self.finished(model, endpoint, ms, t0, acc)
            return JSONResponse(acc.response(req, endpoint, model, payload.get("prompt", "")).model_dump(
                exclude_none=True), headers=headers)
        finally:
            if not done:
                ms.in_flight.labels(model).dec()
                await stream.aclose()

    def finished(self, model: str, endpoint: str, ms, t0: float, acc: Accumulator,
                 chunk_times: list[float] | None = None) -> None:
        """A generation answered: its latency and usage recorded; an interactive one's latency (and, streamed,
        the gaps between its chunks) steers the batch rows' admission window."""
        latency = time.monotonic() - t0
        ms.latency.labels(model).observe(latency)
        if ms is self.metrics.interactive:
            gaps = gaps_of(chunk_times) if chunk_times and self.admission_signal == "gap_p99" else None
            self.admission(model).interactive(t0, latency, acc.completion_tokens, gaps)
        record_usage(model, endpoint, acc, ms)

    async def sse(self, req, endpoint: str, model: str, first: list[dict], stream: AsyncIterator, t0: float, ms):
        rid = new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        acc = Accumulator(req.n)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # vLLM's continuous_usage_stats: the usage so far on every chunk (with include_usage)
        continuous = include_usage and bool(req.stream_options.continuous_usage_stats)
        times: list[float] = []  # when each engine message came: its gaps steer the batch window (gap_p99)
        try:
            if endpoint == "chat":
                prompt = max((d.get("num_input_tokens") or 0 for d in first), default=0)
                for i in range(req.n):  # the role first, one chunk per choice (as vLLM streams)
                    start = [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))]
                    yield _event(ChatCompletionChunk(id=rid, model=model, choices=start,
                                                     usage=Usage.of(prompt, 0) if continuous else None))
            items = first
            while True:
                times.append(time.monotonic())
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
        self.finished(model, endpoint, ms, t0, acc, times)
        if include_usage:
            usage = Usage.of(acc.prompt_tokens, acc.completion_tokens, acc.cached_tokens)
            cls = ChatCompletionChunk if endpoint == "chat" else CompletionResponse
            yield _event(cls(id=rid, model=model, choices=[], usage=usage))
        yield "data: [DONE]\n\n"


def record_usage(model: str, endpoint: str, acc: Accumulator, ms) -> None:
    ms.requests.labels(model, endpoint, "200").inc()
    ms.prompt_tokens.labels(model).inc(acc.prompt_tokens)
    ms.output_tokens.labels(model).inc(acc.completion_tokens)


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


@contextlib.contextmanager
def not_too_deep():
    """A RecursionError (JSON nested past what Python's parser, a validator or a walk over the body
    recurses through) is the request's 400, not the server's 500."""
    try:
        yield
    except RecursionError:
        raise APIError(400, "the request body nests JSON arrays or objects too deeply to be read; send a body "
                       "nested a few levels, as the API's fields are") from None


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
