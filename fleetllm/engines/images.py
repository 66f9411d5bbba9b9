"""Images in chat messages: `{"type": "image_url", "image_url": {"url": ...}}` parts, fetched and checked.

A URL is `data:image/...;base64,...`, `https://`/`http://` (public addresses only unless
`allow_private_urls`), and where `local_files` is on (batch jobs) a local path, `file://` or an fsspec
object-store URL (s3://, gs://, ...). Every image is checked against `ImageLimits` (images per prompt,
bytes, pixels, fetch timeout) and decoded once with Pillow to prove it is an image; a failure is a
RowError naming the part (`messages[0].content[1]`), so it is that row's error or a 400 naming the part.

`load_images` returns the messages with each image part's URL dropped (the part stays, as
`{"type": "image_url", "image_url": {"url": "image:N"}}`, so engines know where the image sits) and the
fetched bytes in order. The batch pipeline runs it in a stage of its own (fleetllm.batch.execution.image_stage),
off the engine's critical path; engines turn the bytes into Pillow images (`decode`) and the parts into
the model's own shape (`model_messages`).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import socket
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlparse

from fleetllm.errors import RowError

PLACEHOLDER = "image:"  # an image part's URL once its bytes are loaded: image:<index>


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = 8  # image parts per prompt
    max_bytes: int = 20 << 20  # encoded size of one image
    max_pixels: int = 40_000_000  # width x height of one image (decompression bombs stay out)
    fetch_timeout_s: float = 10.0  # one http(s) fetch, connect to last byte
    allow_private_urls: bool = False  # http(s) to loopback, private, link-local addresses
    local_files: bool = False  # local paths, file:// and object-store URLs (batch jobs only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_reads_images(model_path: str) -> bool:
    """Whether a model folder's config has a vision tower (True where there is no config to read: a hub id)."""
    import json
    from pathlib import Path

    config = Path(model_path) / "config.json"
    if not config.is_file():
        return True
    try:
        return "vision_config" in json.loads(config.read_text())
    except ValueError:
        return True


def image_parts(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, part) of each image part, in order: where is `messages[i].content[j]`."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                    found.append((f"messages[{i}].content[{j}]", part))
    return found


