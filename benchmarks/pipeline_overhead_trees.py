"""Pipeline overhead before and after a change: `benchmarks/pipeline_overhead.py` run from two code trees
(a git ref, checked out in a temporary worktree, and this tree), interleaved round by round, so the
machine's drift falls on both. Each run measures the bare engine and `fleetllm run` back to back; the
figure compared is their ratio (fleetllm / bare) and fleetllm's output tokens/s. Prints a table of
medians, writes JSON.

    .venv/bin/python benchmarks/pipeline_overhead_trees.py --before e6308d3 --rounds 3 [--engine transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(tree: Path, engine: str, prompts: int, tokens: int, out: Path) -> dict:
    """One run of the benchmark of `tree` (its own code on PYTHONPATH); its JSON for `engine`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str(tree / "benchmarks" / "pipeline_overhead.py"), "--engine", engine,
                    "--prompts", str(prompts), "--tokens", str(tokens), "--out", str(out)],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())[engine]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="git ref of the code before the change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pipeline_overhead_trees.json"))
    args = parser.parse_args()

    before_sha = subprocess.check_output(["git", "rev-parse", args.before], cwd=ROOT, text=True).strip()
    after_sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), before_sha], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for r in range(args.rounds):
                order = [("before", old), ("after", ROOT)] if r % 2 == 0 else [("after", ROOT), ("before", old)]
                for name, tree in order:
                    res = run_once(tree, args.engine, args.prompts, args.tokens, Path(tmp) / f"{name}{r}.json")
                    runs[name].append(res)
                    print(f"round {r + 1} {name:6s}: ratio {res['ratio']:.3f}, fleetllm "
                          f"{res['fleetllm']['output_tokens_per_s']:.1f} tok/s, bare "
                          f"{res['bare']['output_tokens_per_s']:.1f} tok/s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)

    def med(name: str, key) -> float:
        return statistics.median(key(x) for x in runs[name])

    summary = {name: {"ratio": med(name, lambda x: x["ratio"]),
                      "fleetllm_tokens_per_s": med(name, lambda x: x["fleetllm"]["output_tokens_per_s"]),
                      "bare_tokens_per_s": med(name, lambda x: x["bare"]["output_tokens_per_s"]),
                      "fleetllm_end_to_end_s": med(name, lambda x: x["fleetllm"]["end_to_end_s"])}
               for name in runs}
    print(f"\npipeline overhead, {args.engine}, {args.prompts} prompts x {args.tokens} tokens, medians of "
          f"{args.rounds} interleaved rounds; before {before_sha[:7]}, after {after_sha[:7]}")
    print(f"{'tree':8s} {'fleetllm/bare':>13s} {'fleetllm tok/s':>15s} {'bare tok/s':>11s} {'run s':>7s}")
    for name, s in summary.items():
        print(f"{name:8s} {s['ratio']:13.3f} {s['fleetllm_tokens_per_s']:15.1f} {s['bare_tokens_per_s']:11.1f} "
              f"{s['fleetllm_end_to_end_s']:7.1f}")
    print(f"after / before (ratio of ratios): {summary['after']['ratio'] / summary['before']['ratio']:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"engine": args.engine, "prompts": args.prompts, "tokens": args.tokens,
                               "rounds": args.rounds, "before": before_sha, "after": after_sha,
                               "summary": summary, "runs": runs,
                               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
