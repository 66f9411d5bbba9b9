"""AIMD controller with an injected clock: increase, each decrease signal, Retry-After, floor, ceiling."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController, Signal


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(**kw) -> tuple[AIMDController, Clock]:
    clock = Clock()
    return AIMDController(AIMDConfig(**kw), clock=clock), clock


def succeed(c: AIMDController, clock: Clock, n: int, latency: float = 0.1) -> None:
    for _ in range(n):
        t = c.try_acquire()
        assert t is not None
        clock.t += 0.001
        c.on_success(t, latency)


def test_slow_start_grows_per_success_then_additive():
    c, clock = make(initial_window=4, max_window=1000)
    succeed(c, clock, 4)
    assert c.window == 8.0  # default: doubled over one window of successes
    c2, clock2 = make(initial_window=4, max_window=1000, slow_start_increase=0.5)
    succeed(c2, clock2, 4)
    assert c2.window == 6.0  # x1.5 per window of successes
    t = c.try_acquire()
    clock.t += 0.01
    c.on_overload(t, Signal.RATE_LIMIT)
    assert c.window == 4.0 and not c.in_slow_start
    succeed(c, clock, 4)  # one window of successes: about +1
    assert 4.9 < c.window < 5.0


def test_window_limits_in_flight():
    c, _ = make(initial_window=2)
    a, b = c.try_acquire(), c.try_acquire()
    assert a is not None and b is not None
    assert c.try_acquire() is None and c.in_flight == 2
    c.on_other(a)
    assert c.try_acquire() is not None


@pytest.mark.parametrize("signal", [Signal.RATE_LIMIT, Signal.UNAVAILABLE, Signal.TIMEOUT])
def test_overload_signals_halve(signal):
    c, clock = make(initial_window=16, backoff_factor=0.5)
    t = c.try_acquire()
    clock.t += 1
    c.on_overload(t, signal)
    assert c.window == 8.0
    assert c.stats.decreases == {signal.value: 1}


def test_latency_rise_shrinks_gently_and_steady_latency_grows():
    c, clock = make(initial_window=10, slow_start=False, min_latency_samples=4, latency_tolerance=1.5,
                    latency_backoff_factor=0.9, backoff_factor=0.5, latency_smoothing=0.5)
    succeed(c, clock, 10, latency=0.1)  # steady: baseline 0.1, window grows
    grown = c.window
    assert grown > 10.0 and c.baseline_latency == pytest.approx(0.1)
    tickets = [c.try_acquire() for _ in range(3)]  # one round trip of slow answers
    clock.t += 0.4
    for t in tickets:  # smoothed: 0.25, 0.325, 0.3625 (> 1.5 x 0.1) -> one decrease per round trip
        c.on_success(t, 0.4)
    # the first slow answer cuts: ratio 2.5, factor tolerance/ratio = 0.6 (within [0.5, 0.9])
    assert c.window == pytest.approx(grown * 0.6)
    assert c.stats.decreases == {"latency": 1} and c.stats.ignored_signals == 2
    before = c.window
    succeed(c, clock, 1, latency=0.4)  # next round trip still slow: ratio 3.8 -> floor factor 0.5
    assert c.window == pytest.approx(before * 0.5)


def test_slight_latency_rise_cuts_by_latency_backoff_factor():
    c, clock = make(initial_window=20, slow_start=False, min_latency_samples=2, latency_tolerance=1.5,
                    latency_backoff_factor=0.9, latency_smoothing=1.0)
    succeed(c, clock, 2, latency=0.1)
    w = c.window
    succeed(c, clock, 1, latency=0.16)  # ratio 1.6: factor min(0.9, 1.5/1.6=0.94) = 0.9
    assert c.window == pytest.approx(w * 0.9)


def test_slow_start_ends_when_latency_starts_rising():
    c, clock = make(initial_window=10, min_latency_samples=2, latency_tolerance=1.5, latency_smoothing=1.0)
    succeed(c, clock, 4, latency=0.1)
    assert c.in_slow_start and c.window == 14.0
    succeed(c, clock, 1, latency=0.13)  # ratio 1.3 > 1.25 (halfway to 1.5): additive from now on
    assert not c.in_slow_start and c.stats.decreases == {}


def test_latency_is_compared_per_completion_token():
    c, clock = make(initial_window=10, slow_start=False, min_latency_samples=2, latency_smoothing=1.0)
    for tokens in (10, 100, 1000):  # longer outputs take longer: no overload per token
        t = c.try_acquire()
        clock.t += 0.01
        c.on_success(t, 0.01 * tokens, completion_tokens=tokens)
    assert c.stats.decreases == {}
    assert c.baseline_latency == pytest.approx(0.01)


def test_decrease_once_per_round_trip():
    c, clock = make(initial_window=16)
    tickets = [c.try_acquire() for _ in range(8)]
    clock.t += 1
    for t in tickets:  # eight 429s from requests sent under the old window
        c.on_overload(t, Signal.RATE_LIMIT)
    assert c.window == 8.0 and c.stats.ignored_signals == 7
    t = c.try_acquire()  # sent after the decrease: its 429 counts
    clock.t += 1
    c.on_overload(t, Signal.RATE_LIMIT)
    assert c.window == 4.0


def test_retry_after_pauses_new_sends():
    c, clock = make(initial_window=8)
    t = c.try_acquire()
    clock.t += 0.1
    c.on_overload(t, Signal.RATE_LIMIT, retry_after_s=2.0)
    assert c.try_acquire() is None and c.pause_remaining() == pytest.approx(2.0)
    clock.t += 1.5
    assert c.try_acquire() is None and c.pause_remaining() == pytest.approx(0.5)
    clock.t += 0.5
    assert c.try_acquire() is not None


def test_retry_after_is_capped():
    c, clock = make(max_pause_s=5.0)
    c.on_overload(c.try_acquire(), Signal.RATE_LIMIT, retry_after_s=3600)
    assert c.pause_remaining() == pytest.approx(5.0)


def test_floor_and_ceiling():
    c, clock = make(initial_window=4, min_window=3, max_window=6)
    for _ in range(5):
        t = c.try_acquire()
        clock.t += 1
        c.on_overload(t, Signal.UNAVAILABLE)
    assert c.window == 3.0 and c.limit == 3
    c2, clock2 = make(initial_window=4, min_window=1, max_window=6)
    succeed(c2, clock2, 50)
    assert c2.window == 6.0 and c2.limit == 6


def test_disabled_keeps_window_fixed():
    c, clock = make(initial_window=5, enabled=False)
    succeed(c, clock, 20)
    t = c.try_acquire()
    c.on_overload(t, Signal.RATE_LIMIT)
    assert c.limit == 5


def test_config_is_strict():
    with pytest.raises(ValidationError, match="min_window"):
        AIMDConfig(min_window=10, max_window=5)
    with pytest.raises(ValidationError, match="extra"):
        AIMDConfig(ceiling=5)
    for name, f in AIMDConfig.model_fields.items():
        assert f.description, name


def test_more_releases_than_acquires_is_an_error():
    c, _ = make()
    t = c.try_acquire()
    c.on_other(t)
    with pytest.raises(RuntimeError):
        c.on_other(t)


def test_fast_return_after_a_latency_cut_when_latency_recovers():
    c, clock = make(initial_window=20, slow_start=False, min_latency_samples=2, latency_tolerance=1.5,
                    latency_backoff_factor=0.9, backoff_factor=0.5, latency_smoothing=1.0)
    succeed(c, clock, 2, latency=0.1)
    w = c.window
    succeed(c, clock, 1, latency=1.0)  # a stall: ratio 10 -> cut to half
    assert c.window == pytest.approx(w * 0.5) and c.recover_to == pytest.approx(w * 0.9)
    succeed(c, clock, 4, latency=0.1)  # latency is back: +1 per success (slow-start speed), not +1/window
    assert c.window == pytest.approx(w * 0.5 + 4.0)
    succeed(c, clock, 6, latency=0.1)
    assert c.recover_to is None and c.window >= w * 0.9
    back = c.window
    succeed(c, clock, 20, latency=0.1)  # then additive again: about +1 per window of successes
    assert 0.5 < c.window - back < 1.2


def test_no_fast_return_after_a_429():
    c, clock = make(initial_window=20, slow_start=False)
    c.on_overload(c.try_acquire(), Signal.RATE_LIMIT)
    assert c.recover_to is None
    succeed(c, clock, 10)
    assert c.window < 11.0


def test_a_single_slow_answer_does_not_cut():
    c, clock = make(initial_window=20, slow_start=False, min_latency_samples=2, latency_smoothing=0.5)
    succeed(c, clock, 4, latency=0.1)
    succeed(c, clock, 1, latency=0.5)  # smoothed 0.3 > 0.15 and the sample too: cut
    assert c.stats.decreases == {"latency": 1}
    succeed(c, clock, 1, latency=0.1)  # smoothed still 0.2 > 0.15, but this answer is fast: no cut
    assert c.stats.decreases == {"latency": 1}
