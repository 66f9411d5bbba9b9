"""Table and chart of benchmarks/gpu_throughput.py results: fleetllm / bare per engine, shape, workload."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    legs: dict[str, dict] = {}
    for doc in docs:
        for leg in doc.get("legs", []):
            legs[leg["leg"]] = leg
    rows, diagnostics = [], []
    for leg in legs.values():
        main = leg["mode"] in ("bare", "fleetllm") and not leg.get("tag")
        for res in leg.get("results", []):
            (rows if main else diagnostics).append({"engine": leg["engine"], "mode": leg["mode"] + leg.get("tag", ""),
                                                     "shape": leg["shape"], **res})
    pairs = []
    keys = sorted({(r["engine"], r["shape"], r["workload"]) for r in rows})
    for engine, shape, workload in keys:
        got = {r["mode"]: r for r in rows if (r["engine"], r["shape"], r["workload"]) == (engine, shape, workload)}
        bare, fleet = got.get("bare"), got.get("fleetllm")
        pairs.append({
            "engine": engine, "shape": shape, "workload": workload,
            "bare_tokens_per_s": bare and round(bare["output_tokens_per_s"], 1),
            "fleetllm_tokens_per_s": fleet and round(fleet["output_tokens_per_s"], 1),
            "ratio": round(fleet["output_tokens_per_s"] / bare["output_tokens_per_s"], 3) if bare and fleet else None,
            "gpu_busy_bare": bare and bare.get("gpu_busy"), "gpu_busy_fleetllm": fleet and fleet.get("gpu_busy"),
            "rows": (fleet or bare)["rows"], "output_tokens": (fleet or bare)["output_tokens"],
            "gpu_idle_head_tail_s": {m: idle for m, r in (("bare", bare), ("fleetllm", fleet))
                                     if r and (idle := idle_head_tail(r))} or None,
        })
    bare = {(r["mode"], r["engine"], r["shape"], r["workload"]): r for r in rows + diagnostics
            if r["mode"].startswith("bare")}
    for d in diagnostics:  # variants measured in the same run: against the bare leg of the same tag (a
        # repeated pair), else the table's bare leg (a bare repeat against it shows the run-to-run spread)
        tag = d["mode"].split("-", 1)[1] if "-" in d["mode"] else ""
        key = (d["engine"], d["shape"], d["workload"])
        ref = f"bare-{tag}" if not d["mode"].startswith("bare") and ("bare-" + tag, *key) in bare else "bare"
        b = bare.get((ref, *key))
        d["vs"] = ref
        d["vs_bare"] = round(d["output_tokens_per_s"] / b["output_tokens_per_s"], 3) if b else None
    repeats: dict[tuple, list[float]] = {}
    for d in diagnostics:  # pairs repeated under their own tags (p1, p2, ...): the spread between pairs
        if d["vs"] != "bare" and d["vs_bare"] is not None:
            base = re.sub(r"-p\d+$", "", d["mode"])  # fleetllm-p3 -> fleetllm, fleetllm-cg-p1 -> fleetllm-cg
            repeats.setdefault((d["engine"], base, d["shape"], d["workload"]), []).append(d["vs_bare"])
    machine = next((d["machine"] for d in docs if "machine" in d), {})
    missing = [{"leg": leg["leg"], "why": why_missing(leg)}
               for leg in legs.values() if not leg.get("results") or leg.get("failed") or leg.get("skipped")]
    return {"machine": machine, "pairs": pairs, "diagnostics": [
        {**{k: d.get(k) for k in ("engine", "mode", "shape", "workload", "output_tokens_per_s", "vs", "vs_bare",
                                  "gpu_busy", "cpu_cores_busy", "cpu_cores_stolen")},
         "gpu_idle_head_tail_s": idle_head_tail(d)} for d in diagnostics],
            "repeated_pairs": [{"engine": e, "mode": m, "shape": s, "workload": w, "ratios": r,
                                "median": round(statistics.median(r), 3)} for (e, m, s, w), r in repeats.items()],
            "legs": [without_traces(leg) for leg in legs.values()], "not_measured": missing}


def without_traces(leg: dict[str, Any]) -> dict[str, Any]:
    """A leg as the merged results keep it: the per-sample traces stay in the raw files (gpu_runs/)."""
    results = [{k: v for k, v in r.items() if not k.endswith("_trace")} for r in leg.get("results", [])]
    return {**leg, "results": results}


def idle_head_tail(result: dict[str, Any], busy: float = 0.5) -> list[float] | None:
    """Seconds of the measured window before the GPU first reached `busy` utilization, and after it last
    did (from the nvidia-smi trace, 100 ms samples since lease 4): the start-up and wind-down a pipeline adds around the engine."""
    trace = result.get("gpu_trace") or []
    hot = [t for t, u in trace if u >= busy]
    if not hot:
        return None
    return [round(hot[0], 2), round(result["seconds"] - hot[-1], 2)]


def why_missing(leg: dict[str, Any]) -> str:
    failed = leg.get("failed", "")
    if leg.get("skipped"):
        return leg["skipped"]
    if failed.rstrip().endswith("timed out"):
        done = [r["workload"] for r in leg.get("results", [])]
        return f"timed out (the call's time budget) after {', '.join(done) if done else 'no workload'}"
    return failed[-600:]


def table(doc: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fleetllm vs bare engine, output tokens/s after engine start ({doc['machine'].get('gpu', '?')})")
    for col in ("engine", "shape", "workload", "bare tok/s", "fleetllm tok/s", "fleetllm/bare", "GPU busy bare",
                "GPU busy fleetllm"):
        t.add_column(col, justify="right" if "tok" in col or "GPU" in col or "/" in col else "left")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for p in doc["pairs"]:
        t.add_row(p["engine"], p["shape"], p["workload"], fmt(p["bare_tokens_per_s"], ",.0f"),
                  fmt(p["fleetllm_tokens_per_s"], ",.0f"), fmt(p["ratio"], ".3f"), fmt(p["gpu_busy_bare"], ".2f"),
                  fmt(p["gpu_busy_fleetllm"], ".2f"))
    import io

    console = Console(record=True, width=140, file=io.StringIO())
    console.print(t)
    for p in doc["pairs"]:
        if p.get("gpu_idle_head_tail_s"):
            idle = ", ".join(f"{m} {h:.2f} s / {t:.2f} s" for m, (h, t) in p["gpu_idle_head_tail_s"].items())
            console.print(f"GPU idle before the first / after the last busy sample, {p['engine']} {p['shape']} "
                          f"{p['workload']}: {idle}")
    for d in doc.get("diagnostics", []):
        ratio = "-" if d["vs_bare"] is None else f"{d['vs_bare']:.3f}"
        idle = d.get("gpu_idle_head_tail_s")
        console.print(f"diagnostic {d['engine']} {d['mode']} {d['shape']} {d['workload']}: "
                      f"{d['output_tokens_per_s']:,.0f} tok/s, {ratio} of {d.get('vs', 'bare')}, "
                      f"GPU busy {d['gpu_busy']}"
                      + (f", GPU idle head/tail {idle[0]:.2f}/{idle[1]:.2f} s" if idle else "")
                      + (f", CPU cores busy {d['cpu_cores_busy']} (stolen {d['cpu_cores_stolen']})"
                         if d.get("cpu_cores_busy") is not None else ""))
    for r in doc.get("repeated_pairs", []):
        console.print(f"repeated pairs {r['engine']} {r['mode']} {r['shape']} {r['workload']}: "
                      f"{', '.join(f'{x:.3f}' for x in r['ratios'])} of bare -> median {r['median']:.3f}")
    for m in doc.get("not_measured", []):
        console.print(f"not measured: {m['leg']}: {m['why'][:300]}")
    return console.export_text()


def plot(doc: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [p for p in doc["pairs"] if p["bare_tokens_per_s"] or p["fleetllm_tokens_per_s"]]
    labels = [f"{p['engine']}\n{p['shape'].replace('-shape', '')}\n{p['workload']}" for p in pairs]
    x = range(len(pairs))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(pairs)), 4.5))
    ax.bar([i - 0.2 for i in x], [p["bare_tokens_per_s"] or 0 for p in pairs], 0.4, label="bare engine")
    ax.bar([i + 0.2 for i in x], [p["fleetllm_tokens_per_s"] or 0 for p in pairs], 0.4, label="fleetllm run")
    for i, p in zip(x, pairs):
        if p["ratio"]:
            ax.text(i, max(p["bare_tokens_per_s"], p["fleetllm_tokens_per_s"]) * 1.02, f"{p['ratio']:.2f}",
                    ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("output tokens/s (log)")
    ax.set_title(f"fleetllm vs bare engine on {doc['machine'].get('gpu', '?')} (ratio above bars)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
