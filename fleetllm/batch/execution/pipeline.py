"""A batch job's stages, defined once:

    read (a shard -> its rows) -> preprocess (a row -> a prepared row)
        -> [images: fetched and decoded] -> [tokenize: chat template + token ids] -> engine (the replicas)

Two executors run this list: the Ray Data stream (fleetllm.batch.execution.stream: flat_map, map, map_batches and
an actor pool of replicas) and a local run (fleetllm.batch.execution.local_run: the same functions in this process,
shard by shard, one engine started in a thread). The processor API (fleetllm.batch.processor) runs the
table stages and the engine of the same EnginePool over the user's dataset. Which table stages exist
(images for a model that reads them, tokenize for an engine that takes token ids) is decided in one
place: `EnginePool.table_stages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fleetllm.batch.execution.engine_pool import EnginePool


@dataclass(frozen=True)
class Stages:
    """The stages of one job (or one lane of it), in order."""

    read: Callable[..., list[dict]]  # fleetllm.batch.inputs.shard_rows.read_shard_rows: a shard's dict -> its rows
    read_kwargs: dict[str, Any]
    preprocess: Callable[[dict], dict]  # the job's row preprocessor (fleetllm.batch.runner.make_preprocessor)
    tables: tuple[tuple[Callable, dict[str, Any]], ...]  # (fn, map_batches kwargs): a pyarrow table -> table
    pool: EnginePool  # the engine stage: its replicas

    def prepared_table(self, shard: Any) -> Any:
        """The in-process executor of every stage before the engine: a shard's rows read, preprocessed and
        passed through the table stages (as the Ray Data stream's stages do, task by task)."""
        from fleetllm.batch.execution.stages import table_from_rows

        rows = [self.preprocess(r) for r in self.read(shard.to_dict(), **self.read_kwargs)]
        table = table_from_rows(rows)  # an error row first must not drop the other rows' columns
        for fn, kwargs in self.tables:
            table = fn(table, **kwargs["fn_kwargs"])
        return table


def job_stages(plan: Any, preprocessor: Callable[[dict], dict], pool: EnginePool,
               table_batch_size: int | None = None) -> Stages:
    """The stages of `plan` (fleetllm.batch.planning.job_plan.JobPlan) with its replicas `pool`; table stages take
    `table_batch_size` rows per task (None: a whole shard)."""
    from fleetllm.batch.inputs.shard_rows import read_shard_rows

    return Stages(read=read_shard_rows,
                  read_kwargs={"declared": plan.read_format, "columns": plan.columns, "keep": plan.spec.input.columns},
                  preprocess=preprocessor, tables=tuple(pool.table_stages(table_batch_size)), pool=pool)
