"""The ``collectives`` backend of torch.distributed: process groups over communicators, and ``mpi://``."""

__all__ = ["BACKEND", "RENDEZVOUS"]

import contextlib
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
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
from torch.distributed.constants import default_pg_timeout
from torch.distributed.rendezvous import register_rendezvous_handler

from ... import api
from ...communicator import communicator_of, made_for
from ...errors import CollectivesError, ConfigurationError, InvalidBufferError, UnsupportedOpError
from ..collective_jobs import broadcast_bytes
from ..launch import launcher_mismatch
from ..tensors import host_view
from ..worker import background_worker
from .base import (
    Staged,
    c10d_op,
    checked_args,
    host_tensors,
    op_for,
    premul_factor,
    premultiplied,
    root_of,
    sized,
    staged_tensors,
    tensor_like,
    tensor_pairs,
    write_back,
)
from .dispatcher_ops import route_to
from .members import agree_on_members
from .p2p import PointToPoint
from .rooted import RootedCollectives

BACKEND = "collectives"
"""The name ``torch.distributed.init_process_group`` knows this library's backend by."""
RENDEZVOUS = "mpi"
"""``init_method="mpi://"``: rank and world size from MPI, and a store rank 0 opens for the others."""


class MPIProcessGroup(PointToPoint, RootedCollectives):
    """torch.distributed's face of a :class:`~collectives.Communicator`: the ``collectives`` backend.

    Each collective runs on the communicator's thread, in the order it was
    called, and returns a work that raises the collective's error, if any,
    from ``wait()``. Its arguments are checked on the caller's thread first;
    where the checks fail the other ranks are told and their collective raises
    :class:`~collectives.PeerInputError`. Strided tensors go through a
    contiguous copy and bools as their bytes, as gloo takes both. The rooted
    collectives and all-to-all are in :mod:`.rooted`, sends and
    receives in :mod:`.p2p`.
    """

    def __init__(self, communicator: api.Communicator) -> None:
        super().__init__(communicator)
        self._group_name = ""
        self._group_desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    def _get_backend(self, device: torch.device) -> "MPIProcessGroup":  # type: ignore[override]
        """This group, its own cpu backend, as torch's Python groups are (torch 2.14 asks for it)."""
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"No backend type associated with device type {torch.device(device).type}")
        return self

    # c10d keeps a group's name in its backends, and this group has none: it keeps its own
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, description: str) -> None:
        self._group_desc = description

    def getGroupDesc(self) -> str:
        return self._group_desc

    # c10d calls each collective in its first form, (tensors, options); the others are Python sugar
    def allreduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None
    ) -> dist.Work:
        return self._allreduce(tensors, opts)

    def _allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | AllreduceCoalescedOptions | None
    ) -> dist.Work:
        """Both allreduce forms: the tensors, each reduced in place, in one job."""
        if any(isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)

        def check() -> tuple[str, float | None, list[Staged]]:
            op = c10d_op(opts)
            return op, premul_factor(opts), staged_tensors(host_tensors(tensors, op))

        op, factor, staged = self._checks("allreduce", check)

        def job(communicator: api.Communicator) -> None:
            for stage in staged:
                premultiplied(stage.stage, factor, in_place=True)  # the result replaces it
                view = stage.view
                api.allreduce(view, op_for(op, stage.tensor), out=view, comm=communicator)
                stage.finish()

        return self._run(job, tensors)

    def _sparse_allreduce(
        self, tensors: list[torch.Tensor], opts: AllreduceOptions | AllreduceCoalescedOptions | None
    ) -> dist.Work:
        """A sum of sparse COO tensors, as gloo's: every rank's entries gathered, then coalesced."""

        def check() -> list[torch.Tensor]:
            if c10d_op(opts) != "sum":
                raise UnsupportedOpError("sparse tensors are only summed")
            for tensor in tensors:
                if tensor.layout != torch.sparse_coo or tensor.device.type != "cpu":
                    raise InvalidBufferError("a sparse allreduce takes cpu sparse COO tensors only")
                checked_args(tensor._values())
            return tensors

        self._checks("allreduce", check)

        def job(communicator: api.Communicator) -> None:
            for tensor in tensors:
                tensor.copy_(_sparse_sum(tensor, communicator))

        return self._run(job, tensors)

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        return self._allreduce(tensors, opts)

    def broadcast(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: BroadcastOptions | None = None
    ) -> dist.Work:
        root = 0 if opts is None else opts.rootRank
        staged = self._checks(
            "broadcast", lambda: (root_of(root, self.size()), staged_tensors(host_tensors(tensors)))[1]
        )

        def job(communicator: api.Communicator) -> None:
            for stage in staged:
                view = stage.view
                api.broadcast(view, root, out=view, comm=communicator)
                stage.finish()

        return self._run(job, tensors)

    def allgather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        def check() -> list[Staged]:
            inputs = host_tensors(tensors)
            tensor_pairs(output_lists, inputs, "output lists", "inputs")
            for outputs, tensor in zip(output_lists, inputs, strict=True):
                host_tensors(outputs)
                tensor_like(outputs, self.size(), tensor, "allgather needs {} outputs of shape {}, {}")
            return staged_tensors(inputs)

        staged = self._checks("allgather", check)

        def job(communicator: api.Communicator) -> None:
            for outputs, stage in zip(output_lists, staged, strict=True):
                whole = api.allgather(stage.view, comm=communicator)
                for output, piece in zip(outputs, np.split(whole, communicator.size), strict=True):
                    write_back(output, piece)

        return self._run(job, output_lists)

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        tensors: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        """c10d's ``all_gather_coalesced``: one output list per rank, each of every input's shape."""

        def check() -> list[Staged]:
            inputs = host_tensors(tensors)
            if len(output_lists) != self.size() or any(len(outs) != len(inputs) for outs in output_lists):
                raise InvalidBufferError(
                    f"all_gather_coalesced needs {self.size()} output lists of {len(inputs)} tensors"
                )
            for outputs in output_lists:
                for output, tensor in zip(host_tensors(outputs), inputs, strict=True):
                    sized(output, tensor.numel(), tensor.dtype, "output")
            return staged_tensors(inputs)

        staged = self._checks("allgather", check)

        def job(communicator: api.Communicator) -> None:
            for i, stage in enumerate(staged):
                whole = api.allgather(stage.view, comm=communicator)
                for outputs, piece in zip(output_lists, np.split(whole, communicator.size), strict=True):
                    write_back(outputs[i], piece)

        return self._run(job, output_lists)

    def all_gather_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        def check() -> tuple[Staged, Staged]:
            out, mine = host_tensors([output, tensor])
            sized(out, mine.numel() * self.size(), mine.dtype, "output")
            return Staged(out, read=False), Staged(mine)

        staged_out, staged_in = self._checks("allgather", check)

        def job(communicator: api.Communicator) -> None:
            api.allgather(staged_in.view, out=staged_out.view, comm=communicator)
            staged_out.finish()

        return self._run(job, [output])

    _allgather_base = all_gather_single  # type: ignore[assignment]

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], tensors: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        tensor_pairs(outputs, tensors, "outputs", "inputs")
        works = [self.all_gather_single(o, t, opts) for o, t in zip(outputs, tensors, strict=True)]
        return self._together(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        def check() -> tuple[str, float | None, list[Staged]]:
            op = c10d_op(opts)
            outs = host_tensors(outputs, op)
            tensor_pairs(outs, input_lists, "outputs", "input lists")
            for output, inputs in zip(outs, input_lists, strict=True):
                host_tensors(inputs, op)
                tensor_like(inputs, self.size(), output, "reduce_scatter needs {} inputs of shape {}, {}")
            return op, premul_factor(opts), staged_tensors(outs, read=False)

        op, factor, staged = self._checks("reduce_scatter", check)

        def job(communicator: api.Communicator) -> None:
            for stage, inputs in zip(staged, input_lists, strict=True):
                joined = torch.cat([t.reshape(-1) for t in inputs])  # a copy: scaled in place
                whole = Staged(premultiplied(joined, factor, in_place=True))
                reduction = op_for(op, stage.tensor)
                api.reduce_scatter(whole.view, reduction, out=stage.view, comm=communicator)
                stage.finish()

        return self._run(job, outputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: ReduceScatterOptions | None = None
    ) -> dist.Work:
        def check() -> tuple[str, float | None, Staged, Staged]:
            op = c10d_op(opts)
            out, whole = host_tensors([output, tensor], op)
            sized(whole, out.numel() * self.size(), out.dtype, "input")
            return op, premul_factor(opts), Staged(out, read=False), Staged(whole)

        op, factor, staged_out, staged_in = self._checks("reduce_scatter", check)

        def job(communicator: api.Communicator) -> None:
            reduction = op_for(op, output)
            # the input stays as it was: a premul_sum scales a copy of it, in the one pass that makes it
            source = staged_in if factor is None else Staged(premultiplied(staged_in.stage, factor, False))
            api.reduce_scatter(source.view, reduction, out=staged_out.view, comm=communicator)
            staged_out.finish()

        return self._run(job, [output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        tensors: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        tensor_pairs(outputs, tensors, "outputs", "inputs")
        works = [self.reduce_scatter_single(o, t, opts) for o, t in zip(outputs, tensors, strict=True)]
        return self._together(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def barrier(self, opts: BarrierOptions | None = None) -> dist.Work:  # type: ignore[override]
        # device_ids name GPUs for NCCL to sync on; a cpu group has none to sync, so they are ignored
        return self._run(lambda communicator: api.barrier(comm=communicator), [])

    # c10d's coalescing: the calls inside run one by one, each in order, so there is nothing to group
    def _start_coalescing(self, device: torch.device) -> None:
        pass

    def _end_coalescing(self, device: torch.device) -> dist.Work:
        return self._run(lambda communicator: None, [])

    def split_group(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the collectives backend cannot split_group; make groups with new_group")

    def merge_remote_group(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("the collectives backend cannot merge_remote_group")

    def shutdown(self) -> None:
        """Free the communicator after its calls; ``destroy_process_group`` calls it on every rank."""
        self._worker.wait(self._worker.submit(self._communicator.free), "destroy_process_group")
        self._close_point_to_point()


def _sparse_sum(tensor: torch.Tensor, communicator: api.Communicator) -> torch.Tensor:
    """The sum over the ranks of the sparse COO ``tensor``: each rank's entries, gathered and coalesced."""
    mine = tensor.coalesce()
    indices, values = mine._indices().contiguous(), mine._values().contiguous()
    counts = api.allgather(np.array([indices.shape[1]], np.int64), comm=communicator)
    most = int(counts.max())
    padded_indices = torch.zeros((indices.shape[0], most), dtype=torch.int64)
    padded_indices[:, : indices.shape[1]] = indices
    padded_values = torch.zeros((most, *values.shape[1:]), dtype=values.dtype)
    padded_values[: values.shape[0]] = values
    all_indices = api.allgather(host_view(padded_indices.reshape(-1)), comm=communicator)
    all_values = api.allgather(host_view(padded_values.reshape(-1)), comm=communicator)
    pieces_i = torch.from_numpy(all_indices.copy()).reshape(communicator.size, indices.shape[0], most)
    pieces_v = (
        torch.from_numpy(np.asarray(all_values).copy())
        .view(values.dtype)
        .reshape(communicator.size, most, *values.shape[1:])
    )
    found_i = torch.cat([pieces_i[r, :, : int(n)] for r, n in enumerate(counts)], dim=1)
    found_v = torch.cat([pieces_v[r, : int(n)] for r, n in enumerate(counts)])
    return torch.sparse_coo_tensor(found_i, found_v, tensor.shape, check_invariants=False).coalesce()


def _create_process_group(options: _DistributedBackendOptions, backend_options: object) -> MPIProcessGroup:
    """c10d's constructor of the ``collectives`` backend: a process group over a new communicator.

    c10d calls it on the group's members only. The default group and a group
    of every rank get a duplicate of ``MPI.COMM_WORLD``; a subgroup
    (``torch.distributed.new_group(ranks)``) gets a communicator over those
    ranks of it, created by them alone after they agree on the library's
    communicator over every rank, which the default group's creation (or
    ``mpi://``) makes on every rank. Either way torch's global ranks must be
    MPI's, as ``init_method="mpi://"`` makes them (``env://`` and ``file://``
    need the ranks MPI gives).
    """
    ranks = list(options.global_ranks_in_group)
    # init_process_group(timeout=) and new_group(timeout=) bound every call of the group; torch's
    # default (given when the user gave none) leaves $COLLECTIVES_TIMEOUT or the library's own
    timeout = None if options.timeout == default_pg_timeout else options.timeout.total_seconds()
    if not dist.is_initialized():
        # the default group, made by every rank: so is the communicator over MPI.COMM_WORLD on which a
        # later new_group's members agree (mpi:// made it already), since a non-member never joins one
        communicator_of(None)
    elif ranks and len(ranks) < dist.get_world_size() and made_for(None) is None:
        raise ConfigurationError(
            f"new_group({ranks}) with the collectives backend needs its communicator over every rank, "
            "which the ranks make together: init with init_method='mpi://', make the default group a "
            "collectives one, or make a collectives group of every rank first"
        )
    if ranks and dist.is_initialized():
        # new_group: MPI's group creation cannot be bounded, so the members agree on it first
        agree_on_members(communicator_of(None), ranks, timeout)
    if ranks and len(ranks) < dist.get_world_size():
        communicator = _subgroup_communicator(ranks, timeout)
    else:
        # its own duplicate of COMM_WORLD: collective, as creating a group is
        communicator = api.Communicator(timeout=timeout)
    if (options.group_rank, options.group_size) != (communicator.rank, communicator.size):
        rank, size = communicator.rank, communicator.size
        communicator.free()
        raise CollectivesError(
            launcher_mismatch(size)
            or f"torch.distributed says rank {options.group_rank} of {options.group_size}, MPI says rank "
            f"{rank} of {size}; launch with mpiexec and init_method='mpi://'"
        )
    return MPIProcessGroup(communicator)


def _subgroup_communicator(ranks: list[int], timeout: float | None) -> api.Communicator:
    """A communicator over ``ranks`` of ``MPI.COMM_WORLD``; this process is one of them."""
    from ...transport.mpi import MPITransport

    # torch's global rank is the rank in the default group, which mpi:// numbers as MPI does
    return api.Communicator(MPITransport.of_world_ranks(ranks, dist.get_rank()), timeout=timeout)


def _mpi_rendezvous(
    url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any
) -> Iterator[tuple[TCPStore, int, int]]:
    """``mpi://``: rank and world size from MPI, and a TCPStore rank 0 opens on a port it tells the others.

    Rank 0's host is ``$MASTER_ADDR`` when set, else its host name.
    """
    query = dict(parse_qsl(urlparse(url).query))
    communicator = communicator_of(None)
    rank, size = communicator.rank, communicator.size
    if (mismatch := launcher_mismatch(size)) is not None:  # each process would train alone
        raise CollectivesError(f"mpi://: {mismatch}")
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
    address = background_worker(communicator).run_in_order(lambda c: broadcast_bytes(address, 0, c), "mpi://")
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
    route_to(MPIProcessGroup)
    dist.Backend.register_backend(BACKEND, _create_process_group, extended_api=True, devices=["cpu"])
    with contextlib.suppress(RuntimeError):  # registered already, by an earlier import of this module
        register_rendezvous_handler(RENDEZVOUS, _mpi_rendezvous)  # type: ignore[no-untyped-call]


_register()
