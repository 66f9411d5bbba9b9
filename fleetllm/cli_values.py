"""Checked argparse value types: a numeric flag out of its range (negative, NaN, infinite, a port
past 65535) is refused when the command line is parsed, naming the flag's rule, before anything runs."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _number(kind: type, text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def ranged(kind: type, low: float | None = None, high: float | None = None, *, low_open: bool = False,
           what: str = "") -> Callable[[str], float]:
    """An argparse `type` reading `kind` (int or float) within [low, high] (low excluded when `low_open`)."""

    def parse(text: str) -> float:
        value = _number(kind, text)
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {what}")
        return value

    parse.__name__ = what or kind.__name__  # argparse names the type in its messages
    return parse


share = ranged(float, 0.0, 1.0, what="a share between 0 and 1 (0.05 = 5%)")
port = ranged(int, 1, 65535, what="a port between 1 and 65535")
positive_int = ranged(int, 1, what="a whole number of at least 1")
non_negative_int = ranged(int, 0, what="a whole number of at least 0")
positive_float = ranged(float, 0.0, low_open=True, what="a number above 0")
non_negative_float = ranged(float, 0.0, what="a number of at least 0")
