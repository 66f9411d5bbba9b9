"""`fleetllm submit / status / logs` against a real Ray head (its own temp dir, dashboard on a free
loopback port, token authentication on), started and stopped with `fleetllm cluster start/stop`."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleetllm(*args: str, env: dict[str, str], timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetllm", *args], env=env, capture_output=True, text=True, timeout=timeout,
        cwd=cwd, check=False,
    )


@pytest.fixture(scope="module")
def head():
    token = secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0"
    )
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_API_SERVER_ADDRESS"):
        env.pop(name, None)
    temp = tempfile.mkdtemp(prefix="flrs", dir="/tmp")
    gcs, dash = free_port(), free_port()
    ports = {
        "--dashboard-agent-listen-port": free_port(),
        "--ray-client-server-port": free_port(),
        "--metrics-export-port": free_port(),
    }
    try:
        start = fleetllm(
            "cluster", "start", "--head", "--port", str(gcs), "--node-ip-address", "127.0.0.1",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--num-cpus", "1",
            "--object-store-memory", str(100 * 1024 * 1024), "--temp-dir", temp,
            *[f"--ray-arg={flag}={port}" for flag, port in ports.items()],
            env=env, timeout=180,
        )
        assert start.returncode == 0, start.stdout + start.stderr
        assert "token authentication (token from $RAY_AUTH_TOKEN)" in start.stdout
        yield {"env": env, "address": f"http://127.0.0.1:{dash}", "temp": temp}
    finally:
        stop = fleetllm("cluster", "stop", "--temp-dir", temp, env=env)
        from fleetllm.cluster.bootstrap import processes_using, stop_temp_dir

        left = processes_using(temp)
        stop_temp_dir(temp, grace_s=2)  # belt and braces: nothing of ours may outlive the test
        shutil.rmtree(temp, ignore_errors=True)
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
        assert left == [], f"`fleetllm cluster stop --temp-dir` left processes {left}"


def wait_done(head: dict, run_id: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        proc = fleetllm("status", run_id, "--json", "--address", head["address"], env=head["env"])
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        if info["status"] in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return info
        time.sleep(1)


def test_submit_runs_in_the_uploaded_working_dir_and_logs_show_it(head, tmp_path):
    (tmp_path / "note.txt").write_text("from the working dir")
    entry = "python -c 'print(42); print(open(\"note.txt\").read())'"
    sub = fleetllm(
        "submit", "--entrypoint", entry, "--working-dir", str(tmp_path), "--address", head["address"],
        "--submission-id", "fleetllm-test-42", env=head["env"],
    )
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert sub.stdout.strip() == "fleetllm-test-42"

    info = wait_done(head, "fleetllm-test-42")
    assert info["status"] == "SUCCEEDED", info
    assert info["entrypoint"] == entry

    logs = fleetllm("logs", "fleetllm-test-42", "--address", head["address"], env=head["env"])
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert "42" in lines, logs.stdout
    assert lines[lines.index("42") + 1] == "from the working dir"

    follow = fleetllm("logs", "fleetllm-test-42", "--follow", "--address", head["address"], env=head["env"])
    assert follow.returncode == 0, follow.stderr
    assert "42" in follow.stdout and "from the working dir" in follow.stdout


def test_submit_of_a_job_yaml_runs_fleetllm_run_on_it(head, tmp_path):
    spec = {"name": "remote", "input": {"path": "in.jsonl"}, "output": {"path": "out"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = dict(head["env"], RAY_ADDRESS=head["address"])  # the address from the environment this time
    sub = fleetllm("submit", "job.yaml", env=env, cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_id = sub.stdout.strip()
    assert run_id.startswith("fleetllm-remote-")
    info = wait_done(head, run_id)
    assert info["entrypoint"] == "python -m fleetllm run job.yaml"


def test_without_the_token_the_dashboard_refuses(head, tmp_path):
    env = dict(head["env"], HOME=str(tmp_path))  # no ~/.ray/auth_token there
    env.pop("RAY_AUTH_TOKEN")
    env.pop("RAY_AUTH_MODE")
    proc = fleetllm("status", "fleetllm-test-42", "--address", head["address"], env=env)
    assert proc.returncode == 2
    assert "cannot reach the Ray Jobs API" in proc.stderr, proc.stderr
    assert "Authentication required" in proc.stderr, proc.stderr


def test_unknown_run_is_a_clear_error(head):
    proc = fleetllm("status", "no-such-run", "--address", head["address"], env=head["env"])
    assert proc.returncode == 2
    assert "no run 'no-such-run'" in proc.stderr


def test_stop_ends_a_submitted_run_as_ray_job_stop_does(head, tmp_path):
    sub = fleetllm("submit", "--entrypoint", "python -c 'import time; print(\"up\", flush=True); time.sleep(600)'",
                   "--working-dir", str(tmp_path), "--address", head["address"], "--submission-id", "fleetllm-long",
                   env=head["env"])
    assert sub.returncode == 0, sub.stdout + sub.stderr
    deadline = time.monotonic() + 120
    while "up" not in fleetllm("logs", "fleetllm-long", "--address", head["address"], env=head["env"]).stdout:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(1)
    stop = fleetllm("stop", "fleetllm-long", "--address", head["address"], env=head["env"])
    assert stop.returncode == 0 and stop.stdout.strip() == "fleetllm-long: STOPPED", stop.stdout + stop.stderr
    assert wait_done(head, "fleetllm-long")["status"] == "STOPPED"
    again = fleetllm("stop", "fleetllm-long", "--address", head["address"], env=head["env"])
    assert again.returncode == 0 and "already STOPPED" in again.stdout
    unknown = fleetllm("stop", "no-such-run", "--address", head["address"], env=head["env"])
    assert unknown.returncode == 2 and "no run 'no-such-run'" in unknown.stderr
