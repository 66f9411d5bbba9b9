"""A Ray Data driver written for a `.ai` accessor, run against an OpenAI-compatible endpoint with
fleetllm's accessor (`import fleetllm.ai`). Start an endpoint first, e.g. `fleetllm serve
examples/serve.yaml`, then: BASE_URL=http://127.0.0.1:8000/v1 MODEL=smollm2 python examples/ai_accessor.py
"""

import os

import ray

import fleetllm.ai  # noqa: F401  registers ds.ai (was: import ray.data.ai)

ds = ray.data.from_items([{"text": f"Write one sentence about the number {i}."} for i in range(16)])
ds = ds.ai.ai_query(
    os.environ.get("MODEL", "Qwen3.5-4B"),
    prompt_col="text",
    base_url=os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1"),
    api_key=os.environ.get("API_KEY", "unused"),
    output_col="generated_text",
    options={"temperature": 0.7, "max_tokens": int(os.environ.get("MAX_TOKENS", "256")),
             "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    concurrency=32 if "CONCURRENCY" not in os.environ else int(os.environ["CONCURRENCY"]),
    batch_size=8,
)
rows = ds.take_all()
failed = [r for r in rows if r["generated_text"]["error"]]
print(f"Wrote {len(rows)} rows ({len(failed)} failed)")
for r in rows[:3]:
    print(repr(r["text"]), "->", repr(r["generated_text"]["content"]))
