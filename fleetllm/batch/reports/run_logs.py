"""Quiet by default, everything kept: while a job runs, whatever Ray, vLLM and the libraries write to
this process's stdout and stderr (Python logging, warnings, C++ lines such as core_worker.cc) goes to
a log file in the output folder, `_fleetllm/logs/`; fleetllm's own lines (the plan, the progress, the
summary) go to the terminal. At the end the Ray session's worker logs (the replicas', vLLM's) are
copied beside it. `fleetllm run -v` leaves the terminal as it is and still keeps the worker logs.

The redirection is at the file-descriptor level (os.dup2), the only level that catches the C++ lines.
Until the run owns its output folder the log is in a temporary folder named by the run
(`fleetllm-logs-<boot>-<pid>-<start>-...`, fleetllm.batch.output.owner): a killed run's is swept by the next
run; a run that ends without an output folder hands its logs over as `fleetllm-logs-kept-<date>-...`,
the path it prints.
"""

from __future__ import annotations

import contextlib
import glob
import os
import posixpath
import shutil
import sys
import tempfile
import time
from typing import Iterator, TextIO

import fsspec

from fleetllm.batch.output import owner

META = "_fleetllm"  # fleetllm/batch/output/commit.py's metadata folder
LOG_DIR = f"{META}/logs"


@contextlib.contextmanager
def captured_output(out_path: str, verbose: bool = False) -> Iterator[tuple[TextIO, TextIO, list[str]]]:
    """(terminal stdout, terminal stderr, [where the logs are, filled in at the end]) for a run.

    The logs are written to a temporary folder and moved into OUT/_fleetllm/logs/ once the run has
    made the output folder its own (OUT/_fleetllm/job.json); otherwise they stay where they were."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = owner.temp_folder("logs")
    log_path = os.path.join(folder, f"run-{stamp}.log")
    where: list[str] = []
    if verbose:
        try:
            yield sys.stdout, sys.stderr, where
        finally:
            _copy_worker_logs(folder)
            where.append(_keep(folder, out_path))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    old_streams = sys.stdout, sys.stderr
    log = open(log_path, "ab", buffering=0)
    terminal_out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    terminal_err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # sys.stdout stays on fd 1, the log: vLLM's logging handler is bound to sys.stdout when vLLM is
    # imported (during the run), and library print()s belong in the log too. fleetllm's own lines go
    # to the yielded terminal streams.
    try:
        yield terminal_out, terminal_err, where
    finally:
        for stream in (sys.stdout, sys.stderr, *old_streams):
            with contextlib.suppress(Exception):
                stream.flush()
        _copy_worker_logs(folder)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        sys.stdout, sys.stderr = old_streams
        log.close()
        where.append(_keep(folder, out_path))
        terminal_out.flush()
        terminal_err.flush()


def _keep(folder: str, out_path: str) -> str:
    """Move the logs into OUT/_fleetllm/logs/ when OUT is this job's; returns where they are ("" when a
    refused run wrote nothing to them, and they are removed)."""
    try:
        fs, root = fsspec.core.url_to_fs(out_path)
        if not fs.exists(posixpath.join(root, META, "job.json")):
            if not _holds_anything(folder):  # a run refused before it started: no log worth keeping
                shutil.rmtree(folder, ignore_errors=True)
                return ""
            return _hand_over(folder)
        target = posixpath.join(root, LOG_DIR)
        fs.makedirs(target, exist_ok=True)
        fs.put(folder.rstrip("/") + "/", target + "/", recursive=True)
    except Exception:
        return _hand_over(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return out_path.rstrip("/") + "/" + LOG_DIR


def _hand_over(folder: str) -> str:
    """The logs of a run that ended without an output folder of its own stay where the user is told
    they are: renamed so that no later run sweeps them (only folders of killed runs are swept)."""
    kept = tempfile.mkdtemp(prefix=f"fleetllm-logs-kept-{time.strftime('%Y%m%d-%H%M%S')}-")
    try:
        os.replace(folder, kept)
    except OSError:
        os.rmdir(kept)
        return folder
    return kept


def _holds_anything(folder: str) -> bool:
    return any(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def _copy_worker_logs(folder: str) -> None:
    """Shut this process's Ray down (the replicas stop, still writing to the log), then copy the Ray
    session's worker, raylet and GCS logs (a local Ray: this machine's; on a cluster, the head's)."""
    try:
        import ray

        if not ray.is_initialized():
            return
        session = ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - Ray has no public getter
        ray.shutdown()
    except Exception:
        return
    target = os.path.join(folder, "ray")
    os.makedirs(target, exist_ok=True)
    for path in glob.glob(os.path.join(session, "logs", "*")):
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            with contextlib.suppress(OSError):
                shutil.copy2(path, target)


