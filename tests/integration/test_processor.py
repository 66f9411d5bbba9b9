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
        assert "_run" not in r and "_node" not in r  # the replica's telemetry stays inside
    # exactly the user's columns (input, preprocess, postprocess) and the documented output columns
    from fleetllm.batch.processor import OUTPUT_COLUMNS

    assert set(rows[0]) == {"instruction", "k", "messages", "sampling_params", "answer", *OUTPUT_COLUMNS}


def test_processor_rows_with_image_parts_and_adapters(ray_local, tiny_model, tmp_path):
    """Ray Data LLM's VLM rows (messages with image_url parts) and a row's `model` naming its LoRA adapter."""
    import base64
    import io

    import ray
    from PIL import Image

    from fleetllm.testing.tiny_lora import make_lora_adapter
    from fleetllm.testing.tiny_vlm import IMAGE_TOKENS, make_tiny_vlm

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (255, 0, 0)).save(buf, "PNG")
    urls = {"red": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
            "bad": "data:image/png;base64,bm90IGFuIGltYWdl", "text": None}

    def vlm_row(row):
        parts = [{"type": "image_url", "image_url": {"url": row["url"]}}] if row["url"] else []
        return dict(messages=[{"role": "user", "content": [*parts, {"type": "text", "text": "Describe it."}]}],
                    sampling_params=dict(temperature=0.0, max_tokens=4))

    config = TransformersEngineProcessorConfig(model_source=str(make_tiny_vlm(tmp_path / "vlm")), concurrency=1,
                                               batch_size=4)
    out = {r["k"]: r for r in build_processor(config, preprocess=vlm_row)(
        ray.data.from_items([{"k": k, "url": u} for k, u in urls.items()])).take_all()}
    assert out["red"]["error"] is None and out["text"]["error"] is None
    assert out["red"]["num_input_tokens"] >= out["text"]["num_input_tokens"] + IMAGE_TOKENS + 2
    assert "messages[0].content[0]" in out["bad"]["error"] and "not an image" in out["bad"]["error"]

    adapters = {f"a{i}": str(make_lora_adapter(tiny_model, tmp_path / f"a{i}", seed=i)) for i in range(2)}
    config = TransformersEngineProcessorConfig(model_source=tiny_model, concurrency=1, batch_size=8,
                                               lora_adapters=adapters)
    items = [{"k": f"{m}-{n}", "model": m} for m in ("a0", "a1", None) for n in range(2)]
    items += [{"k": "base-by-name", "model": tiny_model}, {"k": "typo", "model": "a9"}]
    rows = {r["k"]: r for r in build_processor(config, preprocess=lambda row: dict(
        messages=[{"role": "user", "content": "Name a colour."}], sampling_params=dict(temperature=0.0, max_tokens=6)),
    )(ray.data.from_items(items)).take_all()}
    out = {k: r["generated_text"] for k, r in rows.items()}
    assert all(out[f"{m}-0"] == out[f"{m}-1"] for m in ("a0", "a1", None))  # each row on its own adapter
    assert len({out["a0-0"], out["a1-0"], out["None-0"]}) == 3
    assert out["base-by-name"] == out["None-0"] and rows["base-by-name"]["error"] is None  # the base model's name
    assert "'a9'" in rows["typo"]["error"] and "lora_adapters" in rows["typo"]["error"]  # an unknown adapter: its error
    assert rows["typo"]["generated_text"] is None and all(r["error"] is None for k, r in rows.items() if k != "typo")
