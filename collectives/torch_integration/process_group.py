"""The ``collectives`` backend of torch.distributed: process groups over communicators, and ``mpi://``."""

__all__ = ["BACKEND", "RENDEZVOUS"]

import contextlib
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlparse

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceScatterOptions,
    TCPStore,
    _DistributedBackendOptions,
)
from torch.distributed.rendezvous import register_rendezvous_handler

from .. import api
from ..errors import CollectivesError, InvalidBufferError, InvalidRootError, UnsupportedOpError
from ..ops import get_op
from .tensors import _TORCH_OPS, _check, _host_view, _reduce_in_place
from .worker import _api_communicator, _tell_refusal, _worker

T = TypeVar("T")

BACKEND = "collectives"
"""The name ``torch.distributed.init_process_group`` knows this library's backend by."""
RENDEZVOUS = "mpi"
"""``init_method="mpi://"``: rank and world size from MPI, and a store rank 0 opens for the others."""


def _c10d_op(opts: AllreduceOptions | AllreduceCoalescedOptions | ReduceScatterOptions | None) -> str:
    """Our name of the c10d op in ``opts`` (a sum without them)."""
    if opts is None:
        return "sum"
    for name, torch_op in _TORCH_OPS.items():
        if cast(object, opts.reduceOp) == torch_op:  # a ReduceOp equals its RedOpType
            return name
    raise UnsupportedOpError(f"the collectives backend cannot reduce with {opts.reduceOp}")


def _flat(tensor: torch.Tensor) -> np.ndarray:
    return _host_view(tensor).reshape(-1)


def _reduce_all(tensors: list[torch.Tensor], op: str, communicator: api.Communicator) -> None:
    for tensor in tensors:
        _reduce_in_place(tensor, op, communicator)


def _host_tensors(tensors: Iterable[torch.Tensor], op: str | None = None) -> list[torch.Tensor]:
    """``tensors``, each checked to be a cpu tensor the library can take, before any rank communicates."""
    checked = list(tensors)
    for tensor in checked:
        name = _check(tensor)
        if tensor.device.type != "cpu":
            raise InvalidBufferError(f"the collectives backend takes cpu tensors, not {tensor.device} ones")
        if op is not None:
            get_op(op).check_dtype(name)
    return checked


def _pairs(first: Sequence[object], second: Sequence[object], names: str, others: str) -> None:
    """Raise unless c10d's per-tensor lists ``first`` and ``second`` (``names``, ``others``) pair up."""
    if len(first) != len(second):
        raise InvalidBufferError(f"{len(first)} {names} for {len(second)} {others}; c10d pairs them up")


def _like(tensors: Sequence[torch.Tensor], size: int, like: torch.Tensor, message: str) -> None:
    """Raise ``message`` (formatted with size, shape, dtype) unless ``tensors`` are ``size`` like ``like``."""
    if len(tensors) != size or any((t.shape, t.dtype) != (like.shape, like.dtype) for t in tensors):
        raise InvalidBufferError(message.format(size, tuple(like.shape), like.dtype))


def _sized(tensor: torch.Tensor, count: int, dtype: torch.dtype, name: str) -> None:
    """Raise unless ``tensor`` (the call's ``name``) holds ``count`` elements of ``dtype``."""
    if (tensor.numel(), tensor.dtype) != (count, dtype):
        raise InvalidBufferError(
            f"the {name} has {tensor.numel()} elements of {tensor.dtype}, expected {count} of {dtype}"
        )


class _Work(dist.Work):
    """A c10d collective in flight on the communicator's thread; :meth:`wait` raises its error.

    c10d's own work made from a future (``_create_work_from_future``) cannot
    carry an error: its ``wait()`` returns ``True`` and its future's value is
    the exception, so a collective that failed (another rank's bad input, a
    mismatch, a timeout) looked like one that ran. This one raises the
    collective's own error from :meth:`wait`, in Python as from C++ (DDP).
    """

    def __init__(self, future: "Future[None]", result: Any) -> None:
        super().__init__()
        self._future = future
        self._result = result
        self._torch_future: torch.futures.Future[Any] | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the collective finishes; raise its error if it failed.

        Args:
            timeout: the most time to wait (then ``TimeoutError``); zero, c10d's
                default, waits as long as it takes.
        """
        seconds = timeout.total_seconds() or None
        error = self._future.exception(seconds)
        if error is not None:
            raise error
        return True

    def is_completed(self) -> bool:
        """Whether the collective has finished, successfully or not."""
        return self._future.done()

    def result(self) -> Any:
        """The collective's outputs, once it has finished; its error if it failed."""
        self.wait()
        return self._result

    def get_future(self) -> "torch.futures.Future[Any]":
        """A torch future of the collective's outputs, failed (a ``RuntimeError`` naming the error) if it did.

        Made on first ask, as only DDP and users of ``get_future`` want one.
        The error goes through a ``then`` so that c10d's C++ side sees the
        future fail, rather than succeed with the exception as its value, as
        ``Future.set_exception`` alone would make it.
        """
        if self._torch_future is None:
            outcome: torch.futures.Future[Any] = torch.futures.Future()
            result = self._result

            def finish(done: "Future[None]") -> None:
                error = done.exception()
                if error is None:
                    outcome.set_result(result)
                else:
                    outcome.set_exception(error)

            self._torch_future = outcome.then(_value_of)
            self._future.add_done_callback(finish)
        return self._torch_future


