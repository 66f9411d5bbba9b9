"""The OpenAI Batch API on `fleetllm serve` (transformers engine, the embedded model), driven by the official
openai client as its docs show it: upload, create, poll, download output and error files, list, retrieve,
cancel (partial output kept), expiry, validation failures naming the line (on the shared served app, whose
batches use 4-request shards: tests/conftest.py); and a server SIGKILLed mid-batch that resumes it on restart
with each custom_id answered once (its own server, started twice)."""

from __future__ import annotations

import collections
import re

import httpx
import openai
import pytest

from fleetllm.testing.batch_client import chat_lines, read_lines, submit, wait_for
from fleetllm.testing.serve_process import ServeProcess

MODEL = "smollm2"


def serve_spec(store: str, engine: str = "transformers") -> dict:
    return {"name": f"batch-{engine}", "models": [{
        "model_id": MODEL, "source": "smollm2-135m-instruct", "engine": engine,
        "engine_kwargs": {"max_model_len": 1024}, "max_ongoing_requests": 8, "max_queued_requests": 8}],
        "batches": {"path": store, "shard_rows": 4}}


@pytest.fixture
def served(served_smollm2):
    return served_smollm2


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


def check_output_shape(line: dict) -> None:
    assert line["id"].startswith("batch_req_") and line["error"] is None
    response = line["response"]
    assert response["status_code"] == 200 and response["request_id"]
    body = response["body"]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0


def test_batch_runs_to_completed_each_custom_id_once(client):
    lines = chat_lines(10, MODEL)
    lines.append({"custom_id": "bad-temperature", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}})
    batch = submit(client, lines, metadata={"job": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"job": "e2e"} and batch.object == "batch"
    batch = wait_for(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == 11 and batch.request_counts.completed == 10
    assert batch.request_counts.failed == 1
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at >= batch.created_at
    out, err = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(10))
    for line in out:
        check_output_shape(line)
    assert [x["custom_id"] for x in err] == ["bad-temperature"]
    assert err[0]["response"] is None and "temperature" in err[0]["error"]["message"]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]
    assert client.batches.retrieve(batch.id).status == "completed"


def test_files_list_retrieve_content_delete(client):
    uploaded = client.files.create(file=("a.jsonl", b'{"x": 1}\n'), purpose="batch")
    assert uploaded.object == "file" and uploaded.bytes == 9 and uploaded.filename == "a.jsonl"
    assert uploaded.id in [f.id for f in client.files.list()]
    assert client.files.retrieve(uploaded.id).bytes == 9
    assert client.files.content(uploaded.id).content == b'{"x": 1}\n'
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError) as exc:
        client.files.retrieve(uploaded.id)
    assert exc.value.body["message"] == f"No such File object: {uploaded.id}"
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")


def test_bad_file_fails_at_validation_naming_each_line(client):
    good = chat_lines(1, MODEL)[0]
    lines = [good, "{not json", {**good, "custom_id": "u", "url": "/v1/embeddings"},
             {**good, "custom_id": "m", "method": "GET"}, good,
             {**good, "custom_id": "x", "body": {**good["body"], "model": "gpt-4o"}}]
    batch = wait_for(client, submit(client, lines).id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    by_line = {e.line: e for e in batch.errors.data}
    assert sorted(by_line) == [2, 3, 4, 5, 6]
    assert by_line[2].code == "invalid_json_line" and by_line[3].code == "invalid_url"
    assert by_line[4].code == "invalid_method" and by_line[5].code == "duplicate_custom_id"
    assert by_line[6].code == "model_not_found" and "gpt-4o" in by_line[6].message
    assert batch.request_counts.completed == 0


def test_create_refuses_a_bad_request_with_openai_errors(client):
    f = client.files.create(file=("r.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
    assert exc.value.body["param"] == "endpoint"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_cancel_stops_and_keeps_partial_output(client, served):
    batch = submit(client, chat_lines(160, MODEL, max_tokens=32, prefix="c"))
    wait_for(client, batch.id, done=4)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = wait_for(client, batch.id, timeout_s=20)
    assert batch.status == "cancelled" and batch.cancelled_at
    out = read_lines(client, batch.output_file_id)
    ids = [x["custom_id"] for x in out]
    assert 4 <= len(ids) < 160 and len(set(ids)) == len(ids) == batch.request_counts.completed
    for line in out:
        check_output_shape(line)
    with pytest.raises(openai.APIStatusError) as exc:  # a finished batch cannot be cancelled
        client.batches.cancel(batch.id)
    assert exc.value.status_code == 409
    metrics = httpx.get(served.url.removesuffix("/v1") + "/metrics", timeout=30).text
    assert 'fleetllm_batch_requests_total{endpoint="chat",model="smollm2",status="200"}' in metrics
    window = re.search(r'^fleetllm_batch_admission_window\{model="smollm2"\} (\S+)$', metrics, re.M)
    assert window and float(window.group(1)) >= 1  # batch rows went through the admission window
    rebaselines = re.search(r'^fleetllm_batch_admission_rebaselines\{model="smollm2"\} (\S+)$', metrics, re.M)
    assert rebaselines and float(rebaselines.group(1)) >= 0  # exported beside the window


def test_completion_window_expires_with_finished_lines_kept(client):
    batch = wait_for(client, submit(client, chat_lines(200, MODEL, max_tokens=32, prefix="e"), window="6s").id,
                     timeout_s=60)
    assert batch.status == "expired" and batch.expired_at >= batch.expires_at
    ids = [x["custom_id"] for x in read_lines(client, batch.output_file_id)]
    assert len(ids) == len(set(ids)) == batch.request_counts.completed < 200


def test_sigkill_mid_batch_then_restart_answers_each_custom_id_once(tmp_path, embedded_model):
    spec = serve_spec(str(tmp_path / "store"))
    first = ServeProcess(spec, tmp_path).start()
    client = openai.OpenAI(base_url=first.url, api_key="unused", max_retries=0, timeout=120)
    batch = submit(client, chat_lines(24, MODEL, max_tokens=16, prefix="k"))
    wait_for(client, batch.id, done=4)
    first.kill()  # the server, its Ray, its replicas and the batch's job process: all SIGKILLed
    second = ServeProcess(spec, tmp_path, port=first.port).start()
    try:
        client = openai.OpenAI(base_url=second.url, api_key="unused", max_retries=0, timeout=120)
        batch = wait_for(client, batch.id)
        assert batch.status == "completed", batch
        ids = collections.Counter(x["custom_id"] for x in read_lines(client, batch.output_file_id))
        assert ids == collections.Counter(f"k{i}" for i in range(24))
        assert batch.request_counts.completed == 24 and batch.error_file_id is None
    finally:
        second.stop()
