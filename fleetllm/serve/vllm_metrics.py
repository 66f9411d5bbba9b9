"""Serving metrics under vLLM's names and labels (`vllm:num_requests_waiting`, `vllm:time_to_first_token_seconds`,
... labelled `model_name`), the names vLLM's Grafana dashboard, llm-d, AIBrix and KEDA recipes read.

Where the engine is vLLM they are vLLM's own: its PrometheusStatLogger records them in the replica (serving
keeps vLLM's statistics on) and `replica_snapshot` reads them from vLLM's registry. The transformers engine
gets the same names from `EngineMetrics`, recorded by the replica's ModelServer per request. Each replica
publishes its snapshot (Prometheus text) to Ray's key-value store every PUBLISH_S seconds; `/metrics` merges
every live replica's snapshot of each model (counters, gauges and histogram buckets summed: the whole
deployment, as Ray's metrics agent aggregates Ray Serve's) with `model_name` set to the served model id.
Without Ray (LocalBackend, tests) the one replica's snapshot is the model's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable

PUBLISH_S = 2.0  # how often a replica publishes its snapshot
STALE_S = 15.0  # a snapshot older than this is a replica that is gone
KV_NAMESPACE = "fleetllm_metrics"
log = logging.getLogger("fleetllm.serve.metrics")

# vLLM's buckets (vllm/v1/metrics/loggers.py), so that histogram_quantile reads the same way
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class EngineMetrics:
    """vLLM's serving metrics for an engine that does not keep them itself (transformers), one replica."""

    def __init__(self, model_name: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab,
                             registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lab,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               lab + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lab, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             lab, buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", lab, buckets=ITL_BUCKETS,
                              registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             lab, buckets=LATENCY_BUCKETS, registry=r)
        self.req_prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lab,
                                    buckets=TOKEN_BUCKETS, registry=r)
        self.req_generation = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                        lab, buckets=TOKEN_BUCKETS, registry=r)

    def request(self, started: float, first_token: float | None, ended: float, prompt_tokens: int,
                generated_tokens: int, finish_reason: str | None) -> None:
        """One finished request (monotonic times); a request without a finish reason (failed, cancelled) counts
        only its tokens, as vLLM's request_success counts finished ones."""
        m = self.model_name
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(generated_tokens)
        if first_token is not None:
            self.ttft.labels(m).observe(first_token - started)
        if finish_reason is None:
            return
        self.success.labels(m, finish_reason).inc()
        self.e2e.labels(m).observe(ended - started)
        self.req_prompt.labels(m).observe(prompt_tokens)
        self.req_generation.labels(m).observe(generated_tokens)
        if first_token is not None and generated_tokens > 1:
            per_token = (ended - first_token) / (generated_tokens - 1)
            self.tpot.labels(m).observe(per_token)
            itl = self.itl.labels(m)
            for _ in range(generated_tokens - 1):  # one observation per token after the first, as vLLM's
                itl.observe(per_token)

    def snapshot(self, running: int, waiting: int) -> str:
        from prometheus_client import generate_latest

        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)
        return generate_latest(self.registry).decode()


def vllm_own_snapshot() -> str:
    """vLLM's own `vllm:` metrics in this process (its PrometheusStatLogger's registry)."""
    from prometheus_client import generate_latest
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    registry = get_prometheus_registry()

    class Only:  # the vllm: families of the process's registry
        def collect(self):
            return (fam for fam in registry.collect() if fam.name.startswith("vllm:"))

    return generate_latest(Only()).decode()


def merge(snapshots: list[str], model_name: str) -> list[Any]:
    """Metric families summing every snapshot's samples by name and labels, `model_name` set to the served id."""
    from prometheus_client.core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    for text in snapshots:
        for fam in text_string_to_metric_families(text):
            families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
            for s in fam.samples:
                if s.name.endswith("_created"):  # creation times: not summed
                    continue
                labels = {**s.labels, "model_name": model_name}
                sums[fam.name][(s.name, tuple(sorted(labels.items())))] += s.value
    out = []
    for name, fam in families.items():
        for (sample, labels), value in sums[name].items():
            if name.endswith("_perc"):  # a share (kv_cache_usage_perc): the replicas' mean, not their sum
                value /= len(snapshots)
            fam.add_sample(sample, dict(labels), value)
        out.append(fam)
    return out


class Publisher:
    """Publishes one replica's snapshot to Ray's key-value store every PUBLISH_S seconds (a daemon thread)."""

    def __init__(self, model_id: str, replica_id: str, snapshot: Callable[[], str]) -> None:
        self.key = f"{model_id}\x00{replica_id}".encode()
        self.snapshot = snapshot
        threading.Thread(target=self._loop, name="fleetllm-metrics", daemon=True).start()

    def _loop(self) -> None:
        from ray.experimental import internal_kv

        while True:
            try:
                value = json.dumps({"t": time.time(), "text": self.snapshot()}).encode()
                internal_kv._internal_kv_put(self.key, value, overwrite=True, namespace=KV_NAMESPACE)
            except Exception as exc:  # noqa: BLE001 - metrics never stop serving
                log.debug("metrics snapshot not published: %s", exc)
            time.sleep(PUBLISH_S)


def gather(model_id: str) -> list[str] | None:
    """Every live replica's published snapshot of a model; None without Ray (or none published yet)."""
    import ray

    if not ray.is_initialized():
        return None
    from ray.experimental import internal_kv

    prefix = f"{model_id}\x00".encode()
    keys = internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE)
    texts = []
    for key in keys:
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw is None:
            continue
        entry = json.loads(raw)
        if time.time() - entry["t"] < STALE_S:
            texts.append(entry["text"])
        else:
            internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    return texts or None


def replica_stats(stats: dict[str, Any]) -> tuple[int, int]:
    """(running, waiting) of a replica's stats dict (ModelServer.stats)."""
    return int(stats.get("running", stats.get("ongoing", 0))), int(stats.get("queued", 0))
