"""The engine stage's actor pool: how many replicas, what each reserves, how many batches each holds.

Shared by `fleetllm run` (fleetllm.batch.runner) and the processor API (fleetllm.batch.processor), so
both place replicas the same way:

- one actor per replica, sized by `fleetllm.sizing` (GPUs = tensor x pipeline parallel size on vLLM;
  when that is more than one the actor takes only CPUs and vLLM places its GPU workers in a placement
  group it makes itself);
- engines that take batches from several threads at once (`Engine.concurrent_batches`: vLLM's async
  engine, the openai engine) get several calls in flight per replica, so the engine's running batch
  stays full while a finished call travels back and the next one arrives. A replica that drains one
  synchronous batch before it may start the next starves vLLM: it ran at 0.40 of bare vLLM that way
  with batches of 64 on an H200 (benchmarks/NOTES.md, change 1). How many calls: fleetllm.sizing.batches_in_flight.
- engines that take token ids (`Engine.takes_token_ids`: vLLM) get a stage before the replicas that
  renders the chat template and tokenizes (fleetllm.batch.execution.tokenize_stage), so a replica submits a
  whole call at once;
- in `fleetllm run` such an engine is handed a whole shard per call (unless compute.batch_size is
  set): Ray Data runs the batches of one block one after another, so smaller calls would cap a
  replica at batch_size x calls in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetllm.sizing import ReplicaPlan

@dataclass
class EnginePool:
    """Everything `ds.map_batches(EngineStage, **pool.map_batches_kwargs())` needs."""

    engine: str
    model_path: str
    engine_kwargs: dict[str, Any]
    replica_plan: ReplicaPlan
    batch_size: int  # rows per engine call
    in_flight: int = 1
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 2
    task: str = "generate"  # "embed": the replicas embed (fleetllm.batch.execution.embed_stage), no tokenize stage
    rows_in_flight: int | None = None  # rows one replica holds at once (sizes vLLM; not fingerprinted)
    images: dict[str, Any] | None = None  # image limits (fleetllm.engines.images.ImageLimits) of a generate job
    ray_remote_args: dict[str, Any] = field(default_factory=dict)  # runtime_env, accelerator_type (Ray Data LLM's)
    # the job's sampling (SamplingSpec.request_params), parsed once: rows without their own run with it
    sampling: dict[str, Any] = field(default_factory=dict)
    # a `fleetllm run` on Ray: the replicas report their engine's progress there (progress_board; the live ETA)
    progress_board: Any = None

    def tokenize_stage_kwargs(self, batch_size: int | None = None) -> dict[str, Any] | None:
        """Arguments of the preprocess tokenization stage for this pool's engine, or None
        (fleetllm.batch.execution.tokenize_stage)."""
        from fleetllm.batch.execution.tokenize_stage import tokenize_stage_kwargs

        if self.task == "embed":
            return None
        return tokenize_stage_kwargs(self.engine, self.model_path, self.engine_kwargs, self.chat_template_kwargs,
                                     batch_size)

    def table_stages(self, batch_size: int | None = None) -> list[tuple[Any, dict[str, Any]]]:
        """The stages between the prepared rows and the replicas, in order, as (fn, map_batches kwargs; the
        fn takes a pyarrow table and `kwargs["fn_kwargs"]`): the images fetched and decoded off the engine's
        path (a model that reads images), then the chat template and tokenization (an engine that takes token
        ids). batch_size: rows per task (None: a whole block). Run by the Ray Data stream (`apply`) and by a
        local run (fleetllm.batch.execution.pipeline.Stages.prepared_table)."""
        stages: list[tuple[Any, dict[str, Any]]] = []
        if self.images is not None and self.task == "generate":
            from fleetllm.batch.execution.image_stage import add_images, image_stage_kwargs

            stages.append((add_images, image_stage_kwargs(self.images, batch_size)))
        tokenize = self.tokenize_stage_kwargs(batch_size)
        if tokenize is not None:
            from fleetllm.batch.execution.tokenize_stage import add_prompt_token_ids

            stages.append((add_prompt_token_ids, tokenize))
        return stages

    def apply(self, ds, tokenize_batch_size: int | None = None):
        """ds -> the table stages -> the replicas, on Ray Data. tokenize_batch_size: rows per table-stage task
        (None: a whole block)."""
        for fn, kwargs in self.table_stages(tokenize_batch_size):
            ds = ds.map_batches(fn, **kwargs)
        return ds.map_batches(self.stage_class(), **self.map_batches_kwargs())

    def stage_class(self) -> type:
        """The replica's callable class: EngineStage (generate) or EmbedStage (embed)."""
        if self.task == "embed":
            from fleetllm.batch.execution.embed_stage import EmbedStage

            return EmbedStage
        from fleetllm.batch.execution.stages import EngineStage

        return EngineStage

    def stage_kwargs(self) -> dict[str, Any]:
        """The EngineStage's constructor arguments (one replica)."""
        kwargs = dict(engine_name=self.engine, model_path=self.model_path, engine_kwargs=self.engine_kwargs,
                      chat_template_kwargs=self.chat_template_kwargs, max_retries=self.max_retries,
                      rows_in_flight=self.rows_in_flight)
        if self.task != "embed":
            kwargs["sampling"] = dict(self.sampling)
            if self.progress_board is not None:
                kwargs["progress_board"] = self.progress_board
        return kwargs

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
            fn_constructor_kwargs=self.stage_kwargs(),
            batch_size=self.batch_size, batch_format="pyarrow", compute=strategy,
            num_cpus=plan.cpus_per_replica,
        )
        if plan.gpus_per_replica and not plan.uses_placement_group:  # else vLLM's workers hold the GPUs
            kwargs["num_gpus"] = plan.gpus_per_replica
        kwargs.update(self.ray_remote_args)
        return kwargs
