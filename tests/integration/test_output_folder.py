"""Who owns the output folder: torn manifests, foreign files, concurrent runs, changed plans, dry runs.

Each case asserts the exact rows read back (by row id, exactly once) and the report."""

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetllm.batch.output.folder_lock import FolderLocked
from fleetllm.batch.runner import run_job
from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec

IDS = [f"r{i}" for i in range(8)]


def spec_for(tiny_model, tmp_path, shard_rows=2, **over) -> JobSpec:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"id": i, "q": f"Question {i}?"}) + "\n" for i in IDS))
    data = {"name": "own", "model": {"source": tiny_model, "engine": "transformers"},
            "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{q}"},
            "sampling": {"max_tokens": 4}, "output": {"path": str(tmp_path / "out"), "shard_rows": shard_rows},
            "compute": {"replicas": 1, "batch_size": 4}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value}
    return JobSpec.model_validate(data)


def row_ids(out: Path) -> list[str]:
    """Every part file read back (as a reader of the folder would), sorted by id."""
    tables = [pq.read_table(p) for p in sorted(out.glob("part-*.parquet"))]
    return sorted(i for t in tables for i in t.column("row_id").to_pylist())


@pytest.fixture(scope="module")
def completed(ray_local, tiny_model, tmp_path_factory) -> Path:
    """A folder (in.jsonl and out/) whose default job (spec_for) ran to the end once: the tests that start
    from such a folder copy it instead of running the job again."""
    folder = tmp_path_factory.mktemp("completed")
    assert run_job(spec_for(tiny_model, folder))["complete"] is True
    return folder


