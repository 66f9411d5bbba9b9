"""The Batch API without a model: validation of batch files (every refusal naming its line), the completion
window, and the /v1/files and /v1/batches routes in-process (FastAPI over httpx's ASGITransport, files on
disk): auth, OpenAI's shapes and errors, cancel marking `cancelling`."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fleetllm.batches import validate
from fleetllm.batches.store import BatchStore, window_seconds
from fleetllm.serve.api import make_api

SERVED = {"m": "generate", "e": "embed"}


def line(i: int, **over) -> bytes:
    row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, **over}
    return json.dumps(row).encode() + b"\n"


def check(lines: list[bytes], endpoint: str = "/v1/chat/completions", size: int = 10):
    return validate.validate_lines(lines, size, endpoint, SERVED)


def test_a_good_file_counts_its_requests_and_names_its_model():
    v = check([line(1), b"\n", line(2)])
    assert (v.errors, v.total, v.model) == ([], 2, "m")


def test_each_refusal_names_line_and_code():
    body = {"model": "m", "messages": []}
    v = check([line(1), b"{oops", line(1), line(3, method="GET"), line(4, url="/v1/completions"),
               line(5, body={"model": "nope"}), line(6, custom_id=None), line(7, body="x"),
               line(8, body={**body, "model": "e"}), b"[1]"])
    assert [(e["line"], e["code"]) for e in v.errors] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "invalid_method"), (5, "invalid_url"),
        (6, "model_not_found"), (7, "missing_custom_id"), (8, "invalid_body"), (9, "mismatched_model"),
        (10, "invalid_json_line")]
    assert "line 1" in v.errors[1]["message"] and "nope" in v.errors[4]["message"]


def test_model_of_the_wrong_task_and_empty_files_are_refused():
    v = check([line(1, url="/v1/embeddings")], endpoint="/v1/embeddings")
    assert [e["code"] for e in v.errors] == ["model_not_supported"]
    assert [e["code"] for e in check([b"\n"]).errors] == ["empty_file"]


def test_limits_are_openais(monkeypatch):
    assert (validate.MAX_REQUESTS, validate.MAX_BYTES) == (50_000, 200 * 1024 * 1024)
    assert [e["code"] for e in check([line(1)], size=validate.MAX_BYTES + 1).errors] == ["file_too_large"]
    monkeypatch.setattr(validate, "MAX_REQUESTS", 2)
    v = check([line(i) for i in range(3)])
    assert [(e["line"], e["code"]) for e in v.errors] == [(3, "too_many_requests")]


def test_completion_window():
    assert window_seconds("24h") == 86400 and window_seconds("90s") == 90
    for bad in ("48h", "1d", "0s", "soon"):
        with pytest.raises(ValueError, match="completion_window"):
            window_seconds(bad)


def call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


def test_routes_store_files_and_batches_with_openai_shapes(tmp_path):
    app = make_api({}, api_key="k", batch_store=str(tmp_path))
    auth = {"Authorization": "Bearer k"}
    assert call(app, "GET", "/v1/files").status_code == 401
    up = call(app, "POST", "/v1/files", headers=auth, files={"file": ("in.jsonl", line(1))},
              data={"purpose": "batch"}).json()
    assert up["object"] == "file" and up["purpose"] == "batch" and up["bytes"] == len(line(1)) and "path" not in up
    assert call(app, "GET", f"/v1/files/{up['id']}/content", headers=auth).content == line(1)
    assert [f["id"] for f in call(app, "GET", "/v1/files", headers=auth).json()["data"]] == [up["id"]]
    created = call(app, "POST", "/v1/batches", headers=auth, json={
        "input_file_id": up["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}).json()
    assert created["status"] == "validating" and created["expires_at"] == created["created_at"] + 86400
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    cancelled = call(app, "POST", f"/v1/batches/{created['id']}/cancel", headers=auth).json()
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"]
    assert call(app, "GET", "/v1/batches", headers=auth).json()["data"][0]["status"] == "cancelling"
    store = BatchStore(str(tmp_path))
    done = {**store.get_batch(created["id"]), "status": "completed"}
    store.save_batch(done)
    refused = call(app, "POST", f"/v1/batches/{created['id']}/cancel", headers=auth)
    assert refused.status_code == 409 and "completed" in refused.json()["error"]["message"]
    assert call(app, "DELETE", f"/v1/files/{up['id']}", headers=auth).json() == {
        "id": up["id"], "object": "file", "deleted": True}
    missing = call(app, "GET", f"/v1/files/{up['id']}", headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    assert call(app, "GET", "/v1/batches/..%2Fetc", headers=auth).status_code == 404


def test_create_refuses_bad_parameters_naming_them(tmp_path):
    app = make_api({}, batch_store=str(tmp_path))
    up = call(app, "POST", "/v1/files", files={"file": ("in.jsonl", line(1))}, data={"purpose": "batch"}).json()
    base = {"input_file_id": up["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    for change, param in (({"endpoint": "/v1/responses"}, "endpoint"), ({"completion_window": "7d"},
                          "completion_window"), ({"metadata": {"a": 1}}, "metadata"), ({"extra": 1}, "extra")):
        r = call(app, "POST", "/v1/batches", json={**base, **change})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = call(app, "POST", "/v1/batches", json={**base, "input_file_id": "file-none"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"
    r = call(app, "POST", "/v1/files", files={"file": ("in.jsonl", b"x")}, data={"purpose": "fine-tune"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"


def test_serve_spec_places_batches_under_fleetllm_home_and_halves_the_capacity(tmp_path, monkeypatch):
    from fleetllm.serve.spec import ServeSpec

    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path))
    spec = ServeSpec.model_validate({"name": "app", "models": [
        {"model_id": "a", "task": "generate", "replicas": 2, "max_ongoing_requests": 16}]})
    assert spec.batch_store_url() == str(tmp_path / "batches" / "app")
    assert spec.batch_models() == {"a": {"task": "generate", "max_in_flight": 16}}
    off = ServeSpec.model_validate({"models": [{"model_id": "a"}], "batches": {"enabled": False}})
    assert off.batch_store_url() is None


def test_a_batchs_job_groups_lines_sharing_a_prefix_and_never_embeddings(tmp_path):
    from fleetllm.batch.api_job import job_spec
    from fleetllm.batch.planning.job_plan import plan_job
    from fleetllm.batches.store import batch_object
    from fleetllm.testing.batch_client import document_lines, jsonl

    store = BatchStore(str(tmp_path))

    def planned(lines: list[dict], endpoint: str):
        up = store.add_file("in.jsonl", "batch", lambda fh: fh.write(jsonl(lines)))
        batch = batch_object(f"batch_{len(store.files())}", up["id"], endpoint, "24h", None)
        spec = job_spec(store, batch, "http://127.0.0.1:9/v1", "m", 16, 8)
        assert spec.compute.prefix_grouping == "auto"
        return plan_job(spec)  # decides the grouping from the lines; writes nothing

    plan = planned(document_lines(70, 4), "/v1/chat/completions")  # 280 lines, each document asked 4 times
    assert plan.grouped and "grouping   auto: " in "\n".join(plan.describe())
    assert not planned(document_lines(70, 1), "/v1/chat/completions").grouped  # nothing shared: input order
    embed = planned([{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": "e", "input": "the same text"}} for i in range(300)], "/v1/embeddings")
    assert not embed.grouped and "not for embed jobs" in embed.grouping.reason
