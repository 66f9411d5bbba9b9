"""`fleetllm report`: the page drawn from an output folder's run record (_SUCCESS, or an older run.json), manifest and data files."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetllm.errors import InputError
from fleetllm.report.data import error_kind, load
from fleetllm.report.html import write_report


def make_output(root, record="_SUCCESS"):
    (root / "_fleetllm").mkdir(parents=True)
    rows = [{"row_id": f"r{i}", "num_input_tokens": 20 + i, "num_generated_tokens": 5 + i % 3,
             "error": None} for i in range(6)]
    rows[4]["error"] = "prompt.template needs column 'x', which this row lacks (columns present: ['y'])"
    rows[5]["error"] = "prompt has 4100 tokens; the model's context is 2048"
    pq.write_table(pa.Table.from_pylist(rows[:3]), root / "part-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[3:]), root / "part-00001.parquet")
    common = {"input_tokens": 0, "output_tokens": 0, "fingerprint": "f"}  # a legacy manifest (commit.py reads it)
    manifest = [{"shard": 0, "file": "part-00000.parquet", "rows": 3, "errors": 0, "nodes": ["n1"], **common},
                {"shard": 1, "file": "part-00001.parquet", "rows": 3, "errors": 2, "nodes": ["n2"], **common}]
    (root / "_fleetllm" / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest) + '{"torn')
    run = {"name": "t", "rows": 6, "errors": 2, "error_rate": 2 / 6, "complete": True,
           "series": {"commits": {"points": [[3.0, 3, 15, 0, 60], [5.0, 3, 14, 2, 70]]},
                      "replicas": [{"replica": 0, "node": "n1", "ready_s": 1.0, "rows": 3},
                                   {"replica": 1, "node": "n2", "ready_s": 1.2, "rows": 3}],
                      "time_split_s": {"start_up": 1.0, "generation": 3.5, "commit": 0.5, "other": 0.2}}}
    (root / record).write_text(json.dumps(run))


@pytest.mark.parametrize("record", ["_SUCCESS", "run.json"])  # run.json: a folder of an earlier version
def test_report_has_every_chart_and_the_errors_by_kind(tmp_path, record):
    make_output(tmp_path, record)
    data = load(str(tmp_path))
    assert data.input_tokens == [20, 21, 22, 23, 24, 25] and len(data.output_tokens) == 4
    assert data.node_rows == {"n1": 3, "n2": 3}
    write_report(str(tmp_path))
    page = (tmp_path / "_fleetllm" / "report.html").read_text()
    assert re.findall(r'data-chart="([^"]+)"><svg', page) == [
        "Throughput", "Time split", "Input tokens", "Output tokens", "Replicas", "Nodes"]
    assert "<code>r4</code>" in page and "<code>r5</code>" in page
    assert not re.search(r"<script|<link|<img|src=|@import", page)  # one self-contained file


def test_error_kinds_mask_values():
    assert error_kind("prompt has 4100 tokens; the model's context is 2048") == \
        error_kind("prompt has 9 tokens; the model's context is 8")
    assert error_kind("engine error after 3 attempts: boom") == "engine error after N attempts"


def test_a_folder_without_a_run_says_what_to_give(tmp_path):
    with pytest.raises(InputError, match=r"no run record \(_SUCCESS"):
        load(str(tmp_path))
