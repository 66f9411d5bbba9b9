"""A disk that fills mid-run (a small tmpfs, mounted by the test where it runs as root): one message
naming the folder, what is committed and what to do; no temporary file or uncommitted part left; after
space is freed the same job resumes and writes every row once."""

import json
import os
import subprocess

import pyarrow.parquet as pq
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec

ROWS = 24


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def spec(tmp_path, out, model) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i:02d}", "q": f"Question {i}?"}) + "\n" for i in range(ROWS)))
    return JobSpec.model_validate({
        "name": "full", "model": {"source": str(model), "engine": "transformers"},
        "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{q}"},
        "sampling": {"max_tokens": 4, "temperature": 0}, "output": {"path": str(out), "shard_rows": 2},
        "compute": {"replicas": 1, "batch_size": 2}})


def test_a_full_disk_stops_the_run_with_one_message_and_the_rerun_resumes(tiny_model, tmp_path, small_disk):
    job = spec(tmp_path, small_disk / "out", tiny_model)
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 72 * 1024))  # room for the metadata and a few shards, not 12
    with pytest.raises(PlanError) as stop:
        run_job(job)
    message = str(stop.value)
    assert f"output folder '{small_disk / 'out'}' is full (No space left on device" in message
    committed = len(os.listdir(small_disk / "out" / "_fleetllm" / "commits"))
    assert 0 < committed < ROWS // 2
    assert f"{committed} shard(s) ({committed * 2} rows) are committed in '{small_disk / 'out'}' and kept" in message
    assert "Free space on that disk" in message and "run the same command again" in message
    left = [p for p in (small_disk / "out").rglob("*") if p.name.startswith(".tmp-")]
    assert left == []
    assert len(list((small_disk / "out").glob("part-*"))) == committed  # no part without its commit

    filler.unlink()
    report = run_job(job)
    assert report["complete"] is True and report["rows_skipped"] == committed * 2
    rows = [r for p in sorted((small_disk / "out").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert sorted(r["row_id"] for r in rows) == [f"r{i:02d}" for i in range(ROWS)]
