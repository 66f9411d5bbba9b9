"""Prometheus metrics of the OpenAI server (prometheus_client, one registry per app): vLLM's names (`vllm:*`,
label `model_name`, merged across replicas: fleetllm.serve.vllm_metrics) beside fleetllm's own (`fleetllm_*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RequestMetrics:
    """The per-request series of one kind of traffic (interactive, or Batch API rows)."""

    requests: Any
    prompt_tokens: Any
    output_tokens: Any
    ttft: Any
    latency: Any
    in_flight: Any


class ServeMetrics:
    """Request counters and latencies recorded by the API; engine gauges filled in at scrape time."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("fleetllm_requests", "Requests by model, endpoint and HTTP status.",
                                ["model", "endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("fleetllm_prompt_tokens", "Prompt tokens of served requests.", ["model"],
                                     registry=r)
        self.output_tokens = Counter("fleetllm_output_tokens", "Generated tokens sent to clients.", ["model"],
                                     registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.ttft = Histogram("fleetllm_time_to_first_token_seconds", "Time from request to first token.",
                              ["model"], buckets=buckets, registry=r)
        self.latency = Histogram("fleetllm_request_latency_seconds", "Time from request to last token.",
                                 ["model"], buckets=buckets, registry=r)
        self.in_flight = Gauge("fleetllm_requests_in_flight", "Requests admitted by the API and not finished.",
                               ["model"], registry=r)
        self.running = Gauge("fleetllm_requests_running", "Requests in an engine batch (sampled replica).",
                             ["model"], registry=r)
        self.queued = Gauge("fleetllm_requests_queued", "Requests waiting for an engine batch (sampled replica).",
                            ["model"], registry=r)
        self.engine_tokens = Gauge("fleetllm_engine_generated_tokens",
                                   "Tokens the engine generated, cancelled requests included (sampled replica).",
                                   ["model"], registry=r)
        self.engine_cancelled = Gauge("fleetllm_engine_cancelled_requests",
                                      "Requests the engine stopped because the client went away (sampled replica).",
                                      ["model"], registry=r)
        self.interactive = RequestMetrics(self.requests, self.prompt_tokens, self.output_tokens, self.ttft,
                                          self.latency, self.in_flight)
        self.batch = RequestMetrics(  # Batch API rows (header x-fleetllm-batch), apart from interactive traffic
            Counter("fleetllm_batch_requests", "Batch API requests by model, endpoint and HTTP status (not in "
                    "fleetllm_requests).", ["model", "endpoint", "status"], registry=r),
            Counter("fleetllm_batch_prompt_tokens", "Prompt tokens of Batch API requests.", ["model"], registry=r),
            Counter("fleetllm_batch_output_tokens", "Generated tokens of Batch API requests.", ["model"], registry=r),
            Histogram("fleetllm_batch_time_to_first_token_seconds", "Batch API requests: time to first token.",
                      ["model"], buckets=buckets, registry=r),
            Histogram("fleetllm_batch_request_latency_seconds", "Batch API requests: time to last token.",
                      ["model"], buckets=buckets, registry=r),
            Gauge("fleetllm_batch_requests_in_flight", "Batch API requests admitted and not finished.", ["model"],
                  registry=r))
        self.batch_window = Gauge("fleetllm_batch_admission_window", "Batch API rows this API process lets into "
                                  "the engines at once (fleetllm.serve.batch_admission).", ["model"], registry=r)
        self.batch_waiting = Gauge("fleetllm_batch_admission_waiting", "Batch API rows held back by the admission "
                                   "window.", ["model"], registry=r)
        self.batch_rebaselines = Gauge("fleetllm_batch_admission_rebaselines", "Times the admission window's "
                                       "interactive-latency baseline was re-learned at its floor (since start).",
                                       ["model"], registry=r)
        self.vllm: dict[str, list[Any]] = {}  # model -> merged vLLM metric families (set_vllm)
        r.register(self)
        self.healthy = Gauge("fleetllm_model_healthy", "1 when the model's engine answers, else 0.", ["model"],
                             registry=r)

    def of(self, batch: bool) -> RequestMetrics:
        return self.batch if batch else self.interactive

    def set_engine(self, model: str, stats: dict[str, Any] | None) -> None:
        if stats is None:
            self.healthy.labels(model).set(0)
            return
        self.healthy.labels(model).set(1 if stats.get("healthy", True) else 0)
        self.running.labels(model).set(stats.get("running", stats.get("ongoing", 0)))
        self.queued.labels(model).set(stats.get("queued", 0))
        self.engine_tokens.labels(model).set(stats.get("generated_tokens", 0))
        self.engine_cancelled.labels(model).set(stats.get("cancelled_requests", 0))

    def set_vllm(self, model: str, snapshots: list[str] | None) -> None:
        """The model's `vllm:` metrics from its replicas' snapshots (None: keep the last ones)."""
        from fleetllm.serve.vllm_metrics import merge

        if snapshots:
            self.vllm[model] = merge(snapshots, model)

    def collect(self):  # the registry's custom collector: the merged vLLM families
        merged: dict[str, Any] = {}
        for families in self.vllm.values():
            for fam in families:
                if fam.name in merged:
                    merged[fam.name].samples.extend(fam.samples)
                else:
                    merged[fam.name] = type(fam)(fam.name, fam.documentation, fam.type)
                    merged[fam.name].samples = list(fam.samples)
        return list(merged.values())

    def describe(self):  # nothing at registration (the families come with the first scrape)
        return []

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
