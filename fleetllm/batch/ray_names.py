"""`ray.data.llm`'s field names and shapes on fleetllm's processor configs (docs/ray-compat.md).

A Ray Data LLM config (vLLMEngineProcessorConfig) validates here with its own names, so a Ray example runs
with the import changed: `max_concurrent_batches` is fleetllm's `batches_in_flight`; `task_type`,
`runtime_env`, `accelerator_type`, `placement_group_config`, `should_continue_on_error`, a `(min, max)`
concurrency, the legacy `apply_chat_template` / `chat_template` / `tokenize` / `detokenize` flags and the
`*_stage` configs (bool, dict or the stage config classes below) are read into fleetllm's settings, or
refused with a SpecError naming the field where fleetllm cannot do what Ray documents.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleetllm.engines.capabilities import declared
from fleetllm.errors import SpecError

log = logging.getLogger("fleetllm.batch")

RAY_ERROR_COLUMN = "__inference_error__"  # Ray's per-row error column (should_continue_on_error)
RENAMED = {"max_concurrent_batches": "batches_in_flight"}  # Ray's name -> fleetllm's
# Ray settings fleetllm sizes itself: accepted and not used (logged).
NOT_USED = ("max_pending_requests", "max_tasks_in_flight_per_actor", "log_engine_metrics")
STAGES = {"chat_template_stage": "apply_chat_template", "tokenize_stage": "tokenize",
          "detokenize_stage": "detokenize", "prepare_multimodal_stage": "has_image",
          "prepare_image_stage": "has_image"}


class _StageConfig(BaseModel):
    """Ray's per-stage config: fleetllm runs these steps inside its engine stage, so only `enabled` (and a
    chat template's settings) matter; the stage's own batch size, concurrency and resources are fleetllm's."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())
    enabled: bool = True
    batch_size: int | None = None
    concurrency: int | tuple[int, int] | None = None
    runtime_env: dict[str, Any] | None = None
    num_cpus: float | None = None
    memory: float | None = None
    model_source: str | None = None


class ChatTemplateStageConfig(_StageConfig):
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizerStageConfig(_StageConfig):
    pass


class DetokenizeStageConfig(_StageConfig):
    pass


class PrepareMultimodalStageConfig(_StageConfig):
    pass


PrepareImageStageConfig = PrepareMultimodalStageConfig


class RayProcessorFields(BaseModel):
    """The Ray Data LLM fields fleetllm's processor configs accept besides their own."""

    accelerator_type: str | None = Field(
        None, description="Ray's accelerator type the replicas run on (e.g. A10G, H100), as Ray Data's "
        "accelerator_type: a scheduling constraint of GPU replicas; replicas without GPUs log it and run.")
    runtime_env: dict[str, Any] | None = Field(None, description="Ray runtime_env of the replicas (pip, env_vars...).")
    task_type: str = Field("generate", description="Ray: generate | embed (an embedding model; `embedding` out); "
                           "auto is generate.")
    placement_group_config: dict[str, Any] | None = Field(
        None, description="Ray: the replica's bundles. fleetllm makes vLLM's placement group from TP x PP; a "
        "config asking for more GPUs than that is refused.")
    should_continue_on_error: bool | None = Field(
        None, description="Ray: record failed rows instead of raising. fleetllm always records them (`error`); "
        "True adds Ray's `__inference_error__` column too; False (raise) is refused.")
    apply_chat_template: bool = True
    tokenize: bool = True
    detokenize: bool = True
    has_image: bool = False  # Ray's image stage: fleetllm's runs whenever the model reads images


def _stage_enabled(value: Any) -> tuple[bool, dict[str, Any]]:
    if isinstance(value, bool):
        return value, {}
    data = value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else dict(value or {})
    return bool(data.pop("enabled", True)), data


