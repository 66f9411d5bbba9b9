"""Job specs with engine openai: validation, the retry budget, the batch default, window warnings."""

from pathlib import Path

import pytest

from fleetllm.errors import SpecError
from fleetllm.query.cli import load_query_spec
from fleetllm.query.window import rows_in_flight_bound, window_warnings
from fleetllm.spec import JobSpec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
BASE = {"input": {"path": "in.jsonl"}, "output": {"path": "out", "shard_rows": 500}}


def spec(model=None, **sections) -> JobSpec:
    model = {"source": "served-id", "engine": "openai", "engine_kwargs": {"base_url": "http://h:1/v1"},
             **(model or {})}
    return parse_spec(JobSpec, {**BASE, "model": model, **sections}, "q.yaml")


def test_engine_kwargs_are_checked_when_the_spec_loads():
    with pytest.raises(SpecError, match=r"engine_kwargs for engine openai are invalid \(max_retry: unknown field"):
        spec({"engine_kwargs": {"base_url": "http://h:1/v1", "max_retry": 3}})
    with pytest.raises(SpecError, match=r"base_url is missing: set engine_kwargs.base_url"):
        spec({"engine_kwargs": {}})


def test_the_served_model_id_is_required():
    with pytest.raises(SpecError, match="needs the served model id: set model.source"):
        parse_spec(JobSpec, {**BASE, "model": {"engine": "openai", "engine_kwargs": {"base_url": "http://h/v1"}}}, "q")
    ok = parse_spec(JobSpec, {**BASE, "model": {"engine": "openai",
                                                "engine_kwargs": {"base_url": "http://h/v1", "model": "m"}}}, "q")
    assert ok.model.engine == "openai"


def test_one_retry_budget_compute_max_retries_is_refused_with_the_fix():
    with pytest.raises(SpecError) as exc:
        spec(compute={"max_retries": 3})
    message = str(exc.value)
    assert "compute.max_retries (3) does not apply to engine openai" in message
    assert "set model.engine_kwargs.max_retries instead (now 5)" in message
    # other engines keep compute.max_retries
    assert parse_spec(JobSpec, {**BASE, "model": {"engine": "transformers"}, "compute": {"max_retries": 3}},
                      "q").compute.max_retries == 3


def test_batch_size_defaults_to_shard_rows_on_engine_openai_only():
    from fleetllm.sizing import rows_per_call

    def rows(s):
        return rows_per_call(s.model.engine, s.compute, s.output.shard_rows)

    assert rows(spec()) == 500
    assert rows(spec(compute={"batch_size": 7})) == 7
    assert rows(parse_spec(JobSpec, {**BASE, "model": {"engine": "transformers"}}, "q")) == 16


def test_window_warnings():
    assert rows_in_flight_bound(batch_size=64, shard_rows=300, batches_in_flight=16) == 1024
    assert rows_in_flight_bound(batch_size=500, shard_rows=100, batches_in_flight=2) == 200
    assert window_warnings(spec()) == []  # batch = shard rows (500), 3 in flight: 1500 >= 256
    small = window_warnings(spec(compute={"batch_size": 8, "batches_in_flight": 4}))
    assert len(small) == 2
    assert small[0].startswith("compute.batch_size (8) is below output.shard_rows (500)")
    assert "at most 32 requests in flight" in small[1] and "aimd.max_window (256)" in small[1]
    capped = spec({"engine_kwargs": {"base_url": "http://h/v1", "aimd": {"max_window": 32}}},
                  compute={"batch_size": 8, "batches_in_flight": 4})
    assert len(window_warnings(capped)) == 1  # the window ceiling is reachable


def test_query_spec_defaults_the_engine_and_refuses_others(tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text("model: {source: m, engine_kwargs: {base_url: 'http://h/v1'}}\n"
                 "input: {path: in.jsonl}\noutput: {path: out}\n")
    assert load_query_spec(str(f)).model.engine == "openai"
    f.write_text("model: {source: m, engine: vllm}\ninput: {path: in.jsonl}\noutput: {path: out}\n")
    with pytest.raises(SpecError, match=r"sets model.engine: vllm; .*Run this spec with `fleetllm run"):
        load_query_spec(str(f))


def test_example_query_yaml_loads():
    s = load_query_spec(str(ROOT / "examples" / "query.yaml"))
    assert s.model.engine == "openai" and s.model.source == "smollm2"
    assert window_warnings(s) == []
