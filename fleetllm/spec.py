"""Job specs: strict pydantic models, loaded from YAML with a safe loader.

The CLI, the Python API and the YAML file are three faces of these models. Every field carries a
description; unknown fields are refused with their path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetllm.engines.capabilities import declared
from fleetllm.engines.fields import DEFAULT_MAX_TOKENS
from fleetllm.environment import EnvironmentSpec
from fleetllm.errors import SpecError, validation_problems
from fleetllm.structured_spec import StructuredOutputsSpec

DEFAULT_MODEL = "smollm2-135m-instruct"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(StrictModel):
    source: str = Field(
        DEFAULT_MODEL,
        description="Model alias (see `fleetllm models list`), a local folder, or a Hugging Face id.",
    )
    engine: Literal["transformers", "vllm", "openai", "auto"] = Field(
        "auto", description="Inference engine: transformers, vllm, openai (an OpenAI-compatible endpoint, "
        "engine_kwargs.base_url), or auto (vLLM when it is usable)."
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the engine unchanged."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the tokenizer's chat template, e.g. {enable_thinking: false}.",
    )
    revision: str | None = Field(None, description="Hub revision (commit, tag or branch) of a hub id.")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters over this model, {name: source}; a source is a local "
        "folder, an object-store URL (s3://...) or a hub id of a peft adapter. Rows pick one with adapter_column.")
    adapter_column: str | None = Field(
        None, description="Column naming each row's LoRA adapter (a name in lora_adapters; empty: the base model). "
        "Rows are grouped by adapter in each engine call.")

    @model_validator(mode="after")
    def _adapters(self) -> "ModelSpec":
        from fleetllm.adapters import check_names

        check_names(self.lora_adapters)
        if self.adapter_column and not self.lora_adapters:
            raise ValueError("model.adapter_column names each row's LoRA adapter, but model.lora_adapters is empty; "
                             "list the adapters as {name: source}")
        if self.lora_adapters and declared(self.engine).is_endpoint:
            raise ValueError("model.lora_adapters load adapters into a local engine; for engine openai name the "
                             "endpoint's adapter as model.source instead")
        return self


class InputSpec(StrictModel):
    path: str = Field(..., description="A file or folder, local or an fsspec URL (s3://, gs://, ...), or a "
                      "Hugging Face dataset: hf://datasets/ORG/NAME, a save_to_disk folder or a local dataset repo.")
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "openai_batch", "hf"] = Field(
        "auto", description="Input format; auto picks it from the file extension (hf for an hf:// path or "
        "when input.split is set)."
    )
    split: str | None = Field(None, description="Hugging Face datasets: the split, with datasets' slicing "
                              "syntax, e.g. 'train' or 'train[:1000]' (default train).")
    revision: str | None = Field(None, description="Hugging Face datasets: hub revision (commit, tag, branch).")
    columns: list[str] | None = Field(None, description="Keep only these input columns (default: all).")
    id_column: str | None = Field(
        None, description="Column holding a stable row id; default: derived from file and position."
    )
    limit: int | None = Field(None, ge=1, description="Read only the first N rows (for trials).")

    @model_validator(mode="after")
    def _hf_format(self) -> "InputSpec":
        if self.format == "auto" and (self.path.startswith("hf://") or self.split is not None):
            self.format = "hf"
        if self.format != "hf" and (self.split is not None or self.revision is not None):
            raise ValueError(f"input.split/input.revision apply to Hugging Face datasets, not input.format "
                             f"{self.format}; remove them or set input.format: hf")
        return self


class ImagesSpec(StrictModel):
    """Limits on the images of chat messages (image_url parts, or prompt.image_column)."""

    max_images: int = Field(8, ge=1, description="Images per prompt; more is the row's error.")
    max_bytes: int = Field(20 << 20, ge=1, description="Encoded bytes of one image.")
    max_pixels: int = Field(40_000_000, ge=1, description="Width x height of one image.")
    fetch_timeout_s: float = Field(10.0, gt=0, description="Seconds to fetch one http(s) image.")
    allow_private_urls: bool = Field(False, description="Fetch http(s) images from private, loopback and "
                                     "link-local addresses too (refused by default).")

    def limits(self, local_files: bool = True):
        from fleetllm.engines.images import ImageLimits

        return ImageLimits(**self.model_dump(), local_files=local_files)


class PromptSpec(StrictModel):
    system: str | None = Field(None, description="System message prepended to every conversation.")
    image_column: str | None = Field(
        None, description="Column holding an image for the user message, placed before prompt.template's "
        "text: bytes, a local path, an object-store URL, an https:// URL or a data: URL.")
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Limits on each row's images.")
    template: str | None = Field(
        None,
        description="User message formatted from the row's columns, e.g. '{instruction}'. "
        "Leave empty when rows carry their own `messages` (or `prompt`) column.",
    )

    @field_validator("template")
    @classmethod
    def _template_parses(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from fleetllm.templates import TemplateError, fields

        try:
            fields(value)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        if not value.strip():
            raise ValueError("prompt.template is empty; give a template such as '{instruction}'")
        return value


def template_fields(template: str) -> list[str]:
    """The column names a template refers to, in order, without duplicates (fleetllm.templates)."""
    from fleetllm.templates import column_names

    return column_names(template)


class SamplingSpec(StrictModel):
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, description="Most tokens to generate per completion. Set, "
                            "prompt + max_tokens must fit the model's context (else the row gets an error, as OpenAI "
                            f"and vLLM answer); left out, {DEFAULT_MAX_TOKENS} capped to what the context leaves.")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling probability mass.")
    top_k: int | None = Field(None, ge=1, description="Sample from the k most likely tokens only.")
    stop: list[str] | None = Field(None, description="Stop strings; the text ends before them.")
    seed: int | None = Field(None, description="Random seed for reproducible sampling.")
    n: int = Field(1, ge=1, description="Completions per row (one output row each, with `index`).")
    logprobs: int | None = Field(None, ge=0, description="Return this many top log-probabilities.")
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="More request fields (presence_penalty, logit_bias, vLLM's ignore_eos, min_tokens, ...); "
        "each must be honoured by the job's engine (docs/request-fields.md), checked at plan time.",
    )
    structured_outputs: StructuredOutputsSpec | None = Field(
        None, description="Constrain every output: a JSON schema (inline, json_file or a pydantic model), any "
        "JSON object, a choice, a regex or a grammar. The output gains `parsed` (JSON text) and an `error` "
        "where the text does not validate.")

    def as_params(self) -> dict[str, Any]:
        """The sampling settings (the job's fingerprint and plan-time check)."""
        params = self.model_dump(exclude={"extra", "structured_outputs"}, exclude_none=True)
        params.update(self.extra)
        if self.structured_outputs is not None:
            params["structured_outputs"] = self.structured_outputs.as_params()
        return params

    def request_params(self, engine: str | None = None) -> dict[str, Any]:
        """The job's request sampling, handed once to each replica (JobPlan.request_sampling -> EngineStage) and
        the defaults of a Batch line's body: max_tokens only when set (a set value must fit the context; left
        out, the local engines cap their default to it). Engine openai always gets it."""
        params = self.as_params()
        if "max_tokens" not in self.model_fields_set and not declared(engine).is_endpoint:
            params.pop("max_tokens")
        return params


class OutputSpec(StrictModel):
    path: str = Field(..., description="Output folder: data files (part-*.parquet), _fleetllm/ (commits, report) "
                      "and the run record _SUCCESS.")
    format: Literal["parquet", "jsonl", "openai_batch"] = Field("parquet", description="Data file format.")
    shard_rows: int = Field(1000, ge=1, description="Rows per shard, the unit of commit and resume.")


class WaitFor(StrictModel):
    gpus: int | None = Field(None, ge=1, description="Wait until the cluster has this many GPUs.")
    cpus: int | None = Field(None, ge=1, description="Wait until the cluster has this many CPUs.")


class ComputeSpec(StrictModel):
    replicas: int | Literal["auto"] = Field(1, description="Engine replicas, or auto (as many as fit).")
    batch_size: int = Field(
        16, ge=1, description="Rows handed to a replica at a time. Engines vllm and openai: default "
        "output.shard_rows, a whole shard per call: vllm schedules the rows itself, and an openai call waits "
        "for its slowest row, so smaller batches leave the endpoint idle (fleetllm/query/window.py).")
    cpus_per_replica: float = Field(1.0, gt=0, description="CPUs reserved per replica (CPU engines).")
    gpus_per_replica: float | None = Field(
        None, ge=0, description="GPUs per replica; default: tensor x pipeline parallel size on vLLM, 0 otherwise."
    )
    batches_in_flight: int | Literal["auto"] = Field(
        "auto", description="Batches a replica works on at once. Engines that batch continuously (vllm, "
        "openai) keep several in flight so the engine never waits for the next batch; auto = enough for "
        "~1024 rows (at most 64 batches). Always 1 on the transformers engine."
    )
    max_retries: int = Field(
        2, ge=0, description="Re-runs of a row when the engine call for its batch raises (a crash, not a "
        "per-row error such as a prompt that is too long, which is final). Engines transformers and vllm; "
        "engine openai retries each HTTP request itself (model.engine_kwargs.max_retries) and refuses this "
        "setting, so the two never multiply.")
    prefix_grouping: Literal["off", "auto", "on"] = Field(
        "auto", description="Put rows whose prompts share a prefix (a document asked several questions) in the "
        "same shards, next to each other, so the engine's prefix cache computes each prefix once. on: always "
        "(the input is partitioned once into OUT/_fleetllm/grouped/; output rows keep their row_id, in prefix "
        "order); auto: on when a sample of the rows shows shared prefixes and the job has >= 256 rows; off: "
        "input order. Generate jobs, keyed on their own template/messages/prompt (openai_batch input: each line's "
        "messages or prompt); never embed jobs.")
    wait_for: WaitFor | None = Field(None, description="Resources to wait for before starting.")
    wait_timeout_s: float = Field(600.0, gt=0, description="How long to wait for `wait_for`.")
    deadline: str | None = Field(
        None, description="When the job must be done: a duration from the start (90m, 2h30m, 1d) or a time "
        "(2026-12-06T08:00:00Z; no zone = UTC). With replicas: auto the plan runs the fewest replicas whose "
        "estimate (its upper end, from the throughput profile: fleetllm calibrate) meets it; a deadline the "
        "cluster cannot meet is refused before anything starts, naming the shortfall. Needs a profile.")
    price_per_accelerator_hour: float | None = Field(
        None, ge=0, description="Price of one accelerator-hour (a GPU; on CPU replicas, one replica) in your "
        "currency: the estimate (fleetllm run --dry-run) then gives the job's cost.")

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value):
        from datetime import datetime

        from fleetllm.estimate.deadline import parse_deadline

        if isinstance(value, datetime):  # YAML reads an unquoted time as a datetime
            value = value.isoformat()
        if value is not None:
            parse_deadline(str(value))
        return value

    @field_validator("replicas", "batches_in_flight")
    @classmethod
    def _count_or_auto(cls, value: int | str, info) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"compute.{info.field_name} is {value}; use a whole number >= 1 or 'auto'")
        return value


