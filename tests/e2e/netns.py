"""Two network namespaces joined by a veth pair, and Ray nodes started in them with `fleetllm cluster`.

Reusable by any e2e test that needs a second machine:

    from netns import two_node_cluster, netns_pair_fixture  # noqa: F401  (the fixture must be imported)

    def test_x(netns_pair, tmp_path):
        with two_node_cluster(netns_pair) as cluster:
            out = cluster.run_driver("import ray; ray.init(); print(len(ray.nodes()))")

- `netns_pair` (module fixture): namespaces `<prefix>h` (198.18.0.1/24) and `<prefix>w` (198.18.0.2/24);
  skips with the reason when not root or `ip netns` is unavailable. Teardown kills every process in both
  namespaces and deletes them, also after failures.
- `two_node_cluster(pair, head_delay_s=0)`: a head in the first namespace and a worker in the second,
  both via `fleetllm cluster start`, each with its own --temp-dir (never the shared /tmp/ray) and a
  test token (`RAY_AUTH_TOKEN`, token mode on; ~/.ray is not touched). `cluster.kill_worker()` kills
  the worker node mid-job.

Only addresses inside these namespaces (and loopback) are ever used.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAD_IP = "198.18.0.1"
WORKER_IP = "198.18.0.2"
GCS_PORT = 6379  # inside our own namespaces, so no clash with anything else on the machine


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")


@dataclass
class NetnsPair:
    """Two namespaces, `head` and `worker`, joined by a veth pair."""

    head: str
    worker: str
    head_ip: str = HEAD_IP
    worker_ip: str = WORKER_IP

    def argv(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def pids(self, ns: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, ns: str, grace_s: float = 5.0) -> None:
        """SIGTERM every process in the namespace, then SIGKILL what is left."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            pids = self.pids(ns)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.pids(ns) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.pids(ns):
                return


@contextlib.contextmanager
def netns_pair(prefix: str | None = None) -> Iterator[NetnsPair]:
    """Create the namespace pair; on exit kill everything in it and delete it."""
    prefix = prefix or f"fl{os.getpid() % 100000}"
    pair = NetnsPair(head=f"{prefix}h", worker=f"{prefix}w")
    veth_h, veth_w = f"{prefix}vh", f"{prefix}vw"
    try:
        _ip("netns", "add", pair.head)
        _ip("netns", "add", pair.worker)
        _ip("link", "add", veth_h, "type", "veth", "peer", "name", veth_w)
        _ip("link", "set", veth_h, "netns", pair.head)
        _ip("link", "set", veth_w, "netns", pair.worker)
        for ns, dev, ip in ((pair.head, veth_h, pair.head_ip), (pair.worker, veth_w, pair.worker_ip)):
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.head, pair.worker):
            pair.kill_all(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        # The veth pair goes with its namespaces; remove it in case setup failed half-way.
        subprocess.run(["ip", "link", "del", veth_h], capture_output=True, check=False)


@pytest.fixture(scope="module", name="netns_pair")
def netns_pair_fixture() -> Iterator[NetnsPair]:
    """Module fixture `netns_pair` (import `netns_pair_fixture` into the test module to use it)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"multi-host test skipped: {reason}")
    with netns_pair() as pair:
        yield pair


def fleetllm_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetllm", *args]


@dataclass
class TwoNodeCluster:
    """A head and a worker node in a NetnsPair."""

    pair: NetnsPair
    env: dict[str, str]
    head_temp: str
    worker_temp: str
    address: str
    head_output: str = ""
    worker_output: str = ""
    worker_returncode: int | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, ns: str, argv: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command inside a namespace with the cluster's environment (token included)."""
        return subprocess.run(
            self.pair.argv(ns, argv), env=env or self.env, capture_output=True, text=True, timeout=timeout,
            cwd=REPO, check=False,
        )

    def run_driver(self, code: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run Python `code` as a Ray driver in the head's namespace (RAY_ADDRESS points at the head)."""
        return self.run(self.pair.head, [sys.executable, "-c", code], timeout=timeout)

    def kill_worker(self) -> None:
        """Kill every process of the worker node (a machine dying mid-job)."""
        self.pair.kill_all(self.pair.worker, grace_s=0.5)


def base_env(token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_DEDUP_LOGS="0",
    )
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def two_node_cluster(
    pair: NetnsPair,
    *,
    head_cpus: int = 1,
    worker_cpus: int = 1,
    head_delay_s: float = 0.0,
    retries: int = 12,
    retry_interval_s: float = 5.0,
    object_store_memory: int = 100 * 1024 * 1024,
    head_args: tuple[str, ...] = ("--no-dashboard",),
    worker_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> Iterator[TwoNodeCluster]:
    """Start the worker's join (`fleetllm cluster start --address`), then after `head_delay_s` the head
    (`fleetllm cluster start --head`, plus `head_args`; the worker gets `worker_args`); yields once the worker has joined. Stops both
    on exit. `extra_env` reaches both nodes' Ray processes (and so their workers) and the drivers."""
    token = secrets.token_hex(16)
    env = base_env(token)
    env.update(extra_env or {})
    head_temp = tempfile.mkdtemp(prefix="flrh", dir="/tmp")  # short: Ray's socket paths have a length limit
    worker_temp = tempfile.mkdtemp(prefix="flrw", dir="/tmp")
    address = f"{pair.head_ip}:{GCS_PORT}"
    env["RAY_ADDRESS"] = address
    cluster = TwoNodeCluster(pair, env, head_temp, worker_temp, address)
    memory = str(object_store_memory)
    try:
        join = subprocess.Popen(
            pair.argv(pair.worker, fleetllm_argv(
                "cluster", "start", "--address", address, "--node-ip-address", pair.worker_ip,
                "--num-cpus", str(worker_cpus), "--num-gpus", "0", "--object-store-memory", memory,
                "--temp-dir", worker_temp, "--retries", str(retries), "--retry-interval", str(retry_interval_s),
                *worker_args,
            )),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        )
        cluster._procs.append(join)
        time.sleep(head_delay_s)
        head = cluster.run(pair.head, fleetllm_argv(
            "cluster", "start", "--head", "--port", str(GCS_PORT), "--node-ip-address", pair.head_ip,
            "--num-cpus", str(head_cpus), "--num-gpus", "0", "--object-store-memory", memory,
            "--temp-dir", head_temp, *head_args,
        ), timeout=180)
        cluster.head_output = head.stdout + head.stderr
        if head.returncode != 0:
            raise RuntimeError(f"head failed to start:\n{cluster.head_output}")
        out, _ = join.communicate(timeout=retries * (retry_interval_s + 5) + 180)
        cluster.worker_output, cluster.worker_returncode = out, join.returncode
        if join.returncode != 0:
            raise RuntimeError(f"worker failed to join:\n{out}")
        yield cluster
    finally:
        for proc in cluster._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        pair.kill_all(pair.worker)
        pair.kill_all(pair.head)
        shutil.rmtree(head_temp, ignore_errors=True)
        shutil.rmtree(worker_temp, ignore_errors=True)
