"""Local engines use the CPU threads the standard variable says (OMP_NUM_THREADS), engine_kwargs.num_threads
first, FLEETLLM_NUM_THREADS (the earlier name) last."""

from fleetllm.engines.threads import cpu_threads


def test_the_order_of_the_thread_settings(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("FLEETLLM_NUM_THREADS", raising=False)
    assert cpu_threads() is None
    monkeypatch.setenv("FLEETLLM_NUM_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads() == 2 and cpu_threads(5) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # a nested list: left to OpenMP, the next setting applies
    assert cpu_threads() == 3


def test_the_transformers_engine_runs_on_omp_num_threads(monkeypatch, tiny_model):
    import torch

    from fleetllm.engines.base import create_engine

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        torch.set_num_threads(2)
        engine = create_engine("transformers", tiny_model, engine_kwargs={"device": "cpu"})
        engine.start()
        assert engine.compute.run(torch.get_num_threads) == 1  # the thread that runs the model (OpenMP's setting is
        engine.stop()  # the calling thread's: every torch call of the engine runs on that one thread)
    finally:
        torch.set_num_threads(before)


def test_the_compute_thread_runs_every_call_on_one_thread_whoever_asks():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    from fleetllm.engines.threads import ComputeThread

    compute = ComputeThread("test-compute")
    try:
        here = threading.get_ident()
        idents = {compute.run(threading.get_ident) for _ in range(3)}
        with ThreadPoolExecutor(4) as callers:  # calls from other threads, at once
            idents |= set(callers.map(lambda _: compute.run(threading.get_ident), range(8)))
        assert len(idents) == 1 and here not in idents
        # a call made from the compute thread itself runs there directly (no deadlock on the one worker)
        assert compute.run(lambda: compute.run(threading.get_ident)) in idents
        with pytest.raises(ZeroDivisionError):  # the error reaches the caller
            compute.run(lambda: 1 / 0)
        assert compute.run(lambda x, y=0: x + y, 2, y=3) == 5
    finally:
        compute.close()
