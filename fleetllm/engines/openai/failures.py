"""How an attempt failed, and whose failure it is: the retry decisions of `fleetllm.engines.openai.client`.

`classify` maps an exception of the openai client (or of the answer's checks, `answers`) onto a
`Failure`: retryable or not, a load signal for the AIMD window, the server's Retry-After.
`endpoint_problem` and `endpoint_wide` say, with the cause and the fix, when a row's final failure is
the endpoint's and not the row's (the caller stops the job instead of committing it); see the
client's module docstring for the rules.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any

from fleetllm.engines.openai.aimd import Signal
from fleetllm.engines.openai.answers import BadAnswer, ResponseTooLarge, not_json


@dataclass
class Failure:
    """How an attempt failed, as the retry loop and the controller see it."""

    message: str
    retryable: bool
    signal: Signal | None = None  # a load signal for the controller, if any
    retry_after_s: float | None = None
    status: int | None = None
    malformed: bool = False  # a 200 that is not a well-formed completion


def parse_retry_after(headers: Any) -> float | None:
    """Retry-After in seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify(exc: BaseException) -> Failure:
    """Map an exception from the openai client onto retry and load-signal decisions."""
    import openai

    if isinstance(exc, BadAnswer):
        return Failure(str(exc), retryable=True, malformed=True)
    if not_json(exc):
        return Failure(f"a 200 whose body is not valid JSON (cut short?): {exc}", retryable=True, malformed=True)
    if isinstance(exc, ResponseTooLarge):
        return Failure(str(exc), retryable=False)
    if isinstance(exc, openai.APITimeoutError):
        return Failure(f"timeout: {exc}", retryable=True, signal=Signal.TIMEOUT)
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None and str(exc.__cause__) else ""
        return Failure(f"connection error: {exc}{cause}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry_after = parse_retry_after(getattr(exc.response, "headers", None))
        message = f"HTTP {status}: {_short(exc)}"
        if status == 429:
            return Failure(message, True, Signal.RATE_LIMIT, retry_after, status)
        if status in (503, 504):
            return Failure(message, True, Signal.UNAVAILABLE, retry_after, status)
        if status == 408 or status >= 500:
            return Failure(message, True, None, retry_after, status)
        return Failure(message, False, None, None, status)
    return Failure(f"{type(exc).__name__}: {exc}", retryable=False)


def endpoint_problem(failure: Failure, base_url: str, model: str) -> str | None:
    """The cause and the fix when a final failure is the endpoint's, not the row's; else None."""
    if failure.status in (401, 403):
        return (f"the endpoint {base_url} refused the api key ({failure.message}); set "
                "model.engine_kwargs.api_key, or the variable named by model.engine_kwargs.api_key_env "
                "(default OPENAI_API_KEY), to a key it accepts, then run again")
    if failure.status == 404:
        return (f"the endpoint {base_url} does not serve model {model!r} ({failure.message}); set "
                "model.source (or model.engine_kwargs.model) to an id that GET /v1/models lists, or fix "
                "model.engine_kwargs.base_url, then run again")
    if failure.status is None and failure.message.startswith("connection error"):
        return (f"the endpoint {base_url} cannot be reached or broke off its answers ({failure.message}); "
                "start it or fix model.engine_kwargs.base_url, then run again")
    return None


def endpoint_wide(failure: Failure, base_url: str, attempts: int, others_succeeded: bool) -> str | None:
    """After a row's last retry: the cause and the fix when its failure is the endpoint's (see the
    module docstring), else None (the row keeps its error)."""
    if not failure.retryable:
        return None
    tried = f"on all {attempts} attempts of a row"
    if failure.malformed:
        return (f"the endpoint {base_url} answered {failure.message} {tried}: not a well-formed completion. "
                "Fix the endpoint (or the proxy in front of it), then run again")
    if failure.status in (429, 503):
        what = "rate-limits" if failure.status == 429 else "is unavailable to"
        return (f"the endpoint {base_url} {what} every request ({failure.message} {tried}). Run again later, or "
                "raise model.engine_kwargs.max_retries and retry.max_backoff_s to wait longer")
    if not others_succeeded:
        return (f"the endpoint {base_url} failed every request ({failure.message} {tried}, and no other request "
                "succeeded meanwhile): an outage or a hang, not the rows. Run again once it answers, or raise "
                "model.engine_kwargs.max_retries, retry.max_backoff_s (or timeout_s) to wait longer")
    return None


def _short(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        return str(inner)[:500]
    return str(getattr(exc, "message", exc))[:500]
