"""Exception types. User-facing errors name the problem and the fix."""


class FleetError(Exception):
    """Base of fleetllm's errors: the message is meant for the user as it is."""


class SpecError(FleetError):
    """A spec file or config object is invalid."""


class InputError(FleetError):
    """The input data is missing or does not fit the spec."""


class PlanError(FleetError):
    """The job cannot be planned: resources, engine availability, output folder."""


class ModelError(FleetError):
    """A model cannot be found, fetched or converted."""


class EngineError(FleetError):
    """The engine failed as a whole (fatal for the replica)."""


class RowError(FleetError):
    """One request cannot be served (recoverable: recorded on the row, the others go on)."""


class RequestFailed(RowError):
    """The engine failed while serving one request (a 500 for it), and it goes on serving the others."""
class EndpointError(EngineError):
    """The endpoint fails every row for a reason that is not the row's (the api key is refused, the
    model is not served, the endpoint cannot be reached): the job stops and commits nothing for them."""


def validation_problems(errors: list[dict], root: str = "(top level)",
                        skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """pydantic's error list (`ValidationError.errors()`) -> (where, what) pairs in words, the one wording
    of every spec, settings object and request body: an unknown field, a missing one, a cross-field check's
    own message, or the message with the value given. `skip`: location parts to leave out (FastAPI's
    "body"); `root`: the name of the whole object."""
    problems = []
    for err in errors:
        loc = err.get("loc", ())
        where = ".".join(str(p) for p in loc if p not in skip) or root
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            problems.append((where, "unknown field; remove it or check its spelling"))
        elif err.get("type") == "missing":
            problems.append((where, "required field is missing"))
        elif not loc:  # a cross-field check: its message names the values
            problems.append((where, msg))
        else:
            problems.append((where, f"{msg} (got {err.get('input')!r})"))
    return problems
