"""`fleetllm serve` (engine vllm) against `vllm serve` under vLLM's own load generator, in one call; then
prefix-affine routing against Ray Serve's default with two replicas on one GPU.

    # leg 1: `vllm serve` and one `fleetllm serve` per --fleet variant (default: the direct path and the
    # separate-ingress path) up side by side (each --gpu-mem of the GPU, default 0.9 / servers), `vllm bench
    # serve --backend openai-chat` (random 1,024 in / 256 out, --ignore-eos) at each concurrency, then request
    # rates, rounds interleaved (the order of the servers rotates per level and round); --plan-only prints
    # the servers' commands and the planned runs, and exits
    python benchmarks/serve_gpu.py compare --tokenizer-dir .gpu/m --budget-s 500 --out R.json
    python benchmarks/serve_gpu.py compare ... --fleet direct,direct@2000,separate   # two budgets and a path
    # leg 2: two fleetllm replicas (each half the GPU), a multi-turn chat workload (benchmarks/serve_chat_load.py)
    # with routing power_of_two, then prefix_affinity (one app after the other)
    python benchmarks/serve_gpu.py routing --tokenizer-dir .gpu/m --budget-s 500 --out R2.json
    # here: the table (README/NOTES) and the chart
    python benchmarks/serve_gpu_report.py R.json R2.json

Both servers run the same model folder (8B shape, dummy weights, SmolLM2's tokenizer: gpu_workloads.py)
with the same engine arguments. The load generator runs in this process (vLLM's `vllm bench serve` code,
`vllm.benchmarks.serve.main_async`, fed the same argument list as the CLI; an option this vLLM lacks is
dropped and named in the JSON), so no run pays vLLM's import. The JSON is rewritten after every run,
and no run starts unless the budget holds it (its last duration, or a guess) plus the time to stop the
servers, so a cut-short call keeps what it measured. GPU busy share: nvidia-smi every 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_throughput import GpuSampler  # noqa: E402
from gpu_workloads import make_models  # noqa: E402
from serve_gpu_plan import (STOP_RESERVE_S, fleet_variants, print_plan, prompts_for,  # noqa: E402
                             variant_engine_kwargs, variant_env, variant_spec)
from serve_servers import (Server, bench_env, fleetllm_serve, spy_on_replica, step_counts,  # noqa: E402
                           step_histogram, vllm_serve)
from serve_client_stats import long_gaps, waves  # noqa: E402
from stream_trace_report import (load as load_trace, loop_summary,  # noqa: E402
                                 summarize as trace_summary)

SUMMARY_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "max_concurrent_requests")
OPTIONAL = ("--num-warmups", "--ready-check-timeout-sec", "--percentile-metrics", "--metric-percentiles",
            "--disable-tqdm", "--random-range-ratio", "--temperature", "--save-detailed")


def bench_argv(server: Server, model: str, args, concurrency: int | None, rate: float | None, prompts: int,
               seed: int = 0) -> list[str]:
    """`vllm bench serve`'s arguments for one run. `seed` picks the random prompts: the servers of one round and
    level get the same prompts, every round and level its own (with one seed for all, a later round's prompts sat
    in vLLM's prefix cache from an earlier one and skipped their prefill: lease 19's c=32 rounds 2-6)."""
    argv = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", server.url[:-3],
            "--model", "bench", "--tokenizer", model, "--dataset-name", "random", "--random-input-len",
            str(args.input_len), "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
            "--num-prompts", str(prompts), "--ignore-eos", "--temperature", "0", "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--disable-tqdm", "--ready-check-timeout-sec", "120", "--num-warmups", str(args.warmups),
            "--save-detailed"]
    argv += ["--request-rate", str(rate) if rate else "inf"]
    if concurrency:
        argv += ["--max-concurrency", str(concurrency)]
    return argv


def run_bench(argv: list[str]) -> tuple[dict, list[str]]:
    """vLLM's `vllm bench serve` in this process; options this vLLM refuses are dropped (and returned)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.benchmarks.serve import add_cli_args, main_async

    dropped: list[str] = []
    while True:
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
            break
        except SystemExit:
            bad = next((o for o in OPTIONAL if o in argv and o in err.getvalue()), None)
            if bad is None:
                raise RuntimeError(f"vllm bench serve refused {argv}: {err.getvalue()[-500:]}") from None
            i = argv.index(bad)
            takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            argv = argv[:i] + argv[i + 1 + takes_value:]
            dropped.append(bad)
    with contextlib.redirect_stdout(io.StringIO()):
        result = asyncio.run(main_async(ns))
    return result, dropped


