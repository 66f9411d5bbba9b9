"""The one Engine interface that batch/ and serve/ see.

An engine takes a list of requests (chat messages or a raw prompt, plus sampling parameters) and
returns one result per request, in order. A request that cannot be served (prompt too long, bad
sampling value) yields a result with `error` set; the others complete. Engine modules import their
heavy dependencies inside `start`, so importing fleetllm stays light.
"""

from __future__ import annotations

import abc
import collections
import importlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fleetllm.errors import PlanError, RowError
from fleetllm.structured import FIELDS as STRUCTURED_FIELDS
from fleetllm.structured import StructuredOutput, pop_constraint

# Sampling keys every engine understands; anything else is engine-specific and passed through.
COMMON_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "logprobs")


@dataclass
class GenerationRequest:
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""
    # The prompt already rendered and tokenized (batch pipeline, fleetllm.batch.execution.tokenize_stage); engines
    # that take token ids (`Engine.takes_token_ids`) use it instead of building the prompt again.
    prompt_token_ids: list[int] | None = None
    # At most one structured-output constraint (fleetllm.structured). `response_format` or
    # `structured_outputs` given in `sampling` move here, so engines never see them as sampling keys.
    structured: StructuredOutput | None = None
    # Scheduling priority in a serving engine: lower runs first (vLLM's order); Batch API rows get 1.
    priority: int = 0
    # The bytes of the messages' images, in order of their image parts (fleetllm.engines.images.load_images
    # has replaced each part's URL by image:N), and the LoRA adapter that serves the request (None: the base).
    images: list[bytes] | None = None
    adapter: str | None = None

    def __post_init__(self) -> None:
        if self.messages is None and self.prompt is None:
            raise RowError("the row has neither `messages` nor `prompt`; give one of them")
        if any(k in (self.sampling or {}) for k in STRUCTURED_FIELDS):
            constraint, self.sampling = pop_constraint(self.sampling)
            if constraint is not None and self.structured is not None and constraint != self.structured:
                raise RowError("the request carries two different structured-output constraints; give one")
            self.structured = self.structured or constraint


@dataclass
class Completion:
    text: str
    num_generated_tokens: int
    finish_reason: str  # "stop" | "length"
    index: int = 0
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class GenerationResult:
    completions: list[Completion] = field(default_factory=list)
    num_input_tokens: int = 0
    error: str | None = None
    attempts: int | None = None  # HTTP attempts made for the row (engines that retry, e.g. openai)
    num_cached_tokens: int | None = None  # prompt tokens found in the engine's prefix cache (vLLM says)

    @classmethod
    def failed(cls, error: str, num_input_tokens: int = 0) -> "GenerationResult":
        return cls(completions=[], num_input_tokens=num_input_tokens, error=error)

    @property
    def text(self) -> str | None:
        return self.completions[0].text if self.completions else None

    @property
    def num_generated_tokens(self) -> int:
        return sum(c.num_generated_tokens for c in self.completions)


@dataclass
class StreamDelta:
    """One step of a streamed completion (serving).

    `text` is the new text since the previous delta of the same `index`; `num_generated_tokens` counts
    the tokens of that completion so far (cumulative); `logprobs` holds entries for the new tokens.
    """

    index: int
    text: str
    num_generated_tokens: int
    finish_reason: str | None = None
    num_input_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None
    num_cached_tokens: int | None = None  # prompt tokens the engine found in its prefix cache (when it says)
    emitted_at: float | None = None  # time.monotonic() when the engine's output reached fleetllm (stream traces)


@dataclass
class EmbeddingRequest:
    """One text to embed: `text`, or its token ids (`token_ids`, OpenAI's token-array input)."""

    text: str | None = None
    token_ids: list[int] | None = None
    dimensions: int | None = None  # Matryoshka truncation (models that declare it), else None
    request_id: str = ""

    def __post_init__(self) -> None:
        if self.text is None and self.token_ids is None:
            raise RowError("nothing to embed: give text (or token ids)")


