"""What an endpoint answered, checked before a row takes it: a well-formed completion, of bounded size.

- `check_completion`: a 200 whose body is not a completion (not JSON, e.g. a proxy's HTML page; no
  `choices`; fewer choices than the `n` asked; a choice without its message or text) raises
  `BadAnswer` naming what came back. The client retries it like a 5xx and, if it persists, stops the
  job (the endpoint's failure, never the row's result).
- `capped_http_client`: the HTTP client of the openai client, whose response bodies are read as a
  stream and refused past `max_bytes` (`ResponseTooLarge`), before they are held whole in memory.
"""

from __future__ import annotations

from typing import Any


class BadAnswer(Exception):
    """The endpoint answered 200 with something that is not a well-formed completion."""


class ResponseTooLarge(Exception):
    """A response body past the size cap (model.engine_kwargs.max_response_mb)."""


def _shown(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def check_completion(response: Any, n: int, chat: bool) -> None:
    """Raise BadAnswer unless `response` is a completion with at least `n` choices, each with its
    message (chat) or text (completions)."""
    if isinstance(response, (str, bytes)):  # the openai client hands back a non-JSON body as text
        text = response.decode("utf-8", "replace") if isinstance(response, bytes) else response
        raise BadAnswer(f"a 200 whose body is not JSON: {_shown(text)}")
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise BadAnswer(f"a 200 with no choices (choices: {_shown(choices, 40)})")
    if len(choices) < n:
        raise BadAnswer(f"a 200 with {len(choices)} choice(s) where n={n} were asked")
    for i, choice in enumerate(choices):
        if chat and getattr(choice, "message", None) is None:
            raise BadAnswer(f"a 200 whose choice {i} has no message")
        if not chat and getattr(choice, "text", None) is None:
            raise BadAnswer(f"a 200 whose choice {i} has no text")


def not_json(exc: BaseException) -> bool:
    """A body that was said to be JSON but does not parse (cut short, or HTML under a JSON type)."""
    import json

    return isinstance(exc, json.JSONDecodeError)


def _capped(stream: Any, cap: int, url: str) -> Any:
    """`stream` (the response's async byte stream) raising ResponseTooLarge once more than `cap` bytes
    came through; an AsyncByteStream of the HTTP library the openai client uses (httpx2, or httpx)."""
    base = next(t for t in type(stream).__mro__ if t.__name__ == "AsyncByteStream")

    class Capped(base):
        async def __aiter__(self):
            seen = 0
            async for chunk in stream:
                seen += len(chunk)
                if seen > cap:
                    raise ResponseTooLarge(too_large(cap, url))
                yield chunk

        async def aclose(self) -> None:
            await stream.aclose()

    return Capped()


def too_large(cap: int, url: str) -> str:
    return (f"the answer of {url} is larger than model.engine_kwargs.max_response_mb "
            f"({cap / 2 ** 20:g} MiB); it was refused unread past that. Raise max_response_mb if answers "
            "this large are expected (many choices, logprobs), then rerun with --retry-errors")


def capped_http_client(max_bytes: int, timeout_s: float) -> Any:
    """openai's default async HTTP client (its limits, redirects, proxies), reading each response body
    as a stream and refusing it past `max_bytes` (a Content-Length past the cap is refused unread)."""
    import openai

    async def cap(response: Any) -> None:
        url = str(response.request.url)
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            await response.aclose()
            raise ResponseTooLarge(too_large(max_bytes, url))
        response.stream = _capped(response.stream, max_bytes, url)

    return openai.DefaultAsyncHttpxClient(timeout=timeout_s, event_hooks={"response": [cap]})
