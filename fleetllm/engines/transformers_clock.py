"""The clock of one static batch on the transformers engine: a `StoppingCriteria` (transformers calls it once
per decoding step, after the step's token) that only notes the time, so a batch's prefill (up to its first
token) can be told from its decode steps. The calibration probe fits the two apart (fleetllm.estimate.observe
.split_call): on this CPU a step of SmolLM2-135M takes ~60 ms at 1 sequence and ~90 ms at 4 whatever the
context (40, 216 or 730 tokens), while a whole call's time alone could not tell a step's cost from its
context's.
"""

from __future__ import annotations

import time
from typing import Any

from fleetllm.engines.base import GenerateTiming


def step_clock() -> Any:
    """A fresh clock to pass in generate's `stopping_criteria`; it never stops a sequence."""
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            self.times.append(time.time())
            return input_ids.new_zeros(input_ids.shape[0], dtype=bool)

        def timing(self, width: int, prompt_len: int) -> GenerateTiming | None:
            if not self.times:
                return None
            return GenerateTiming(width, prompt_len, len(self.times), self.times[0], self.times[-1])

    return StepClock()
