"""The commit protocol of an output folder (a local or network folder, or an object-store prefix).

Layout:
    part-000000.parquet ...             one data file per committed shard, written once whole
    _fleetllm/job.json                  the job's fingerprint and its parts (what changes outputs)
    _fleetllm/commits/shard-000000-<fingerprint>.json   one small commit object per committed shard
    _fleetllm/lock.json                 the lock of the run writing the folder (folder_lock.py)
    _fleetllm/report.html               `fleetllm report OUT`
    _SUCCESS                            the run record (JSON), written last: its presence means the job
                                        completed, as Hadoop's committer writes its summary there

Every name a Parquet reader would open ends in `.parquet`; the rest starts with `_` or `.`, which
pandas, pyarrow, Spark, DuckDB and Ray skip, so the folder opens with no options. Folders written by
earlier versions hold the run record as `run.json` (and a report as `report.html`) at the top: they
are still read and resumed, and the run that takes such a folder removes them.

A shard is committed in two writes, each whole or absent (store.write_atomic): its data under its
final name, then its commit object. A shard counts only with a commit object whose fingerprint is
the current plan's and whose data file is there; nothing is ever appended. The commit object's
name carries the shard and its fingerprint, so planning a resume lists `_fleetllm/commits/` and the
folder (paginated on object stores: one request per 1,000 objects) and reads no object; the report
reads the commit objects (concurrently on object stores). Memory follows shards, never rows. Before a run
computes anything it removes the commit objects, then the data parts, of shards the current plan does not
hold as committed, so every data part left in the folder belongs to this plan and is read back exactly once.

Folders written by earlier versions keep their commits in `_fleetllm/manifest.jsonl` (one line per
shard, appended). They still resume: the lines that parse (a torn last line is skipped) become commit
objects when the run takes the folder, and the manifest is removed; it is never appended to.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from fleetllm.batch.output import store
from fleetllm.batch.inputs.discovery import LEGACY_RUN_RECORD  # still read and resumed
from fleetllm.batch.output.folder_lock import FolderLock
from fleetllm.batch.planning.shards import Shard, shard_fingerprint
from fleetllm.errors import PlanError

META = "_fleetllm"
COMMITS = "commits"
LEGACY_MANIFEST = "manifest.jsonl"
LOCK = "lock.json"
DATA_EXT = {"parquet": "parquet", "jsonl": "jsonl", "openai_batch": "jsonl"}
RUN_RECORD = "_SUCCESS"
REPORT_PAGE = "report.html"  # `fleetllm report OUT`, under _fleetllm/ (at the top before)
REPORT_FILES = (RUN_RECORD, LEGACY_RUN_RECORD, REPORT_PAGE, "output.jsonl", "errors.jsonl")
PART = re.compile(r"^part-\d{6}\.(parquet|jsonl)$")
COMMIT = re.compile(r"^shard-(\d{6,})-([0-9a-f]+)\.json$")


def part_name(shard_id: int, fmt: str) -> str:
    return f"part-{shard_id:06d}.{DATA_EXT[fmt]}"


def commit_name(shard_id: int, fingerprint: str) -> str:
    return f"shard-{shard_id:06d}-{fingerprint}.json"


def written_by_fleetllm(name: str) -> bool:
    """A top-level name fleetllm writes in an output folder."""
    return name == META or name in REPORT_FILES or name.startswith(".tmp-") or PART.match(name) is not None


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
    cached_tokens: int | None = None  # prompt tokens from the engine's prefix cache, where the engine says
    replicas: list[str] | None = None  # the engine replicas (Ray actor ids) that computed the shard's rows

    def to_json(self) -> str:
        fields = {k: v for k, v in self.__dict__.items() if k not in ("cached_tokens", "replicas") or v is not None}
        return json.dumps(fields, sort_keys=True)


def _entry(raw: bytes | str) -> ManifestEntry | None:
    try:
        entry = ManifestEntry(**json.loads(raw))
    except (ValueError, TypeError):
        return None
    return entry if isinstance(entry.shard, int) and isinstance(entry.file, str) else None


class OutputFolder:
    def __init__(self, path: str, fmt: str) -> None:
        self.url = path
        self.fs, self.root = store.open_url(path)
        self.root = self.root.rstrip("/") or self.root
        self.fmt = fmt

    def p(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    # --- state (read only) -----------------------------------------------------------------

    def read_job(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.cat_file(self.p(META, "job.json")))
        except FileNotFoundError:
            return None

    def read_legacy_manifest(self) -> dict[int, ManifestEntry]:
        """Entries of an earlier version's manifest.jsonl; lines that do not parse (a torn last line,
        or a line a later append ran into) are skipped: those shards are computed again."""
        try:
            raw = self.fs.cat_file(self.p(META, LEGACY_MANIFEST))
        except FileNotFoundError:
            return {}
        entries = {}
        for line in raw.splitlines():
            entry = _entry(line)
            if entry is not None:
                entries[entry.shard] = entry
        return entries

    def commit_index(self) -> dict[tuple[int, str], str]:
        """{(shard, fingerprint): commit object name}, from one listing (no object is read)."""
        found = {}
        for name in store.listing(self.fs, self.p(META, COMMITS)):
            m = COMMIT.match(name)
            if m:
                found[(int(m.group(1)), m.group(2))] = name
        return found

    def _read_entries(self, names: list[str]) -> dict[int, ManifestEntry]:
        folder = self.p(META, COMMITS)
        entries = {}
        for path, raw in sorted(store.read_bytes(self.fs, [posixpath.join(folder, n) for n in names]).items()):
            entry = _entry(raw)
            if entry is not None and posixpath.basename(path) == commit_name(entry.shard, entry.fingerprint):
                entries[entry.shard] = entry
        return entries

    def read_commits(self) -> dict[int, ManifestEntry]:
        """Every recorded commit by shard id (legacy manifest lines under the commit objects)."""
        return {**self.read_legacy_manifest(), **self._read_entries(list(self.commit_index().values()))}

    read_manifest = read_commits  # the name earlier versions used

    def top(self) -> dict[str, dict[str, Any]]:
        return store.listing(self.fs, self.root)

    def foreign(self, top: dict[str, Any] | None = None) -> list[str]:
        return sorted(n for n in (self.top() if top is None else top) if not written_by_fleetllm(n))

    def pending(self, shards: list[Shard], job_fp: str) -> tuple[list[Shard], dict[int, ManifestEntry]]:
        """Shards still to compute, and the commits valid for this plan (their shard, file, rows and
        fingerprint; read_commits or committed() has the counts). Lists, reads no commit object,
        changes nothing."""
        legacy = self.read_legacy_manifest()
        index = self.commit_index()
        data = self.top()
        valid, todo = {}, []
        for shard in shards:
            fp = shard_fingerprint(job_fp, shard)
            file = part_name(shard.shard_id, self.fmt)
            old = legacy.get(shard.shard_id)
            if (shard.shard_id, fp) in index and file in data:
                valid[shard.shard_id] = ManifestEntry(shard.shard_id, file, shard.rows, 0, 0, 0, fp, [])
            elif old is not None and old.fingerprint == fp and old.file in data:
                valid[shard.shard_id] = old
            else:
                todo.append(shard)
        return todo, valid

    def committed(self, shards: list[Shard], job_fp: str) -> dict[int, ManifestEntry]:
        """The commits of this plan, as recorded (entries of other plans, e.g. before shard_rows
        changed, are not)."""
        valid = self.pending(shards, job_fp)[1]
        index = self.commit_index()
        names = [index[(s, e.fingerprint)] for s, e in valid.items() if (s, e.fingerprint) in index]
        return {**valid, **self._read_entries(names)}

    # --- taking the folder -------------------------------------------------------------------

    def refuse_foreign(self, overwrite: bool) -> None:
        """Refuse a folder that holds files fleetllm did not write, naming them (read only)."""
        if self.fs.exists(self.root) and not self.fs.isdir(self.root):
            raise PlanError(f"output.path {self.url!r} is a file; give a folder")
        top = self.top()
        foreign = self.foreign(top)
        if not foreign:
            return
        shown = ", ".join(foreign[:20]) + (f" and {len(foreign) - 20} more" if len(foreign) > 20 else "")
        if META not in top:
            raise PlanError(f"output folder {self.url!r} is not empty and was not written by fleetllm "
                            f"(it holds {shown}); choose another output.path")
        why = ("--overwrite removes only what fleetllm wrote, and these would then be read back mixed with "
               "the job's rows" if overwrite else "they would be read back mixed with the job's rows")
        raise PlanError(f"output folder {self.url!r} holds {len(foreign)} file(s) fleetllm did not write: "
                        f"{shown}; {why}. Move them elsewhere or choose another output.path")

    def lock(self, overwrite: bool = False) -> FolderLock:
        """The run's lock of this folder (a context manager), taken after refusing a foreign folder
        (so that nothing is written into one)."""
        self.refuse_foreign(overwrite)
        return FolderLock(self.fs, self.p(META, LOCK), self.url)

    def prepare(self, job_fp: str, job_parts: dict[str, Any], overwrite: bool) -> None:
        """Check that this folder holds nothing or this same job; take over an earlier version's
        manifest. Call with the folder's lock held."""
        self.refuse_foreign(overwrite)
        job_parts = json.loads(json.dumps(job_parts, sort_keys=True, default=str))  # as stored
        existing = self.read_job()
        if existing is not None and existing.get("fingerprint") != job_fp and not overwrite \
                and self.holds_results():  # a record of a run that committed nothing blocks nothing
            changed = sorted(k for k in set(existing.get("parts", {})) | set(job_parts)
                             if existing.get("parts", {}).get(k) != job_parts.get(k))
            raise PlanError(
                f"output folder {self.url!r} holds results of a different job configuration "
                f"(changed: {', '.join(changed) or 'unknown'}); outputs are never mixed: "
                "use --overwrite to recompute everything, or another output.path")
        if overwrite:
            self.clear()
        else:
            self._adopt_legacy_manifest()
        data = json.dumps({"fingerprint": job_fp, "parts": job_parts}, indent=2, sort_keys=True, default=str)
        store.write_atomic(self.fs, self.p(META, "job.json"), lambda fh: fh.write(data.encode()))

    def holds_results(self) -> bool:
        """Whether any shard was committed here (a commit object, a legacy manifest line or a data part)."""
        return bool(self.commit_index()) or bool(self.read_legacy_manifest()) \
            or any(PART.match(n) for n in self.top())

    def _adopt_legacy_manifest(self) -> None:
        legacy = self.read_legacy_manifest()
        if not legacy and not self.fs.exists(self.p(META, LEGACY_MANIFEST)):
            return
        for entry in legacy.values():
            self._write_commit(entry)
        store.remove(self.fs, [self.p(META, LEGACY_MANIFEST)])

    def discard_others(self, valid: dict[int, ManifestEntry]) -> None:
        """Remove the commit objects, then the data parts, that are not this plan's valid commits
        (shards of other plans, uncommitted parts of killed runs), and temporary files."""
        folder = self.p(META, COMMITS)
        keep = {commit_name(s, e.fingerprint) for s, e in valid.items()}
        store.remove(self.fs, [posixpath.join(folder, n) for n in store.listing(self.fs, folder) if n not in keep])
        parts = {e.file for e in valid.values()}
        store.remove(self.fs, [self.p(n) for n in self.top()
                               if n.startswith(".tmp-") or (PART.match(n) and n not in parts)])

    def clear(self) -> None:
        """Remove what fleetllm wrote here (commits first, then data, metadata, reports); the lock stays."""
        if not self.fs.exists(self.root):
            return
        commits = self.p(META, COMMITS)
        store.remove(self.fs, [posixpath.join(commits, n) for n in store.listing(self.fs, commits)])
        store.remove(self.fs, [self.p(n) for n in self.top() if n != META and written_by_fleetllm(n)])
        store.remove(self.fs, [self.p(META, n) for n, info in store.listing(self.fs, self.p(META)).items()
                               if n != LOCK and info.get("type") != "directory"])

    # --- commits ---------------------------------------------------------------------------

    def _write_commit(self, entry: ManifestEntry) -> None:
        data = entry.to_json().encode()
        # not fsynced: a commit object lost or torn by a power loss only means its shard is computed again
        store.write_atomic(self.fs, self.p(META, COMMITS, commit_name(entry.shard, entry.fingerprint)),
                           lambda fh: fh.write(data), durable=False)

    def commit(self, entry: ManifestEntry, write_data) -> None:
        """Write the shard's data whole under its final name, then its commit object."""
        store.write_atomic(self.fs, self.p(entry.file), write_data)
        try:
            self._write_commit(entry)
        except BaseException:  # a data part without its commit object would be read as data: removed
            store.remove(self.fs, [self.p(entry.file)])
            raise

    def write_file(self, name: str, write) -> None:
        """A whole file at the folder's top (_SUCCESS, output.jsonl, ...)."""
        store.write_atomic(self.fs, self.p(name), write)

    def write_report(self, report: dict[str, Any]) -> None:
        """The run record, last: `_SUCCESS` holding its JSON (readers of the folder skip it)."""
        data = json.dumps(report, indent=2, sort_keys=True, default=str).encode()
        self.write_file(RUN_RECORD, lambda fh: fh.write(data))

    def remove_report(self) -> None:
        """Before a run computes: the record and report of the previous run (old names too)."""
        store.remove(self.fs, [self.p(n) for n in (RUN_RECORD, LEGACY_RUN_RECORD, REPORT_PAGE)]
                     + [self.p(META, REPORT_PAGE)])


def read_run_record(out_path: str) -> dict[str, Any] | None:
    """The run record of an output folder (`_SUCCESS`, or an earlier version's `run.json`); None when
    the folder holds no finished run."""
    fs, root = store.open_url(out_path)
    for name in (RUN_RECORD, LEGACY_RUN_RECORD):
        try:
            return json.loads(fs.cat_file(posixpath.join(root.rstrip("/") or root, name)))
        except FileNotFoundError:
            continue
    return None
