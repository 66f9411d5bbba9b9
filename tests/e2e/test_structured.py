"""Structured outputs end to end on the embedded SmolLM2 model (transformers engine): `fleetllm serve`
driven by the official openai client, an OpenAI Batch file and a job spec with a schema file.

The 135M model writes prose when asked for JSON unconstrained; the outputs below parse and validate
only because decoding follows the schema (xgrammar)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from test_cli_run import fleetllm, read_rows, write_job

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                         "country": {"type": "string", "maxLength": 40}},
        "required": ["city", "country"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Name a famous city and the country it is in."}]


def chat_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2", "messages": ASK, "max_tokens": 48, **body}}) + "\n"


def openai_batch_lines() -> str:
    return "".join([
        chat_line("schema", response_format={"type": "json_schema",
                                             "json_schema": {"name": "city", "schema": CITY, "strict": True}}),
        chat_line("object", response_format={"type": "json_object"}),
        chat_line("choice", structured_outputs={"choice": ["Paris", "Rome", "Tokyo"]}),
        chat_line("cut", max_tokens=3, response_format={"type": "json_schema",
                                                        "json_schema": {"name": "city", "schema": CITY}}),
        chat_line("bad", response_format={"type": "xml"}),
    ])


def check_batch_output(lines: dict[str, dict]) -> None:
    """The Batch output lines of openai_batch_lines(): JSON ones valid against their schema."""
    content = {k: v["response"]["body"]["choices"][0]["message"]["content"] for k, v in lines.items()
               if v["error"] is None}
    assert sorted(content) == ["choice", "object", "schema"]
    jsonschema.validate(json.loads(content["schema"]), CITY)
    assert isinstance(json.loads(content["object"]), dict)
    assert content["choice"] in ("Paris", "Rome", "Tokyo")


def check_structured_chats(client: openai.OpenAI) -> tuple[Any, list]:
    """A json_schema chat, plain and streamed, valid against CITY, and a choice through vLLM's
    structured_outputs shape (extra_body, as with vLLM's server); returns (the chat, the stream's chunks)."""
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    chat = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=48, temperature=0,
                                          response_format=response_format)
    jsonschema.validate(json.loads(chat.choices[0].message.content), CITY)
    chunks = list(client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=48, temperature=0,
                                                 response_format=response_format, stream=True))
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), CITY)
    pick = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8,
                                          extra_body={"structured_outputs": {"choice": ["Paris", "Rome"]}})
    assert pick.choices[0].message.content in ("Paris", "Rome")
    return chat, chunks


def test_json_schema_chat_validates_also_streamed(served_smollm2):  # the shared app, tests/conftest.py
    client = openai.OpenAI(base_url=served_smollm2.url, api_key="unused", max_retries=0, timeout=600)
    chat, chunks = check_structured_chats(client)
    assert chat.choices[0].finish_reason == "stop"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # it did stream
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})


def test_openai_batch_file_with_response_format_lines(tmp_path):
    (tmp_path / "requests.jsonl").write_text(openai_batch_lines())
    job = write_job(tmp_path, input={"path": str(tmp_path / "requests.jsonl"), "format": "openai_batch"},
                    prompt={"system": None, "template": None}, output={"format": "openai_batch"})
    proc = fleetllm("run", str(job), "--max-error-rate", "0.5", timeout=900)  # 2 of the 5 lines fail
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [json.loads(line) for line in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    errors = {e["custom_id"]: e for e in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())}
    check_batch_output({line["custom_id"]: line for line in out})
    assert sorted(errors) == ["bad", "cut"]  # one line each, none dropped
    assert errors["bad"]["error"]["code"] == "invalid_request" and "xml" in errors["bad"]["error"]["message"]
    cut = errors["cut"]
    assert cut["error"]["code"] == "invalid_output" and "raise max_tokens" in cut["error"]["message"]
    assert cut["response"]["body"]["choices"][0]["finish_reason"] == "length"  # the text is kept


def test_job_with_schema_file_gains_a_parsed_column(tmp_path):
    (tmp_path / "city.json").write_text(json.dumps(CITY))
    rows = [{"id": "a", "instruction": "Name a famous city and the country it is in."},
            {"id": "b", "instruction": "Which city is the capital of Japan? Give its country too."}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(tmp_path, sampling={"max_tokens": 48, "structured_outputs": {"json_file": str(tmp_path / "city.json")}})
    proc = fleetllm("run", str(job), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {r["row_id"]: r for r in read_rows(tmp_path / "out")}
    for row in out.values():
        assert row["error"] is None, row
        parsed = json.loads(row["parsed"])  # JSON text, the same value as the generated text
        jsonschema.validate(parsed, CITY)
        assert parsed == json.loads(row["generated_text"])
