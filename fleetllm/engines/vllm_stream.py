"""Streaming one request through vLLM (VLLMEngine.generate_stream): the request runs on the engine's loop and its
outputs reach the caller's loop as they come, each stamped when it left vLLM (the serving path's trace)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

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
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        request_id = self._request_id(request)

        extra = {"priority": request.priority} if request.priority else {}  # needs scheduling_policy: priority

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
        counts: dict[int, int] = {}
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, Exception):
                    raise self._failure(item) from item
                item, emitted_at = item
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
        finally:
            if not future.done():
                future.cancel()  # cancels pump() on the engine loop; vLLM's generate() then aborts the request
