"""Which files an input path holds, in which format and compression, and how to open them.

A folder's files are found recursively; a path with any component (folder or file) starting with `_` or
`.` is skipped, as Arrow's and Spark's dataset readers do, so a fleetllm output folder (`_fleetllm/`) or
a Spark/Hadoop one (`_SUCCESS`, `.part.crc`) is valid input. The format comes from the extension; a
compression suffix after it (`.jsonl.gz`, `.csv.zst`, `.json.bz2`, `.jsonl.xz`) is decompressed as the
file is read (fsspec's codecs; `.zst` needs the `zstandard` package).
"""

from __future__ import annotations

import os
import posixpath

import fsspec

from fleetllm.batch.output import store
from fleetllm.errors import InputError

EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
LEGACY_RUN_RECORD = "run.json"  # an output folder's run record before _SUCCESS (fleetllm.batch.output.commit)
COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz"}


def split_compression(path: str) -> tuple[str, str | None]:
    """(the path without its compression suffix, fsspec's codec name or None)."""
    stem, ext = os.path.splitext(path)
    codec = COMPRESSIONS.get(ext.lower())
    return (stem, codec) if codec else (path, None)


def file_format(path: str, declared: str) -> str:
    stem, codec = split_compression(path)
    fmt = declared
    if declared == "auto":
        ext = os.path.splitext(stem)[1].lower()
        if ext not in EXTENSIONS:
            raise InputError(
                f"cannot tell the format of {path!r} from its extension; "
                f"use one of {sorted(EXTENSIONS)} (optionally compressed: {sorted(COMPRESSIONS)}) or set input.format"
            )
        fmt = EXTENSIONS[ext]
    if codec and fmt == "parquet":
        raise InputError(f"{path!r} is a compressed Parquet file; Parquet compresses its own pages and is read by "
                         "row group, so decompress it (or write it with compression='zstd' inside)")
    return fmt


def open_input(fs: fsspec.AbstractFileSystem, path: str):
    """The file, binary, decompressed by its suffix. A compressed stream seeks by reading up to the
    offset: each shard of a compressed file reads the file from its start to its own rows."""
    return fs.open(path, "rb", compression=split_compression(path)[1])


def hidden(rel: str) -> bool:
    """A path (relative to the input root) that has a component starting with `_` or `.`."""
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


def list_files(path: str, declared: str) -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str]]]:
    """(filesystem, [(URL, name relative to the input root)]) in a stable order. The URLs keep their
    protocol (s3://, gs://, ...): Ray tasks on other nodes open them again."""
    fs, root = store.open_url(path)
    if not fs.exists(root):
        raise InputError(f"input path {path!r} does not exist; check input.path")
    if fs.isdir(root):
        skip = own_records(fs, root)
        found = sorted(p for p in fs.find(root) if not hidden(rel := posixpath.relpath(p, root)) and rel not in skip)
        wanted = [p for p in found if declared != "auto" or known_extension(p)]
        if not wanted:
            raise InputError(f"input folder {path!r} holds no {sorted(EXTENSIONS)} files (paths with a component "
                             "starting with _ or . are skipped)")
        return fs, [(store.to_url(fs, p), posixpath.relpath(p, root)) for p in wanted]
    return fs, [(store.to_url(fs, root), posixpath.basename(root))]


def own_records(fs: fsspec.AbstractFileSystem, root: str) -> set[str]:
    """In a fleetllm output folder (one holding `_fleetllm/job.json`), the run record an earlier version
    wrote at the top (`run.json`), which is not data; nothing elsewhere."""
    return {LEGACY_RUN_RECORD} if fs.exists(posixpath.join(root, "_fleetllm", "job.json")) else set()


def known_extension(path: str) -> bool:
    return os.path.splitext(split_compression(path)[0])[1].lower() in EXTENSIONS
