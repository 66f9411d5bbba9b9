"""The transformers engine with xgrammar: per-row grammars within one padded batch (batch and streaming),
compiled grammars cached per constraint, a bad constraint failing its row only.

The tiny random-weight model writes anything the grammar allows, so the constraints here are ones
that must end (bounded JSON without free whitespace, a choice, a fixed-length regex): every output
then satisfies its constraint whatever the weights."""

from __future__ import annotations

import asyncio

import pytest

from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.transformers_engine import TransformersEngine

FLAG = {"structured_outputs": {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                        "required": ["ok"], "additionalProperties": False},
                               "disable_any_whitespace": True}}
CHOICE = {"structured_outputs": {"choice": ["red", "green", "blue"]}}
DIGITS = {"structured_outputs": {"regex": r"[0-9]{3}"}}


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = TransformersEngine(tiny_model, engine_kwargs={"max_model_len": 512, "max_batch_size": 8})
    eng.start()
    yield eng
    eng.stop()


def request(constraint: dict, **sampling) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "Answer."}],
                             sampling={"max_tokens": 24, **sampling, **constraint})


def test_rows_of_one_batch_follow_their_own_grammar(engine):
    reqs = [request(FLAG), request(CHOICE), request(DIGITS), request({}),
            request({"structured_outputs": {"regex": "(unclosed"}})]
    results = engine.generate(reqs)
    assert results[0].text == '{"ok":true}' or results[0].text == '{"ok":false}'
    assert results[1].text in ("red", "green", "blue")
    assert len(results[2].text) == 3 and results[2].text.isdigit()
    assert results[3].error is None and results[3].num_generated_tokens > 0
    assert "cannot be compiled" in results[4].error  # fails alone
    assert all(r.completions[0].finish_reason == "stop" for r in results[:3])
    compiled = engine.grammars.compiled
    assert compiled == 3
    engine.generate([request(CHOICE, n=2, temperature=1.0, seed=3), request(FLAG, n=2, temperature=1.0, seed=3)])
    assert engine.grammars.compiled == compiled  # cached per constraint


def test_n_completions_each_follow_the_grammar(engine):
    [result] = engine.generate([request(CHOICE, n=3, temperature=1.0, seed=1)])
    assert [c.index for c in result.completions] == [0, 1, 2]
    assert all(c.text in ("red", "green", "blue") for c in result.completions)


def test_streamed_rows_of_one_batch_follow_their_own_grammar(engine):
    async def collect(req):
        return "".join([d.text async for d in engine.generate_stream(req)])

    async def main():
        return await asyncio.gather(collect(request(FLAG)), collect(request(CHOICE)), collect(request({})),
                                    collect(request(DIGITS, stop=["9"])))

    flag, choice, free, digits = asyncio.run(main())
    assert flag in ('{"ok":true}', '{"ok":false}') and choice in ("red", "green", "blue") and free
    assert digits.isdigit() and len(digits) <= 3  # a stop string may end a constrained row early
    assert engine.batcher.stats.max_batch_rows >= 2  # they shared a batch
