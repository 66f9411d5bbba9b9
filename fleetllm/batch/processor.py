"""The Python processor API, in the shape of `ray.data.llm`: a Ray user changes one import.

Example (runs as it is, on the embedded model)::

    import ray
    from fleetllm import build_processor, TransformersEngineProcessorConfig

    config = TransformersEngineProcessorConfig(model_source="smollm2-135m-instruct", concurrency=1, batch_size=16)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["instruction"]}],
            sampling_params=dict(temperature=0.0, max_tokens=32),
        ),
        postprocess=lambda row: dict(answer=row["generated_text"], **row),
    )
    ds = processor(ray.data.from_items([{"instruction": "What is the capital of France?"}]))
    ds.write_parquet("out/answers")

Rows enter the engine stage with `messages` (or `prompt`) and `sampling_params`, and reach
postprocess (and the output) with exactly the user's columns (the input's and preprocess's) plus
OUTPUT_COLUMNS: `generated_text`, `num_input_tokens`, `num_generated_tokens`, `finish_reason`, `error`
and `attempts`. Rows whose `sampling_params` carry a structured-output constraint (`response_format`
or `structured_outputs`, fleetllm.structured) also get `parsed` (JSON text) and an `error` where the
text does not satisfy it; `n` > 1 adds `completions`, `logprobs` adds `logprobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import ConfigDict, Field, model_validator

from fleetllm.batch import ray_names
from fleetllm.batch.execution.stages import OUTPUT_COLUMNS as STAGE_OUTPUT_COLUMNS

if TYPE_CHECKING:
    from fleetllm.batch.execution.engine_pool import EnginePool

Row = dict[str, Any]
TOKENIZE_BATCH_ROWS = 1024  # rows per tokenization task (the dataset's blocks may be any size)
OUTPUT_COLUMNS = (*STAGE_OUTPUT_COLUMNS, "attempts")  # the engine stage's, and the attempts each row took


class _ProcessorConfig(ray_names.RayProcessorFields):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_source: str = Field(..., description="Model alias, local folder, or Hugging Face id.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to the engine unchanged.")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Chat template variables.")
    concurrency: int | tuple[int, int] = Field(
        1, description="Engine replicas (actors), each loading the model once; (min, max): as many as fit, at "
        "most max.")
    batch_size: int = Field(16, ge=1, description="Rows handed to a replica at a time.")
    cpus_per_replica: float = Field(1.0, gt=0, description="CPUs reserved per replica.")
    gpus_per_replica: float | None = Field(
        None, ge=0, description="GPUs per replica; default: tensor x pipeline parallel size on vLLM with GPUs, else 0.")
    batches_in_flight: int | Literal["auto"] = Field(
        "auto", description="Batches a replica works on at once (vllm: auto keeps ~1024 rows in flight; "
        "transformers: 1).")
    max_retries: int = Field(2, ge=0, description="Retries of a failing row before its error is recorded.")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters {name: source}; a row whose `model` column names one "
        "runs on it (Ray Data LLM's convention), other rows on the base model.")
    engine: str = "transformers"

    @model_validator(mode="before")
    @classmethod
    def _ray_names(cls, data: Any) -> Any:  # max_concurrent_batches, (min, max) concurrency, task_type, ...
        return ray_names.normalize(data)

    @model_validator(mode="after")
    def _ray_checks(self) -> "_ProcessorConfig":
        if isinstance(self.concurrency, int) and self.concurrency < 1:
            raise ValueError(f"concurrency is {self.concurrency}; use 1 or more")
        ray_names.check(self)
        return self


class TransformersEngineProcessorConfig(_ProcessorConfig):
    """Hugging Face transformers engine: runs anywhere torch runs."""

    engine: Literal["transformers"] = "transformers"


class vLLMEngineProcessorConfig(_ProcessorConfig):  # noqa: N801 - the name ray.data.llm uses
    """vLLM engine; a replica uses tensor_parallel_size x pipeline_parallel_size GPUs."""

    engine: Literal["vllm"] = "vllm"


class Processor:
    """preprocess -> engine stage (an actor pool of replicas) -> postprocess, over a Ray Dataset."""

    def __init__(self, config: _ProcessorConfig, preprocess: Callable[[Row], Row] | None = None,
                 postprocess: Callable[[Row], Row] | None = None, preprocess_map_kwargs: dict[str, Any] | None = None,
                 postprocess_map_kwargs: dict[str, Any] | None = None) -> None:
        from fleetllm import models

        self.config = config
        self.preprocess = preprocess
        self.postprocess = postprocess
        self.preprocess_map_kwargs = dict(preprocess_map_kwargs or {})  # Dataset.map options (Ray's names)
        self.postprocess_map_kwargs = dict(postprocess_map_kwargs or {})
        self.model_path = models.resolve(config.model_source).path

    def pool(self) -> "EnginePool":
        """Replicas sized against the connected Ray cluster (started locally when none is running);
        PlanError when `concurrency` replicas do not fit. A replica that spans GPUs (TP/PP > 1)
        runs its vLLM workers in a placement group vLLM makes when the replica starts."""
        import ray

        from fleetllm import sizing
        from fleetllm.batch.execution.engine_pool import EnginePool
        from fleetllm.engines.images import ImageLimits, config_reads_images
        from fleetllm.sizing import batches_in_flight

        c = self.config
        if not ray.is_initialized():
            ray.init()
        plan = _fitting_plan(c)
        engine_kwargs = sizing.engine_kwargs_for(plan, c.engine_kwargs)
        if c.lora_adapters:
            from fleetllm.adapters import resolve_all

            engine_kwargs["lora_adapters"] = resolve_all(c.lora_adapters)
        images = ImageLimits(local_files=True).as_dict() if config_reads_images(self.model_path) else None
        return EnginePool(engine=c.engine, model_path=self.model_path, images=images,
                          engine_kwargs=engine_kwargs, replica_plan=plan,
                          batch_size=c.batch_size, in_flight=batches_in_flight(c.engine, c.batch_size,
                                                                               c.batches_in_flight),
                          chat_template_kwargs=c.chat_template_kwargs, max_retries=c.max_retries,
                          task=c.task_type, ray_remote_args=ray_names.ray_remote_args(c, plan.gpus_per_replica))

    def log_input_column_names(self) -> None:
        """Log (INFO, logger fleetllm.batch) the columns the engine stage reads, as Ray's Processor does."""
        ray_names.log.info("The first stage of the processor is the engine stage (%s).\nRequired input columns:\n"
                           "\tmessages or prompt: chat messages (OpenAI format) or prompt text\n"
                           "Optional input columns:\n\tsampling_params: the sampling settings (OpenAI / vLLM "
                           "names)", self.config.engine)

    def __call__(self, ds):
        if self.preprocess is not None:
            pre = self.preprocess
            ds = ds.map(lambda row: {**row, **pre(row)}, **self.preprocess_map_kwargs)
        if self.config.task_type == "embed":
            ds = ds.map(ray_names.with_embed_text)
        if self.config.lora_adapters:  # a row's `model` naming an adapter picks it; the base model's name or none
            pick = _AdapterPick(tuple(self.config.lora_adapters), (self.config.model_source, self.model_path))
            ds = ds.map(pick)
        ds = self.pool().apply(ds, tokenize_batch_size=TOKENIZE_BATCH_ROWS)
        post, config = self.postprocess, self.config

        def finish(row: Row) -> Row:
            row = ray_names.ray_output(_drop_internal(row), config)
            if not post or (config.should_continue_on_error and row.get("error")):
                return row  # Ray: error rows bypass postprocess
            return post(row)

        return ds.map(finish, **self.postprocess_map_kwargs)