def normalize(data: Any) -> Any:
    """A processor config's input with Ray's names turned into fleetllm's (a before-validator)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for ray_name, name in RENAMED.items():
        if ray_name in data:
            if name in data:
                raise SpecError(f"give {ray_name} (Ray's name) or {name}, not both")
            data[name] = data.pop(ray_name)
    for ray_name in NOT_USED:
        if ray_name in data:
            log.info("%s=%r: fleetllm sizes this itself; not used", ray_name, data.pop(ray_name))
    for key in ("dynamic_lora_loading_path",):
        if data.get(key) is not None:
            raise SpecError(f"{key} is not supported by fleetllm's processor; name each LoRA adapter in "
                            "lora_adapters={name: source} (a row's `model` picks it)")
        data.pop(key, None)
    chat_kwargs = dict(data.get("chat_template_kwargs") or {})
    if data.get("chat_template") is not None:
        chat_kwargs["chat_template"] = data.pop("chat_template")
    data.pop("chat_template", None)
    for stage, flag in STAGES.items():
        if stage not in data:
            continue
        enabled, settings = _stage_enabled(data.pop(stage))
        data[flag] = enabled
        if settings.get("chat_template"):
            chat_kwargs["chat_template"] = settings["chat_template"]
        chat_kwargs.update(settings.get("chat_template_kwargs") or {})
    if chat_kwargs:
        data["chat_template_kwargs"] = chat_kwargs
    concurrency = data.get("concurrency")
    if isinstance(concurrency, (tuple, list)):
        if len(concurrency) != 2 or not all(isinstance(c, int) and c > 0 for c in concurrency) \
                or concurrency[0] > concurrency[1]:
            raise SpecError(f"concurrency={tuple(concurrency)!r}: give an int or (min, max) with 1 <= min <= max")
        low, high = concurrency
        data["concurrency"] = low if low == high else (low, high)
    if data.get("task_type") == "auto":
        data["task_type"] = "generate"
    if data.get("should_continue_on_error") is False:
        raise SpecError("should_continue_on_error=False (fail the dataset on a row's error) is not what fleetllm "
                        "does: every row's error is recorded in its `error` column and no row is dropped; leave "
                        "it out or set True")
    return data


def check(config: Any) -> None:
    """Refuse what Ray documents and fleetllm cannot do, naming the field (an after-validator)."""
    if config.task_type not in ("generate", "embed"):
        raise SpecError(f"task_type={config.task_type!r}: fleetllm's processor generates or embeds; use "
                        "task_type='generate' or 'embed'")
    bundles = (config.placement_group_config or {}).get("bundles") or []
    gpus = sum(float(b.get("GPU", 0)) for b in bundles)
    if gpus and not declared(config.engine).shards_over_gpus:
        raise SpecError(f"placement_group_config asks for {gpus:g} GPUs; the {config.engine} engine runs a replica "
                        "in one actor: set gpus_per_replica instead")


def replica_range(concurrency: int | tuple[int, int]) -> list[int]:
    """Replica counts to try, largest first: (min, max) -> max..min (as Ray's autoscaling pool would reach)."""
    if isinstance(concurrency, tuple):
        return list(range(concurrency[1], concurrency[0] - 1, -1))
    return [concurrency]


def ray_remote_args(config: Any, gpus_per_replica: float) -> dict[str, Any]:
    """Ray options of the engine replicas' actors from the Ray fields: runtime_env, and accelerator_type where the
    replicas hold GPUs (a CPU replica has no accelerator to match: logged, so Ray's GPU examples run on a CPU)."""
    out = {"runtime_env": config.runtime_env} if config.runtime_env else {}
    if config.accelerator_type and gpus_per_replica:
        out["accelerator_type"] = config.accelerator_type
    elif config.accelerator_type:
        log.warning("accelerator_type=%r: the replicas run on CPU (no GPU per replica), so the type is not "
                    "passed to Ray", config.accelerator_type)
    return out


def ray_output(row: dict[str, Any], config: Any) -> dict[str, Any]:
    """Ray's output columns beside fleetllm's: `embeddings` (embed), `__inference_error__`."""
    if "embedding" in row and "embeddings" not in row:
        row["embeddings"] = row["embedding"]
    if config.should_continue_on_error:
        row[RAY_ERROR_COLUMN] = row.get("error")
    return row


def with_embed_text(row: dict[str, Any]) -> dict[str, Any]:
    """An embed row's text for the embed stage: its `text` or `prompt` column (Ray's embedding examples)."""
    from fleetllm.batch.execution.embed_stage import TEXT_COLUMNS

    text = next((row[c] for c in TEXT_COLUMNS if isinstance(row.get(c), str)), None)
    if text is None:
        row["error"] = f"an embed row needs a {' or '.join(TEXT_COLUMNS)} column (text)"
    return {"error": None, **row, "_embed_text": text or ""}
