"""What an input file holds, as a short hash: the identity a shard is resumed by.

Size and modification time are not an identity: `cp -p`, `rsync -a` and `tar x` keep both while the
text changes. So:
- line formats (jsonl, openai_batch): each shard's identity is a hash of the bytes its rows span,
  taken while the plan counts the lines (the file is read once either way): appending rows changes
  only the last shard, editing a row changes only its shard;
- other formats (parquet, csv, json, Arrow): the file's identity is the object store's own content
  identity where it gives one (S3/Azure ETag with VersionId, GCS md5/crc32c with generation, the
  Hugging Face Hub's LFS sha256 or git blob id), else an XXH3-128 hash of its bytes.

`changed_files` compares a plan's file identities with the ones recorded by the folder's last run, so
the run can say which files changed.
"""

from __future__ import annotations

import json
from typing import Any

import fsspec
import xxhash

BLOCK = 1 << 20
RECORD = "_fleetllm/inputs.json"
# (keys of fsspec's info dict that name an object's content): first found wins
STORE_KEYS = (("lfs", "sha256"), ("blob_id",), ("ETag",), ("etag",), ("md5Hash",), ("crc32c",),
              ("content_settings", "content_md5"))
VERSION_KEYS = ("VersionId", "version_id", "generation")


def hasher():
    """XXH3-128: a non-cryptographic hash at memory speed (~10x BLAKE2b or SHA-256 here), enough to tell
    one file's versions apart (nobody is forging inputs against their own job)."""
    return xxhash.xxh3_128()


def digest(lines: list[bytes]) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(lines))


def store_identity(info: dict[str, Any]) -> str | None:
    """The content identity an object store reports for a file (plus its version), else None."""
    for keys in STORE_KEYS:
        value: Any = info
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value:
            version = next((str(info[k]) for k in VERSION_KEYS if info.get(k)), "")
            return f"{keys[-1]}:{value}{'@' + version if version else ''}"
    return None


def file_identity(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any]) -> str:
    """The store's content identity, else a hash of the file's bytes."""
    known = store_identity(info)
    if known is not None:
        return known
    h = hasher()
    with fs.open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            h.update(block)
    return f"xxh3:{h.hexdigest()}"


def combined(digests: tuple[str, ...], rows: int) -> str:
    """A line-format file's identity: its shards' digests together."""
    return f"xxh3:{xxhash.xxh3_128_hexdigest(json.dumps([rows, *digests]).encode())}"


def changed_files(previous: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The files (by name under the input root) whose identity differs from the last run's record."""
    if not previous:
        return []
    return sorted(rel for rel, ident in current.items() if rel in previous and previous[rel] != ident)


def recorded(folder: str) -> dict[str, str] | None:
    """{file: identity} recorded by the folder's last planned run, else None."""
    fs, root = fsspec.core.url_to_fs(folder)
    try:
        with fs.open(f"{root.rstrip('/')}/{RECORD}", "r") as fh:
            data = json.load(fh)
        return {str(k): str(v) for k, v in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record(folder: str, files: dict[str, str]) -> None:
    from fleetllm.batch.output import store

    fs, root = fsspec.core.url_to_fs(folder)
    store.write_atomic(fs, f"{root.rstrip('/')}/{RECORD}",
                       lambda fh: fh.write(json.dumps({"files": files}, indent=1).encode()))
