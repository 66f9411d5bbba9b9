"""Ray's field names and shapes in the processor configs (`ray.data.llm`'s vLLMEngineProcessorConfig):
aliases where fleetllm's names differ, Ray's behaviour where fleetllm has it, a refusal naming the field
where it has not. Applied before validation (`_ProcessorConfig`), so a Ray example runs with the import
changed."""

from __future__ import annotations

from typing import Any

from fleetllm.errors import SpecError

RENAMED = {"max_concurrent_batches": "batches_in_flight"}  # Ray's name -> fleetllm's
DOC = "https://docs.ray.io/en/latest/data/api/llm.html"


def from_ray_names(data: Any) -> Any:
    """The config's data with Ray's names and shapes turned into fleetllm's (a SpecError names what fleetllm
    does not do)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for ray_name, ours in RENAMED.items():
        if ray_name in data:
            if ours in data:
                raise SpecError(f"give {ray_name} (Ray's name) or {ours}, not both")
            data[ours] = data.pop(ray_name)
    concurrency = data.get("concurrency")
    if isinstance(concurrency, (tuple, list)):
        if len(concurrency) != 2 or concurrency[0] != concurrency[1]:
            raise SpecError(f"concurrency={tuple(concurrency)!r} asks Ray Data for an autoscaling pool of "
                            "(min, max) replicas; fleetllm runs a fixed number of replicas: give an int (or (n, n))")
        data["concurrency"] = concurrency[0]
    task = data.pop("task_type", "generate")
    if task not in ("generate", "auto"):
        raise SpecError(f"task_type={task!r}: the processor generates text (task_type 'generate'); embed with "
                        "`fleetllm run` (model.task: embed) or the serve API's /v1/embeddings")
    if data.pop("should_continue_on_error", True) is False:
        raise SpecError("should_continue_on_error=False (fail the dataset on a row's error) is not what fleetllm "
                        "does: every row's error is recorded in its `error` column and no row is dropped; leave "
                        "it out or set True")
    return data
