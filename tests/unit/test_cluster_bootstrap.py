"""Pure logic of the cluster commands: the join retry loop, the resource wait, command lines, tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetllm.cluster.auth import auth_env, auth_headers, find_token
from fleetllm.cluster.bootstrap import (
    ClusterError,
    HeadOptions,
    NodeOptions,
    head_command,
    join_with_retries,
    parse_address,
    worker_command,
)
from fleetllm.cluster.jobs import JobsError, default_entrypoint, plan_submission
from fleetllm.ray_resources import ResourceTimeout, Snapshot, wait_until, wanted
from fleetllm.errors import PlanError


class FakeClock:
    """A clock that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --------------------------------------------------------------------------------- join retries


def test_join_retries_until_the_head_answers():
    clock = FakeClock()
    up_at = 120.0  # the head comes up 20 s after the first attempt
    attempts: list[float] = []
    lines: list[str] = []

    def attempt() -> int:
        attempts.append(clock.now)
        return 0

    report = join_with_retries(
        attempt, lambda: clock.now >= up_at, retries=12, interval_s=5, sleep=clock.sleep, log=lines.append
    )
    assert report.attempts == 5  # t = 100, 105, 110, 115 unreachable; 120 joins
    assert attempts == [120.0]
    assert clock.sleeps == [5, 5, 5, 5]
    assert report.outcomes[-1] == "joined"
    assert "attempt 1/12" in lines[0] and "retrying in 5 s" in lines[0]


def test_join_retries_a_failing_ray_start_then_gives_up_with_what_happened():
    clock = FakeClock()
    codes = iter([1, 1, 1])
    with pytest.raises(ClusterError) as err:
        join_with_retries(
            lambda: next(codes), lambda: True, retries=3, interval_s=2, sleep=clock.sleep, log=lambda _: None
        )
    assert clock.sleeps == [2, 2]  # no sleep after the last attempt
    assert "after 3 attempts" in str(err.value) and "exited with code 1" in str(err.value)
    assert "--retries" in str(err.value)


def test_join_never_runs_ray_start_while_the_head_is_down():
    calls = []
    with pytest.raises(ClusterError, match="not reachable"):
        join_with_retries(
            lambda: calls.append(1) or 0, lambda: False, retries=2, interval_s=0, sleep=lambda s: None, log=lambda _: None
        )
    assert calls == []


def test_join_needs_at_least_one_attempt():
    with pytest.raises(ClusterError, match="--retries"):
        join_with_retries(lambda: 0, lambda: True, retries=0)


# ------------------------------------------------------------------------------------ commands


def test_head_and_worker_command_lines():
    head = head_command(
        HeadOptions(port=6380, num_cpus=2, num_gpus=0, dashboard_host="0.0.0.0", dashboard_port=8266, temp_dir="/x")
    )
    assert head[1:] == [
        "start", "--head", "--port", "6380", "--include-dashboard", "true", "--dashboard-host", "0.0.0.0",
        "--dashboard-port", "8266", "--num-cpus", "2", "--num-gpus", "0", "--temp-dir", "/x",
    ]
    assert "--dashboard-host" not in head_command(HeadOptions(include_dashboard=False, dashboard_host="0.0.0.0"))
    worker = worker_command("10.0.0.1", NodeOptions(node_ip_address="10.0.0.2", block=True))
    assert worker[1:] == ["start", "--address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.2", "--block"]


@pytest.mark.parametrize("bad", ["http://h:8265", "h:port", ":6379"])
def test_parse_address_refuses_what_is_not_host_port(bad):
    with pytest.raises(ClusterError, match="HOST:PORT"):
        parse_address(bad)


# --------------------------------------------------------------------------------------- tokens


def test_token_lookup_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    path_file = tmp_path / "tok"
    path_file.write_text("from-path")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(path_file)}
    assert find_token("from-flag", env).value == "from-flag"
    assert find_token(None, env).value == "from-env"
    assert find_token(None, {"RAY_AUTH_TOKEN_PATH": str(path_file)}).value == "from-path"
    home = find_token(None, {})
    assert home.value == "from-home" and home.source.endswith(".ray/auth_token")
    (tmp_path / ".ray" / "auth_token").unlink()
    assert find_token(None, {}) is None


