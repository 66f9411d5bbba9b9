"""An api_key no client can send (spaces around it, non-ASCII) is refused when the server starts,
naming the fix, instead of a server that answers 401 to everyone; a Secret reference reads
$FLEETLLM_API_KEY."""

from __future__ import annotations

import pytest
import yaml

from fleetllm.cli import main
from fleetllm.errors import SpecError
from fleetllm.serve.spec import ServeSpec

MODELS = [{"model_id": "m", "source": "smollm2-135m-instruct", "engine": "transformers"}]


def serve_yaml(tmp_path, **fields) -> str:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"models": MODELS, **fields}, allow_unicode=True))
    return str(path)


@pytest.mark.parametrize("key, words", [
    (" sk-123", "spaces around it"),
    ("sk-123\n", "spaces around it"),
    ("clé-123", "'é'"),
    ("sk 123", "' '"),
    ("", "is empty"),
])
def test_an_unusable_api_key_is_refused_at_start(tmp_path, capsys, monkeypatch, key, words):
    monkeypatch.delenv("FLEETLLM_API_KEY", raising=False)
    assert main(["serve", serve_yaml(tmp_path, api_key=key), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "api_key" in err and words in err


@pytest.mark.parametrize("key", [" sk-123", "clé"])
def test_an_unusable_key_in_the_environment_is_refused_at_start(tmp_path, capsys, monkeypatch, key):
    monkeypatch.setenv("FLEETLLM_API_KEY", key)
    assert main(["serve", serve_yaml(tmp_path), "--dry-run"]) == 2
    assert "$FLEETLLM_API_KEY" in capsys.readouterr().err


def test_a_usable_key_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLEETLLM_API_KEY", raising=False)
    assert main(["serve", serve_yaml(tmp_path, api_key="sk-Abc_123.~+/="), "--dry-run"]) == 0
    assert "api key: required" in capsys.readouterr().out


def test_a_secret_reference_reads_the_variable_its_pods_get(monkeypatch):
    spec = ServeSpec.model_validate({"models": MODELS, "api_key": {"secretKeyRef": {"name": "serve-key", "key": "k"}}})
    monkeypatch.delenv("FLEETLLM_API_KEY", raising=False)
    with pytest.raises(SpecError, match="Secret 'serve-key'.*set \\$FLEETLLM_API_KEY"):
        spec.effective_api_key()
    monkeypatch.setenv("FLEETLLM_API_KEY", "sk-from-secret")
    assert spec.effective_api_key() == "sk-from-secret"


def test_build_openai_app_refuses_an_unusable_key():
    from fleetllm.serve import build_openai_app

    cfg = {"model_loading_config": {"model_id": "m", "model_source": "smollm2-135m-instruct"}, "engine": "transformers"}
    with pytest.raises(SpecError, match="spaces around it"):
        build_openai_app({"llm_configs": [cfg], "api_key": "sk-1 "})
