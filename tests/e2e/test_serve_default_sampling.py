"""The official openai client against `fleetllm serve` (the shared apps, both engines): a request without
`temperature` samples as `vllm serve` does (the embedded model's generation_config.json sets no sampling, so
OpenAI's temperature 1.0), and n=3 streaming gives each choice its finish_reason (issue 39)."""

from __future__ import annotations

import openai
import pytest

ASK = [{"role": "user", "content": "Write one sentence about the sea."}]


def check_sampling_defaults(served) -> None:
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    one, two = (client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=24) for _ in range(2))
    assert one.choices[0].message.content != two.choices[0].message.content  # samples, not one greedy answer
    stream = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, n=3, stream=True)
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in stream
                if c.choices and c.choices[0].finish_reason}
    assert sorted(finished) == [0, 1, 2] and set(finished.values()) <= {"stop", "length"}


def test_default_sampling_transformers(served_smollm2):
    check_sampling_defaults(served_smollm2)


@pytest.mark.vllm
def test_default_sampling_vllm(served_smollm2_vllm):
    check_sampling_defaults(served_smollm2_vllm)
