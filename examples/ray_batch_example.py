"""Ray's LLM batch example, with fleetllm: the only change is the import.

Run: .venv/bin/python examples/ray_batch_example.py
"""

import ray

from fleetllm import TransformersEngineProcessorConfig, build_processor

config = TransformersEngineProcessorConfig(
    model_source="smollm2-135m-instruct",
    engine_kwargs={},
    concurrency=1,
    batch_size=16,
)
processor = build_processor(
    config,
    preprocess=lambda row: dict(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": row["instruction"]},
        ],
        sampling_params=dict(temperature=0.0, max_tokens=32),
    ),
    postprocess=lambda row: dict(answer=row["generated_text"], **row),
)

if __name__ == "__main__":
    ds = ray.data.from_items([
        {"instruction": "What is the capital of France?"},
        {"instruction": "Name three primary colors."},
        {"instruction": "Write a haiku about autumn."},
    ])
    ds = processor(ds)
    ds.write_parquet("out/ray_batch_example")
    for row in ray.data.read_parquet("out/ray_batch_example").take_all():
        print(row["instruction"], "->", row["answer"])
