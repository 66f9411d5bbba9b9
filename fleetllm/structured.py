"""Structured outputs: one constraint on what a request may generate, in every shape users send it.

A request carries at most one constraint, given either as OpenAI's `response_format`
(`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`)
or as vLLM's `structured_outputs` (`{"json": schema} | {"json_object": true} | {"regex": ...} |
{"choice": [...]} | {"grammar": EBNF or Lark}`). Both become one `StructuredOutput`, which the engines
map onto their grammar backend (vLLM's structured output backends; xgrammar on transformers), and
which checks a finished text (`check`): the JSON parsed and validated against the schema.

Plain logic: no engine, no xgrammar; jsonschema is imported when a text is checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fleetllm.errors import RowError

# The request fields that carry a constraint (OpenAI's and vLLM's names).
FIELDS = ("response_format", "structured_outputs")
KINDS = ("json", "json_object", "regex", "choice", "grammar")
# vLLM `structured_outputs` options fleetllm honours besides the constraint itself.
OPTIONS = ("disable_any_whitespace",)


@dataclass(frozen=True)
class StructuredOutput:
    """One constraint: `kind` is json (a JSON schema), json_object (any JSON object), regex, choice or
    grammar (xgrammar EBNF/GBNF, or Lark, as vLLM takes it)."""

    kind: str
    value: Any  # json: the schema (dict); json_object: True; regex/grammar: str; choice: tuple of str
    strict: bool | None = None  # json_schema.strict as sent (decoding follows the schema either way)
    name: str | None = None  # json_schema.name as sent
    disable_any_whitespace: bool = False

    @property
    def key(self) -> str:
        """Canonical text of what constrains decoding: the cache key of a compiled grammar."""
        return json.dumps([self.kind, self.value, self.disable_any_whitespace], sort_keys=True)

    @property
    def is_json(self) -> bool:
        return self.kind in ("json", "json_object")

    def to_structured_outputs(self) -> dict[str, Any]:
        """vLLM's `structured_outputs` shape (what StructuredOutputsParams takes)."""
        value = list(self.value) if self.kind == "choice" else self.value
        out: dict[str, Any] = {self.kind: value}
        if self.disable_any_whitespace:
            out["disable_any_whitespace"] = True
        return out

    def request_fields(self) -> dict[str, Any]:
        """The request field an OpenAI-compatible endpoint takes for this constraint: `response_format`
        for JSON (any endpoint), vLLM's `structured_outputs` for the others."""
        if self.kind == "json_object" and not self.disable_any_whitespace:
            return {"response_format": {"type": "json_object"}}
        if self.kind == "json" and not self.disable_any_whitespace:
            spec: dict[str, Any] = {"name": self.name or "output", "schema": self.value}
            if self.strict is not None:
                spec["strict"] = self.strict
            return {"response_format": {"type": "json_schema", "json_schema": spec}}
        return {"structured_outputs": self.to_structured_outputs()}

    def check(self, text: str | None, finish_reason: str | None = None) -> tuple[str | None, str | None]:
        """(parsed, error) for a finished text. `parsed` is the value as compact JSON text (JSON kinds
        only); `error` says why the text does not satisfy the constraint (None when it does)."""
        if text is None:
            return None, None
        cut = " (generation stopped at max_tokens: raise max_tokens)" if finish_reason == "length" else ""
        if self.kind == "choice":
            if text in self.value:
                return None, None
            return None, f"the output {_short(text)} is not one of the choices {list(self.value)}{cut}"
        if self.kind == "regex":
            try:
                ok = re.fullmatch(self.value, text, flags=re.DOTALL) is not None
            except re.error:  # a pattern xgrammar takes but Python's re does not: nothing to check against
                return None, None
            return None, None if ok else f"the output {_short(text)} does not match the regex {self.value!r}{cut}"
        if self.kind == "grammar":
            return None, None  # checked by the grammar during decoding; no parser of its own here
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"the output is not valid JSON ({exc.msg} at character {exc.pos}){cut}"
        if self.kind == "json_object":
            if not isinstance(value, dict):
                return None, f"the output is JSON but not an object (got {type(value).__name__}){cut}"
        else:
            import jsonschema

            problem = jsonschema.exceptions.best_match(_validator(self.value).iter_errors(value))
            if problem is not None:
                where = "/".join(str(p) for p in problem.absolute_path) or "(root)"
                return None, f"the output does not validate against the schema at {where}: {problem.message}{cut}"
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")), None


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _validator(schema: dict[str, Any]):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON schema as a dict (from a dict or JSON text); RowError naming `where` when it is not one."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise RowError(f"{where} is not valid JSON text ({exc}); give a JSON schema object") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise RowError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    import jsonschema

    schema = _drop_nulls(schema)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise RowError(f"{where} is not a valid JSON schema: {exc.message}") from None
    return schema


