"""One served model: the engine behind a small, engine-agnostic streaming interface.

`ModelServer` owns an engine and turns `engine.generate_stream(request)` into lists of plain delta
dicts (what crosses a Ray Serve handle). It runs inside the Ray Serve model deployment, and
in-process behind `LocalBackend` (tests, the ASGI app without Ray). The API layer (api.py) talks to
any object with the `Backend` shape: `stream(payload)`, `embed(payload)`, `stats()`, `healthy()`,
`max_model_len` and `task` ("generate" or "embed": what the model serves).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, AsyncIterator, Protocol

from fleetllm.engines.base import Engine, GenerationRequest
from fleetllm.engines.fields import FieldError, check_prompt_ids
from fleetllm.errors import EngineError, FleetError, RequestFailed, RowError
from fleetllm.serve.echo import echo_item
from fleetllm.serve.defaults import model_sampling_defaults, with_defaults
from fleetllm.engines.openai_api.protocol import APIError, overloaded
from fleetllm.serve.spec import LLMConfig
from fleetllm.serve.stream_trace import new_trace

# How often one request's deltas are sent: every message costs CPU in the replica, the ingress, the HTTP
# proxy and the client (2-3 ms together on this 2-core machine) whatever it carries. A replica sends at
# most LLMConfig.stream_budget() messages a second across its streams, so each stream's gap is
# streams / budget: with few streams every delta goes out as the engine makes it (no fixed interval),
# and as streams grow their deltas are merged so the hops' total message rate stays at the budget.
# CPU default 40/s (1 stream: every 25 ms; 32 streams: every 0.8 s), GPU default 2,000/s (up to ~10
# streams per token at 5 ms steps; 256 streams every 128 ms): benchmarks/NOTES-serve.md.
# FLEETLLM_STREAM_INTERVAL_S sets a floor under the gap (0: none).
STREAM_INTERVAL_S = float(os.environ.get("FLEETLLM_STREAM_INTERVAL_S", "0"))

# The replica process runs several busy threads (vLLM's output loop, the serving loop, Ray Serve's loop); a
# token handed between them waits for the GIL up to Python's switch interval (5 ms) at each hop. An A/B knob
# for the serving tail (issue 36; benchmarks/serve_gpu_plan.py TWEAKS "switch"): FLEETLLM_SWITCH_INTERVAL_S
# sets sys.setswitchinterval in the replica; unset, Python's default stays.
SWITCH_INTERVAL_S = os.environ.get("FLEETLLM_SWITCH_INTERVAL_S")


class Backend(Protocol):
    model_id: str
    max_model_len: int | None
    task: str  # "generate" | "embed"

    def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]: ...

    async def embed(self, payload: dict[str, Any]) -> dict[str, Any]: ...

    async def stats(self) -> dict[str, Any] | None: ...

    async def healthy(self) -> bool: ...


def error_item(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"status": status, "message": message, "code": code, "param": param}}


async def served_images(messages: Any) -> tuple[Any, list[bytes]]:
    """A chat request's messages with their image parts fetched and checked (in a thread: fetching waits on
    the network), and the images' bytes; RowError naming the part. Served models fetch https:// and data:
    URLs only (no local files), public addresses only."""
    from fleetllm.engines.images import ImageLimits, image_parts, load_images

    if not messages or not image_parts(messages):
        return messages, []
    return await asyncio.to_thread(load_images, messages, ImageLimits())


class ModelServer:
    """Loads one model's engine and streams its deltas as lists of dicts."""

    def __init__(self, config: LLMConfig, engine: Engine | None = None) -> None:
        if SWITCH_INTERVAL_S:
            sys.setswitchinterval(float(SWITCH_INTERVAL_S))
        self.config = config
        self.model_id = config.model_id
        if engine is None:
            from fleetllm import models
            from fleetllm.engines.base import create_engine
            from fleetllm.engines.capabilities import capabilities

            resolved = models.resolve(config.model_loading_config.model_source)
            self.task = config.task if config.task != "auto" else models.model_task(resolved)
            name = config.resolved_engine()
            kwargs = dict(config.engine_kwargs)
            if config.lora_adapters:
                from fleetllm.adapters import resolve_all

                kwargs["lora_adapters"] = resolve_all(config.lora_adapters)
            can = capabilities(name)
            if not can.continuous_batching and self.task == "generate":  # a static batch holds what the replica admits
                kwargs.setdefault("max_batch_size", config.deployment_options()["max_ongoing_requests"])
            if can.priority_scheduling and self.task == "generate":  # interactive requests before Batch API rows
                kwargs.setdefault("scheduling_policy", "priority")
            engine = create_engine(name, resolved.path, task=self.task, engine_kwargs=kwargs,
                                   chat_template_kwargs=config.chat_template_kwargs, workload="serve")
            engine.start()
        else:
            self.task = config.task if config.task != "auto" else getattr(engine, "tasks", ("generate",))[0]
        self.engine = engine
        self.adapters = tuple(config.lora_adapters)  # served as model ids of their own
        self.reads_images = bool(getattr(engine, "reads_images", False))
        self.default_sampling = model_sampling_defaults(getattr(engine, "model_path", None))  # as `vllm serve`
        self.stream_budget = config.stream_budget()
        self.fatal: str | None = None
        self.ongoing = 0
        self.replica_id = "local"  # the Ray Serve replica's id when deployed (sent as x-fleetllm-replica)
        # vLLM's serving metrics (fleetllm.serve.vllm_metrics): vLLM keeps its own; other engines get them here
        from fleetllm.engines.capabilities import declared_by
        from fleetllm.serve.vllm_metrics import EngineMetrics

        self.vllm_metrics = None if declared_by(engine).reports_engine_metrics else EngineMetrics(self.model_id)

    def metrics_snapshot(self) -> str:
        """This replica's `vllm:` metrics as Prometheus text (vLLM's own where the engine is vLLM)."""
        from fleetllm.serve.vllm_metrics import replica_stats, vllm_own_snapshot

        if self.vllm_metrics is None:
            return vllm_own_snapshot()
        return self.vllm_metrics.snapshot(*replica_stats(self.stats(snapshot=False)))

    def publish_metrics(self) -> None:
        """In a Ray Serve replica (replica_id set): publish the snapshot for every replica's /metrics."""
        from fleetllm.serve.vllm_metrics import Publisher

        Publisher(self.model_id, self.replica_id, self.metrics_snapshot)

    @property
    def max_model_len(self) -> int | None:
        return self.engine.max_model_len

    def healthy(self) -> bool:
        failure = self.engine.streaming_failure()  # the transformers streaming loop, once started
        if failure is not None:
            self.fatal = self.fatal or failure
        if getattr(self.engine, "model", True) is None:
            self.fatal = self.fatal or "the engine was stopped"
        return self.fatal is None

    def stats(self, snapshot: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"ongoing": self.ongoing, "healthy": self.healthy()}
        out.update(self.engine.streaming_stats())
        if snapshot:
            out["vllm_metrics"] = self.metrics_snapshot()
        return out

    def stream_gap(self) -> float:
        """Seconds between two messages of one stream, now (grows with the streams in flight)."""
        return max(STREAM_INTERVAL_S, self.ongoing / self.stream_budget)

    async def embed(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Embed payload["items"] ({text} or {token_ids} each): {"vectors", "prompt_tokens"}, or an error item
        (400 naming the first input the engine refused, 503 when the engine died)."""
        from fleetllm.engines.base import EmbeddingRequest

        if not self.healthy():
            return error_item(503, f"model {self.model_id!r} is unavailable: {self.fatal}", "engine_dead")
        try:
            requests = [EmbeddingRequest(text=it.get("text"), token_ids=it.get("token_ids"),
                                         dimensions=payload.get("dimensions"),
                                         request_id=f"{payload.get('request_id', 'emb')}-{i}")
                        for i, it in enumerate(payload["items"])]
        except RowError as exc:
            return error_item(400, str(exc))
        self.ongoing += 1
        try:
            results = await self.engine.aembed(requests)
        except EngineError as exc:
            self.fatal = str(exc)
            return error_item(503, str(exc), "engine_error")
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            return error_item(500, f"{type(exc).__name__}: {exc}", "internal_error")
        finally:
            self.ongoing -= 1
        for i, res in enumerate(results):
            if res.error is not None:
                where = f"input[{i}]: " if len(results) > 1 else ""
                return error_item(400, where + res.error)
        return {"vectors": [r.embedding for r in results], "prompt_tokens": sum(r.num_input_tokens for r in results)}

    async def _request(self, payload: dict[str, Any]) -> tuple[GenerationRequest, dict[str, Any] | None]:
        """The engine request (unset sampling fields from the model's defaults, as `vllm serve`) and, for
        echo, the prompt's text and logprobs; RowError (a FieldError naming the field) when refused."""
        if payload.get("prompt_token_ids") is not None:  # a token-id prompt: ids in the vocabulary
            check_prompt_ids(payload["prompt_token_ids"], self.engine.vocab_size)
        messages, images = await served_images(payload.get("messages"))
        request = GenerationRequest(messages=messages, prompt=payload.get("prompt"),
                                    prompt_token_ids=payload.get("prompt_token_ids"),
                                    sampling=with_defaults(payload.get("sampling") or {}, self.default_sampling),
                                    chat_template_kwargs=payload.get("chat_template_kwargs") or {},
                                    request_id=payload.get("request_id", ""),
                                    priority=int(payload.get("priority") or 0),
                                    images=images or None, adapter=payload.get("adapter"))
        echo = await asyncio.to_thread(echo_item, self.engine, payload) if payload.get("echo") else None
        return request, echo

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield lists of delta dicts; a request the engine refuses yields one error item."""
        if not self.healthy():
            yield [error_item(503, f"model {self.model_id!r} is unavailable: {self.fatal}", "engine_dead")]
            return
        try:
            request, echo = await self._request(payload)
        except RowError as exc:
            yield [error_item(400, str(exc), param=getattr(exc, "param", None))]
            return
        self.ongoing += 1
        details = self.config.enable_prompt_tokens_details  # usage.prompt_tokens_details, as vLLM's flag
        buf: list[dict[str, Any]] = []
        wake = asyncio.Event()
        state: dict[str, Any] = {"done": False, "error": None}

        seen = RequestSeen(time.monotonic())
        trace = new_trace()  # FLEETLLM_STREAM_TRACE: per-token timestamps (fleetllm.serve.stream_trace)

        async def pump() -> None:
            try:
                async for delta in self.engine.generate_stream(request):
                    seen.add(delta)
                    item = dict(vars(delta))  # shallow: each delta is new (asdict's deep copy: ~7 us a token)
                    trace.delta(item.pop("emitted_at"))
                    item["num_cached_tokens"] = (item.get("num_cached_tokens") or 0) if details else None
                    buf.append(item)
                    wake.set()
            except RequestFailed as exc:  # the engine failed on this request only: it goes on serving
                state["error"] = error_item(500, str(exc), "request_failed")
            except FieldError as exc:
                state["error"] = error_item(400, str(exc), param=exc.param)
            except (RowError, ValueError) as exc:
                state["error"] = error_item(400, str(exc))
            except EngineError as exc:  # only this marks the replica dead (Ray Serve restarts it)
                self.fatal = str(exc)
                state["error"] = error_item(503, str(exc), "engine_error")
            except FleetError as exc:
                state["error"] = error_item(400, str(exc))
            except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
                state["error"] = error_item(500, f"{type(exc).__name__}: {exc}", "internal_error")
            finally:
                if self.vllm_metrics is not None:
                    seen.record(self.vllm_metrics, ok=state["error"] is None)
                state["done"] = True
                wake.set()

        task = asyncio.create_task(pump())
        last = 0.0
        first = True
        try:
            while True:
                await wake.wait()
                wake.clear()
                wait = last + self.stream_gap() - time.monotonic()
                if last and wait > 0 and not state["done"]:
                    await asyncio.wait({task}, timeout=wait)  # merge what arrives; the request's end cuts it short
                if buf:
                    items, buf[:] = list(buf), []
                    if first:  # which replica answers (the API's x-fleetllm-replica header)
                        items[0]["replica"], items[0]["echo"], first = self.replica_id, echo, False
                    last = time.monotonic()
                    trace.sent(len(items))
                    yield items
                if state["done"]:
                    if state["error"] is not None:
                        yield [state["error"]]
                    return
        finally:
            self.ongoing -= 1
            trace.write()
            if not task.done():  # the caller went away: closing the engine stream cancels the request
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001
                    pass


class RequestSeen:
    """What one served request's deltas said, for vLLM's request metrics (fleetllm.serve.vllm_metrics)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.prompt = 0
        self.generated: dict[int, int] = {}
        self.finish: str | None = None

    def add(self, delta) -> None:
        if self.first is None and delta.num_generated_tokens:
            self.first = time.monotonic()
        self.prompt = max(self.prompt, delta.num_input_tokens)
        self.generated[delta.index] = delta.num_generated_tokens
        self.finish = delta.finish_reason or self.finish

    def record(self, metrics, ok: bool) -> None:
        metrics.request(self.started, self.first, time.monotonic(), self.prompt, sum(self.generated.values()),
                        self.finish if ok else None)


class LocalBackend:
    """A ModelServer in this process, with the same bounded admission as a Ray Serve replica."""

    def __init__(self, server: ModelServer, max_ongoing_requests: int = 32, max_queued_requests: int = 64,
                 retry_after_s: float = 1.0) -> None:
        self.server = server
        self.model_id = server.model_id
        self.task = server.task
        self.adapters = server.adapters
        self.reads_images = server.reads_images
        self.capacity = max_ongoing_requests + max_queued_requests
        self.retry_after_s = retry_after_s
        self.admitted = 0

    @property
    def max_model_len(self) -> int | None:
        return self.server.max_model_len

    async def stream(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        if self.admitted >= self.capacity:
            raise overloaded(f"model {self.model_id!r} has {self.admitted} requests in flight (limit "
                             f"{self.capacity}); retry later", 429, self.retry_after_s)
        self.admitted += 1
        try:
            async for items in self.server.stream(payload):
                yield items
        finally:
            self.admitted -= 1

    async def embed(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.admitted >= self.capacity:
            raise overloaded(f"model {self.model_id!r} has {self.admitted} requests in flight (limit "
                             f"{self.capacity}); retry later", 429, self.retry_after_s)
        self.admitted += 1
        try:
            return await self.server.embed(payload)
        finally:
            self.admitted -= 1

    async def stats(self) -> dict[str, Any]:
        return self.server.stats()

    async def healthy(self) -> bool:
        return self.server.healthy()


def raise_item_error(items: list[dict[str, Any]]) -> None:
    """Turn an in-band error item into an APIError."""
    for item in items:
        err = item.get("error")
        if err:
            status = int(err["status"])
            kind = {400: "invalid_request_error", 503: "service_unavailable"}.get(status, "server_error")
            raise APIError(status, err["message"], type=kind, param=err.get("param"), code=err.get("code"))
