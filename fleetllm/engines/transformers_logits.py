"""Logits on the transformers engine: OpenAI's presence and frequency penalties as a LogitsProcessor, and
logprob entries.

Penalties as OpenAI and vLLM define them, over the tokens generated so far (not the prompt):
logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0).

Logprobs are the model's raw ones (log_softmax of its logits, before penalties, temperature, top-k and
grammars), as vLLM and OpenAI give them, clamped at OpenAI's floor (-9999.0) so that a token the model
rules out is a number, never -inf (which reaches clients as null or -Infinity).
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


LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token of probability 0


def clamp(logprob: float) -> float:
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR  # also -inf and nan


def logprob_entry(tokenizer: Any, torch: Any, logp: Any, token: int, top: int) -> dict[str, Any]:
    """{token, logprob, top_logprobs} of one generated token from the step's log-softmax over the vocabulary."""
    entry: dict[str, Any] = {"token": tokenizer.decode([token]), "logprob": clamp(float(logp[token]))}
    if top:
        values, ids = torch.topk(logp, top)
        entry["top_logprobs"] = [{"token": tokenizer.decode([int(t)]), "logprob": clamp(float(v))}
                                 for v, t in zip(values, ids)]
    return entry
