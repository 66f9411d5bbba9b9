"""ai_query: run a Ray Dataset through any OpenAI-compatible endpoint, as fast as it allows.

Each of `concurrency` Ray actors holds one `OpenAIHTTPEngine`, whose AIMD window starts at
`batch_size` in-flight requests and adapts to the endpoint (429, 503, timeouts, rising latency);
failing requests are retried with backoff and a row that still fails keeps its error. The result is
lazy and streaming (`ds.map_batches` with an async actor class).

Example::

    import fleetllm
    result = fleetllm.ai_query(
        ds, "smollm2", prompt_col="text",
        base_url="http://127.0.0.1:8000/v1", api_key="...",
        options={"temperature": 0.7, "max_tokens": 256,
                 "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        concurrency=4, batch_size=8,
    )
    for row in result.iter_rows():
        print(row["generated_text"]["content"])

Embeddings (POST /v1/embeddings): `task="embed"`, text in `prompt_col`; the output column is a struct of
embedding (list<float32>), prompt_tokens, error and attempts::

    vectors = fleetllm.ai_query(ds, "minilm", prompt_col="text", task="embed",
                                base_url="http://127.0.0.1:8000/v1", output_col="embedding")
"""

from __future__ import annotations

import asyncio
import math
import os
from typing import TYPE_CHECKING, Any

from fleetllm.errors import SpecError
from fleetllm.engines.openai.aimd import AIMDConfig

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

# Ray Data runs up to this many batches of an async actor at once (its default).
ASYNC_BATCHES_PER_ACTOR = 4
FORBIDDEN_OPTIONS = ("model", "messages", "prompt", "stream")


def embed_output_type():
    """The Arrow struct type of the output column of task embed."""
    import pyarrow as pa

    return pa.struct([("embedding", pa.list_(pa.float32())), ("prompt_tokens", pa.int64()),
                      ("error", pa.string()), ("attempts", pa.int64())])


def output_type():
    """The Arrow struct type of the output column."""
    import pyarrow as pa

    return pa.struct([
        ("content", pa.string()),
        ("finish_reason", pa.string()),
        ("usage", pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())])),
        ("error", pa.string()),
        ("attempts", pa.int64()),
    ])


class _QueryActor:
    """One Ray actor: an OpenAI HTTP engine whose AIMD window lives as long as the actor."""

    def __init__(self, model: str, engine_kwargs: dict[str, Any], prompt_col: str | None,
                 messages_col: str | None, output_col: str, options: dict[str, Any], task: str = "generate") -> None:
        from fleetllm.engines.openai.engine import OpenAIHTTPEngine

        self.engine = OpenAIHTTPEngine(model, engine_kwargs)
        self.engine.start()
        self.prompt_col, self.messages_col = prompt_col, messages_col
        self.output_col, self.options = output_col, options
        self.task = task

    async def _embed(self, batch):
        import pyarrow as pa

        from fleetllm.engines.base import EmbeddingRequest

        values = batch.column(self.prompt_col).to_pylist()
        outputs: list[dict[str, Any] | None] = [None] * len(values)
        requests, index = [], []
        for i, value in enumerate(values):
            if not isinstance(value, str) or not value:
                outputs[i] = {"embedding": None, "prompt_tokens": 0, "attempts": 0,
                              "error": f"bad row: column {self.prompt_col!r} is empty or not text"}
                continue
            requests.append(EmbeddingRequest(text=value, dimensions=self.options.get("dimensions")))
            index.append(i)
        results = await asyncio.wrap_future(self.engine.submit_embed(requests)) if requests else []
        for i, res in zip(index, results):
            outputs[i] = {"embedding": res.embedding, "prompt_tokens": res.num_input_tokens, "error": res.error,
                          "attempts": res.attempts or 0}
        return batch.append_column(self.output_col, pa.array(outputs, type=embed_output_type()))

    async def __call__(self, batch):
        import pyarrow as pa

        from fleetllm.engines.base import GenerationRequest

        if self.task == "embed":
            return await self._embed(batch)

        col = self.prompt_col or self.messages_col
        values = batch.column(col).to_pylist()
        outputs: list[dict[str, Any] | None] = [None] * len(values)
        requests, index = [], []
        for i, value in enumerate(values):
            try:
                if self.prompt_col:
                    if not isinstance(value, str) or not value:
                        raise ValueError(f"column {col!r} is empty or not text")
                    request = GenerationRequest(messages=[{"role": "user", "content": value}],
                                                sampling=self.options)
                else:
                    request = GenerationRequest(messages=value, sampling=self.options)
                    if not value:
                        raise ValueError(f"column {col!r} holds no messages")
            except Exception as exc:  # a bad row fails alone, with its reason
                outputs[i] = _row(None, None, 0, 0, f"bad row: {exc}", 0)
                continue
            requests.append(request)
            index.append(i)
        results = await asyncio.wrap_future(self.engine.submit(requests)) if requests else []
        for i, res in zip(index, results):
            c = res.completions[0] if res.completions else None
            outputs[i] = _row(c.text if c else None, c.finish_reason if c else None, res.num_input_tokens,
                              res.num_generated_tokens, res.error, res.attempts or 0)
        return batch.append_column(self.output_col, pa.array(outputs, type=output_type()))

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


def _row(content, finish_reason, prompt_tokens, completion_tokens, error, attempts) -> dict[str, Any]:
    return {"content": content, "finish_reason": finish_reason,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
            "error": error, "attempts": attempts}


