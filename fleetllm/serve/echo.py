"""`echo` on /v1/completions, as `vllm serve` answers it: the prompt's text before the completion and, with
`logprobs`, the prompt's tokens in the logprobs (the first with no logprob, as it has no context).

The prompt's logprobs take one forward pass of the model over the prompt: the transformers engine does it
here; the vllm engine asks vLLM for them (`prompt_logprobs` on a one-token request, VLLMEngine.prompt_logprobs).
An engine with neither refuses echo with logprobs (a 400 naming `echo`).
"""

from __future__ import annotations

from typing import Any

from fleetllm.engines.capabilities import declared_by
from fleetllm.engines.fields import FieldError


def prompt_ids(engine: Any, payload: dict[str, Any]) -> list[int]:
    """The prompt's token ids: as sent, or the text tokenized as the engine tokenizes a prompt."""
    if payload.get("prompt_token_ids") is not None:
        return [int(t) for t in payload["prompt_token_ids"]]
    return list(engine.tokenizer(payload.get("prompt") or "", add_special_tokens=True)["input_ids"])


def echo_item(engine: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """{"prompt_text", "prompt_logprobs"} for an echo request (prompt_logprobs None without logprobs)."""
    top = (payload.get("sampling") or {}).get("logprobs")
    ids = prompt_ids(engine, payload) if payload.get("prompt_token_ids") is not None or top is not None else []
    text = payload.get("prompt") or engine.tokenizer.decode(ids)
    if top is None:
        return {"prompt_text": text, "prompt_logprobs": None}
    if declared_by(engine).exposes_torch_model:
        return {"prompt_text": text, "prompt_logprobs": _prompt_logprobs(engine, ids, int(top))}
    if hasattr(engine, "prompt_logprobs"):
        return {"prompt_text": text, "prompt_logprobs": engine.prompt_logprobs(ids, int(top))}
    raise FieldError(f"`echo` with `logprobs` is not supported by the {engine.name} engine (it would need the "
                     "prompt's logprobs); engines that honour it: transformers, vllm", param="echo")


def _prompt_logprobs(engine: Any, ids: list[int], top: int) -> list[dict[str, Any] | None]:
    """Each prompt token's logprob given the tokens before it, with the `top` likeliest there."""
    torch = engine.torch

    def forward() -> Any:
        with torch.no_grad():
            return engine.model(torch.tensor([ids], device=engine.model.device)).logits[0].float()

    compute = getattr(engine, "compute", None)  # the engine's one torch thread (fleetllm.engines.threads)
    logits = compute.run(forward) if compute is not None else forward()
    logp = torch.log_softmax(logits, dim=-1)
    decode = engine.tokenizer.decode
    out: list[dict[str, Any] | None] = [{"token": decode([ids[0]]), "logprob": None, "top_logprobs": None}]
    for pos in range(1, len(ids)):
        row, token = logp[pos - 1], ids[pos]
        entry: dict[str, Any] = {"token": decode([token]), "logprob": float(row[token])}
        values, best = torch.topk(row, top) if top else ([], [])
        entry["top_logprobs"] = [{"token": decode([int(t)]), "logprob": float(v)} for v, t in zip(values, best)]
        out.append(entry)
    return out
