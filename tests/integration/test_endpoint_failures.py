"""Endpoint failures that are not a row's fault stop the job and commit nothing for those rows;
failures of a row's own request stay that row's error. The real capacity server, the real runner."""

import json
import threading
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import ray

from fleetllm.batch.runner import run_job
from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.openai.engine import OpenAIHTTPEngine, check_endpoint
from fleetllm.errors import EndpointError
from fleetllm.spec import JobSpec
from fleetllm.testing.capacity_server import CapacityServer

MODEL = "capacity-test"


def spec_for(tmp_path: Path, base_url: str, key: str, rows: int = 12, **over) -> JobSpec:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"id": f"r{i:02d}", "text": f"prompt {i}"}) + "\n" for i in range(rows)))
    data = {"name": "endpoint", "model": {"source": MODEL, "engine": "openai", "engine_kwargs": {
                "base_url": base_url, "api_key": key, "max_retries": 2,
                "retry": {"initial_backoff_s": 0.01, "max_backoff_s": 0.02}}},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": 8}, "output": {"path": str(tmp_path / "out"), "shard_rows": 3},
            "compute": {"replicas": 1, "cpus_per_replica": 0.5}}
    for key_, value in over.items():
        data[key_] = {**data[key_], **value}
    return JobSpec.model_validate(data)


def rows_of(path) -> dict[str, dict]:
    rows = pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    ids = [r["row_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"a row was written twice: {sorted(ids)}"
    assert ray.data.read_parquet(str(path)).count() == len(rows)
    return {r["row_id"]: r for r in rows}


def committed_lines(tmp_path: Path) -> int:
    commits = tmp_path / "out" / "_fleetllm" / "commits"  # one commit object per shard (batch/output/commit.py)
    return len(list(commits.glob("*.json"))) if commits.exists() else 0


def test_the_engine_raises_on_a_refused_key_and_keeps_a_400_as_the_rows_error():
    with CapacityServer(capacity=None, api_key="right", bad_request_marker="BAD") as srv:
        engine = OpenAIHTTPEngine(MODEL, {"base_url": srv.base_url, "api_key": "wrong", "max_retries": 0})
        engine.start()
        try:
            with pytest.raises(EndpointError, match="refused the api key .*HTTP 401.*api_key_env"):
                engine.generate([GenerationRequest(prompt="hi", sampling={"max_tokens": 2})])
        finally:
            engine.stop()
        engine = OpenAIHTTPEngine(MODEL, {"base_url": srv.base_url, "api_key": "right", "max_retries": 0})
        engine.start()
        try:
            ok, bad = engine.generate([GenerationRequest(prompt="hi", sampling={"max_tokens": 2}),
                                       GenerationRequest(prompt="a BAD one", sampling={"max_tokens": 2})])
        finally:
            engine.stop()
        assert ok.error is None and ok.completions[0].text == "echo: hi"
        assert bad.error.startswith("HTTP 400: this prompt is invalid")
        with pytest.raises(EndpointError, match="does not serve model 'other'.*it lists \\['capacity-test'\\]"):
            check_endpoint("other", {"base_url": srv.base_url, "api_key": "right"})
        check_endpoint(MODEL, {"base_url": srv.base_url, "api_key": "right"})
    with pytest.raises(EndpointError, match="cannot be reached .*start it or fix model.engine_kwargs.base_url"):
        check_endpoint(MODEL, {"base_url": srv.base_url, "api_key": "right"}, attempts=2)


def test_a_wrong_key_stops_before_ray_and_the_rerun_computes_every_row(ray_local, tmp_path):
    with CapacityServer(capacity=None, api_key="right", bad_request_marker="prompt 7") as srv:
        with pytest.raises(EndpointError, match="refused the api key"):
            run_job(spec_for(tmp_path, srv.base_url, "wrong"))
        assert committed_lines(tmp_path) == 0 and not list((tmp_path / "out").glob("part-*"))
        report = run_job(spec_for(tmp_path, srv.base_url, "right"))
    assert report["rows_computed"] == 12 and report["rows_skipped"] == 0 and report["errors"] == 1
    rows = rows_of(tmp_path / "out")
    assert sorted(rows) == [f"r{i:02d}" for i in range(12)]
    assert rows["r07"]["error"].startswith("HTTP 400: this prompt is invalid")  # the row's own fault
    assert all(r["generated_text"].startswith("echo: prompt") for k, r in rows.items() if k != "r07")


def test_a_key_revoked_mid_run_stops_the_job_and_commits_none_of_the_refused_rows(ray_local, tmp_path):
    with CapacityServer(capacity=1, latency_s=0.15, api_key="first") as srv:
        spec = spec_for(tmp_path, srv.base_url, "first", rows=30, compute={"batch_size": 3, "batches_in_flight": 1})

        def revoke():  # once a shard is committed, the endpoint stops taking the key
            while committed_lines(tmp_path) == 0:
                time.sleep(0.02)
            srv.options.api_key = "second"

        flip = threading.Thread(target=revoke, daemon=True)
        flip.start()
        with pytest.raises(EndpointError, match=r"refused the api key .* The job stopped: (\d+) of 10 shard"):
            run_job(spec)
        flip.join(timeout=5)
        before = rows_of(tmp_path / "out")
        assert 0 < len(before) < 30 and all(r["error"] is None for r in before.values())
        again = run_job(spec_for(tmp_path, srv.base_url, "second"))
    assert again["rows_skipped"] == len(before) and again["rows_computed"] == 30 - len(before)
    rows = rows_of(tmp_path / "out")
    assert sorted(rows) == [f"r{i:02d}" for i in range(30)] and all(r["error"] is None for r in rows.values())