def _drop_nulls(value: Any) -> Any:
    """Arrow struct columns fill a mapping's absent keys with nulls; a schema dict sheds them (give the
    schema as JSON text to keep a literal null, e.g. `default: null`)."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_drop_nulls(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars from Arrow
        return _drop_nulls(value.tolist())
    return value


def from_response_format(value: Any) -> StructuredOutput | None:
    """OpenAI's `response_format`; None for `{"type": "text"}`."""
    value = _drop_nulls(value)
    if not isinstance(value, dict) or "type" not in value:
        raise RowError("response_format must be an object with `type`: text, json_object or json_schema")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object", True)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RowError("response_format json_schema needs `json_schema: {name, schema, strict}` with a `schema`")
        unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if unknown:
            raise RowError(f"response_format.json_schema has unknown field(s) {unknown}; "
                           "it takes name, schema, strict and description")
        schema = check_schema(spec["schema"], "response_format.json_schema.schema")
        strict = spec.get("strict")
        return StructuredOutput("json", schema, strict=None if strict is None else bool(strict), name=spec.get("name"))
    raise RowError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema "
                   "(or structured_outputs for regex, choice and grammar)")


def from_structured_outputs(value: Any) -> StructuredOutput | None:
    """vLLM's `structured_outputs`: exactly one of json, json_object, regex, choice, grammar."""
    value = _drop_nulls(value)
    if not isinstance(value, dict):
        raise RowError("structured_outputs must be an object such as {\"json\": <schema>}, "
                       f"got {type(value).__name__}")
    unknown = sorted(set(value) - set(KINDS) - set(OPTIONS))
    if unknown:
        raise RowError(f"structured_outputs has field(s) {unknown} that fleetllm does not honour; "
                       f"use one of {list(KINDS)} (and optionally {list(OPTIONS)})")
    given = [k for k in KINDS if k in value and value[k] is not False]
    if len(given) != 1:
        raise RowError(f"structured_outputs needs exactly one of {list(KINDS)}, got {given or 'none'}")
    kind = given[0]
    raw = value[kind]
    whitespace = bool(value.get("disable_any_whitespace", False))
    if kind == "json":
        return StructuredOutput("json", check_schema(raw, "structured_outputs.json"), disable_any_whitespace=whitespace)
    if kind == "json_object":
        return StructuredOutput("json_object", True, disable_any_whitespace=whitespace)
    if kind == "choice":
        if not isinstance(raw, (list, tuple)) or not raw or not all(isinstance(c, str) and c for c in raw):
            raise RowError("structured_outputs.choice must be a non-empty list of non-empty strings")
        return StructuredOutput("choice", tuple(raw))
    if not isinstance(raw, str) or not raw.strip():
        raise RowError(f"structured_outputs.{kind} must be a non-empty string")
    if kind == "regex" and "\x00" in raw:
        raise RowError("structured_outputs.regex must not contain a NUL character")
    return StructuredOutput(kind, raw)


def pop_constraint(sampling: dict[str, Any]) -> tuple[StructuredOutput | None, dict[str, Any]]:
    """Split a sampling dict into its constraint (from `response_format` / `structured_outputs`) and the
    rest; RowError when a field is malformed or both carry a constraint."""
    rest = {k: v for k, v in sampling.items() if k not in FIELDS}
    found = []
    if sampling.get("response_format") is not None:
        found.append(from_response_format(sampling["response_format"]))
    if sampling.get("structured_outputs") is not None:
        found.append(from_structured_outputs(sampling["structured_outputs"]))
    found = [c for c in found if c is not None]
    if len(found) > 1:
        raise RowError("the request gives both response_format and structured_outputs constraints; give one")
    return (found[0] if found else None), rest


def load_pydantic_schema(path: str) -> dict[str, Any]:
    """The JSON schema of a pydantic model named `module:Class` (importable from the driver)."""
    import importlib

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"pydantic model {path!r} must be written module:Class, e.g. myproject.schemas:Person")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of pydantic model {path!r} ({exc}); "
                         "check the name and that it is on PYTHONPATH") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"module {module_name!r} has no {attr!r} (pydantic model {path!r})")
    if not hasattr(obj, "model_json_schema"):
        raise ValueError(f"{path!r} is not a pydantic model class (it has no model_json_schema)")
    return obj.model_json_schema()
