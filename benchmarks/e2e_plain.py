"""The plain scripts `benchmarks/e2e.py` times against `fleetllm run`: what a user writes by hand.

    python benchmarks/e2e_plain.py transformers --model DIR --input rows.jsonl --out out.jsonl
    python benchmarks/e2e_plain.py vllm --model DIR --input rows.jsonl --out out.jsonl [--engine-kwargs JSON]

Rows: {id, text, system?, sampling_params: {max_tokens, temperature, ignore_eos?}}. Each script imports
its library, loads the model, answers every row as a chat message, writes one JSON line per row, and
prints `GEN {"seconds", "output_tokens"}` (the generation call alone) for the throughput figures.
Nothing of fleetllm is imported.
"""

from __future__ import annotations

import argparse
import json
import time


def read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def messages(row: dict) -> list[dict]:
    msgs = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    return msgs + [{"role": "user", "content": row["text"]}]


def plain_transformers(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = read_rows(args.input)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    max_tokens = max(r["sampling_params"]["max_tokens"] for r in rows)
    texts = [tok.apply_chat_template(messages(r), tokenize=False, add_generation_prompt=True) for r in rows]
    t0 = time.time()
    out_tokens = 0
    with open(args.out, "w") as f:
        for i in range(0, len(rows), args.batch_size):
            batch = tok(texts[i:i + args.batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.inference_mode():
                out = model.generate(**batch, max_new_tokens=max_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
            for row, seq in zip(rows[i:i + args.batch_size], out[:, batch["input_ids"].shape[1]:]):
                ids = [t for t in seq.tolist() if t != tok.pad_token_id]
                out_tokens += len(ids)
                f.write(json.dumps({"id": row["id"], "text": tok.decode(ids, skip_special_tokens=True)}) + "\n")
    print("GEN " + json.dumps({"seconds": time.time() - t0, "output_tokens": out_tokens}), flush=True)


def plain_vllm(args) -> None:
    from vllm import LLM, SamplingParams

    rows = read_rows(args.input)
    llm = LLM(model=args.model, **json.loads(args.engine_kwargs))
    params = [SamplingParams(**r["sampling_params"]) for r in rows]
    t0 = time.time()
    outs = llm.chat([messages(r) for r in rows], params, use_tqdm=False)
    gen = time.time() - t0
    with open(args.out, "w") as f:
        for row, o in zip(rows, outs):
            f.write(json.dumps({"id": row["id"], "text": o.outputs[0].text}) + "\n")
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print("GEN " + json.dumps({"seconds": gen, "output_tokens": tokens}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("library", choices=["transformers", "vllm"])
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--engine-kwargs", default="{}", help="JSON keyword arguments of vllm.LLM")
    args = p.parse_args()
    plain_transformers(args) if args.library == "transformers" else plain_vllm(args)


if __name__ == "__main__":
    main()
