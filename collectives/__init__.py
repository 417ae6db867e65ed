"""Collective communication in Python: pure schedules, a simulator, and an engine over mpi4py."""

__all__ = [
    "COLLECTIVES",
    "OPS",
    "CalibrationError",
    "CollectiveTimeout",
    "CollectivesError",
    "Communicator",
    "InvalidBufferError",
    "InvalidRootError",
    "ReduceOp",
    "ScheduleError",
    "TransportError",
    "UnknownAlgorithmError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "__version__",
    "allgather",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "explain",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]

from .api import (
    Communicator,
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    explain,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .errors import (
    CalibrationError,
    CollectivesError,
    CollectiveTimeout,
    InvalidBufferError,
    InvalidRootError,
    ScheduleError,
    TransportError,
    UnknownAlgorithmError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .ops import OPS, ReduceOp
from .specs import COLLECTIVES

__version__ = "0.1.0.dev0"
