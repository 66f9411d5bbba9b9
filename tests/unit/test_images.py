"""fleetllm.engines.images: image parts fetched and checked, each failure naming the part and the limit."""

import base64
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetllm.engines.images import ImageLimits, load_images
from fleetllm.errors import RowError


def png(size=(20, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (0, 128, 0)).save(buf, "PNG")
    return buf.getvalue()


def msg(*urls, text="What is it?"):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def data(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def test_data_urls_load_and_parts_keep_their_place():
    messages, images = load_images(msg(data(png()), data(png((5, 5)))), ImageLimits())
    assert images == [png(), png((5, 5))]
    assert [p["image_url"]["url"] for p in messages[1]["content"][:2]] == ["image:0", "image:1"]
    assert messages[1]["content"][2] == {"type": "text", "text": "What is it?"}


@pytest.mark.parametrize("urls, limits, expected", [
    ([data(png())] * 3, ImageLimits(max_images=2), "3 images, more than the limit of 2"),
    ([data(png((300, 300)))], ImageLimits(max_pixels=10_000), r"messages\[1\].content\[0\]: the image is 300x300"),
    ([data(png())], ImageLimits(max_bytes=10), "more than 10 bytes"),
    (["data:image/png;base64,bm90IGFuIGltYWdl"], ImageLimits(), "not an image Pillow can read"),
    (["data:image/png;base64,%%%"], ImageLimits(), "not valid base64"),
    (["http://127.0.0.1:9/x.png"], ImageLimits(), "private address .*allow_private_urls"),
    (["http://10.1.2.3/x.png"], ImageLimits(), "private address"),
    (["/etc/hostname"], ImageLimits(), "scheme 'none' is not accepted"),
    (["s3://bucket/x.png"], ImageLimits(), "scheme 's3' is not accepted"),
])
def test_refusals_name_the_part_and_the_limit(urls, limits, expected):
    with pytest.raises(RowError, match=expected):
        load_images(msg(*urls), limits)


def test_local_files_only_where_allowed(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    _, images = load_images(msg(str(tmp_path / "a.png")), ImageLimits(local_files=True))
    assert images == [png()]


class Slow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/slow.png":
            time.sleep(2)
        if self.path == "/moved.png":  # a public URL may redirect anywhere: not followed
            self.send_response(302)
            self.send_header("Location", "/ok.png")
            self.end_headers()
            return
        if self.path == "/missing.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(png())

    def log_message(self, *args):
        pass


def test_http_fetch_with_timeout_when_private_addresses_are_allowed():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)  # the slow answer blocks no other
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        limits = ImageLimits(allow_private_urls=True, fetch_timeout_s=0.5)
        assert load_images(msg(f"{base}/ok.png"), limits)[1] == [png()]
        with pytest.raises(RowError, match=r"took more than 0.5 s \(fetch_timeout_s\)"):
            load_images(msg(f"{base}/slow.png"), limits)
        with pytest.raises(RowError, match=r"messages\[1\]\.content\[0\]: fetching the image gave HTTP 302"):
            load_images(msg(f"{base}/moved.png"), limits)
        with pytest.raises(RowError, match=r"gave HTTP 404"):
            load_images(msg(f"{base}/missing.png"), limits)
        with pytest.raises(RowError, match=r"more than 10 bytes \(max_bytes\)"):
            load_images(msg(f"{base}/ok.png"), ImageLimits(allow_private_urls=True, max_bytes=10))
    finally:
        server.shutdown()


def test_openai_batch_lines_name_adapters_and_keep_image_parts():
    import json as _json

    from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor

    pre = OpenAIBatchPreprocessor({}, "generate", ("a0", "a1"), images=True)

    def line(model, content="Hi"):
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        return pre({"_line": 0, "custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                    "body": _json.dumps(body)})

    assert line("a1")["_adapter"] == "a1" and line("base:a0")["_adapter"] == "a0"
    assert line("smollm2")["_adapter"] is None and line("smollm2")["error"] is None
    assert "not in model.lora_adapters" in line("smollm2:zz")["error"]
    row = line("smollm2", [{"type": "image_url", "image_url": {"url": data(png())}}, {"type": "text", "text": "?"}])
    assert row["error"] is None and '"image_url"' in row["_messages"]
    pre.images = False  # a text-only model: the part is refused as before, naming it
    row = line("smollm2", [{"type": "text", "text": "?"}, {"type": "image_url", "image_url": {"url": data(png())}}])
    assert row["error"].startswith("body.messages[0].content[1] is a content part of type 'image_url'")
