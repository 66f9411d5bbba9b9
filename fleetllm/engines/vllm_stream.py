"""Streaming one request through vLLM (VLLMEngine.generate_stream): its outputs reach the caller as they come,
each stamped when it left vLLM (the serving path's trace). In a serving replica vLLM's client lives on the serving
loop itself (no hop between threads); elsewhere the request runs on the engine's loop and crosses to the caller's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import time
from typing import Any, AsyncIterator

from fleetllm.engines.base import GenerationRequest, StreamDelta
from fleetllm.engines.chat import prompt_chars
from fleetllm.engines.vllm_outputs import logprob_entries
from fleetllm.errors import EngineError, RowError

# Prompts longer than OFFLOAD_CHARS are templated and tokenized off the caller's event loop when streaming, as `vllm
# serve` tokenizes in a thread: in a serving replica that loop also runs vLLM's output handler and every stream's
# writes, and the tokenizer holds the thread that calls it for the whole call (its Rust half lets other threads run,
# not the caller). Lease 17 (one H100, c=32 of 1,024-token prompts, py-spy of the replica): 12% of the loop's busy
# time was tokenizing, ~5 ms a request, so 8 requests arriving together held every stream ~40 ms (ITL p99 28-33 ms
# against `vllm serve`'s 12). A prompt this short tokenizes in well under a millisecond, less than a thread hop.
# They go to one worker thread of the engine's, in arrival order, as vLLM's renderer does (its tokenizer pool keeps
# copies for a worker or two; more threads at once would deep-copy the tokenizer on the spot). Prompts over
# HUGE_CHARS and prompts with images go to asyncio's own pool instead, so a 5 MB prompt never queues the others.
# FLEETLLM_OFFLOAD_CHARS: for A/B runs (serve_gpu.py +onloop).
OFFLOAD_CHARS = int(os.environ.get("FLEETLLM_OFFLOAD_CHARS", "512"))
HUGE_CHARS = 32_768


class VLLMStreaming:
    """VLLMEngine's streaming half; the engine gives `_llm`, `_prepare`, `_submit`, `_request_id` and `_failure`, and
    calls `_stop_prepare_thread` when it stops."""

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Stream one request; closing the generator (or cancelling its task) aborts it in vLLM.

        Raises RowError for a request that cannot be served (prompt too long, bad sampling option).
        """
        if self._llm is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        chars = prompt_chars(request)
        if chars > HUGE_CHARS or request.images:  # off the event loop, beside the others (OFFLOAD_CHARS)
            prompt, params, lora = await asyncio.to_thread(self._prepare, request, True)
        elif chars > OFFLOAD_CHARS:  # off the event loop, on the engine's one prepare thread
            prepare = functools.partial(self._prepare, request, True)
            prompt, params, lora = await asyncio.get_running_loop().run_in_executor(self._prepare_thread(), prepare)
        else:
            prompt, params, lora = self._prepare(request, delta=True)
        extra = {"priority": request.priority} if request.priority else {}  # needs scheduling_policy: priority
        outputs = self._outputs(prompt, params, self._request_id(request), lora, extra)
        counts: dict[int, int] = {}
        async with contextlib.aclosing(outputs):  # closing it aborts the request in vLLM
            async for item, emitted_at in outputs:
                for out in item.outputs:
                    counts[out.index] = counts.get(out.index, 0) + len(out.token_ids)
                    finish = out.finish_reason if out.finish_reason in ("stop", "length") else None
                    if out.finish_reason is not None and finish is None:
                        raise RowError(f"vLLM ended the request ({out.finish_reason})")
                    yield StreamDelta(
                        index=out.index, text=out.text, num_generated_tokens=counts[out.index],
                        finish_reason=finish,
                        num_input_tokens=len(item.prompt_token_ids or prompt.get("prompt_token_ids") or []),
                        logprobs=logprob_entries(out.token_ids, out.logprobs, params.logprobs),
                        num_cached_tokens=item.num_cached_tokens, emitted_at=emitted_at,
                    )

    def _prepare_thread(self) -> concurrent.futures.ThreadPoolExecutor:
        """The engine's one thread that templates and tokenizes streamed prompts (made on first use; stop() ends it)."""
        pool = getattr(self, "_prepare_pool", None)
        if pool is None:
            pool = self._prepare_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fleetllm-prepare")
        return pool

    def _stop_prepare_thread(self) -> None:
        pool, self._prepare_pool = getattr(self, "_prepare_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # a prompt being tokenized finishes (milliseconds)

    async def _outputs(self, prompt: dict, params: Any, request_id: str, lora: Any,
                       extra: dict) -> AsyncIterator[tuple[Any, float]]:
        """vLLM's outputs of one request, each with the moment it left vLLM. Where vLLM's client lives on this
        loop (a serving replica: VLLMEngine._serving_loop) they come straight from it; else the request runs on
        the engine's loop and its outputs cross to this one through a queue. Closing this aborts the request."""
        if self._loop is not None and self._loop.loop is asyncio.get_running_loop():
            try:
                async for out in self._llm.generate(prompt, params, request_id, lora_request=lora, **extra):
                    yield out, time.monotonic()
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                raise self._failure(exc) from exc
            return
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump() -> None:  # runs on the engine's loop
            try:
                async for out in self._llm.generate(prompt, params, request_id, lora_request=lora, **extra):
                    caller.call_soon_threadsafe(queue.put_nowait, (out, time.monotonic()))
                caller.call_soon_threadsafe(queue.put_nowait, done)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                caller.call_soon_threadsafe(queue.put_nowait, exc)

        future = self._submit(pump())
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, Exception):
                    raise self._failure(item) from item
                yield item
        finally:
            if not future.done():
                future.cancel()  # cancels pump() on the engine loop; vLLM's generate() then aborts the request
