import json

import pytest

from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor
from fleetllm.engines.openai_api.batch_lines import batch_line
from fleetllm.batch.execution.stages import TemplatePreprocessor, generate_with_retries
from fleetllm.engines.base import Completion, GenerationRequest, GenerationResult


def _row(**kw):
    return {"_line": 3, "_file": "in.jsonl", **kw}


def test_template_builds_messages_with_system():
    pre = TemplatePreprocessor("Be brief.", "Q: {question}", id_column="id")
    out = pre(_row(question="2+2?", id="r1"))
    assert json.loads(out["_messages"]) == [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Q: 2+2?"}]
    assert out["row_id"] == "r1" and out["error"] is None
    assert "sampling_params" not in out  # the job's sampling goes to the engine stage, not on every row


def test_a_rows_own_sampling_replaces_the_jobs_and_rows_without_take_the_stages():
    from fleetllm.batch.execution.stages import request_from_row

    pre = TemplatePreprocessor(None, "{q}")
    own, plain = pre(_row(q="a", sampling_params={"max_tokens": 3})), pre(_row(q="b"))
    assert json.loads(own["sampling_params"]) == {"max_tokens": 3}  # JSON text: one Arrow type
    job = {"max_tokens": 9, "temperature": 0.5}
    assert request_from_row(own, None, job).sampling == {"max_tokens": 3}
    assert request_from_row(plain, None, job).sampling == job


def test_missing_template_column_is_a_row_error_naming_columns():
    out = TemplatePreprocessor(None, "{question}")(_row(text="hello", question=None))
    assert "needs column 'question'" in out["error"] and "['text']" in out["error"]
    assert out["row_id"] == "in.jsonl:3"


def test_empty_prompt_is_a_row_error():
    assert "empty" in TemplatePreprocessor(None, "{q}")(_row(q="   "))["error"]
    assert "empty" in TemplatePreprocessor(None, None)(_row(prompt=""))["error"]


def test_rows_with_their_own_messages():
    msgs = [{"role": "user", "content": "hi"}]
    out = TemplatePreprocessor("sys", None)(_row(messages=msgs))
    sent = json.loads(out["_messages"])  # what the engine gets; the input column stays as it was read
    assert sent[0] == {"role": "system", "content": "sys"} and sent[1] == msgs[0] and out["messages"] == msgs


def test_retries_isolate_the_failing_row_with_exact_backoff():
    calls, sleeps = [], []

    def engine(reqs):
        calls.append([r.prompt for r in reqs])
        if len(reqs) > 1 or reqs[0].prompt == "bad":
            raise RuntimeError("boom")
        return [GenerationResult([Completion(reqs[0].prompt.upper(), 1, "stop")], 1)]

    reqs = [GenerationRequest(prompt="a"), GenerationRequest(prompt="bad")]
    results, attempts = generate_with_retries(engine, reqs, max_retries=2, sleep=sleeps.append)
    assert results[0].text == "A" and attempts[0] == 2
    assert results[1].error.startswith("engine error after 3 attempts: boom") and attempts[1] == 3
    assert sleeps == [0.1, 0.1, 0.2]
    assert calls == [["a", "bad"], ["a"], ["bad"], ["bad"]]


@pytest.mark.parametrize("line, message", [
    ({"custom_id": "x", "method": "POST", "url": "/v1/images/generations", "body": {"prompt": "a"}},
     "url '/v1/images/generations'"),
    ({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}},
     "url /v1/embeddings does not match this job's task (generate)"),
    ({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions"}, "no `body`"),
    ({"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}, "method 'GET'"),
    ({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}, "messages is missing"),
])
def test_openai_batch_bad_lines(line, message):
    out = OpenAIBatchPreprocessor({})(_row(**line))
    assert message in out["error"]
    rendered = batch_line({**out, "attempts": 0})
    assert rendered["custom_id"] == "x" and rendered["response"] is None
    assert message in rendered["error"]["message"]


def test_openai_batch_good_line_maps_body_and_renders_response():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7,
            "temperature": 0.5, "stop": "END", "seed": 3}
    out = OpenAIBatchPreprocessor({"max_tokens": 64})(_row(custom_id="c1", method="POST",
                                                         url="/v1/chat/completions", body=json.dumps(body)))
    assert out["error"] is None and out["messages"] == body["messages"]
    assert json.loads(out["sampling_params"]) == {"max_tokens": 7, "temperature": 0.5, "seed": 3, "stop": ["END"]}
    line = batch_line({**out, "generated_text": "hello", "finish_reason": "stop", "num_input_tokens": 5,
                       "num_generated_tokens": 2, "attempts": 1})
    assert line["error"] is None and line["response"]["status_code"] == 200
    resp = line["response"]["body"]
    assert resp["object"] == "chat.completion" and resp["choices"][0]["message"]["content"] == "hello"
    assert resp["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
