"""Cluster helpers against the real Ray: wait_for_resources on the process's own Ray connection (how the
batch runner calls it), and the head token made by Ray's own `ray get-auth-token --generate`."""

from __future__ import annotations

import pytest

from fleetllm.cluster.wait import wait_for_resources
from fleetllm.ray_resources import ResourceTimeout


def test_wait_returns_when_the_cluster_has_enough(ray_local):
    lines: list[str] = []
    snapshot = wait_for_resources(cpus=2, timeout_s=30, log=lines.append)
    assert snapshot.resources["CPU"] >= 2 and snapshot.nodes == 1
    assert lines and lines[-1].startswith("cluster ready")
    assert ray_local.is_initialized()  # a connection it did not open stays open


def test_wait_times_out_naming_what_the_cluster_has(ray_local):
    cpus = ray_local.cluster_resources()["CPU"]
    with pytest.raises(ResourceTimeout) as err:
        wait_for_resources(gpus=1, cpus=1, timeout_s=1, poll_s=0.2, log=lambda _: None)
    assert f"0 GPU(s), {cpus:g} CPU(s) on 1 node(s)" in str(err.value)


def test_a_head_without_any_token_gets_one_from_ray(tmp_path, monkeypatch):
    from fleetllm.cluster.auth import ensure_head_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    token = ensure_head_token()
    saved = (tmp_path / ".ray" / "auth_token").read_text().strip()
    assert token.value == saved and len(saved) >= 32
    assert ensure_head_token().value == saved  # an existing token is kept
