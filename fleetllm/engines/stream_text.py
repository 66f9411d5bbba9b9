"""The text of one streamed completion, token by token: detokenized incrementally with
`tokenizers.decoders.DecodeStream` (what vLLM uses: each token costs the same, however long the output),
stop strings found in the new text only, and what could still grow into a stop string or an incomplete
UTF-8 character held back. A tokenizer without a Rust backend (a "slow" tokenizer) decodes the row's
whole output again at every step, as fleetllm did before (quadratic in the output's length: 410 ms
against 7 ms for 2,048 tokens on the 2-core CPU, benchmarks/stream_detok.py).
"""

from __future__ import annotations

from typing import Any


def incremental_decoder(tokenizer: Any) -> Any:
    """A DecodeStream for the tokenizer's Rust backend, or None (a slow tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers.decoders import DecodeStream

    return DecodeStream(skip_special_tokens=True)


class RowText:
    """One completion's text as its tokens arrive. `add(token)` returns (delta to send, finished by a stop
    string); `finish()` the rest when the row ends for another reason."""

    def __init__(self, tokenizer: Any, stops: list[str], incremental: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.decoder = incremental_decoder(tokenizer) if incremental else None
        self.tokens: list[int] = []
        self.text = ""  # decoded so far (incremental), stop strings cut
        self.sent = ""  # streamed so far: always a prefix of the final text

    def _decoded(self, token: int) -> tuple[str, int]:
        """The text after this token and where a new stop string could start in it."""
        self.tokens.append(token)
        if self.decoder is None:  # slow tokenizer: the whole output again
            return self.tokenizer.decode(self.tokens, skip_special_tokens=True), 0
        piece = self.decoder.step(self.tokenizer.backend_tokenizer, token)
        longest = max((len(s) for s in self.stops), default=1)
        start = max(0, len(self.text) - longest + 1)  # no stop string lay wholly in the earlier text
        self.text += piece or ""  # None: an incomplete UTF-8 character, completed by a later token
        return self.text, start

    def add(self, token: int, last: bool) -> tuple[str, bool]:
        """Take a token; `last`: the row's length limit is reached. Returns (delta, stopped)."""
        text, start = self._decoded(token)
        stopped = False
        for s in self.stops:
            cut = text.find(s, start)
            if cut >= 0:
                text, stopped = text[:cut], True
        if self.decoder is not None:
            self.text = text
        if not stopped and not last:
            safe = len(text) - _held_back(text, self.stops)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence (full decode): wait for the next token
                safe = min(safe, len(text) - 1)
            text = text[:max(safe, len(self.sent))]
        return self._send(text), stopped

    def finish(self) -> str:
        """What is left to send when the row ends (end of sequence, generation stopped)."""
        text = self.text
        if self.decoder is None:
            text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
            for s in self.stops:
                cut = text.find(s)
                if cut >= 0:
                    text = text[:cut]
        return self._send(text)

    def _send(self, text: str) -> str:
        delta = text[len(self.sent):]
        self.sent = text
        return delta


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters could still grow into a stop string (not streamed yet)."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                held = max(held, k)
                break
    return held