def _value_of(future: "torch.futures.Future[T]") -> T:
    """``future``'s value; raises the error it was given with ``set_exception``."""
    return future.value()


class _ProcessGroup(dist.ProcessGroup):
    """torch.distributed's face of a :class:`~collectives.Communicator`: the ``collectives`` backend.

    Each collective runs on the communicator's thread, in the order it was
    called, and returns a :class:`_Work` that raises the collective's error,
    if any, from ``wait()``. Its arguments are checked on the caller's thread
    first; where the checks fail the other ranks are told (see :meth:`_refuse`)
    and their collective raises :class:`~collectives.PeerInputError`.
    """

    def __init__(self, communicator: api.Communicator) -> None:
        # a Python subclass must take (rank, size), the constructor torch's stubs leave out
        super().__init__(communicator.rank, communicator.size)  # type: ignore[call-arg]
        self._communicator = communicator
        self._worker = _worker(communicator)

    def getBackendName(self) -> str:
        return BACKEND

    def _run(self, job: Callable[[api.Communicator], None], result: Any) -> dist.Work:
        """Submit ``job``; the work completes with ``result`` (what c10d expects of the collective)."""
        communicator = self._worker.communicator
        return _Work(self._worker.submit(lambda: job(communicator)), result)

    def _refuse(self, collective: str, error: Exception) -> None:
        """Tell the other ranks that this rank's checks of ``collective`` failed, after the jobs before."""
        _tell_refusal(self._communicator, collective, error)

    # c10d calls each collective in its first form, (tensors, options); the others are Python sugar
    def allreduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None
    ) -> dist.Work:
        return self._allreduce(tensors, opts)

    def _allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | AllreduceCoalescedOptions | None
    ) -> dist.Work:
        """Both allreduce forms: the tensors, each reduced in place, in one job."""
        try:
            op = _c10d_op(opts)
            tensors = _host_tensors(tensors, op)
        except Exception as error:
            self._refuse("allreduce", error)
            raise
        return self._run(lambda communicator: _reduce_all(tensors, op, communicator), tensors)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        return self._allreduce(tensors, opts)

    def broadcast(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: BroadcastOptions | None = None
    ) -> dist.Work:
        try:
            root = 0 if opts is None else opts.rootRank
            tensors = _host_tensors(tensors)
            if not 0 <= root < self.size():
                raise InvalidRootError(f"root {root} is not a rank of a group of {self.size()}")
        except Exception as error:
            self._refuse("broadcast", error)
            raise

        def job(communicator: api.Communicator) -> None:
            for tensor in tensors:
                view = _host_view(tensor)
                api.broadcast(view, root, out=view, comm=communicator)

        return self._run(job, tensors)

    def allgather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        try:
            tensors = _host_tensors(tensors)
            _pairs(output_lists, tensors, "output lists", "inputs")
            for outputs, tensor in zip(output_lists, tensors, strict=True):
                _host_tensors(outputs)
                _like(outputs, self.size(), tensor, "allgather needs {} outputs of shape {}, {}")
        except Exception as error:
            self._refuse("allgather", error)
            raise

        def job(communicator: api.Communicator) -> None:
            for outputs, tensor in zip(output_lists, tensors, strict=True):
                whole = api.allgather(_flat(tensor), comm=communicator)
                for output, piece in zip(outputs, np.split(whole, communicator.size), strict=True):
                    _flat(output)[...] = piece

        return self._run(job, output_lists)

    def all_gather_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        try:
            output, tensor = _host_tensors([output, tensor])
            _sized(output, tensor.numel() * self.size(), tensor.dtype, "output")
        except Exception as error:
            self._refuse("allgather", error)
            raise

        def job(communicator: api.Communicator) -> None:
            api.allgather(_flat(tensor), out=_flat(output), comm=communicator)

        return self._run(job, [output])

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        try:
            op = _c10d_op(opts)
            outputs = _host_tensors(outputs, op)
            _pairs(outputs, input_lists, "outputs", "input lists")
            for output, inputs in zip(outputs, input_lists, strict=True):
                _host_tensors(inputs, op)
                _like(inputs, self.size(), output, "reduce_scatter needs {} inputs of shape {}, {}")
        except Exception as error:
            self._refuse("reduce_scatter", error)
            raise

        def job(communicator: api.Communicator) -> None:
            for output, inputs in zip(outputs, input_lists, strict=True):
                whole = torch.cat([t.reshape(-1) for t in inputs])
                api.reduce_scatter(_host_view(whole), op, out=_flat(output), comm=communicator)

        return self._run(job, outputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: ReduceScatterOptions | None = None
    ) -> dist.Work:
        try:
            op = _c10d_op(opts)
            output, tensor = _host_tensors([output, tensor], op)
            _sized(tensor, output.numel() * self.size(), output.dtype, "input")
        except Exception as error:
            self._refuse("reduce_scatter", error)
            raise

        def job(communicator: api.Communicator) -> None:
            api.reduce_scatter(_flat(tensor), op, out=_flat(output), comm=communicator)

        return self._run(job, [output])

    def barrier(self, opts: BarrierOptions | None = None) -> dist.Work:  # type: ignore[override]
        return self._run(lambda communicator: api.barrier(comm=communicator), [])

    def shutdown(self) -> None:
        """Free the communicator after its collectives; ``destroy_process_group`` calls it on every rank."""
        self._worker.submit(self._communicator.free).result()


