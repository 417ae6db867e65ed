"""Collective communication in Python: pure schedules, a simulator, and an engine over mpi4py."""

__all__ = [
    "COLLECTIVES",
    "OPS",
    "CalibrationError",
    "CollectiveTimeout",
    "CollectivesError",
    "Communicator",
    "ConfigurationError",
    "InvalidBufferError",
    "InvalidRootError",
    "MismatchError",
    "PeerInputError",
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
    ConfigurationError,
    InvalidBufferError,
    InvalidRootError,
    MismatchError,
    PeerInputError,
    ScheduleError,
    TransportError,
    UnknownAlgorithmError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .ops import OPS, ReduceOp
from .specs import COLLECTIVES

__version__ = "0.1.0.dev0"
