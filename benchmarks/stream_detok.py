"""Streaming detokenization and raw logprobs on the transformers engine (issue 38): the new code against the
code it replaced, same text, ratios side by side.

detok: one row's text streamed token by token through fleetllm.engines.stream_text.RowText, incremental
(tokenizers' DecodeStream, what the streaming path uses now) against the whole-output decode at every token
(what it did before, kept as the slow-tokenizer fallback), for outputs of --lengths tokens of real text
(the embedded SmolLM2 tokenizer), with and without a stop string. Medians of --repeats interleaved pairs;
the streamed texts must be equal.

logprobs: one `model.generate` of --gen-tokens tokens, temperature 1.5, top_k 2, with logprobs recorded the
old way and the new way, per path: batch (old: generate's `scores`, processed: -inf where top-k removed a
token; new: its raw `logits`), stream (old: a LogitsProcessor after the model's own processors and the
penalties; new: a forward hook on the model: its raw logits). Medians of interleaved pairs; the generated
tokens must be equal (same seed); the count of -inf logprobs among each step's top 5 is reported.

    python benchmarks/stream_detok.py                       # CPU: the embedded model, tiny random model for logprobs
    python benchmarks/stream_detok.py --model PATH --device cuda --gen-tokens 256   # GPU (the same table)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = Path(__file__).resolve().parent / "results"

SEED_TEXT = ("Grüße aus Zürich! The quick brown fox jumps over the lazy dog — 世界 🎉. def f(x): return [x * 2] "
             "# código, naïve café, résumé. ")


def stream_once(tok, ids, stops, incremental) -> tuple[float, str]:
    from fleetllm.engines.stream_text import RowText

    row, out = RowText(tok, stops, incremental), []
    t0 = time.perf_counter()
    for t in ids:
        delta, stopped = row.add(t, last=False)
        out.append(delta)
        if stopped:
            break
    else:
        out.append(row.finish())
    return time.perf_counter() - t0, "".join(out)


def bench_detok(tok, lengths, repeats) -> list[dict]:
    rows = []
    base = tok.encode(SEED_TEXT * 400, add_special_tokens=False)
    for n in lengths:
        ids = base[:n]
        for stops in ([], ["<never>"]):
            pairs = []
            for _ in range(repeats):  # interleaved: old, new, old, new ...
                t_old, text_old = stream_once(tok, ids, stops, incremental=False)
                t_new, text_new = stream_once(tok, ids, stops, incremental=True)
                assert text_old == text_new, f"texts differ at {n} tokens"
                pairs.append((t_old, t_new))
            old = statistics.median(p[0] for p in pairs)
            new = statistics.median(p[1] for p in pairs)
            rows.append({"tokens": n, "stop": bool(stops), "old_ms": round(old * 1e3, 3),
                         "new_ms": round(new * 1e3, 3), "speedup": round(old / new, 1), "same_text": True})
    return rows


def bench_logprobs(model_path, device, gen_tokens, repeats) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).to(device).eval()
    batch = tok(["Write a story about a lighthouse."] * 4, return_tensors="pt").to(device)
    kw = dict(max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=True, temperature=1.5, top_k=2,
              pad_token_id=tok.pad_token_id or tok.eos_token_id)

    def run(path: str, new: bool):
        """path "batch": out.scores (old: processed) / out.logits (new: raw); "stream": a LogitsProcessor
        after the model's own processors (old) / a forward hook on the model (new)."""
        rec: list = []

        class Old(LogitsProcessor):
            def __call__(self, input_ids, scores):
                rec.append(torch.log_softmax(scores.float(), dim=-1))
                return scores

        def hook(module, args, kwargs, output):
            rec.append(torch.log_softmax(output.logits[:, -1].float(), dim=-1))

        extra: dict = {}
        handle = None
        if path == "batch":
            extra = dict(return_dict_in_generate=True, **({"output_logits": True} if new else {"output_scores": True}))
        elif new:
            handle = model.register_forward_hook(hook, with_kwargs=True)
        else:
            extra = {"logits_processor": LogitsProcessorList([Old()])}
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**batch, **kw, **extra)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if handle is not None:
            handle.remove()
        if path == "batch":
            rec = [torch.log_softmax(x.float(), dim=-1) for x in (out.logits if new else out.scores)]
            out = out.sequences
        minus_inf = sum(int(torch.isinf(torch.topk(lp, 5).values).sum()) for lp in rec)
        return took, out.tolist(), minus_inf, sum(5 * lp.shape[0] for lp in rec)

    legs = {}
    for path in ("batch", "stream"):
        pairs = [(run(path, False), run(path, True)) for _ in range(repeats)]
        assert all(o[1] == n[1] for o, n in pairs), "the generated tokens differ"
        old = statistics.median(o[0] for o, _ in pairs)
        new = statistics.median(n[0] for _, n in pairs)
        legs[path] = {"gen_tokens": gen_tokens, "rows": 4, "old_s": round(old, 4), "new_s": round(new, 4),
                      "ratio_new_over_old": round(new / old, 3), "same_tokens": True,
                      "old_minus_inf_in_top5": f"{pairs[0][0][2]}/{pairs[0][0][3]}",
                      "new_minus_inf_in_top5": f"{pairs[0][1][2]}/{pairs[0][1][3]}"}
    return legs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="the model for the logprobs leg (default: a tiny random Llama)")
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the embedded SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "stream_detok.json"))
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from fleetllm import models

    tok_path = args.tokenizer or models.resolve(models.EMBEDDED_DEFAULT).path
    detok = bench_detok(AutoTokenizer.from_pretrained(tok_path), [int(x) for x in args.lengths.split(",")],
                        args.repeats)
    model = args.model
    if model is None:
        import tempfile

        from fleetllm.testing.tiny_model import make_tiny_model

        model = str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    logprobs = bench_logprobs(model, args.device, args.gen_tokens, args.repeats)
    print(f"{'tokens':>7} {'stop':>5} {'old ms':>10} {'new ms':>9} {'speedup':>8}  same text")
    for r in detok:
        print(f"{r['tokens']:>7} {str(r['stop']):>5} {r['old_ms']:>10.2f} {r['new_ms']:>9.2f} {r['speedup']:>7}x  yes")
    print(f"\nlogprobs, generate {args.gen_tokens} tokens x 4 rows, temperature 1.5, top_k 2 (same tokens):")
    print(f"{'path':>7} {'old s':>8} {'new s':>8} {'new/old':>8}  -inf in top 5: old / new")
    for path, r in logprobs.items():
        print(f"{path:>7} {r['old_s']:>8} {r['new_s']:>8} {r['ratio_new_over_old']:>8}  "
              f"{r['old_minus_inf_in_top5']} / {r['new_minus_inf_in_top5']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"detok": detok, "logprobs": logprobs, "device": args.device}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
