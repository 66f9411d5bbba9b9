"""Waiting for a Ray cluster's resources: the runtime helper a batch job uses for compute.wait_for.

`wait_until` is the pure loop (clock, sleep and the resource reader injected); `ray_snapshot` reads
the connected Ray cluster (`ray.cluster_resources()`, alive nodes); `request_from_autoscaler` asks an
autoscaling cluster for the wanted resources; `autoscaler_limits` reads how far its autoscaler may grow
it. It sits below both batch/ (batch/execution/stream.py wait_for_cluster) and cluster/
(cluster/wait.py: connect + `fleetllm cluster wait`), so batch needs nothing of the deployment tooling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from fleetllm.errors import PlanError


class ResourceTimeout(PlanError):
    """The cluster did not reach the wanted resources in time."""


@dataclass(frozen=True)
class Snapshot:
    """What the cluster had at one poll."""

    resources: dict[str, float]
    nodes: int

    def describe(self) -> str:
        gpus = self.resources.get("GPU", 0)
        cpus = self.resources.get("CPU", 0)
        return f"{gpus:g} GPU(s), {cpus:g} CPU(s) on {self.nodes} node(s)"


def wanted(gpus: float | None, cpus: float | None) -> dict[str, float]:
    """The resource mapping to wait for; at least one of gpus/cpus must be given."""
    need = {name: float(value) for name, value in (("GPU", gpus), ("CPU", cpus)) if value is not None}
    if not need:
        raise PlanError("wait for what? give gpus and/or cpus (e.g. `fleetllm cluster wait --gpus 8`)")
    for name, value in need.items():
        if value <= 0:
            raise PlanError(f"wait for {value:g} {name}(s)? give a number above 0")
    return need


def satisfied(snapshot: Snapshot, need: dict[str, float]) -> bool:
    """True when every wanted resource is present in at least the wanted amount."""
    return all(snapshot.resources.get(name, 0.0) >= amount for name, amount in need.items())


def wait_until(
    read: Callable[[], Snapshot],
    need: dict[str, float],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
) -> Snapshot:
    """Poll `read()` until it satisfies `need` or `timeout_s` passes.

    Logs what the cluster has whenever it changes (and once at the start). Returns the satisfying
    snapshot; raises ResourceTimeout with the last snapshot on timeout.
    """
    want = ", ".join(f"{amount:g} {name}(s)" for name, amount in need.items())
    start = clock()
    last: Snapshot | None = None
    while True:
        snapshot = read()
        if satisfied(snapshot, need):
            log(f"cluster ready: {snapshot.describe()} (wanted {want})")
            return snapshot
        elapsed = clock() - start
        if last is None or snapshot != last:
            log(f"waiting for {want}: the cluster has {snapshot.describe()} ({elapsed:.0f} s elapsed)")
        last = snapshot
        if elapsed >= timeout_s:
            raise ResourceTimeout(
                f"waited {timeout_s:g} s for {want}, but the cluster has only {snapshot.describe()}; "
                "start more nodes (`fleetllm cluster start --address HEAD:PORT` on each), lower the "
                "request, or raise the timeout (compute.wait_timeout_s / --timeout)"
            )
        sleep(min(poll_s, timeout_s - elapsed))


def ray_snapshot() -> Snapshot:
    """The connected Ray cluster's total resources and alive node count."""
    import ray

    resources = {k: float(v) for k, v in ray.cluster_resources().items()}
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return Snapshot(resources=resources, nodes=nodes)


# More replicas than this are never planned from an autoscaler's limits (an unbounded node group reads as this many)
MOST_AUTOSCALED_REPLICAS = 4096


def autoscaler_limits() -> dict[str, float] | None:
    """The most CPUs and GPUs the connected cluster's autoscaler may grow it to: each node group's max count x its
    resources, as Ray's autoscaler reports its config to the GCS (what Ray Data and Ray Train read:
    `ray._private.state.state.get_max_resources_from_cluster_config`). None without a connected Ray, or where no
    autoscaler reported a config (a cluster of fixed size; Ray's open-source autoscaler v2 of Ray 2.60 does not
    report it: seen with its fake multi-node provider). An unbounded group (Ray: sys.maxsize) is capped at
    MOST_AUTOSCALED_REPLICAS x 1,024 of a resource."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        from ray._private.state import state

        limits = state.get_max_resources_from_cluster_config()
    except Exception:  # a private API: a Ray without it, or a GCS that cannot answer, reads as no limit known
        return None
    out = {k: float(min(v, MOST_AUTOSCALED_REPLICAS * 1024)) for k, v in (limits or {}).items()
           if k in ("CPU", "GPU") and v}
    return out if out.get("CPU") else None


def request_from_autoscaler(need: dict[str, float]) -> None:
    """Ask an autoscaling cluster for what the job waits for (ray.autoscaler.sdk.request_resources: a
    standing request, so the autoscaler starts nodes instead of waiting for tasks to queue); a cluster
    without an autoscaler keeps it unread. `need={}` withdraws it."""
    import math

    from ray.autoscaler.sdk import request_resources

    cpus = math.ceil(need.get("CPU", 0))
    request_resources(num_cpus=cpus, bundles=[{"GPU": 1.0}] * math.ceil(need.get("GPU", 0)))
    _standing[0] = bool(need)


_standing = [False]  # whether this process's last request_from_autoscaler left a standing request


def requested_here() -> bool:
    """Whether this process made a standing autoscaler request it has not withdrawn (the cluster keeps one request
    at a time: withdrawing one this process did not make would drop another's)."""
    return _standing[0]
