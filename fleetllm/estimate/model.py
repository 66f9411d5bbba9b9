"""The throughput model: an engine's step time fitted from observed engine calls, and the time a
job's work takes under it. Pure: no I/O, no engine, no Ray.

One engine call (a batch of sequences) takes

    seconds = c0 * calls + c1 * prefill_tokens + c2 * steps + c3 * seq_steps + c4 * ctx_steps / 1000

- `prefill_tokens`: prompt tokens computed (not found in the prefix cache): the prefill rate is 1 / c1;
- `steps`: decode steps (forward passes: the longest output of the call), c2 the fixed cost of a step
  (weights read once per step, the memory-bound floor);
- `seq_steps`: sequence-steps (each sequence's share of a step: on a static-batch engine every row of
  the call for every step, padding included; on a continuous-batching engine each row for its own
  output length), c3 the per-sequence cost of a step;
- `ctx_steps`: the context each sequence-step attends over, c4 its cost (attention grows with it).

So the decode rate at batch size b and context length L is b / (c2 + c3 b + c4 b L / 1000) tokens/s:
the shape of the step time. The coefficients are fitted by non-negative least squares on relative
error (scipy.optimize.nnls), so a 1-second call counts as much as a 60-second one.

Example:
    >>> calls = [Call(1, 100 * b, 32, 32 * b, 32 * b * 116, 0.05 + 32 * (0.01 + 0.002 * b)) for b in (1, 4, 16)]
    >>> rates = fit(calls)
    >>> round(predict_call(rates, Call(1, 800, 32, 256, 256 * 116, 0)), 2)
    0.88
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

COEFFICIENTS = ("per_call_s", "per_prefill_token_s", "per_step_s", "per_seq_step_s", "per_ctx_kstep_s")
STATIC, CONTINUOUS = "static", "continuous"  # how the engine batches (transformers: static; vllm: continuous)


@dataclass(frozen=True)
class Call:
    """One observed (or planned) engine call, or for a continuous-batching engine a window of calls."""

    calls: int
    prefill_tokens: float
    steps: float
    seq_steps: float
    ctx_steps: float
    seconds: float

    def features(self) -> list[float]:
        return [self.calls, self.prefill_tokens, self.steps, self.seq_steps, self.ctx_steps / 1000.0]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Rates:
    """The fitted coefficients (seconds per unit of each feature) and the fit's relative error."""

    coef: tuple[float, ...]
    rel_error: float  # root mean square of (predicted - observed) / observed over the fitted calls
    calls: int  # observations fitted

    def as_dict(self) -> dict:
        return {"coefficients": dict(zip(COEFFICIENTS, self.coef)), "rel_error": self.rel_error,
                "calls_fitted": self.calls}

    def prefill_tokens_per_s(self) -> float | None:
        return 1.0 / self.coef[1] if self.coef[1] > 0 else None

    def decode_tokens_per_s(self, batch: int, context: float) -> float:
        """Decode rate at `batch` sequences of `context` tokens: the step time's shape."""
        step = self.coef[2] + self.coef[3] * batch + self.coef[4] * batch * context / 1000.0
        return batch / step if step > 0 else float("inf")


def fit(calls: Sequence[Call]) -> Rates:
    """Fit the coefficients to observed calls (ValueError when there are none)."""
    import numpy as np
    from scipy.optimize import nnls

    usable = [c for c in calls if c.seconds > 0]
    if not usable:
        raise ValueError("no engine call with a duration to fit")
    a = np.array([[f / c.seconds for f in c.features()] for c in usable])
    b = np.ones(len(usable))
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, b)
    coef = coef / scale
    pred = (a * coef).sum(axis=1)  # predicted / observed
    rel = float(np.sqrt(np.mean((pred - 1.0) ** 2)))
    return Rates(tuple(float(x) for x in coef), rel, len(usable))


def predict_call(rates: Rates, call: Call) -> float:
    return sum(k * f for k, f in zip(rates.coef, call.features()))


def expected_max(lengths: Sequence[int], k: int) -> float:
    """E[max of k draws] from the empirical distribution of `lengths` (order statistics)."""
    xs = sorted(lengths)
    n = len(xs)
    if n == 0 or k <= 0:
        return 0.0
    return sum(x * ((i / n) ** k - ((i - 1) / n) ** k) for i, x in enumerate(xs, start=1))


@dataclass(frozen=True)
class Work:
    """What one replica computes: rows of `prompt_tokens` (mean), `cached_fraction` of them found in the
    prefix cache, outputs drawn from `output_lengths` (a sample; n per row), in calls of `rows_per_call`
    rows, with `concurrency` rows held at once by a continuous-batching engine. `drains` False: rows computed
    while the engine stayed full (a running job's rows done so far, or its running rows' tokens so far):
    each step shared by `concurrency` sequences, and no tail at the end."""

    rows: int
    prompt_tokens: float
    cached_fraction: float
    output_lengths: tuple[int, ...]
    n: int
    batching: str
    rows_per_call: int
    concurrency: int
    drains: bool = True  # continuous: the batch empties at the end, its longest rows finishing alone


def planned_calls(work: Work) -> list[Call]:
    """The engine calls (or, continuous, the one window) the work becomes, without durations."""
    if work.rows <= 0:
        return []
    lens = work.output_lengths or (0,)
    mean = sum(lens) / len(lens)
    mean_sq = sum(x * x for x in lens) / len(lens)
    prefill_per_row = work.prompt_tokens * (1.0 - work.cached_fraction)
    n_calls = math.ceil(work.rows / max(1, work.rows_per_call))
    if work.batching == CONTINUOUS:
        seqs = work.rows * work.n
        full = max(1, work.concurrency * work.n)
        width = min(full, seqs) if work.drains else full  # not draining: a share of the full batch's steps
        steps = seqs * mean / width  # full batches, then the tail
        if work.drains:
            steps += max(0.0, expected_max(lens, width) - mean)
        ctx = seqs * (mean * work.prompt_tokens + mean_sq / 2)
        return [Call(n_calls, work.rows * prefill_per_row, steps, seqs * mean, ctx, 0.0)]
    out = []
    full, rest = divmod(work.rows, max(1, work.rows_per_call))
    for rows, times in ((work.rows_per_call, full), (rest, 1 if rest else 0)):
        if times:  # identical calls as one: the features are linear
            width = rows * work.n
            steps = expected_max(lens, width)
            out.append(Call(times, times * rows * prefill_per_row, times * steps, times * width * steps,
                            times * width * steps * (work.prompt_tokens + steps / 2), 0.0))
    return out


def predict_work(rates: Rates, work: Work) -> float:
    """Seconds one replica takes for `work`."""
    return sum(predict_call(rates, c) for c in planned_calls(work))