def copy_completed(completed: Path, tmp_path: Path) -> None:
    # in.jsonl's content is each shard's identity, so the copy resumes as the original
    shutil.copytree(completed, tmp_path, dirs_exist_ok=True)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_torn_manifest_line_of_an_earlier_version_loses_nothing(ray_local, tiny_model, tmp_path, completed):
    copy_completed(completed, tmp_path)
    spec = spec_for(tiny_model, tmp_path)
    out = tmp_path / "out"
    # the folder as an earlier version left it when killed mid-append: manifest.jsonl, last line torn
    commits = sorted((out / "_fleetllm" / "commits").glob("shard-*.json"))
    lines = [p.read_text() for p in commits]
    (out / "_fleetllm" / "manifest.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:30])
    shutil.rmtree(out / "_fleetllm" / "commits")
    (out / "_SUCCESS").unlink()

    report = run_job(spec)
    assert report["complete"] is True and report["rows"] == 8
    assert report["rows_skipped"] == 6 and report["rows_computed"] == 2
    assert row_ids(out) == IDS
    assert not (out / "_fleetllm" / "manifest.jsonl").exists()
    assert run_job(spec)["rows_skipped"] == 8  # and it resumes from the commit objects from now on


def test_overwrite_refuses_a_folder_holding_foreign_files_and_lists_them(ray_local, tiny_model, tmp_path, completed):
    copy_completed(completed, tmp_path)
    spec = spec_for(tiny_model, tmp_path)
    out = tmp_path / "out"
    pq.write_table(pa.table({"row_id": ["stranger"]}), out / "data.parquet")
    before = tree(out)
    for overwrite in (True, False):
        with pytest.raises(PlanError, match=r"holds 1 file\(s\) fleetllm did not write: data.parquet"):
            run_job(spec, overwrite=overwrite)
    assert tree(out) == before  # nothing deleted, nothing written
    (out / "data.parquet").unlink()
    report = run_job(spec, overwrite=True)
    assert report["rows_computed"] == 8 and report["rows_skipped"] == 0 and row_ids(out) == IDS


def test_a_second_run_on_the_same_folder_refuses_naming_the_holder(ray_local, tiny_model, tmp_path):
    slow = spec_for(tiny_model, tmp_path, sampling={"max_tokens": 24, "extra": {"min_tokens": 24}},
                    compute={"batch_size": 1})
    first: dict = {}
    runner = threading.Thread(target=lambda: first.update(run_job(slow)))
    runner.start()
    lock = tmp_path / "out" / "_fleetllm" / "lock.json"
    deadline = time.time() + 120
    while time.time() < deadline and not (lock.exists() and lock.read_text()):
        time.sleep(0.05)
    try:
        with pytest.raises(FolderLocked, match=rf"in use by another fleetllm run \(host .*, pid {os.getpid()}, "):
            run_job(slow)
    finally:
        runner.join(timeout=600)
    assert first["complete"] is True and first["rows"] == 8 and row_ids(tmp_path / "out") == IDS
    assert not lock.exists()


def test_after_shard_rows_changes_only_the_new_plans_commits_count(ray_local, tiny_model, tmp_path, completed):
    copy_completed(completed, tmp_path)  # shard_rows 2: 4 shards
    report = run_job(spec_for(tiny_model, tmp_path, shard_rows=3))  # 3 shards: 3 + 3 + 2
    assert report["rows"] == 8 and report["shards"] == 3 and report["complete"] is True
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == [f"part-00000{i}.parquet" for i in range(3)]
    assert row_ids(tmp_path / "out") == IDS


def test_a_dry_run_leaves_the_folder_byte_identical(ray_local, tiny_model, tmp_path, completed):
    copy_completed(completed, tmp_path)
    out = tmp_path / "out"
    (out / ".tmp-part-000009.parquet").write_bytes(b"half")
    (out / "_fleetllm" / "lock.json").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    before = tree(out)
    for spec in (spec_for(tiny_model, tmp_path), spec_for(tiny_model, tmp_path, input={"limit": 3}),
                 spec_for(tiny_model, tmp_path, shard_rows=3)):
        report = run_job(spec, dry_run=True)
        assert report["dry_run"] is True
    assert tree(out) == before


def test_the_folder_opens_in_every_parquet_reader_and_resumes_after_a_report(ray_local, tiny_model, tmp_path,
                                                                              completed):
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    from fleetllm.cli import main

    copy_completed(completed, tmp_path)
    spec, out = spec_for(tiny_model, tmp_path), tmp_path / "out"
    assert main(["report", str(out)]) == 0 and (out / "_fleetllm" / "report.html").exists()
    record = json.loads((out / "_SUCCESS").read_text())  # the run record, where readers skip it
    assert record["rows"] == 8 and record["complete"] is True
    # no options: the folder is a Parquet dataset to each of them
    assert sorted(pd.read_parquet(out)["row_id"]) == IDS
    assert sorted(pq.read_table(out).column("row_id").to_pylist()) == IDS
    assert sorted(ds.dataset(out).to_table().column("row_id").to_pylist()) == IDS
    assert sorted(r[0] for r in duckdb.sql(f"select row_id from read_parquet('{out}')").fetchall()) == IDS
    assert sorted(r["row_id"] for r in ray_local.data.read_parquet(str(out)).take_all()) == IDS
    # every file fleetllm wrote (the report included) is its own: a resume and an --overwrite both run
    resumed = run_job(spec)
    assert resumed["complete"] is True and resumed["rows_skipped"] == 8
    assert not (out / "_fleetllm" / "report.html").exists()  # the report of an earlier run is not left stale
    assert main(["report", str(out)]) == 0
    again = run_job(spec, overwrite=True)
    assert again["rows_computed"] == 8 and sorted(pd.read_parquet(out)["row_id"]) == IDS


def test_a_folder_of_an_earlier_version_with_run_json_and_report_at_its_top_resumes(ray_local, tiny_model, tmp_path,
                                                                                    completed):
    copy_completed(completed, tmp_path)
    spec, out = spec_for(tiny_model, tmp_path), tmp_path / "out"
    (out / "_SUCCESS").rename(out / "run.json")  # the layout before: record and report at the top
    (out / "report.html").write_text("<html>an earlier report</html>")
    report = run_job(spec)
    assert report["complete"] is True and report["rows_skipped"] == 8
    assert not (out / "run.json").exists() and not (out / "report.html").exists()
    assert json.loads((out / "_SUCCESS").read_text())["rows"] == 8
    assert sorted(pq.read_table(out).column("row_id").to_pylist()) == IDS