def ai_query(
    ds: "ray.data.Dataset",
    model: str,
    *,
    prompt_col: str | None = None,
    messages_col: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    output_col: str = "generated_text",
    options: dict[str, Any] | None = None,
    concurrency: int = 4,
    batch_size: int = 8,
    max_retries: int = 5,
    aimd: AIMDConfig | dict[str, Any] | None = None,
    timeout_s: float = 600.0,
    retry: dict[str, Any] | None = None,
    num_cpus: float = 0.25,
    task: str = "generate",
) -> "ray.data.Dataset":
    """Add `output_col` to every row of `ds`: the endpoint's answer to the row's prompt or messages.

    Args:
        ds: the input Ray Dataset.
        model: the served model id (as the endpoint's /v1/models lists it).
        prompt_col: column of prompt text, sent as one user message (give this or messages_col).
        messages_col: column of chat messages (lists of {role, content}).
        base_url: the endpoint root, e.g. "http://127.0.0.1:8000/v1" (default: $OPENAI_BASE_URL).
        api_key: the API key (default: $OPENAI_API_KEY, else none).
        output_col: the new column, a struct of content, finish_reason, usage (prompt_tokens,
            completion_tokens), error (None on success) and attempts (HTTP attempts made).
        options: chat-completion arguments (temperature, max_tokens, stop, seed, extra_body, ...).
        concurrency: Ray actors sending requests, each with its own AIMD window.
        batch_size: in-flight requests per actor at start (the AIMD initial window).
        max_retries: retries of a failing request (408/429/5xx/timeouts) before the row keeps its error.
        aimd: AIMD settings (floor, ceiling, factors...); see `fleetllm.engines.openai.aimd.AIMDConfig`.
        timeout_s: timeout of one HTTP attempt.
        retry: backoff settings (initial_backoff_s, max_backoff_s, jitter); see `RetryPolicy`.
        num_cpus: CPUs reserved per actor (the work is network-bound).
        task: "generate" (chat completions) or "embed" (POST /embeddings of prompt_col's text; options may
            hold only `dimensions`; the output column is a struct of embedding, prompt_tokens, error, attempts).

    Returns:
        A lazy Ray Dataset with the input columns and `output_col`. No row is dropped.
    """
    options = dict(options or {})
    base_url = base_url or os.environ.get("OPENAI_BASE_URL")
    _check_task(task, messages_col, options)
    _check_arguments(ds, model, prompt_col, messages_col, output_col, options, concurrency, batch_size,
                     max_retries, base_url)
    if aimd is None:
        aimd_config = AIMDConfig(initial_window=batch_size)
    elif isinstance(aimd, AIMDConfig):
        aimd_config = aimd
    else:
        try:
            aimd_config = AIMDConfig.model_validate({"initial_window": batch_size, **dict(aimd)})
        except Exception as exc:
            raise SpecError(f"aimd settings are invalid: {exc}") from None
    engine_kwargs = {"base_url": base_url, "api_key": api_key, "model": model, "timeout_s": timeout_s,
                     "max_retries": max_retries, "aimd": aimd_config.model_dump(), "retry": dict(retry or {})}
    # Enough rows per call that the actor's concurrent batches can fill its AIMD ceiling.
    rows_per_call = max(batch_size, math.ceil(aimd_config.max_window / ASYNC_BATCHES_PER_ACTOR))
    return ds.map_batches(
        _QueryActor,
        fn_constructor_kwargs={"model": model, "engine_kwargs": engine_kwargs, "prompt_col": prompt_col,
                               "messages_col": messages_col, "output_col": output_col, "options": options,
                               "task": task},
        batch_size=rows_per_call,
        batch_format="pyarrow",
        concurrency=concurrency,
        num_cpus=num_cpus,
    )


def _check_task(task: str, messages_col: str | None, options: dict[str, Any]) -> None:
    if task not in ("generate", "embed"):
        raise SpecError(f"task={task!r}: use 'generate' (chat completions) or 'embed' (embeddings)")
    if task != "embed":
        return
    if messages_col is not None:
        raise SpecError("task='embed' embeds text: give prompt_col= (a text column), not messages_col=")
    other = sorted(set(options) - {"dimensions"})
    if other:
        raise SpecError(f"options {other} do not apply to task='embed'; embeddings take only `dimensions`")


def _check_arguments(ds, model, prompt_col, messages_col, output_col, options, concurrency, batch_size,
                     max_retries, base_url) -> None:
    if (prompt_col is None) == (messages_col is None):
        raise SpecError("give exactly one of prompt_col= (prompt text) or messages_col= (chat messages); "
                        f"got prompt_col={prompt_col!r}, messages_col={messages_col!r}")
    if not isinstance(model, str) or not model:
        raise SpecError(f"model must be the served model id (a non-empty string); got {model!r}")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise SpecError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1 (or set $OPENAI_BASE_URL); "
                        f"got {base_url!r}")
    for name, value, least in (("concurrency", concurrency, 1), ("batch_size", batch_size, 1),
                               ("max_retries", max_retries, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SpecError(f"{name} must be a whole number >= {least}; got {value!r}")
    bad = [k for k in FORBIDDEN_OPTIONS if k in options]
    if bad:
        raise SpecError(f"options may not set {bad}: ai_query sets model and the prompt itself and does not "
                        "stream; remove them")
    from fleetllm.engines.fields import FieldError, check_sampling

    try:  # the one field table (fleetllm.engines.fields): what engine openai sends, with types and ranges
        check_sampling(options, "openai")
    except FieldError as exc:
        raise SpecError(f"options: {exc}") from None
    if options.get("n", 1) != 1:
        raise SpecError(f"options n={options['n']!r}: ai_query returns one completion per row; use n=1")
    columns = ds.columns()
    col = prompt_col or messages_col
    if col not in columns:
        which = "prompt_col" if prompt_col else "messages_col"
        raise SpecError(f"{which}={col!r} is not a column of the dataset; its columns are {columns}")
    if output_col in columns:
        raise SpecError(f"output_col={output_col!r} is already a column of the dataset; choose another name")
