"""Collective communication in Python: pure schedules, a simulator, and an engine over mpi4py."""

__all__ = [
    "COLLECTIVES",
    "OPS",
    "CalibrationError",
    "CollectiveTimeout",
    "CollectivesError",
    "Communicator",
    "InvalidBufferError",
    "ReduceOp",
    "ScheduleError",
    "TransportError",
    "UnknownAlgorithmError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "__version__",
    "allgather",
    "allreduce",
    "explain",
    "reduce_scatter",
]

from .api import Communicator, allgather, allreduce, explain, reduce_scatter
from .errors import (
    CalibrationError,
    CollectivesError,
    CollectiveTimeout,
    InvalidBufferError,
    ScheduleError,
    TransportError,
    UnknownAlgorithmError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .ops import OPS, ReduceOp
from .specs import COLLECTIVES

__version__ = "0.1.0.dev0"
