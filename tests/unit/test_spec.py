from pathlib import Path

import pytest

from fleetllm.errors import SpecError
from fleetllm.spec import JobSpec, load_job_spec, parse_spec, template_fields

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_example_loads():
    spec = load_job_spec(ROOT / "examples" / "quickstart.yaml")
    assert spec.model.source == "smollm2-135m-instruct"
    assert spec.prompt.template == "{instruction}"
    assert spec.sampling.as_params()["max_tokens"] == 64


def test_unknown_field_names_its_path(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("input: {path: x.jsonl}\noutput: {path: out}\nsampling: {max_tokns: 5}\n")
    with pytest.raises(SpecError) as exc:
        load_job_spec(f)
    assert "sampling.max_tokns: unknown field" in str(exc.value)


def test_invalid_yaml_is_reported(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("input: {path: x.jsonl\noutput: [\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_job_spec(f)


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_job_spec(tmp_path / "nope.yaml")


def test_missing_required_section():
    with pytest.raises(SpecError, match="output: required field is missing"):
        parse_spec(JobSpec, {"input": {"path": "x.jsonl"}})


@pytest.mark.parametrize("bad, where", [
    ({"sampling": {"max_tokens": -1}}, "sampling.max_tokens"),
    ({"sampling": {"temperature": -0.5}}, "sampling.temperature"),
    ({"compute": {"replicas": 0}}, "compute.replicas"),
    ({"prompt": {"template": "{0} and {}"}}, "prompt.template"),
    ({"prompt": {"template": "{unclosed"}}, "prompt.template"),
])
def test_bad_values_name_the_field(bad, where):
    data = {"input": {"path": "x.jsonl"}, "output": {"path": "out"}, **bad}
    with pytest.raises(SpecError, match=where.replace(".", r"\.")):
        parse_spec(JobSpec, data)


def test_template_fields():
    assert template_fields("Q: {question}\nContext: {context} {question}") == ["question", "context"]
    assert template_fields("no fields, literal {{braces}}") == []


def test_extra_sampling_options_pass_through():
    spec = parse_spec(JobSpec, {"input": {"path": "x"}, "output": {"path": "o"},
                                "sampling": {"max_tokens": 8, "extra": {"ignore_eos": True, "min_tokens": 8}}})
    assert spec.sampling.as_params() == {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "n": 1,
                                         "ignore_eos": True, "min_tokens": 8}
