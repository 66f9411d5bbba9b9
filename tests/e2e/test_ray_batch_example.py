"""The Ray-style driver script in examples/ runs as it is."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ray_batch_example_runs_as_is(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "ray_batch_example.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "What is the capital of France? -> The capital of France is Paris." in proc.stdout
    assert list((tmp_path / "out" / "ray_batch_example").glob("*.parquet"))
