"""Streaming one request through vLLM (VLLMEngine.generate_stream): its outputs reach the caller as they come,
each stamped when it left vLLM (the serving path's trace). In a serving replica vLLM's client lives on the serving
loop itself (no hop between threads); elsewhere the request runs on the engine's loop and crosses to the caller's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

from fleetllm.engines.base import GenerationRequest, StreamDelta
from fleetllm.engines.chat import prompt_chars
from fleetllm.engines.vllm_outputs import logprob_entries
from fleetllm.errors import EngineError, RowError

# Prompts longer than this (characters) are templated and tokenized in a worker thread when streaming,
# not on the caller's event loop (a 5 MB prompt stalled every other request of the replica for seconds).
OFFLOAD_CHARS = 32_768


class VLLMStreaming:
    """VLLMEngine's streaming half; the engine gives `_llm`, `_prepare`, `_submit`, `_request_id` and `_failure`."""

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Stream one request; closing the generator (or cancelling its task) aborts it in vLLM.

        Raises RowError for a request that cannot be served (prompt too long, bad sampling option).
        """
        if self._llm is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        if prompt_chars(request) > OFFLOAD_CHARS or request.images:  # long prompts, images: off the event loop
            prompt, params, lora = await asyncio.to_thread(self._prepare, request, True)
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
