"""Hostile requests against the OpenAI API in-process (FastAPI over the real transformers engine on a
tiny random model): each gets its exact 400 in OpenAI's error shape, and after each /health answers
200 and the next normal request succeeds. A request can only fail itself."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fleetllm.engines.transformers_engine import TransformersEngine
from fleetllm.serve.api import make_api
from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.serve.spec import LLMConfig

MSG = [{"role": "user", "content": "Say hi"}]
CONTEXT = 256


@pytest.fixture(scope="module")
def served(tiny_model):
    engine = TransformersEngine(tiny_model, engine_kwargs={"max_model_len": CONTEXT})
    engine.start()
    cfg = LLMConfig(model_loading_config=dict(model_id="tiny", model_source=tiny_model), engine="transformers")
    server = ModelServer(cfg, engine=engine)
    yield make_api({"tiny": LocalBackend(server)}), engine
    engine.stop()


def call(app, *requests):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await asyncio.gather(*[client.request(m, p, **kw) for m, p, kw in requests])
    return asyncio.run(go())


def chat(messages=None, **body):
    return ("POST", "/v1/chat/completions", {"json": {"model": "tiny", "messages": messages or MSG, **body}})


def raw(body: str, path: str = "/v1/chat/completions"):
    """A request whose body is sent as written (escapes json.dumps would not produce)."""
    return ("POST", path, {"content": body.encode(), "headers": {"content-type": "application/json"}})


def part(**p):
    return [{"role": "user", "content": [{"type": "text", "text": "Look:"}, p]}]


SEED = 18446744073709551616
# (request, status, param, message): the exact error body
CASES = [
    (chat(seed=SEED), 400, "seed", f"seed: Input should be less than or equal to {(1 << 63) - 1} (got {SEED}) "
     "[type=less_than_equal]"),  # the bound it breaks and pydantic's error type, as vLLM's message says
    (chat(seed=1.5), 400, "seed", None),
    (chat(part(type="text", text=5)), 400, "messages[0].content",
     "messages[0].content[1].text must be a string, got 5"),
    (chat(part(type="image_url", image_url={"url": "https://example.com/cat.png"})), 400, "messages[0].content",
     "messages[0].content[1] is a content part of type 'image_url'; this model reads text only (content parts "
     "of type 'text'): remove the part or use a multimodal endpoint"),
    (chat(part(type="input_audio", input_audio={"data": "AAAA", "format": "wav"})), 400, "messages[0].content",
     "messages[0].content[1] is a content part of type 'input_audio'; this model reads text only (content "
     "parts of type 'text'): remove the part or use a multimodal endpoint"),
    (chat(max_tokens=10**9), 400, "max_tokens", None),  # message checked below: names the context
    (chat(top_k=10**9), 400, "top_k", None),
    (chat(logit_bias={"99999999": 5}), 400, "logit_bias", None),
    (chat(logit_bias={"1": 500}), 400, "logit_bias", "`logit_bias` must be in [-100.0, 100.0], got 500"),
    (chat(logit_bias={"x": 1}), 400, "logit_bias", "`logit_bias` keys must be token ids, got 'x'"),
    (chat(n=1000), 400, "n", "n: Input should be less than or equal to 16 (got 1000) [type=less_than_equal]"),
    (chat(presence_penalty=3), 400, "presence_penalty", "`presence_penalty` must be in [-2.0, 2.0], got 3"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools",
     "`tools` is not supported by the transformers engine (tool calls are not parsed by fleetllm); "
     "no fleetllm engine honours it"),
    (chat(stop_token_ids=[1]), 400, "stop_token_ids",
     "`stop_token_ids` is not supported by the transformers engine; engines that honour it: vllm, openai"),
    (chat(min_tokens=9, max_tokens=3), 400, "min_tokens", "`min_tokens` (9) is larger than `max_tokens` (3)"),
    (chat(n=2, temperature=0), 400, "n", "`n` is 2 but temperature is 0.0: greedy decoding gives one "
     "answer, not 2; set temperature above 0 (e.g. 1.0) or n: 1"),
    (chat(stream_options={"include_usage": True}), 400, "stream_options", "stream_options: `stream_options` is only "
     "allowed when `stream` is true; set stream: true or remove it (got {'include_usage': True})"),
    (chat(frobnicate=True), 400, "frobnicate", None),
    (chat(temperature=9), 400, "temperature", "temperature: Input should be less than or equal to 2 (got 9) "
     "[type=less_than_equal]"),
    (chat([{"role": "user", "content": "x" * 5_000_000}]), 400, None, None),
    (("POST", "/v1/completions", {"json": {"model": "tiny", "prompt": "hi", "logit_bias": {"-1": 1}}}), 400,
     "logit_bias", "`logit_bias` token id -1 is negative"),
    # JSON lets a lone UTF-16 surrogate be escaped; no tokenizer takes the str Python decodes it to
    (raw('{"model": "tiny", "messages": [{"role": "user", "content": "Say \\udc00 hi"}]}'), 400, "messages",
     "messages[0].content holds a lone UTF-16 surrogate U+DC00 at character 4: it is not valid Unicode text; fix "
     "the escape (a surrogate pair such as \\ud83d\\ude00 is one valid character) or remove it"),
    (raw('{"model": "tiny", "prompt": "\\uD800", "max_tokens": 2}', "/v1/completions"), 400, "prompt", None),
    (raw('{"model": "tiny", "input": ["ok", "\\ud800"]}', "/v1/embeddings"), 400, "input", None),
]


def test_each_hostile_request_fails_alone(served):
    app, engine = served
    vocab = engine.vocab_size
    for request, status, param, message in CASES:
        (resp,) = call(app, request)
        assert resp.status_code == status, (request, resp.text)
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
        assert err["param"] == param, (request, err)
        if message is not None:
            assert err["message"] == message, (request, err)
        health, normal = call(app, ("GET", "/health", {}), chat(max_tokens=4))
        assert health.status_code == 200 and health.json()["status"] == "ok", (request, health.text)
        assert normal.status_code == 200 and normal.json()["choices"][0]["finish_reason"] in ("stop", "length")
    (big,) = call(app, chat(max_tokens=10**9))
    prompt_tokens = call(app, chat(max_tokens=1))[0].json()["usage"]["prompt_tokens"]
    assert big.json()["error"]["message"] == (
        f"the model's context is {CONTEXT} tokens; the request asks for {prompt_tokens + 10**9} ({prompt_tokens} "
        f"in the prompt, {10**9} in max_tokens): lower max_tokens to {CONTEXT - prompt_tokens} or less")
    (topk,) = call(app, chat(top_k=10**9))
    assert topk.json()["error"]["message"] == f"`top_k` {10**9} is larger than the model's vocabulary ({vocab})"
    (bias,) = call(app, chat(logit_bias={"99999999": 5}))
    assert bias.json()["error"]["message"] == (
        f"`logit_bias` token id 99999999 is outside the model's vocabulary of {vocab} tokens (ids 0 to "
        f"{vocab - 1})")
    (unknown,) = call(app, chat(frobnicate=True))
    assert unknown.json()["error"]["message"].startswith(
        "`frobnicate` is not a request field fleetllm knows; remove it or check its spelling (known: ")
    (long,) = call(app, chat([{"role": "user", "content": "x" * 5_000_000}]))
    assert long.json()["error"]["message"] == (
        f"the prompt is 5000000 characters, more than the model's context of {CONTEXT} tokens can hold (at most "
        f"{engine.chars_per_token} characters a token): shorten the prompt")


def test_honoured_fields_change_the_output(served):
    """presence/frequency penalties and logit_bias are applied by the transformers engine, not dropped."""
    app, engine = served
    token = 42
    (biased,) = call(app, chat(max_tokens=6, logit_bias={str(token): 100}, ignore_eos=True,
                               logprobs=True))
    assert biased.status_code == 200, biased.text
    chosen = [e["token"] for e in biased.json()["choices"][0]["logprobs"]["content"]]
    assert chosen == [engine.tokenizer.decode([token])] * 6
    plain, penalised = call(app, chat(max_tokens=24, ignore_eos=True, temperature=0),
                            chat(max_tokens=24, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0,
                                 temperature=0))
    assert plain.status_code == penalised.status_code == 200
    a, b = plain.json()["choices"][0]["message"]["content"], penalised.json()["choices"][0]["message"]["content"]
    ids_a, ids_b = engine.tokenizer(a)["input_ids"], engine.tokenizer(b)["input_ids"]
    # the penalties discourage repeats: fewer repeated tokens than greedy decoding without them
    assert len(ids_b) - len(set(ids_b)) < len(ids_a) - len(set(ids_a)), (a, b)


def test_a_huge_prompt_does_not_stall_other_requests(tiny_model):
    """A 900 kB prompt that fits the (large) context is templated and tokenized off the event loop: a normal
    request sent after it completes first, and the huge one then gets its 400 (max_tokens past the context)."""
    engine = TransformersEngine(tiny_model, engine_kwargs={"max_model_len": 400_000})
    engine.start()
    cfg = LLMConfig(model_loading_config=dict(model_id="tiny", model_source=tiny_model), engine="transformers")
    app = make_api({"tiny": LocalBackend(ModelServer(cfg, engine=engine))})
    huge = "hello " * 150_000
    order = []

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            async def send(name, body):
                resp = await client.post("/v1/chat/completions", json={"model": "tiny", **body})
                order.append((name, resp.status_code, resp.json().get("error", {}).get("param")))
            big = asyncio.create_task(send("huge", {"messages": [{"role": "user", "content": huge}],
                                                    "max_tokens": 10**9}))
            await asyncio.sleep(0.05)  # the huge request is being tokenized
            await send("normal", {"messages": MSG, "max_tokens": 2})
            await big
    try:
        asyncio.run(go())
    finally:
        engine.stop()
    assert order == [("normal", 200, None), ("huge", 400, "max_tokens")], order
