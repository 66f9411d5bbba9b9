"""Text that is not valid Unicode, found before it reaches a tokenizer, an Arrow array or a file.

JSON may escape a lone UTF-16 surrogate (`"\\ud800"`): Python's json decodes it into a str that no
tokenizer, Arrow array, Parquet file or UTF-8 encoder accepts, so one such row would otherwise fail a
whole shard when it is written. A pair (`"\\ud83d\\ude00"`) decodes to one valid character and is fine.
Parquet and CSV files can hold bytes that are not UTF-8 in a string column (a writer that does not
validate), which Arrow only finds when the value is converted to Python.
"""

from __future__ import annotations

import re
from typing import Any

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON text that may decode to a lone surrogate: a \uD800-\uDFFF escape (cheap test on the raw bytes)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
FIX = ("fix the escape (a surrogate pair such as \\ud83d\\ude00 is one valid "
       "character) or remove it")


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where the first lone surrogate in a decoded JSON value is, in words (`messages[0].content`, character 4,
    U+D800), or None when every string in it (keys included) is valid Unicode."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # a numpy array from Arrow or Ray
        value = value.tolist()
    if isinstance(value, str):
        found = LONE_SURROGATE.search(value)
        if found is None:
            return None
        return (f"{where or 'the text'} holds a lone UTF-16 surrogate U+{ord(found.group()):04X} "
                f"at character {found.start()}")
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = lone_surrogate(key, f"a key of {where or 'the object'}") or lone_surrogate(item, path)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            found = lone_surrogate(item, f"{where}[{k}]")
            if found:
                return found
    return None


def lone_surrogate_in_json(raw: bytes, value: Any, where: str = "") -> str | None:
    """lone_surrogate(value), only looked for when the raw JSON text holds a surrogate escape."""
    return lone_surrogate(value, where) if SURROGATE_ESCAPE.search(raw) else None


def refusal(bad_text: str) -> str:
    """The error of a request or prompt holding such text (lone_surrogate's description)."""
    return f"{bad_text}: it is not valid Unicode text; {FIX}"
