"""Ray Data LLM's HttpRequestProcessorConfig: each row's `payload` POSTed as JSON to `url`, the JSON answer in
`http_response` (docs/ray-compat.md).

    config = HttpRequestProcessorConfig(url="http://127.0.0.1:8000/v1/chat/completions",
                                        headers={"Authorization": "Bearer KEY"}, qps=1)
    processor = build_processor(config, preprocess=lambda row: dict(payload=dict(model="m", messages=[...])),
                                postprocess=lambda row: dict(answer=row["http_response"]["choices"][0]["message"]))

A request answered 429, 5xx or not at all is retried `max_retries` times, waiting
base_retry_wait_time_in_s x 2^attempt; a row that still fails gets `http_response` None and its `error`
(fleetllm records failed rows instead of raising), and skips postprocess as Ray's error rows do.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

RETRIED_STATUS = (408, 429, 500, 502, 503, 504)
TIMEOUT_S = 600.0  # one request's wait for its answer


class HttpRequestProcessorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    url: str = Field(..., description="The URL each row's payload is POSTed to.")
    headers: dict[str, Any] | None = Field(None, description="HTTP headers of every request.")
    qps: int | None = Field(None, gt=0, description="Most requests a second, per worker.")
    max_retries: int = Field(0, ge=0, description="Retries of a request answered 429/5xx or not answered.")
    base_retry_wait_time_in_s: float = Field(1.0, ge=0, description="First retry's wait; doubled each retry.")
    batch_size: int = Field(64, ge=1, description="Rows per task.")
    concurrency: int | tuple[int, int] = Field(1, description="Workers sending requests; (min, max): max.")
    accelerator_type: str | None = None
    session_factory: Any = None
    http_request_stage: Any = None

    def model_post_init(self, __context: Any) -> None:
        if self.session_factory is not None:
            raise ValueError("session_factory: fleetllm sends the requests itself (urllib); leave it out")


class HttpCaller:
    """One worker: POSTs each row's payload (the standard library's urllib: no client dependency)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = HttpRequestProcessorConfig.model_validate(config)
        self.headers = {"Content-Type": "application/json", **(self.config.headers or {})}
        self.next_at = 0.0

    def _send(self, payload: Any) -> Any:
        request = urllib.request.Request(self.config.url, data=json.dumps(payload).encode(), headers=self.headers,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())

    def _post(self, payload: Any) -> Any:
        c = self.config
        for attempt in range(c.max_retries + 1):
            if c.qps:
                time.sleep(max(0.0, self.next_at - time.monotonic()))
                self.next_at = time.monotonic() + 1.0 / c.qps
            try:
                return self._send(payload)
            except urllib.error.HTTPError as exc:  # answered with an error status
                if exc.code not in RETRIED_STATUS or attempt == c.max_retries:
                    raise
            except OSError:  # not answered: refused, reset, timed out (URLError is an OSError)
                if attempt == c.max_retries:
                    raise
            time.sleep(c.base_retry_wait_time_in_s * 2 ** attempt)
        raise AssertionError("unreachable")

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        try:
            row["http_response"], row["error"] = self._post(row.get("payload")), None
        except (OSError, ValueError) as exc:  # HTTPError, URLError, timeouts; an answer that is not JSON
            detail = exc.read().decode(errors="replace")[:500] if isinstance(exc, urllib.error.HTTPError) else ""
            row["http_response"], row["error"] = None, f"{type(exc).__name__}: {exc} {detail}".strip()
        return row


class HttpRequestProcessor:
    """preprocess -> HTTP requests -> postprocess (rows with an `error` skip postprocess)."""

    def __init__(self, config: HttpRequestProcessorConfig, preprocess=None, postprocess=None,
                 preprocess_map_kwargs: dict[str, Any] | None = None,
                 postprocess_map_kwargs: dict[str, Any] | None = None) -> None:
        self.config, self.preprocess, self.postprocess = config, preprocess, postprocess
        self.preprocess_map_kwargs = dict(preprocess_map_kwargs or {})
        self.postprocess_map_kwargs = dict(postprocess_map_kwargs or {})

    def __call__(self, ds):
        if self.preprocess is not None:
            pre = self.preprocess
            ds = ds.map(lambda row: {**row, **pre(row)}, **self.preprocess_map_kwargs)
        c = self.config
        workers = c.concurrency[1] if isinstance(c.concurrency, tuple) else c.concurrency
        ds = ds.map(HttpCaller, fn_constructor_kwargs={"config": c.model_dump()}, concurrency=workers, num_cpus=0.1)
        post = self.postprocess
        if post is None:
            return ds
        return ds.map(lambda row: post(row) if row.get("error") is None else row, **self.postprocess_map_kwargs)
