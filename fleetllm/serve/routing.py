"""Prefix-affine request routing across a model's replicas (serve.yaml `routing: prefix_affinity`).

Requests that share a prompt prefix (a conversation's turns, few-shot prompts with one preamble) go to
the replica that served that prefix before, so its engine finds the prefix in its KV cache (vLLM's
prefix caching) instead of computing it again. The policy is Ray Serve LLM's
`PrefixCacheAffinityRouter` (a prefix tree of the prompts each replica was sent, in one detached actor
per deployment): while the replicas' queues differ by at most `imbalanced_threshold` requests, a
request goes to the replica with the longest matching prefix (when it matches at least 10% of the
prompt), else to the replica holding the least text; past the threshold, to the less loaded of two
(Ray Serve's default). This subclass only reads fleetllm's payload (a dict with `messages` or `prompt`)
where Ray Serve LLM's requests carry attributes.
"""

from __future__ import annotations

from typing import Any

# the module itself: ray.serve.llm (its __init__) imports vLLM protocol classes of a newer vLLM than 0.25.1
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter

ROUTER_PATH = "fleetllm.serve.routing.PrefixAffinityRouter"


def prompt_text(payload: Any) -> str | None:
    """The text a payload's prefix is matched on: the messages' contents (or the prompt), concatenated;
    None for a payload without text (embeddings, token-id prompts, stats calls)."""
    if not isinstance(payload, dict):
        return None
    value = payload.get("messages") if payload.get("messages") is not None else payload.get("prompt")
    if isinstance(value, str):
        return value or None
    if not isinstance(value, list):
        return None
    parts: list[str] = []
    for item in value:
        content = item.get("content") if isinstance(item, dict) else item
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # content parts: their text
            parts.extend(p.get("text") or "" for p in content if isinstance(p, dict))
    return "".join(parts) or None


class PrefixAffinityRouter(PrefixCacheAffinityRouter):
    """Ray Serve LLM's PrefixCacheAffinityRouter over fleetllm's model deployment calls."""

    def _extract_text_from_request(self, pending_request) -> str | None:  # noqa: D401 - Ray's hook
        for arg in pending_request.args or ():
            text = prompt_text(arg)
            if text is not None:
                return text
        return None


def router_config(max_ongoing_requests: int, overrides: dict[str, Any] | None = None):
    """The deployment's RequestRouterConfig: prefix affinity while queues differ by <= a quarter of a replica's
    batch (at least 4 requests), so one hot prefix cannot pile every request onto one replica. `overrides`:
    the router's keyword arguments as given (build_openai_app's `router_config`, Ray's name)."""
    from ray.serve.config import RequestRouterConfig

    kwargs = {"imbalanced_threshold": max(4, max_ongoing_requests // 4), **(overrides or {})}
    return RequestRouterConfig(request_router_class=ROUTER_PATH, request_router_kwargs=kwargs)
