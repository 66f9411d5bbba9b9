"""`fleetllm serve serve.yaml [--dry-run] [--host H] [--port P]`."""

from __future__ import annotations

import argparse

from fleetllm import cli_values


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve models behind an OpenAI-compatible API on Ray Serve")
    p.add_argument("spec", help="serve YAML file (see examples/serve.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--host", default=None, help="listen address (default: the spec's host)")
    p.add_argument("--port", type=cli_values.port, default=None, help="listen port (default: the spec's port)")
    p.set_defaults(handler=_serve)


def _serve(args) -> int:
    import signal
    import threading

    from fleetllm.serve.run import ingress_line, plan_lines, run_serve, stop_serve
    from fleetllm.serve.spec import load_serve_spec

    spec = load_serve_spec(args.spec)
    host, port = args.host or spec.host, args.port or spec.port
    if args.dry_run:
        print("\n".join(plan_lines(spec, host, port)))
        return 0
    stop = threading.Event()
    try:
        url = run_serve(spec, host, port)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own handlers
            signal.signal(sig, lambda *_: stop.set())
        print(f"serving {', '.join(m.model_id for m in spec.models)} at {url}  (Ctrl-C to stop)\n"
              f"{ingress_line(spec)}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("shutting down", flush=True)
        stop_serve()
    return 0
