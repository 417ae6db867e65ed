"""Point-to-point and shared memory over mpi4py: the only package that imports it."""

__all__ = [
    "CUDA_AWARE_ENV",
    "RANKS_PER_NODE_ENV",
    "SHARED_REGION_BYTES",
    "MPISharedMemory",
    "MPITransport",
    "end_without_finalize",
    "ranks_per_node",
    "ulfm_missing",
]

from .failures import end_without_finalize, ulfm_missing
from .messages import CUDA_AWARE_ENV, RANKS_PER_NODE_ENV, MPITransport, ranks_per_node
from .shared_memory import SHARED_REGION_BYTES, MPISharedMemory
