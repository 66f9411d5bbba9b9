"""What one engine step of M tokens costs on this GPU for the 8B shape, in plain torch (no vLLM needed).

Issue 34 #3 asks for interactive ITL p99 within 1.25x of alone while a batch runs at 0.9 of the peak: that
needs steps short enough for the ITL and big enough for the batch's tokens. This measures both ends of that
trade with the model's own matrix work: the 32 layers' projections (QKV, O, gate/up, down), RMSNorms, SiLU and
residual adds for M tokens, plus the LM head for the rows sampled, replayed as one CUDA graph (vLLM replays
graphs too); and, apart, decode attention (GQA, bf16 KV) for R rows over C tokens of context each, the part of
a decode step that grows with the rows' context. Random weights: the arithmetic's cost does not depend on them.

    python3 benchmarks/step_cost_gpu.py --out $OUT/step_cost.json            # H100/H200, llama3-8b shape
    python3 benchmarks/step_cost_gpu.py --tiny --tokens 8,64 --out /tmp/s.json  # CPU smoke: tiny dims
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, head dim, vocab
    "llama3-8b-shape": (4096, 14336, 32, 32, 8, 128, 128256),
    "tiny": (256, 512, 2, 4, 2, 64, 1000),
}


def weights(shape: tuple, device: str, dtype: torch.dtype) -> dict:
    hid, inter, layers, heads, kv, hd, vocab = shape
    w = lambda *s: torch.randn(*s, device=device, dtype=dtype) * 0.02  # noqa: E731
    return {"layers": [{"qkv": w((heads + 2 * kv) * hd, hid), "o": w(hid, heads * hd), "gu": w(2 * inter, hid),
                        "down": w(hid, inter), "n1": torch.ones(hid, device=device, dtype=dtype),
                        "n2": torch.ones(hid, device=device, dtype=dtype)} for _ in range(layers)],
            "head": w(vocab, hid)}


def step(x: torch.Tensor, ws: dict, sampled: int) -> torch.Tensor:
    """The matrix work of one step over x's tokens (attention's own arithmetic left out: measured apart)."""
    for lw in ws["layers"]:
        h = F.rms_norm(x, x.shape[-1:], lw["n1"])
        qkv = h @ lw["qkv"].t()
        x = x + qkv[:, : lw["o"].shape[1]] @ lw["o"].t()
        h = F.rms_norm(x, x.shape[-1:], lw["n2"])
        g, u = (h @ lw["gu"].t()).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ lw["down"].t()
    return x[-sampled:] @ ws["head"].t()


def timed(fn, device: str, reps: int) -> float:
    """Median milliseconds of fn() over reps calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    out = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return sorted(out)[len(out) // 2]


def graphed(fn, device: str):
    """fn replayed as one CUDA graph on a GPU (as vLLM runs its steps); fn itself elsewhere."""
    if device != "cuda":
        return fn
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def attention_ms(shape: tuple, rows: int, ctx: int, device: str, dtype: torch.dtype, reps: int) -> float:
    """One decode step's attention over all layers: rows queries, each over ctx cached tokens (GQA)."""
    _, _, layers, heads, kv, hd, _ = shape
    q = torch.randn(rows, heads, 1, hd, device=device, dtype=dtype)
    k = torch.randn(rows, kv, ctx, hd, device=device, dtype=dtype)
    v = torch.randn(rows, kv, ctx, hd, device=device, dtype=dtype)
    one = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    return timed(graphed(one, device), device, reps) * layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama3-8b-shape", choices=sorted(SHAPES))
    p.add_argument("--tiny", action="store_true", help="the tiny shape (a CPU smoke)")
    p.add_argument("--tokens", default="8,16,32,64,128,192,256,320,384,512,768,1024,2048,4096,8192")
    p.add_argument("--sampled", type=int, default=8, help="rows whose logits a step computes (at most M)")
    p.add_argument("--attn", default="8x1280,64x1280,256x1280", help="decode attention: ROWSxCONTEXT,...")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    shape = SHAPES["tiny" if a.tiny else a.shape]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ws = weights(shape, device, dtype)
    rows = []
    for m in (int(t) for t in a.tokens.split(",")):
        x = torch.randn(m, shape[0], device=device, dtype=dtype)
        ms = timed(graphed(lambda x=x, m=m: step(x, ws, min(a.sampled, m)), device), device, a.reps)
        flops = 2 * m * sum(t.numel() for lw in ws["layers"] for k, t in lw.items() if k in ("qkv", "o", "gu", "down"))
        rows.append({"tokens": m, "ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)})
        print(f"step of {m:5d} tokens: {ms:8.3f} ms  ({rows[-1]['tflops']} TFLOP/s of projections)", flush=True)
    attn = []
    for spec in a.attn.split(","):
        r, c = (int(v) for v in spec.split("x"))
        ms = attention_ms(shape, r, c, device, dtype, a.reps)
        attn.append({"rows": r, "context": c, "ms": round(ms, 3)})
        print(f"decode attention, {r} rows x {c} context, all layers: {ms:.3f} ms", flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    with open(a.out, "w") as f:
        json.dump({"device": name, "shape": "tiny" if a.tiny else a.shape, "torch": torch.__version__,
                   "sampled": a.sampled, "steps": rows, "decode_attention": attn}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
