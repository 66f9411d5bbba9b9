"""`import fleetllm.ai` registers a `.ai` accessor on `ray.data.Dataset`, as pandas registers accessors
(`pandas.api.extensions.register_dataframe_accessor`): an explicit, opt-in extension. Importing this
module adds one attribute, `ai`, to the `ray.data.Dataset` class and changes nothing else of Ray.

Example (a driver written for a `.ai` accessor runs with this one import)::

    import ray
    import fleetllm.ai  # noqa: F401  registers ds.ai

    ds = ray.data.from_items([{"text": "What is the capital of France?"}])
    ds = ds.ai.ai_query("smollm2", prompt_col="text", base_url="http://127.0.0.1:8000/v1", api_key="...",
                        output_col="generated_text", options={"max_tokens": 64}, concurrency=4, batch_size=8)
    print(ds.take(1)[0]["generated_text"]["content"])

`ds.ai.ai_query(model, **kwargs)` is `fleetllm.ai_query(ds, model, **kwargs)` (fleetllm/query/ai_query.py).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import ray.data

ACCESSOR = "ai"


class CachedAccessor:
    """A class attribute that builds the accessor for the instance it is read from (pandas' pattern)."""

    def __init__(self, name: str, accessor: type) -> None:
        self._name, self._accessor = name, accessor

    def __get__(self, obj, cls):
        if obj is None:  # read from the class: the accessor class itself (help(), docs)
            return self._accessor
        return self._accessor(obj)


def register_dataset_accessor(name: str) -> Callable[[type], type]:
    """Register a class as `ray.data.Dataset.<name>`; it is built with the dataset as its argument.

    Refuses to shadow an attribute Ray itself defines (warns and leaves Ray's in place)."""

    def decorator(accessor: type) -> type:
        existing = getattr(ray.data.Dataset, name, None)
        if existing is not None and not isinstance(ray.data.Dataset.__dict__.get(name), CachedAccessor):
            warnings.warn(f"ray.data.Dataset already has an attribute {name!r}; fleetllm leaves it as it is "
                          f"and registers no {name!r} accessor", UserWarning, stacklevel=2)
            return accessor
        setattr(ray.data.Dataset, name, CachedAccessor(name, accessor))
        return accessor

    return decorator


@register_dataset_accessor(ACCESSOR)
class AIAccessor:
    """`ds.ai`: fleetllm's AI functions on a Ray Dataset."""

    def __init__(self, ds: "ray.data.Dataset") -> None:
        self._ds = ds

    def ai_query(self, model: str, **kwargs: Any) -> "ray.data.Dataset":
        """`fleetllm.ai_query(ds, model, **kwargs)`: add the endpoint's answer to every row.

        Keyword arguments as fleetllm.query.ai_query.ai_query: prompt_col or messages_col, base_url,
        api_key, output_col, options, concurrency, batch_size, max_retries, aimd, timeout_s, retry."""
        from fleetllm.query.ai_query import ai_query

        return ai_query(self._ds, model, **kwargs)
