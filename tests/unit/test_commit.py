import json

import pytest

from fleetllm.batch.commit import ManifestEntry, OutputFolder
from fleetllm.batch.plan import InputFile, plan_shards, shard_fingerprint
from fleetllm.errors import PlanError

PARTS = {"sampling": {"max_tokens": 8}, "model": {"files": [("a", 1, 2)]}}


def _entry(shard, fp):
    return ManifestEntry(shard=shard.shard_id, file=f"part-{shard.shard_id:06d}.jsonl", rows=shard.rows,
                         errors=0, input_tokens=1, output_tokens=2, fingerprint=shard_fingerprint(fp, shard),
                         nodes=["n1"])


def test_commit_resume_and_torn_manifest(tmp_path):
    out = OutputFolder(str(tmp_path / "o"), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    shards = plan_shards([InputFile("/x", "x", 1, "1", 30)], 10)
    out.commit(_entry(shards[0], "fp1"), lambda fh: fh.write(b"{}\n"))
    with open(tmp_path / "o" / "_fleetllm" / "manifest.jsonl", "a") as fh:
        fh.write('{"shard": 1, "fi')  # a driver killed mid-append
    (tmp_path / "o" / ".tmp-part-000002.jsonl").write_text("half")
    out2 = OutputFolder(str(tmp_path / "o"), "jsonl")
    out2.prepare("fp1", PARTS, overwrite=False)  # same job: accepted, leftovers cleaned
    assert not (tmp_path / "o" / ".tmp-part-000002.jsonl").exists()
    todo, valid = out2.pending(shards, "fp1")
    assert [s.shard_id for s in todo] == [1, 2] and list(valid) == [0]


def test_changed_job_is_refused_naming_what_changed(tmp_path):
    out = OutputFolder(str(tmp_path), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    changed = {**PARTS, "sampling": {"max_tokens": 9}}
    with pytest.raises(PlanError, match=r"changed: sampling\); outputs are never mixed: use --overwrite"):
        out.prepare("fp2", changed, overwrite=False)
    (tmp_path / "part-000000.jsonl").write_text("{}\n")
    (tmp_path / "mine.txt").write_text("keep me")
    out.prepare("fp2", changed, overwrite=True)
    assert not (tmp_path / "part-000000.jsonl").exists() and (tmp_path / "mine.txt").exists()
    assert json.loads((tmp_path / "_fleetllm" / "job.json").read_text())["fingerprint"] == "fp2"


def test_foreign_folder_is_refused(tmp_path):
    (tmp_path / "data.csv").write_text("a\n")
    with pytest.raises(PlanError, match="not written by fleetllm"):
        OutputFolder(str(tmp_path), "parquet").prepare("fp", PARTS, overwrite=False)
