"""Start, join and stop Ray nodes by wrapping Ray's own `ray start` / `ray status` / `ray stop`.

The command lines are built by pure functions (`head_command`, `worker_command`); the join retry is a
pure loop (`join_with_retries`) with the probe, the attempt and the sleep injected, so both are tested
without Ray. Every command runs with token authentication on (see fleetllm.cluster.auth).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fleetllm.cluster.auth import Token, auth_env
from fleetllm.errors import FleetError

log = logging.getLogger("fleetllm.cluster")

DEFAULT_GCS_PORT = 6379
DEFAULT_RETRIES = 12
DEFAULT_RETRY_INTERVAL_S = 5.0


class ClusterError(FleetError):
    """A Ray node could not be started, joined, inspected or stopped."""


def ray_cli() -> str:
    """The `ray` executable of the Python running fleetllm (falls back to `ray` on PATH)."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


@dataclass(frozen=True)
class NodeOptions:
    """Options shared by head and worker nodes (each maps to a `ray start` flag; None = Ray's default)."""

    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_memory: int | None = None
    node_ip_address: str | None = None
    temp_dir: str | None = None
    block: bool = False
    extra_args: tuple[str, ...] = ()

    def args(self) -> list[str]:
        out: list[str] = []
        for flag, value in (
            ("--num-cpus", self.num_cpus),
            ("--num-gpus", self.num_gpus),
            ("--object-store-memory", self.object_store_memory),
            ("--node-ip-address", self.node_ip_address),
            ("--temp-dir", self.temp_dir),
        ):
            if value is not None:
                out += [flag, str(value)]
        if self.block:
            out.append("--block")
        out += list(self.extra_args)
        return out


@dataclass(frozen=True)
class HeadOptions(NodeOptions):
    """A head node: the GCS port and the dashboard (needed for `fleetllm submit`)."""

    port: int = DEFAULT_GCS_PORT
    include_dashboard: bool = True
    dashboard_host: str | None = None
    dashboard_port: int | None = None


def head_command(opts: HeadOptions) -> list[str]:
    """`ray start --head ...` for these options."""
    cmd = [ray_cli(), "start", "--head", "--port", str(opts.port)]
    cmd += ["--include-dashboard", "true" if opts.include_dashboard else "false"]
    if opts.include_dashboard and opts.dashboard_host:
        cmd += ["--dashboard-host", opts.dashboard_host]
    if opts.include_dashboard and opts.dashboard_port is not None:
        cmd += ["--dashboard-port", str(opts.dashboard_port)]
    return cmd + opts.args()


def parse_address(address: str) -> tuple[str, int]:
    """`HOST[:PORT]` -> (host, port); the port defaults to Ray's 6379."""
    address = address.strip()
    for prefix in ("ray://", "http://", "https://"):
        if address.startswith(prefix):
            raise ClusterError(
                f"--address {address!r} is a URL; give the head's GCS address as HOST:PORT "
                f"(e.g. 10.0.0.1:{DEFAULT_GCS_PORT})"
            )
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, DEFAULT_GCS_PORT
    if not host or not port.isdigit():
        raise ClusterError(f"--address {address!r} is not HOST:PORT (e.g. 10.0.0.1:{DEFAULT_GCS_PORT})")
    return host, int(port)


def worker_command(address: str, opts: NodeOptions) -> list[str]:
    """`ray start --address HOST:PORT ...` for these options."""
    host, port = parse_address(address)
    return [ray_cli(), "start", "--address", f"{host}:{port}"] + opts.args()


