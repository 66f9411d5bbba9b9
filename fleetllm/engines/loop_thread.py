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
