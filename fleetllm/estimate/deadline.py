"""`compute.deadline`: a duration ("90m", "2h30m", "45s", "1d") or a time ("2026-12-06T08:00:00Z",
"2026-12-06 08:00"; no zone means UTC), and the replicas that meet it. Pure.

`choose_replicas` tries replica counts from 1 up to the most the cluster allows and keeps the
fewest whose estimated wall time (its upper end) fits; when even the most does not, DeadlineError
names the shortfall: the estimate, how far past the deadline, and the replicas it would need.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from fleetllm.errors import PlanError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*((\d+(\.\d+)?)\s*([smhd])\s*)+$")


class DeadlineError(PlanError):
    """The deadline cannot be met with what the cluster allows."""


def parse_deadline(value: str) -> tuple[str, float]:
    """("duration", seconds) or ("time", unix seconds); ValueError naming the accepted forms."""
    text = str(value).strip()
    if _DURATION.match(text):
        return "duration", sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)\s*([smhd])", text))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"compute.deadline {value!r} is neither a duration (e.g. 90m, 2h30m, 45s, 1d) nor a time "
                         "(e.g. 2026-12-06T08:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return "time", when.timestamp()


def seconds_until(value: str, now: float) -> float:
    kind, x = parse_deadline(value)
    return x if kind == "duration" else x - now


def fmt_s(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def choose_replicas(wall_range: Callable[[int], tuple[float, float]], budget_s: float, most: int,
                    deadline: str, limit_hint: str, need_cap: int = 4096) -> tuple[int, str]:
    """(replicas, why): the fewest of 1..`most` whose estimate's upper end fits `budget_s` seconds.
    `wall_range(k)` is the estimated (mid, high) wall seconds with k replicas."""
    if budget_s <= 0:
        raise DeadlineError(f"compute.deadline {deadline!r} has already passed; give a later time or a duration")
    for k in range(1, most + 1):
        mid, high = wall_range(k)
        if high <= budget_s:
            return k, (f"deadline {deadline} ({fmt_s(budget_s)}): {k} replica(s) estimated {fmt_s(mid)} "
                       f"(at most {fmt_s(high)})")
    mid, high = wall_range(most)
    need = next((k for k in range(most + 1, need_cap + 1) if wall_range(k)[1] <= budget_s), None)
    needs = (f"meeting it needs {need} replicas ({need - most} more than the {most} {limit_hint})" if need
             else f"no replica count up to {need_cap} meets it (start-up and the longest call alone take longer)")
    raise DeadlineError(
        f"compute.deadline {deadline!r} cannot be met: {fmt_s(budget_s)} left, and with the most replicas the cluster "
        f"allows ({most}) the estimate is {fmt_s(mid)} (up to {fmt_s(high)}), {fmt_s(max(0.0, high - budget_s))} "
        f"short; {needs}. Add nodes, allow a later deadline, or make the job smaller")
