"""Wait until a Ray cluster has the GPUs / CPUs a job needs: `fleetllm cluster wait`.

The loop, the snapshot and the autoscaler request live in fleetllm/ray_resources.py (batch uses them
for a job's `compute.wait_for` without importing cluster/); this module connects a driver to the
cluster (`connect`, with the cluster token) and runs the loop on it (`wait_for_resources`).
"""

from __future__ import annotations

from typing import Callable

from fleetllm.errors import PlanError
from fleetllm.ray_resources import Snapshot, ray_snapshot, wait_until, wanted


def connect(address: str | None, token: str | None = None) -> bool:
    """Connect this process to the Ray cluster at `address` (default $RAY_ADDRESS) as a driver, with the
    cluster token when one is found. Returns True when this call connected (the caller disconnects)."""
    import os

    import ray

    from fleetllm.cluster.auth import apply_to_process, find_token

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise PlanError(
            "which cluster? give --address HOST:PORT (the head's GCS address) or set $RAY_ADDRESS"
        )
    found = find_token(token)
    if found is not None:
        apply_to_process(found)
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    return True


def wait_for_resources(
    gpus: float | None = None,
    cpus: float | None = None,
    timeout_s: float = 600.0,
    *,
    address: str | None = None,
    poll_s: float = 2.0,
    log: Callable[[str], None] = print,
) -> Snapshot:
    """Block until the Ray cluster has at least `gpus` GPUs and `cpus` CPUs in total.

    Uses the Ray connection of this process when there is one, else connects to `address`
    (or $RAY_ADDRESS) and disconnects afterwards. Raises ResourceTimeout after `timeout_s`.

    Example::

        wait_for_resources(gpus=8, timeout_s=900)   # before starting 4 replicas of a TP=2 model
    """
    import ray

    need = wanted(gpus, cpus)
    connected_here = connect(address)
    try:
        return wait_until(ray_snapshot, need, timeout_s=timeout_s, poll_s=poll_s, log=log)
    finally:
        if connected_here:
            ray.shutdown()
