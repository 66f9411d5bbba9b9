"""The OpenAI embeddings shape (POST /v1/embeddings), shared by serve (fleetllm.serve.api) and OpenAI
Batch files (fleetllm.batch.inputs.openai_batch): the request, the response, and base64 vectors.

    {"model": "minilm", "input": "text" | ["text", ...] | [token ids] | [[token ids], ...],
     "encoding_format": "float" | "base64", "dimensions": 256, "user": "..."}
 -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...] | "<base64>"}],
     "model": "minilm", "usage": {"prompt_tokens": N, "total_tokens": N}}

base64 is the little-endian float32 bytes of the vector, as OpenAI sends it (the official client asks
for it by default and decodes it with numpy). Unknown fields are refused with a 400 naming them.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="The served embedding model's id.")
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="Text, a list of texts, a list of token ids, or a list of token-id lists.")
    encoding_format: Literal["float", "base64"] = Field("float", description="float lists or base64 float32.")
    dimensions: int | None = Field(None, ge=1, description="Cut vectors to this size (Matryoshka models only).")
    user: str | None = Field(None, description="End-user id (accepted, not used).")

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value:
                raise ValueError("`input` is an empty string; give text to embed")
            return value
        if not value:
            raise ValueError("`input` is an empty list; give at least one text")
        if len(value) > MAX_INPUTS:
            raise ValueError(f"`input` holds {len(value)} items; send at most {MAX_INPUTS} per request")
        if isinstance(value[0], str) and any(not v for v in value):
            raise ValueError("`input` holds an empty string; every text must have content")
        if isinstance(value[0], list) and any(not v for v in value):
            raise ValueError("`input` holds an empty token list")
        return value

    def items(self) -> list[dict[str, Any]]:
        """One {text} or {token_ids} per input, in order."""
        value = self.input
        if isinstance(value, str):
            return [{"text": value}]
        if isinstance(value[0], int):
            return [{"token_ids": list(value)}]
        return [{"text": v} if isinstance(v, str) else {"token_ids": list(v)} for v in value]


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embeddings_response(model: str, vectors: list[list[float]], prompt_tokens: int,
                        encoding_format: str) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def wrong_task_message(model: str, task: str, endpoint: str) -> str:
    """The 400 for a model asked for what it does not serve."""
    if task == "embed":
        return (f"model {model!r} is an embedding model: it serves POST /v1/embeddings, not {endpoint}; "
                "send chat and completions to a generative model")
    return (f"model {model!r} is a generative model: it serves /v1/chat/completions and /v1/completions, not "
            f"{endpoint}; send embeddings to an embedding model (e.g. source all-minilm-l6-v2)")
