"""`http: replica` (serve.yaml): the one model replica answers HTTP on the app's host:port itself, as `vllm serve`'s
API process does, with no Serve HTTP proxy between the client and the replica.

How: Ray Serve's direct ingress (RAY_SERVE_ENABLE_DIRECT_INGRESS: an ingress replica runs an HTTP server of its own
on a port the controller hands out from a range) with that range narrowed to the app's port, and the replica's user
code on its main loop (RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0), where that HTTP server runs: HTTP, the SSE
writer and vLLM's output handler then share one loop on one thread (VLLMEngine._serving_loop). Serve's proxy still
starts (Serve puts a replica's HTTP server only where HTTP is on) on a free port of its own; nothing goes through it.
No load balancer deregisters the replica, so it stops without direct ingress's 30 s draining period.

Why (issue 36, lease 14 on one H100 at concurrency 32, benchmarks/NOTES-serve.md): the proxy hop held half of the
ITL p99 tail (42.6 ms through it, 23.5 ms with the replica answering; `vllm serve` 11.2), throughput 0.985x ->
0.998x of `vllm serve`, TTFT p99 unchanged.

Where: the direct path (one model, default routing), one fixed replica, and a Ray this command starts (Ray's
controller and replicas read these settings from the environment Ray starts with). Elsewhere Serve's proxy: several
replicas need a balancer in front (Ray's HAProxy mode), and a running cluster keeps the settings it started with.
"""

from __future__ import annotations

import socket
from typing import Any, Literal

HttpMode = Literal["auto", "replica", "proxy"]


def choose_http(mode: str, path: str, models: list[Any], ray_here: bool) -> tuple[str, str]:
    """("replica" | "proxy", why) for serve.yaml's `http`; ValueError naming what stops `http: replica`."""
    blockers = []
    if path != "direct":
        blockers.append("the app takes the separate ingress (several models or prefix_affinity routing)")
    several = [m.model_id for m in models if getattr(m, "autoscaling", None) or getattr(m, "replicas", 1) != 1]
    if several:
        blockers.append(f"model {', '.join(several)} runs several replicas or autoscales, which need a balancer in "
                        "front (Serve's proxy)")
    if not ray_here:
        blockers.append("the app joins a running Ray cluster (cluster.address, RAY_ADDRESS or Ray already up "
                        "here), whose Serve keeps the settings it started with")
    if mode == "replica" and blockers:
        raise ValueError("http: replica cannot serve this app: " + "; ".join(blockers) + "; use http: auto or proxy")
    if mode != "auto":
        return mode, f"as `http: {mode}` asks"
    if blockers:
        return "proxy", "auto: " + "; ".join(blockers)
    return "replica", "auto: one model on one replica, on a Ray started here"


def replica_env(port: int) -> dict[str, str]:
    """The environment Ray starts with so that the replica answers HTTP on `port` itself."""
    # the range is [MIN, MAX) to Serve's port allocator; a replica started again (after its engine died) takes
    # the same port at once: no quarantine, which keeps a port from a balancer's stale entry (none here)
    return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0", "RAY_SERVE_PORT_QUARANTINE_S": "0"}


def free_port(host: str) -> int:
    """A port nothing listens on at `host` now (Serve's proxy, which carries no traffic here)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
