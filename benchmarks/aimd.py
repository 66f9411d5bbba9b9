"""AIMD vs static concurrency against the capacity-limited test server.

The server (fleetllm.testing.capacity_server, in a subprocess) serves C requests at a time, queues
the rest (latency grows with load, as vLLM does) and answers 429 past a hard limit. The client does
not know C. For every static concurrency 1, 2, 4, ..., 256 and for AIMD (starting at 8 in-flight
requests, no tuning), the same rows go through the real openai client (fleetllm.engines.openai.client) and
we measure throughput, p99 row latency (first send to result, retries included) and 429s.
A second part compares one global AIMD window shared by 4 clients against 4 per-client windows.

    PYTHONPATH=. python benchmarks/aimd.py            # prints a table, writes benchmarks/results/aimd.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path

from fleetllm.engines.openai.aimd import AIMDConfig, AIMDController
from fleetllm.engines.openai.client import AsyncWindow, QueryClient, RetryPolicy
from fleetllm.testing.capacity_server import CapacityServer

STATIC = [1, 2, 4, 8, 16, 32, 64, 128, 256]
RESULTS = Path(__file__).parent / "results" / "aimd.json"


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def drive(base_url: str, rows: int, controllers: list[AIMDController], shared: bool) -> dict:
    """Send `rows` rows split over len(controllers) clients; return throughput and latencies."""
    retry = RetryPolicy(max_retries=20, initial_backoff_s=0.1, max_backoff_s=2.0)
    window = AsyncWindow(controllers[0]) if shared else None
    clients = [QueryClient(base_url=base_url, model="capacity-test", retry=retry,
                           controller=None if shared else c, window=window) for c in controllers]
    start = time.monotonic()
    tasks = [clients[i % len(clients)].chat([{"role": "user", "content": f"row {i}"}], max_tokens=8)
             for i in range(rows)]
    results = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    for c in clients:
        await c.aclose()
    errors = sum(r.error is not None for r in results)
    lat = [r.elapsed_s for r in results]
    return {"rows": rows, "errors": errors, "seconds": elapsed, "throughput": rows / elapsed,
            "p50_s": percentile(lat, 0.5), "p99_s": percentile(lat, 0.99),
            "attempts": sum(r.attempts for r in results),
            "final_windows": [c.limit for c in (controllers[:1] if shared else controllers)],
            "max_window": max(c.stats.max_limit for c in controllers)}


def point(server: CapacityServer, rows: int, controllers: list[AIMDController], shared: bool = False) -> dict:
    before = server.stats()["rate_limited"]
    out = asyncio.run(drive(server.base_url, rows, controllers, shared))
    out["429s"] = server.stats()["rate_limited"] - before
    return out


def static_controller(c: int) -> AIMDController:
    return AIMDController(AIMDConfig(enabled=False, initial_window=c, max_window=max(c, 256)))


def aimd_controller(initial: int) -> AIMDController:
    return AIMDController(AIMDConfig(initial_window=initial))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=32, help="the server's hidden capacity C")
    p.add_argument("--latency-s", type=float, default=0.3, help="service time of one request")
    p.add_argument("--batch-slowdown", type=float, default=0.5, help="extra service time at a full batch")
    p.add_argument("--rows", type=int, default=600, help="rows per point (static c < rows/30 run 30*c rows)")
    p.add_argument("--repeats", type=int, default=3, help="runs of AIMD and of the 3 best static points")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()

    server_opts = dict(capacity=a.capacity, latency_s=a.latency_s, batch_slowdown=a.batch_slowdown,
                       hard_limit=4 * a.capacity, retry_after_s=1.0)
    report: dict = {"server": server_opts, "machine": platform.platform(), "static": {}, "aimd": [],
                    "scope": {}}
    t0 = time.monotonic()
    with CapacityServer(subprocess=True, **server_opts) as server:
        point(server, 50, [static_controller(8)])  # warm up connections and the server
        for c in STATIC:
            report["static"][c] = [point(server, min(a.rows, 30 * c), [static_controller(c)])]
            print(f"static {c:4d}: {report['static'][c][0]['throughput']:7.1f} rows/s", flush=True)
        # repeat the three best static points, so that the best static is a median too
        top = sorted(STATIC, key=lambda c: -report["static"][c][0]["throughput"])[:3]
        for c in top:
            report["static"][c] += [point(server, min(a.rows, 30 * c), [static_controller(c)])
                                    for _ in range(a.repeats - 1)]
        for _ in range(a.repeats):
            run = point(server, a.rows, [aimd_controller(8)])
            report["aimd"].append(run)
            print(f"aimd       : {run['throughput']:7.1f} rows/s  max window {run['max_window']}", flush=True)
        # one global window shared by 4 clients vs 4 per-client windows (each starting at 8)
        for scope in ("per_actor", "global"):
            runs = []
            for _ in range(max(1, a.repeats - 1)):
                ctrls = [aimd_controller(8) for _ in range(4)] if scope == "per_actor" else [aimd_controller(8)]
                runs.append(point(server, a.rows, ctrls, shared=(scope == "global")))
            report["scope"][scope] = runs
            print(f"aimd {scope:9s}: {statistics.median(r['throughput'] for r in runs):7.1f} rows/s", flush=True)
    report["seconds"] = time.monotonic() - t0

    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    best_c = max(report["static"], key=lambda c: med(report["static"][c], "throughput"))
    best = report["static"][best_c]
    aimd = report["aimd"]
    summary = {
        "best_static_concurrency": best_c,
        "best_static_throughput": med(best, "throughput"),
        "aimd_throughput": med(aimd, "throughput"),
        "throughput_ratio": med(aimd, "throughput") / med(best, "throughput"),
        "p99_ratio": med(aimd, "p99_s") / med(best, "p99_s"),
        "aimd_429s": sum(r["429s"] for r in aimd) / len(aimd),
        "per_actor_vs_global_throughput": med(report["scope"]["per_actor"], "throughput")
        / med(report["scope"]["global"], "throughput"),
    }
    report["summary"] = summary

    print()
    print(f"capacity-limited server: C={a.capacity} (hidden), service {a.latency_s * 1000:.0f} ms "
          f"(+{a.batch_slowdown:.0%} at a full batch), 429 past {4 * a.capacity} in system")
    print(f"{'client':>16} {'rows/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'429s':>6} {'errors':>6} {'vs best':>8}")
    rows = [(f"static {c}", runs) for c, runs in report["static"].items()]
    rows += [("AIMD (start 8)", aimd), ("4 x per-actor", report["scope"]["per_actor"]),
             ("4 x global", report["scope"]["global"])]
    for name, runs in rows:
        print(f"{name:>16} {med(runs, 'throughput'):8.1f} {med(runs, 'p50_s') * 1000:8.0f} "
              f"{med(runs, 'p99_s') * 1000:8.0f} {med(runs, '429s'):6.0f} {med(runs, 'errors'):6.0f} "
              f"{med(runs, 'throughput') / summary['best_static_throughput']:8.3f}")
    print()
    print(f"AIMD / best static (c={best_c}): throughput {summary['throughput_ratio']:.3f}, "
          f"p99 latency {summary['p99_ratio']:.2f}, 429s per run {summary['aimd_429s']:.0f}")
    print(f"per-actor windows / one global window (4 clients): {summary['per_actor_vs_global_throughput']:.3f}")
    print(f"total {report['seconds']:.0f} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
