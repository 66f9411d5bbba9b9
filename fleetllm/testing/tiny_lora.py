"""LoRA adapters with random (non-zero) weights, made with peft, for tests and benchmarks.

peft initialises lora_B to zero (an adapter that changes nothing); these adapters fill both A and B with
seeded noise so each adapter's outputs differ from the base model's and from the other adapters'.
"""

from __future__ import annotations

from pathlib import Path

from fleetllm.testing.tiny_model import save_whole

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_lora_adapter(base_path: str | Path, out_dir: str | Path, seed: int, rank: int = 8,
                      scale: float = 0.5, model=None) -> Path:
    """Write a random LoRA adapter for the model in `base_path` to `out_dir` (reused when present).
    `model`: the base model already loaded (saves loading it once per adapter); it is left unchanged."""
    import torch
    from peft import LoraConfig, get_peft_model

    out = Path(out_dir)
    if (out / "adapter_config.json").exists():
        return out
    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(base_path)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale / param.shape[-1] ** 0.5)
    save_whole(out, peft_model)
    peft_model.unload()  # the base model's modules back as they were
    return out
