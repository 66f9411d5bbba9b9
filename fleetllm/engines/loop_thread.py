"""An asyncio event loop on a daemon thread, for engines whose client is async (vLLM's AsyncLLM, the
openai client) behind the synchronous Engine interface: the caller's threads submit coroutines to it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine


class LoopThread:
    """Starts the loop on construction; `submit` (a concurrent.futures.Future) or `run` (its result)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.submit(coro).result()

    def close(self, timeout_s: float = 10) -> None:
        """Stop the loop, wait for its thread (at most timeout_s), close it."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout_s)
        self.loop.close()


class CallerLoop:
    """LoopThread's interface over a loop that already runs on its owner's thread (a Ray Serve replica's serving
    loop): an async client created there (vLLM's AsyncLLM) hands each output to the serving code on the same
    thread, with no hop between threads, as `vllm serve`'s API process does. `run` from that thread would wait on
    itself: an error instead of a hang."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._thread = threading.get_ident()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def on_own_thread(self) -> bool:
        return threading.get_ident() == self._thread

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self.on_own_thread():
            coro.close()
            raise RuntimeError("a blocking engine call on the serving loop's own thread would wait on itself; "
                               "await the engine's async methods there (or call from another thread)")
        return self.submit(coro).result()

    def close(self, timeout_s: float = 10) -> None:
        """Nothing to stop: the loop belongs to its owner."""


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
