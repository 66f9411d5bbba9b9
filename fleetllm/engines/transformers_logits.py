"""OpenAI's presence and frequency penalties as a transformers LogitsProcessor.

As OpenAI and vLLM define them, over the tokens generated so far (not the prompt):
logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0).
"""

from __future__ import annotations

from typing import Any


def penalty_processor(presence: float, frequency: float, prompt_len: int) -> Any:
    """A LogitsProcessor for one padded batch whose prompts all end at column `prompt_len`."""
    import torch
    from transformers import LogitsProcessor

    class PresenceFrequencyPenalty(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            generated = input_ids[:, prompt_len:]
            if generated.shape[1] == 0:
                return scores
            counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
            return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)

    return PresenceFrequencyPenalty()
