"""Exceptions raised by collectives."""

__all__ = [
    "CalibrationError",
    "CollectiveTimeout",
    "CollectivesError",
    "InvalidBufferError",
    "InvalidRootError",
    "ScheduleError",
    "TopologyError",
    "TransportError",
    "UnknownAlgorithmError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
]


class CollectivesError(Exception):
    """Base class of every error this library raises."""


class UnsupportedDtypeError(CollectivesError, TypeError):
    """The array's dtype cannot be communicated or reduced."""


class UnsupportedOpError(CollectivesError, ValueError):
    """The reduction op is unknown or does not apply to the dtype."""


class UnknownAlgorithmError(CollectivesError, ValueError):
    """No algorithm of that name implements the collective."""


class InvalidBufferError(CollectivesError, ValueError):
    """An input or output buffer has the wrong shape, size, dtype or layout."""


class InvalidRootError(CollectivesError, ValueError):
    """The root of a rooted collective is not a rank of the communicator."""


class ScheduleError(CollectivesError):
    """A schedule is malformed or does not meet its collective's contract.

    Attributes name the first place the simulator found wrong; any of them may be
    ``None`` when it does not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        rank: int | None = None,
        chunk: int | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.rank = rank
        self.chunk = chunk
        self.expected = expected
        self.actual = actual


class TopologyError(CollectivesError, ValueError):
    """A topology is malformed, or a device, route or placement is not in it."""


class TransportError(CollectivesError, RuntimeError):
    """A point-to-point transfer failed."""


class CollectiveTimeout(TransportError, TimeoutError):
    """A collective did not complete in time."""


class CalibrationError(CollectivesError, ValueError):
    """A calibration file cannot be read or does not hold the cost model's constants."""
