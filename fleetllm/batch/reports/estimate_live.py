"""A run's estimate: made at the start (kept in run.json beside what happened), the progress ETA from
the same model, and the run's own engine calls and output lengths added to the profile and the job's
lengths under $FLEETLLM_HOME when it ends (the calls of its first OBSERVE_S seconds).
"""

from __future__ import annotations

import time
from typing import Any

from fleetllm.batch.execution.telemetry import run_field
from fleetllm.batch.reports.estimate_job import (
    batching,
    estimate_plan,
    executor,
    job_key,
    job_shape,
    layout,
    profile_key,
)
from fleetllm.estimate import store
from fleetllm.estimate.estimate import Eta
from fleetllm.estimate.model import CONTINUOUS
from fleetllm.estimate.observe import (
    call_from_rows,
    group_calls,
    output_lengths,
    window_from_calls,
)

OBSERVE_S = 300.0  # engine calls kept from a run's first minutes
# seconds since start, rows committed, the ETA; what it was computed from: rows and output tokens done (the engine's
# count where it gives one), sequences running and their output tokens so far
LOG_COLUMNS = ("t_s", "rows_done", "eta_s", "rows_counted", "output_tokens_counted", "running", "running_tokens")
LOG_EVERY = 1 / 200  # between commits, an ETA point per this share of the time run so far
KEEP_COLUMNS = ("error", "_run", "num_input_tokens", "num_generated_tokens", "_cached_tokens", "sampling_params")


