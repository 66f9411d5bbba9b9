"""Table (markdown, for README/NOTES) and chart of benchmarks/serve_gpu.py results.

    python benchmarks/serve_gpu_report.py R.json [R2.json ...] [--png benchmarks/results/serve_gpu.png]
        [--out benchmarks/results/serve_gpu.json]

compare runs: per level (concurrency or request rate) the median over rounds of each server's output
tokens/s, TTFT p50/p99, ITL p50/p99, TPOT p50, tokens per SSE chunk and GPU busy share, side by side for
every server of the call (`vllm`, then each fleetllm variant: fleetllm-direct, fleetllm-separate, ...),
the ratios of each fleetllm server / vllm, and, per fleetllm server, the issue's checks (tok/s >= 0.97x at c=32 and 256; TTFT p50 <= 1.1x + 5 ms and
ITL p50 <= 1.05x at c=1 and 32). routing runs: per policy, tok/s, TTFT, prefix cache hit rate per replica.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METRICS = (("output_throughput", "tok/s"), ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
           ("median_itl_ms", "ITL p50"), ("p99_itl_ms", "ITL p99"), ("median_tpot_ms", "TPOT p50"),
           ("tokens_per_chunk", "tok/chunk"), ("gpu_busy", "GPU busy"))


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 2) if values else None


def server_names(docs: list[dict]) -> list[str]:
    """The compare servers in the calls' order: vllm first, then each fleetllm variant."""
    names: list[str] = []
    for d in docs:
        if d.get("mode") == "compare":
            for name in list(d.get("servers", {})) + [r["server"] for r in d["runs"]]:
                if name not in names:
                    names.append(name)
    return sorted(names, key=lambda n: n != "vllm")


def compare_rows(docs: list[dict]) -> list[dict]:
    runs = [r for d in docs if d.get("mode") == "compare" for r in d["runs"] if "error" not in r]
    levels = sorted({("concurrency", r["concurrency"]) if "concurrency" in r else ("rate", r["rate"]) for r in runs},
                    key=lambda lv: (lv[0] != "concurrency", lv[1]))
    names = server_names(docs)
    rows = []
    for kind, value in levels:
        row: dict = {"level": f"c={value:g}" if kind == "concurrency" else f"{value:g} req/s", kind: value,
                     "servers": names, "ratio": {}}
        for server in names:
            mine = [r for r in runs if r["server"] == server and r.get(kind) == value]
            row[server] = {key: med([r.get(key) for r in mine]) for key, _ in METRICS}
            row[server]["rounds"] = len(mine)
        v = row.get("vllm") or {}
        for server in (n for n in names if n != "vllm"):
            f = row[server]
            row["ratio"][server] = {k: round(f[k] / v[k], 3) if f.get(k) and v.get(k) else None for k, _ in METRICS}
        rows.append(row)
    return rows


def checks(rows: list[dict]) -> list[str]:
    out = []
    for row in rows:
        c, v = row.get("concurrency"), row.get("vllm")
        for server in (n for n in row.get("servers", ["fleetllm"]) if n != "vllm" and v):
            f, who = row[server], f"{server}: " if len(row.get("servers", [])) > 2 else ""
            if c in (32, 256) and v["output_throughput"] and f["output_throughput"]:
                r = f["output_throughput"] / v["output_throughput"]
                out.append(f"{who}c={c}: tok/s {r:.3f}x (>= 0.97: {'yes' if r >= 0.97 else 'NO'})")
            if c in (1, 32) and v["median_ttft_ms"] and f["median_ttft_ms"]:
                ok = f["median_ttft_ms"] <= 1.1 * v["median_ttft_ms"] + 5
                out.append(f"{who}c={c}: TTFT p50 {f['median_ttft_ms']} vs {v['median_ttft_ms']} ms (<= 1.1x + 5: "
                           f"{'yes' if ok else 'NO'})")
            if c in (1, 32) and v["median_itl_ms"] and f["median_itl_ms"]:
                r = f["median_itl_ms"] / v["median_itl_ms"]
                out.append(f"{who}c={c}: ITL p50 {r:.2f}x (<= 1.05: {'yes' if r <= 1.05 else 'NO'})")
    return out


