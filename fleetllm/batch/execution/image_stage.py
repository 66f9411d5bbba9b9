"""The image stage: fetch, check and carry each row's images, ahead of the replicas.

Ray Data runs it as tasks beside the replicas (as ray.data.llm's PrepareImageStage), in-process runs in
the shard threads (fleetllm.batch.execution.local_run), so fetching and decoding never holds up an engine. A row
whose `_messages` holds image_url parts gets `_images` (the bytes, in order; list<binary>) and its parts'
URLs replaced by `image:N` (fleetllm.engines.images.load_images); a row whose image cannot be had gets
that as its `error` and skips the engine. Rows without images pass through untouched.
"""

from __future__ import annotations

import json
from typing import Any

IMAGES_COLUMN = "_images"


def add_images(batch, limits: dict[str, Any]):
    """A pyarrow batch with the `_images` column (null where a row has no image)."""
    import pyarrow as pa

    from fleetllm.batch.execution.stages import table_from_rows
    from fleetllm.engines.images import ImageLimits, load_images
    from fleetllm.errors import RowError

    if "_messages" not in batch.column_names and "messages" not in batch.column_names:
        return batch
    rows = batch.to_pylist()
    for row in rows:  # the processor API's rows carry `messages` as they are: their JSON text, as the job's
        if row.get("_messages") is None and isinstance(row.get("messages"), list):
            row["_messages"] = json.dumps(row["messages"], ensure_ascii=False, default=str)
    if not any(isinstance(r.get("_messages"), str) and '"image_url"' in r["_messages"] for r in rows):
        return batch
    image_limits = ImageLimits(**limits)
    for row in rows:
        text = row.get("_messages")
        row[IMAGES_COLUMN] = None
        if row.get("error") or not isinstance(text, str) or '"image_url"' not in text:
            continue
        try:
            messages, images = load_images(json.loads(text), image_limits)
        except RowError as exc:
            row["error"] = str(exc)
            continue
        row["_messages"] = json.dumps(messages, ensure_ascii=False)
        row[IMAGES_COLUMN] = images
    table = table_from_rows(rows)
    column = pa.array([r[IMAGES_COLUMN] for r in rows], type=pa.list_(pa.binary()))
    return table.set_column(table.column_names.index(IMAGES_COLUMN), IMAGES_COLUMN, column)


def image_stage_kwargs(limits: dict[str, Any], batch_size: int | None = None) -> dict[str, Any]:
    """`ds.map_batches(add_images, **kwargs)` arguments."""
    return dict(fn_kwargs={"limits": dict(limits)}, batch_format="pyarrow", batch_size=batch_size, num_cpus=0.25)
