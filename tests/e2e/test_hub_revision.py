"""A hub model's revision is pinned to its commit (fleetllm.hub_revision): in the job's fingerprint and in
what the engine loads. The hub is a local fake here: a Hugging Face cache holding `fake-org/tiny` (the tiny
random Llama) with HF_HUB_OFFLINE=1, so the commit comes from the cache's refs/main, as it does wherever
the hub cannot be reached. When main moves to another commit, resuming the folder is refused, naming the
model, instead of mixing two models' rows."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SHA1, SHA2 = "1" * 40, "2" * 40


def publish(cache: Path, model: Path, sha: str) -> None:
    """The cache as huggingface_hub leaves it after a download of main at commit `sha`."""
    repo = cache / "models--fake-org--tiny"
    shutil.copytree(model, repo / "snapshots" / sha)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)


def run(tmp_path: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "FLEETLLM_USE_RAY": "0"}
    return subprocess.run([sys.executable, "-m", "fleetllm", "run", str(tmp_path / "job.yaml")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_the_fingerprint_and_the_engine_take_the_commit_and_a_moved_main_is_refused(tiny_model, tmp_path):
    cache = tmp_path / "hub"
    publish(cache, Path(tiny_model), SHA1)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"q": f"q{i}"}) + "\n" for i in range(3)))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "hub", "model": {"source": "fake-org/tiny", "engine": "transformers"},
        "input": {"path": "in.jsonl"}, "prompt": {"template": "{q}"}, "sampling": {"max_tokens": 2},
        "output": {"path": "out"}, "compute": {"replicas": 1}}))
    first = run(tmp_path, cache)
    assert first.returncode == 0, first.stdout + first.stderr
    job = json.loads((tmp_path / "out" / "_fleetllm" / "job.json").read_text())
    assert job["parts"]["model"]["revision"] == SHA1 and job["parts"]["engine_kwargs"]["revision"] == SHA1
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["rows"] == 3

    publish(cache, Path(tiny_model), SHA2)  # main moved on the hub: another commit
    again = run(tmp_path, cache)
    assert again.returncode == 2
    assert "holds results of a different job configuration (changed: engine_kwargs, model)" in again.stderr
