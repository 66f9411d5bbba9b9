"""`http: replica` (serve.yaml): the one model replica answers HTTP on the app's host:port itself, as `vllm serve`'s
API process does, with no Serve HTTP proxy between the client and the replica.

How: the replica runs a uvicorn server of its own over the same OpenAI app (api.py), on the loop Ray Serve runs
its code on, where vLLM's output handler also runs (VLLMEngine._serving_loop): HTTP, the SSE writer and vLLM's
outputs share one loop on one thread, and a token reaches the socket without crossing a thread or a process.
Serve's proxy still starts, on a free port of its own, and carries no traffic. The listening socket takes
SO_REUSEADDR, as uvicorn's own does: a replica started again after its engine died (connections the old one held
wait in TIME_WAIT for a minute) binds the port at once. (Ray Serve's direct ingress does the same in Ray's code, but
binds without it: a restart then waits out TIME_WAIT, and Ray blocks the port for good when the bind fails.)

Why (issue 36, lease 14 on one H100 at concurrency 32, benchmarks/NOTES-serve.md): the proxy hop held half of the
ITL p99 tail (42.6 ms through it, 23.5 ms with the replica answering; `vllm serve` 11.2), throughput 0.985x ->
0.998x of `vllm serve`, TTFT p99 unchanged.

Where: the direct path (one model, default routing), one fixed replica, and a Ray this command starts (its replica
runs on this machine, where host:port is). Elsewhere Serve's proxy: several replicas need a balancer in front, and
on a cluster joined or on Kubernetes the replica may run on any node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, Literal

log = logging.getLogger("fleetllm.serve")

HttpMode = Literal["auto", "replica", "proxy"]
BIND_WAIT_S = 30.0  # a replica started again waits this long for the one before it to let the port go


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
                        "here), where the replica may run on another node")
    if mode == "replica" and blockers:
        raise ValueError("http: replica cannot serve this app: " + "; ".join(blockers) + "; use http: auto or proxy")
    if mode != "auto":
        return mode, f"as `http: {mode}` asks"
    if blockers:
        return "proxy", "auto: " + "; ".join(blockers)
    return "replica", "auto: one model on one replica, on a Ray started here"


def free_port(host: str) -> int:
    """A port nothing listens on at `host` now (Serve's proxy, which carries no traffic under http: replica)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def bind(host: str, port: int, wait_s: float = BIND_WAIT_S) -> socket.socket:
    """A listening socket on host:port (SO_REUSEADDR), waiting up to wait_s for a replica before this one to let it
    go; OSError naming the address past that."""
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(2048)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise OSError(exc.errno, f"the replica cannot listen on {host}:{port} ({exc.strerror}); stop what "
                              "uses it, or serve with http: proxy") from None
            time.sleep(0.5)


class Listener:
    """`app` served on host:port by uvicorn on the running loop (the replica's serving loop); `stop()` ends it."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        sock = bind(host, port)
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                timeout_keep_alive=30, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))
        log.info("fleetllm serve: this replica answers HTTP on %s:%d itself", host, port)

    def stop(self) -> None:
        self.server.should_exit = True
