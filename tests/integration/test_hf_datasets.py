"""Hugging Face datasets in a Ray user's hands: the seed driver's shape, load_dataset ->
ray.data.from_huggingface -> build_processor, on local parquet files.

(The files are named through `data_files`: a dataset loaded by folder name makes Ray's from_huggingface
ask huggingface.co for that name's parquet files, which raises where the hub cannot be reached.)"""

import pytest

from fleetllm import TransformersEngineProcessorConfig, build_processor

datasets = pytest.importorskip("datasets")


def test_load_dataset_from_huggingface_build_processor(ray_local, tiny_model, tmp_path):
    import ray

    (tmp_path / "alpaca" / "data").mkdir(parents=True)
    rows = {"instruction": [f"Say {i}" for i in range(9)], "input": [""] * 9, "output": ["x"] * 9}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "alpaca" / "data" / "train-00000.parquet"))
    hf = datasets.load_dataset("parquet", data_files=str(tmp_path / "alpaca" / "data" / "*.parquet"),
                               split="train[:6]")
    ds = ray.data.from_huggingface(hf)
    config = TransformersEngineProcessorConfig(model_source=tiny_model, concurrency=1, batch_size=4)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(messages=[{"role": "user", "content": row["instruction"]}],
                                    sampling_params=dict(temperature=0.0, max_tokens=4)),
        postprocess=lambda row: dict(instruction=row["instruction"], answer=row["generated_text"],
                                     error=row["error"]),
    )
    out = sorted(processor(ds).take_all(), key=lambda r: int(r["instruction"].split()[1]))
    assert [r["instruction"] for r in out] == [f"Say {i}" for i in range(6)]
    assert all(r["error"] is None and r["answer"] for r in out)
