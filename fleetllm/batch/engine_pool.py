"""The engine stage's actor pool: how many replicas, what each reserves, how many batches each holds.

Shared by `fleetllm run` (fleetllm.batch.runner) and the processor API (fleetllm.batch.processor), so
both place replicas the same way:

- one actor per replica, sized by `fleetllm.sizing` (GPUs = tensor x pipeline parallel size on vLLM,
  a placement group per replica when that is more than one);
- engines that take batches from several threads at once (`Engine.concurrent_batches`: vLLM's async
  engine, the openai engine) get several batches in flight per replica, so the engine's running
  batch stays full while a finished batch travels back and the next one arrives. A replica that
  drains one synchronous batch before it may start the next starves vLLM: ../shared/gpu/README.md
  measured 0.40 of bare vLLM that way with batches of 64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleetllm.sizing import ReplicaPlan, ray_remote_args_fn

# Requests a concurrent replica aims to hold: above vLLM's max_num_seqs (256 by default, up to 1024 on
# H100/H200-class GPUs), so its scheduler always has waiting requests to admit.
TARGET_ROWS_IN_FLIGHT = 1024
MAX_BATCHES_IN_FLIGHT = 64


def engine_is_concurrent(engine: str) -> bool:
    from fleetllm.engines.base import engine_class

    return bool(engine_class(engine).concurrent_batches)


def batches_in_flight(engine: str, batch_size: int, requested: int | str = "auto") -> int:
    """Batches one replica works on at once: 1 for engines that take one batch at a time; for
    concurrent engines `requested`, or (auto) enough batches for TARGET_ROWS_IN_FLIGHT rows."""
    if not engine_is_concurrent(engine):
        return 1
    if requested != "auto":
        return int(requested)
    return max(2, min(MAX_BATCHES_IN_FLIGHT, math.ceil(TARGET_ROWS_IN_FLIGHT / batch_size)))


@dataclass
class EnginePool:
    """Everything `ds.map_batches(EngineStage, **pool.map_batches_kwargs())` needs."""

    engine: str
    model_path: str
    engine_kwargs: dict[str, Any]
    replica_plan: ReplicaPlan
    batch_size: int
    in_flight: int = 1
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 2
    placement_groups: list = field(default_factory=list)  # pre-reserved, one per replica (TP/PP > 1)

    def map_batches_kwargs(self) -> dict[str, Any]:
        import ray

        plan = self.replica_plan
        strategy = ray.data.ActorPoolStrategy(
            size=plan.replicas,
            # Ray Data runs a synchronous callable one call at a time unless told otherwise; a
            # concurrent engine takes `in_flight` calls at once, and one more queued per call.
            max_concurrent_calls_per_actor=self.in_flight,
            enable_true_multi_threading=self.in_flight > 1,
            max_tasks_in_flight_per_actor=2 * self.in_flight,
        )
        kwargs: dict[str, Any] = dict(
            fn_constructor_kwargs=dict(engine_name=self.engine, model_path=self.model_path,
                                       engine_kwargs=self.engine_kwargs,
                                       chat_template_kwargs=self.chat_template_kwargs,
                                       max_retries=self.max_retries),
            batch_size=self.batch_size, batch_format="pyarrow", compute=strategy,
            num_cpus=plan.cpus_per_replica,
        )
        if plan.uses_placement_group:
            # The actor takes bundle 0 of its own group; vLLM's Ray workers take the GPU bundles.
            kwargs["ray_remote_args_fn"] = ray_remote_args_fn(plan, self.placement_groups)
        elif plan.gpus_per_replica:
            kwargs["num_gpus"] = plan.gpus_per_replica
        return kwargs

    def describe(self) -> str:
        return (f"{self.replica_plan.replicas} replica(s), {self.in_flight} batch(es) of {self.batch_size} "
                f"rows in flight per replica")
