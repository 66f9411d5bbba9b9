"""EngineStarter.wait_core_started: the shard threads of an in-process vLLM run start preparing once the
engine's child process (vLLM's engine core) is up, or once the start has ended, never before."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from fleetllm.batch.execution.local_run import EngineStarter


def _core(stop) -> None:
    stop.wait(30)


class ForksThenWaits:
    """Like vLLM's LLM(): Python work first (here a sleep), then a child process, then waits on it."""

    before_fork_s = 0.6
    forked_at: float | None = None

    def __init__(self, node_id: str, release: threading.Event) -> None:
        time.sleep(self.before_fork_s)
        stop = multiprocessing.get_context("fork").Event()
        self.proc = multiprocessing.get_context("fork").Process(target=_core, args=(stop,), daemon=True)
        self.proc.start()
        type(self).forked_at = time.monotonic()
        release.wait(30)  # the engine's "ready" comes later
        stop.set()
        self.proc.join(10)
        self.ready_at = time.monotonic()


class FailsBeforeFork:
    def __init__(self, node_id: str) -> None:
        time.sleep(0.3)
        raise RuntimeError("no GPU here")


def test_wait_returns_once_the_child_runs_not_when_the_engine_is_ready() -> None:
    release = threading.Event()
    started = time.monotonic()
    starter = EngineStarter(ForksThenWaits, {"release": release})
    starter.wait_core_started()
    waited_until = time.monotonic()
    try:
        assert ForksThenWaits.forked_at is not None, "returned before the engine started its child"
        assert waited_until >= ForksThenWaits.forked_at
        assert waited_until - started >= ForksThenWaits.before_fork_s
        assert starter._thread.is_alive(), "waited for the whole start instead of the fork"
    finally:
        release.set()
    stage = starter.stage()
    assert stage.ready_at >= waited_until
    assert not multiprocessing.active_children()


def test_wait_returns_when_the_start_fails_without_a_child() -> None:
    starter = EngineStarter(FailsBeforeFork, {})
    starter.wait_core_started()  # returns: the thread ended
    with pytest.raises(RuntimeError, match="no GPU here"):
        starter.stage()


def test_a_child_the_caller_already_had_does_not_count() -> None:
    stop = multiprocessing.get_context("fork").Event()
    mine = multiprocessing.get_context("fork").Process(target=_core, args=(stop,), daemon=True)
    mine.start()
    release = threading.Event()
    try:
        ForksThenWaits.forked_at = None
        starter = EngineStarter(ForksThenWaits, {"release": release})
        starter.wait_core_started()
        assert ForksThenWaits.forked_at is not None, "the caller's own child was taken for the engine core"
    finally:
        release.set()
        stop.set()
        mine.join(10)
    starter.stage()
