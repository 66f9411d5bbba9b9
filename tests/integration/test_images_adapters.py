"""Images in chat messages and LoRA adapters in batch jobs, on the transformers engine (in-process runs).

A tiny random-weight Idefics3 (SmolVLM's architecture, fleetllm.testing.tiny_vlm) reads the images; three
random LoRA adapters made with peft (fleetllm.testing.tiny_lora) sit on the embedded chat model.
"""

import base64
import io
import json

import pyarrow.dataset as pads
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.spec import JobSpec
from fleetllm.testing.tiny_vlm import IMAGE_TOKENS


def read_output(path) -> dict[str, dict]:
    rows = pads.dataset(str(path), format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    return {r["row_id"]: r for r in rows}


def png(color, size=(40, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory, embedded_model) -> str:
    from fleetllm.testing.tiny_vlm import make_tiny_vlm

    return str(make_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm"))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, embedded_model) -> dict[str, str]:
    from transformers import AutoModelForCausalLM

    from fleetllm.testing.tiny_lora import make_lora_adapter

    base = AutoModelForCausalLM.from_pretrained(embedded_model)
    root = tmp_path_factory.mktemp("adapters")
    return {f"a{i}": str(make_lora_adapter(embedded_model, root / f"a{i}", seed=i, model=base)) for i in range(3)}


def job(tmp_path, name, model, rows, **over) -> JobSpec:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"model": {"engine": "transformers", **model}, "input": {"path": str(src), "id_column": "id"},
            "sampling": {"max_tokens": 8}, "output": {"path": str(tmp_path / name), "shard_rows": 4},
            "compute": {"batch_size": 8}}
    data.update(over)
    return JobSpec.model_validate(data)


def test_image_rows_count_image_tokens_and_bad_images_fail_alone(tiny_vlm, tmp_path):
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    (tmp_path / "red.png").write_bytes(red)
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    data_url = "data:image/png;base64," + base64.b64encode(red).decode()
    rows = [
        {"id": "path", "q": "Describe it.", "img": str(tmp_path / "red.png")},
        {"id": "text", "q": "Describe it."},  # no image: a text-only row of the same model
        {"id": "blue", "q": "Describe it.", "img": "data:image/png;base64," + base64.b64encode(blue).decode()},
        {"id": "bad", "q": "Describe it.", "img": str(tmp_path / "bad.png")},
        {"id": "private", "q": "Describe it.", "img": "http://127.0.0.1:9/cat.png"},
        {"id": "missing", "q": "Describe it.", "img": str(tmp_path / "nowhere.png")},
    ]
    spec = job(tmp_path, "cols", {"source": tiny_vlm}, rows, prompt={"template": "{q}", "image_column": "img"})
    out = read_output(run_job(spec) and spec.output.path)
    assert out["path"]["error"] is None and out["text"]["error"] is None and out["blue"]["error"] is None
    # the image's tokens count: <image> x IMAGE_TOKENS plus the processor's markers around them
    assert out["path"]["num_input_tokens"] >= out["text"]["num_input_tokens"] + IMAGE_TOKENS + 2
    assert out["path"]["generated_text"] != out["blue"]["generated_text"]  # the pixels reach the model
    assert "messages[0].content[0]" in out["bad"]["error"] and "not an image" in out["bad"]["error"]
    assert "private address" in out["private"]["error"] and "allow_private_urls" in out["private"]["error"]
    assert "could not read image" in out["missing"]["error"]
    # `fleetllm calibrate`'s probe rows go through the image stage as the job's rows do
    from fleetllm.batch.reports.estimate_probe import call_table, probe_rows
    from fleetllm.batch.planning.job_plan import plan_job

    probed = call_table(plan_job(spec), probe_rows(plan_job(spec), 4), None).to_pylist()
    assert probed[0]["_images"] == [red] and probed[1]["_images"] is None and "not an image" in probed[3]["error"]

    # the same image as an image_url part of the row's own messages (a data: URL) gives the same output
    part = [{"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": "Describe it."}]
    too_many = [{"type": "image_url", "image_url": {"url": data_url}}] * 3 + part[1:]
    spec = job(tmp_path, "msgs", {"source": tiny_vlm},
               [{"id": "m", "messages": [{"role": "user", "content": part}]},
                {"id": "many", "messages": [{"role": "user", "content": too_many}]}],
               prompt={"images": {"max_images": 2}})
    again = read_output(run_job(spec) and spec.output.path)
    assert again["m"]["generated_text"] == out["path"]["generated_text"]
    assert again["m"]["num_input_tokens"] == out["path"]["num_input_tokens"]
    assert "3 images" in again["many"]["error"] and "max_images" in again["many"]["error"]


def test_mixed_adapters_match_each_adapter_alone(embedded_model, adapters, tmp_path):
    questions = ["Name a colour.", "Name a fruit.", "Say hello."]
    names = [None, "a0", "a1", "a2"]
    rows = [{"id": f"{name or 'base'}-{k}", "q": q, "adapter": name} for k, q in enumerate(questions[:2])
            for name in names]
    rows.append({"id": "unknown", "q": questions[2], "adapter": "nope"})
    spec = job(tmp_path, "mixed", {"source": embedded_model, "lora_adapters": adapters, "adapter_column": "adapter"},
               rows, prompt={"template": "{q}"})
    mixed = read_output(run_job(spec) and spec.output.path)
    from fleetllm.batch.planning.job_plan import plan_job

    assert plan_job(spec).pending == []  # a dry run resolves the adapter folders as the run did
    assert "'nope'" in mixed["unknown"]["error"] and "model.lora_adapters" in mixed["unknown"]["error"]
    texts = {}
    for name in names:  # the same rows in a job of that adapter alone (base: a job without adapters)
        model = {"source": embedded_model}
        if name:
            model.update(lora_adapters={name: adapters[name]}, adapter_column="adapter")
        alone = job(tmp_path, f"alone-{name}", model, [r for r in rows if r["adapter"] == name],
                    prompt={"template": "{q}"})
        for row_id, row in read_output(run_job(alone) and alone.output.path).items():
            assert row["error"] is None
            assert mixed[row_id]["generated_text"] == row["generated_text"], row_id
            texts[row_id] = row["generated_text"]
    for k in range(2):  # every adapter changes the output: a dropped adapter would not pass as the base
        assert len({texts[f"{name or 'base'}-{k}"] for name in names}) == len(names)
