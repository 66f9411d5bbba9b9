"""The `fleetllm` command. Sub-commands live beside what they drive (`<area>/cli.py`), each module
exposing `add_commands(subparsers)`; heavy imports happen inside the command handlers."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys

from fleetllm.errors import FleetError

# Modules that contribute sub-commands; each defines add_commands(subparsers).
COMMAND_MODULES = (
    "fleetllm.batch.cli",      # run
    "fleetllm.models_cli",     # models list / pull
    "fleetllm.serve.cli",      # serve
    "fleetllm.batches.cli",    # batches list / status / cancel (the Batch API of a server)
    "fleetllm.query.cli",      # query
    "fleetllm.report.cli",     # report
    "fleetllm.cluster.cli",    # cluster, submit, status, logs, k8s
    "fleetllm.estimate.cli",   # calibrate
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetllm",
        description="Run LLMs over datasets and behind an OpenAI-compatible API, from a laptop to a Ray cluster.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).add_commands(sub)
    return parser


def configure_logging() -> None:
    """The CLI shows fleetllm's library log records (logging.getLogger("fleetllm...")) on stderr, at
    $FLEETLLM_LOG_LEVEL (default INFO); an application embedding fleetllm configures logging itself."""
    logger = logging.getLogger("fleetllm")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fleetllm: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(os.environ.get("FLEETLLM_LOG_LEVEL", "INFO").upper())
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except FleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; committed shards are kept, run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
