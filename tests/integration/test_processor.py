"""The ray.data.llm-shaped processor API on a local Ray cluster."""

from fleetllm import TransformersEngineProcessorConfig, build_processor


def test_processor_keeps_input_columns_and_adds_outputs(ray_local, tiny_model):
    import ray

    config = TransformersEngineProcessorConfig(model_source=tiny_model, concurrency=1, batch_size=3)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(messages=[{"role": "user", "content": row["instruction"]}],
                                    sampling_params=dict(temperature=0.0, max_tokens=5)),
        postprocess=lambda row: dict(answer=row["generated_text"], **row),
    )
    ds = ray.data.from_items([{"instruction": f"Say {i}", "k": i} for i in range(7)])
    rows = sorted(processor(ds).take_all(), key=lambda r: r["k"])
    assert [r["k"] for r in rows] == list(range(7))
    for r in rows:
        assert r["instruction"].startswith("Say") and r["answer"] == r["generated_text"]
        assert 0 < r["num_generated_tokens"] <= 5 and r["num_input_tokens"] > 0 and r["error"] is None
        assert "_node" not in r
    # exactly the user's columns (input, preprocess, postprocess) and the documented output columns
    from fleetllm.batch.processor import OUTPUT_COLUMNS

    assert set(rows[0]) == {"instruction", "k", "messages", "sampling_params", "answer", *OUTPUT_COLUMNS}
