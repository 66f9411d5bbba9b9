"""`fleetllm report OUT`: write OUT/_fleetllm/report.html from a run's output folder."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write OUT/_fleetllm/report.html: charts of a finished run",
                       description="Write OUT/_fleetllm/report.html, one self-contained page: throughput over "
                       "time, time split, token length histograms, errors by kind, replica and node shares.")
    p.add_argument("out", help="the run's output folder (output.path), local or an fsspec URL")
    p.set_defaults(handler=_report)


def _report(args) -> int:
    from fleetllm.report.html import write_report

    print(f"Wrote {write_report(args.out)}")
    return 0
