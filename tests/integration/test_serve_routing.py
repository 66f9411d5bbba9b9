"""Prefix-affine routing on a real Ray Serve app with two replicas of a tiny model: every turn of a
conversation (its prompt extends the previous turn's) is answered by the replica that answered its first
turn, read from the `x-fleetllm-replica` header, and new conversations spread over both replicas."""

from __future__ import annotations

import json

import httpx
import pytest

from fleetllm.serve.routing import prompt_text
from fleetllm.serve.spec import ServeSpec
from fleetllm.testing.serve_process import free_port


def test_prompt_text_reads_messages_prompts_and_nothing_else():
    assert prompt_text({"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": [
        {"type": "text", "text": "b"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}) == "ab"
    assert prompt_text({"prompt": "hello"}) == "hello"
    assert prompt_text({"prompt": [1, 2, 3]}) is None  # token ids: routed by load
    assert prompt_text({"items": [{"text": "x"}]}) is None and prompt_text("x") is None


@pytest.fixture(scope="module")
def two_replicas(ray_local, tiny_model):
    from fleetllm.serve.run import run_serve, stop_serve

    spec = ServeSpec.model_validate({"name": "test-routing", "port": free_port(), "models": [{
        "model_id": "tiny", "source": tiny_model, "engine": "transformers", "replicas": 2,
        "routing": "prefix_affinity", "max_ongoing_requests": 4, "max_queued_requests": 4,
        "cpus_per_replica": 0.5}]})
    url = run_serve(spec)
    yield url
    stop_serve(shutdown_ray=False)


def test_turns_of_a_conversation_stay_on_one_replica(two_replicas):
    answered: dict[int, list[str]] = {}
    with httpx.Client(base_url=two_replicas, timeout=120) as client:
        history = {c: [{"role": "system", "content": f"Conversation {c}: " + f"topic-{c} " * 60}] for c in range(4)}
        for turn in range(3):
            for c, messages in history.items():
                messages.append({"role": "user", "content": f"question {turn} of conversation {c}"})
                stream = turn == 1  # the streaming path names the replica too
                resp = client.post("/chat/completions", json={"model": "tiny", "messages": messages,
                                                              "max_tokens": 4, "stream": stream})
                assert resp.status_code == 200, resp.text
                answered.setdefault(c, []).append(resp.headers["x-fleetllm-replica"])
                if stream:
                    chunks = [json.loads(x[6:]) for x in resp.text.splitlines() if x.startswith("data: {")]
                    reply = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
                else:
                    reply = resp.json()["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": reply})
    for c, replicas in answered.items():
        assert len(set(replicas)) == 1, f"conversation {c} moved between replicas: {replicas}"
    assert len({r[0] for r in answered.values()}) == 2, answered  # new conversations go to the emptier replica
