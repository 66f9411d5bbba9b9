"""`fleetllm serve` with a vision-language model and a chat model with LoRA adapters, through the official
openai client: an image part in a chat message, an adapter named as the model, and their errors; the Batch API
takes the same (an adapter as a line's model, image parts in its messages)."""

import base64
import io
import json

import openai
import pytest

from fleetllm.testing.tiny_vlm import IMAGE_TOKENS


def data_url(color=(255, 0, 0)) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_model):
    from fleetllm.testing.serve_process import ServeProcess
    from fleetllm.testing.tiny_lora import make_lora_adapter
    from fleetllm.testing.tiny_vlm import make_tiny_vlm

    root = tmp_path_factory.mktemp("served-images-adapters")
    vlm = make_tiny_vlm(root / "vlm")
    adapters = {f"a{i}": str(make_lora_adapter(embedded_model, root / f"a{i}", seed=i)) for i in range(2)}
    common = {"engine": "transformers", "cpus_per_replica": 0.5, "max_ongoing_requests": 4}
    spec = {"name": "images-adapters", "models": [
        {**common, "model_id": "vlm", "source": str(vlm)},
        {**common, "model_id": "smollm2", "source": embedded_model, "lora_adapters": adapters}],
        "batches": {"path": str(root / "batches"), "shard_rows": 4}}
    server = ServeProcess(spec, root).start()
    yield openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    server.stop()


def chat(client, model, content, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0, **kw)


def test_adapters_are_models_and_answer_as_themselves(served):
    cards = {m.id: m for m in served.models.list().data}
    assert {"vlm", "smollm2", "a0", "a1"} <= set(cards)
    assert cards["a0"].model_extra.get("parent") == "smollm2"
    base = chat(served, "smollm2", "Name a colour.").choices[0].message.content
    a0 = chat(served, "a0", "Name a colour.")
    assert a0.model == "a0" and a0.choices[0].message.content != base
    assert chat(served, "smollm2:a0", "Name a colour.").choices[0].message.content == a0.choices[0].message.content
    assert chat(served, "a1", "Name a colour.").choices[0].message.content != a0.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as err:
        chat(served, "smollm2:nope", "Name a colour.")
    assert err.value.code == "model_not_found" and "smollm2:nope" in err.value.message


def test_image_part_counts_its_tokens_and_bad_images_are_400s(served):
    text_only = chat(served, "vlm", [{"type": "text", "text": "Describe it."}])
    with_image = chat(served, "vlm", [{"type": "image_url", "image_url": {"url": data_url()}},
                                      {"type": "text", "text": "Describe it."}])
    assert with_image.choices[0].message.content
    assert with_image.usage.prompt_tokens >= text_only.usage.prompt_tokens + IMAGE_TOKENS + 2
    with pytest.raises(openai.BadRequestError) as err:
        chat(served, "vlm", [{"type": "text", "text": "Describe it."},
                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}])
    assert "messages[0].content[1]" in err.value.message and "not an image" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        chat(served, "vlm", [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}])
    assert "private address" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # a text-only model refuses the image, naming why
        chat(served, "smollm2", [{"type": "image_url", "image_url": {"url": data_url()}}])
    assert "reads text only" in err.value.message


def test_batch_api_lines_name_an_adapter_and_carry_image_parts(served):
    from fleetllm.testing.batch_client import read_lines, submit, wait_for

    def line(custom_id, model, content):
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 6,
                         "temperature": 0}}

    image = [{"type": "image_url", "image_url": {"url": data_url()}}, {"type": "text", "text": "Describe it."}]
    bad = [{"type": "text", "text": "Describe it."},
           {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]
    on_adapter = submit(served, [line("c", "smollm2:a1", "Name a colour.")])
    on_vlm = submit(served, [line("img", "vlm", image), line("bad", "vlm", bad)])

    batch = wait_for(served, on_adapter.id)
    assert batch.status == "completed" and batch.request_counts.completed == 1, batch.errors
    body = read_lines(served, batch.output_file_id)[0]["response"]["body"]
    assert body["model"] == "smollm2:a1"
    assert body["choices"][0]["message"]["content"] == chat(served, "a1", "Name a colour.").choices[0].message.content

    batch = wait_for(served, on_vlm.id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    out, err = read_lines(served, batch.output_file_id), read_lines(served, batch.error_file_id)
    assert out[0]["custom_id"] == "img"
    assert out[0]["response"]["body"]["usage"]["prompt_tokens"] == chat(served, "vlm", image).usage.prompt_tokens
    assert err[0]["custom_id"] == "bad" and "messages[0].content[1]" in json.dumps(err[0])
