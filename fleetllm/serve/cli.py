"""`fleetllm serve serve.yaml [--dry-run] [--host H] [--port P] [--api-key K]`, or `fleetllm serve MODEL [--flags]`
as `vllm serve MODEL` (fleetllm.serve.model_args)."""

from __future__ import annotations

import argparse

from fleetllm import cli_values
from fleetllm.serve.model_args import add_model_flags


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models behind an OpenAI-compatible API on Ray Serve")
    p.add_argument("spec", metavar="SPEC_OR_MODEL",
                   help="serve YAML file (see examples/serve.yaml), or a model (alias, local folder, hub id)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--host", default=None, help="listen address (default: the spec's host)")
    p.add_argument("--port", type=cli_values.port, default=None, help="listen port (default: the spec's port)")
    add_model_flags(p)
    p.set_defaults(handler=_serve)


def _serve(args) -> int:
    import signal
    import threading

    from fleetllm.serve.run import http_choice, http_line, ingress_line, plan_lines, run_serve, stop_serve
    from fleetllm.serve.model_args import spec_data
    from fleetllm.serve.spec import ServeSpec
    from fleetllm.spec import parse_spec

    spec = parse_spec(ServeSpec, *spec_data(args))
    host, port = args.host or spec.host, args.port or spec.port
    if args.dry_run:
        print("\n".join(plan_lines(spec, host, port)))
        return 0
    stop = threading.Event()
    service = None
    try:
        http = http_choice(spec)  # before Ray starts (after, Ray is up here and `auto` would say proxy)
        url = run_serve(spec, host, port)
        service = start_batch_service(spec, url)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own handlers
            signal.signal(sig, lambda *_: stop.set())
        print(f"serving {', '.join(m.model_id for m in spec.models)} at {url}  (Ctrl-C to stop)\n"
              f"{ingress_line(spec)}\n{http_line(spec, http)}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("shutting down", flush=True)
        if service is not None:
            service.stop()  # a running batch stays in_progress: the next start resumes it
        stop_serve()
    return 0


def start_batch_service(spec, url: str):
    """The Batch API's runner (fleetllm.batch.api_service) against this server; None when batches are off."""
    if spec.batch_store_url() is None:
        return None
    from fleetllm.batch.api_service import BatchService
    from fleetllm.batches.store import BatchStore

    base = url.replace("://0.0.0.0:", "://127.0.0.1:")  # the service calls this server itself
    return BatchService(BatchStore(spec.batch_store_url()), base, spec.batch_models(),
                        api_key=spec.effective_api_key(), shard_rows=spec.batches.shard_rows).start()
