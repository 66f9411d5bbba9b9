"""Live progress of a batch job: rows done/total, rows/s, output tokens/s, ETA.

The ETA is the estimate model's (`eta`: fleetllm.batch.reports.estimate_live, tokens left at the measured
rates) when the run has one, else the rows left at the rows/s so far.

On a terminal a rich progress bar; elsewhere (CI, logs, a subprocess) one plain line every
`interval_s` seconds, so a long job still shows it is alive.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class JobProgress:
    def __init__(self, total_rows: int, skipped_rows: int = 0, label: str = "rows",
                 interval_s: float = 10.0, console: Console | None = None,
                 eta: Callable[[int, int], float | None] | None = None) -> None:
        self.total = total_rows
        self.skipped = skipped_rows
        self.done = 0  # rows computed in this run
        self.output_tokens = 0
        self.errors = 0
        self.eta = eta  # (rows computed, output tokens) -> seconds left
        self.eta_s: float | None = None
        self.prompt_tokens = 0  # of rows whose engine reports prefix-cache hits
        self.cached_tokens: int | None = None
        self.start = time.monotonic()
        self.interval_s = interval_s
        self._last_line = self.start
        self.wait_note: str | None = None  # what the engine waits for (a Retry-After...), until rows come
        self._last_note = float("-inf")
        self.lock = threading.Lock()  # the ETA state: advance, observe (committing); refresh (a tick on Ray)
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self._progress = None
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=self.console,
            )
            self._task = self._progress.add_task(label, total=total_rows, completed=skipped_rows,
                                                 rate=self._rates())
            self._progress.start()
        if skipped_rows:
            self.console.print(f"resuming: {skipped_rows} rows already committed are skipped")

    def _rates(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        return (f"{self.done / elapsed:.1f} rows/s  {self.output_tokens / elapsed:.0f} tok/s"
                + (f"  prefix cache {self.cached_tokens / self.prompt_tokens:.0%}"
                   if self.cached_tokens is not None and self.prompt_tokens else "")
                + (f"  {self.errors} errors" if self.errors else "")
                + (f"  ({self.wait_note})" if self.wait_note else ""))

    def waiting(self, note: str) -> None:
        """The engine waits (a backoff, a server's Retry-After): say what for on the progress line (on a
        plain stream: at once, then at most once per interval), until the next rows arrive."""
        self.wait_note = note
        if self._progress is not None:
            self._progress.update(self._task, rate=self._rates())
        elif time.monotonic() - self._last_note >= self.interval_s:
            self._last_note = time.monotonic()
            self.console.print(self.line())

    def advance(self, rows: int, output_tokens: int, errors: int = 0, prompt_tokens: int = 0,
                cached_tokens: int | None = None) -> None:
        """`cached_tokens`: of the `prompt_tokens`, those the engine found in its prefix cache (None: not said)."""
        with self.lock:
            self._advance(rows, output_tokens, errors, prompt_tokens, cached_tokens)

    def _advance(self, rows: int, output_tokens: int, errors: int, prompt_tokens: int,
                 cached_tokens: int | None) -> None:
        self.done += rows
        self.wait_note = None
        self.output_tokens += output_tokens
        self.errors += errors
        if cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached_tokens
            self.prompt_tokens += prompt_tokens
        if self.eta is not None:
            self.eta_s = self.eta(self.done, self.output_tokens)
        if self._progress is not None:
            model_eta = f"  ETA {self.eta_s:.0f}s (model)" if self.eta_s is not None else ""
            self._progress.update(self._task, advance=rows, rate=self._rates() + model_eta)
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            self.console.print(self.line())

    def refresh(self) -> None:
        """Between commits (a tick): the model's ETA again, from the engines' work on the rows they hold;
        shown as advance shows it."""
        if self.eta is None:
            return
        with self.lock:
            eta = self.eta(self.done, self.output_tokens)
            if eta is None:
                return
            self.eta_s = eta
        if self._progress is not None:
            self._progress.update(self._task, rate=self._rates() + f"  ETA {eta:.0f}s (model)")
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            self.console.print(self.line())

    def line(self) -> str:
        finished = self.done + self.skipped
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = self.done / elapsed
        eta = self.eta_s if self.eta_s is not None else (self.total - finished) / rate if rate > 0 else float("nan")
        return f"{finished}/{self.total} rows  {self._rates()}  ETA {eta:.0f}s"

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        else:
            self.console.print(self.line())
        sys.stderr.flush()
