"""What a client of `vllm serve` relies on (issue 39), in-process over the transformers engine on the tiny model:
default sampling from generation_config.json, token-id prompts, custom roles, continuous usage, one streamed
chunk per choice, the stop token counted, echo with the prompt's logprobs, prompt_tokens_details when asked."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest

from fleetllm.engines.transformers_engine import TransformersEngine
from fleetllm.serve.api import make_api
from fleetllm.serve.backend import LocalBackend, ModelServer
from fleetllm.serve.spec import LLMConfig

MSG = [{"role": "user", "content": "Say hi"}]


def _server(path: str, model_id: str, **config) -> ModelServer:
    engine = TransformersEngine(path, engine_kwargs={"max_model_len": 256})
    engine.start()
    cfg = LLMConfig(model_loading_config=dict(model_id=model_id, model_source=path), engine="transformers", **config)
    return ModelServer(cfg, engine=engine)


@pytest.fixture(scope="module")
def api(tiny_model, tmp_path_factory):
    """"tiny": the tiny model (no sampling in its generation_config.json), with prompt_tokens_details on;
    "greedy": a copy whose generation_config.json says temperature 0; "sampling": one whose config samples
    (do_sample, temperature 0.9, top_p 0.95, as many instruct models ship)."""
    def variant(name: str, **generation) -> str:
        folder = tmp_path_factory.mktemp(name) / "tiny"
        shutil.copytree(tiny_model, folder)
        config = json.loads((folder / "generation_config.json").read_text())
        (folder / "generation_config.json").write_text(json.dumps({**config, **generation}))
        return str(folder)

    servers = {"tiny": _server(tiny_model, "tiny", enable_prompt_tokens_details=True),
               "greedy": _server(variant("greedy", temperature=0.0), "greedy"),
               "sampling": _server(variant("sampling", do_sample=True, temperature=0.9, top_p=0.95), "sampling")}
    yield make_api({m: LocalBackend(s, max_ongoing_requests=8) for m, s in servers.items()}), servers
    for s in servers.values():
        s.engine.stop()


def post(app, *bodies, path="/v1/chat/completions"):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:
            return await asyncio.gather(*[client.post(path, json=b) for b in bodies])
    return asyncio.run(go())


def events(resp) -> list[dict]:
    return [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]


def test_default_sampling_follows_the_generation_config(api):
    app, servers = api
    assert servers["tiny"].default_sampling == {"temperature": 1.0}  # OpenAI's default: nothing in the config
    assert servers["greedy"].default_sampling == {"temperature": 0.0}
    body = {"messages": MSG, "max_tokens": 12, "ignore_eos": True}
    a, b = post(app, {**body, "model": "tiny"}, {**body, "model": "tiny"})
    assert a.json()["choices"][0]["message"]["content"] != b.json()["choices"][0]["message"]["content"]
    c, d, n2 = post(app, {**body, "model": "greedy"}, {**body, "model": "greedy"}, {**body, "model": "greedy", "n": 2})
    assert c.json()["choices"][0]["message"]["content"] == d.json()["choices"][0]["message"]["content"]
    assert n2.status_code == 400 and n2.json()["error"]["param"] == "n"  # greedy by the config: one answer
    (three,) = post(app, {**body, "model": "tiny", "n": 3})  # sampled by default: n > 1 needs no temperature
    assert len({c["message"]["content"] for c in three.json()["choices"]}) == 3


def test_the_openai_client_samples_by_a_sampling_generation_config(api):
    """The official client, no temperature in the request, a model whose generation_config.json samples: its
    values apply (vLLM's --generation-config auto) and two answers differ."""
    import openai

    app, servers = api
    assert servers["sampling"].default_sampling == {"temperature": 0.9, "top_p": 0.95}

    async def go() -> list[str]:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test/v1", timeout=120)
        client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
        answers = await asyncio.gather(*[client.chat.completions.create(
            model="sampling", messages=MSG, max_tokens=12, extra_body={"ignore_eos": True}) for _ in range(2)])
        await http.aclose()
        return [a.choices[0].message.content for a in answers]

    one, two = asyncio.run(go())
    assert one != two


def test_token_id_prompts_and_echo_with_the_prompts_logprobs(api):
    app, servers = api
    tok = servers["tiny"].engine.tokenizer
    ids = tok("Once upon a time")["input_ids"]
    text, as_ids, echo, bad = post(
        app, {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0},
        {"model": "tiny", "prompt": ids, "max_tokens": 4, "temperature": 0},
        {"model": "tiny", "prompt": [ids], "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2},
        {"model": "tiny", "prompt": [1, 10**9], "max_tokens": 2}, path="/v1/completions")
    assert as_ids.status_code == 200 and as_ids.json()["choices"][0]["text"] == text.json()["choices"][0]["text"]
    assert as_ids.json()["usage"]["prompt_tokens"] == len(ids)
    choice = echo.json()["choices"][0]
    assert choice["text"].startswith("Once upon a time")
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 3 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:2] == [0, len(lp["tokens"][0])] and len(lp["text_offset"]) == len(lp["tokens"])
    assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"][1:])  # the top 2 and the chosen token
    vocab = servers["tiny"].engine.vocab_size
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert f"{vocab} tokens" in bad.json()["error"]["message"] and "1000000000" in bad.json()["error"]["message"]


def test_custom_role_continuous_usage_and_a_chunk_per_choice(api):
    app, _ = api
    role, stream, n3 = post(
        app, {"model": "tiny", "messages": [{"role": "my-custom-role", "content": "hi"}], "max_tokens": 2},
        {"model": "tiny", "messages": MSG, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {"model": "tiny", "messages": MSG, "max_tokens": 5, "n": 3, "stream": True})
    assert role.status_code == 200, role.text
    chunks = events(stream)
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts[0] == 0 and counts[1:] == sorted(set(counts[1:])) and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # asked for by this model
    per_chunk = [c["choices"] for c in events(n3)]
    assert all(len(choices) == 1 for choices in per_chunk)  # one choice per chunk, as vLLM streams
    assert sorted(ch[0]["index"] for ch in per_chunk if ch[0].get("finish_reason")) == [0, 1, 2]


def test_a_stop_token_answer_counts_one_token(api):
    app, servers = api
    eos = next(iter(servers["tiny"].engine.eos_ids()))
    plain, greedy = post(app, {"model": "tiny", "messages": MSG, "max_tokens": 4, "logit_bias": {str(eos): 100}},
                         {"model": "greedy", "messages": MSG, "max_tokens": 4})
    body = plain.json()
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["message"]["content"] == ""
    assert body["usage"]["completion_tokens"] == 1  # the stop token, as vLLM counts it
    assert "prompt_tokens_details" not in greedy.json()["usage"]  # only where the model asks for it


def test_errors_carry_the_facts(api):
    app, _ = api
    keys, seed, literal = post(app, {"model": "tiny", "messages": MSG, "frobnicate": 1, "wibble": 2},
                               {"model": "tiny", "messages": MSG, "seed": -(1 << 63) - 1},
                               {"model": "tiny", "messages": MSG, "stream": True, "stream_options": "yes"})
    assert "`frobnicate`" in keys.json()["error"]["message"] and "`wibble`" in keys.json()["error"]["message"]
    assert seed.json()["error"]["message"] == (f"seed: Input should be greater than or equal to {-(1 << 63)} "
                                               f"(got {-(1 << 63) - 1}) [type=greater_than_equal]")
    assert "[type=model_type]" in literal.json()["error"]["message"]