def part_url(where: str, part: dict[str, Any]) -> str:
    """The URL of an image part (OpenAI's `image_url: {url}` or the short `image_url: "..."`)."""
    value = part.get("image_url") if part.get("type") == "image_url" else part.get("image")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{where} is an image part without a URL; give image_url: {{url: 'https://...' or "
                       "'data:image/png;base64,...'}")
    return value.strip()


def load_images(messages: list[dict[str, Any]], limits: ImageLimits) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The messages with image URLs replaced by `image:N`, and each image's bytes (checked); RowError
    naming the part when an image cannot be had."""
    parts = image_parts(messages)
    if not parts:
        return messages, []
    if len(parts) > limits.max_images:
        raise RowError(f"the prompt has {len(parts)} images, more than the limit of {limits.max_images} per prompt; "
                       "send fewer images (or raise the limit: max_images)")
    images: list[bytes] = []
    messages = [dict(m, content=[dict(p) for p in m["content"]]) if isinstance(m.get("content"), list) else dict(m)
                for m in messages]
    for n, (where, _) in enumerate(parts):
        i, j = (int(x.split("]")[0]) for x in where.split("[")[1:])
        part = messages[i]["content"][j]
        data = fetch(where, part_url(where, part), limits)
        check_image(where, data, limits)
        images.append(data)
        messages[i]["content"][j] = {"type": "image_url", "image_url": {"url": f"{PLACEHOLDER}{n}"}}
    return messages, images


def fetch(where: str, url: str, limits: ImageLimits) -> bytes:
    """The bytes an image URL names; RowError naming the part and what to do."""
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        return _data_url(where, url, limits)
    if scheme in ("http", "https"):
        return _http(where, url, limits)
    if not limits.local_files:
        raise RowError(f"{where}: image URL scheme {scheme or 'none'!r} is not accepted here; send an https:// URL "
                       "or a data: URL (base64)")
    try:
        import fsspec

        with fsspec.open(url, "rb") as f:
            data = f.read(limits.max_bytes + 1)
    except (OSError, ValueError, ImportError) as exc:
        raise RowError(f"{where}: could not read image {url[:200]!r}: {exc}") from None
    return _sized(where, data, limits)


def _sized(where: str, data: bytes, limits: ImageLimits) -> bytes:
    if len(data) > limits.max_bytes:
        raise RowError(f"{where}: the image is more than {limits.max_bytes} bytes (max_bytes); send a smaller image")
    return data


def _data_url(where: str, url: str, limits: ImageLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header:
        raise RowError(f"{where}: a data: URL must be base64, as data:image/png;base64,<data>")
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise RowError(f"{where}: the image is more than {limits.max_bytes} bytes (max_bytes); send a smaller image")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RowError(f"{where}: the data: URL is not valid base64") from None


def check_public(where: str, host: str, limits: ImageLimits) -> None:
    """RowError when `host` resolves to a loopback, private, link-local or reserved address (unless allowed)."""
    if limits.allow_private_urls:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError) as exc:
        raise RowError(f"{where}: cannot resolve the image host {host!r}: {exc}") from None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not ip.is_global:
            raise RowError(f"{where}: image URL host {host!r} is a private address ({ip}); fleetllm fetches public "
                           "URLs only (set allow_private_urls to fetch from private networks)")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed (a public URL could redirect to a private address): a 3xx is an HTTPError."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None


def _http(where: str, url: str, limits: ImageLimits) -> bytes:
    """An http(s) image with the standard library (httpx is a test tool only): no redirects, at most
    max_bytes + 1 bytes read, fetch_timeout_s from connect to the last byte."""
    host = urlparse(url).hostname or ""
    check_public(where, host, limits)
    deadline = time.monotonic() + limits.fetch_timeout_s
    took = (f"{where}: fetching the image took more than {limits.fetch_timeout_s} s (fetch_timeout_s): "
            f"{url[:200]}")
    opener = urllib.request.build_opener(_NoRedirects)
    data = bytearray()
    try:
        with opener.open(urllib.request.Request(url, headers={"User-Agent": "fleetllm"}),
                         timeout=limits.fetch_timeout_s) as response:
            while len(data) <= limits.max_bytes:
                if time.monotonic() > deadline:
                    raise RowError(took)
                chunk = response.read(min(1 << 16, limits.max_bytes + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
    except urllib.error.HTTPError as exc:
        raise RowError(f"{where}: fetching the image gave HTTP {exc.code} ({url[:200]})") from None
    except (TimeoutError, socket.timeout):
        raise RowError(took) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise RowError(took) from None
        raise RowError(f"{where}: could not fetch the image {url[:200]}: {exc.reason}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise RowError(f"{where}: could not fetch the image {url[:200]}: {exc}") from None
    return _sized(where, bytes(data), limits)


def check_image(where: str, data: bytes, limits: ImageLimits) -> tuple[int, int]:
    """(width, height) of an encoded image; RowError when it is not an image Pillow reads, or too large."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > limits.max_pixels:
                raise RowError(f"{where}: the image is {width}x{height} pixels, more than max_pixels "
                               f"({limits.max_pixels}); send a smaller image")
            image.verify()
    except RowError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        detail = "" if isinstance(exc, UnidentifiedImageError) else f": {exc}"  # (its text holds an object's address)
        raise RowError(f"{where}: the data is not an image Pillow can read ({type(exc).__name__}{detail})") from None
    return width, height


def decode(data: bytes):
    """A Pillow RGB image from checked bytes."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def model_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a processor's chat template: image parts become `{"type": "image"}` (the Hugging Face
    shape that SmolVLM, Qwen2-VL, LLaVA... templates place their image tokens for)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image"} if isinstance(p, dict) and p.get("type") in ("image_url", "image") else p
                       for p in content]
        out.append({**m, "content": content})
    return out
