import json
import os
import socket
import subprocess
import sys

import pytest

from fleetllm.batch.output.commit import ManifestEntry, OutputFolder
from fleetllm.batch.output.folder_lock import FolderLocked
from fleetllm.batch.planning.shards import InputFile, plan_shards, shard_fingerprint
from fleetllm.errors import PlanError

PARTS = {"sampling": {"max_tokens": 8}, "model": {"files": [("a", 1, 2)]}}


def _entry(shard, fp):
    return ManifestEntry(shard=shard.shard_id, file=f"part-{shard.shard_id:06d}.jsonl", rows=shard.rows,
                         errors=0, input_tokens=1, output_tokens=2, fingerprint=shard_fingerprint(fp, shard),
                         nodes=["n1"])


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_commit_objects_resume_and_leftovers_are_discarded(tmp_path):
    out = OutputFolder(str(tmp_path / "o"), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    shards = plan_shards([InputFile("/x", "x", 1, "1", 30)], 10)
    out.commit(_entry(shards[0], "fp1"), lambda fh: fh.write(b"{}\n"))
    assert [p.name[:13] for p in (tmp_path / "o" / "_fleetllm" / "commits").iterdir()] == ["shard-000000-"]
    assert not (tmp_path / "o" / "_fleetllm" / "manifest.jsonl").exists()  # nothing is appended to
    (tmp_path / "o" / "part-000001.jsonl").write_text("{}\n")  # killed between its data and its commit
    (tmp_path / "o" / ".tmp-part-000002.jsonl").write_text("half")
    out2 = OutputFolder(str(tmp_path / "o"), "jsonl")
    out2.prepare("fp1", PARTS, overwrite=False)  # same job: accepted
    todo, valid = out2.pending(shards, "fp1")
    assert [s.shard_id for s in todo] == [1, 2] and list(valid) == [0]
    out2.discard_others(valid)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["_fleetllm", "part-000000.jsonl"]


def test_legacy_manifest_with_a_torn_last_line_is_adopted_never_appended_to(tmp_path):
    root = tmp_path / "o"
    shards = plan_shards([InputFile("/x", "x", 1, "1", 30)], 10)
    (root / "_fleetllm").mkdir(parents=True)
    (root / "_fleetllm" / "job.json").write_text(json.dumps({"fingerprint": "fp1", "parts": PARTS}))
    for s in shards:
        (root / f"part-{s.shard_id:06d}.jsonl").write_text("{}\n")
    lines = [_entry(s, "fp1").to_json() for s in shards]
    (root / "_fleetllm" / "manifest.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:25])
    out = OutputFolder(str(root), "jsonl")
    todo, valid = out.pending(shards, "fp1")  # an earlier version's folder resumes
    assert [s.shard_id for s in todo] == [2] and sorted(valid) == [0, 1]
    out.prepare("fp1", PARTS, overwrite=False)
    assert not (root / "_fleetllm" / "manifest.jsonl").exists()
    out.discard_others(valid)
    out.commit(_entry(shards[2], "fp1"), lambda fh: fh.write(b"{}\n"))
    assert sorted(OutputFolder(str(root), "jsonl").committed(shards, "fp1")) == [0, 1, 2]


def test_entries_of_another_plan_do_not_count(tmp_path):
    out = OutputFolder(str(tmp_path), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    old = plan_shards([InputFile("/x", "x", 1, "1", 8)], 2)
    for s in old:
        out.commit(_entry(s, "fp1"), lambda fh: fh.write(b"{}\n"))
    new = plan_shards([InputFile("/x", "x", 1, "1", 8)], 3)
    todo, valid = out.pending(new, "fp1")
    assert len(todo) == 3 and valid == {}
    out.discard_others(valid)  # part-000003 of the old plan goes, with its commit, before anything runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_fleetllm"]
    assert os.listdir(tmp_path / "_fleetllm" / "commits") == []


def test_pending_changes_nothing_on_disk(tmp_path):
    out = OutputFolder(str(tmp_path), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    shards = plan_shards([InputFile("/x", "x", 1, "1", 30)], 10)
    for s in shards:
        out.commit(_entry(s, "fp1"), lambda fh: fh.write(b"{}\n"))
    (tmp_path / ".tmp-part-000009.jsonl").write_text("half")
    before = tree(tmp_path)
    out.pending(shards[:1], "fp1")  # a plan with fewer shards (a dry run with input.limit)
    assert tree(tmp_path) == before


def test_changed_job_is_refused_naming_what_changed(tmp_path):
    out = OutputFolder(str(tmp_path), "jsonl")
    out.prepare("fp1", PARTS, overwrite=False)
    changed = {**PARTS, "sampling": {"max_tokens": 9}}
    out.prepare("fp2", changed, overwrite=False)  # nothing committed under fp1: nothing to mix with
    out.prepare("fp1", PARTS, overwrite=False)
    shard = plan_shards([InputFile("/x", "x", 1, "1", 30)], 10)[0]
    out.commit(_entry(shard, "fp1"), lambda fh: fh.write(b"{}\n"))
    with pytest.raises(PlanError, match=r"changed: sampling\); outputs are never mixed: use --overwrite"):
        out.prepare("fp2", changed, overwrite=False)
    (tmp_path / "_SUCCESS").write_text("{}")
    (tmp_path / "run.json").write_text("{}")  # an earlier version's record: fleetllm's too
    out.prepare("fp2", changed, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_fleetllm"]
    assert json.loads((tmp_path / "_fleetllm" / "job.json").read_text())["fingerprint"] == "fp2"


def test_foreign_files_are_refused_and_listed_even_with_overwrite(tmp_path):
    (tmp_path / "data.csv").write_text("a\n")
    with pytest.raises(PlanError, match="not written by fleetllm"):
        OutputFolder(str(tmp_path), "parquet").prepare("fp", PARTS, overwrite=False)
    (tmp_path / "data.csv").unlink()
    out = OutputFolder(str(tmp_path), "jsonl")
    out.prepare("fp", PARTS, overwrite=False)
    (tmp_path / "part-000000.jsonl").write_text("{}\n")
    (tmp_path / "data.parquet").write_text("not ours")
    (tmp_path / "notes").mkdir()
    before = tree(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(PlanError, match=r"holds 2 file\(s\) fleetllm did not write: data.parquet, notes"):
            with out.lock(overwrite):
                pass
    assert tree(tmp_path) == before  # not even a lock file was written


def test_the_lock_names_its_live_holder_and_a_dead_holder_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom fleetllm.batch.output.commit import OutputFolder\n"
         f"lock = OutputFolder({str(tmp_path)!r}, 'jsonl').lock()\nlock.acquire()\nprint('held', flush=True)\n"
         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLocked, match=rf"in use by another fleetllm run \(host {socket.gethostname()}, "
                                               rf"pid {holder.pid}, started 20"):
            OutputFolder(str(tmp_path), "jsonl").lock().acquire()
    finally:
        holder.kill()
        holder.wait()
    lock_file = tmp_path / "_fleetllm" / "lock.json"
    assert json.loads(lock_file.read_text())["pid"] == holder.pid  # left behind by the killed process
    with OutputFolder(str(tmp_path), "jsonl").lock() as lock:
        assert lock.took_over["pid"] == holder.pid
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
        with pytest.raises(FolderLocked):  # a second run in this same process is refused too
            OutputFolder(str(tmp_path), "jsonl").lock().acquire()
    assert not lock_file.exists()


def test_an_unwritable_output_folder_is_a_clear_error(tmp_path):
    (tmp_path / "f").write_text("a file, not a folder")
    with pytest.raises(PlanError, match="cannot write the output folder .*check output.path"):
        OutputFolder(str(tmp_path / "f" / "out"), "jsonl").lock().acquire()
