"""Files and batch records of the Batch API, in a folder or object-store prefix (fsspec).

    ROOT/files/<file_id>.json          the File object (+ "path": where its bytes are, relative to ROOT)
    ROOT/files/<file_id>.jsonl         an uploaded file's bytes
    ROOT/batches/<batch_id>/batch.json the Batch object (written by the API at create, then by the runner)
    ROOT/batches/<batch_id>/cancel     written by the API on cancel; the runner reads it and stops the job
    ROOT/batches/<batch_id>/job/       the fleetllm job's output folder (shards, commits, output.jsonl,
                                       errors.jsonl): the output and error files point into it

The API process and the runner share nothing but this folder: each Batch object has one writer at a time
(the API while `validating` at create, the runner afterwards), and a cancel is a separate marker file.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import time
import uuid
from typing import Any, Callable, Iterator

import fsspec

BATCH_HEADER = "x-fleetllm-batch"  # marks a request as a batch row: low priority, counted apart in /metrics
TERMINAL = ("failed", "completed", "expired", "cancelled")
WINDOW_RE = re.compile(r"^(\d+)(s|m|h)$")
MAX_WINDOW_S = 24 * 3600


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def window_seconds(window: str) -> int:
    """"24h" (OpenAI's only value) or a shorter "<N>s|m|h"; ValueError naming the accepted forms."""
    m = WINDOW_RE.match(str(window))
    if not m:
        raise ValueError(f"completion_window {window!r} is not supported; use '24h' (or a shorter window such as "
                         "'30m' or '90s')")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 0 < seconds <= MAX_WINDOW_S:
        raise ValueError(f"completion_window {window!r} must be longer than 0 and at most '24h'")
    return seconds


def file_object(file_id: str, size: int, filename: str, purpose: str, path: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()), "filename": filename,
            "purpose": purpose, "status": "processed", "status_details": None, "expires_at": None, "path": path}


def public(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as the API returns it (without the store's own keys, which start with `path` or `_`)."""
    return {k: v for k, v in obj.items() if k != "path" and not k.startswith("_")}


def batch_object(batch_id: str, input_file_id: str, endpoint: str, window: str, metadata: dict | None) -> dict:
    now = int(time.time())
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": input_file_id,
            "completion_window": window, "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + window_seconds(window),
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata or None}


class BatchStore:
    """The Batch API's objects under one root URL (a local folder or an object-store prefix)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        proto = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.local = proto in ("file", "local")
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def p(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    def url_of(self, *names: str) -> str:
        """A path under ROOT as a URL another process opens (a fleetllm job's input or output)."""
        return self.p(*names) if self.local else self.fs.unstrip_protocol(self.p(*names))

    def _write(self, path: str, write: Callable[[Any], None]) -> None:
        """Whole or not at all: a local file is written aside and renamed; an object PUT is atomic."""
        if not self.local:
            with self.fs.open(path, "wb") as fh:
                write(fh)
            return
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _write_json(self, path: str, obj: dict[str, Any]) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode()
        self._write(path, lambda fh: fh.write(data))

    def _read(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    def _read_json(self, path: str) -> dict[str, Any] | None:
        raw = self._read(path)
        return json.loads(raw) if raw else None

    def _names(self, folder: str) -> list[str]:
        """The entries of a folder or prefix, fresh (no cached listing); [] when it does not exist."""
        self.fs.invalidate_cache(folder)
        try:
            return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(folder, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    # --- files ---

    def add_file(self, filename: str, purpose: str, write: Callable[[Any], None]) -> dict[str, Any]:
        """Store an upload (`write(fh)` writes its bytes) and its File object."""
        file_id = new_id("file-")
        rel = f"files/{file_id}.jsonl"
        self._write(self.p(rel), write)
        size = self.fs.size(self.p(rel))
        obj = file_object(file_id, size, filename, purpose, rel)
        self._write_json(self.p("files", f"{file_id}.json"), obj)
        return obj

    def register_file(self, file_id: str, filename: str, purpose: str, rel: str) -> dict[str, Any]:
        """A File object for bytes fleetllm wrote under ROOT (a batch's output or error file)."""
        obj = file_object(file_id, self.fs.size(self.p(rel)), filename, purpose, rel)
        self._write_json(self.p("files", f"{file_id}.json"), obj)
        return obj

    def get_file(self, file_id: str) -> dict[str, Any] | None:
        if not _safe(file_id):
            return None
        return self._read_json(self.p("files", f"{file_id}.json"))

    def files(self) -> list[dict[str, Any]]:
        found = [self._read_json(self.p("files", n)) for n in self._names(self.p("files")) if n.endswith(".json")]
        return sorted((o for o in found if o), key=lambda o: (o["created_at"], o["id"]), reverse=True)

    def open_content(self, obj: dict[str, Any]):
        return self.fs.open(self.p(obj["path"]), "rb")

    def content_path(self, obj: dict[str, Any]) -> str:
        return self.p(obj["path"])

    def delete_file(self, obj: dict[str, Any]) -> None:
        """Remove the File object; an upload's bytes too (a batch's output stays in its job folder)."""
        paths = [self.p("files", f"{obj['id']}.json")]
        if obj["path"].startswith("files/"):
            paths.append(self.p(obj["path"]))
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

    # --- batches ---

    def save_batch(self, batch: dict[str, Any]) -> None:
        self._write_json(self.p("batches", batch["id"], "batch.json"), batch)

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        if not _safe(batch_id):
            return None
        return self._read_json(self.p("batches", batch_id, "batch.json"))

    def batches(self) -> list[dict[str, Any]]:
        """Every batch, oldest first."""
        found = [self._read_json(self.p("batches", n, "batch.json")) for n in self._names(self.p("batches"))]
        return sorted((b for b in found if b), key=lambda b: (b["created_at"], b["id"]))

    def request_cancel(self, batch_id: str) -> None:
        """The first cancel's time is kept (a second cancel changes nothing)."""
        if self.cancel_requested_at(batch_id) is None:
            stamp = str(time.time()).encode()
            self._write(self.p("batches", batch_id, "cancel"), lambda fh: fh.write(stamp))

    def cancel_requested_at(self, batch_id: str) -> int | None:
        raw = self._read(self.p("batches", batch_id, "cancel"))
        return int(float(raw)) if raw else None

    def view(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The Batch object as clients see it: `cancelling` once a cancel was asked and the runner has not
        finished the batch yet."""
        out = public(batch)
        if out["status"] not in TERMINAL and out["status"] != "cancelling":
            asked = self.cancel_requested_at(batch["id"])
            if asked is not None:
                out["status"], out["cancelling_at"] = "cancelling", out["cancelling_at"] or asked
        return out

    def job_url(self, batch_id: str) -> str:
        return self.url_of("batches", batch_id, "job")

    def lines(self, file_obj: dict[str, Any]) -> Iterator[bytes]:
        with self.open_content(file_obj) as fh:
            yield from fh


def _safe(object_id: str) -> bool:
    """Ids name files under ROOT: letters, digits, '-' and '_' only (no path tricks)."""
    return bool(re.fullmatch(r"[A-Za-z0-9_-]{1,100}", object_id or ""))
