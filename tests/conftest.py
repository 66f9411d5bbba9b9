"""Shared fixtures. Tests are marked by folder: tests/unit, tests/integration, tests/e2e."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))


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


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray cluster for the whole session (address='local' never joins a stray cluster)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()
