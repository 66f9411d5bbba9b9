"""Starting and stopping the Ray Serve application of a ServeSpec (used by the CLI, tests, benchmarks)."""

from __future__ import annotations

import os
from typing import Any

from fleetllm.engines.capabilities import engine_label
from fleetllm.errors import PlanError
from fleetllm.serve.replica_http import bind, choose_http, free_port
from fleetllm.serve.spec import ServeSpec, choose_ingress


def ingress_line(spec: ServeSpec) -> str:
    """Which path the app takes, and why (the plan and the start-up line say it)."""
    path, why = choose_ingress(spec.ingress, spec.models)
    where = ("the model replicas answer the API themselves (no ingress deployment)" if path == "direct"
             else "an OpenAIIngress deployment routes to the model replicas (HTTP -> ingress -> replica)")
    return f"ingress: {path}: {where}; {why}"


def ray_started_here(spec: ServeSpec) -> bool:
    """Whether `fleetllm serve` starts Ray itself (no cluster to join, none up in this process)."""
    import ray

    return not (ray.is_initialized() or spec.cluster.address or os.environ.get("RAY_ADDRESS"))


def http_choice(spec: ServeSpec) -> tuple[str, str]:
    """("replica" | "proxy", why): who listens on host:port (fleetllm.serve.replica_http); PlanError for
    `http: replica` where it cannot apply."""
    path, _ = choose_ingress(spec.ingress, spec.models)
    try:
        return choose_http(spec.http, path, spec.models, ray_started_here(spec))
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def http_line(spec: ServeSpec, choice: tuple[str, str] | None = None) -> str:
    http, why = choice or http_choice(spec)
    where = ("the model replica listens on the app's address itself (no Serve proxy hop)" if http == "replica"
             else "Ray Serve's HTTP proxy listens on the app's address")
    return f"http: {http}: {where}; {why}"


def check_port_free(host: str, port: int) -> None:
    try:
        bind(host, port, wait_s=0).close()
    except OSError as exc:
        raise PlanError(f"cannot listen on {host}:{port} ({os.strerror(exc.errno)}); pick another port with --port "
                        "or stop what uses it") from None


def plan_lines(spec: ServeSpec, host: str, port: int) -> list[str]:
    """A readable plan of what `fleetllm serve` would start."""
    key = "required" if spec.effective_api_key() else "none"
    lines = [f"app {spec.name!r} at http://{host}:{port}/v1  (api key: {key})",
             f"ray cluster: {spec.cluster.address or os.environ.get('RAY_ADDRESS') or 'local (started here)'}"]
    for m in spec.models:
        cfg = m.to_llm_config()
        auto = m.autoscaling
        scale = (f"autoscaling {auto.min_replicas}..{auto.max_replicas} replicas "
                 f"(target {auto.target_ongoing_requests:g} ongoing)") if auto else f"{m.replicas} replica(s)"
        lines.append(f"  model {m.model_id!r}: source {m.source}, engine "
                     f"{engine_label(m.engine, cfg.resolved_engine())}, task {m.task}, {scale}, "
                     f"{m.max_ongoing_requests} ongoing + "
                     f"{m.max_queued_requests} queued per replica, {m.cpus_per_replica:g} CPU / "
                     f"{m.gpus_per_replica:g} GPU per replica"
                     + (", prefix-affine routing" if m.routing == "prefix_affinity" else ""))
        if m.engine_kwargs:
            lines.append(f"    engine_kwargs: {m.engine_kwargs}")
    lines.append(ingress_line(spec))
    lines.append(http_line(spec))
    if spec.batch_store_url():
        lines.append(f"batch API: /v1/files and /v1/batches, files and state in {spec.batch_store_url()}")
    lines.append(f"environment: {spec.environment.describe()}")
    return lines


def run_serve(spec: ServeSpec, host: str | None = None, port: int | None = None,
              ray_init_kwargs: dict[str, Any] | None = None) -> str:
    """Start Ray (unless running) and the app; returns the base URL once every replica is up."""
    import ray
    from ray import serve

    from fleetllm.serve.app import build_openai_app

    host = host or spec.host
    port = port or spec.port
    check_port_free(host, port)
    spec.environment.check_local()
    if ray_started_here(spec):
        spec.environment.check_refs_set()  # a local Ray: Secret references must be set here
    http, _ = http_choice(spec)
    if not ray.is_initialized():
        address = spec.cluster.address or os.environ.get("RAY_ADDRESS") or "local"
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **(ray_init_kwargs or {}))
    # http: replica: the replica listens on `port`; the proxy Serve starts anyway gets a free port of its own
    serve.start(http_options={"host": host, "port": free_port(host) if http == "replica" else port})
    listen = {"host": host, "port": port} if http == "replica" else None
    app = build_openai_app({"llm_configs": spec.llm_configs(), "api_key": spec.effective_api_key(),
                            "ingress": spec.ingress, "batch_store": spec.batch_store_url(), "listen": listen})
    serve.run(app, name=spec.name, route_prefix="/", blocking=False)
    return f"http://{host}:{port}/v1"


def stop_serve(shutdown_ray: bool = True) -> None:
    """Shut Serve down (and Ray, when this process started it)."""
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()
        if shutdown_ray:
            ray.shutdown()
