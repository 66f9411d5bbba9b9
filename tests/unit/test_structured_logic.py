"""Structured-output constraints: parsing every shape users send, and checking finished texts."""

from __future__ import annotations

import json

import pytest

from fleetllm.engines.base import GenerationRequest
from fleetllm.errors import RowError
from fleetllm.spec import SamplingSpec, SpecError, parse_spec
from fleetllm.structured import (
    StructuredOutput, from_response_format, from_structured_outputs, pop_constraint,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_response_format_shapes():
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == StructuredOutput("json_object", True)
    c = from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}})
    assert (c.kind, c.value, c.strict, c.name) == ("json", PERSON, True, "p")
    with pytest.raises(RowError, match="type 'xml' is not supported"):
        from_response_format({"type": "xml"})
    with pytest.raises(RowError, match="needs `json_schema"):
        from_response_format({"type": "json_schema"})
    with pytest.raises(RowError, match="not a valid JSON schema"):
        from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "objekt"}}})


def test_structured_outputs_shapes():
    assert from_structured_outputs({"json": json.dumps(PERSON)}).value == PERSON  # JSON text is read too
    assert from_structured_outputs({"choice": ["yes", "no"]}) == StructuredOutput("choice", ("yes", "no"))
    assert from_structured_outputs({"regex": r"\d+"}).kind == "regex"
    assert from_structured_outputs({"grammar": 'root ::= "a"'}).kind == "grammar"
    assert from_structured_outputs({"json_object": True, "disable_any_whitespace": True}).disable_any_whitespace
    with pytest.raises(RowError, match="exactly one of"):
        from_structured_outputs({"regex": "a", "choice": ["a"]})
    with pytest.raises(RowError, match=r"\['structural_tag'\] that fleetllm does not honour"):
        from_structured_outputs({"structural_tag": "{}"})
    with pytest.raises(RowError, match="non-empty list"):
        from_structured_outputs({"choice": []})


def test_arrow_nulls_are_shed_from_schema_dicts():
    # a struct column gives every row every key, absent ones as None
    c = from_structured_outputs({"json": {**PERSON, "items": None}, "regex": None, "choice": None})
    assert c.value == PERSON


def test_a_request_takes_its_constraint_out_of_sampling():
    req = GenerationRequest(prompt="x", sampling={"max_tokens": 8, "response_format": {"type": "json_object"}})
    assert req.structured == StructuredOutput("json_object", True) and req.sampling == {"max_tokens": 8}
    req = GenerationRequest(prompt="x", sampling={"response_format": {"type": "text"}})
    assert req.structured is None and req.sampling == {}
    with pytest.raises(RowError, match="both response_format and structured_outputs"):
        pop_constraint({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}})


def test_check_parses_and_validates():
    c = StructuredOutput("json", PERSON)
    assert c.check('{ "name": "Ada", "age": 36 }', "stop") == ('{"name":"Ada","age":36}', None)
    parsed, err = c.check('{"name": "Ada"}', "stop")
    assert parsed is None and "'age' is a required property" in err
    parsed, err = c.check('{"name": "Ada", "a', "length")
    assert parsed is None and "not valid JSON" in err and "raise max_tokens" in err
    assert StructuredOutput("json_object", True).check("[1]")[1].startswith("the output is JSON but not an object")
    assert StructuredOutput("choice", ("yes", "no")).check("yes") == (None, None)
    assert "not one of the choices" in StructuredOutput("choice", ("yes", "no")).check("maybe")[1]
    assert StructuredOutput("regex", r"\d+").check("123") == (None, None)
    assert "does not match" in StructuredOutput("regex", r"\d+").check("12a")[1]


def test_request_fields_for_an_openai_endpoint():
    c = from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}})
    assert c.request_fields() == {"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": PERSON, "strict": True}}}
    assert StructuredOutput("choice", ("a", "b")).request_fields() == {"structured_outputs": {"choice": ["a", "b"]}}


def test_job_spec_schema_inline_file_and_pydantic(tmp_path, monkeypatch):
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    (tmp_path / "myschemas.py").write_text(
        "from pydantic import BaseModel\nclass Person(BaseModel):\n    name: str\n    age: int\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    inline = SamplingSpec.model_validate({"structured_outputs": {"json": PERSON, "strict": True}})
    assert inline.as_params()["structured_outputs"] == {"json": PERSON}
    from_file = SamplingSpec.model_validate({"structured_outputs": {"json_file": "person.json"}})
    assert from_file.as_params()["structured_outputs"] == {"json": PERSON}
    model = SamplingSpec.model_validate({"structured_outputs": {"pydantic": "myschemas:Person"}})
    schema = model.as_params()["structured_outputs"]["json"]
    assert schema["required"] == ["name", "age"] and schema["properties"]["age"]["type"] == "integer"
    choice = SamplingSpec.model_validate({"structured_outputs": {"choice": ["a", "b"]}})
    assert choice.as_params()["structured_outputs"] == {"choice": ["a", "b"]}


@pytest.mark.parametrize("given, message", [
    ({"json_file": "missing.json"}, "does not exist"),
    ({"pydantic": "no_such_module_x:Model"}, "cannot import module"),
    ({"pydantic": "json"}, "must be written module:Class"),
    ({"regex": "a", "choice": ["a"]}, "exactly one of"),
    ({}, "got none"),
])
def test_job_spec_structured_errors_name_the_problem(tmp_path, monkeypatch, given, message):
    monkeypatch.chdir(tmp_path)
    data = {"input": {"path": "in.jsonl"}, "output": {"path": "out"}, "sampling": {"structured_outputs": given}}
    from fleetllm.spec import JobSpec

    with pytest.raises(SpecError, match=message):
        parse_spec(JobSpec, data, "job.yaml")


def test_result_columns_and_batch_lines_of_a_constrained_row():
    from fleetllm.engines.openai_api.batch_lines import batch_line
    from fleetllm.batch.execution.stages import result_columns
    from fleetllm.engines.base import Completion, GenerationResult

    c = StructuredOutput("json", PERSON)
    ok = result_columns(GenerationResult([Completion('{"name": "Ada", "age": 36}', 9, "stop")], 5), 1, 1, c)
    assert ok["parsed"] == '{"name":"Ada","age":36}' and ok["error"] is None
    cut = result_columns(GenerationResult([Completion('{"name": "Ad', 4, "length")], 5), 1, 1, c)
    assert cut["parsed"] is None and cut["error"].startswith("structured output: the output is not valid JSON")
    two = result_columns(GenerationResult([Completion('{"name": "A", "age": 1}', 9, "stop"),
                                           Completion("{}", 2, "stop", index=1)], 5), 1, 2, c)
    assert [e["parsed"] for e in two["completions"]] == ['{"name":"A","age":1}', None]
    assert two["error"].startswith("structured output: completion 1:")
    row = {"custom_id": "x", "row_id": "x", "url": "/v1/chat/completions", "body": "{}", **cut}
    line = batch_line(row)
    assert line["error"]["code"] == "invalid_output" and line["response"]["body"]["choices"][0]["message"]["content"]
    assert batch_line({**row, **ok})["error"] is None
