"""An endpoint that lies or fails, then heals (issue 33): the capacity test server with its switchable
fault modes (fleetllm.testing.faults), the real openai engine and the real runner.

- an answer that is not a well-formed completion stops the job naming the endpoint and what it
  answered, commits none of those rows, and the healed rerun computes exactly the rows not answered;
- an endpoint-wide 429 storm, outage or hang does the same; a 5xx of one row while others succeed
  stays that row's error, and `--retry-errors` recomputes exactly the failed rows, once;
- a server's Retry-After is capped by retry.max_backoff_s and the wait is told; a body past
  max_response_mb is refused with an error naming the setting.
"""

import io
import json
import threading
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from rich.console import Console

from fleetllm.batch.reports.progress import JobProgress
from fleetllm.batch.runner import run_job
from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.openai.client import wait_listeners
from fleetllm.engines.openai.engine import OpenAIHTTPEngine
from fleetllm.errors import EndpointError
from fleetllm.spec import JobSpec
from fleetllm.testing.capacity_server import CapacityServer

MODEL = "capacity-test"
ROWS = 12
FAST_RETRY = {"initial_backoff_s": 0.01, "max_backoff_s": 0.02}


@pytest.fixture(scope="module")
def server():
    with CapacityServer(capacity=1, latency_s=0.02) as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.options.fault, server.options.fault_marker, server.options.fault_after = None, None, 0
    server.options.bad_request_marker = None
    yield server
    server.options.fault = None  # healed for the next test


def spec_for(tmp_path: Path, base_url: str, rows: int = ROWS, sampling=None, **engine) -> JobSpec:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"id": f"r{i:02d}", "text": f"prompt {i}"}) + "\n" for i in range(rows)))
    return JobSpec.model_validate({
        "name": "lying", "model": {"source": MODEL, "engine": "openai", "engine_kwargs": {
            "base_url": base_url, "max_retries": 2, "retry": FAST_RETRY, **engine}},
        "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{text}"},
        "sampling": {"max_tokens": 8, **(sampling or {})}, "output": {"path": str(tmp_path / "out"), "shard_rows": 3},
        "compute": {"replicas": 1, "cpus_per_replica": 0.5, "batch_size": 3, "batches_in_flight": 1}})


