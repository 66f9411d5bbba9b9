"""The Ray Data stream of a batch job: Ray started or joined, the shards read, preprocessed, tokenized
(engines that take token ids) and run through the engine replicas, the rows handed back in order of
completion for the driver to assemble into shards and commit.

    from_items(shards) -> flat_map(read_shard_rows) -> map(preprocess)
        -> map_batches(each table stage: images, tokenize) -> map_batches(EngineStage, replicas)

the stages of fleetllm.batch.execution.pipeline, run by Ray Data.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from typing import Any, Callable

from rich.console import Console

from fleetllm import sizing
from fleetllm.batch.execution.telemetry import run_field
from fleetllm.batch.output.assemble import ShardAssembler
from fleetllm.batch.planning.job_plan import JobPlan, engine_pool
from fleetllm.spec import JobSpec


def init_ray(address: str | None, min_cpus: float = 1, runtime_env: dict[str, Any] | None = None) -> None:
    """Connect to `address` (or $RAY_ADDRESS); else start a private local Ray. `runtime_env` (the job's
    `environment:`) becomes the job's Ray runtime_env: every replica and task runs in it."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR",
                 runtime_env=runtime_env)
    if address:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR", runtime_env=runtime_env)
    else:
        cpus = sizing.local_cpus(min_cpus)  # +1: room for the read/prepare tasks
        # Ray starts its workers at nice 15; the engine replicas are the work here, and at nice 15 every
        # wake-up of Ray's own processes stalls their torch threads (0.55 -> 0.89 of the bare engine on
        # 2 cores, benchmarks/pipeline_overhead.py). Ray's job supervisor sets 0 for the same reason.
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(address="local", num_cpus=cpus, **quiet)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.verbose_progress = False


def wait_for_cluster(spec: JobSpec, console: Console) -> None:
    """Block until the connected cluster has compute.wait_for (nodes joining late); ResourceTimeout
    (a PlanError naming what was seen) after compute.wait_timeout_s."""
    if spec.compute.wait_for is None:
        return
    from fleetllm.ray_resources import ray_snapshot, request_from_autoscaler, wait_until, wanted

    need = wanted(spec.compute.wait_for.gpus, spec.compute.wait_for.cpus)
    request_from_autoscaler(need)  # withdrawn when the job ends (release_cluster_request)
    wait_until(ray_snapshot, need, timeout_s=spec.compute.wait_timeout_s, log=lambda m: console.print(m))


def release_cluster_request(spec: JobSpec) -> None:
    """Withdraw the autoscaler request of compute.wait_for or of a deadline's scale-up (it outlives the driver
    otherwise)."""
    from fleetllm.ray_resources import request_from_autoscaler, requested_here

    if spec.compute.wait_for is not None or requested_here():
        request_from_autoscaler({})


def build_dataset(plan: JobPlan, preprocessor: Callable[[dict], dict], progress_board: Any = None):
    """The job's dataset. Grouped by prefix on several replicas: one lane per replica (an actor pool of
    one, fed only its lane's shards; fleetllm.batch.planning.prefix.replica_lanes), the lanes' outputs unioned, so
    the rows of one prefix meet one replica's prefix cache. Otherwise one pool of all the replicas."""
    pool = replace(engine_pool(plan), progress_board=progress_board)
    if plan.lanes_by_prefix:
        from fleetllm.batch.planning.prefix import replica_lanes

        lanes = replica_lanes(plan.pending, pool.replica_plan.replicas)
        one = replace(pool, replica_plan=replace(pool.replica_plan, replicas=1))
        branches = [_shard_stream(plan, preprocessor, lane, one) for lane in lanes]
        return branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]
    return _shard_stream(plan, preprocessor, plan.pending, pool)


def _shard_stream(plan: JobPlan, preprocessor: Callable[[dict], dict], shards: list, pool):
    import ray

    from fleetllm.batch.execution.pipeline import job_stages

    stages = job_stages(plan, preprocessor, pool)
    items = [s.to_dict() for s in shards]
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.flat_map(stages.read, fn_kwargs=stages.read_kwargs, num_cpus=0.25)
    ds = ds.map(stages.preprocess, num_cpus=0.25)
    # vLLM: chat template + tokenization in tasks here (a whole shard each), off the replicas' critical
    # path. Ray Data gives actor pools max_restarts=-1 and max_task_retries=-1: a crashed replica is
    # restarted and its in-flight batch redone; the assembler drops any re-emitted duplicate.
    for fn, kwargs in stages.tables:
        ds = ds.map_batches(fn, **kwargs)
    return ds.map_batches(pool.stage_class(), **pool.map_batches_kwargs())


def run_on_ray(plan: JobPlan, preprocessor: Callable[[dict], dict], on_shard: Callable,
               on_engine: Callable | None = None, on_tick: Callable | None = None) -> dict[str, float]:
    """Stream the pending shards through the replicas; `on_shard(shard, table)` commits each complete
    shard in the driver. With `on_engine` and `on_tick` (the live ETA), the replicas report their engines'
    progress to a board (fleetllm.batch.execution.progress_board): `on_engine(board_engine, ready_at)` once the
    first replica is ready, then `on_tick()` every TICK_S from a thread beside the stream. Returns the
    replicas' timestamps (first ready, first call, last call done)."""
    times = {"ready": float("inf"), "first_call": float("inf"), "last_done": 0.0}
    by_id = {s.shard_id: s for s in plan.pending}
    assembler = ShardAssembler(plan.pending)
    ticker = _Ticker(on_engine, on_tick) if on_engine is not None and on_tick is not None else None
    ds = build_dataset(plan, preprocessor, ticker.board if ticker is not None else None)
    try:
        for batch in replica_errors_named(ds.iter_batches(batch_format="pyarrow", batch_size=None,
                                                          prefetch_batches=0)):
            readies = run_field(batch, "ready") if times["ready"] == float("inf") else []
            if readies:
                times["ready"] = min(readies)
            times["first_call"] = min([times["first_call"], *run_field(batch, "started")])
            times["last_done"] = max([times["last_done"], *run_field(batch, "finished")])
            for shard_id, table in assembler.add(batch):
                on_shard(by_id[shard_id], table)
    finally:
        if ticker is not None:
            ticker.stop()
    return times


def replica_errors_named(batches):
    """The stream's batches; a replica whose actor died (its engine failed to start: Ray Data reports the actor's
    death, with the engine's error as text) raises fleetllm's own error as the replica raised it (an EngineError
    naming the model folder and the fix, as an in-process run says it), else an EngineError quoting the cause."""
    import re

    from ray.exceptions import ActorDiedError

    from fleetllm import errors

    try:
        yield from batches
    except ActorDiedError as exc:
        text = str(exc)
        ours = re.findall(r"fleetllm\.errors\.(\w+): (.+)", text)
        kind = getattr(errors, ours[-1][0], None) if ours else None
        if isinstance(kind, type) and issubclass(kind, errors.FleetError):
            raise kind(ours[-1][1].strip()) from exc
        cause = re.findall(r"^\s*([\w.]+(?:Error|Exception): .+)$", text, flags=re.M)
        raise errors.EngineError(f"a replica died: {cause[-1].strip() if cause else text.splitlines()[0]}; its Ray "
                                 "worker log has the whole trace") from exc


class _Ticker:
    """The driver's live-ETA thread on the Ray path: watches the board until a replica is ready, then ticks."""

    def __init__(self, on_engine: Callable, on_tick: Callable) -> None:
        from fleetllm.batch.execution.progress_board import BoardEngine, open_board

        self.board = open_board()
        self.engine = BoardEngine(self.board)
        self.on_engine, self.on_tick = on_engine, on_tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetllm-eta-tick", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from fleetllm.batch.execution.local_run import TICK_S

        watched = False
        while not self._stop.wait(TICK_S):
            if not watched:
                if self.engine.read() is None:
                    continue
                self.on_engine(self.engine, self.engine.ready_at)
                watched = True
            self.on_tick()

    def stop(self) -> None:
        import ray

        self._stop.set()
        self._thread.join(timeout=10)
        ray.kill(self.board)  # the replicas' reporters stop at their next report