def summarize(result: dict) -> dict:
    out = {k: result.get(k) for k in SUMMARY_KEYS}
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p90", "p99"):
            key = f"{stat}_{m}_ms"
            if key in result:
                out[key] = round(float(result[key]), 2)
    itls = result.get("itls") or []
    chunks = sum(len(x) for x in itls) + sum(1 for t in result.get("ttfts") or [] if t)
    out["chunks"] = chunks  # SSE messages carrying text: tokens per chunk shows the server's merging
    out["tokens_per_chunk"] = round(result["total_output_tokens"] / chunks, 2) if chunks else None
    out["errors"] = sorted({e for e in result.get("errors") or [] if e})[:3]
    out["long_gaps"] = long_gaps(itls)
    out["waves"] = waves(result.get("start_times") or [], result.get("ttfts") or [])
    return out


def save(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out)


def machine() -> dict:
    from e2e import machine as m

    return m()


def start_all(servers: list[Server], doc: dict, deadline: float, out: Path) -> list[Server]:
    """Start servers one after the other (vLLM sizes its KV cache from the free memory it sees); those that
    come up. A server that fails keeps its log's tail in the JSON."""
    up = []
    for s in servers:
        left = deadline - time.time() - STOP_RESERVE_S
        if left < 60:
            doc["skipped"].append(f"start {s.name}: {left:.0f}s left")
            break
        s.start()
        ok = s.wait_ready(left)
        doc["servers"][s.name] = {"cmd": " ".join(s.cmd), "ready_s": s.ready_s, "up": ok}
        if not ok:
            doc["servers"][s.name].update(log_tail=s.tail(), rc=s.proc.poll(), after_s=round(time.time() - s._t0, 1))
            s.stop()
        else:
            up.append(s)
        save(doc, out)
        print(f"{s.name}: {'ready after ' + str(s.ready_s) + ' s' if ok else 'FAILED'}", flush=True)
    return up


def trace_env(env: dict, folder: Path | None) -> dict:
    """A fleetllm server's environment, with FLEETLLM_STREAM_TRACE where --trace asks for it."""
    if folder is None:
        return env
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return {**env, "FLEETLLM_STREAM_TRACE": str(folder)}


