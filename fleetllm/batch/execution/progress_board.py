"""The replicas' engine progress for the driver's live ETA on the Ray path.

The in-process run reads its engine's progress directly (local_run: `Engine.progress`). On Ray the engines live
in the replica actors and their rows come back only complete, so a job whose rows the replicas hold at once
showed no progress until its end. Here each replica (EngineStage) reports its engine's progress to one small
actor of the run every REPORT_S (a fire-and-forget call from a thread), and the driver's tick reads the sum: rows
and tokens finished, the running sequences' tokens so far, and the first replica's ready time.
"""

from __future__ import annotations

import threading
from typing import Any

from fleetllm.engines.base import EngineProgress

REPORT_S = 1.0  # how often a replica reports
READ_TIMEOUT_S = 2.0  # the driver's read gives up past this (the ETA waits for the next tick)


class Board:
    """The actor's class: the latest report of each replica."""

    def __init__(self) -> None:
        self.by_replica: dict[str, tuple] = {}

    def report(self, replica: str, ready_at: float, finished: int, finished_tokens: int,
               running: list[int]) -> None:
        self.by_replica[replica] = (ready_at, finished, finished_tokens, tuple(running))

    def read(self) -> list[tuple]:
        return list(self.by_replica.values())


def open_board() -> Any:
    """The run's board (an actor of no CPU, on the driver's node, gone with the driver's Ray job)."""
    import ray

    return ray.remote(num_cpus=0)(Board).remote()


class BoardEngine:
    """What RunEstimate.watch reads from an engine, summed over the replicas' reports on the board."""

    default_max_num_seqs = None  # the profile's stands (replicas report only their work)
    prefix_block_tokens = None
    start_compile_s = None

    def __init__(self, board: Any) -> None:
        self.board = board
        self.ready_at: float | None = None

    def read(self) -> EngineProgress | None:
        """The sum of the replicas' reports (None before any, or when the board does not answer in time);
        `ready_at` becomes the first replica's ready time."""
        import ray

        try:
            reports = ray.get(self.board.read.remote(), timeout=READ_TIMEOUT_S)
        except Exception:  # a slow or gone board: no progress this tick
            return None
        if not reports:
            return None
        self.ready_at = min(r[0] for r in reports)
        return EngineProgress(sum(r[1] for r in reports), sum(r[2] for r in reports),
                              tuple(t for r in reports for t in r[3]))

    def progress(self) -> EngineProgress | None:
        return self.read()


class Reporter:
    """In a replica: its engine's progress to the board every REPORT_S, from a daemon thread (gone with the
    actor). Engines that do not count their progress (Engine.progress None) report nothing."""

    def __init__(self, board: Any, replica: str, ready_at: float, engine: Any, every_s: float = REPORT_S) -> None:
        self.board, self.replica, self.ready_at, self.engine, self.every_s = board, replica, ready_at, engine, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetllm-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import ray

        while not self._stop.wait(self.every_s):
            if not ray.is_initialized():  # Ray shut down here: a call would start a new one
                return
            try:
                p = self.engine.progress()
                if p is not None:
                    self.board.report.remote(self.replica, self.ready_at, p.finished, p.finished_tokens,
                                             list(p.running))
            except Exception:  # noqa: BLE001 - the engine stopping, the board gone: this report is skipped
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
