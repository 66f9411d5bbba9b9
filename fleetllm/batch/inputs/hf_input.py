"""Hugging Face datasets as job input: `input.format: hf` (implied by an `hf://` path or `input.split`).

Three kinds of source, one code path:

- a hub dataset, `hf://datasets/ORG/NAME` (with `input.revision`): `datasets.load_dataset_builder`
  resolves the split's data files (pinned to the revision's commit), read through the hub's fsspec
  filesystem (`hf://`, huggingface_hub's HfFileSystem);
- a local dataset repo (a folder `load_dataset(folder)` reads): the same builder resolution;
- a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`: its Arrow files, named
  in `state.json`.

Shards are planned from the files' row counts (parquet footers, Arrow record batches, line scans),
so they are the same on every run and resume works; a shard task reads only its own rows, on any
node, and nothing is loaded whole into memory. `input.split` takes the `datasets` slicing syntax
(`train`, `train[:1000]`, `train[10%:20%]`).
"""

from __future__ import annotations

import json
import posixpath
from array import array
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from fleetllm.batch.planning import content_id
from fleetllm.batch.inputs import input_files
from fleetllm.batch.planning.input_names import kept_name, rename_table
from fleetllm.batch.planning.shards import Shard
from fleetllm.errors import InputError

HUB_PREFIX = "hf://datasets/"
BUILDER_FORMATS = {"parquet": "parquet", "json": "auto", "csv": "csv", "arrow": "arrow"}


@dataclass(frozen=True)
class DataFile:
    path: str  # as fsspec understands it
    rel: str  # stable name (relative to the dataset root), used in row ids
    fmt: str  # parquet | jsonl | json | csv | arrow
    rows: int
    identity: str  # changes when the file changes
    offsets: tuple[int, ...] = ()  # jsonl: byte offset of every row (only while planning)


def is_hf(input_spec) -> bool:
    return input_spec.format == "hf"


def split_name(split: str | None) -> str:
    return (split or "train").split("[")[0].strip() or "train"


def _fs(path: str):
    return fsspec.core.url_to_fs(path)


def resolve_files(path: str, split: str | None, revision: str | None) -> list[tuple[str, str, str]]:
    """[(fsspec path, rel name, format)] of the split's data files, in the dataset's order."""
    name = split_name(split)
    if not path.startswith("hf://"):
        fs, root = _fs(path)
        if not fs.exists(root):
            raise InputError(f"input path {path!r} does not exist; check input.path")
        if fs.exists(posixpath.join(root, "dataset_dict.json")):  # DatasetDict.save_to_disk
            splits = json.loads(fs.cat(posixpath.join(root, "dataset_dict.json")))["splits"]
            if name not in splits:
                raise InputError(f"{path!r} has splits {splits}, not {name!r}; set input.split to one of them")
            return _saved_files(fs, posixpath.join(root, name), name)
        if fs.exists(posixpath.join(root, "state.json")):  # Dataset.save_to_disk: one split
            return _saved_files(fs, root, "")
    return _builder_files(path, name, revision)


def _saved_files(fs, folder: str, prefix: str) -> list[tuple[str, str, str]]:
    state = json.loads(fs.cat(posixpath.join(folder, "state.json")))
    names = [f["filename"] for f in state.get("_data_files", [])]
    if not names:
        raise InputError(f"{folder!r}: state.json names no data files; is it a complete save_to_disk folder?")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    base = folder if protocol in ("file", "local") else f"{protocol}://{folder}"
    return [(posixpath.join(base, n), posixpath.join(prefix, n) if prefix else n, "arrow") for n in names]


def _builder_files(path: str, name: str, revision: str | None) -> list[tuple[str, str, str]]:
    import datasets

    repo = path[len(HUB_PREFIX):].strip("/") if path.startswith(HUB_PREFIX) else path
    if path.startswith("hf://") and not path.startswith(HUB_PREFIX):
        raise InputError(f"input.path {path!r}: a hub dataset is hf://datasets/ORG/NAME")
    if "@" in repo and revision is None:
        repo, revision = repo.split("@", 1)
    try:
        builder = datasets.load_dataset_builder(repo, revision=revision)
    except Exception as exc:
        raise InputError(f"cannot open Hugging Face dataset {path!r}"
                         f"{f' at revision {revision!r}' if revision else ''}: {exc}") from None
    module = builder.name
    if module not in BUILDER_FORMATS:
        raise InputError(f"dataset {path!r} is read by the {module!r} builder; fleetllm reads datasets made of "
                         f"{sorted(BUILDER_FORMATS)} files. Convert it once (load_dataset(...).save_to_disk(DIR)) "
                         "and point input.path at DIR")
    data_files = builder.config.data_files or {}
    by_name = {str(k): v for k, v in data_files.items()}
    if name not in by_name:
        raise InputError(f"dataset {path!r} has splits {sorted(by_name)}, not {name!r}; set input.split")
    root = str(builder.base_path or "").rstrip("/")
    files = []
    for f in by_name[name]:
        f = str(f)
        rel = posixpath.relpath(f, root) if root and f.startswith(root) else posixpath.basename(f)
        declared = BUILDER_FORMATS[module]
        fmt = declared if declared != "auto" else input_files.file_format(f.split("::")[0], "auto")
        files.append((f, rel, fmt))
    return files


