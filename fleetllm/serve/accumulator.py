"""The answer of one generation request, collected from the engine's deltas (fleetllm.serve.handlers):
per-choice text, token counts, finish reasons and logprobs; the SSE chunks of a batch of deltas and the
final chat / completion response."""

from __future__ import annotations

from typing import Any

from fleetllm.engines.openai_api.protocol import (
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, CompletionChoice, CompletionResponse,
    DeltaMessage, ResponseMessage, Usage, chat_logprobs, completion_logprobs, new_id,
)


class Accumulator:
    """Collects delta dicts into per-choice text, token counts, finish reasons and logprobs."""

    def __init__(self, n: int) -> None:
        self.texts = [""] * n
        self.tokens = [0] * n
        self.finish: list[str | None] = [None] * n
        self.logprobs: list[list[dict]] = [[] for _ in range(n)]
        self.prompt_tokens = 0
        self.cached_tokens: int | None = None  # prompt tokens from the engine's prefix cache (vLLM says)
        self.echo: dict[str, Any] | None = None  # {prompt_text, prompt_logprobs} for completions' echo

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens)

    def add(self, items: list[dict]) -> None:
        for d in items:
            i = d["index"]
            self.echo = d.get("echo") or self.echo
            self.texts[i] += d["text"]
            self.tokens[i] = max(self.tokens[i], d["num_generated_tokens"])
            self.finish[i] = d.get("finish_reason") or self.finish[i]
            self.prompt_tokens = max(self.prompt_tokens, d.get("num_input_tokens") or 0)
            if d.get("num_cached_tokens") is not None:
                self.cached_tokens = max(self.cached_tokens or 0, d["num_cached_tokens"])
            self.logprobs[i].extend(d.get("logprobs") or [])

    def chunks(self, rid: str, endpoint: str, model: str, items: list[dict]) -> list:
        """The SSE chunks for a batch of deltas: one per choice index (its deltas merged), so a client reading
        choices[0] of each chunk sees every choice, one whose first token was the stop token included."""
        merged: dict[int, dict[str, Any]] = {}
        for d in items:
            m = merged.setdefault(d["index"], {"text": "", "finish": None, "logprobs": []})
            m["text"] += d["text"]
            m["finish"] = d.get("finish_reason") or m["finish"]
            m["logprobs"].extend(d.get("logprobs") or [])
        if endpoint == "chat":
            return [ChatCompletionChunk(id=rid, model=model, choices=[ChatChunkChoice(
                index=i, delta=DeltaMessage(content=m["text"]), finish_reason=m["finish"],
                logprobs=chat_logprobs(m["logprobs"]))]) for i, m in sorted(merged.items())]
        return [CompletionResponse(id=rid, model=model, choices=[CompletionChoice(
            index=i, text=m["text"], finish_reason=m["finish"],
            logprobs=completion_logprobs(m["logprobs"], offset=len(self.texts[i]) - len(m["text"])))])
            for i, m in sorted(merged.items())]

    def response(self, req, endpoint: str, model: str, prompt: str):
        usage = Usage.of(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
        if endpoint == "chat":
            choices = [ChatChoice(index=i, message=ResponseMessage(content=t), finish_reason=self.finish[i],
                                  logprobs=chat_logprobs(self.logprobs[i])) for i, t in enumerate(self.texts)]
            return ChatCompletionResponse(id=new_id("chatcmpl"), model=model, choices=choices, usage=usage)
        echo = (self.echo or {}).get("prompt_text", prompt) if getattr(req, "echo", False) else ""
        head = (self.echo or {}).get("prompt_logprobs") or []  # the prompt's tokens, before the generated ones
        choices = [CompletionChoice(index=i, text=echo + t, finish_reason=self.finish[i],
                                    logprobs=completion_logprobs(head + self.logprobs[i] if self.logprobs[i] else None))
                   for i, t in enumerate(self.texts)]
        return CompletionResponse(id=new_id("cmpl"), model=model, choices=choices, usage=usage)
