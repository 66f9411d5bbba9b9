"""The peer suite's root conftest (copied in as tests/conftest.py): the cases fleetllm does not claim, skipped
by name with the reason. vLLM's own root conftest is kept as tests/vllm_conftest.py, for the reference HF
runner the embedding tests compare against."""

from __future__ import annotations

import os
import tempfile

import pytest
import vllm.transformers_utils.repo_utils as repo_utils

import tests.vllm_conftest as vllm_conftest
from tests.vllm_conftest import HfRunner, hf_runner  # noqa: F401 - vLLM's fixtures, unchanged


class _NoHub:
    """Nothing is downloaded here: the LoRA fixtures get an empty folder (the shim ignores --lora-modules,
    and the cases that call an adapter are skipped below)."""

    def snapshot_download(self, repo_id: str, **_) -> str:
        return tempfile.mkdtemp(prefix="no-hub-")


repo_utils.hf_api = vllm_conftest.hf_api = lambda *a, **k: _NoHub()

NOT_CLAIMED: dict[str, str] = {}


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FLEETLLM_PEER_NO_SKIP"):  # the comparison runs: every case, as `vllm serve` gets them
        return
    for item in items:
        name = item.nodeid.split("::", 1)[-1]
        base = name.split("[", 1)[0]
        reason = NOT_CLAIMED.get(name) or NOT_CLAIMED.get(base)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"fleetllm does not claim this: {reason}"))
