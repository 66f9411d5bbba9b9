"""How many CPU threads a local engine's torch uses: engine_kwargs.num_threads, else the standard
OMP_NUM_THREADS (what torch, MKL and OpenMP read, and what Ray sets in a worker to its CPUs), else
FLEETLLM_NUM_THREADS (fleetllm's earlier name, still read), else torch's own default."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
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


class ComputeThread:
    """The one thread that runs all of an engine's torch work (its model's load, every batch, every streamed
    batch, every embedding forward), whichever thread asks. torch's CPU kernels run on an OpenMP team of
    the thread that calls them, and a second calling thread brings a second team: measured on this 2-core
    CPU (SmolLM2-135M, 4 sequences, 48 steps), a step took 76-89 ms while one thread ran the model, and
    99-118 ms on either thread once two had (the batch run's shard threads take turns; the calibration probe
    calls from its main thread, so the run's steps were ~25% slower than the probe's, and its estimate
    short by as much)."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident: int | None = None

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) on the compute thread (directly when called from it); its result or error."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._pool.submit(self._call, fn, args, kwargs).result()

    def _call(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        self._ident = threading.get_ident()
        return fn(*args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def load_on_compute_thread(load: Any) -> ComputeThread:
    """A new compute thread with `load()` (the engine's model load) run on it; closed again if the load fails."""
    compute = ComputeThread("fleetllm-torch")
    try:
        compute.run(load)
    except BaseException:
        compute.close()
        raise
    return compute
