"""`fleetllm calibrate JOB.yaml`: measure the throughput profile of the job's engine on this machine
(fleetllm.batch.reports.estimate_probe), then print the job's estimate from it."""

from __future__ import annotations

import argparse
import json


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure a throughput profile for a job's model, engine and accelerator",
                       description="Run a short probe of the job (its first rows, in engine calls of growing size, "
                       "one replica in this process; nothing is written to its output folder) and store the "
                       "throughput profile under $FLEETLLM_HOME/profiles for `fleetllm run --dry-run` estimates, "
                       "ETAs and compute.deadline.")
    p.add_argument("job", help="the job's YAML file")
    p.add_argument("--rows", type=int, default=None, help="rows to probe (default 48)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=calibrate_command)


def calibrate_command(args) -> int:
    from fleetllm.batch.reports.estimate_probe import calibrate
    from fleetllm.estimate.describe import describe
    from fleetllm.estimate.estimate import PROBE_ROWS
    from fleetllm.spec import load_job_spec

    if args.rows is not None and args.rows < 2:
        raise SystemExit(f"error: --rows {args.rows}: the probe needs at least 2 rows (a warm-up and a call)")
    result = calibrate(load_job_spec(args.job), args.rows or PROBE_ROWS)
    if args.json:
        print(json.dumps(result))
        return 0
    fit = result["fit"]
    print(f"profile    {result['profile']} ({len(result['calls'])} calls probed; engine start {result['startup_s']}s)")
    pre = result["prefill_tokens_per_s"]
    print(f"prefill    {pre:,.0f} tokens/s" if pre else "prefill    too fast to measure at these prompt lengths")
    print("decode     " + ", ".join(f"batch {b}: {r:,} tok/s" for b, r in result["decode_tokens_per_s"].items())
          + " (context 512)")
    print(f"fit        relative error {fit['rel_error']:.1%} over {fit['calls_fitted']} calls")
    for line in describe(result["estimate"]):
        print(line)
    return 0