@dataclass
class EmbeddingResult:
    embedding: list[float] | None = None
    num_input_tokens: int = 0
    error: str | None = None
    attempts: int | None = None  # HTTP attempts made for the row (engines that retry, e.g. openai)

    @classmethod
    def failed(cls, error: str, num_input_tokens: int = 0) -> "EmbeddingResult":
        return cls(embedding=None, num_input_tokens=num_input_tokens, error=error)


@dataclass(frozen=True)
class EngineProgress:
    """An engine's batch work so far: requests (rows) `finished` and their output tokens, and the output
    tokens generated so far by each sequence still running that is past its prefill (`running`; those
    waiting or in prefill are not in it)."""

    finished: int
    finished_tokens: int
    running: tuple[int, ...]


@dataclass(frozen=True)
class GenerateTiming:
    """One static batch's clock (a `generate` of `width` sequences over prompts padded to `prompt_len`
    tokens): when its prefill gave the first token, and when its last of `steps` steps ended. It tells the
    prefill's time from the decode steps' (fleetllm.estimate.observe.split_call)."""

    width: int
    prompt_len: int
    steps: int
    first_token_at: float
    finished: float


def clean_sampling(sampling: dict[str, Any] | None) -> dict[str, Any]:
    """Drop unset (None) values: Arrow struct columns fill absent keys with nulls."""
    return {k: v for k, v in (sampling or {}).items() if v is not None}


