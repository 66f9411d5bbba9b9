"""Start a `fleetllm` command and SIGKILL it (with the local Ray it started) once enough shards committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kill_after_commits(args: list[str], manifest: Path, commits: int, timeout_s: float,
                       poll_s: float = 0.05) -> tuple[int, str]:
    """Run `python -m fleetllm ARGS`; kill its process group when `manifest` has `commits` lines.
    Returns (return code, stderr): -SIGKILL when the kill landed, else the run ended first."""
    proc = subprocess.Popen([sys.executable, "-m", "fleetllm", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if manifest.exists() and len(manifest.read_text().splitlines()) >= commits:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(poll_s)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr
