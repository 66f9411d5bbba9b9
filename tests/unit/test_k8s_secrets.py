"""`fleetllm k8s render` of a job and a serve spec holding Kubernetes Secret references and literal
secrets: no secret value in any rendered file but the `Secret`; every secret reaches the head and
worker containers through `secretKeyRef`; the manifests still validate against the KubeRay CRDs."""

from __future__ import annotations


import pytest
import yaml
from test_cluster_k8s import CRD_DIR, validate

from fleetllm.cli import main

LITERALS = {"HF_TOKEN": "hf_LiteralJobToken123", "AWS_ACCESS_KEY_ID": "AKIALITERALKEYID",
            "OPENAI_API_KEY": "sk-job-literal-456", "FLEETLLM_API_KEY": "sk-serve-literal-789",
            "WANDB_API_KEY": "wandb-literal-000", "DB_PASSWORD": "pa55-literal"}
AWS_REF = {"secretKeyRef": {"name": "aws-creds", "key": "secret_access_key"}}
HF_REF = {"secretKeyRef": {"name": "hf", "key": "token"}}
PLAIN = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # not secret: stay in the runtime env

JOB = {"name": "secret-job",
       "model": {"source": "gpt-4o-mini", "engine": "openai",
                 "engine_kwargs": {"base_url": "https://api.example/v1", "api_key": LITERALS["OPENAI_API_KEY"]}},
       "input": {"path": "s3://bkt/in.jsonl"}, "prompt": {"template": "{q}"}, "output": {"path": "s3://bkt/out"},
       "compute": {"replicas": 2},
       "environment": {"env_vars": {"HF_TOKEN": LITERALS["HF_TOKEN"], "AWS_ACCESS_KEY_ID": LITERALS["AWS_ACCESS_KEY_ID"],
                                    "AWS_SECRET_ACCESS_KEY": AWS_REF, **PLAIN}}}
SERVE = {"name": "secret-serve", "api_key": LITERALS["FLEETLLM_API_KEY"],
         "models": [{"model_id": "a", "source": "smollm2-135m-instruct", "engine": "transformers"},
                    {"model_id": "b", "source": "smollm2-135m-instruct", "engine": "transformers"}],
         "environment": {"env_vars": {"HF_TOKEN": HF_REF, "WANDB_API_KEY": LITERALS["WANDB_API_KEY"],
                                      "DB_PASSWORD": LITERALS["DB_PASSWORD"], **PLAIN}}}


def render(tmp_path, spec: dict, *flags: str, capsys) -> tuple[dict[str, str], str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / ("out" + "".join(flags))
    assert main(["k8s", "render", str(path), "-o", str(out), *flags]) == 0
    return {p.name: p.read_text() for p in sorted(out.iterdir())}, capsys.readouterr().err


def pod_containers(manifest: dict) -> list[dict]:
    """Every head and worker container of a RayJob, RayService or RayClusterFleet."""
    spec = manifest["spec"]
    cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec.get("template", {}).get("spec")
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def refs(box: dict) -> dict[str, dict]:
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in box.get("env", []) if "valueFrom" in e}


def check(files: dict[str, str], name: str, moved: dict[str, str], referenced: dict[str, dict]) -> None:
    secret_file = f"secret-{name}-secrets.yaml"
    for fname, text in files.items():  # no secret value in any file but the Secret
        for value in moved.values():
            assert (value in text) == (fname == secret_file), (fname, value)
    secret = yaml.safe_load(files[secret_file])
    assert secret["kind"] == "Secret" and secret["stringData"] == moved
    manifests = [yaml.safe_load(t) for f, t in files.items() if f != secret_file]
    clusters = [m for m in manifests if m["kind"] in ("RayJob", "RayService", "RayClusterFleet")]
    assert clusters
    want = {**{k: {"name": f"{name}-secrets", "key": k} for k in moved}, **referenced}
    for manifest in clusters:
        for box in pod_containers(manifest):
            assert {k: v for k, v in refs(box).items() if k != "RAY_AUTH_TOKEN"} == want
        if CRD_DIR.is_dir():
            validate(manifest)
    for manifest in manifests:  # the specs and runtime envs keep the plain variables, never the secret ones
        text = yaml.safe_dump(manifest)
        if manifest["kind"] in ("ConfigMap", "RayJob", "RayService"):
            assert "HF_HUB_OFFLINE" in text and "TOKENIZERS_PARALLELISM" in text


