"""Temporary folders of a run (`fleetllm-prefix-*`, `fleetllm-logs-*`) are named by their owner and
swept by the next run once that owner is dead, even where its pid now belongs to another process;
those of live runs, handed-over logs and anything fleetllm did not name are left alone."""

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from fleetllm.batch.output import owner
from fleetllm.batch.runner import run_job
from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec

MAKE = ("import sys, time\nfrom fleetllm.batch.output import owner\n"
        "print(owner.temp_folder('prefix'), owner.temp_folder('logs'), flush=True)\n"
        "time.sleep(float(sys.argv[1]))")


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))  # this process's temporary folder
    return root


def folders_of_a_process(root, *, alive: bool) -> tuple[list[str], subprocess.Popen]:
    """The temporary folders made by another process, killed (SIGKILL: nothing cleaned) unless `alive`."""
    proc = subprocess.Popen([sys.executable, "-c", MAKE, "600"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(root)})
    made = proc.stdout.readline().split()
    for path in made:
        with open(os.path.join(path, "spill"), "w") as fh:
            fh.write("x" * 1000)
    if not alive:
        proc.kill()
        proc.wait()
    return made, proc


def test_a_killed_runs_folders_are_swept_and_a_live_ones_are_kept(tmp_root):
    dead, _ = folders_of_a_process(tmp_root, alive=False)
    live, proc = folders_of_a_process(tmp_root, alive=True)
    try:
        mine = owner.temp_folder("logs")
        kept = tmp_root / "fleetllm-logs-kept-20260101-000000-abcd1234"  # logs a run handed to its user
        other = tmp_root / "fleetllm-prefix-notes"  # a name fleetllm does not make
        for folder in (kept, other):
            folder.mkdir()
        assert sorted(owner.sweep_temp()) == sorted(dead)
        assert all(os.path.isdir(p) for p in (*live, mine, kept, other))
    finally:
        proc.kill()
        proc.wait()
    assert sorted(owner.sweep_temp()) == sorted(live)


def test_a_dead_owners_pid_reused_by_a_live_process_does_not_keep_its_folder(tmp_root):
    dead, _ = folders_of_a_process(tmp_root, alive=False)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:  # rename the dead run's folder as if its pid were now the bystander's
        boot, _pid, ticks, rest = os.path.basename(dead[0]).split("-", 2)[2].split("-", 3)
        reused = tmp_root / f"fleetllm-prefix-{boot}-{bystander.pid}-{ticks}-{rest}"
        os.rename(dead[0], reused)
        assert str(reused) in owner.sweep_temp()
    finally:
        bystander.kill()
        bystander.wait()


def test_an_earlier_versions_folder_is_swept_once_a_day_old(tmp_root):
    old, recent = tmp_root / "fleetllm-prefix-k3j_9xq2", tmp_root / "fleetllm-logs-a8d7f6e5"
    for folder in (old, recent):
        folder.mkdir()
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    assert owner.sweep_temp() == [str(old)]
    assert recent.is_dir()


def test_the_next_run_sweeps_even_when_it_is_refused(tmp_root, tmp_path):
    dead, _ = folders_of_a_process(tmp_root, alive=False)
    (tmp_path / "in.jsonl").write_text(json.dumps({"q": "a"}) + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("not fleetllm's")
    spec = JobSpec.model_validate({"model": {"source": "smollm2-135m-instruct", "engine": "transformers"},
                                   "input": {"path": str(tmp_path / "in.jsonl")}, "prompt": {"template": "{q}"},
                                   "output": {"path": str(tmp_path / "out")}})
    with pytest.raises(PlanError, match="not empty"):
        run_job(spec)
    assert not any(os.path.exists(p) for p in dead)