class _AdapterPick:
    """A row's adapter from its `model` column (Ray Data LLM's convention): an adapter's name picks it; empty,
    absent or the base model's name (its source or path) is the base model; any other name is that row's error
    (a typo must not silently run on the base model)."""

    def __init__(self, adapters: tuple[str, ...], base_names: tuple[str, ...]) -> None:
        self.adapters, self.base_names = adapters, tuple(n for n in base_names if n)

    def __call__(self, row: Row) -> Row:
        name = row.get("model")
        row = {**row, "_adapter": None, "error": row.get("error")}
        if name is None or (isinstance(name, str) and not name.strip()) or name in self.base_names:
            return row
        if name in self.adapters:
            row["_adapter"] = name
        elif not row["error"]:
            row["error"] = (f"column 'model' names LoRA adapter {name!r}, which is not in lora_adapters "
                            f"{sorted(self.adapters)} nor the base model {self.base_names[0]!r}; fix the value or add "
                            "the adapter (empty means the base model)")
        return row


def _fitting_plan(c: _ProcessorConfig):
    """The replica plan for `concurrency` (for (min, max): the most replicas from max down to min that fit)."""
    from fleetllm import sizing
    from fleetllm.errors import PlanError

    counts = ray_names.replica_range(c.concurrency)
    for i, count in enumerate(counts):
        try:
            return sizing.plan_replicas(c.engine, c.engine_kwargs, count, c.cpus_per_replica, c.gpus_per_replica,
                                        sizing.cluster_resources())
        except PlanError:
            if i == len(counts) - 1:
                raise


def _drop_internal(row: Row) -> Row:
    """The row without the columns the engine stage adds for `fleetllm run` (its replica's telemetry `_run`,
    the token ids handed to vLLM): the user's columns and OUTPUT_COLUMNS stay."""
    from fleetllm.batch.execution.stages import INTERNAL_COLUMNS

    for name in INTERNAL_COLUMNS:
        if name.startswith("_"):  # `sampling_params` and `messages` are the user's preprocess's
            row.pop(name, None)
    return row


def build_processor(config: _ProcessorConfig, preprocess: Callable[[Row], Row] | None = None,
                    postprocess: Callable[[Row], Row] | None = None,
                    preprocess_map_kwargs: dict[str, Any] | None = None,
                    postprocess_map_kwargs: dict[str, Any] | None = None,
                    builder_kwargs: dict[str, Any] | None = None) -> Any:
    """Build a processor: a callable taking and returning a Ray Dataset. `*_map_kwargs` go to Dataset.map;
    `builder_kwargs` may carry `chat_template_kwargs` (Ray's builder argument). An HttpRequestProcessorConfig
    builds fleetllm.batch.http_processor's processor."""
    from fleetllm.batch.http_processor import HttpRequestProcessor, HttpRequestProcessorConfig

    if isinstance(config, HttpRequestProcessorConfig):
        if builder_kwargs:
            raise ValueError("builder_kwargs are not read by the HTTP request processor")
        return HttpRequestProcessor(config, preprocess, postprocess, preprocess_map_kwargs, postprocess_map_kwargs)
    extra = dict(builder_kwargs or {})
    if extra.get("chat_template_kwargs"):
        config = config.model_copy(update={"chat_template_kwargs": {**config.chat_template_kwargs,
                                                                    **extra.pop("chat_template_kwargs")}})
    extra.pop("chat_template_kwargs", None)
    if extra:
        raise ValueError(f"builder_kwargs {sorted(extra)} are not read by fleetllm; it reads chat_template_kwargs")
    return Processor(config, preprocess, postprocess, preprocess_map_kwargs, postprocess_map_kwargs)


build_llm_processor = build_processor  # Ray's older name