def compare(args) -> None:
    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    variants = fleet_variants(args.fleet, args.fleet_budget)
    if args.gpu_mem is None:  # all servers up at once on one GPU
        args.gpu_mem = int(0.9 / (len(variants) + (not args.no_vllm)) * 20) / 20
    models = make_models(args.tokenizer_dir, Path(args.models_dir).expanduser())
    model = models[args.shape]
    on_gpu = shutil.which("nvidia-smi") is not None
    # on a CPU vLLM reads gpu_memory_utilization as the share of RAM for the KV cache: `vllm serve`'s 0.92
    # default leaves no room for a second server
    kwargs = {"load_format": "dummy", "gpu_memory_utilization": args.gpu_mem, **json.loads(args.engine_kwargs)}
    env = bench_env()
    work = out.parent / (out.stem + "-logs")
    work.mkdir(parents=True, exist_ok=True)
    levels = [("concurrency", int(c)) for c in args.concurrency.split(",") if c]
    rates = [("rate", float(r)) for r in args.rates.split(",") if r]
    doc = {"mode": "compare", "shape": args.shape, "engine_kwargs": kwargs, "input_len": args.input_len,
           "output_len": args.output_len, "budget_s": args.budget_s, "fleet_stream_messages_per_s": args.fleet_budget,
           "fleet": [{"server": n, "ingress": i, "stream_messages_per_s": b} for n, i, b in variants],
           "gpu_mem": args.gpu_mem, "machine": machine() if not args.plan_only else {}, "servers": {}, "runs": [],
           "skipped": [], "dropped_options": []}
    max_c = max([c for _, c in levels] + [1])
    servers = [] if args.no_vllm else [vllm_serve(model, args.port, kwargs, env, work / "vllm.log")]
    traces = {name: Path(args.trace) / name for name, _, _ in variants} if args.trace else {}
    for i, (name, ingress, budget) in enumerate(variants):
        srv_env = {**trace_env(env, traces.get(name)), **variant_env(name)}
        srv = fleetllm_serve(model, args.port + 1 + i, {**kwargs, **variant_engine_kwargs(name)}, srv_env, work, name,
                             gpus=1.0 if on_gpu else 0.0,
                             max_ongoing=args.max_ongoing or max_c, budget=budget, ingress=ingress,
                             spec_extra=variant_spec(name))
        servers.append(srv)
    plan = [(r, lv) for r in range(args.rounds) for lv in levels] + [(0, lv) for lv in rates]
    level_ids = {lv: i for i, lv in enumerate(dict.fromkeys(lv for _, lv in plan))}  # seeds: rates 0.5, 0.7 differ
    doc["planned_s"] = round(print_plan(servers, plan, args))
    if args.plan_only:
        return
    sampler = GpuSampler()
    try:
        up = start_all(servers, doc, deadline, out)
        durations: dict[tuple, float] = {}
        for i, (rnd, (kind, value)) in enumerate(plan):
            order = up[i % len(up):] + up[:i % len(up)] if up else []
            for s in order:
                key = (s.name, kind, value)
                # this server's last run at this level, else another server's at this level, else the
                # longest so far (lease 7 skipped a c=32 run for the 30 s default with 16 s left; runs took 14 s)
                same_level = [d for (_, k, v), d in durations.items() if (k, v) == (kind, value)]
                guess = durations.get(key) or (min(same_level) if same_level else
                                               max(durations.values(), default=30.0))
                left = deadline - time.time() - STOP_RESERVE_S
                if left < guess * 1.2 + 5:
                    doc["skipped"].append(f"round {rnd + 1} {s.name} {kind}={value}: {left:.0f}s left, needs ~{guess:.0f}s")
                    continue
                prompts = prompts_for(kind, value, args)
                argv = bench_argv(s, model, args, value if kind == "concurrency" else None,
                                  value if kind == "rate" else None, prompts,
                                  seed=1000 * (rnd + 1) + level_ids[(kind, value)])
                steps0 = step_histogram(s.url)  # vLLM's tokens a step, before and after (both servers report it)
                t0, m0 = time.time(), time.monotonic()
                spy = spy_on_replica(args.py_spy, f"{s.name}-{kind}{value:g}", args.py_spy_s, s.proc.pid) if (
                    args.py_spy and rnd == 0 and s.name != "vllm" and value == args.py_spy_at) else None
                try:
                    result, dropped = run_bench(argv)
                    res = summarize(result)
                    doc["dropped_options"] = sorted(set(doc["dropped_options"]) | set(dropped))
                except Exception as exc:  # noqa: BLE001 - recorded; the next run goes on
                    res = {"error": f"{type(exc).__name__}: {exc}", "server_log_tail": s.tail(1500)}
                t1 = time.time()
                steps = step_counts(steps0, step_histogram(s.url))
                if spy is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        spy.wait(timeout=args.py_spy_s + 30)
                durations[key] = t1 - t0
                run = {"server": s.name, "round": rnd + 1, kind: value, "prompts": prompts, "wall_s": round(t1 - t0, 1),
                       **res, **{k: v for k, v in sampler.window(t0, t1).items() if not k.endswith("_trace")}}
                if steps is not None:  # how prefills were grouped into engine steps (a long step is a long gap)
                    run["engine_steps"] = steps
                if s.name in traces:  # the replica's own view of this run's streams (stream_trace_report.py)
                    run["replica_trace"] = trace_summary(load_trace(traces[s.name], m0, time.monotonic()))
                    run["replica_loop"] = loop_summary(traces[s.name], m0, time.monotonic())
                doc["runs"].append(run)
                save(doc, out)
                print(f"round {rnd + 1} {s.name:18s} {kind}={value:<6g} {run.get('output_throughput') or 0:9.1f} tok/s  "
                      f"TTFT p50 {run.get('median_ttft_ms')} ms  ITL p50 {run.get('median_itl_ms')} ms  "
                      f"ITL p99 {run.get('p99_itl_ms')} ms  tok/chunk {run.get('tokens_per_chunk')}  "
                      f"GPU {run.get('gpu_busy')}  ({run['wall_s']} s)", flush=True)
                lg = run.get("long_gaps") or {}
                if lg.get("count"):
                    print(f"    client gaps > {lg['over_ms']:g} ms: {lg['count']} ({lg['share']:.2%}), by token index "
                          + ", ".join(f"{k} {v}" for k, v in lg["by_token_index"].items()), flush=True)
                wv = run.get("waves") or {}
                if wv.get("send_bursts"):
                    print(f"    client: {wv['send_bursts']} bursts sent, first tokens in {wv['first_token_steps']} "
                          f"steps ({wv['steps_per_burst']} a burst)", flush=True)
                if steps is not None:
                    print("    engine steps by tokens: " + ", ".join(f"{k} {v}" for k, v in steps.items() if v),
                          flush=True)
                if "replica_trace" in run:
                    t = run["replica_trace"]
                    print(f"    replica: engine gap p99 {t['engine_gap_p99_ms']} ms, out gap p99 "
                          f"{t['out_gap_p99_ms']} ms, engine->loop p99 {t['engine_to_loop_p99_ms']} ms, "
                          f"loop->out p99 {t['loop_to_out_p99_ms']} ms", flush=True)
                    w = run["replica_loop"]
                    print(f"    loop: {w['loop_stalls']} stalls >= 5 ms ({w['loop_stalls_over_15ms']} over 15, max "
                          f"{w['loop_stall_max_ms']} ms), {w['gc_pauses']} collections >= 0.5 ms ({w['gc_gen2']} "
                          f"full, max {w['gc_max_ms']} ms)", flush=True)
    finally:
        for s in reversed(servers):
            s.stop()
        sampler.close()
        doc["wall_s"] = round(time.time() - t_start, 1)
        save(doc, out)
    print(f"wrote {out} ({doc['wall_s']} s)")


