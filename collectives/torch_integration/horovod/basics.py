"""Horovod's basics: init and shutdown, ranks and sizes, the ops' constants and the process's state."""

__all__ = [
    "OPS",
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "Sum",
    "check_global",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "horovod_communicator",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "nccl_built",
    "op_of",
    "rank",
    "shutdown",
    "size",
    "state",
]

import itertools
import socket
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from ... import api
from ...errors import CollectivesError, ConfigurationError
from ..collective_jobs import allgather_bytes
from ..mpi_ops import communicator_for
from ..worker import background_worker
from .elastic import Elastic

Average, Sum, Adasum, Min, Max, Product = range(6)
"""The reduction ops, as Horovod's constants."""
OPS = {Average: "avg", Sum: "sum", Adasum: "adasum", Min: "min", Max: "max", Product: "prod"}
"""Each of Horovod's op constants, by the library's name of the op."""

HorovodInternalError = CollectivesError
"""What a failed collective raises: every error of this library is one."""

global_process_set = None
"""The only process set: all ranks (pass ``process_set=`` only as this, or leave it out)."""


class FacadeState:
    """The facade's process state: its communicator, its node layout and the collectives in flight."""

    def __init__(self) -> None:
        self.comm: Any = None
        self.initialized = False
        self.local: tuple[int, int, int, int] = (0, 1, 0, 1)  # local rank, local size, cross rank, cross size
        self.unnamed: dict[
            str, itertools.count[int]
        ] = {}  # each kind's unnamed collectives, in program order
        # each handle's future, what synchronize makes of its result, and the collective's full name
        self.handles: dict[int, tuple[Future[Any], Callable[[Any], Any], str]] = {}
        self.handle_ids = itertools.count(1)


state = FacadeState()
"""The one state of ``collectives.horovod`` in this process."""


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start (a collective call): ``comm`` is an mpi4py communicator, or ``None`` for ``COMM_WORLD``."""
    if process_sets not in (None, [], "dynamic"):
        raise ConfigurationError("collectives.horovod runs on the global process set only")
    state.comm = comm
    elastic.enter(comm)  # a process started in a lost rank's place joins the job here
    communicator = communicator_for(comm)
    worker = background_worker(communicator)
    hosts = worker.submit(
        lambda: allgather_bytes(socket.gethostname().encode(), worker.communicator)
    ).result()
    order = list(dict.fromkeys(hosts))  # nodes in the order of their first rank
    mine = hosts[communicator.rank]
    on_node = [r for r, host in enumerate(hosts) if host == mine]
    state.local = (on_node.index(communicator.rank), len(on_node), order.index(mine), len(order))
    state.initialized = True


def _new_world() -> None:
    """After a lost rank (elastic), the survivors' world: as ``shutdown(); init()``."""
    state.handles.clear()  # the lost world's, never to complete
    state.unnamed.clear()  # each survivor may have named a different number of them
    init(state.comm)


elastic = Elastic(_new_world, lambda: state.comm)
"""Horovod Elastic, ``@hvd.elastic.run`` and ``TorchState``: :mod:`.elastic`."""


def shutdown() -> None:
    """Stop: later calls need :func:`init` again. Collectives in flight finish first."""
    for handle in list(state.handles):
        entry = state.handles.pop(handle, None)
        if entry is not None:
            entry[0].result()  # as synchronize, whose finishing touch only hands the tensors back
    state.initialized = False


def is_initialized() -> bool:
    """Whether :func:`init` was called (and not :func:`shutdown` since)."""
    return state.initialized


def horovod_communicator() -> api.Communicator:
    """The communicator the facade runs on; Horovod's error before :func:`init`."""
    if not state.initialized:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return communicator_for(state.comm)


def rank() -> int:
    """This process's rank."""
    return int(horovod_communicator().rank)


def size() -> int:
    """The number of ranks."""
    return int(horovod_communicator().size)


def _local(index: int) -> int:
    horovod_communicator()  # raises before init
    return state.local[index]


def local_rank() -> int:
    """This process's rank among the ranks of its node (host name)."""
    return _local(0)


def local_size() -> int:
    """The number of ranks on this process's node."""
    return _local(1)


def cross_rank() -> int:
    """This process's node's index among the nodes, in the order of their first rank."""
    return _local(2)


def cross_size() -> int:
    """The number of nodes."""
    return _local(3)


def mpi_built() -> bool:
    """True: collectives runs over MPI."""
    return True


def mpi_enabled() -> bool:
    """True: collectives runs over MPI."""
    return True


def gloo_built() -> bool:
    """False: no Gloo controller here."""
    return False


def gloo_enabled() -> bool:
    """False: no Gloo controller here."""
    return False


def nccl_built() -> bool:
    """False: GPU reductions here go through CuPy, not a Horovod NCCL build."""
    return False


def cuda_built() -> bool:
    """Whether torch has CUDA."""
    return bool(torch.cuda.is_available())


def op_of(op: int | None, average: bool | None) -> int:
    """Horovod's rule: ``op`` wins, ``average`` is deprecated, Average by default."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def check_global(process_set: Any) -> None:
    """Raise unless ``process_set`` is the global one (or left out): the only one offered."""
    if process_set is not None:
        raise ConfigurationError("collectives.horovod runs on the global process set only")
