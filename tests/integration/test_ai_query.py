"""ai_query on a local Ray cluster against the real capacity-limited HTTP server."""

from __future__ import annotations

import pytest

import fleetllm
from fleetllm.errors import SpecError
from fleetllm.testing.capacity_server import CapacityServer


@pytest.fixture(scope="module")
def server():
    with CapacityServer(capacity=8, latency_s=0.002) as srv:
        yield srv


def test_prompt_col_every_row_answered(ray_local, server):
    ds = ray_local.data.from_items([{"id": i, "text": f"row {i}"} for i in range(200)])
    result = fleetllm.ai_query(ds, "capacity-test", prompt_col="text", base_url=server.base_url,
                               options={"max_tokens": 16, "temperature": 0.7}, concurrency=2, batch_size=4)
    rows = sorted(result.take_all(), key=lambda r: r["id"])
    assert len(rows) == 200
    for r in rows:
        out = r["generated_text"]
        assert out["content"] == f"echo: {r['text']}" and out["error"] is None
        assert out["finish_reason"] == "stop" and out["attempts"] >= 1
        assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 3}


def test_messages_col_and_bad_rows_are_kept(ray_local, server):
    items = [{"id": i, "messages": [{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": f"hello {i}"}]} for i in range(20)]
    items.append({"id": 20, "messages": []})
    ds = ray_local.data.from_items(items)
    result = fleetllm.ai_query(ds, "capacity-test", messages_col="messages", base_url=server.base_url,
                               output_col="answer", concurrency=1)
    rows = sorted(result.take_all(), key=lambda r: r["id"])
    assert [r["answer"]["content"] for r in rows[:20]] == [f"echo: hello {i}" for i in range(20)]
    assert rows[20]["answer"]["content"] is None and "no messages" in rows[20]["answer"]["error"]
    assert rows[20]["answer"]["attempts"] == 0


def test_thirty_percent_503_through_ray(ray_local):
    with CapacityServer(capacity=8, latency_s=0.001, failure_rate=0.3, seed=3) as srv:
        ds = ray_local.data.from_items([{"id": i, "text": f"t {i}"} for i in range(150)])
        result = fleetllm.ai_query(ds, "capacity-test", prompt_col="text", base_url=srv.base_url,
                                   concurrency=2, max_retries=12,
                                   retry={"initial_backoff_s": 0.002, "max_backoff_s": 0.02})
        rows = result.take_all()
        stats = srv.stats()
    assert len(rows) == 150
    assert all(r["generated_text"]["content"] == f"echo: {r['text']}" for r in rows)
    assert sum(r["generated_text"]["attempts"] for r in rows) == stats["requests"]
    assert all(r["generated_text"]["attempts"] == stats["prompts"][r["text"]] for r in rows)
    assert stats["failed"] > 10


def test_argument_errors_name_the_fix(ray_local):
    ds = ray_local.data.from_items([{"text": "a", "other": 1}])
    url = "http://127.0.0.1:9/v1"
    with pytest.raises(SpecError, match="exactly one of prompt_col"):
        fleetllm.ai_query(ds, "m", base_url=url)
    with pytest.raises(SpecError, match="exactly one of prompt_col"):
        fleetllm.ai_query(ds, "m", prompt_col="text", messages_col="text", base_url=url)
    with pytest.raises(SpecError, match=r"'prompt' is not a column.*\['text', 'other'\]"):
        fleetllm.ai_query(ds, "m", prompt_col="prompt", base_url=url)
    with pytest.raises(SpecError, match="already a column"):
        fleetllm.ai_query(ds, "m", prompt_col="text", output_col="other", base_url=url)
    with pytest.raises(SpecError, match="use n=1"):
        fleetllm.ai_query(ds, "m", prompt_col="text", options={"n": 2}, base_url=url)
    with pytest.raises(SpecError, match="base_url"):
        fleetllm.ai_query(ds, "m", prompt_col="text", base_url="127.0.0.1:8000")
    with pytest.raises(SpecError, match="aimd settings"):
        fleetllm.ai_query(ds, "m", prompt_col="text", base_url=url, aimd={"floor": 2})
