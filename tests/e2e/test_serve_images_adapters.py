"""`fleetllm serve` with a vision-language model and a chat model with LoRA adapters, through the official
openai client: an image part in a chat message, an adapter named as the model, and their errors."""

import base64
import io

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
        {**common, "model_id": "smollm2", "source": embedded_model, "lora_adapters": adapters}]}
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
