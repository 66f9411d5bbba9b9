"""Tiny random-weight models with the SmolLM2 tokenizer, for tests and benchmarks.

A 2-layer Llama with the embedded model's tokenizer and chat template loads in about a second, so
tests exercise fleetllm's real path (chat template, tokenization, generation, detokenization)
without the cost of real weights. Output text is gibberish by design.
"""

from __future__ import annotations

from pathlib import Path

from fleetllm import models

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def make_tiny_model(out_dir: str | Path, layers: int = 2, hidden: int = 64, seed: int = 0,
                    max_position_embeddings: int = 512) -> Path:
    """Write a tiny Llama (random weights, SmolLM2 tokenizer) to `out_dir`; returns the folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    source = Path(models.resolve(models.EMBEDDED_DEFAULT).path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return save_whole(out, LlamaForCausalLM(config), tokenizer)


def save_whole(out: Path, *parts) -> Path:
    """`save_pretrained` of each part into a folder beside `out`, then renamed to `out`: a folder there is
    whole (one left by a killed test is the `.tmp`, made again)."""
    import shutil

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    for part in parts:
        part.save_pretrained(tmp)
    tmp.rename(out)
    return out
