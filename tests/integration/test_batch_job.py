"""Batch jobs on a local Ray cluster with a tiny random-weight model: the real pipeline end to end."""

import json
import threading
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import InputError, PlanError
from fleetllm.spec import JobSpec


def read_output(path) -> list[dict]:
    return pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()


def make_spec(tiny_model, tmp_path, rows=None, **over) -> JobSpec:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        rows = rows if rows is not None else [{"id": f"r{i}", "q": f"Question {i}?"} for i in range(24)]
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {
        "name": "t", "model": {"source": tiny_model, "engine": "transformers"},
        "input": {"path": str(src), "id_column": "id"}, "prompt": {"system": "Be brief.", "template": "{q}"},
        "sampling": {"max_tokens": 6}, "output": {"path": str(tmp_path / "out"), "shard_rows": 5},
        "compute": {"replicas": 1, "batch_size": 4},
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value}
    return JobSpec.model_validate(data)


def test_run_commits_every_row_once_then_resumes(ray_local, tiny_model, tmp_path):
    spec = make_spec(tiny_model, tmp_path)
    report = run_job(spec)
    rows = read_output(spec.output.path)
    assert sorted(r["row_id"] for r in rows) == sorted(f"r{i}" for i in range(24))
    assert all(r["error"] is None and r["finish_reason"] in ("stop", "length") for r in rows)
    assert all(0 < r["num_generated_tokens"] <= 6 and r["num_input_tokens"] > 5 for r in rows)
    saved = json.loads((Path(spec.output.path) / "_SUCCESS").read_text())
    assert saved["rows"] == 24 and saved["shards"] == 5 and saved["complete"] is True
    assert saved["output_tokens"] == sum(r["num_generated_tokens"] for r in rows)
    assert saved["engine"]["name"] == "transformers" and saved["versions"]["ray"]
    assert len(saved["nodes"]) == 1 and report["rows_computed"] == 24
    assert "messages" not in rows[0] and not [k for k in rows[0] if k.startswith("_")]  # _shard, _run, ... stay inside

    again = run_job(spec)
    assert again["rows_skipped"] == 24 and again["rows_computed"] == 0 and again["shards_skipped"] == 5
    assert len(read_output(spec.output.path)) == 24


def test_changed_sampling_is_refused_then_overwritten(ray_local, tiny_model, tmp_path):
    spec = make_spec(tiny_model, tmp_path, input={"limit": 5})
    run_job(spec)
    changed = make_spec(tiny_model, tmp_path, input={"limit": 5}, sampling={"max_tokens": 3})
    with pytest.raises(PlanError, match=r"different job configuration \(changed: sampling\)"):
        run_job(changed)
    report = run_job(changed, overwrite=True)
    assert report["rows_computed"] == 5 and report["rows_skipped"] == 0
    assert all(r["num_generated_tokens"] <= 3 for r in read_output(changed.output.path))


def test_template_column_missing_fails_before_loading(tiny_model, tmp_path):
    spec = make_spec(tiny_model, tmp_path, rows=[{"text": "a", "lang": "en"}])
    with pytest.raises(InputError, match=r"uses column\(s\) \['q'\].*columns present: \['lang', 'text'\]"):
        run_job(spec)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_bad_rows_are_recorded_and_the_others_complete(ray_local, tiny_model, tmp_path):
    rows = [{"id": "ok1", "q": "Hello?"}, {"id": "long", "q": "word " * 800}, {"id": "empty", "q": "  "},
            {"id": "ok2", "q": "Bye?"}]
    spec = make_spec(tiny_model, tmp_path, rows=rows)
    report = run_job(spec, max_error_rate=0.0)
    out = {r["row_id"]: r for r in read_output(spec.output.path)}
    assert set(out) == {"ok1", "long", "empty", "ok2"}
    assert "the model's context is 512 tokens" in out["long"]["error"]
    assert "empty" in out["empty"]["error"]
    assert out["ok1"]["error"] is None and out["ok2"]["generated_text"] is not None
    assert report["errors"] == 2 and report["ok"] is False


def test_openai_batch_files(ray_local, tiny_model, tmp_path):
    good = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    comp = {"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 3}}
    lines = [json.dumps(good), json.dumps({**good, "custom_id": "c", "url": "/v1/images/generations"}),
             json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/chat/completions"}),
             "{not json", json.dumps(comp)]
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join(lines) + "\n")
    spec = JobSpec.model_validate({
        "model": {"source": tiny_model, "engine": "transformers"},
        "input": {"path": str(src), "format": "openai_batch"},
        "output": {"path": str(tmp_path / "out"), "format": "openai_batch", "shard_rows": 2}})
    run_job(spec)
    ok = [json.loads(x) for x in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    bad = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert sorted(x["custom_id"] for x in ok) == ["a", "b"]
    assert len(ok) + len(bad) == 5
    by_id = {x["custom_id"]: x for x in ok}
    chat = by_id["a"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
    assert chat["body"]["usage"]["completion_tokens"] <= 4 and chat["request_id"]
    assert by_id["b"]["response"]["body"]["object"] == "text_completion"
    messages = {x["custom_id"]: x["error"]["message"] for x in bad}
    assert "url '/v1/images/generations'" in messages["c"] and "no `body`" in messages["d"]
    assert any("line 4 of batch.jsonl is not a JSON object" in m for k, m in messages.items() if k is None)
    assert all(x["response"] is None for x in bad)


def _engine_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any("MapBatches(EngineStage)" in part for part in (p.info["cmdline"] or []))]


def test_killed_engine_replica_is_restarted_exactly_once(ray_local, tiny_model, tmp_path, monkeypatch):
    import os
    import signal

    monkeypatch.setenv("FLEETLLM_USE_RAY", "1")  # replicas as Ray actors, even if an earlier test shut Ray down

    rows = [{"id": f"k{i}", "q": f"Tell me about number {i}."} for i in range(60)]
    spec = make_spec(tiny_model, tmp_path, rows=rows, sampling={"max_tokens": 48, "extra": {"min_tokens": 48}},
                     compute={"batch_size": 2})
    result = {}
    runner = threading.Thread(target=lambda: result.update(run_job(spec)))
    runner.start()
    commits = tmp_path / "out" / "_fleetllm" / "commits"
    killed, seen = None, {"commit": False, "replica": False}
    deadline = time.time() + 300
    while time.time() < deadline and runner.is_alive() and killed is None:
        seen["commit"] = seen["commit"] or (commits.exists() and any(p.suffix == ".json" for p in commits.iterdir()))
        pids = _engine_pids()
        seen["replica"] = seen["replica"] or bool(pids)
        if seen["commit"] and pids:
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    runner.join(timeout=600)
    assert killed is not None, f"the job finished before a replica could be killed (seen: {seen}, {result})"
    out = read_output(spec.output.path)
    ids = [r["row_id"] for r in out]
    assert sorted(ids) == sorted(f"k{i}" for i in range(60)) and len(ids) == len(set(ids))
    assert result["rows"] == 60 and result["errors"] == 0
    assert all(r["num_generated_tokens"] == 48 for r in out)  # the job's sampling (min_tokens) reached the engine
