"""Turning a request into prompt text with the tokenizer's chat template."""

from __future__ import annotations

from typing import Any, Callable

from fleetllm.engines.base import GenerationRequest
from fleetllm.errors import RowError
from fleetllm.unicode_text import lone_surrogate, refusal


def text_content(content: Any, where: str = "content") -> str | None:
    """A message's content as text: a string, or a list of `{type: text, text}` parts joined. Any other
    part type (image_url, input_audio, file...) is refused, naming it: fleetllm's local models read text
    only, and a dropped image would leave the model answering about a picture it never saw."""
    if content is None or isinstance(content, str):
        return content
    if hasattr(content, "tolist"):
        content = content.tolist()
    if not isinstance(content, list):
        raise RowError(f"{where} must be a string or a list of content parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise RowError(f"{where}[{j}] must be a content part object, got {part!r}")
        kind = part.get("type")
        if kind != "text":
            raise RowError(f"{where}[{j}] is a content part of type {kind!r}; this model reads text only "
                           "(content parts of type 'text'): remove the part or use a multimodal endpoint")
        if not isinstance(part.get("text"), str):
            raise RowError(f"{where}[{j}].text must be a string, got {part.get('text')!r}")
        texts.append(part["text"])
    return "".join(texts)


def normalize_messages(messages: Any, text_only: bool = True) -> list[dict[str, Any]]:
    """Messages as plain dicts; Arrow hands struct lists over as numpy arrays of dicts. With `text_only`
    (the local engines), list content becomes text and non-text parts are refused (`text_content`)."""
    if messages is None or isinstance(messages, (str, bytes)):
        raise RowError("`messages` must be a list of {role, content} objects")
    out = []
    for i, m in enumerate(list(messages)):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RowError(f"each message needs `role` and `content`; got {m!r}")
        m = {k: v for k, v in m.items() if v is not None}
        if text_only and "content" in m:
            m["content"] = text_content(m["content"], f"messages[{i}].content")
        out.append(m)
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


def prompt_chars(request: GenerationRequest) -> int:
    """Characters of a request's prompt text (the chat template adds more): cheap, before tokenizing."""
    if request.messages is None:
        return len(request.prompt or "")
    total = 0
    for m in list(request.messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif content is not None:
            total += sum(len(p.get("text") or "") for p in list(content) if isinstance(p, dict)
                         and isinstance(p.get("text"), str))
    return total


def max_chars_per_token(tokenizer) -> int:
    """An upper bound of the characters one token covers (as vLLM's tokenizer.max_chars_per_token): a
    prompt longer than context x this cannot fit, and is refused without tokenizing it."""
    try:
        return max(1, max(len(t) for t in tokenizer.get_vocab()))
    except Exception:  # noqa: BLE001 - no vocabulary to read: no early check
        return 1 << 30


def check_text(request: GenerationRequest) -> None:
    """RowError when the prompt holds text that is not valid Unicode (a lone surrogate): no tokenizer takes
    it and no UTF-8 request body can carry it."""
    bad_text = (lone_surrogate(request.prompt, "the prompt") if request.messages is None
                else lone_surrogate(list(request.messages), "messages"))
    if bad_text:
        raise RowError(refusal(bad_text))


def check_prompt_chars(request: GenerationRequest, context: int, chars_per_token: int) -> None:
    """RowError when the prompt cannot fit the context by its characters alone, or is not valid Unicode."""
    check_text(request)
    chars = prompt_chars(request)
    if chars > context * chars_per_token:
        raise RowError(f"the prompt is {chars} characters, more than the model's context of {context} tokens "
                       f"can hold (at most {chars_per_token} characters a token): shorten the prompt")


def prompt_ids(request: GenerationRequest, tokenize: Callable[[GenerationRequest], list[int]], context: int,
               chars_per_token: int) -> list[int]:
    """A request's prompt token ids, the preparation every local engine shares: a prompt too long for the
    context by its characters alone refused before tokenizing (unless the ids are given), a template or
    message that fails to render is this row's RowError, an empty prompt refused."""
    if request.prompt_token_ids is None:
        check_prompt_chars(request, context, chars_per_token)
    try:
        ids = tokenize(request)
    except RowError:
        raise
    except Exception as exc:  # a bad chat template or message shape fails this row only
        raise RowError(f"could not build the prompt: {exc}") from None
    if len(ids) == 0:
        raise RowError("the prompt is empty")
    return ids