def _count(path: str, fmt: str) -> tuple[int, tuple[int, ...]]:
    fs, p = _fs(path)
    if fmt == "parquet":
        with fs.open(p, "rb") as fh:
            return pq.ParquetFile(fh).metadata.num_rows, ()
    if fmt == "arrow":
        with fs.open(p, "rb") as fh:
            return sum(b.num_rows for b in _arrow_batches(fh)), ()
    if fmt == "jsonl":
        offsets, pos = array("q"), 0
        with fs.open(p, "rb") as fh:
            for line in fh:
                if line.strip():
                    offsets.append(pos)
                pos += len(line)
        return len(offsets), tuple(offsets)
    return input_files._read_whole(fs, p, fmt).num_rows, ()


def _arrow_batches(fh):
    """The record batches of a `datasets` Arrow file (IPC stream format; the file format too)."""
    try:
        reader = pa.ipc.open_stream(fh)
    except pa.ArrowInvalid:
        fh.seek(0)
        f = pa.ipc.open_file(fh)
        yield from (f.get_batch(i) for i in range(f.num_record_batches))
        return
    yield from reader


def describe(input_spec) -> list[DataFile]:
    out = []
    for path, rel, fmt in resolve_files(input_spec.path, input_spec.split, input_spec.revision):
        fs, p = _fs(path)
        info = fs.info(p)
        ident = content_id.file_identity(fs, p, info)  # the Hub's LFS sha256 / blob id, else the bytes' hash
        rows, offsets = _count(path, fmt)
        out.append(DataFile(path, rel, fmt, rows, ident, offsets))
    return out


def row_range(split: str | None, total: int) -> tuple[int, int]:
    """The [from, to) rows `input.split` selects out of `total` (datasets' slicing syntax)."""
    import datasets

    name = split_name(split)
    try:
        instructions = datasets.ReadInstruction.from_spec(split or name).to_absolute({name: total})
    except (ValueError, AssertionError) as exc:
        raise InputError(f"input.split {split!r} is not a split spec such as 'train' or 'train[:1000]': {exc}") \
            from None
    if len(instructions) != 1:
        raise InputError(f"input.split {split!r} names {len(instructions)} ranges; give one, e.g. 'train[:1000]'")
    return instructions[0].from_, instructions[0].to


def plan(input_spec, shard_rows: int) -> list[Shard]:
    """Shards of at most `shard_rows` rows over the split's files (never across files), in order."""
    files = describe(input_spec)
    total = sum(f.rows for f in files)
    lo, hi = row_range(input_spec.split, total)
    if input_spec.limit is not None:
        hi = min(hi, lo + input_spec.limit)
    shards: list[Shard] = []
    pos = 0
    for f in files:
        start, stop = max(lo - pos, 0), min(hi - pos, f.rows)
        for a in range(start, stop, shard_rows):
            b = min(a + shard_rows, stop)
            offset = f.offsets[a] if f.offsets else -1
            shards.append(Shard(len(shards), f.path, f.rel, a, b, offset, f"{f.fmt}:{f.identity}"))
        pos += f.rows
    if not shards:
        raise InputError(f"input {input_spec.path!r} split {input_spec.split!r} selects no rows ({total} in the split)")
    return shards


def read_shard(shard: Shard) -> list[dict[str, Any]]:
    """The rows of one shard, each with `_line` (its row index in its file)."""
    fmt = shard.file_identity.split(":", 1)[0]
    if fmt != "arrow":
        return input_files.read_shard(shard, fmt, shard.path)
    fs, p = _fs(shard.path)
    parts, pos = [], 0
    with fs.open(p, "rb") as fh:
        for batch in _arrow_batches(fh):
            n = batch.num_rows
            if pos + n > shard.start and pos < shard.stop:
                parts.append(batch.slice(max(shard.start - pos, 0), min(shard.stop, pos + n) - max(shard.start, pos)))
            pos += n
            if pos >= shard.stop:
                break
    rows = (input_files.table_rows_checked(rename_table(pa.Table.from_batches(parts)), shard.start, shard.rel)
            if parts else [])
    for k, row in enumerate(rows):
        row["_line"] = shard.start + k
    return rows


def peek(input_spec, n: int = 5) -> list[dict[str, Any]]:
    shards = plan(input_spec.model_copy(update={"limit": n}), n)
    return [r for r in read_shard(shards[0]) if "_input_error" not in r]


def keep_columns(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """`input.columns`: the row's chosen columns (under the name they are read as: fleetllm.batch.planning.input_names)
    and fleetllm's own (`_`-prefixed) ones."""
    wanted = set(columns) | {kept_name(c) for c in columns}
    return {k: v for k, v in row.items() if k in wanted or k.startswith("_")}
