"""`fleetllm run JOB.yaml`."""

from __future__ import annotations

import argparse
import sys

from fleetllm import cli_values


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a batch job over a dataset",
                       description="Run a batch job: stream the input through engine replicas into files.")
    p.add_argument("job", help="the job's YAML file")
    add_job_flags(p)
    p.set_defaults(handler=run_command)


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every command that runs a job spec (`run`, `query`)."""
    p.add_argument("--dry-run", action="store_true",
                   help="validate and print the plan and its estimate (tokens, time, GPU-hours, cost); load no model")
    p.add_argument("--json", action="store_true",
                   help="with --dry-run: print one JSON object (plan lines, replicas, `estimate`, deadline)")
    p.add_argument("--overwrite", action="store_true",
                   help="recompute everything, replacing what fleetllm wrote in the output folder")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show Ray's and the engine's log lines on the terminal (always kept in OUT/_fleetllm/logs/)")
    p.add_argument("--retry-errors", nargs="?", const="all", choices=("all", "retryable"), default=None,
                   help="recompute only the rows of the existing output whose `error` is set (`retryable`: only "
                   "429/5xx/timeouts whose retries ran out, answers past max_response_mb, failed engine calls); "
                   "each rewritten shard replaces the old one atomically, every row still appears once")
    p.add_argument("--max-error-rate", type=cli_values.share, default=0.0,
                   help="the run fails (exit 1) when more than this share of rows failed (default 0)")


def run_command(args) -> int:
    from fleetllm.spec import load_job_spec

    return execute_job(load_job_spec(args.job), args)


def execute_job(spec, args) -> int:
    """Run (or dry-run) a JobSpec through fleetllm.batch.runner.run_job and print the outcome."""
    from rich.console import Console

    from fleetllm.batch.runner import run_job
    from fleetllm.engines.capabilities import declared

    console = Console(stderr=True)
    if declared(spec.model.engine).is_endpoint:
        from fleetllm.query.window import window_warnings

        for line in window_warnings(spec):
            console.print(f"[yellow]warning:[/yellow] {line}")
    if getattr(args, "json", False) and not args.dry_run:
        print("error: --json prints the dry run's plan and estimate; add --dry-run (a run writes run.json)",
              file=sys.stderr)
        return 2
    if args.dry_run:
        result = run_job(spec, overwrite=args.overwrite, dry_run=True, console=console,
                         as_json=getattr(args, "json", False))
        if getattr(args, "json", False):
            import json

            print(json.dumps(result))
        return 0
    from fleetllm.batch.reports.run_logs import captured_output

    log_path: list[str] = []
    try:
        with captured_output(spec.output.path, verbose=getattr(args, "verbose", False)) as (_, err, log_path):
            console = Console(file=err)
            report = run_job(spec, overwrite=args.overwrite, max_error_rate=args.max_error_rate, console=console,
                             retry_errors=getattr(args, "retry_errors", None))
    finally:  # one unwrapped line: a long path must stay whole for copy-paste (and for grep)
        if log_path and log_path[0]:
            print(f"logs: {log_path[0]}", file=sys.stderr, flush=True)
    print(f"Wrote {report['rows']} rows to {spec.output.path}"
          f" ({report['rows_computed']} computed, {report['rows_skipped']} resumed, {report['errors']} errors;"
          f" {report['output_tokens_per_s']} output tokens/s)")
    if not report["ok"]:
        print(f"error: {report['errors']} of {report['rows']} rows failed ({report['error_rate']:.1%}), "
              f"above --max-error-rate {args.max_error_rate}; see the `error` column")
        return 1
    return 0
