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
        assert torch.get_num_threads() == 1
        engine.stop()
    finally:
        torch.set_num_threads(before)
