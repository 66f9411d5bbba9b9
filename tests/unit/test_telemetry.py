"""The replica's telemetry is one struct column, `_run`, stamped once per engine call and read by the driver."""

from __future__ import annotations

from fleetllm.batch.execution.stages import INTERNAL_COLUMNS, table_from_rows
from fleetllm.batch.execution.telemetry import FIELDS, RUN, run_field, stamp
from fleetllm.batch.planning.input_names import kept_name
from fleetllm.batch.reports.run_series import RunSeries
from fleetllm.estimate.observe import group_calls


def _rows():
    first, second = stamp("node-a", "r1", 10.0, 11.0, 12.0), stamp("node-b", "r2", 10.5, 11.5, 13.0)
    return [{"_line": k, "num_input_tokens": 5, "num_generated_tokens": 3, "_run": run}
            for k, run in enumerate([first, first, second])]


def test_one_struct_column_with_the_replicas_fields():
    table = table_from_rows(_rows())
    assert [f.name for f in table.schema.field(RUN).type] == list(FIELDS)
    assert run_field(table, "started") == [11.0, 11.0, 11.5]
    assert run_field(table, "node") == ["node-a", "node-a", "node-b"]
    assert run_field(table.drop_columns([RUN]), "started") == []  # rows that never reached an engine
    former = {"_node", "_replica", "_ready", "_started", "_finished"}
    assert RUN in INTERNAL_COLUMNS and not former & set(INTERNAL_COLUMNS)


def test_the_driver_reads_replicas_and_calls_from_it():
    table = table_from_rows(_rows())
    series = RunSeries(t0=9.0)
    series.batch(table)
    assert [(r["node"], r["ready_s"], r["rows"]) for r in series.as_dict(10.0, 5.0, 6.0)["replicas"]] == [
        ("node-a", 1.0, 2), ("node-b", 1.5, 1)]
    calls = group_calls(table.to_pylist())
    assert [(c.replica, c.started, c.finished, len(c.rows)) for c in calls] == [
        ("r1", 11.0, 12.0, 2), ("r2", 11.5, 13.0, 1)]


def test_the_former_names_stay_reserved_input_names():
    for name in ("_node", "_replica", "_ready", "_started", "_finished", "_src_file", "_src_line", RUN, "_source_line"):
        assert kept_name(name) == "input_" + name
