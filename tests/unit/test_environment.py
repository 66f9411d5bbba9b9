"""`environment:` in job and serve specs: Ray's runtime_env, the dry-run plan, the k8s manifests."""

import pytest
import yaml

from fleetllm.cluster.k8s import render_spec_file
from fleetllm.cluster.k8s_pods import RenderOptions
from fleetllm.errors import SpecError
from fleetllm.serve.run import plan_lines
from fleetllm.serve.spec import ServeSpec
from fleetllm.spec import JobSpec, parse_spec

ENV = {"pip": ["datasets>=3", "emoji==2.14.0"], "env_vars": {"HF_HUB_OFFLINE": 1, "MODE": "batch"},
       "working_dir": "s3://bucket/code.zip"}
JOB = {"name": "envjob", "input": {"path": "s3://b/in.jsonl"}, "output": {"path": "s3://b/out"},
       "prompt": {"template": "{q}"}, "environment": ENV}
SERVE = {"name": "envserve", "models": [{"model_id": "m", "source": "smollm2-135m-instruct"}], "environment": ENV}
RUNTIME_ENV = {"pip": ["datasets>=3", "emoji==2.14.0"], "env_vars": {"HF_HUB_OFFLINE": "1", "MODE": "batch"},
               "working_dir": "s3://bucket/code.zip"}


def test_the_environment_is_rays_runtime_env():
    assert JobSpec.model_validate(JOB).environment.runtime_env() == RUNTIME_ENV
    assert JobSpec.model_validate({**JOB, "environment": {}}).environment.runtime_env() is None


def test_bad_environments_name_the_fix():
    with pytest.raises(SpecError, match="environment.env_vars.*must be text"):
        parse_spec(JobSpec, {**JOB, "environment": {"env_vars": {"A": {"b": 1}}}})
    with pytest.raises(SpecError, match="environment.pip: unknown field|environment.conda: unknown field"):
        parse_spec(JobSpec, {**JOB, "environment": {"conda": "x"}})
    with pytest.raises(SpecError, match="is not a folder"):
        JobSpec.model_validate({**JOB, "environment": {"working_dir": "/no/such/dir"}}).environment.check_local()


def test_serve_replicas_get_the_runtime_env_and_the_plan_says_so():
    spec = ServeSpec.model_validate(SERVE)
    for cfg in spec.llm_configs():
        assert cfg.deployment_options()["ray_actor_options"]["runtime_env"] == RUNTIME_ENV
    assert any(line.startswith("environment: pip ['datasets>=3'") for line in plan_lines(spec, "h", 1))


def test_k8s_manifests_carry_the_environment(tmp_path):
    opts = RenderOptions(image="registry.example/fleetllm:test", namespace="llm")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    rayjob = [m for m in render_spec_file(job, opts) if m["kind"] == "RayJob"][0]
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]) == RUNTIME_ENV
    serve = tmp_path / "serve.yaml"
    serve.write_text(yaml.safe_dump(SERVE))
    service = [m for m in render_spec_file(serve, opts) if m["kind"] == "RayService"][0]
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    assert app["runtime_env"] == RUNTIME_ENV
    assert app["args"]["spec"]["environment"]["pip"] == ENV["pip"]