class ClusterSpec(StrictModel):
    address: str | None = Field(
        None, description="Ray cluster address (host:port or 'auto'); default: $RAY_ADDRESS, else a local Ray."
    )


class JobSpec(StrictModel):
    name: str = Field("job", description="Job name, used in reports.")
    task: Literal["generate", "embed"] = Field(
        "generate", description="generate: text completions (generated_text). embed: one vector per row "
        "(an `embedding` column, fixed-size list<float32>) of prompt.template or the row's `text`/`prompt` "
        "column, with an embedding model (e.g. all-minilm-l6-v2). OpenAI Batch input: the lines' url decides "
        "(/v1/embeddings embeds).")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Which model and engine.")
    input: InputSpec = Field(..., description="Where the rows come from.")
    prompt: PromptSpec = Field(default_factory=PromptSpec, description="How a row becomes a conversation.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Generation settings.")
    output: OutputSpec = Field(..., description="Where the results go.")
    compute: ComputeSpec = Field(default_factory=ComputeSpec, description="Replicas and batching.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Which Ray cluster.")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec,
                                         description="pip, env_vars, working_dir: Ray's runtime_env for the replicas.")

    @model_validator(mode="after")
    def _openai_engine(self) -> "JobSpec":
        if not declared(self.model.engine).is_endpoint:
            return self
        from fleetllm.engines.openai.engine import parse_engine_kwargs

        try:
            settings = parse_engine_kwargs(self.model.engine_kwargs)
        except SpecError as exc:
            raise ValueError(f"model.{exc}") from None
        # $OPENAI_BASE_URL read here, on the driver: the replicas (maybe on other machines) get it in the spec
        self.model.engine_kwargs.setdefault("base_url", settings.base_url)
        if "source" not in self.model.model_fields_set and not settings.model:
            raise ValueError("engine openai needs the served model id: set model.source to the id the endpoint "
                             "lists at GET /v1/models (or model.engine_kwargs.model)")
        if "max_retries" in self.compute.model_fields_set:
            raise ValueError(
                f"compute.max_retries ({self.compute.max_retries}) does not apply to engine openai, which retries "
                "each HTTP request itself; set model.engine_kwargs.max_retries instead "
                f"(now {settings.max_retries}) and remove compute.max_retries")
        return self

    @model_validator(mode="after")
    def _embed_task(self) -> "JobSpec":
        if self.task != "embed":
            return self
        set_sampling = sorted(self.sampling.model_fields_set)
        if set_sampling:
            raise ValueError(f"task embed generates no text, so sampling ({', '.join(set_sampling)}) does not apply; "
                             "remove the sampling section")
        if self.prompt.system:
            raise ValueError("task embed embeds text as it is: prompt.system (a chat message) does not apply; "
                             "put any prefix into prompt.template")
        return self

    @model_validator(mode="after")
    def _image_column(self) -> "JobSpec":
        if self.prompt.image_column and not self.prompt.template:
            raise ValueError("prompt.image_column places an image beside prompt.template's text; set "
                             "prompt.template too (rows with their own messages carry image_url parts)")
        return self

    @model_validator(mode="after")
    def _openai_batch_pairs(self) -> "JobSpec":
        if self.input.format == "openai_batch" and self.prompt.template:
            raise ValueError(
                "input.format openai_batch carries its own messages; remove prompt.template"
            )
        return self


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise SpecError(f"spec file {str(path)!r} does not exist; check the path")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold a YAML mapping (key: value lines), got {type(data).__name__}")
    return data


def format_validation_error(exc: ValidationError, source: str) -> str:
    problems = validation_problems(exc.errors())
    lines = [f"{source}: {exc.error_count()} problem(s) in the spec"]
    lines += [f"  {what}" if where == "(top level)" else f"  {where}: {what}" for where, what in problems]
    return "\n".join(lines)


def parse_spec(model: type[BaseModel], data: dict[str, Any], source: str = "spec"):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, source)) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Load and validate a job YAML file; relative input paths stay relative to the cwd."""
    return parse_spec(JobSpec, load_yaml(path), str(path))