def routing(args) -> None:
    from transformers import AutoTokenizer

    from serve_chat_load import conversations, run_chat

    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    models = make_models(args.tokenizer_dir, Path(args.models_dir).expanduser())
    model = models[args.shape]
    on_gpu = shutil.which("nvidia-smi") is not None
    kwargs = {"load_format": "dummy", **({"gpu_memory_utilization": args.gpu_mem,
                                           "kv_cache_memory_bytes": int(args.kv_cache_gib * (1 << 30))}
                                          if on_gpu else {}), **json.loads(args.engine_kwargs)}
    convs = conversations(AutoTokenizer.from_pretrained(model), args.conversations, args.doc_tokens, args.turns,
                          args.question_tokens)
    work = out.parent / (out.stem + "-logs")
    work.mkdir(parents=True, exist_ok=True)
    doc = {"mode": "routing", "shape": args.shape, "engine_kwargs": kwargs, "replicas": args.replicas,
           "conversations": args.conversations, "doc_tokens": args.doc_tokens, "turns": args.turns,
           "question_tokens": args.question_tokens, "output_len": args.output_len, "budget_s": args.budget_s,
           "machine": machine(), "servers": {}, "runs": [], "skipped": []}
    policies = args.policies.split(",")
    sampler = GpuSampler()
    try:
        for i in range(args.rounds * len(policies)):
            policy = policies[i % len(policies)]
            name = f"fleetllm-{policy}-{i // len(policies) + 1}"
            srv = fleetllm_serve(model, args.port + i, kwargs, bench_env(), work, name, replicas=args.replicas,
                                 routing=policy, gpus=(1.0 / args.replicas) if on_gpu else 0.0,
                                 max_ongoing=max(8, args.conversations))
            if not start_all([srv], doc, deadline, out):
                continue
            try:
                left = deadline - time.time() - STOP_RESERVE_S
                t0 = time.time()
                res = asyncio.run(asyncio.wait_for(run_chat(srv.url, "bench", convs, args.output_len,
                                                             stagger_s=args.stagger_s), max(10, left)))
                t1 = time.time()
                reqs = res.pop("requests")
                doc["runs"].append({"server": name, "routing": policy, "round": i // len(policies) + 1, **res,
                                    **{k: v for k, v in sampler.window(t0, t1).items() if not k.endswith("_trace")},
                                    "requests": [{k: r.get(k) for k in ("conversation", "turn", "replica", "cached_tokens",
                                                                        "prompt_tokens", "error")} for r in reqs]})
                print(f"{policy:15s} {res['output_throughput']} tok/s  TTFT p50 {res['median_ttft_ms']} ms "
                      f"(later turns {res['median_ttft_later_turns_ms']})  hit rate {res['prefix_cache_hit_rate']}  "
                      f"per replica {[r['prefix_cache_hit_rate'] for r in res['replicas'].values()]}  "
                      f"one replica per conversation {res['conversations_on_one_replica']}", flush=True)
            except Exception as exc:  # noqa: BLE001 - recorded (a timeout at the budget included)
                doc["runs"].append({"server": name, "routing": policy, "error": f"{type(exc).__name__}: {exc}"})
            finally:
                srv.stop()
                save(doc, out)
    finally:
        sampler.close()
        doc["wall_s"] = round(time.time() - t_start, 1)
        save(doc, out)
    print(f"wrote {out} ({doc['wall_s']} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c, r = sub.add_parser("compare"), sub.add_parser("routing")
    for s in (c, r):
        s.add_argument("--tokenizer-dir", required=True, help="SmolLM2 config + tokenizer files (.gpu/m)")
        s.add_argument("--models-dir", default="~/.cache/fleetllm-bench/gpu-models")
        s.add_argument("--shape", default="llama3-8b-shape", help="llama3-8b-shape | smollm2-135m-shape | tiny-shape")
        s.add_argument("--engine-kwargs", default="{}", help="JSON added to both servers' vLLM arguments")
        s.add_argument("--output-len", type=int, default=256)
        s.add_argument("--rounds", type=int, default=3 if s is c else 1)
        s.add_argument("--budget-s", type=float, default=500, help="stop starting runs past this (whole call)")
        s.add_argument("--port", type=int, default=8100)
        s.add_argument("--out", required=True)
    c.add_argument("--gpu-mem", type=float, default=None, help="gpu_memory_utilization of each server (all are up "
                   "at once; default 0.9 / servers, rounded down to 0.05: 0.3 for vllm + two fleetllm)")
    c.add_argument("--fleet", default="direct,separate", help="fleetllm servers, INGRESS[@MESSAGES_PER_S] each "
                   "(INGRESS direct | separate | auto; the budget default: --fleet-budget, else fleetllm's own)")
    c.add_argument("--plan-only", action="store_true", help="print the servers' commands and the planned runs; exit")
    c.add_argument("--input-len", type=int, default=1024)
    c.add_argument("--concurrency", default="1,32,256")
    c.add_argument("--rates", default="", help="request rates (req/s) after the rounds, e.g. 4,16")
    c.add_argument("--rate-seconds", type=float, default=15, help="prompts per rate run = rate x this")
    c.add_argument("--waves", type=float, default=2, help="prompts per concurrency run = concurrency x this")
    c.add_argument("--min-prompts", type=int, default=8)
    c.add_argument("--warmups", type=int, default=2, help="vllm bench serve --num-warmups")
    c.add_argument("--no-vllm", action="store_true", help="fleetllm variants only (an A/B of fleetllm settings)")
    c.add_argument("--trace", default=None, help="a folder: fleetllm servers write per-token timestamps there "
                   "(FLEETLLM_STREAM_TRACE) and each run keeps the replica's gaps (replica_trace)")
    c.add_argument("--py-spy", default=None, help="a folder: py-spy records the fleetllm replica during round 1's "
                   "run at --py-spy-at (one fleetllm server)")
    c.add_argument("--py-spy-at", type=float, default=32, help="the level (concurrency or rate) py-spy records")
    c.add_argument("--py-spy-s", type=float, default=12, help="seconds py-spy records from the run's start (idle "
                   "samples dropped)")
    c.add_argument("--max-ongoing", type=int, default=None, help="each fleetllm replica's max_ongoing_requests (default: "
                   "the highest --concurrency; lease 16 ran c=32 under 256)")
    c.add_argument("--fleet-budget", type=float, default=None, help="fleetllm's stream_messages_per_s (default: its own)")
    r.add_argument("--gpu-mem", type=float, default=0.45, help="gpu_memory_utilization of each replica")
    r.add_argument("--kv-cache-gib", type=float, default=32, help="each replica's KV cache on a GPU (fixed, so the "
                   "replicas starting together size it alike; 32 GiB: ~260K tokens of the 8B shape, about 60%% of "
                   "the conversations' working set)")
    r.add_argument("--replicas", type=int, default=2)
    r.add_argument("--policies", default="power_of_two,prefix_affinity")
    r.add_argument("--conversations", type=int, default=96)
    r.add_argument("--doc-tokens", type=int, default=3000)
    r.add_argument("--turns", type=int, default=4)
    r.add_argument("--question-tokens", type=int, default=64)
    r.add_argument("--stagger-s", type=float, default=0.05, help="conversation c starts c x this after the first")
    args = p.parse_args()
    if args.cmd == "routing":
        routing(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
