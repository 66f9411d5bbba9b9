"""Inputs by content and jobs over jobs (issue 33), with the real runner and a tiny transformers model:
a file rewritten with its size and mtime kept recomputes exactly its changed shard and the run names the
file; a job over a previous job's output folder reads its parts (not `_fleetllm/`), keeps the previous
`error`, `row_id` and `generated_text` as `input_*` columns and computes every row, its error rows too."""

import json
import os
from pathlib import Path

import pyarrow.dataset as pads

from fleetllm.batch.runner import run_job
from fleetllm.spec import JobSpec


def spec_for(model: str, src: Path, out: Path, template: str = "{instruction}") -> JobSpec:
    return JobSpec.model_validate({
        "name": "chain", "model": {"source": model, "engine": "transformers"}, "input": {"path": str(src)},
        "prompt": {"template": template}, "sampling": {"max_tokens": 2},
        "output": {"path": str(out), "shard_rows": 4}, "compute": {"replicas": 1, "batch_size": 4}})


def read(out: Path) -> dict[str, dict]:
    rows = pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    return {r["row_id"]: r for r in rows}


def test_a_rewrite_keeping_size_and_mtime_recomputes_its_shard_and_names_the_file(tiny_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"instruction": f"question {i}"}) + "\n" for i in range(10)))
    out = tmp_path / "out"
    assert run_job(spec_for(tiny_model, src, out))["rows_computed"] == 10
    stat = src.stat()
    text = src.read_text().replace("question 5", "QUESTION 5")  # shard 1 (rows 4-7)
    src.write_text(text)
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as `cp -p` leaves it
    again = run_job(spec_for(tiny_model, src, out))
    assert again["changed_files"] == ["in.jsonl"]
    assert again["rows_computed"] == 4 and again["rows_skipped"] == 6
    assert run_job(spec_for(tiny_model, src, out))["changed_files"] == []
    with src.open("a") as fh:  # appending: only the last shard (rows 8-9, now 8-10) is computed again
        fh.write(json.dumps({"instruction": "question 10"}) + "\n")
    appended = run_job(spec_for(tiny_model, src, out))
    assert appended["rows_computed"] == 3 and appended["rows_skipped"] == 8
    assert sorted(read(out)) == sorted(f"in.jsonl:{i}" for i in range(11))


def test_a_job_over_a_previous_output_keeps_its_columns_and_recomputes_its_error_rows(tiny_model, tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "instruction": "   " if i in (1, 4) else f"question {i}"} for i in range(6)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = tmp_path / "first"
    run_job(spec_for(tiny_model, src, first))
    before = read(first)
    assert {r["id"] for r in before.values() if r["error"]} == {"r1", "r4"}  # empty prompts
    assert (first / "_fleetllm").is_dir()
    # the previous output folder as input, fixed rows in a template over its own columns
    second = tmp_path / "second"
    report = run_job(spec_for(tiny_model, first, second, template="Answer again: {instruction}"))
    assert report["rows"] == 6 and report["complete"]
    after = read(second)
    assert len(after) == 6
    by_old_id = {r["input_row_id"]: r for r in after.values()}
    assert set(by_old_id) == set(before)
    for rid, old in before.items():
        new = by_old_id[rid]
        assert new["input_error"] == old["error"] and new["input_generated_text"] == old["generated_text"]
        assert new["error"] is None and new["num_generated_tokens"] > 0  # the failed rows computed this time
        assert new["id"] == old["id"] and new["instruction"] == old["instruction"]
    assert {"input_attempts", "input_finish_reason", "input_num_input_tokens"} <= set(next(iter(after.values())))
