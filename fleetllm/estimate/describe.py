"""The estimate as `fleetllm run --dry-run` prints it (fleetllm.estimate.estimate builds the dict)."""

from __future__ import annotations

from typing import Any

from fleetllm.estimate.deadline import fmt_s


def _range(pair: list[float], fmt) -> str:
    return f"{fmt(pair[0])} - {fmt(pair[1])}"


def describe(est: dict[str, Any]) -> list[str]:
    cached = est.get("cached_prompt_tokens") or 0
    lines = [
        f"estimate   prompt tokens {est['prompt_tokens']:,} ({est['prompt_tokens_how']})"
        + (f", {cached:,} expected from the prefix cache" if cached else ""),
        f"           output tokens {est['output_tokens']:,} "
        f"(range {_range(est['range']['output_tokens'], '{:,}'.format)}; "
        f"from {est['output_tokens_how']}" + (f"; n={est['n']}" if est.get("n", 1) > 1 else "")
        + ("; structured outputs" if est.get("structured") else "") + ")",
    ]
    if est.get("rows_past_context"):
        lines.append(f"           {est['rows_past_context']:,} row(s) have prompts past the model's context: "
                     "each gets an error, no output")
    if est.get("wall_s") is None and (est.get("no_profile") or {}).get("measured_by"):
        lines.append(f"           time: no profile yet; measured by {est['no_profile']['measured_by']}")
        return lines
    if est.get("wall_s") is None:
        probe = (est.get("no_profile") or {}).get("probe") or {}
        lines.append("           time: no profile yet for this model, engine and accelerator; "
                     f"`fleetllm calibrate JOB.yaml` measures one: {probe.get('rows', 0)} rows "
                     f"(~{probe.get('prompt_tokens', 0):,} prompt tokens, <= {probe.get('output_tokens_at_most', 0):,} "
                     "output tokens) on 1 replica, plus the engine's start")
        return lines
    r = est["range"]
    lines.append(f"           wall time {fmt_s(est['wall_s'])} with {est['replicas']} replica(s) "
                 f"(range {_range(r['wall_s'], fmt_s)}; start-up {fmt_s(est['startup_s'])}, "
                 f"generation {fmt_s(est['generation_s'])}; profile {est['profile']})")
    lines.append(f"           GPU-hours {est['gpu_hours']:.3f}; accelerator-hours {est['accelerator_hours']:.3f} "
                 f"(range {_range(r['accelerator_hours'], '{:.3f}'.format)})")
    if est.get("cost") is not None:
        lines.append(f"           cost {est['cost']:.2f} (range {_range(r['cost'], '{:.2f}'.format)}) "
                     "at compute.price_per_accelerator_hour")
    return lines
