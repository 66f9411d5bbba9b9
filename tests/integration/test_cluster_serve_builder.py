"""The RayService's serveConfigV2 names a real Ray Serve application builder: Ray Serve's own loader
imports it and builds the fleetllm app from the rendered args (the path `serve deploy` takes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetllm.cluster.k8s import render_spec_file
from fleetllm.cluster.k8s_pods import RenderOptions
from fleetllm.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]


def rendered_app() -> dict:
    rayservice, _, _ = render_spec_file(ROOT / "examples" / "serve.yaml", RenderOptions(image="img:1"))
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    return app


def test_serve_config_import_path_builds_the_openai_app():
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.deployment import Application
    from ray._common.utils import import_attr

    app = rendered_app()
    built = call_user_app_builder_with_args_if_necessary(import_attr(app["import_path"]), app["args"])
    assert isinstance(built, Application)
    ingress = built._bound_deployment
    assert ingress.name == "OpenAIIngress"
    handles = ingress.init_args[0]
    assert list(handles) == ["smollm2", "minilm"]
    assert handles["smollm2"]._bound_deployment.name == "LLMServer-smollm2"


def test_builder_refuses_a_bad_spec_with_servespec_errors():
    from fleetllm.cluster.serve_adapter import app_from_spec

    app = rendered_app()
    app["args"]["spec"]["models"][0]["replica"] = 2
    with pytest.raises(SpecError, match="models.0.replica: unknown field"):
        app_from_spec(app["args"])
    with pytest.raises(SpecError, match="spec"):
        app_from_spec({"config": {}})
