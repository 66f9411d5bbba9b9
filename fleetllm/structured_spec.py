"""`sampling.structured_outputs` of a job spec (fleetllm.spec.SamplingSpec): one structured-output
constraint for every row, checked when the spec loads and turned into vLLM's `structured_outputs` shape
(the decoding itself: fleetllm.structured, fleetllm.engines.grammar).

Its model_config is the whole of fleetllm.spec.StrictModel's (unknown fields refused, assignments
validated) plus the `json` alias, so it derives from BaseModel here and fleetllm.spec need not be imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StructuredOutputsSpec(BaseModel):
    """One structured-output constraint for every row (fleetllm.structured); give exactly one of json,
    json_file, pydantic, json_object, choice, regex, grammar."""

    json_schema: dict[str, Any] | None = Field(
        None, alias="json", description="A JSON schema, inline: outputs are JSON valid against it.")
    json_file: str | None = Field(None, description="A file holding a JSON schema (relative to the cwd).")
    pydantic: str | None = Field(
        None, description="A pydantic model as module:Class (importable where `fleetllm run` runs); its JSON schema.")
    json_object: bool = Field(False, description="Outputs are any JSON object.")
    choice: list[str] | None = Field(None, min_length=1, description="Outputs are exactly one of these strings.")
    regex: str | None = Field(None, description="Outputs match this regular expression.")
    grammar: str | None = Field(None, description="Outputs follow this grammar (EBNF/GBNF as xgrammar reads it, "
                                "or Lark).")
    strict: bool | None = Field(None, description="OpenAI's json_schema.strict, recorded as given; decoding "
                                "follows the schema either way.")
    disable_any_whitespace: bool = Field(
        False, description="JSON without free whitespace between tokens (vLLM's option of the same name).")

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True)

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputsSpec":
        given = [name for name, set_ in (("json", self.json_schema is not None), ("json_file", self.json_file),
                                         ("pydantic", self.pydantic), ("json_object", self.json_object),
                                         ("choice", self.choice), ("regex", self.regex), ("grammar", self.grammar))
                 if set_]
        if len(given) != 1:
            raise ValueError(f"sampling.structured_outputs needs exactly one of json, json_file, pydantic, "
                             f"json_object, choice, regex, grammar; got {given or 'none'}")
        self.as_params()  # a schema that cannot be read or is not valid fails when the spec loads
        return self

    def as_params(self) -> dict[str, Any]:
        """vLLM's `structured_outputs` shape, the schema read from its file or pydantic model."""
        from fleetllm.errors import RowError
        from fleetllm.structured import check_schema, load_pydantic_schema

        out: dict[str, Any] = {"disable_any_whitespace": True} if self.disable_any_whitespace else {}
        try:
            if self.json_schema is not None:
                out["json"] = check_schema(self.json_schema, "sampling.structured_outputs.json")
            elif self.json_file:
                path = Path(self.json_file)
                if not path.is_file():
                    raise ValueError(f"sampling.structured_outputs.json_file {self.json_file!r} does not exist; "
                                     "check the path (relative to the current directory)")
                where = f"sampling.structured_outputs.json_file {self.json_file!r}"
                out["json"] = check_schema(path.read_text(), where)
            elif self.pydantic:
                out["json"] = check_schema(load_pydantic_schema(self.pydantic), f"pydantic model {self.pydantic!r}")
            elif self.json_object:
                out["json_object"] = True
            elif self.choice:
                out = {"choice": list(self.choice)}
            elif self.regex is not None:
                out = {"regex": self.regex}
            else:
                out = {"grammar": self.grammar}
        except RowError as exc:
            raise ValueError(str(exc)) from None
        return out
