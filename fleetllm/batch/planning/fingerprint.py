"""The job fingerprint: a hash of everything that changes outputs.

Parts: the model (resolved path and weight files' identity, or hub id and revision), the engine and
its version, output-affecting engine_kwargs, sampling, the prompt (system + template, or the
preprocess function's source), chat_template_kwargs and the output format. Each shard adds its
input identity (batch/planning/shards.py: shard_fingerprint).
"""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any, Callable

from fleetllm.batch.planning.shards import job_fingerprint
from fleetllm.models import ResolvedModel, weights_identity

# engine_kwargs that change speed or memory, never the text generated.
NON_OUTPUT_KWARGS = frozenset({
    "gpu_memory_utilization", "enforce_eager", "num_threads", "max_num_seqs", "max_num_batched_tokens",
    "tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend", "swap_space",
    "disable_log_stats", "max_batch_tokens", "enable_prefix_caching", "kv_cache_memory_bytes",
    "cpu_offload_gb", "block_size", "concurrency", "timeout_s", "max_retries", "api_key",
    # engine openai: how fast and how often it asks, not what. The endpoint's address is not the model
    # (the served id, model.source, is): a job resumes against its endpoint restarted on another port/host.
    "api_key_env", "aimd", "retry", "base_url", "max_response_mb",
})

ENGINE_PACKAGES = {"transformers": "transformers", "vllm": "vllm", "openai": "openai"}


def engine_version(engine: str) -> str:
    package = ENGINE_PACKAGES.get(engine, engine)
    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def model_identity(model: ResolvedModel) -> dict[str, Any]:
    if model.kind == "served":  # engine openai; the endpoint (base_url) is in engine_kwargs
        return {"served_id": model.path}
    if model.kind == "hub":
        return {"hub_id": model.path, "revision": model.revision}
    return {"path": model.path, "files": weights_identity(model.path)}


def source_of(fn: Callable | None) -> str | None:
    if fn is None:
        return None
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))


def fingerprint_parts(*, model: ResolvedModel, engine: str, engine_kwargs: dict[str, Any],
                      sampling: dict[str, Any], prompt: dict[str, Any], chat_template_kwargs: dict[str, Any],
                      output_format: str, preprocess: Callable | None = None) -> dict[str, Any]:
    return {
        "model": model_identity(model),
        "engine": {"name": engine, "version": engine_version(engine)},
        "engine_kwargs": {k: v for k, v in sorted(engine_kwargs.items()) if k not in NON_OUTPUT_KWARGS},
        "sampling": sampling,
        "prompt": prompt,
        "preprocess": source_of(preprocess),
        "chat_template_kwargs": chat_template_kwargs,
        "output_format": output_format,
    }


def fingerprint(parts: dict[str, Any]) -> str:
    return job_fingerprint(parts)
