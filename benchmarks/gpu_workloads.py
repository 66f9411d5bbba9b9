"""Model folders and workloads of the GPU benchmark (benchmarks/gpu_throughput.py).

Models are real shapes with dummy weights: a folder holding a `config.json` (Llama-3-8B's shape, or
SmolLM2-135M's) and the SmolLM2 tokenizer files, loaded with `load_format: dummy`, so fleetllm's real
path (chat template, tokenization, detokenization, writing) runs while no weights are downloaded.

Workloads (deterministic, seeded):
- a{N}: N prompts of ~256 input tokens (chat template included) and exactly 256 output tokens;
- b{N}: N prompts with long-tailed (log-normal) input and output lengths, as in chat logs, so a
  fixed batch stalls on its longest request.
Output lengths are fixed per row with `ignore_eos` + `max_tokens`.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

LLAMA3_8B_SHAPE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "torch_dtype": "bfloat16", "initializer_range": 0.02,
}

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy moment "
         "air teacher force education").split()


def make_models(tokenizer_dir: str | Path, dest: str | Path) -> dict[str, str]:
    """Write `llama3-8b-shape`, `smollm2-135m-shape` and `tiny-shape` folders under dest; returns {shape: folder}."""
    tokenizer_dir, dest = Path(tokenizer_dir), Path(dest)
    small = json.loads((tokenizer_dir / "config.json").read_text())
    shapes = {"llama3-8b-shape": {**LLAMA3_8B_SHAPE, "vocab_size": small["vocab_size"],
                                  "bos_token_id": small.get("bos_token_id"), "eos_token_id": small.get("eos_token_id")},
              "smollm2-135m-shape": {k: v for k, v in small.items() if k != "quantization_config"}}
    # 2 layers, hidden 64: compute is negligible, so a run measures the engine's and the pipeline's own
    # per-step and per-job costs (CPU diagnostics; not part of the GPU table)
    shapes["tiny-shape"] = {**shapes["smollm2-135m-shape"], "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                            "head_dim": 32}
    folders = {}
    for name, config in shapes.items():
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        for f in TOKENIZER_FILES:
            if (tokenizer_dir / f).exists():
                shutil.copy(tokenizer_dir / f, folder / f)
        folders[name] = str(folder)
    return folders


def _text_of_tokens(tokenizer, rng: random.Random, n: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(n + 8))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:max(1, n)]
    return tokenizer.decode(ids)


def template_overhead(tokenizer) -> int:
    """Tokens the chat template adds around a user message."""
    from fleetllm.engines.base import GenerationRequest
    from fleetllm.engines.chat import render_prompt

    text = render_prompt(tokenizer, GenerationRequest(messages=[{"role": "user", "content": "x"}]), {})
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) - 1


def make_workload(tokenizer, name: str, seed: int = 0) -> list[dict[str, Any]]:
    """Rows {id, text, sampling_params}; name is a{N} (fixed 256/256) or b{N} (long-tailed lengths),
    optionally a{N}-{L}: lengths scaled so that 256 becomes L (CPU smoke runs)."""
    kind, _, scale_to = name[1:].partition("-")  # a1024, or a8-32: 8 rows, lengths scaled to 32 (smoke runs)
    kind, count = name[0], int(kind)
    scale = int(scale_to) / 256 if scale_to else 1.0
    rng = random.Random(f"{name}-{seed}")
    overhead = template_overhead(tokenizer)
    rows = []
    for i in range(count):
        if kind == "a":
            n_in, n_out = 256, 256
        elif kind == "b":  # log-normal: median ~180 in / ~160 out, long tails, clipped
            n_in = int(min(2048, max(16, rng.lognormvariate(5.2, 0.9))))
            n_out = int(min(1024, max(8, rng.lognormvariate(5.1, 0.8))))
        else:
            raise ValueError(f"workload {name!r}: use a<N> or b<N>")
        n_in, n_out = max(overhead + 1, int(n_in * scale)), max(1, int(n_out * scale))
        rows.append({"id": f"{name}-{i}", "text": _text_of_tokens(tokenizer, rng, max(1, n_in - overhead)),
                     "sampling_params": {"max_tokens": n_out, "ignore_eos": True, "temperature": 0.0}})
    return rows


def prompt_ids(tokenizer, rows: list[dict[str, Any]]) -> list[list[int]]:
    """The token ids fleetllm's engines hand to the model for these rows (same chat template path)."""
    from fleetllm.engines.base import GenerationRequest
    from fleetllm.engines.chat import render_prompt

    out = []
    for row in rows:
        text = render_prompt(tokenizer, GenerationRequest(messages=[{"role": "user", "content": row["text"]}]), {})
        out.append([int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]])
    return out
