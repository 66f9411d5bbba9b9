"""The commit protocol of an output folder.

Layout of an output folder:
    part-000000.parquet ...      one data file per committed shard (written as .tmp-*, then renamed)
    _fleetllm/job.json           the job's fingerprint and its parts (what changes outputs)
    _fleetllm/manifest.jsonl     one line per committed shard, appended after its rename
    run.json                     the report, written last: its presence means the job completed

A shard is committed once its line is in the manifest; resume reads the manifest only, so its
memory is proportional to the number of shards, never to the number of rows.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

import fsspec

from fleetllm.batch.plan import Shard, shard_fingerprint
from fleetllm.errors import PlanError

META = "_fleetllm"
DATA_EXT = {"parquet": "parquet", "jsonl": "jsonl", "openai_batch": "jsonl"}


def part_name(shard_id: int, fmt: str) -> str:
    return f"part-{shard_id:06d}.{DATA_EXT[fmt]}"


@dataclass
class ManifestEntry:
    shard: int
    file: str
    rows: int
    errors: int
    input_tokens: int
    output_tokens: int
    fingerprint: str
    nodes: list[str]

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


class OutputFolder:
    def __init__(self, path: str, fmt: str) -> None:
        self.url = path
        self.fs, self.root = fsspec.core.url_to_fs(path)
        self.fmt = fmt

    def p(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    # --- state -----------------------------------------------------------------------------

    def read_job(self) -> dict[str, Any] | None:
        path = self.p(META, "job.json")
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "r") as fh:
            return json.load(fh)

    def read_manifest(self) -> dict[int, ManifestEntry]:
        """Committed shards by id; a torn last line (killed mid-append) is ignored."""
        path = self.p(META, "manifest.jsonl")
        entries: dict[int, ManifestEntry] = {}
        if not self.fs.exists(path):
            return entries
        with self.fs.open(path, "r") as fh:
            for line in fh:
                try:
                    entry = ManifestEntry(**json.loads(line))
                except (ValueError, TypeError):
                    continue
                entries[entry.shard] = entry
        return entries

    def prepare(self, job_fp: str, job_parts: dict[str, Any], overwrite: bool) -> None:
        """Check that this folder holds nothing or this same job; clean leftovers of a killed run."""
        fs = self.fs
        if fs.exists(self.root) and not fs.isdir(self.root):
            raise PlanError(f"output.path {self.url!r} is a file; give a folder")
        job_parts = json.loads(json.dumps(job_parts, sort_keys=True, default=str))  # as stored
        existing = self.read_job()
        if existing is None and fs.exists(self.root):
            foreign = [n for n in fs.ls(self.root, detail=False) if not posixpath.basename(n).startswith(".tmp-")]
            if foreign and not overwrite:
                raise PlanError(
                    f"output folder {self.url!r} is not empty and was not written by fleetllm; "
                    "choose another output.path")
        if existing is not None and existing.get("fingerprint") != job_fp:
            if not overwrite:
                changed = sorted(k for k in set(existing.get("parts", {})) | set(job_parts)
                                 if existing.get("parts", {}).get(k) != job_parts.get(k))
                raise PlanError(
                    f"output folder {self.url!r} holds results of a different job configuration "
                    f"(changed: {', '.join(changed) or 'unknown'}); outputs are never mixed: "
                    "use --overwrite to recompute everything, or another output.path")
        if overwrite:
            self.clear()
        fs.makedirs(self.p(META), exist_ok=True)
        for name in fs.ls(self.root, detail=False):
            if posixpath.basename(name).startswith(".tmp-"):
                fs.rm(name)
        with fs.open(self.p(META, "job.json"), "w") as fh:
            json.dump({"fingerprint": job_fp, "parts": job_parts}, fh, indent=2, sort_keys=True, default=str)

    def clear(self) -> None:
        """Remove what fleetllm wrote here (data parts, metadata, reports), nothing else."""
        if not self.fs.exists(self.root):
            return
        for name in self.fs.ls(self.root, detail=False):
            base = posixpath.basename(name)
            if base.startswith(("part-", ".tmp-")) or base in (META, "run.json", "output.jsonl", "errors.jsonl"):
                self.fs.rm(name, recursive=True)

    def pending(self, shards: list[Shard], job_fp: str) -> tuple[list[Shard], dict[int, ManifestEntry]]:
        """Shards still to compute, and the committed entries that stay valid."""
        committed = self.read_manifest()
        valid = {}
        todo = []
        for shard in shards:
            entry = committed.get(shard.shard_id)
            if (entry is not None and entry.fingerprint == shard_fingerprint(job_fp, shard)
                    and self.fs.exists(self.p(entry.file))):
                valid[shard.shard_id] = entry
            else:
                todo.append(shard)
        # parts of shards that no longer exist in the plan (the input shrank) go away
        planned = {s.shard_id for s in shards}
        for sid, entry in committed.items():
            if sid not in planned and self.fs.exists(self.p(entry.file)):
                self.fs.rm(self.p(entry.file))
        return todo, valid

    # --- commits ---------------------------------------------------------------------------

    def commit(self, entry: ManifestEntry, write_data) -> None:
        """Write the shard's data atomically, then append its manifest line (fsynced)."""
        from fleetllm.batch.io import sync, write_atomic

        write_atomic(self.fs, self.p(entry.file), write_data)
        with self.fs.open(self.p(META, "manifest.jsonl"), "a") as fh:
            fh.write(entry.to_json() + "\n")
            sync(fh)

    def write_report(self, report: dict[str, Any]) -> None:
        from fleetllm.batch.io import write_atomic

        data = json.dumps(report, indent=2, sort_keys=True, default=str).encode()
        write_atomic(self.fs, self.p("run.json"), lambda fh: fh.write(data))

    def remove_report(self) -> None:
        if self.fs.exists(self.p("run.json")):
            self.fs.rm(self.p("run.json"))

