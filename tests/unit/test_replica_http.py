"""serve.yaml's `http` (fleetllm.serve.replica_http): who listens on the app's address, and the errors naming why
`http: replica` cannot apply. The served path itself: tests/e2e/test_serve_cli.py."""

from __future__ import annotations

import pytest

from fleetllm.serve.replica_http import choose_http, free_port, replica_env
from fleetllm.serve.spec import ServeSpec

ONE = {"name": "x", "models": [{"model_id": "a"}]}


def test_auto_takes_the_replica_for_one_model_on_one_replica_on_a_ray_started_here():
    spec = ServeSpec.model_validate(ONE)
    assert spec.http == "auto"
    assert choose_http("auto", "direct", spec.models, ray_here=True)[0] == "replica"
    http, why = choose_http("auto", "direct", spec.models, ray_here=False)
    assert http == "proxy" and "joins a running Ray cluster" in why
    assert choose_http("proxy", "direct", spec.models, ray_here=True) == ("proxy", "as `http: proxy` asks")


def test_replica_is_refused_where_it_cannot_apply_naming_why():
    with pytest.raises(ValueError, match="http: replica cannot serve this app: model a runs several replicas"):
        ServeSpec.model_validate({**ONE, "http": "replica", "models": [{"model_id": "a", "replicas": 2}]})
    with pytest.raises(ValueError, match="separate ingress .*use http: auto or proxy"):
        ServeSpec.model_validate({"name": "x", "http": "replica", "models": [{"model_id": "a"}, {"model_id": "b"}]})
    auto = ServeSpec.model_validate({**ONE, "models": [{"model_id": "a", "autoscaling": {"max_replicas": 2}}]})
    assert choose_http("auto", "direct", auto.models, ray_here=True)[0] == "proxy"
    spec = ServeSpec.model_validate({**ONE, "http": "replica", "cluster": {"address": "ray://10.0.0.1:10001"}})
    from fleetllm.errors import PlanError
    from fleetllm.serve.run import http_choice

    with pytest.raises(PlanError, match="joins a running Ray cluster"):
        http_choice(spec)


def test_the_replicas_environment_narrows_the_port_range_to_the_apps_port():
    env = replica_env(8000)
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1" and env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    # Serve's allocator hands out range(MIN, MAX): exactly the app's port
    assert list(range(int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
                      int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]))) == [8000]
    assert 0 < free_port("127.0.0.1") < 65536
