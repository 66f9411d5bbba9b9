"""`fleetllm run` on a Hugging Face dataset folder (written by save_to_disk) with a split slice."""

import json

import pytest
from test_cli_run import fleetllm, read_rows, write_job
from test_run_report import assert_quiet_and_logged

datasets = pytest.importorskip("datasets")


def test_job_on_a_saved_dataset_with_a_split_slice(tmp_path):
    n = 80
    rows = {"instruction": [f"Name the number {i}." for i in range(n)], "input": [""] * n, "output": ["x"] * n}
    folder = tmp_path / "alpaca"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    job = write_job(tmp_path, input={"path": str(folder), "split": "train[:50]", "id_column": None,
                                     "columns": ["instruction"]},
                    sampling={"max_tokens": 4}, output={"shard_rows": 20})
    dry = fleetllm("run", str(job), "--dry-run", timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "50 rows in 3 shard(s)" in dry.stdout
    proc = fleetllm("run", str(job), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Wrote 50 rows to {tmp_path / 'out'}" in proc.stdout
    assert_quiet_and_logged(proc, tmp_path / "out")  # the embedded model's run: no ERROR/Traceback/core_worker
    out = sorted(read_rows(tmp_path / "out"), key=lambda r: int(r["row_id"].split(":")[1]))
    assert [r["instruction"] for r in out] == rows["instruction"][:50]
    assert "output" not in out[0]  # input.columns kept only `instruction`
    assert all(r["error"] is None and r["generated_text"] for r in out)
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["rows"] == 50
    again = fleetllm("run", str(job), timeout=300)  # resume: the same shards, all committed
    assert "(0 computed, 50 resumed" in again.stdout, again.stderr[-2000:]
