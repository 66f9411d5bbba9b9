"""The CLI against messy inputs and failing endpoints: `fleetllm query` with a wrong key stops before
anything is committed and the rerun with the right key computes every row; `fleetllm run` writes rows
whose template column mixes strings and numbers; an unwritable output path is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import yaml

from fleetllm.testing.capacity_server import CapacityServer

ROOT = Path(__file__).resolve().parents[2]
MODEL = "capacity-test"


def fleetllm(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "fleetllm", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kw)


def read_rows(path: Path) -> dict[str, dict]:
    rows = pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    ids = [r["row_id"] for r in rows]
    assert len(ids) == len(set(ids)), sorted(ids)
    return {r["row_id"]: r for r in rows}


def query_spec(tmp_path: Path, base_url: str) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "text": f"prompt {i}" if i != 3 else 3}) + "\n" for i in range(8)))
    spec = {"name": "keys", "model": {"source": MODEL, "engine_kwargs": {"base_url": base_url, "max_retries": 1}},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{text}"},
            "sampling": {"max_tokens": 8}, "output": {"path": str(tmp_path / "out"), "shard_rows": 3},
            "compute": {"replicas": 1, "cpus_per_replica": 0.5}}
    path = tmp_path / "query.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_query_with_a_wrong_key_commits_nothing_and_the_rerun_computes_all(tmp_path):
    with CapacityServer(capacity=None, api_key="sk-right") as srv:
        spec = query_spec(tmp_path, srv.base_url)
        proc = fleetllm("query", str(spec), env={"OPENAI_API_KEY": "sk-wrong"}, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "refused the api key (HTTP 401: Incorrect API key provided)" in proc.stderr
        assert "OPENAI_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
        assert not list((tmp_path / "out").glob("part-*")) and not list((tmp_path / "out").rglob("*.json"))
        proc = fleetllm("query", str(spec), env={"OPENAI_API_KEY": "sk-right"}, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Wrote 8 rows" in proc.stdout and "(8 computed, 0 resumed, 0 errors" in proc.stdout
    rows = read_rows(tmp_path / "out")
    assert {k: r["generated_text"] for k, r in rows.items()} == {
        f"q{i}": f"echo: prompt {i}" if i != 3 else "echo: 3" for i in range(8)}


def test_query_against_an_endpoint_that_is_down_or_serves_another_model(tmp_path):
    with CapacityServer(capacity=None, model="another") as srv:
        spec = query_spec(tmp_path, srv.base_url)
        proc = fleetllm("query", str(spec), timeout=300)
        assert proc.returncode == 2 and "does not serve model 'capacity-test' (it lists ['another'])" in proc.stderr
    proc = fleetllm("query", str(spec), timeout=300)  # the server is gone now
    assert proc.returncode == 2 and "cannot be reached or broke off its answers (connection error" in proc.stderr
    assert "start it or fix model.engine_kwargs.base_url" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "out").rglob("*.json"))  # no job, no commit (the lock's folder may stay)


def test_run_with_an_unwritable_output_is_a_clear_error_before_ray(tmp_path, tiny_model):
    (tmp_path / "in.jsonl").write_text('{"id":"m0","instruction":"Hi"}\n{"id":"m1","instruction":7}\n')
    (tmp_path / "file").write_text("not a folder")
    job = {"name": "unwritable", "model": {"source": tiny_model, "engine": "transformers"},
           "input": {"path": str(tmp_path / "in.jsonl"), "id_column": "id"}, "prompt": {"template": "{instruction}"},
           "sampling": {"max_tokens": 3}, "output": {"path": str(tmp_path / "file" / "out")},
           "compute": {"replicas": 1, "batch_size": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = fleetllm("run", str(tmp_path / "job.yaml"), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Not a directory" in proc.stderr and str(tmp_path / "file" / "out") in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "engine:" not in proc.stderr  # stopped before Ray and the plan

    # the reproduction: a string then a number in the template column, ids mixing types
    (tmp_path / "in.jsonl").write_text('{"id":"m0","instruction":"Hi"}\n{"id":1,"instruction":7}\n')
    job["output"]["path"] = str(tmp_path / "out")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    for _ in range(2):  # the rerun resumes both rows
        proc = fleetllm("run", str(tmp_path / "job.yaml"), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(0 computed, 2 resumed, 0 errors" in proc.stdout
    rows = read_rows(tmp_path / "out")
    assert {k: (r["id"], r["instruction"], r["error"]) for k, r in rows.items()} == {
        "m0": ("m0", "Hi", None), "1": ("1", "7", None)}


def test_inputs_fleetllm_cannot_use_are_refused_before_the_run_naming_the_fix(tmp_path):
    """`fleetllm run --dry-run` (no model, no endpoint): each bad input is one line naming it, exit 2."""
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps({"id": i % 2, "instruction": "q"}) + "\n" for i in range(3)))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "empty.parquet").write_bytes(b"")
    (tmp_path / "dup.csv").write_text("instruction,a,a\nq,1,2\n")
    cases = [({"path": str(tmp_path / "ids.jsonl"), "id_column": "id"}, "{instruction}",
              "input.id_column 'id' is not unique: '0' (2 rows)"),
             ({"path": str(tmp_path / "folder")}, "{instruction}",
              "input file 'empty.parquet' cannot be read as parquet"),
             ({"path": str(tmp_path / "dup.csv")}, "{instruction}", "names column(s) ['a'] more than once"),
             ({"path": str(tmp_path / "ids.jsonl")}, "{instruction:d}", "cannot render column 'instruction'"),
             ({"path": str(tmp_path / "ids.jsonl")}, "{instruction.__class__}", "uses attribute access")]
    for k, (source, template, message) in enumerate(cases):
        spec = {"name": "bad", "model": {"source": MODEL, "engine": "openai",
                                         "engine_kwargs": {"base_url": "http://127.0.0.1:9/v1"}},
                "input": source, "prompt": {"template": template}, "output": {"path": str(tmp_path / f"out{k}")}}
        job = tmp_path / f"job{k}.yaml"
        job.write_text(yaml.safe_dump(spec))
        proc = fleetllm("run", str(job), "--dry-run", timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (k, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
