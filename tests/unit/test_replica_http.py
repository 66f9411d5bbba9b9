"""serve.yaml's `http` (fleetllm.serve.replica_http): who listens on the app's address, and the errors naming why
`http: replica` cannot apply. The served path itself: tests/e2e/test_serve_cli.py."""

from __future__ import annotations

import pytest

from fleetllm.serve.replica_http import bind, choose_http, free_port
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


def test_the_replicas_socket_takes_a_port_left_in_time_wait_at_once():
    """A replica started again after its engine died binds the port its predecessor's connections still hold in
    TIME_WAIT (SO_REUSEADDR, as uvicorn's own socket); a port another socket listens on is refused, naming it."""
    import socket

    first = bind("127.0.0.1", 0)
    port = first.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    first.setblocking(True)
    accepted, _ = first.accept()
    accepted.close()  # the server closes first: its side waits in TIME_WAIT
    first.close()
    client.close()
    again = bind("127.0.0.1", port, wait_s=0)
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}.*http: proxy"):
        bind("127.0.0.1", port, wait_s=0)
    again.close()
    assert 0 < free_port("127.0.0.1") < 65536