def tcp_reachable(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class JoinReport:
    """What the join loop did, attempt by attempt."""

    attempts: int = 0
    outcomes: list[str] = field(default_factory=list)


def join_with_retries(
    attempt: Callable[[], int],
    probe: Callable[[], bool],
    *,
    retries: int = DEFAULT_RETRIES,
    interval_s: float = DEFAULT_RETRY_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
    target: str = "the head",
) -> JoinReport:
    """Try to join up to `retries` times, `interval_s` apart.

    An attempt first probes the head (`probe()`, cheap); only when it answers is `attempt()` (the real
    `ray start`, returning its exit code) run. Returns the report of the successful attempt; raises
    ClusterError naming every outcome when all attempts fail.
    """
    if retries < 1:
        raise ClusterError(f"--retries is {retries}; use 1 or more")
    report = JoinReport()
    for number in range(1, retries + 1):
        report.attempts = number
        if not probe():
            outcome = f"{target} is not reachable yet"
        else:
            code = attempt()
            if code == 0:
                report.outcomes.append("joined")
                log(f"joined {target} on attempt {number}/{retries}")
                return report
            outcome = f"`ray start` exited with code {code}"
        report.outcomes.append(outcome)
        if number < retries:
            log(f"attempt {number}/{retries}: {outcome}; retrying in {interval_s:g} s")
            sleep(interval_s)
        else:
            log(f"attempt {number}/{retries}: {outcome}")
    raise ClusterError(
        f"could not join {target} after {retries} attempts {interval_s:g} s apart "
        f"({'; '.join(sorted(set(report.outcomes)))}); check that the head is running "
        "(`fleetllm cluster start --head`), that the address and port are right and open, and that this "
        "node has the head's token; raise --retries / --retry-interval for a slow head"
    )


def _ray_env(token: Token | None) -> dict[str, str]:
    env = dict(os.environ)
    if token is not None:
        env.update(auth_env(token))
    return env


AUTH_FAILURE_MARKERS = ("InvalidAuthToken", "AuthenticationError", "Authentication token is missing")


def run_ray(cmd: list[str], token: Token | None, timeout_s: float | None = None) -> int:
    """Run a `ray` command with the token in its environment, its output passed through.

    Raises ClusterError at once when Ray reports that the cluster refused the token (retrying cannot help).
    """
    sys.stdout.flush()
    try:
        proc = subprocess.Popen(
            cmd, env=_ray_env(token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
    except FileNotFoundError:
        raise ClusterError(f"{cmd[0]!r} not found; install Ray (`pip install 'ray[default]'`)") from None
    refused = threading.Event()

    def pump() -> None:  # pass the output through, watching for an auth refusal
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if any(marker in line for marker in AUTH_FAILURE_MARKERS):
                refused.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    while proc.poll() is None:
        if refused.is_set():
            proc.kill()
        elif deadline is not None and time.monotonic() > deadline:
            timed_out = True
            proc.kill()
        time.sleep(0.2)
    code = proc.wait()
    reader.join(timeout=5)
    if timed_out:
        log.warning("`%s ...` did not finish within %g s", " ".join(cmd[:3]), timeout_s)
    if refused.is_set():
        raise ClusterError(
            "the cluster refused this node's authentication token (InvalidAuthToken); use the head's token: "
            "copy ~/.ray/auth_token from the head (or `ray get-auth-token` there) and pass --token or "
            "set $RAY_AUTH_TOKEN"
        )
    return code


def start_head(opts: HeadOptions, token: Token) -> int:
    """Start a head node; returns `ray start`'s exit code."""
    return run_ray(head_command(opts), token)


def join_cluster(
    address: str,
    opts: NodeOptions,
    token: Token,
    *,
    retries: int = DEFAULT_RETRIES,
    interval_s: float = DEFAULT_RETRY_INTERVAL_S,
    attempt_timeout_s: float = 180.0,
) -> JoinReport:
    """Join the head at `address`, retrying while it is not up yet (as multi-node launch scripts do)."""
    host, port = parse_address(address)
    cmd = worker_command(address, opts)
    timeout = None if opts.block else attempt_timeout_s
    return join_with_retries(
        attempt=lambda: run_ray(cmd, token, timeout_s=timeout),
        probe=lambda: tcp_reachable(host, port),
        retries=retries,
        interval_s=interval_s,
        target=f"the head at {host}:{port}",
        log=lambda line: print(line, flush=True),
    )


def processes_using(temp_dir: str | Path) -> list[int]:
    """PIDs of the processes whose command line names `temp_dir` (the Ray processes of one node or
    cluster started with --temp-dir); this process and its ancestors (e.g. the shell that ran
    `fleetllm cluster stop --temp-dir ...`) are left out."""
    import re

    import psutil

    needle = re.compile(re.escape(str(Path(temp_dir).resolve())) + r"(?=$|[/\s'\",=])")
    me = psutil.Process()
    spared = {me.pid} | {p.pid for p in me.parents()}
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if proc.info["pid"] not in spared and needle.search(cmdline):
            pids.append(proc.info["pid"])
    return pids


def stop_temp_dir(temp_dir: str | Path, grace_s: float = 10.0) -> list[int]:
    """Stop only the Ray processes of `temp_dir`: SIGTERM, then SIGKILL after `grace_s`."""
    import psutil

    procs = []
    for pid in processes_using(temp_dir):
        try:
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            procs.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in procs]


def stop_node(temp_dir: str | None, force: bool = False) -> int:
    """Stop Ray on this machine: only the processes of `temp_dir` when given, else `ray stop`
    (which stops every Ray process of this machine)."""
    if temp_dir:
        pids = stop_temp_dir(temp_dir)
        print(f"stopped {len(pids)} Ray process(es) of {temp_dir}")
        return 0
    return run_ray([ray_cli(), "stop"] + (["--force"] if force else []), None)
