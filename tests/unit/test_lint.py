"""The package passes its ruff configuration (pyproject.toml [tool.ruff]: pyflakes, pycodestyle's errors,
lines of 120): `ruff check fleetllm`, run here so that a change that breaks it fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_passes_on_the_package():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: it is in the test extra (pip install -e '.[test]')"
    proc = subprocess.run([ruff, "check", "fleetllm", "--output-format", "concise"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
