"""The live ETA on the Ray path (issue 37): replicas report their engine's progress to the run's board, the
driver reads the sum (fleetllm.batch.execution.progress_board), and a job run on Ray logs the ETAs it made.
The tiny random-weight model on the transformers engine, the tests' local Ray cluster."""

from __future__ import annotations

import json
import time

from fleetllm.batch.execution.progress_board import BoardEngine, Reporter, open_board
from fleetllm.engines.base import GenerationRequest, create_engine


def wait_for(read, until, timeout_s: float = 20.0):
    end = time.time() + timeout_s
    while time.time() < end:
        value = read()
        if value is not None and until(value):
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout_s} s; last: {value}")


def test_replicas_report_their_engines_progress_and_the_driver_reads_the_sum(ray_local, tiny_model):
    engine = create_engine("transformers", tiny_model)
    engine.start()
    board = open_board()
    driver = BoardEngine(board)
    assert driver.read() is None and driver.ready_at is None  # no replica has reported
    first = Reporter(board, "replica-a", 200.0, engine, every_s=0.05)
    results = engine.generate([GenerationRequest(prompt=f"count to {i}", sampling={"max_tokens": 5, "temperature": 0})
                               for i in range(3)])
    tokens = sum(r.num_generated_tokens for r in results)
    seen = wait_for(driver.read, lambda p: p.finished == 3)
    assert seen.finished_tokens == tokens and seen.running == () and driver.ready_at == 200.0
    other = create_engine("transformers", tiny_model)
    other.start()
    second = Reporter(board, "replica-b", 150.0, other, every_s=0.05)
    other.generate([GenerationRequest(prompt="hello", sampling={"max_tokens": 4, "temperature": 0})])
    both = wait_for(driver.read, lambda p: p.finished == 4)
    assert both.finished_tokens > tokens and driver.ready_at == 150.0  # the first replica ready
    first.stop(), second.stop()  # their threads live in this process: no report may outlive the test's Ray


def test_a_job_on_ray_keeps_its_etas(ray_local, tiny_model, tmp_path, monkeypatch):
    """Ray is up in this process, so `fleetllm run` takes the Ray Data path (not the in-process run)."""
    import yaml

    from fleetllm.cli import main

    monkeypatch.setenv("FLEETLLM_HOME", str(tmp_path / "home"))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"question {i}"}) + "\n" for i in range(24)))
    job = {"name": "ray-eta", "model": {"source": tiny_model, "engine": "transformers"},
           "input": {"path": str(data), "id_column": "id"}, "prompt": {"template": "{text}"},
           "sampling": {"max_tokens": 16, "temperature": 0.0},
           "output": {"path": str(tmp_path / "out"), "format": "jsonl", "shard_rows": 4},
           "compute": {"batch_size": 4, "replicas": 1, "cpus_per_replica": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["run", str(tmp_path / "job.yaml")]) == 0
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    points = report["estimate"]["eta_log"]["points"]
    assert points and points[-1][1] == 24 and points[-1][2] == 0  # every row committed, nothing left
    assert all(p[3] >= p[1] for p in points)  # the engines' count of rows done is never behind the commits
