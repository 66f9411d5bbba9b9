"""Remote runs through Ray's Jobs API (the head's dashboard, e.g. http://HEAD:8265).

`fleetllm submit job.yaml` uploads the working directory as the job's runtime_env working_dir and
runs `python -m fleetllm run job.yaml` on the cluster; `fleetllm status` / `fleetllm logs` follow it by
its submission id (the RUN_ID printed by submit), and `fleetllm stop RUN_ID` stops it as `ray job stop` does
(what the run committed stays; running it again resumes).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetllm.cluster.auth import auth_headers, find_token
from fleetllm.errors import FleetError

WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", "node_modules"]


class JobsError(FleetError):
    """The Jobs API could not be reached or refused the request."""


def default_entrypoint(spec_path: str) -> str:
    """The command a submitted job runs on the cluster."""
    return f"python -m fleetllm run {shlex.quote(spec_path)}"


def dashboard_address(address: str | None) -> str:
    """The Jobs API address: --address, else $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS."""
    for value in (address, os.environ.get("RAY_API_SERVER_ADDRESS"), os.environ.get("RAY_ADDRESS")):
        if value:
            return value
    raise JobsError(
        "which cluster? give --address http://HEAD:8265 (the head's dashboard) or set $RAY_ADDRESS"
    )


def client(address: str | None, token: str | None = None):
    """A JobSubmissionClient for the cluster, sending the cluster's token when one is found."""
    from ray.job_submission import JobSubmissionClient

    url = dashboard_address(address)
    headers = auth_headers(find_token(token))
    try:
        return JobSubmissionClient(url, headers=headers)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError and requests errors alike
        raise JobsError(
            f"cannot reach the Ray Jobs API at {url}: {exc}; check the address (the head's dashboard, "
            "default port 8265, started with --dashboard-host 0.0.0.0 to be reachable from other machines) "
            "and the token (--token or $RAY_AUTH_TOKEN)"
        ) from None


@dataclass(frozen=True)
class Submission:
    """What `submit` asks the cluster to run."""

    entrypoint: str
    runtime_env: dict[str, Any]
    submission_id: str


def plan_submission(
    spec_path: str,
    working_dir: str | Path,
    *,
    entrypoint: str | None = None,
    submission_id: str | None = None,
    job_name: str | None = None,
) -> Submission:
    """The entrypoint, runtime_env and id of a submission (pure; checks the spec lies in working_dir)."""
    work = Path(working_dir).resolve()
    if not work.is_dir():
        raise JobsError(f"working directory {str(work)!r} does not exist")
    if entrypoint is None:
        spec = Path(spec_path).resolve()
        if not spec.is_file():
            raise JobsError(f"job spec {spec_path!r} does not exist; check the path")
        try:
            relative = spec.relative_to(work)
        except ValueError:
            raise JobsError(
                f"job spec {str(spec)!r} is outside the working directory {str(work)!r} that is uploaded "
                "to the cluster; move it there or pass --working-dir"
            ) from None
        entrypoint = default_entrypoint(relative.as_posix())
    stem = (job_name or Path(spec_path).stem or "job").replace("_", "-").lower()
    return Submission(
        entrypoint=entrypoint,
        runtime_env={"working_dir": str(work), "excludes": list(WORKING_DIR_EXCLUDES)},
        submission_id=submission_id or f"fleetllm-{stem}-{uuid.uuid4().hex[:8]}",
    )


def submit(sub: Submission, address: str | None, token: str | None = None) -> str:
    """Submit; returns the submission id (the RUN_ID)."""
    jobs = client(address, token)
    try:
        return jobs.submit_job(
            entrypoint=sub.entrypoint,
            runtime_env=sub.runtime_env,
            submission_id=sub.submission_id,
            metadata={"submitted_by": "fleetllm"},
        )
    except Exception as exc:  # noqa: BLE001
        raise JobsError(f"the cluster refused the job: {exc}") from None


def status(run_id: str, address: str | None, token: str | None = None) -> dict[str, Any]:
    """The run's status, entrypoint, message and times, as the Jobs API reports them."""
    jobs = client(address, token)
    try:
        info = jobs.get_job_info(run_id)
    except Exception as exc:  # noqa: BLE001
        raise JobsError(f"no run {run_id!r} on the cluster ({exc}); list runs with `ray job list`") from None
    return {
        "run_id": run_id,
        "status": str(info.status.value if hasattr(info.status, "value") else info.status),
        "entrypoint": info.entrypoint,
        "message": info.message,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "driver_exit_code": getattr(info, "driver_exit_code", None),
    }


def stop(run_id: str, address: str | None, token: str | None = None) -> bool:
    """Ask the cluster to stop the run (SIGTERM to its entrypoint, as `ray job stop`); False when it had ended."""
    jobs = client(address, token)
    try:
        return bool(jobs.stop_job(run_id))
    except Exception as exc:  # noqa: BLE001
        raise JobsError(f"no run {run_id!r} on the cluster ({exc}); list runs with `ray job list`") from None


def logs(run_id: str, address: str | None, token: str | None = None) -> str:
    """The run's output so far."""
    jobs = client(address, token)
    try:
        return jobs.get_job_logs(run_id)
    except Exception as exc:  # noqa: BLE001
        raise JobsError(f"no logs for run {run_id!r} ({exc})") from None


def follow_logs(run_id: str, address: str | None, token: str | None = None, write=print) -> None:
    """Stream the run's output until it ends."""
    jobs = client(address, token)

    async def tail() -> None:
        async for chunk in jobs.tail_job_logs(run_id):
            write(chunk, end="", flush=True)

    asyncio.run(tail())


def wait_finished(run_id: str, address: str | None, timeout_s: float, token: str | None = None) -> str:
    """Poll until the run is SUCCEEDED / FAILED / STOPPED; returns that status."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        state = status(run_id, address, token)["status"]
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            return state
        if time.monotonic() > deadline:
            raise JobsError(f"run {run_id} is still {state} after {timeout_s:g} s")
        time.sleep(1.0)