def rows_of(tmp_path: Path) -> dict[str, dict]:
    out = tmp_path / "out"
    if not out.exists():
        return {}
    rows = pads.dataset(str(out), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    ids = [r["row_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"a row was written twice: {sorted(ids)}"
    return {r["row_id"]: r for r in rows}


def answered(row: dict) -> bool:
    return row["error"] is None and isinstance(row["generated_text"], str) and row["generated_text"].startswith("echo:")


def drained(srv, timeout_s: float = 30.0) -> None:
    """Wait until the server holds no request: those a stopped job's client gave up on (timeouts of 0.3 s, which a
    loaded machine reaches) stay queued there and would meet the next run with the server's 429 (hard limit)."""
    deadline = time.monotonic() + timeout_s
    while srv.stats()["in_system"] and time.monotonic() < deadline:
        time.sleep(0.05)


def heal_and_rerun(tmp_path: Path, srv, before: dict, **spec_over) -> dict:
    """Heal the endpoint, run again: exactly the rows not committed are computed, each row once, all answered."""
    srv.options.fault = None
    drained(srv)
    report = run_job(spec_for(tmp_path, srv.base_url, **spec_over))
    assert report["rows_skipped"] == len(before) and report["rows_computed"] == ROWS - len(before)
    rows = rows_of(tmp_path)
    assert sorted(rows) == [f"r{i:02d}" for i in range(ROWS)]
    assert all(answered(r) for r in rows.values()), [r for r in rows.values() if not answered(r)]
    return rows


@pytest.mark.parametrize("fault, said, sampling", [
    ("html", "body is not JSON: '<html>", None),
    ("truncated", "body is not valid JSON", None),
    ("no_choices", "with no choices", None),
    ("fewer_choices", "1 choice\\(s\\) where n=2 were asked", {"n": 2, "temperature": 1.0}),
    ("no_message", "choice 0 has no message", None),
])
def test_an_answer_that_is_not_a_completion_stops_the_job_and_the_healed_rerun_computes_the_rest(
        srv, tmp_path, fault, said, sampling):
    srv.options.fault, srv.options.fault_marker = fault, "prompt 7"  # a lying proxy, for some requests
    sent = srv.stats()["prompts"].get("prompt 7", 0)
    with pytest.raises(EndpointError, match=f"the endpoint {srv.base_url} answered a 200 .*{said}.* on all 3 "
                                            "attempts of a row: not a well-formed completion.*The job stopped"):
        run_job(spec_for(tmp_path, srv.base_url, sampling=sampling))
    before = rows_of(tmp_path)
    assert "r07" not in before and all(answered(r) for r in before.values())  # nothing committed as final
    assert srv.stats()["prompts"]["prompt 7"] - sent == 3  # retried like a 5xx
    rows = heal_and_rerun(tmp_path, srv, before, sampling=sampling)
    if sampling:
        assert all(len(r["completions"]) == 2 for r in rows.values())


@pytest.mark.parametrize("fault, status, said", [
    ("status", 429, "rate-limits every request \\(HTTP 429"),
    ("status", 503, "is unavailable to every request \\(HTTP 503"),
    ("status", 500, "failed every request \\(HTTP 500.*no other request succeeded meanwhile"),
    ("hang", None, "failed every request \\(timeout.*no other request succeeded meanwhile"),
])
def test_an_endpoint_wide_storm_outage_or_hang_stops_the_job_without_committing_row_errors(
        srv, tmp_path, fault, status, said):
    drained(srv)  # the healthy phase below counts the server's requests: nothing left over may take them
    srv.options.fault_status, srv.options.fault_retry_after_s, srv.options.fault_hang_s = status or 503, None, 5.0
    # healthy for the first two shards (one batch of 3 rows at a time), then down for every request
    srv.options.fault, srv.options.fault_after = fault, srv.stats()["requests"] + 6
    with pytest.raises(EndpointError, match=f"the endpoint {srv.base_url} {said}.*The job stopped: [12] of 4"):
        run_job(spec_for(tmp_path, srv.base_url, timeout_s=0.3))
    # the shards answered before the outage: one or two whole shards of 3 rows (which ones depends on the order
    # in which the executor sent their requests: on Ray a later shard may be served before the second)
    before = rows_of(tmp_path)
    shards = {int(r[1:]) // 3 for r in before}
    assert 1 <= len(shards) <= 2 and sorted(before) == [f"r{i:02d}" for s in sorted(shards)
                                                        for i in range(3 * s, 3 * s + 3)], sorted(before)
    assert all(answered(r) for r in before.values())
    heal_and_rerun(tmp_path, srv, before, timeout_s=0.3)


def test_one_rows_5xx_stays_its_error_and_retry_errors_recomputes_exactly_the_failed_rows(srv, tmp_path):
    srv.options.fault, srv.options.fault_marker, srv.options.fault_status = "status", "prompt 7", 500
    srv.options.fault_retry_after_s = None
    srv.options.bad_request_marker = "prompt 9"  # a 400 about the row's content: never retryable
    slower = {"initial_backoff_s": 0.1, "max_backoff_s": 0.2}  # its neighbours answer during its retries
    first = run_job(spec_for(tmp_path, srv.base_url, retry=slower))
    assert first["rows_computed"] == ROWS and first["errors"] == 2  # the others succeeded meanwhile
    rows = rows_of(tmp_path)
    assert rows["r07"]["error"] == "HTTP 500: injected endpoint failure (after 3 attempts)"
    assert rows["r09"]["error"].startswith("HTTP 400")
    srv.options.fault = None
    assert run_job(spec_for(tmp_path, srv.base_url))["rows_computed"] == 0  # a plain rerun keeps the errors
    seen = dict(srv.stats()["prompts"])
    again = run_job(spec_for(tmp_path, srv.base_url), retry_errors="retryable")
    assert again["rows_computed"] == 1 and again["rows_skipped"] == ROWS - 1 and again["errors"] == 1
    after = srv.stats()["prompts"]
    assert {p: n - seen.get(p, 0) for p, n in after.items() if n != seen.get(p, 0)} == {"prompt 7": 1}
    rows = rows_of(tmp_path)
    assert sorted(rows) == [f"r{i:02d}" for i in range(ROWS)]
    assert answered(rows["r07"]) and rows["r07"]["generated_text"] == "echo: prompt 7"
    assert rows["r09"]["error"].startswith("HTTP 400")  # not a retryable kind: kept as it was
    srv.options.bad_request_marker = None
    last = run_job(spec_for(tmp_path, srv.base_url), retry_errors="all")
    assert last["rows_computed"] == 1 and last["errors"] == 0 and last["complete"]
    rows = rows_of(tmp_path)
    assert [r["row_id"] for r in pads.dataset(str(tmp_path / "out"), format="parquet", exclude_invalid_files=True).to_table().to_pylist()] \
        == [f"r{i:02d}" for i in range(ROWS)]  # every row once, in its place
    assert all(answered(r) and r["generated_text"] == f"echo: prompt {int(k[1:])}" for k, r in rows.items())


def test_a_body_past_max_response_mb_is_the_rows_error_and_retry_errors_computes_it_after(srv, tmp_path):
    srv.options.fault, srv.options.fault_marker, srv.options.fault_body_mb = "huge", "prompt 4", 3.0
    report = run_job(spec_for(tmp_path, srv.base_url, max_response_mb=1))
    assert report["errors"] == 1
    error = rows_of(tmp_path)["r04"]["error"]
    assert "larger than model.engine_kwargs.max_response_mb (1 MiB)" in error and "--retry-errors" in error
    srv.options.fault = None
    again = run_job(spec_for(tmp_path, srv.base_url, max_response_mb=1), retry_errors="retryable")
    assert again["rows_computed"] == 1 and again["errors"] == 0
    rows = rows_of(tmp_path)
    assert len(rows) == ROWS and all(answered(r) for r in rows.values())


def test_retry_after_is_capped_by_max_backoff_s_and_the_wait_is_told(srv):
    srv.options.fault, srv.options.fault_status, srv.options.fault_retry_after_s = "status", 429, 3600
    heard: list[str] = []
    wait_listeners.append(heard.append)
    engine = OpenAIHTTPEngine(MODEL, {"base_url": srv.base_url, "max_retries": 3,
                                      "retry": {"initial_backoff_s": 0.01, "max_backoff_s": 1.0}})
    engine.start()
    try:
        threading.Timer(1.5, lambda: setattr(srv.options, "fault", None)).start()  # heals after ~1 retry
        started = time.monotonic()
        result = engine.generate([GenerationRequest(prompt="wait", sampling={"max_tokens": 4})])[0]
        took = time.monotonic() - started
    finally:
        engine.stop()
        wait_listeners.remove(heard.append)
    assert result.error is None and result.completions[0].text == "echo: wait" and result.attempts >= 2
    assert took < 10, f"Retry-After: 3600 was obeyed ({took:.1f} s)"
    assert heard and heard[0].startswith(f"waiting 1 s to retry {srv.base_url}: HTTP 429")
    assert "Retry-After 3600 s, capped at retry.max_backoff_s 1 s" in heard[0]
    stream = io.StringIO()
    progress = JobProgress(10, console=Console(file=stream, force_terminal=False, width=400))
    progress.waiting(heard[0])
    progress.close()
    assert "0/10 rows" in stream.getvalue() and "Retry-After 3600 s, capped" in stream.getvalue()
