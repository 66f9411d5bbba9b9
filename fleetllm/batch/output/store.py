"""Paths as URLs through fsspec: local folders, network file systems and object stores.

Every path fleetllm reads or writes goes through `open_url`, so a URL keeps its protocol (and the
store its credentials, which come from the environment or the store's own configuration) all the
way to the Ray task that reads a shard on another node.

Two write paths, one interface (`write_atomic`):
- file systems (local, NFS, ...): a temporary name in the same folder, fsynced, renamed into place;
- object stores (s3, gs, abfs, ...): the object is written once under its final name: a PUT (or a
  multipart upload, completed in one request) makes it exist whole or not at all; there is no
  rename (a copy plus delete there) and no append.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Callable

import fsspec

OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2", "cos", "obs", "tos"}
# open(path, "xb") is a conditional create on these: S3 `If-None-Match: *` (s3fs), GCS
# `ifGenerationMatch=0` (gcsfs), Azure `If-None-Match: *` (adlfs); FileExistsError when it exists.
EXCLUSIVE_CREATE = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}


def open_url(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path within it) of a local path or an fsspec URL."""
    return fsspec.core.url_to_fs(url)


def protocol(fs: fsspec.AbstractFileSystem) -> str:
    proto = fs.protocol
    return proto[0] if isinstance(proto, (tuple, list)) else proto


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return protocol(fs) in ("file", "local")


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    return protocol(fs) in OBJECT_STORES


def to_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A path of `fs` as a URL any process can open again (local paths stay plain paths)."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def listing(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, dict[str, Any]]:
    """{basename: info} of a folder or prefix, fresh (no cached listing); {} when it does not exist.
    Object stores list in pages (s3fs, gcsfs and adlfs page through the listing themselves)."""
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for info in entries:
        name = posixpath.basename(info["name"].rstrip("/"))
        if name and info["name"].rstrip("/") != path.rstrip("/"):
            found[name] = info
    return found


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, write: Callable[[Any], None],
                 durable: bool = True) -> None:
    """Write `path` so that it exists whole or not at all (see the module docstring). On a local
    disk `durable` fsyncs the data before the rename, so the file survives a power loss whole; the
    rename is ordered by the file system's journal before any later one (a commit object)."""
    if is_object_store(fs):
        with fs.open(path, "wb") as fh:
            write(fh)
        return
    folder = posixpath.dirname(path)
    tmp = f"{folder}/.tmp-{posixpath.basename(path)}"
    try:
        if is_local(fs):
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "wb") as fh:
                write(fh)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
            return
        fs.makedirs(folder, exist_ok=True)
        with fs.open(tmp, "wb") as fh:
            write(fh)
        fs.mv(tmp, path)
    except BaseException:  # a full disk, a failed write, an interrupt: no temporary file is left behind
        _discard(fs, tmp)
        raise


def _discard(fs: fsspec.AbstractFileSystem, tmp: str) -> None:
    try:
        if is_local(fs):
            os.remove(tmp)
        else:
            fs.rm(tmp)
    except (OSError, FileNotFoundError):
        pass


def create_exclusive(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> tuple[bool, bool]:
    """Create `path` holding `data` only if it does not exist: (created, atomic). `atomic` is False
    where the store offers no conditional create and this was a check followed by a write."""
    if is_local(fs):
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False, True
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return True, True
    if protocol(fs) in EXCLUSIVE_CREATE:
        try:
            with fs.open(path, "xb") as fh:
                fh.write(data)
        except FileExistsError:
            return False, True
        return True, True
    fs.invalidate_cache(posixpath.dirname(path))
    if fs.exists(path):
        return False, False
    with fs.open(path, "wb") as fh:
        fh.write(data)
    return True, False


def read_bytes(fs: fsspec.AbstractFileSystem, paths: list[str]) -> dict[str, bytes]:
    """The contents of many small files; object stores fetch them concurrently. Files that vanished
    between the listing and the read are left out."""
    if not paths:
        return {}
    if is_local(fs):
        found = {}
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    found[path] = fh.read()
            except FileNotFoundError:
                pass
        return found
    got = fs.cat(paths, on_error="omit")
    return {fs._strip_protocol(k): v for k, v in got.items()}


def remove(fs: fsspec.AbstractFileSystem, paths: list[str]) -> None:
    """Delete files (object stores: in batched requests); ones already gone are fine."""
    if not paths:
        return
    if is_local(fs):
        for path in paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        return
    try:
        fs.rm(paths)
    except FileNotFoundError:
        pass
    fs.invalidate_cache()