def table(rows: list[dict]) -> str:
    head = "| level | server | " + " | ".join(label for _, label in METRICS) + " | rounds |"
    lines = [head, "|" + "---|" * (len(METRICS) + 3)]
    for row in rows:
        for server in row["servers"]:
            cells = [f"{row[server][k]:g}" if row[server][k] is not None else "-" for k, _ in METRICS]
            lines.append(f"| {row['level']} | {server} | " + " | ".join(cells) + f" | {row[server]['rounds']} |")
        for server, ratios in row["ratio"].items():
            cells = [f"{ratios[k]:.2f}x" if ratios[k] else "-" for k, _ in METRICS]
            lines.append(f"| {row['level']} | {server} / vllm | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def routing_table(docs: list[dict]) -> str:
    runs = [r for d in docs if d.get("mode") == "routing" for r in d["runs"]]
    if not runs:
        return ""
    lines = ["| routing | tok/s | TTFT p50 ms | TTFT p50 later turns | TTFT p99 | hit rate | per replica (requests: hit rate) "
             "| conversations on one replica |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['routing']} | error: {r['error'][:80]} | | | | | | |")
            continue
        reps = ", ".join(f"{v['requests']}: {v['prefix_cache_hit_rate']}" for v in r["replicas"].values())
        lines.append(f"| {r['routing']} | {r['output_throughput']} | {r['median_ttft_ms']} | "
                     f"{r['median_ttft_later_turns_ms']} | {r['p99_ttft_ms']} | {r['prefix_cache_hit_rate']} | {reps} | "
                     f"{r['conversations_on_one_replica']} |")
    return "\n".join(lines)


def chart(rows: list[dict], png: Path, where: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("output_throughput", "output tokens/s"), ("median_ttft_ms", "TTFT p50 (ms)"),
              ("median_itl_ms", "ITL p50 (ms)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    labels = [r["level"] for r in rows]
    x = range(len(rows))
    names = rows[0]["servers"] if rows else []
    width = 0.8 / max(1, len(names))
    for ax, (key, title) in zip(axes, panels):
        for j, server in enumerate(names):
            ax.bar([i + (j - (len(names) - 1) / 2) * width for i in x], [r[server][key] or 0 for r in rows], width,
                   label="vllm serve" if server == "vllm" else server.replace("fleetllm", "fleetllm serve", 1))
        ax.set_xticks(list(x), labels, rotation=30)
        ax.set_title(title)
        if key != "output_throughput":
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(f"fleetllm serve (engine vllm) vs vllm serve, {where} (median of rounds)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    here = Path(__file__).resolve().parent / "results"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+")
    p.add_argument("--png", default=str(here / "serve_gpu.png"))
    p.add_argument("--out", default=str(here / "serve_gpu.json"))
    args = p.parse_args()
    docs = [json.loads(Path(x).read_text()) for x in args.inputs]
    rows = compare_rows(docs)
    if rows:
        print(table(rows) + "\n")
        for line in checks(rows):
            print("  " + line)
        first = next(d for d in docs if d.get("mode") == "compare")
        chart(rows, Path(args.png), f"{first.get('shape')}, {first.get('machine', {}).get('gpu', '?')}")
        print(f"wrote {args.png}")
    rt = routing_table(docs)
    if rt:
        print("\n" + rt)
    summary = {"inputs": args.inputs, "compare": rows, "checks": checks(rows),
               "routing": [{k: v for k, v in r.items() if k != "requests"}
                           for d in docs if d.get("mode") == "routing" for r in d["runs"]],
               "skipped": [s for d in docs for s in d.get("skipped", [])]}
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
