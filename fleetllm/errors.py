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
