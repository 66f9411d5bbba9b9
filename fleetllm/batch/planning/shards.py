"""The shard planner: a deterministic split of the input into shards of `shard_rows` rows.

Pure logic over (file, row count, line offsets): no Ray, no models. A shard is the unit of
commit and resume: its identity is its file's identity plus its row range.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class InputFile:
    path: str  # as fsspec understands it
    rel: str  # stable name relative to the input root, used in row ids
    size: int
    mtime: str  # modification time as the filesystem reports it ("" where unknown)
    rows: int
    # byte offset where row k * shard_rows starts (line-based formats), else empty
    offsets: tuple[int, ...] = field(default=(), compare=False)
    # what the file holds (fleetllm.batch.planning.content_id): the store's content identity or a hash of its bytes
    content: str = ""
    # line-based formats: a hash of the bytes of rows k * shard_rows .. (k + 1) * shard_rows - 1, per shard
    digests: tuple[str, ...] = field(default=(), compare=False)

    @property
    def identity(self) -> str:
        """What the file holds: its content identity (size and mtime only where none was taken)."""
        return self.content or f"{self.size}:{self.mtime}"


@dataclass(frozen=True)
class Shard:
    shard_id: int
    path: str
    rel: str
    start: int  # first row, 0-based within the file
    stop: int  # one past the last row
    offset: int  # byte offset of row `start` for line-based formats, else -1
    file_identity: str  # what the shard reads: a hash of its rows' bytes, or its file's content identity
    # --retry-errors (fleetllm.batch.output.retry_errors): the only lines of a committed shard to compute again
    only_lines: tuple[int, ...] | None = field(default=None, compare=False)

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def rows_to_compute(self) -> int:
        """The rows a run computes: all of them, or a reopened shard's failed rows (only_lines)."""
        return self.rows if self.only_lines is None else len(self.only_lines)

    def identity(self) -> str:
        """What the shard reads: changes when its file or its row range changes."""
        raw = f"{self.rel}|{self.start}|{self.stop}|{self.file_identity}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self)


def plan_shards(files: list[InputFile], shard_rows: int, limit: int | None = None) -> list[Shard]:
    """Split files, in order, into shards of at most `shard_rows` rows (never across files). A shard of a
    line-based file is identified by its own rows' bytes (appending rows changes only the last shard),
    any other by its file's content."""
    if shard_rows < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    shards: list[Shard] = []
    remaining = limit if limit is not None else None
    for f in files:
        rows = f.rows if remaining is None else min(f.rows, remaining)
        for k, start in enumerate(range(0, rows, shard_rows)):
            stop = min(start + shard_rows, rows)
            offset = f.offsets[k] if k < len(f.offsets) else -1
            ident = f"rows:{f.digests[k]}" if k < len(f.digests) else f.identity
            shards.append(Shard(len(shards), f.path, f.rel, start, stop, offset, ident))
        if remaining is not None:
            remaining -= rows
            if remaining <= 0:
                break
    return shards


def job_fingerprint(parts: dict) -> str:
    """A stable hash of everything that changes outputs (see batch/planning/fingerprint.py)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def shard_fingerprint(job_fp: str, shard: Shard) -> str:
    return hashlib.sha256(f"{job_fp}|{shard.identity()}".encode()).hexdigest()[:24]