class Engine(abc.ABC):
    """Base of the engines. Subclasses implement start, generate and stop."""

    name: str = "base"
    # True when `generate` may be called from several threads at once, each call's requests joining
    # the engine's running batch (vLLM's continuous batching, the openai engine's AIMD window). The
    # batch pipeline then keeps several batches in flight per replica.
    concurrent_batches: bool = False
    # True when the engine retries each request itself and reports a row that still fails as a
    # per-row error (the openai engine: engine_kwargs.max_retries HTTP retries with backoff). The
    # batch stage then never re-runs its rows (compute.max_retries does not apply), so the two
    # retry budgets cannot multiply.
    retries_requests: bool = False
    # True when the engine takes prompts as token ids built by the tokenizer of the model folder
    # (vLLM): the batch pipeline then renders and tokenizes rows in its preprocess tasks, off the
    # replica's critical path.
    takes_token_ids: bool = False

    def __init__(
        self,
        model_path: str,
        engine_kwargs: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        workload: str = "batch",
        rows_in_flight: int | None = None,
    ) -> None:
        """workload: "batch" (a batch job's replica) or "serve" (interactive requests, `fleetllm serve`);
        rows_in_flight: the rows a batch replica holds at once (an engine may size itself to them). Every
        engine takes both at construction; those that have no use for them ignore them."""
        if workload not in WORKLOADS:
            raise ValueError(f"workload {workload!r}: use one of {WORKLOADS}")
        self.model_path = model_path
        self.engine_kwargs = dict(engine_kwargs or {})
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.workload = workload
        self.rows_in_flight = rows_in_flight

    @abc.abstractmethod
    def start(self) -> None:
        """Load the model. Called once per replica."""

    @abc.abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Serve a batch; one result per request, in order."""

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Stream one request's completions (serving). Engines that serve override it."""
        raise NotImplementedError(f"the {self.name} engine does not stream")
        yield  # pragma: no cover

    # What the engine serves: "generate" (generate/generate_stream), "embed" (embed/aembed) or both.
    tasks: tuple[str, ...] = ("generate",)

    def embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        """Embed a batch; one result per request, in order (a bad row fails alone). Engines with the
        "embed" task override it (fleetllm.engines.embed_engines)."""
        raise NotImplementedError(f"the {self.name} engine does not embed; start it with task embed")

    async def aembed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        """`embed` for callers on an event loop (serving); by default runs `embed` in a thread."""
        import asyncio

        return await asyncio.to_thread(self.embed, requests)

    @property
    def embedding_dimensions(self) -> int | None:
        """Length of the vectors `embed` returns (embedding engines), else None."""
        return None

    def stop(self) -> None:
        """Release the model."""

    @property
    def version(self) -> str:
        return "unknown"

    @property
    def max_model_len(self) -> int | None:
        return None

    @property
    def start_compile_s(self) -> float | None:
        """Seconds the last start spent compiling the model (0.0: it compiled nothing, a warm or eager start;
        None: not known). A throughput profile keeps warm starts apart from cold ones (fleetllm.estimate)."""
        return None

    @property
    def default_max_num_seqs(self) -> int | None:
        """Sequences the engine schedules at once on this machine when engine_kwargs.max_num_seqs is not set
        (known once started; None: no such cap, or not known). Throughput profiles keep it (fleetllm.estimate)."""
        return None

    @property
    def prefix_block_tokens(self) -> int | None:
        """Tokens of one prefix-cache block (only whole blocks are reused: vLLM's 16 on a GPU, 128 on its CPU
        backend); None: no prefix cache, or not known. Throughput profiles keep it (estimates of cached tokens)."""
        return None

    @property
    def reads_images(self) -> bool:
        """Whether the model takes images (image_url parts; its config has a vision tower); False: such parts
        are refused as text-only."""
        from fleetllm.engines.images import config_reads_images

        return config_reads_images(self.model_path)

    @property
    def vocab_size(self) -> int | None:
        """Size of the model's output vocabulary (bounds logit_bias ids and top_k); None when unknown."""
        return None

    def streaming_failure(self) -> str | None:
        """Why this engine's streaming loop stopped (a replica that cannot stream is unhealthy); None while
        it runs or when the engine has no loop of its own."""
        return None

    def progress(self) -> "EngineProgress | None":
        """The batch work this engine has done so far, counted as it happens (a live ETA reads it between
        commits); None when the engine does not count it (its rows are seen only once complete)."""
        return None

    # the clocks of `generate` calls not taken yet (a deque the engine appends to); None: the engine keeps none
    _timings: "collections.deque | None" = None

    def take_generate_timings(self) -> "list[GenerateTiming]":
        """The clocks of the calls run since the last call (and forgets them): transformers' static batches, vLLM's
        calls of one output length while its statistics are on; [] for an engine that keeps none (the others'
        calls overlap: fleetllm.estimate.observe reads them as windows)."""
        taken = []
        while self._timings:
            taken.append(self._timings.popleft())
        return taken

    def streaming_stats(self) -> dict[str, Any]:
        """Counters of the streaming loop (queued, running, batches...), for /metrics; {} when none."""
        return {}

    def check_sampling(self, sampling: dict[str, Any] | None) -> dict[str, Any]:
        """A request's sampling dict checked against the field table (fleetllm.engines.fields) for this
        engine and the model's limits; raises FieldError (a RowError) naming the field."""
        from fleetllm.engines.fields import check_model_limits, check_sampling

        checked = check_sampling(sampling, self.name)
        check_model_limits(checked, self.vocab_size)
        return checked


WORKLOADS = ("batch", "serve")

ENGINES = {
    "transformers": "fleetllm.engines.transformers_engine:TransformersEngine",
    "vllm": "fleetllm.engines.vllm_engine:VLLMEngine",
    "openai": "fleetllm.engines.openai.engine:OpenAIHTTPEngine",
}


# The engines of the "embed" task, where it is a class of its own (openai embeds with its one class).
EMBED_ENGINES = {
    "transformers": "fleetllm.engines.transformers_embed:TransformersEmbedEngine",
    "vllm": "fleetllm.engines.vllm_embed:VLLMEmbedEngine",
}
TASKS = ("generate", "embed")


def engine_class(name: str, task: str = "generate") -> type[Engine]:
    if name not in ENGINES:
        raise PlanError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}")
    if task not in TASKS:
        raise PlanError(f"unknown task {task!r}; choose one of {list(TASKS)}")
    target = EMBED_ENGINES.get(name, ENGINES[name]) if task == "embed" else ENGINES[name]
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_engine(name: str, model_path: str, task: str = "generate", **kwargs: Any) -> Engine:
    return engine_class(name, task)(model_path, **kwargs)