class RunEstimate:
    """`shape` None: the job's shape (its prompts tokenized in this process) is made at the first
    commit, once the engine runs, so a run's start waits for no tokenizer; the profile is the one the
    run started with either way (this run's calls are added only when it ends)."""

    def __init__(self, plan, t0: float, shape=None) -> None:
        self.plan, self.t0, self.shape = plan, t0, shape
        self.key = profile_key(plan)
        self.default_n = int(plan.request_sampling().get("n") or 1)  # rows without their own sampling run with it
        profile = store.load_profile(self.key)
        self.rates = profile.rates() if profile is not None and profile.calls else None
        self.default_seqs = profile.max_num_seqs if profile is not None else None
        self.prefix_block = profile.prefix_block if profile is not None else None
        self.compile_s: float | None = None  # the in-process engine's start (watch); None on Ray replicas
        self.at_start: dict[str, Any] | None = None
        self.eta_model: Eta | None = None
        if shape is not None:
            self._made()
        self.ready: float | None = None
        self.calls: list = []  # fleetllm.estimate.observe.CallRows
        self.lengths: list[int] = []
        self.log: list[list[float]] = []  # LOG_COLUMNS at each ETA
        self.engine_progress = None  # () -> EngineProgress | None: the in-process engine's (watch())

    def _made(self) -> None:
        if self.eta_model is None:
            self.shape = self.shape or job_shape(self.plan)
            self.at_start = estimate_plan(self.plan, self.shape)
            self.eta_model = Eta(self.shape, layout(self.plan, default_seqs=self.default_seqs), self.rates)

    def observe(self, table) -> None:
        """A batch of rows back from the replicas (pyarrow), before it is committed."""
        self._made()
        cols = [c for c in KEEP_COLUMNS if c in table.column_names]
        rows = table.select(cols).to_pylist()
        readies = [ready for ready in run_field(table, "ready") if ready]
        if readies:
            self.ready = min([self.ready or readies[0], *readies])
        self.lengths += output_lengths(rows, self.default_n)
        if self.ready is not None and time.time() - self.ready <= OBSERVE_S:
            self.calls.extend(group_calls(rows, self.default_n))

    def watch(self, engine, ready_at: float | None = None) -> None:
        """The run's engine, called once it is ready (`ready_at`): in this process (fleetllm.batch.execution.
        local_run), or on Ray the sum of the replicas' reports (progress_board.BoardEngine). The ETA also reads
        the work done on rows not committed yet (Engine.progress; None from engines that do not count it), so
        it has one before the first commit (a job the engine holds at once commits only at its end)."""
        if ready_at is not None and self.ready is None:
            self.ready = ready_at
        self.engine_progress = engine.progress
        self.default_seqs = engine.default_max_num_seqs or self.default_seqs  # kept in the profile (learn)
        self.prefix_block = engine.prefix_block_tokens or self.prefix_block
        self.compile_s = engine.start_compile_s  # whether the run's start compiled (learn)

    def eta(self, rows_done: int, output_tokens_done: int) -> float | None:
        """Seconds left, from the model (progress.JobProgress calls it after each commit). With the
        engine's progress: the rows it finished (committed or not: a shard commits once all its rows are)
        and the tokens of those still running count as done."""
        if self.ready is None:
            return None
        self._made()  # before the first commit when the engine's progress is read (tick)
        now = time.time()
        live = self.engine_progress() if self.engine_progress is not None else None
        running: tuple[int, ...] = ()
        rows, tokens = rows_done, output_tokens_done
        if live is not None:
            rows, tokens, running = max(rows, live.finished), max(tokens, live.finished_tokens), live.running
        left = self.eta_model.seconds_left(rows, tokens, now - self.ready, running)
        if left is not None and self._logs(now, rows_done):
            self.log.append([round(now - self.t0, 3), rows_done, round(left, 2), rows, tokens, len(running),
                             sum(running)])
        return left

    def _logs(self, now: float, rows_done: int) -> bool:
        """Every ETA after a commit is logged; between commits (ticks) one per LOG_EVERY of the run so far
        (at least 1 s apart), so a long run's run.json keeps a few hundred points, not one per tick."""
        if not self.log or self.log[-1][1] != rows_done:
            return True
        since = now - self.t0
        return since - self.log[-1][0] >= max(1.0, since * LOG_EVERY)

    def finish(self, report: dict[str, Any]) -> None:
        """run.json's `estimate` (at the start, what happened, the ETAs shown), then the profile and the
        job's lengths are updated."""
        self._made()
        timeline = report.get("timeline_s", {})
        start = timeline.get("t0", 0.0)
        report["estimate"] = {
            "at_start": self.at_start,
            "actual": {"wall_s": report.get("wall_time_s"), "output_tokens": report.get("output_tokens_computed"),
                       "prompt_tokens": report.get("prompt_tokens"),
                       "cached_prompt_tokens": report.get("cached_prompt_tokens"),
                       "rows": report.get("rows_computed"),
                       "generation_end_s": (round(timeline["last_commit"] - start, 3)
                                            if "last_commit" in timeline else None)},
            "eta_log": {"columns": list(LOG_COLUMNS), "points": self.log},
        }
        try:
            self.learn(report, timeline)
        except OSError as exc:  # a read-only home: the run's result stands
            report["estimate"]["profile_not_updated"] = str(exc)

    def learn(self, report: dict[str, Any], timeline: dict[str, float]) -> None:
        if self.plan.task != "generate" or not self.calls:
            return
        kind = batching(self.plan.engine)
        if kind == CONTINUOUS:
            by_replica: dict = {}
            for c in self.calls:
                by_replica.setdefault(c.replica, []).append(c)
            observed = [w for group in by_replica.values() if (w := window_from_calls(group)) is not None]
        else:
            observed = [call_from_rows(c, kind) for c in self.calls]
        profile = store.load_profile(self.key) or store.Profile(self.key, kind)
        profile.max_num_seqs = self.default_seqs or profile.max_num_seqs
        profile.prefix_block = self.prefix_block or profile.prefix_block
        startup = (timeline["engine_ready"] - timeline["engine_start"]
                   if "engine_ready" in timeline and "engine_start" in timeline else None)
        gen_end = timeline.get("last_commit")
        overhead = None
        if startup is not None and gen_end is not None and report.get("wall_time_s"):
            overhead = report["wall_time_s"] - (gen_end - timeline["engine_ready"]) - startup
        where = executor(self.plan)
        profile.add(observed, {"kind": "run", "job": self.plan.spec.name, "rows": report.get("rows_computed"),
                               "executor": where}, startup, overhead, self.compile_s, where)
        store.save_profile(profile)
        store.save_lengths(job_key(self.plan), self.lengths, "previous run", self.plan.spec.name)
