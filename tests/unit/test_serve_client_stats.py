"""benchmarks/serve_client_stats.py: what serve_gpu.py reads from `vllm bench serve`'s per-request clock (start
times, TTFTs, gaps): whether a load stayed in waves, and where its long gaps fell."""

from __future__ import annotations

from bench_modules import benchmark_module


def stats_module():
    return benchmark_module("serve_client_stats")


def test_a_wave_split_in_two_shows_as_a_third_burst_and_more_first_token_steps():
    stats = stats_module()
    # two waves of 4 requests sent together; the first wave's prompts finish prefill in two engine steps
    starts = [0.0, 0.001, 0.002, 0.003, 2.0, 2.001, 2.002, 2.003]
    ttfts = [0.10, 0.10, 0.30, 0.30, 0.10, 0.10, 0.10, 0.10]
    assert stats.waves(starts, ttfts) == {"send_bursts": 2, "first_token_steps": 3, "steps_per_burst": 1.5}
    # the second wave split: its last two requests went out 50 ms late (a burst of their own) and prefilled apart
    split = starts[:6] + [2.051, 2.052]
    assert stats.waves(split, ttfts) == {"send_bursts": 3, "first_token_steps": 4, "steps_per_burst": 1.33}
    assert stats.waves([], []) == {"send_bursts": 0, "first_token_steps": 0, "steps_per_burst": None}


def test_long_gaps_are_counted_by_where_in_the_stream_they_fell():
    stats = stats_module()
    itls = [[0.005, 0.030, 0.005] + [0.005] * 30 + [0.025], [0.021] + [0.005] * 9]  # seconds, as vLLM's bench
    out = stats.long_gaps(itls)
    assert out["count"] == 3 and out["share"] == round(3 / 44, 4)
    assert out["by_token_index"] == {"1": 1, "2-7": 1, "8-31": 0, "32+": 1}
