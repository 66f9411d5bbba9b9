"""OpenAI's Files and Batches routes on the serving API (`/v1/files`, `/v1/batches`), over a BatchStore.

The routes only store and read: a created batch is `validating` until the batch service of `fleetllm serve`
(fleetllm.batch.api_service) validates and runs it; a cancel writes a marker the service acts on within a
second. Same authentication as every other route. Shapes and errors follow OpenAI's API reference.
"""

from __future__ import annotations

import shutil
from typing import Any, Callable

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from fleetllm.batches.store import TERMINAL, BatchStore, batch_object, new_id, public, window_seconds
from fleetllm.batches.validate import ENDPOINTS
from fleetllm.engines.openai_api.protocol import APIError

MAX_UPLOAD_BYTES = 512 * 1024 * 1024  # OpenAI's per-file limit (a batch file: 200 MB, checked at create)
MAX_METADATA_KEYS = 16


def not_found(kind: str, object_id: str) -> APIError:
    return APIError(404, f"No such {kind} object: {object_id}", param="id", code=None)


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: items after the one with id `after`, at most `limit`."""
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


def check_limit(limit: int) -> int:
    if not 1 <= limit <= 10_000:
        raise APIError(400, f"limit {limit} is out of range; give 1 to 10000", param="limit")
    return limit


def add_batch_routes(app: FastAPI, store: BatchStore, check_key: Callable[[Request], None]) -> None:
    """Register /v1/files and /v1/batches on `app` (sync handlers: FastAPI runs them on its thread pool)."""
    add_file_routes(app, store, check_key)
    add_batches_routes(app, store, check_key)


def get_file(store: BatchStore, file_id: str) -> dict[str, Any]:
    obj = store.get_file(file_id)
    if obj is None:
        raise not_found("File", file_id)
    return obj


def get_batch(store: BatchStore, batch_id: str) -> dict[str, Any]:
    batch = store.get_batch(batch_id)
    if batch is None:
        raise not_found("Batch", batch_id)
    return batch


def add_file_routes(app: FastAPI, store: BatchStore, check_key: Callable[[Request], None]) -> None:
    """/v1/files: upload, list, retrieve, content, delete."""

    @app.post("/v1/files")
    def upload(request: Request, file: UploadFile = File(...), purpose: str = Form(...)):
        check_key(request)
        if purpose != "batch":
            raise APIError(400, f"purpose {purpose!r} is not supported here; this server stores files for the Batch "
                           "API: use purpose='batch'", param="purpose")
        size = file.size if file.size is not None else 0
        if size > MAX_UPLOAD_BYTES:
            raise APIError(413, f"the file has {size:,} bytes; the most a file may hold is {MAX_UPLOAD_BYTES:,}",
                           param="file")
        obj = store.add_file(file.filename or "upload.jsonl", purpose, lambda fh: shutil.copyfileobj(file.file, fh))
        return JSONResponse(public(obj))

    @app.get("/v1/files")
    def list_files(request: Request, purpose: str | None = None, limit: int = 10_000, after: str | None = None,
                   order: str = "desc"):
        check_key(request)
        items = [public(o) for o in store.files() if purpose is None or o["purpose"] == purpose]
        if order == "asc":
            items.reverse()
        return JSONResponse(page(items, after, check_limit(limit)))

    @app.get("/v1/files/{file_id}")
    def retrieve_file(request: Request, file_id: str):
        check_key(request)
        return JSONResponse(public(get_file(store, file_id)))

    @app.get("/v1/files/{file_id}/content")
    def file_content(request: Request, file_id: str):
        check_key(request)
        obj = get_file(store, file_id)

        def chunks():
            with store.open_content(obj) as fh:
                while block := fh.read(1 << 20):
                    yield block

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}")
    def delete_file(request: Request, file_id: str):
        check_key(request)
        obj = get_file(store, file_id)
        store.delete_file(obj)
        return JSONResponse({"id": obj["id"], "object": "file", "deleted": True})


def add_batches_routes(app: FastAPI, store: BatchStore, check_key: Callable[[Request], None]) -> None:
    """/v1/batches: create, list, retrieve, cancel."""

    @app.post("/v1/batches")
    async def create_batch(request: Request):
        check_key(request)
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            raise APIError(400, "the request body is not valid JSON (or nests too deeply); send a JSON object") \
                from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return JSONResponse(store.view(new_batch(store, body)))

    @app.get("/v1/batches")
    def list_batches(request: Request, limit: int = 20, after: str | None = None):
        check_key(request)
        items = [store.view(b) for b in reversed(store.batches())]  # newest first, as OpenAI lists them
        return JSONResponse(page(items, after, check_limit(limit)))

    @app.get("/v1/batches/{batch_id}")
    def retrieve_batch(request: Request, batch_id: str):
        check_key(request)
        return JSONResponse(store.view(get_batch(store, batch_id)))

    @app.post("/v1/batches/{batch_id}/cancel")
    def cancel_batch(request: Request, batch_id: str):
        check_key(request)
        batch = get_batch(store, batch_id)
        if batch["status"] in TERMINAL:
            raise APIError(409, f"Cannot cancel a batch with status '{batch['status']}'.", param="batch_id")
        store.request_cancel(batch_id)
        return JSONResponse(store.view(batch))


def new_batch(store: BatchStore, body: dict[str, Any]) -> dict[str, Any]:
    """Check a create request (400 naming the field) and store the `validating` Batch object."""
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if unknown:
        raise APIError(400, f"unknown parameter(s) {unknown}", param=unknown[0])
    for key in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(key), str):
            raise APIError(400, f"missing required parameter: '{key}' (a string)", param=key)
    if body["endpoint"] not in ENDPOINTS:
        raise APIError(400, f"endpoint {body['endpoint']!r} is not supported; use one of {list(ENDPOINTS)}",
                       param="endpoint")
    try:
        window_seconds(body["completion_window"])
    except ValueError as exc:
        raise APIError(400, str(exc), param="completion_window") from None
    metadata = body.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS
                                 or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise APIError(400, f"metadata must be an object of at most {MAX_METADATA_KEYS} string keys and string "
                       "values", param="metadata")
    file_obj = store.get_file(body["input_file_id"])
    if file_obj is None:
        raise APIError(404, f"No such File object: {body['input_file_id']}", param="input_file_id")
    if file_obj["purpose"] != "batch":
        raise APIError(400, f"file {file_obj['id']} has purpose {file_obj['purpose']!r}; a batch reads a file "
                       "uploaded with purpose='batch'", param="input_file_id")
    batch = batch_object(new_id("batch_"), file_obj["id"], body["endpoint"], body["completion_window"], metadata)
    store.save_batch(batch)
    return batch
