"""How many CPU threads a local engine's torch uses: engine_kwargs.num_threads, else the standard
OMP_NUM_THREADS (what torch, MKL and OpenMP read, and what Ray sets in a worker to its CPUs), else
FLEETLLM_NUM_THREADS (fleetllm's earlier name, still read), else torch's own default."""

from __future__ import annotations

import os
from typing import Any


def cpu_threads(num_threads: Any = None) -> int | None:
    for value in (num_threads, os.environ.get("OMP_NUM_THREADS"), os.environ.get("FLEETLLM_NUM_THREADS")):
        try:
            threads = int(value) if value not in (None, "") else 0
        except (TypeError, ValueError):
            continue  # OMP_NUM_THREADS may hold a list ("4,2"): torch reads it itself then
        if threads > 0:
            return threads
    return None


def apply_cpu_threads(torch: Any, device: str, num_threads: Any = None) -> None:
    threads = cpu_threads(num_threads)
    if device == "cpu" and threads:
        torch.set_num_threads(threads)
