"""Interactive latency with and without a Batch API batch running on the same `fleetllm serve` (issue 34,
must-show 3), side by side in one call.

Per round (rounds interleaved, medians reported, the count said):
  1. alone:      `vllm bench serve` (openai-chat, random IN in / OUT out, --ignore-eos) at --concurrency;
  2. with batch: a --batch-size request batch (the same lengths, ignore_eos) is created through the openai
                 client; once it runs, the same interactive load; the server's total output tokens/s over that
                 window (interactive + batch, from /metrics); then the batch is cancelled;
  3. peak:       the same load alone at --peak-concurrency (the server's peak output tokens/s).
Ratios: interactive TTFT p50 / p99 and ITL p99 with batch over alone (target <= 1.25), total tok/s with batch
over peak (target >= 0.9). Prints the table, writes JSON.

    # GPU (8B shape, dummy weights; see /work/shared/gpu/README.md for the machine's setup):
    python3 benchmarks/batch_api_interference.py --tokenizer-dir .gpu/m --shape llama3-8b-shape --rounds 3 \
        --out benchmarks/results/batch_api_interference.json
    # the window steered by the interactive streams' p99 gap, with a small step budget (docs/batch-api.md):
    python3 benchmarks/batch_api_interference.py --tokenizer-dir .gpu/m --shape llama3-8b-shape --rounds 3 \
        --admission-signal gap_p99 --engine-kwargs '{"max_num_batched_tokens": 384, "max_num_seqs": 384}'
    # CPU smoke (tiny scale, the transformers engine and the embedded model):
    python benchmarks/batch_api_interference.py --model smollm2-135m-instruct --engine transformers \
        --input-len 32 --output-len 16 --concurrency 2 --peak-concurrency 8 --prompts 8 --batch-size 48 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_gpu import bench_argv, run_bench, save, summarize  # noqa: E402
from serve_servers import Server, bench_env  # noqa: E402

RATIOS = (("ttft_p50", "median_ttft_ms"), ("ttft_p99", "p99_ttft_ms"), ("itl_p99", "p99_itl_ms"))


def start_server(args, model: str, work: Path) -> Server:
    import yaml

    kwargs = {**({"load_format": "dummy"} if args.shape else {}), **json.loads(args.engine_kwargs)}
    if args.engine == "vllm" and shutil.which("nvidia-smi"):
        kwargs.setdefault("gpu_memory_utilization", 0.9)
    spec = {"name": "batchbench", "host": "127.0.0.1", "port": args.port, "models": [{
        "model_id": "bench", "source": model, "engine": args.engine, "engine_kwargs": kwargs,
        "max_ongoing_requests": args.max_ongoing, "max_queued_requests": max(256, args.max_ongoing),
        "gpus_per_replica": 1.0 if shutil.which("nvidia-smi") else 0.0}],
        "batches": {"path": str(work / "batches"), "shard_rows": args.shard_rows}}
    (work / "serve.yaml").write_text(yaml.safe_dump(spec))
    env = {**bench_env(), "FLEETLLM_BATCH_ADMISSION_SIGNAL": args.admission_signal}
    server = Server("fleetllm", [sys.executable, "-m", "fleetllm", "serve", str(work / "serve.yaml")], args.port,
                    env, work / "serve.log").start()
    if not server.wait_ready(args.start_timeout_s):
        raise RuntimeError(f"fleetllm serve did not start:\n{server.tail()}")
    return server


def batch_lines(model_dir: str, args) -> bytes:
    """--batch-size chat requests of ~input-len prompt tokens and output-len generated tokens each."""
    import random

    from transformers import AutoTokenizer

    from gpu_workloads import _text_of_tokens

    tok = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    texts = [_text_of_tokens(tok, rng, args.input_len) for _ in range(min(64, args.batch_size))]
    lines = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "bench", "messages": [{"role": "user", "content": f"{i} " + texts[i % len(texts)]}],
                       "max_tokens": args.output_len, "ignore_eos": True, "temperature": 0}}
             for i in range(args.batch_size)]
    return "\n".join(json.dumps(x) for x in lines).encode() + b"\n"


def metric_samples(url: str) -> list:
    """The server's /metrics, as prometheus_client's parsed samples."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return [sample for fam in text_string_to_metric_families(text) for sample in fam.samples]