def test_auth_env_keeps_token_mode_on():
    token = find_token("abc", {})
    assert auth_env(token) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "abc"}
    assert auth_headers(token) == {"Authorization": "Bearer abc"}
    assert auth_headers(None) == {}


# ---------------------------------------------------------------------------------------- wait


def test_wait_polls_until_enough_gpus_and_logs_changes():
    clock = FakeClock()
    seen = iter(
        [Snapshot({"CPU": 4.0}, 1), Snapshot({"CPU": 4.0}, 1), Snapshot({"CPU": 8.0, "GPU": 1.0}, 2)]
        + [Snapshot({"CPU": 12.0, "GPU": 2.0}, 3)]
    )
    lines: list[str] = []
    got = wait_until(lambda: next(seen), wanted(2, None), timeout_s=60, poll_s=2, clock=clock, sleep=clock.sleep, log=lines.append)
    assert got.resources["GPU"] == 2.0 and got.nodes == 3
    assert clock.sleeps == [2, 2, 2]
    # One line per change, then the ready line.
    assert len(lines) == 3
    assert "0 GPU(s), 4 CPU(s) on 1 node(s)" in lines[0]
    assert "1 GPU(s), 8 CPU(s) on 2 node(s)" in lines[1]
    assert lines[2].startswith("cluster ready")


def test_wait_times_out_with_what_it_saw():
    clock = FakeClock()
    with pytest.raises(ResourceTimeout) as err:
        wait_until(
            lambda: Snapshot({"CPU": 2.0, "GPU": 1.0}, 1), wanted(None, 4), timeout_s=10, poll_s=3,
            clock=clock, sleep=clock.sleep, log=lambda _: None,
        )
    assert clock.sleeps == [3, 3, 3, 1]  # never sleeps past the deadline
    message = str(err.value)
    assert "waited 10 s for 4 CPU(s)" in message and "1 GPU(s), 2 CPU(s) on 1 node(s)" in message


def test_wait_needs_something_to_wait_for():
    with pytest.raises(PlanError, match="gpus and/or cpus"):
        wanted(None, None)
    with pytest.raises(PlanError, match="above 0"):
        wanted(0, None)


# ---------------------------------------------------------------------------------------- submit


def test_submission_uploads_the_working_dir_and_runs_the_spec(tmp_path):
    (tmp_path / "jobs").mkdir()
    spec = tmp_path / "jobs" / "my job.yaml"
    spec.write_text("x: 1\n")
    sub = plan_submission(str(spec), tmp_path, job_name="My_Job")
    assert sub.entrypoint == default_entrypoint("jobs/my job.yaml") == "python -m fleetllm run 'jobs/my job.yaml'"
    assert sub.runtime_env["working_dir"] == str(tmp_path.resolve())
    assert ".git" in sub.runtime_env["excludes"]
    assert sub.submission_id.startswith("fleetllm-my-job-")
    assert plan_submission("x", tmp_path, entrypoint="echo hi", submission_id="r1").entrypoint == "echo hi"


def test_submission_refuses_a_spec_outside_the_working_dir(tmp_path):
    outside = tmp_path / "job.yaml"
    outside.write_text("x: 1\n")
    (tmp_path / "work").mkdir()
    with pytest.raises(JobsError, match="outside the working directory"):
        plan_submission(str(outside), tmp_path / "work")
    with pytest.raises(JobsError, match="does not exist"):
        plan_submission(str(Path(tmp_path / "work" / "nope.yaml")), tmp_path / "work")



def test_processes_using_finds_only_that_temp_dir(tmp_path):
    import subprocess
    import sys

    from fleetllm.cluster.bootstrap import processes_using, stop_temp_dir

    mine, other = tmp_path / "ray", tmp_path / "ray2"
    sleeper = "import time; time.sleep(60)"
    a = subprocess.Popen([sys.executable, "-c", sleeper, f"--temp-dir={mine}"])
    b = subprocess.Popen([sys.executable, "-c", sleeper, "--session-dir", f"{other}/session_1"])
    try:
        assert processes_using(mine) == [a.pid]
        assert processes_using(other) == [b.pid]
        assert stop_temp_dir(mine, grace_s=5) == [a.pid]
        a.wait(timeout=5)  # ended (psutil may already have reaped it)
        assert b.poll() is None
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait()