def test_a_job_renders_its_secrets_into_a_secret_only(tmp_path, capsys):
    files, err = render(tmp_path, JOB, capsys=capsys)
    moved = {k: LITERALS[k] for k in ("HF_TOKEN", "AWS_ACCESS_KEY_ID", "OPENAI_API_KEY")}
    check(files, "secret-job", moved, {"AWS_SECRET_ACCESS_KEY": AWS_REF["secretKeyRef"]})
    assert "AWS_ACCESS_KEY_ID, HF_TOKEN, OPENAI_API_KEY written only into the Secret 'secret-job-secrets'" in err
    job_yaml = yaml.safe_load(yaml.safe_load(files["configmap-secret-job-spec.yaml"])["data"]["job.yaml"])
    assert job_yaml["environment"]["env_vars"]["HF_TOKEN"] == {
        "secretKeyRef": {"name": "secret-job-secrets", "key": "HF_TOKEN"}}
    assert job_yaml["model"]["engine_kwargs"] == {"base_url": "https://api.example/v1", "api_key_env": "OPENAI_API_KEY"}
    runtime_env = yaml.safe_load(yaml.safe_load(files["rayjob-secret-job.yaml"])["spec"]["runtimeEnvYAML"])
    assert runtime_env["env_vars"] == PLAIN


@pytest.mark.parametrize("fleet", [False, True])
def test_a_serve_spec_renders_its_secrets_into_a_secret_only(tmp_path, capsys, fleet):
    files, err = render(tmp_path, SERVE, *(["--fleet"] if fleet else []), capsys=capsys)
    moved = {k: LITERALS[k] for k in ("WANDB_API_KEY", "DB_PASSWORD", "FLEETLLM_API_KEY")}
    check(files, "secret-serve", moved, {"HF_TOKEN": HF_REF["secretKeyRef"]})
    assert "written only into the Secret 'secret-serve-secrets'" in err
    if not fleet:
        config = yaml.safe_load(yaml.safe_load(files["rayservice-secret-serve.yaml"])["spec"]["serveConfigV2"])
        app = config["applications"][0]
        assert app["runtime_env"]["env_vars"] == PLAIN
        assert app["args"]["spec"]["api_key"] == {"secretKeyRef": {"name": "secret-serve-secrets",
                                                                   "key": "FLEETLLM_API_KEY"}}


def test_references_alone_need_no_secret_manifest(tmp_path, capsys):
    spec = {**SERVE, "api_key": {"secretKeyRef": {"name": "serve-key", "key": "key"}},
            "environment": {"env_vars": {"HF_TOKEN": HF_REF, **PLAIN}}}
    files, err = render(tmp_path, spec, capsys=capsys)
    assert not [f for f in files if f.startswith("secret-")] and "Secret" not in err
    service = yaml.safe_load(files["rayservice-secret-serve.yaml"])
    for box in pod_containers(service):
        assert refs(box) == {"HF_TOKEN": HF_REF["secretKeyRef"], "FLEETLLM_API_KEY": {"name": "serve-key", "key": "key"}}
    if CRD_DIR.is_dir():
        validate(service)


def test_a_malformed_reference_is_refused(tmp_path, capsys):
    spec = {**SERVE, "environment": {"env_vars": {"HF_TOKEN": {"secretKeyRef": {"name": "Bad_Name", "key": "t"}}}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["k8s", "render", str(path), "-o", str(tmp_path / "o")]) == 2
    assert "is not a Kubernetes name" in capsys.readouterr().err


def test_a_local_run_needs_the_variables_its_secret_references_name(monkeypatch):
    from fleetllm.environment import EnvironmentSpec
    from fleetllm.errors import SpecError

    env = EnvironmentSpec(env_vars={"HF_TOKEN": HF_REF, **PLAIN})
    assert env.runtime_env() == {"env_vars": PLAIN}  # the reference is the environment's own variable
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(SpecError, match=r"HF_TOKEN \(Secret 'hf', key 'token'\).*set HF_TOKEN in this environment"):
        env.check_refs_set()
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    env.check_refs_set()
