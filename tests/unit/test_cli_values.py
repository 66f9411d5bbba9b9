"""Numeric flags are checked when the command line is parsed: nothing runs with a value out of range."""

import pytest
import yaml

from fleetllm.cli import main


@pytest.mark.parametrize("argv, problem", [
    (["run", "{job}", "--max-error-rate", "-0.5"], "between 0 and 1"),
    (["run", "{job}", "--max-error-rate", "nan"], "not a finite number"),
    (["query", "{job}", "--max-error-rate", "1.5"], "between 0 and 1"),
    (["run", "{job}", "--max-error-rate", "inf"], "not a finite number"),
    (["serve", "{job}", "--port", "70000"], "between 1 and 65535"),
    (["cluster", "wait", "--address", "127.0.0.1:9", "--timeout", "-1"], "above 0"),
    (["cluster", "wait", "--address", "127.0.0.1:9", "--timeout", "1", "--cpus", "-2"], "at least 0"),
    (["k8s", "render", "{job}", "--output", "{tmp}/k8s", "--replicas", "0"], "at least 1"),
])
def test_a_numeric_flag_out_of_range_is_refused_before_anything_runs(tmp_path, capsys, argv, problem):
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"model": {"source": "no-such-model"}, "input": {"path": str(tmp_path / "in.jsonl")},
                                   "prompt": {"template": "{q}"}, "output": {"path": str(out)}}))
    with pytest.raises(SystemExit) as stop:
        main([a.replace("{job}", str(job)).replace("{tmp}", str(tmp_path)) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert problem in err and argv[-2] in err
    assert not (tmp_path / "k8s").exists()
    assert not out.exists()  # refused at parse time: no folder, no run


def test_values_in_range_parse():
    from fleetllm.cli import build_parser

    args = build_parser().parse_args(["run", "job.yaml", "--max-error-rate", "0.05"])
    assert args.max_error_rate == 0.05
