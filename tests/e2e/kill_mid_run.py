"""Start a `fleetllm` command and SIGKILL it (with the local Ray it started) once enough shards committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def committed_shards(output: str | Path) -> int:
    """How many commit objects the output folder (a path or an fsspec URL) holds."""
    from fleetllm.batch.output import store
    from fleetllm.batch.output.commit import COMMIT, COMMITS, META

    fs, root = store.open_url(str(output))
    return sum(1 for n in store.listing(fs, f"{root.rstrip('/')}/{META}/{COMMITS}") if COMMIT.match(n))


def kill_after_commits(args: list[str], output: str | Path, commits: int, timeout_s: float,
                       poll_s: float = 0.05, env: dict | None = None) -> tuple[int, str]:
    """Run `python -m fleetllm ARGS`; kill its process group once `output` holds `commits` commits.
    Returns (return code, stderr): -SIGKILL when the kill landed, else the run ended first."""
    proc = subprocess.Popen([sys.executable, "-m", "fleetllm", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True, env=env)
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if committed_shards(output) >= commits:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(poll_s)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr
