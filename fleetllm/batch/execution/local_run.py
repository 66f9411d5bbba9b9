"""`fleetllm run` in one process, for a local job of one replica: no Ray.

A local single-replica run gains nothing from Ray Data (one machine, one engine) and paid for it at
start-up: on the 2-core CPU Ray's start (~6 s), the replica actor importing torch and the engine again
(~10 s), and on vLLM the engine core spawned inside the actor importing vLLM a third time (~11 s:
vLLM must spawn in a Ray actor, while in a plain process it forks). benchmarks/NOTES.md, change 5.

What stays identical to the Ray path (fleetllm.batch.execution.stream): the plan (`plan_job`: engine, shards,
fingerprint, the output folder's checks), the engine stage (`EngineStage`: the same rows in, the same
columns out), the chat template + tokenization ahead of the engine for vLLM (`add_prompt_token_ids`),
the commit of each complete shard through the same `OutputFolder` path in the driver, and the report
(`make_report`, the run record). So resume and exactly-once hold the same way: a shard counts once its
commit object is written, and a killed run resumes from the commits whichever path ran it.

What differs: the engine starts in a thread as soon as the job is planned, while the first shards
are read, preprocessed and tokenized; shards run `in_flight` at a time on threads (vLLM batches them
together), plus one read ahead; a crashed engine fails the run (resume continues it) instead of
being restarted by Ray Data. `run_job` takes this path only when no cluster is named (no
cluster.address, no $RAY_ADDRESS, Ray not already initialized in this process, no compute.wait_for)
and the plan has one replica; FLEETLLM_USE_RAY=1 forces Ray.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from fleetllm import sizing
from fleetllm.batch.execution.telemetry import run_field
from fleetllm.spec import JobSpec

TICK_S = 1.0  # between commits, how often the live ETA reads the engine's progress


def local_resources_for_run(spec: JobSpec) -> dict[str, float]:
    return sizing.local_run_resources(spec.compute.cpus_per_replica, spec.compute.replicas)


def runs_in_process(spec: JobSpec) -> bool:
    """True for a local job of one replica (see the module docstring)."""
    if os.environ.get("FLEETLLM_USE_RAY") == "1" or spec.cluster.address or os.environ.get("RAY_ADDRESS"):
        return False
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return False
    if spec.compute.wait_for is not None:
        return False
    if spec.environment.runtime_env():  # pip / env_vars / working_dir are Ray's runtime_env for the replicas
        return False
    plan = sizing.plan_for_spec(spec.model, spec.compute, local_resources_for_run(spec))
    return plan.replicas == 1 and not plan.uses_placement_group


class EngineStarter:
    """Starts the engine stage in a thread; `stage()` waits for it (raising its start-up error)."""

    def __init__(self, stage_class: type, kwargs: dict[str, Any]) -> None:
        self._stage_class = stage_class
        self._stage: Any = None
        self._error: BaseException | None = None
        self._children_before = {p.pid for p in multiprocessing.active_children()}  # a caller's own children
        self._thread = threading.Thread(target=self._start, args=(kwargs,), name="fleetllm-engine-start",
                                        daemon=True)
        self._thread.start()

    def _start(self, kwargs: dict[str, Any]) -> None:
        try:
            self._stage = self._stage_class(**kwargs, node_id=f"local:{socket.gethostname()}")
        except BaseException as exc:  # re-raised in the driver by stage()
            self._error = exc

    def wait_core_started(self, poll_s: float = 0.02) -> None:
        """Block until the engine has started a child process (vLLM's engine core; children the process
        had before do not count) or its start has ended. Until then the engine thread runs Python (vLLM's
        imports, its config, its tokenizer), and shard threads reading and tokenizing beside it would take
        the GIL from it; after the fork that thread waits on the core (the model loads, compiles and
        captures there), so the shards are prepared in time that costs the engine nothing. By then vLLM
        has imported transformers and loaded its tokenizer, so loading fleetllm's races no lazy import
        (NOTES.md, change 9)."""
        while self._thread.is_alive() and not self._new_children():
            time.sleep(poll_s)

    def _new_children(self) -> set[int]:
        return {p.pid for p in multiprocessing.active_children()} - self._children_before

    def started(self) -> bool:
        """The engine is up (its start ended without an error); does not wait."""
        return not self._thread.is_alive() and self._error is None and self._stage is not None

    def stage(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._stage

    def close(self) -> None:
        """Stop the engine (after its start finished, so a half-started vLLM leaves no process behind)."""
        self._thread.join()
        if self._stage is not None:
            self._stage.engine.stop()
            self._stage = None


def run_shards(plan, preprocessor, on_shard, on_engine=None, on_tick=None, tick_s: float = TICK_S) -> dict[str, float]:
    """Run every pending shard through one in-process engine; `on_shard(shard, table)` commits each in
    this thread as it completes. `on_engine(engine, ready_at)` is called once the engine is ready and
    `on_tick()` every `tick_s` while no shard completes (the live ETA reads the engine's progress between
    commits). Returns the engine's timestamps (ready, first call, last call done)."""
    from fleetllm.batch.planning.job_plan import engine_pool
    from fleetllm.batch.execution.pipeline import job_stages
    from fleetllm.engines.capabilities import capabilities

    pool = engine_pool(plan)
    stages = job_stages(plan, preprocessor, pool)  # the stages the Ray Data stream runs, run here
    forks_core = capabilities(plan.engine).forks_engine_core
    if forks_core:  # a plain process may fork vLLM's engine core (no second import of vLLM)
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    tokenize = pool.tokenize_stage_kwargs()
    times = {"ready": float("inf"), "first_call": float("inf"), "last_done": 0.0, "engine_start": time.time()}
    starter = EngineStarter(pool.stage_class(), pool.stage_kwargs())
    one_at_a_time = threading.Lock() if plan.in_flight == 1 else None
    prepare = threading.Lock()
    prepared = threading.Event()
    if not forks_core and tokenize is None:  # nothing to wait for
        prepared.set()

    def wait_for_engine_core() -> None:
        """The shard threads start preparing once vLLM's core runs (EngineStarter.wait_core_started); the
        first loads the tokenizer: transformers' lazy imports are not thread-safe, so nothing here may
        import it while the engine thread does (seen on the H200 before: "cannot import name
        'AutoTokenizer'" in 3 of 4 runs when both threads imported it at once)."""
        if prepared.is_set():
            return
        with prepare:
            if prepared.is_set():
                return
            starter.wait_core_started()
            if tokenize is not None:
                from fleetllm.batch.execution.tokenize_stage import load_tokenizer

                load_tokenizer(**tokenize["fn_kwargs"]["tokenizer"])
            prepared.set()

    def shard_table(shard) -> Any:
        wait_for_engine_core()
        table = stages.prepared_table(shard)
        return _call_engine(starter.stage(), table, plan.rows_per_call, one_at_a_time)

    ahead = plan.in_flight + 1  # calls in flight, and one shard read and prepared ahead
    todo = list(plan.pending)
    running: dict[Future, Any] = {}
    try:
        with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="fleetllm-shard") as workers:
            while todo or running:
                while todo and len(running) < ahead:
                    shard = todo.pop(0)
                    running[workers.submit(shard_table, shard)] = shard
                finished, _ = wait(running, timeout=tick_s if on_tick or on_engine else None,
                                   return_when=FIRST_COMPLETED)
                if on_engine is not None and (finished or starter.started()):
                    on_engine, watch = None, on_engine
                    watch(starter.stage().engine, starter.stage().ready_at)
                if not finished and on_tick is not None and starter.started():
                    on_tick()
                for fut in finished:
                    shard = running.pop(fut)
                    table = fut.result()  # an engine that died fails the run; committed shards stay
                    times["ready"] = min(times["ready"], starter.stage().ready_at)
                    times["first_call"] = min([times["first_call"], *run_field(table, "started")])
                    times["last_done"] = max([times["last_done"], *run_field(table, "finished")])
                    on_shard(shard, table)
    except BaseException:
        for fut in running:
            fut.cancel()
        raise
    finally:
        starter.close()
    return times


def _call_engine(stage, table, rows_per_call: int, one_at_a_time: threading.Lock | None) -> Any:
    """The engine stage's output for `table`, called `rows_per_call` rows at a time (one call in flight
    across the shards when `one_at_a_time` is given), in line order."""
    import pyarrow as pa

    parts = []
    for i in range(0, table.num_rows, rows_per_call):
        chunk = table.slice(i, rows_per_call)
        if one_at_a_time is not None:
            with one_at_a_time:
                parts.append(stage(chunk))
        else:
            parts.append(stage(chunk))
    return pa.concat_tables(parts, promote_options="permissive").sort_by("_line")