def total(samples: list, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def output_tokens(samples: list, batch_only: bool = False) -> float:
    """Interactive + batch output tokens the server has counted; the batch's alone."""
    batch = total(samples, "fleetllm_batch_output_tokens_total")
    return batch if batch_only else batch + total(samples, "fleetllm_output_tokens_total")


def batch_rows_answered(samples: list) -> float:
    """Batch API rows answered with a 200: each row's request as it finishes, before the shard's commit (the
    batch's `request_counts` move at commits only, so a short leg may show none)."""
    return total(samples, "fleetllm_batch_requests_total", status="200")


def admission(samples: list) -> dict:
    """The batch admission window's gauges: window, waiting rows, re-learned baselines."""
    prefix = "fleetllm_batch_admission_"
    return {s.name.removeprefix(prefix): s.value for s in samples if s.name.startswith(prefix)}


def with_batch(server: Server, client, file_id: str, argv: list[str], args) -> dict:
    """Start the batch, wait until it computes, run the interactive load, measure, cancel."""
    import openai

    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.time() + args.start_timeout_s
    tokens0 = output_tokens(metric_samples(server.url))
    while output_tokens(metric_samples(server.url)) - tokens0 < args.output_len * 2 and time.time() < deadline:
        time.sleep(0.5)  # the batch's job started and its rows are being answered
    t0, before = time.time(), metric_samples(server.url)
    result, _ = run_bench(argv)
    after = metric_samples(server.url)  # one read for the tokens and the window's gauges at the leg's end
    wall, toks = time.time() - t0, output_tokens(after) - output_tokens(before)
    batch_toks = output_tokens(after, batch_only=True) - output_tokens(before, batch_only=True)
    rows = batch_rows_answered(after) - batch_rows_answered(before)
    state, gate = client.batches.retrieve(batch.id), admission(after)
    try:
        client.batches.cancel(batch.id)
    except openai.ConflictError:  # it finished during the load (a small batch): nothing to cancel
        pass
    while client.batches.retrieve(batch.id).status not in ("cancelled", "completed", "failed", "expired"):
        time.sleep(0.5)
    run = summarize(result)
    run.update(total_output_tok_s=round(toks / wall, 1), batch_output_tok_s=round(batch_toks / wall, 1),
               batch_rows_answered_during=int(rows), batch_completed_during=state.request_counts.completed,
               batch_status_during=state.status, admission_at_end=gate)
    return run


def ratios(rounds: list[dict]) -> dict:
    out = {}
    for name, key in RATIOS:
        vals = [r["with_batch"][key] / r["alone"][key] for r in rounds if r["alone"].get(key)]
        out[f"{name}_ratio"] = round(statistics.median(vals), 3) if vals else None
    vals = [r["with_batch"]["total_output_tok_s"] / r["peak"]["output_throughput"] for r in rounds]
    out["total_tok_s_vs_peak"] = round(statistics.median(vals), 3)
    return out


def print_table(doc: dict) -> None:
    med = lambda leg, key: statistics.median(r[leg][key] for r in doc["rounds"])  # noqa: E731
    print(f"\n{len(doc['rounds'])} round(s), medians; interactive c={doc['args']['concurrency']}, "
          f"{doc['args']['input_len']} in / {doc['args']['output_len']} out; "
          f"batch {doc['args']['batch_size']} requests; window steered by {doc['args'].get('admission_signal')}")
    print(f"{'metric':<26}{'alone':>12}{'with batch':>12}{'ratio':>8}  target")
    for name, key in RATIOS:
        print(f"{name + ' (ms)':<26}{med('alone', key):>12.1f}{med('with_batch', key):>12.1f}"
              f"{doc['summary'][name + '_ratio']:>8.2f}  <= 1.25")
    print(f"{'total output tok/s':<26}{med('peak', 'output_throughput'):>12.1f}"
          f"{med('with_batch', 'total_output_tok_s'):>12.1f}{doc['summary']['total_tok_s_vs_peak']:>8.2f}  >= 0.9 "
          f"(alone: peak at c={doc['args']['peak_concurrency']})")
    waves = lambda leg: [(r[leg].get("waves") or {}).get("send_bursts") for r in doc["rounds"]]  # noqa: E731
    print(f"bursts sent a round (alone / with batch; {doc['args']['prompts']} requests: near that many is spread out, "
          f"near prompts / c is lock-step): {waves('alone')} / {waves('with_batch')}")
    leg = lambda key: [r["with_batch"].get(key) for r in doc["rounds"]]  # noqa: E731
    print(f"batch during the with-batch leg: rows answered {leg('batch_rows_answered_during')}, output tok/s "
          f"{leg('batch_output_tok_s')}, rows committed {leg('batch_completed_during')}, window at the end "
          f"{[(g or {}).get('window') for g in leg('admission_at_end')]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder or alias (default: the --shape folder made from --tokenizer-dir)")
    p.add_argument("--tokenizer-dir", help="a tokenizer folder (SmolLM2's) for the dummy-weight --shape models")
    p.add_argument("--shape", default=None, help="llama3-8b-shape (GPU) | smollm2-135m-shape | tiny-shape")
    p.add_argument("--engine", default="vllm")
    p.add_argument("--engine-kwargs", default="{}")
    p.add_argument("--admission-signal", default="token_latency", choices=["token_latency", "gap_p99"],
                   help="what steers the batch rows' window (fleetllm.serve.batch_admission)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--request-rate", type=float, default=None,
                   help="the interactive legs' Poisson arrivals a second, still at most --concurrency at once "
                        "(default: closed loop; its equal-length streams can run in lock-step waves alone: lease 20)")
    p.add_argument("--peak-concurrency", type=int, default=256)
    p.add_argument("--prompts", type=int, default=128, help="interactive requests per load run")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--max-ongoing", type=int, default=256, help="the replica's max_ongoing_requests")
    p.add_argument("--shard-rows", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--start-timeout-s", type=float, default=600)
    p.add_argument("--out", default="benchmarks/results/batch_api_interference.json")
    args = p.parse_args()
    import openai

    work = Path(tempfile.mkdtemp(prefix="batchbench-"))
    model = args.model
    if args.shape:
        from gpu_workloads import make_models

        model = make_models(args.tokenizer_dir, work / "models")[args.shape]
    from fleetllm import models as fm

    model_dir = fm.resolve(model).path
    doc = {"args": vars(args), "rounds": [], "summary": {}}
    server = start_server(args, model, work)
    try:
        client = openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=2, timeout=600)
        file_id = client.files.create(file=("batch.jsonl", batch_lines(model_dir, args)), purpose="batch").id
        # every leg of every round its own random prompts: with one seed for all (leases 10-19), the with-batch
        # leg's interactive prompts and every later round's sat in vLLM's prefix cache and skipped their prefill
        argv = lambda c, n, seed, rate=args.request_rate: bench_argv(  # noqa: E731
            server, model_dir, args, c, rate, n, seed=seed)
        peak_prompts = max(args.prompts, 2 * args.peak_concurrency)  # every slot busy for two waves
        for r in range(args.rounds):
            seed = 100 * (r + 1)
            rnd = {"alone": summarize(run_bench(argv(args.concurrency, args.prompts, seed + 1))[0]),
                   "with_batch": with_batch(server, client, file_id, argv(args.concurrency, args.prompts, seed + 2),
                                            args),
                   "peak": summarize(run_bench(argv(args.peak_concurrency, peak_prompts, seed + 3, None))[0])}
            doc["rounds"].append(rnd)
            doc["summary"] = ratios(doc["rounds"])
            save(doc, Path(args.out))
            print(f"round {r + 1}: {json.dumps(doc['summary'])}", flush=True)
    finally:
        server.stop()
    print_table(doc)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
