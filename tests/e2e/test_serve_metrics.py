"""/metrics of a served model under vLLM's names and labels: what vLLM's Grafana dashboard, llm-d, AIBrix and
KEDA read, from vLLM itself on engine: vllm and the same names on engine: transformers (the shared apps of
tests/conftest.py), fleetllm's own counters beside them."""

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

# the series a vLLM dashboard reads (vLLM's Grafana dashboard, KEDA's vllm:num_requests_waiting trigger)
DASHBOARD = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:time_to_first_token_seconds_bucket",
             "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
             "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:request_success_total")


def scrape(url: str) -> dict[str, float]:
    """{sample name: value summed over its series} of the samples labelled model_name="smollm2"; the
    fleetllm_* ones by their model label."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("model_name", s.labels.get("model")) == "smollm2":
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def ask(url: str) -> int:
    """One plain and one streamed chat; the generated tokens they report."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    msgs = [{"role": "user", "content": "Name three colours."}]
    plain = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    return plain.usage.completion_tokens + chunks[-1].usage.completion_tokens


def test_metrics_carry_vllm_names_labelled_model_name(served_smollm2):
    check_metrics(served_smollm2.url, vllm=False)


@pytest.mark.vllm
def test_metrics_carry_vllm_names_labelled_model_name_on_vllm(served_smollm2_vllm):
    check_metrics(served_smollm2_vllm.url, vllm=True)


def check_metrics(url: str, vllm: bool) -> None:
    """(The shared apps are named as fixtures, not looked up by name: tests/conftest.py orders the modules that
    use them by their fixture names and stops each app after its last user.)"""
    before = scrape(url)
    generated = ask(url)
    deadline = time.monotonic() + 30  # replicas publish their snapshot every 2 s
    while True:
        after = scrape(url)
        done = after.get("vllm:request_success_total", 0) - before.get("vllm:request_success_total", 0)
        if done >= 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert done == 2
    missing = [name for name in DASHBOARD if name not in after]
    assert not missing, f"/metrics lacks {missing}"
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == generated
    assert after["vllm:prompt_tokens_total"] > before.get("vllm:prompt_tokens_total", 0)
    assert after["vllm:e2e_request_latency_seconds_count"] - before.get("vllm:e2e_request_latency_seconds_count",
                                                                        0) == 2
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    assert after["fleetllm_requests_total"] > 0  # fleetllm's own counters beside them
    if vllm:  # vLLM's own statistics, its KV cache among them
        assert "vllm:kv_cache_usage_perc" in after and "vllm:prefix_cache_queries_total" in after
