"""`fleetllm run` as a subprocess: the embedded model, dry runs, and SIGKILL + resume."""

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

from kill_mid_run import committed_shards, kill_after_commits

import pyarrow.dataset as pads
import yaml

ROOT = Path(__file__).resolve().parents[2]


def fleetllm(*args, cwd=ROOT, **kw):
    return subprocess.run([sys.executable, "-m", "fleetllm", *args], cwd=cwd, capture_output=True, text=True, **kw)


def write_job(tmp_path, **over) -> Path:
    job = {"name": "e2e", "model": {"source": "smollm2-135m-instruct", "engine": "transformers"},
           "input": {"path": str(tmp_path / "in.jsonl"), "id_column": "id"},
           "prompt": {"system": "You are a helpful assistant.", "template": "{instruction}"},
           "sampling": {"max_tokens": 24, "temperature": 0.0},
           "output": {"path": str(tmp_path / "out"), "format": "parquet"},
           "compute": {"replicas": 1, "batch_size": 8, "cpus_per_replica": 2}}
    for key, value in over.items():
        job[key] = {**job[key], **value}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def read_rows(path):
    return pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()


def test_embedded_model_answers_paris(tmp_path):
    rows = [{"id": "fr", "instruction": "What is the capital of France?"},
            {"id": "h", "instruction": "Write a haiku about the sea."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(tmp_path)
    proc = fleetllm("run", str(job), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Wrote 2 rows to {tmp_path / 'out'}" in proc.stdout
    out = {r["row_id"]: r for r in read_rows(tmp_path / "out")}
    assert "Paris" in out["fr"]["generated_text"]
    assert out["h"]["generated_text"].strip()
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["model"]["kind"] == "embedded" and report["rows"] == 2


def test_dry_run_prints_the_plan_and_loads_nothing(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "instruction": "x"}) + "\n" for i in range(7)))
    proc = fleetllm("run", str(write_job(tmp_path)), "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "7 rows in 1 shard(s)" in proc.stdout and "engine     transformers" in proc.stdout
    assert not (tmp_path / "out").exists()
    assert "prompts    chat template + tokenization in the replicas" in proc.stdout
    if importlib.util.find_spec("vllm") is not None:  # vllm: the preprocess tasks tokenize
        proc = fleetllm("run", str(write_job(tmp_path, model={"engine": "vllm"})), "--dry-run", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "prompts    chat template + tokenization in preprocess tasks" in proc.stdout


def test_bad_spec_gives_a_clear_error_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: {path: x.jsonl}\noutput: {path: out}\ncompute: {replicaz: 2}\n")
    proc = fleetllm("run", str(bad), timeout=60)
    assert proc.returncode == 2
    assert "compute.replicaz: unknown field" in proc.stderr and "Traceback" not in proc.stderr
    proc = fleetllm("run", str(tmp_path / "nope.yaml"), timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_a_job_refused_at_plan_time_leaves_no_folder_and_no_log(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, "instruction": "Hi"}) + "\n")
    job = write_job(tmp_path, prompt={"template": "{nosuchcolumn}"})
    job.write_text(job.read_text().replace(str(tmp_path / "out"), str(tmp_path / "new" / "out")))
    proc = fleetllm("run", str(job), timeout=120)
    assert proc.returncode == 2 and "uses column(s) ['nosuchcolumn'] that the input rows lack" in proc.stderr
    assert not (tmp_path / "new").exists(), "the refused run created folders"
    assert "logs:" not in proc.stderr, "a refused run that logged nothing points at no log"
    (tmp_path / "mine").mkdir()  # a folder of the user's: kept, with nothing of fleetllm's in it
    job.write_text(job.read_text().replace(str(tmp_path / "new" / "out"), str(tmp_path / "mine")))
    assert fleetllm("run", str(job), timeout=120).returncode == 2
    assert (tmp_path / "mine").is_dir() and not list((tmp_path / "mine").iterdir())


def test_sigkill_then_resume_is_exactly_once(tmp_path, tiny_model):
    rows = [{"id": f"k{i:02d}", "instruction": f"Tell me about {i}."} for i in range(60)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = dict(model={"source": tiny_model}, output={"shard_rows": 5},
                  sampling={"max_tokens": 16, "extra": {"min_tokens": 16}},
                  compute={"batch_size": 1, "cpus_per_replica": 1})
    job = write_job(tmp_path, **common)
    code, stderr = kill_after_commits(["run", str(job)], tmp_path / "out", commits=6, timeout_s=400)
    assert code == -signal.SIGKILL, f"the run ended before it could be killed: {stderr[-2000:]}"
    committed = committed_shards(tmp_path / "out")
    assert 6 <= committed < 12

    resumed = fleetllm("run", str(job), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["rows_skipped"] == committed * 5 and report["rows_computed"] == 60 - committed * 5
    out = read_rows(tmp_path / "out")
    assert sorted(r["row_id"] for r in out) == [r["id"] for r in rows]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp-")]

    # outputs equal an uninterrupted greedy run
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    (ref_dir / "in.jsonl").write_text((tmp_path / "in.jsonl").read_text())
    ref = fleetllm("run", str(write_job(ref_dir, **common)), timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = {r["row_id"]: r["generated_text"] for r in read_rows(ref_dir / "out")}
    assert {r["row_id"]: r["generated_text"] for r in out} == reference
