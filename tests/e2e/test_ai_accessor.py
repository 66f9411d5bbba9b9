"""`import fleetllm.ai`: the `.ai` accessor on ray.data.Dataset, driven against a real `fleetllm serve`."""

import os
import subprocess
import sys
from pathlib import Path

from fleetllm.testing.serve_process import ServeProcess

ROOT = Path(__file__).resolve().parents[2]


def test_accessor_is_registered_explicitly_and_changes_nothing_else():
    import ray.data

    before = set(vars(ray.data.Dataset))
    import fleetllm.ai
    from fleetllm.query.ai_query import ai_query

    assert set(vars(ray.data.Dataset)) - before <= {"ai"}
    assert ray.data.Dataset.ai is fleetllm.ai.AIAccessor  # on the class: the accessor itself (docs, help())
    assert "ai_query" in (fleetllm.ai.AIAccessor.ai_query.__doc__ or "") and ai_query.__doc__


def test_the_drivers_call_runs_as_written_against_fleetllm_serve(tmp_path):
    spec = {"name": "accessor", "api_key": "sk-test", "models": [
        {"model_id": "Qwen3.5-4B", "source": "smollm2-135m-instruct", "engine": "transformers",
         "engine_kwargs": {"max_model_len": 2048}}]}
    with ServeProcess(spec, tmp_path) as served:
        env = {**os.environ, "BASE_URL": served.url, "API_KEY": "sk-test", "MAX_TOKENS": "8",
               "CONCURRENCY": "2", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "ai_accessor.py")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Wrote 16 rows (0 failed)" in proc.stdout, proc.stdout + proc.stderr[-2000:]
        bad_key = subprocess.run([sys.executable, str(ROOT / "examples" / "ai_accessor.py")],
                                 env={**env, "API_KEY": "wrong"}, cwd=tmp_path, capture_output=True, text=True,
                                 timeout=600)
        # a refused key is not the rows' fault: the pipeline stops naming it, no row is written as an answer
        assert bad_key.returncode != 0 and "Wrote" not in bad_key.stdout, bad_key.stdout + bad_key.stderr[-2000:]
        assert "refused the api key (HTTP 401" in bad_key.stderr, bad_key.stderr[-2000:]
