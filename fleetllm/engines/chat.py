"""Turning a request into prompt text with the tokenizer's chat template."""

from __future__ import annotations

from typing import Any

from fleetllm.engines.base import GenerationRequest
from fleetllm.errors import RowError


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as plain dicts; Arrow hands struct lists over as numpy arrays of dicts."""
    if messages is None or isinstance(messages, (str, bytes)):
        raise RowError("`messages` must be a list of {role, content} objects")
    out = []
    for m in list(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RowError(f"each message needs `role` and `content`; got {m!r}")
        out.append({k: v for k, v in m.items() if v is not None})
    if not out:
        raise RowError("`messages` is empty")
    return out


def render_prompt(tokenizer, request: GenerationRequest, default_kwargs: dict[str, Any]) -> str:
    if request.messages is None:
        if not request.prompt:
            raise RowError("the prompt is empty")
        return request.prompt
    kwargs = {**default_kwargs, **(request.chat_template_kwargs or {})}
    if getattr(tokenizer, "chat_template", None) is None:
        raise RowError("the tokenizer has no chat template; send `prompt` text instead of `messages`")
    return tokenizer.apply_chat_template(
        normalize_messages(request.messages), tokenize=False, add_generation_prompt=True, **kwargs
    )
