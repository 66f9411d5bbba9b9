"""Request fields in batch jobs (the field table, fleetllm.engines.fields): an OpenAI Batch line with a field
the engine does not honour gets its own error line and the others are answered; the YAML `sampling` is
checked against the job's engine at plan time. Real pipeline on a local Ray, tiny random model."""

import json

import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import PlanError
from fleetllm.spec import JobSpec

HI = [{"role": "user", "content": "hi"}]


def line(custom_id, **body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "x", "messages": HI, "max_tokens": 4, **body}})


def test_openai_batch_lines_with_refused_fields_fail_alone(ray_local, tiny_model, tmp_path):
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]
    lines = [
        line("ok"),
        line("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        line("stop_ids", stop_token_ids=[1]),
        line("seed", seed=18446744073709551616),
        line("image", messages=image),
        line("penalties", presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"42": 100}, top_k=5, min_p=0.1),
        line("logprobs", logprobs=True, top_logprobs=2),
        line("too_long", max_tokens=10**9),
        line("parts", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
    ]
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join(lines) + "\n")
    spec = JobSpec.model_validate({
        "model": {"source": tiny_model, "engine": "transformers", "engine_kwargs": {"max_model_len": 256}},
        "input": {"path": str(src), "format": "openai_batch"},
        "output": {"path": str(tmp_path / "out"), "format": "openai_batch", "shard_rows": 3}})
    run_job(spec)
    ok = {x["custom_id"]: x for x in map(json.loads, (tmp_path / "out" / "output.jsonl").read_text().splitlines())}
    bad = {x["custom_id"]: x["error"]["message"]
           for x in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())}
    assert sorted(ok) == ["logprobs", "ok", "parts", "penalties"]
    assert sorted(bad) == ["image", "seed", "stop_ids", "too_long", "tools"]
    assert bad["tools"] == ("`tools` is not supported by the transformers engine (tool calls are not parsed by "
                            "fleetllm); no fleetllm engine honours it")
    assert bad["stop_ids"] == ("`stop_token_ids` is not supported by the transformers engine; engines that honour "
                               "it: vllm, openai")
    assert bad["seed"] == f"`seed` must be between {-(1 << 63)} and {(1 << 63) - 1}, got 18446744073709551616"
    assert bad["image"].startswith("body.messages[0].content[1] is a content part of type 'image_url'; this model "
                                   "reads text only")
    assert bad["too_long"].startswith("the model's context is 256 tokens; the request asks for ")
    # logit_bias +100 on token 42 makes every generated token 42
    from transformers import AutoTokenizer

    penalties = ok["penalties"]["response"]["body"]
    tokens = penalties["usage"]["completion_tokens"]
    assert tokens >= 1 and penalties["choices"][0]["message"]["content"] == \
        AutoTokenizer.from_pretrained(tiny_model).decode([42] * tokens, skip_special_tokens=True)
    choice = ok["logprobs"]["response"]["body"]["choices"][0]
    assert len(choice["logprobs"]["content"]) == ok["logprobs"]["response"]["body"]["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 for e in choice["logprobs"]["content"])


def test_yaml_sampling_refused_by_the_engine_fails_at_plan_time(tiny_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"q": "hi"}) + "\n")
    spec = JobSpec.model_validate({
        "model": {"source": tiny_model, "engine": "transformers"}, "input": {"path": str(src)},
        "prompt": {"template": "{q}"}, "output": {"path": str(tmp_path / "out")},
        "sampling": {"extra": {"stop_token_ids": [1]}}})
    with pytest.raises(PlanError, match=r"^sampling: `stop_token_ids` is not supported by the transformers engine; "
                                        r"engines that honour it: vllm, openai$"):
        run_job(spec)
    bad_value = spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"extra": {"min_p": 7}})})
    with pytest.raises(PlanError, match=r"^sampling: `min_p` must be in \[0.0, 1.0\], got 7$"):
        run_job(bad_value)
    assert not (tmp_path / "out").exists()  # a refused run leaves no folder of its own behind
