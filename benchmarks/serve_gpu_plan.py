"""The plan of `benchmarks/serve_gpu.py compare`: its fleetllm servers (--fleet), the prompts per run, and
the planned runs with a wall-time guess (printed before anything starts; --plan-only stops there)."""

from __future__ import annotations

STOP_RESERVE_S = 25.0  # stopping the servers at the end


# Tweaks a variant may name after its ingress (`direct+thread`), to A/B where a streamed token waits
# (benchmarks/NOTES-serve.md): environment of the replica process (TWEAKS), or serve.yaml fields (SPEC_TWEAKS).
# Since 2026-12-07 one replica answers HTTP itself (serve.yaml `http: auto` -> replica: a uvicorn server of
# fleetllm's own in the replica, fleetllm.serve.replica_http) and vLLM's client runs on its serving loop.
# samethread: with `http: replica` the replica's uvicorn would then run on its main thread and take SIGINT/SIGTERM
# there (uvicorn captures signals on the main thread): pair it with +proxy.
TWEAKS = {"samethread": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"},
          "switch": {"FLEETLLM_SWITCH_INTERVAL_S": "0.0005"},  # the GIL handed between threads every 0.5 ms
          "thread": {"FLEETLLM_VLLM_LOOP": "thread"},  # vLLM's client on its own loop thread (before 2026-12-07)
          "proxy": {},  # Serve's HTTP proxy in front (`http: proxy`, the default before 2026-12-07)
          "onloop": {"FLEETLLM_OFFLOAD_CHARS": "100000000"},  # prompts tokenized on the serving loop (before lease 17)
          "fcfs": {}}  # vLLM's FCFS scheduler (`vllm serve`'s default), not fleetllm's priority one
SPEC_TWEAKS = {"proxy": {"http": "proxy"}}
ENGINE_TWEAKS = {"fcfs": {"scheduling_policy": "fcfs"}}  # the model's engine_kwargs a variant adds


def _tweaked(table: dict[str, dict], name: str) -> dict:
    """What the tweaks a server name carries (`fleetllm-direct-proxy`: proxy) set, from `table`."""
    return {k: v for tweak, values in table.items() if name.endswith(f"-{tweak}") or f"-{tweak}-" in name
            for k, v in values.items()}


def variant_spec(name: str) -> dict:
    """serve.yaml fields a variant's tweaks set (server name `fleetllm-direct-proxy` -> {"http": "proxy"})."""
    return _tweaked(SPEC_TWEAKS, name)


def variant_engine_kwargs(name: str) -> dict:
    """engine_kwargs a variant's tweaks add (server name `fleetllm-direct-fcfs` -> {"scheduling_policy": "fcfs"})."""
    return _tweaked(ENGINE_TWEAKS, name)


def variant_env(name: str) -> dict[str, str]:
    """The environment a variant's tweaks add (server name `fleetllm-direct-samethread` -> its variables)."""
    return _tweaked(TWEAKS, name)


def fleet_variants(text: str, default_budget: float | None) -> list[tuple[str, str, float | None]]:
    """`direct,separate@2000,direct+samethread` -> [(server name, ingress, stream_messages_per_s)]: a fleetllm
    server each (a `+tweak` adds TWEAKS[tweak] to its environment: variant_env)."""
    out: list[tuple[str, str, float | None]] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        item, *tweaks = item.split("+")
        if any(t not in TWEAKS for t in tweaks):
            raise SystemExit(f"--fleet: unknown tweak in {tweaks}; known: {sorted(TWEAKS)}")
        ingress, _, budget = item.partition("@")
        try:
            value = float(budget) if budget else default_budget
        except ValueError:
            value = -1.0
        if ingress not in ("auto", "direct", "separate") or (value is not None and value <= 0):
            raise SystemExit(f"--fleet: {item!r} is not INGRESS[@MESSAGES_PER_S] with INGRESS direct, separate or "
                             "auto and a budget > 0, e.g. direct,separate@2000")
        name = f"fleetllm-{ingress}" + (f"-{value:g}" if budget else "") + "".join(f"-{t}" for t in tweaks)
        if name in [n for n, _, _ in out]:
            raise SystemExit(f"--fleet: {item!r} is given twice")
        out.append((name, ingress, value))
    if not out:
        raise SystemExit("--fleet: give at least one variant, e.g. direct,separate")
    return out


def run_guess_s(kind: str, value: float, args) -> float:
    """A planned run's wall time on the H200 (8B shape): warm-ups, waves of output_len steps, the bench's start."""
    if kind == "rate":
        return 8 + args.rate_seconds + args.output_len * 0.02
    step = 0.005 if value <= 32 else 0.03
    waves = prompts_for(kind, value, args) / value
    return 8 + (waves + args.warmups / value) * (0.05 + args.output_len * step)


def print_plan(servers: list, plan: list, args) -> float:
    """The servers' commands and the planned runs, with a wall-time guess (seconds)."""
    print(f"servers ({len(servers)}, gpu_memory_utilization {args.gpu_mem:g} each):")
    for s in servers:
        print(f"  {s.name}: {' '.join(s.cmd)}")
    starts = sum(110 if s.name == "vllm" else 75 for s in servers)
    runs = 0.0
    for i, (rnd, (kind, value)) in enumerate(plan):
        guess = run_guess_s(kind, value, args)
        runs += guess * len(servers)
        order = servers[i % len(servers):] + servers[:i % len(servers)]
        print(f"  run {i + 1}: round {rnd + 1} {kind}={value:g} ({prompts_for(kind, value, args)} prompts): "
              f"{', '.join(s.name for s in order)} (~{guess:.0f} s each)")
    total = starts + runs + STOP_RESERVE_S
    print(f"planned: {len(plan) * len(servers)} runs; guess ~{starts} s of starts + ~{runs:.0f} s of runs + "
          f"{STOP_RESERVE_S:.0f} s to stop = ~{total / 60:.1f} min (budget {args.budget_s:g} s)", flush=True)
    return total


def prompts_for(kind: str, value: float, args) -> int:
    if kind == "rate":
        return max(4, int(value * args.rate_seconds))
    return max(args.min_prompts, int(value * args.waves))
