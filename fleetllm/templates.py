"""prompt.template: what a template may say, checked before any row is read, and whether its format
specs can render the columns it names, checked at plan time against the columns' planned types.

A template names columns, `{column}`, and may index into a nested value, `{column[key]}` or
`{column[0]}`; a field may carry a conversion (`!s`, `!r`, `!a`) and a format spec (`{score:.2f}`,
`{name:>20}`). Attribute access (`{column.attr}`), positional fields (`{}`, `{0}`), format specs
holding fields (`{x:{width}}`), widths over MAX_WIDTH and numeric precisions over MAX_PRECISION are
refused: they read Python internals into prompts or make one row's prompt megabytes long.
"""

from __future__ import annotations

import _string  # the parser str.format itself uses: (first name, [(is_attribute, key), ...])
import re
import string
from typing import Any, Iterable

MAX_WIDTH = 10_000  # characters a field may be padded to
MAX_PRECISION = 100  # digits of a number rendered with e, E, f, F, g, G or %
NUMERIC_TYPES = set("eEfFgG%")
# Python's standard format spec: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
FORMAT_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?"
                         r"(?:\.(?P<precision>\d+))?(?P<type>[bcdeEfFgGnosxX%])?", re.DOTALL)
FIX = "write columns as {column} (or {column[key]} for a nested value) and literal braces as {{ and }}"


class TemplateError(ValueError):
    """A template that cannot be used; the message names the template and the fix."""


def fields(template: str) -> list[tuple[str, list[Any], str | None, str]]:
    """(column, [index keys], conversion, format spec) of each field, in order; TemplateError for a
    field that is not a column, optionally indexed."""
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TemplateError(f"prompt.template {template!r} is not a valid format string ({exc}); {FIX}") from None
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        try:
            first, rest = _string.formatter_field_name_split(field_name)
            rest = list(rest)
        except ValueError as exc:
            raise TemplateError(f"prompt.template {template!r}: field {{{field_name}}} does not parse ({exc}); "
                                f"{FIX}") from None
        if not isinstance(first, str) or not first or first.isdigit():
            raise TemplateError(f"prompt.template {template!r}: positional field {{{field_name}}}; name a column "
                                "instead, e.g. {instruction}")
        attrs = [key for is_attribute, key in rest if is_attribute]
        if attrs:
            raise TemplateError(f"prompt.template {template!r}: {{{field_name}}} uses attribute access "
                                f"(.{attrs[0]}); a template may only name columns: {FIX}")
        check_spec(template, field_name, spec or "")
        out.append((first, [key for _, key in rest], conversion, spec or ""))
    return out


def check_spec(template: str, field_name: str, spec: str) -> None:
    """TemplateError for a format spec that is not Python's standard one, holds fields, or pads to
    more than MAX_WIDTH characters (or MAX_PRECISION digits)."""
    where = f"prompt.template {template!r}: {{{field_name}:{spec}}}"
    if "{" in spec or "}" in spec:
        raise TemplateError(f"{where} has a field inside its format spec; give the spec literally, e.g. {{x:>20}}")
    match = FORMAT_SPEC.fullmatch(spec)
    if match is None:
        raise TemplateError(f"{where}: {spec!r} is not a format spec; remove it or write one such as "
                            "'.2f' (numbers) or '>20' (padding)")
    width, precision, kind = match.group("width"), match.group("precision"), match.group("type")
    if width and int(width) > MAX_WIDTH:
        raise TemplateError(f"{where} pads to {int(width)} characters (at most {MAX_WIDTH}); use a smaller width")
    if precision and kind in NUMERIC_TYPES and int(precision) > MAX_PRECISION:
        raise TemplateError(f"{where} asks for {int(precision)} digits (at most {MAX_PRECISION}); use fewer")


def column_names(template: str) -> list[str]:
    """The column names a template refers to, in order, without duplicates."""
    return list(dict.fromkeys(name for name, *_ in fields(template)))


def check_renders(template: str, samples: dict[str, Iterable[Any]]) -> None:
    """TemplateError when a field's conversion and format spec cannot render a value of its column
    (`{instruction:d}` over text). `samples`: column -> values standing for what its rows hold (one
    per type the column has). Indexed fields are not checked: a nested value's type is the row's."""
    for name, keys, conversion, spec in fields(template):
        if keys or not spec:
            continue
        for value in samples.get(name, ()):
            value = {"r": repr, "a": ascii, "s": str}.get(conversion or "", lambda v: v)(value)
            try:
                format(value, spec)
            except (ValueError, TypeError) as exc:
                raise TemplateError(
                    f"prompt.template {template!r}: {{{name}:{spec}}} cannot render column {name!r}, whose values are "
                    f"{type(value).__name__} ({exc}); remove ':{spec}' or use a spec for {type(value).__name__} "
                    "values, e.g. '>20'") from None
