"""Structured outputs on the transformers engine, with xgrammar (the grammar library vLLM uses).

`GrammarCache` compiles a request's constraint (fleetllm.structured.StructuredOutput) for one
tokenizer, as vLLM's xgrammar backend does (same xgrammar calls and options), and keeps the compiled
grammars by constraint: one compiler per engine, so the cache is per (schema, tokenizer).
`GrammarLogitsProcessor` constrains the rows of one padded `generate` batch, each row with its own
compiled grammar or none: xgrammar's matchers fill the token bitmask and xgrammar applies it to the
logits (`xgrammar.contrib.hf.LogitsProcessor` takes one grammar per row and no unconstrained rows,
and asserts on tokens of rows that ended by a stop string; this one tolerates both). Imported by the
transformers engine only: it imports transformers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from transformers import LogitsProcessor

from fleetllm.errors import RowError
from fleetllm.structured import StructuredOutput

CACHE_ENTRIES = 256  # compiled grammars kept per engine (least recently used dropped first)


def _is_lark(grammar: str) -> bool:
    """vLLM's rule: a grammar with no `::=` rule line is Lark, else EBNF/GBNF."""
    for line in grammar.splitlines():
        line = line.split("#")[0].split("//")[0].strip()
        if "::=" in line:
            return False
    return True


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar matching exactly one of `choices` (as vLLM turns `choice` into a grammar)."""
    import json

    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


class GrammarCache:
    """Compiled xgrammar grammars of one tokenizer, keyed by constraint; thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (not served from the cache): read by tests

    def get(self, constraint: StructuredOutput) -> Any:
        """The compiled grammar of `constraint`; RowError when xgrammar cannot compile it."""
        key = constraint.key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            compiled = self._compile(constraint)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its parser's message
            raise RowError(f"the {constraint.kind} constraint cannot be compiled to a grammar: {exc}") from None
        with self._lock:
            self.compiled += 1
            self._cache[key] = compiled
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, c: StructuredOutput) -> Any:
        import json

        compiler = self.compiler
        whitespace = dict(any_whitespace=False, separators=(",", ":")) if c.disable_any_whitespace else {}
        if c.kind == "json":
            return compiler.compile_json_schema(json.dumps(c.value), **whitespace)
        if c.kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', **whitespace)
        if c.kind == "regex":
            return compiler.compile_regex(c.value)
        if c.kind == "choice":
            return compiler.compile_grammar(choice_grammar(c.value))
        if c.kind == "grammar":
            return compiler.compile_lark(c.value) if _is_lark(c.value) else compiler.compile_grammar(c.value)
        raise RowError(f"unknown structured-output kind {c.kind!r}")


class GrammarLogitsProcessor(LogitsProcessor):
    """A transformers logits processor: row i of the batch follows `grammars[i]` (None: unconstrained).

    Build one per `generate` call. At each step it feeds each constrained row's last token to its
    xgrammar matcher, lets the matchers fill the bitmask, and applies it to those rows' logits. A row
    whose token the grammar refuses (it ended some other way: a stop string, its own max_tokens, and
    generate pads it since) is left alone from then on.
    """

    def __init__(self, grammars: list[Any]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.rows = [i for i, g in enumerate(grammars) if g is not None]
        self.matchers = {i: xgr.GrammarMatcher(grammars[i]) for i in self.rows}
        vocab = grammars[self.rows[0]].tokenizer_info.vocab_size if self.rows else 0
        self.bitmask = xgr.allocate_token_bitmask(len(grammars), vocab) if self.rows else None
        self.started = False
        self.live = set(self.rows)

    def __call__(self, input_ids, scores):
        if not self.rows:
            return scores
        if self.started:
            last = input_ids[:, -1].tolist()
            for i in list(self.live):
                m = self.matchers[i]
                if m.is_terminated() or not m.accept_token(last[i]):
                    self.live.discard(i)
        self.started = True
        for i in self.live:
            if self.matchers[i].is_terminated():
                continue
            self.matchers[i].fill_next_token_bitmask(self.bitmask, i)
        active = [i for i in self.live if not self.matchers[i].is_terminated()]
        if not active:
            return scores
        device = scores.device
        on_cpu = scores if device.type in ("cuda", "cpu") else scores.to("cpu")
        self._xgr.apply_token_bitmask_inplace(on_cpu, self.bitmask.to(on_cpu.device), indices=sorted(active))
        return on_cpu if on_cpu is scores else on_cpu.to(device)