def _create_process_group(options: _DistributedBackendOptions, backend_options: object) -> _ProcessGroup:
    """c10d's constructor of the ``collectives`` backend: a process group over a new communicator.

    c10d calls it on the group's members only. The default group and a group
    of every rank get a duplicate of ``MPI.COMM_WORLD``; a subgroup
    (``torch.distributed.new_group(ranks)``) gets a communicator over those
    ranks of it, created by them alone. Either way torch's global ranks must be
    MPI's, as ``init_method="mpi://"`` makes them.
    """
    ranks = list(options.global_ranks_in_group)
    if ranks and len(ranks) < dist.get_world_size():
        communicator = _subgroup_communicator(ranks)
    else:
        # its own duplicate of COMM_WORLD: collective, as creating a group is
        communicator = api.Communicator()
    if (options.group_rank, options.group_size) != (communicator.rank, communicator.size):
        rank, size = communicator.rank, communicator.size
        communicator.free()
        raise CollectivesError(
            f"torch.distributed says rank {options.group_rank} of {options.group_size}, MPI says rank "
            f"{rank} of {size}; launch with mpiexec and init_method='mpi://'"
        )
    return _ProcessGroup(communicator)


def _subgroup_communicator(ranks: list[int]) -> api.Communicator:
    """A communicator over ``ranks`` of ``MPI.COMM_WORLD``; this process is one of them."""
    from ..transport.mpi import MPITransport

    # torch's global rank is the rank in the default group, which mpi:// numbers as MPI does
    return api.Communicator(MPITransport.of_world_ranks(ranks, dist.get_rank()))


def _broadcast_bytes(payload: bytes, root: int, communicator: api.Communicator) -> bytes:
    """The root's ``payload`` on every rank (the others pass anything); two broadcasts, length first."""
    length = np.array([len(payload)], np.int64)
    api.broadcast(length, root, out=length, comm=communicator)
    if communicator.rank == root:
        data = np.frombuffer(payload, np.uint8).copy()
    else:
        data = np.empty(int(length[0]), np.uint8)
    api.broadcast(data, root, out=data, comm=communicator)
    return data.tobytes()


def _mpi_rendezvous(
    url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any
) -> Iterator[tuple[TCPStore, int, int]]:
    """``mpi://``: rank and world size from MPI, and a TCPStore rank 0 opens on a port it tells the others.

    Rank 0's host is ``$MASTER_ADDR`` when set, else its host name.
    """
    query = dict(parse_qsl(urlparse(url).query))
    communicator = _api_communicator(None)
    rank, size = communicator.rank, communicator.size
    given = (int(query.get("rank", -1)), int(query.get("world_size", -1)))
    if given[0] not in (-1, rank) or given[1] not in (-1, size):
        raise CollectivesError(f"mpi:// was given rank {given[0]} of {given[1]}; MPI says {rank} of {size}")
    store, address, failure = None, b"", None
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        try:
            store = TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
            address = f"{host}:{store.port}".encode()
        except Exception as error:  # the others learn of it from the empty address, rather than wait
            failure = error
    worker = _worker(communicator)
    address = worker.submit(lambda: _broadcast_bytes(address, 0, worker.communicator)).result()
    if failure is not None:
        raise failure
    if not address:
        raise CollectivesError("mpi://: rank 0 could not open the TCPStore; see its error")
    if store is None:
        host, port = address.decode().rsplit(":", 1)
        store = TCPStore(host, int(port), size, False, timeout)
    yield store, rank, size
    raise CollectivesError("mpi:// cannot rendezvous a second time")


def _register() -> None:
    dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True, devices=["cpu"])
    with contextlib.suppress(RuntimeError):  # registered already, by an earlier import of this module
        register_rendezvous_handler(RENDEZVOUS, _mpi_rendezvous)  # type: ignore[no-untyped-call]


_register()
