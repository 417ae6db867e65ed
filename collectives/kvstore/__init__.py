"""A sharded key-value store (parameter server) with push and pull, server-side updates, and BSP/ASP/SSP."""

__all__ = [
    "DEFAULT_PARTITION_BYTES",
    "MODES",
    "SGD",
    "Adam",
    "Handle",
    "KVStore",
    "Optimizer",
    "Pulled",
    "create",
]

from .handles import Handle, Pulled
from .layout import DEFAULT_PARTITION_BYTES
from .store import MODES, KVStore, create
from .updaters import SGD, Adam, Optimizer
