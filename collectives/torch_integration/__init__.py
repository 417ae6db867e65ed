"""torch through collectives: Horovod-style API, DDP hooks, a torch.distributed backend."""

__all__ = [
    "BACKEND",
    "RENDEZVOUS",
    "DistributedOptimizer",
    "Handle",
    "allgather",
    "allreduce",
    "allreduce_",
    "allreduce_async_",
    "allreduce_bf16_hook",
    "allreduce_fp16_hook",
    "allreduce_hook",
    "broadcast_",
    "broadcast_async_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "explain_path",
    "functional",
    "fusion_buckets",
    "rank",
    "reduce_scatter",
    "size",
]

import contextlib
import io
import itertools
import math
import os
import queue
import socket
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import parse_qsl, urlparse

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # GradBucket at run time: DDP checks hook annotations against it
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    GradBucket,
    ReduceScatterOptions,
    TCPStore,
    _DistributedBackendOptions,
)
from torch.distributed.rendezvous import register_rendezvous_handler

from .. import api
from ..errors import (
    CollectivesError,
    ConfigurationError,
    InvalidBufferError,
    InvalidRootError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from ..ops import get_op
from ..selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI

    Comm = api.Communicator | MPI.Comm | dist.ProcessGroup | None
else:
    Comm = Any

T = TypeVar("T")
TensorFuture = torch.futures.Future[torch.Tensor]

_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
}
_WIRE_DTYPES: dict[str | None, torch.dtype | None] = {
    None: None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
_NO_GPU_BACKEND = (
    "cuda tensors need the GPU backend, which needs CuPy (pip install cupy-cuda12x or cupy-cuda13x), "
    "or torch.distributed initialised with NCCL (torch.distributed.init_process_group('nccl'))"
)
_HOST = "collectives"
_DEVICE = "collectives-cuda"
_FALLBACK = "torch.distributed"

# --------------------------------------------------------------------------- tensors and the path they take


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _DTYPES)
        raise UnsupportedDtypeError(f"unsupported dtype {dtype}; supported dtypes are {supported}")
    return name


def _check(tensor: torch.Tensor) -> str:
    """Raise unless ``tensor`` is dense, contiguous and of a dtype the library moves; its dtype name."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidBufferError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise InvalidBufferError(f"tensor has layout {tensor.layout}; only dense (strided) tensors are taken")
    name = _dtype_name(tensor.dtype)
    if not tensor.is_contiguous():
        raise InvalidBufferError(
            f"tensor of shape {tuple(tensor.shape)} and strides {tensor.stride()} is not contiguous; "
            "pass tensor.contiguous()"
        )
    return name


def _nccl_initialised() -> bool:
    return dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend())


def _cupy_available() -> bool:
    """Whether CuPy imports (asked only for cuda tensors, so cpu-only programs never import it)."""
    try:
        import cupy  # noqa: F401
    except Exception:  # a CuPy built for another CUDA fails with errors of its own
        return False
    return True


def _route(tensor: torch.Tensor, comm: Comm) -> str:
    """``_HOST`` for a cpu tensor; for a cuda one ``_DEVICE`` with CuPy, else ``_FALLBACK`` with NCCL.

    Raises for any other.
    """
    if tensor.device.type == "cpu":
        return _HOST
    if tensor.device.type == "cuda":
        if _cupy_available():
            return _DEVICE
        if not _nccl_initialised():
            raise InvalidBufferError(_NO_GPU_BACKEND)
        if comm is not None:
            raise InvalidBufferError("cuda tensors use torch.distributed's default group; pass comm=None")
        return _FALLBACK
    raise InvalidBufferError(f"tensor is on device {tensor.device}; collectives takes cpu tensors")


def _cuda_without_cupy(tensor: object) -> bool:
    """Whether ``tensor`` is a cuda tensor on a host without CuPy: its collectives go through NCCL."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda" and not _cupy_available()


def _checked(tensor: torch.Tensor, op: str | None, comm: Comm, collective: str) -> str:
    """Validate ``tensor`` and ``op`` on the caller's thread, before any rank communicates; the route.

    Where the checks fail the other ranks are told first (see :func:`_refuse`), and
    their ``collective`` raises :class:`~collectives.PeerInputError`.
    """
    try:
        name = _check(tensor)
        if op is not None:
            get_op(op).check_dtype(name)
        return _route(tensor, comm)
    except Exception as error:
        _refuse(comm, collective, tensor, error)
        raise


def _refuse(comm: Comm, collective: str, tensor: object, error: Exception) -> None:
    """Tell the other ranks that this rank's checks of ``collective`` failed, so theirs raises too.

    See :func:`_tell_refusal`. Nothing is told where there is no communicator
    of this library to tell (a ``comm`` of another backend), nor for a cuda
    tensor without CuPy, whose collectives go through torch.distributed's NCCL
    group: the other ranks then wait until their timeout.
    """
    if _cuda_without_cupy(tensor):
        return
    try:
        communicator = _communicator_of(comm)
    except CollectivesError:
        return
    _tell_refusal(communicator, collective, error)


def explain_path(tensor: torch.Tensor, comm: Comm = None) -> str:
    """Which path a collective on ``tensor`` takes, or why it cannot take any.

    Returns:
        One line: ``"collectives: ..."`` (a zero-copy numpy view of a cpu
        tensor, or a zero-copy CuPy view of a cuda one, named with the
        communicator's device path once known), ``"torch.distributed: ..."`` (a
        cuda tensor through the NCCL process group, where CuPy is missing), or
        ``"unsupported: <the error the collective raises>"``.
    """
    try:
        name = _check(tensor)
        route = _route(tensor, comm)
    except CollectivesError as error:
        return f"unsupported: {error}"
    if route == _HOST:
        through = " (through int16)" if tensor.dtype == torch.bfloat16 else ""
        return f"collectives: zero-copy numpy view{through} of a cpu {name} tensor"
    if route == _DEVICE:
        known = comm.device_path if isinstance(comm, api.Communicator) else None
        path = known or "cuda ipc on one node, else cuda-aware mpi or host staging"
        return f"collectives: zero-copy CuPy view (DLPack) of a {name} tensor on {tensor.device}, over {path}"
    return f"torch.distributed: {name} tensor on {tensor.device} through the default NCCL process group"


def _host_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array over ``tensor``'s memory: no copy (bfloat16 through ml_dtypes)."""
    data = tensor.detach()
    if data.dtype == torch.bfloat16:
        # torch has no numpy bfloat16 to give; the same bits through int16 are ml_dtypes' bfloat16
        return data.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return data.numpy()


def _view(tensor: torch.Tensor) -> Any:
    """A zero-copy array over ``tensor``: numpy for a cpu tensor, CuPy (DLPack) for a cuda one."""
    if tensor.device.type != "cuda":
        return _host_view(tensor)
    from ..backends import adopt

    return adopt(tensor.detach())


@contextlib.contextmanager
def _device_of(*tensors: torch.Tensor) -> Iterator[None]:
    """Run CuPy work on the tensors' device, and finish it before torch's next kernels read them.

    The collectives' kernels and copies run on CuPy's current stream, on the thread
    the job runs on; synchronising it at the end orders them before whatever torch
    queues next on its own stream.
    """
    device = tensors[0].device
    if device.type != "cuda":
        yield
        return
    import cupy

    with cupy.cuda.Device(device.index if device.index is not None else torch.cuda.current_device()):
        yield
        cupy.cuda.get_current_stream().synchronize()


def _reduce_in_place(tensor: torch.Tensor, op: str, communicator: api.Communicator) -> torch.Tensor:
    with _device_of(tensor):
        view = _view(tensor)
        api.allreduce(view, op, out=view, comm=communicator)
    return tensor


# --------------------------------------------------------------------------- the communication thread


class _Worker:
    """One thread that runs a communicator's collectives one at a time, in the order they were submitted.

    Every rank submits its collectives in its program order, which is the same
    on every rank, so the collectives pair up; and two collectives on one
    communicator never interleave their messages. Where MPI lets only the main
    thread call it (``funneled``, ``single``) there is no thread: a job runs
    at once on the caller's.
    """

    def __init__(self, inline: bool) -> None:
        self._inline = inline
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        if not inline:
            threading.Thread(target=self._run, name="collectives-comm", daemon=True).start()

    def submit(self, job: Callable[[], T]) -> "Future[T]":
        future: Future[T] = Future()
        if self._inline:
            _run_job(job, future)
        else:
            self._jobs.put((job, future))
        return future

    def stop(self) -> None:
        """End the thread once the jobs before have run."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            _run_job(*item)
            # hold no tensor while idle: one freed here during interpreter shutdown would abort
            del item


def _run_job(job: Callable[[], T], future: "Future[T]") -> None:
    future.set_running_or_notify_cancel()
    try:
        with torch.no_grad():
            result = job()
    except BaseException as error:
        future.set_exception(error)
    else:
        future.set_result(result)


_workers: "weakref.WeakKeyDictionary[api.Communicator, _Worker]" = weakref.WeakKeyDictionary()
_workers_lock = threading.Lock()


def _worker(communicator: api.Communicator) -> _Worker:
    with _workers_lock:
        worker = _workers.get(communicator)
        if worker is None:
            worker = _Worker(inline=communicator.transport.thread_level in ("funneled", "single"))
            _workers[communicator] = worker
            weakref.finalize(communicator, worker.stop)
        return worker


def _api_communicator(comm: "api.Communicator | MPI.Comm | None") -> api.Communicator:
    """The communicator api runs ``comm``'s collectives on; for ``None`` the one over ``MPI.COMM_WORLD``.

    Created on first use, a collective call.
    """
    return api._communicator(comm)


def _tell_refusal(communicator: api.Communicator, collective: str, error: Exception) -> None:
    """Tell the other ranks that this rank's checks of ``collective`` failed, so theirs raises too.

    It goes on the communicator's thread, in order with the collectives started
    before it, as a poisoned signature (see :meth:`collectives.watchdog.Watchdog.poison`).
    """
    _worker(communicator).submit(lambda: api._refuse(communicator, collective, AUTO, None, error)).result()


def _submit(comm: Comm, job: Callable[[api.Communicator], T]) -> "Future[T]":
    """Run ``job(communicator)`` on the communicator's thread.

    The communicator is looked up (and the default one created, a collective
    call) here, on the caller's thread.
    """
    communicator = _communicator_of(comm)
    return _worker(communicator).submit(lambda: job(communicator))


def _communicator_of(comm: Comm) -> api.Communicator:
    """The library's communicator for ``comm``, which may also be a torch.distributed group of this backend.

    ``None`` is the communicator over ``MPI.COMM_WORLD`` (created on first use,
    a collective call), not torch's default group.
    """
    if isinstance(comm, _ProcessGroup):
        return comm._communicator
    if isinstance(comm, dist.ProcessGroup):
        raise ConfigurationError(
            f"comm is a torch.distributed group of the {comm.name()!r} backend; collectives runs on the "
            f"groups of the {BACKEND!r} backend (torch.distributed.new_group(ranks, backend={BACKEND!r}))"
        )
    if isinstance(comm, int) and comm == dist.GroupMember.NON_GROUP_MEMBER:
        raise ConfigurationError("comm is GroupMember.NON_GROUP_MEMBER: this rank is not in that group")
    return _api_communicator(comm)


# --------------------------------------------------------------------------- functions


def rank(comm: Comm = None) -> int:
    """This process's rank in ``comm`` (over ``MPI.COMM_WORLD`` by default), as Horovod's ``rank()``."""
    return _communicator_of(comm).rank


def size(comm: Comm = None) -> int:
    """The number of ranks in ``comm`` (over ``MPI.COMM_WORLD`` by default), as Horovod's ``size()``."""
    return _communicator_of(comm).size


class Handle:
    """A collective in flight, from :func:`allreduce_async_`; :meth:`wait` gives its result."""

    __slots__ = ("_done", "_wait")

    def __init__(self, wait: Callable[[float | None], torch.Tensor], done: Callable[[], bool]) -> None:
        self._wait = wait
        self._done = done

    def done(self) -> bool:
        """Whether the collective has finished, successfully or not."""
        return self._done()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """Block until the collective finishes; return its result, or raise its error.

        Args:
            timeout: the most seconds to wait (then ``TimeoutError``); ``None``
                waits as long as it takes. The NCCL fallback ignores it.
        """
        return self._wait(timeout)


_TORCH_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def _work_handle(work: dist.Work | None, tensor: torch.Tensor) -> Handle:
    """A handle on torch.distributed's work on ``tensor``."""
    if work is None:
        raise CollectivesError("torch.distributed gave no work to wait on")

    def wait(timeout: float | None) -> torch.Tensor:
        work.wait()
        return tensor

    return Handle(wait, work.is_completed)


def allreduce_async_(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> Handle:
    """Start reducing ``tensor`` in place across all ranks; :meth:`Handle.wait` returns it.

    Leave the tensor alone until the handle is waited on. The collectives of
    one communicator run in the order they were started, on a background
    thread, so every rank must start them in the same order.

    Args:
        tensor: a contiguous cpu tensor, the same shape and dtype on every
            rank; a cuda one goes through CuPy zero-copy, or torch.distributed's
            NCCL where CuPy is missing (see :func:`explain_path`).
        op: ``sum``, ``prod``, ``min``, ``max``, ``avg`` (floating types) or
            ``band``, ``bor``, ``bxor`` (integers).
        comm: a :class:`~collectives.Communicator`, an mpi4py communicator,
            or a torch.distributed group of the ``collectives`` backend; the
            communicator over ``MPI.COMM_WORLD`` by default.
    """
    if _checked(tensor, op, comm, "allreduce") == _FALLBACK:
        return _work_handle(dist.all_reduce(tensor, op=_TORCH_OPS[get_op(op).name], async_op=True), tensor)
    future = _submit(comm, lambda communicator: _reduce_in_place(tensor, op, communicator))
    return Handle(future.result, future.done)


def allreduce_(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """Reduce ``tensor`` in place across all ranks and return it; as :func:`allreduce_async_`."""
    return allreduce_async_(tensor, op, comm=comm).wait()


def allreduce(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """The reduction of ``tensor`` across all ranks, in a new tensor; ``tensor`` is left as it was.

    Args as for :func:`allreduce_async_`.
    """
    _checked(tensor, op, comm, "allreduce")
    return allreduce_(tensor.detach().clone(), op, comm=comm)


def allgather(tensor: torch.Tensor, *, comm: Comm = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order, in a new tensor.

    As in Horovod, the first dimension may differ between ranks (the row
    counts are exchanged first); the other dimensions and the dtype must be the
    same on every rank. A 0-d tensor counts as one row.
    """
    route = _checked(tensor, None, comm, "allgather")
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    layout = [rows.shape[0], math.prod(rows.shape[1:]), rows.dim(), list(_DTYPES).index(tensor.dtype)]
    if route == _FALLBACK:
        return _fallback_allgather(rows, layout)

    def job(communicator: api.Communicator) -> torch.Tensor:
        layouts = api.allgather(np.array(layout, np.int64), comm=communicator).reshape(-1, len(layout))
        _check_layouts(layouts, tuple(rows.shape[1:]))
        out = torch.empty(
            (int(layouts[:, 0].sum()), *rows.shape[1:]), dtype=tensor.dtype, device=tensor.device
        )
        counts = [int(n) * layout[1] for n in layouts[:, 0]]
        with _device_of(out):
            mine, whole = _view(rows).reshape(-1), _view(out).reshape(-1)
            api.allgather(mine, counts=counts, out=whole, comm=communicator)
        return out

    return _submit(comm, job).result()


def _check_layouts(layouts: np.ndarray, rest: tuple[int, ...]) -> None:
    """Raise, on every rank alike, unless all ranks' rows have the same size, rank and dtype."""
    if (layouts[:, 1:] != layouts[0, 1:]).any():
        raise InvalidBufferError(
            "allgather needs the same dtype and trailing dimensions on every rank; ranks differ in "
            f"(elements per row, dimensions, dtype): {[tuple(int(v) for v in row[1:]) for row in layouts]}"
        )


def _fallback_allgather(rows: torch.Tensor, layout: list[int]) -> torch.Tensor:
    size = dist.get_world_size()
    mine = torch.tensor(layout, dtype=torch.int64, device=rows.device)
    layouts = torch.empty(size * len(layout), dtype=torch.int64, device=rows.device)
    dist.all_gather_single(layouts, mine)
    table = layouts.reshape(size, len(layout)).cpu().numpy()
    _check_layouts(table, tuple(rows.shape[1:]))
    parts = [rows.new_empty((int(n), *rows.shape[1:])) for n in table[:, 0]]
    dist.all_gather(parts, rows)
    return torch.cat(parts)


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """This rank's share of the reduction of ``tensor`` across all ranks, in a new tensor.

    ``tensor`` has ``P * k`` rows (P the world size); rank ``r`` gets rows
    ``r * k`` to ``(r + 1) * k`` of the reduction.
    """
    route = _checked(tensor, op, comm, "reduce_scatter")
    if tensor.dim() == 0:
        error = InvalidBufferError("reduce_scatter needs a tensor with rows, got a 0-d tensor")
        _refuse(comm, "reduce_scatter", tensor, error)
        raise error
    if route == _FALLBACK:
        size = dist.get_world_size()
        out = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
        dist.reduce_scatter_single(out, tensor, op=_TORCH_OPS[get_op(op).name])
        return out

    def job(communicator: api.Communicator) -> torch.Tensor:
        out = tensor.new_empty((tensor.shape[0] // communicator.size, *tensor.shape[1:]))
        with _device_of(out):
            api.reduce_scatter(_view(tensor), op, out=_view(out), comm=communicator)
        return out

    return _submit(comm, job).result()


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, *, comm: Comm = None) -> Handle:
    """Start copying the root's ``tensor`` into every rank's ``tensor``; :meth:`Handle.wait` returns it.

    Args:
        tensor: a contiguous cpu tensor of the same shape and dtype on every
            rank (a cuda one as for :func:`allreduce_async_`); only the root's
            contents are read.
        root_rank: the rank whose tensor is sent.
        comm: the communicator, as for :func:`allreduce_async_`.
    """
    if _checked(tensor, None, comm, "broadcast") == _FALLBACK:
        return _work_handle(dist.broadcast(tensor, src=root_rank, async_op=True), tensor)

    def job(communicator: api.Communicator) -> torch.Tensor:
        with _device_of(tensor):
            view = _view(tensor)
            api.broadcast(view, root_rank, out=view, comm=communicator)
        return tensor

    future = _submit(comm, job)
    return Handle(future.result, future.done)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, *, comm: Comm = None) -> torch.Tensor:
    """Copy the root's ``tensor`` into every rank's ``tensor`` and return it; as :func:`broadcast_async_`."""
    return broadcast_async_(tensor, root_rank, comm=comm).wait()


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor],
    root_rank: int = 0,
    *,
    comm: Comm = None,
) -> None:
    """Copy the root's parameters (and buffers) into every rank's, in place, so all ranks start equal.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()`` or a list
            of tensors, in the same order on every rank.
        root_rank: the rank whose values are sent.
        comm: the communicator, as for :func:`allreduce_async_`.
    """
    if isinstance(params, Mapping):
        named = list(params.items())
    else:
        named = [item if isinstance(item, tuple) else (f"tensor {i}", item) for i, item in enumerate(params)]
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            error = InvalidBufferError(
                f"broadcast_parameters takes tensors; {name} is {type(tensor).__name__}"
            )
            _refuse(comm, "broadcast", tensor, error)
            raise error
        _checked(tensor, None, comm, "broadcast")
    with torch.no_grad():
        # the first alone, so that where another rank's checks failed (and it told this one in the
        # first broadcast's place) no more broadcasts are left waiting for it
        if named:
            broadcast_async_(named[0][1], root_rank, comm=comm).wait()
        handles = [broadcast_async_(tensor, root_rank, comm=comm) for _, tensor in named[1:]]
    for handle in handles:
        handle.wait()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, *, comm: Comm = None
) -> None:
    """Give every rank the root's optimizer state (moments, step counts) and hyperparameters.

    The root's ``state_dict()`` is serialised with ``torch.save``, broadcast as
    bytes, and loaded into every other rank's optimizer, which must hold the
    same parameters in the same groups.
    """
    future = _submit(comm, lambda communicator: _broadcast_state(optimizer, root_rank, communicator))
    state = future.result()
    if state is not None:
        optimizer.load_state_dict(state)


def _broadcast_state(
    optimizer: torch.optim.Optimizer, root_rank: int, communicator: api.Communicator
) -> dict[str, Any] | None:
    """The root's state dict on the other ranks, ``None`` on the root; on the communication thread."""
    payload = b""
    if communicator.rank == root_rank:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        payload = buffer.getvalue()
    received = _broadcast_bytes(payload, root_rank, communicator)
    if communicator.rank == root_rank:
        return None
    loaded: dict[str, Any] = torch.load(io.BytesIO(received), weights_only=True)
    return loaded


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


# --------------------------------------------------------------------------- DistributedOptimizer


def fusion_buckets(params: Sequence[torch.Tensor], threshold_bytes: int) -> list[list[int]]:
    """Group parameters into fusion buckets: each bucket's indices into ``params``, in launch order.

    The parameters are taken in reverse order (backward produces the last
    layers' gradients first). A bucket is closed when the next parameter would
    take it past ``threshold_bytes`` or has another dtype, so a parameter larger
    than the threshold is alone, and a threshold of 0 puts every parameter
    alone. Only the parameters' order, sizes and dtypes matter, so every rank
    gets the same buckets.
    """
    if threshold_bytes < 0:
        raise ValueError(f"threshold_bytes must be non-negative, got {threshold_bytes}")
    buckets: list[list[int]] = []
    filled = 0
    for index in reversed(range(len(params))):
        param = params[index]
        nbytes = param.numel() * param.element_size()
        if not buckets or param.dtype != params[buckets[-1][0]].dtype or filled + nbytes > threshold_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += nbytes
    return buckets


class _Bucket:
    """The parameters of one fusion bucket, and the buffers their gradients travel in."""

    def __init__(self, params: list[torch.Tensor], wire: torch.dtype | None) -> None:
        self.params = params
        self.wire = wire
        self._fused: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None

    def reduce(self, op: str, communicator: api.Communicator) -> None:
        """Reduce the gradients in place across the ranks; runs on the communication thread."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if len(grads) < len(self.params):
            raise CollectivesError("a gradient went missing before it was reduced; was zero_grad() called?")
        if self.wire is None and len(grads) == 1 and grads[0].is_contiguous():
            _reduce_in_place(grads[0], op, communicator)  # one gradient needs no fusion buffer
            return
        if self._fused is None:
            self._fused = torch.empty(sum(p.numel() for p in self.params), dtype=self.params[0].dtype)
        fused = self._fused
        bounds = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        pieces = [fused[lo:hi] for lo, hi in itertools.pairwise(bounds)]
        for piece, grad in zip(pieces, grads, strict=True):
            piece.copy_(grad.reshape(-1))
        if self.wire is None:
            _reduce_in_place(fused, op, communicator)
        else:
            if op == "avg":
                fused.div_(communicator.size)  # before the cast, so float16 cannot overflow in the sum
            if self._packed is None:
                self._packed = torch.empty(fused.numel(), dtype=self.wire)
            self._packed.copy_(fused)
            _reduce_in_place(self._packed, "sum", communicator)
            fused.copy_(self._packed)
        for piece, grad in zip(pieces, grads, strict=True):
            grad.copy_(piece.view_as(grad))


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer so that ``step()`` uses the gradients averaged over all ranks, as Horovod's does.

    A hook on every parameter hands its gradient over as soon as backward has
    accumulated it. Gradients travel in fusion buckets (:func:`fusion_buckets`:
    reverse registration order, up to ``fusion_threshold_bytes`` each); a
    bucket is reduced on the communication thread once all its gradients are
    ready and every bucket before it has been started, so the buckets go out
    in the same order on every rank while backward goes on with earlier layers.
    :meth:`step` calls :meth:`synchronize`, which starts the buckets backward
    did not fill, waits for all, and leaves the results in ``.grad``; then it
    steps the wrapped optimizer.

    The wrapper shares the wrapped optimizer's ``param_groups`` and ``state``,
    so learning-rate schedulers and state dicts work through either.

    Args:
        optimizer: the optimizer to wrap.
        named_parameters: ``model.named_parameters()``. Their order fixes the
            buckets, so it must be the same on every rank; the optimizer's
            order is used without it.
        fusion_threshold_bytes: the most gradient bytes fused into one
            allreduce; 0 reduces each gradient alone.
        compression: ``None``, ``"fp16"`` or ``"bf16"``: the dtype gradients
            travel in. With ``op="avg"`` they are divided by the world size
            before the cast, so float16 does not overflow in the sum.
        op: ``"avg"`` or ``"sum"`` of the gradients.
        backward_passes_per_step: backward passes that accumulate into
            ``.grad`` before each step; gradients are reduced after the last.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        fusion_threshold_bytes: int = 64 * 2**20,
        compression: str | None = None,
        op: str = "avg",
        backward_passes_per_step: int = 1,
        comm: Comm = None,
    ) -> None:
        if compression not in _WIRE_DTYPES:
            raise UnsupportedDtypeError(
                f"unknown compression {compression!r}; valid ones are None, 'fp16', 'bf16'"
            )
        if op not in ("avg", "sum"):
            raise UnsupportedOpError(f"DistributedOptimizer takes op 'avg' or 'sum', not {op!r}")
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
        names, params = _parameters_to_reduce(optimizer, named_parameters)
        super().__init__(optimizer.param_groups, optimizer.defaults)  # the same group dicts, shared
        self.optimizer = optimizer
        self.state = optimizer.state
        self._names = names
        self._op = op
        self._passes = backward_passes_per_step
        self._communicator = _communicator_of(comm)
        self._worker = _worker(self._communicator)
        grouping = fusion_buckets(params, fusion_threshold_bytes)
        wire = _WIRE_DTYPES[compression]
        self._buckets = [_Bucket([params[i] for i in indices], wire) for indices in grouping]
        self._bucket_names = [[names[i] for i in indices] for indices in grouping]
        self._bucket_of = [0] * len(params)
        for b, indices in enumerate(grouping):
            for i in indices:
                self._bucket_of[i] = b
        self._lock = threading.Lock()
        self._new_round()
        self._needs_sync = True
        self._hooks = [
            param.register_post_accumulate_grad_hook(self._hook(i))  # type: ignore[no-untyped-call]
            for i, param in enumerate(params)
        ]

    @property
    def buckets(self) -> list[list[str]]:
        """The parameter names of each fusion bucket, in the order the buckets are reduced."""
        return [list(names) for names in self._bucket_names]

    def _new_round(self) -> None:
        self._passes_seen = [0] * len(self._bucket_of)
        self._ready = [0] * len(self._buckets)
        self._started = 0
        self._pending: list[Future[None]] = []

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            with self._lock:
                self._passes_seen[index] += 1
                passes = self._passes_seen[index]
                if passes > self._passes:
                    raise CollectivesError(
                        f"the gradient of {self._names[index]} was accumulated {passes} times before "
                        f"step() or synchronize(); pass backward_passes_per_step={passes} to accumulate"
                    )
                self._needs_sync = True
                if passes == self._passes:
                    self._ready[self._bucket_of[index]] += 1
                    self._start_ready()

        return hook

    def _start_ready(self) -> None:
        # strictly in bucket order: a full bucket waits until every bucket before it has started
        while self._started < len(self._buckets) and self._ready[self._started] == len(
            self._buckets[self._started].params
        ):
            self._start(self._buckets[self._started])

    def _start(self, bucket: _Bucket) -> None:
        op, communicator = self._op, self._communicator
        self._pending.append(self._worker.submit(lambda: bucket.reduce(op, communicator)))
        self._started += 1

    def synchronize(self) -> None:
        """Reduce what is left of this step's gradients and wait for all; ``.grad`` then holds the results.

        Call it to read or clip the averaged gradients before :meth:`step`,
        which then does not reduce again. A parameter without a gradient
        contributes zeros, and gets the result.
        """
        with self._lock:
            for bucket in self._buckets[self._started :]:
                for param in bucket.params:
                    if param.grad is None:
                        param.grad = torch.zeros_like(param)
                self._start(bucket)
            pending = self._pending
            self._new_round()
            self._needs_sync = False
        errors = [error for future in pending if (error := future.exception()) is not None]
        if errors:
            raise errors[0]

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Reduce the gradients (unless :meth:`synchronize` just did) and step the wrapped optimizer.

        A closure is called once, before the reduction.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._needs_sync:
            self.synchronize()
        self.optimizer.step()
        self._needs_sync = True
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients as the wrapped optimizer does; an error while they are being reduced."""
        with self._lock:
            if self._pending:
                raise CollectivesError(
                    "zero_grad() was called while gradients were being reduced; call step() or "
                    "synchronize() between backward and zero_grad()"
                )
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only while wrapping: the buckets are fixed once the wrapper exists."""
        if hasattr(self, "_buckets"):
            raise CollectivesError("DistributedOptimizer cannot take new parameter groups once created")
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer, and share its new groups and state."""
        self.optimizer.load_state_dict(state_dict)
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, buckets={len(self._buckets)}, op={self._op!r})"


def _parameters_to_reduce(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
) -> tuple[list[str], list[torch.Tensor]]:
    """The optimizer's parameters that take gradients, with names, in registration order; validated."""
    owned = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if named_parameters is None:
        names, params = [f"param{i}" for i in range(len(owned))], owned
    else:
        pairs = list(named_parameters)
        repeated = sorted(name for name, times in Counter(name for name, _ in pairs).items() if times > 1)
        if repeated:
            raise InvalidBufferError(f"named_parameters repeats the names {repeated}")
        wanted = {id(p) for p in owned}
        ordered = [(name, p) for name, p in pairs if id(p) in wanted]
        missing = len(wanted) - len({id(p) for _, p in ordered})
        if missing:
            raise InvalidBufferError(f"{missing} of the optimizer's parameters are not in named_parameters")
        names, params = [name for name, _ in ordered], [p for _, p in ordered]
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        raise InvalidBufferError(f"the parameters are on several devices ({', '.join(devices)}), not one")
    for name, param in zip(names, params, strict=True):
        if not param.dtype.is_floating_point:
            raise UnsupportedDtypeError(f"parameter {name} has dtype {param.dtype}, not a floating one")
        _dtype_name(param.dtype)
        if param.layout != torch.strided:
            raise InvalidBufferError(f"parameter {name} has layout {param.layout}, not a dense one")
        if param.device.type == "cuda":
            raise InvalidBufferError(
                f"parameter {name} is on {param.device}: DistributedOptimizer reduces cpu parameters until "
                "collectives has its GPU backend; use DDP over NCCL for cuda"
            )
        if param.device.type != "cpu":
            raise InvalidBufferError(f"parameter {name} is on device {param.device}, not the cpu")
    return names, params


# --------------------------------------------------------------------------- DDP communication hooks


def _hook_future(state: Comm, bucket: GradBucket, wire: torch.dtype | None) -> "TensorFuture":
    buffer = bucket.buffer()
    if _checked(buffer, "avg", state, "allreduce") == _FALLBACK:
        return _fallback_hook_future(buffer, wire)

    def job(communicator: api.Communicator) -> torch.Tensor:
        if wire is None:
            return _reduce_in_place(buffer, "avg", communicator)
        buffer.div_(communicator.size)  # before the cast, so float16 cannot overflow in the sum
        packed = buffer.to(wire)
        _reduce_in_place(packed, "sum", communicator)
        return buffer.copy_(packed)

    result: TensorFuture = torch.futures.Future()

    def finish(done: "Future[torch.Tensor]") -> None:
        error = done.exception()
        if error is None:
            result.set_result(done.result())
        else:
            result.set_exception(error)  # type: ignore[arg-type]  # torch annotates it as the result type

    _submit(state, job).add_done_callback(finish)
    return result


def _fallback_hook_future(buffer: torch.Tensor, wire: torch.dtype | None) -> "TensorFuture":
    buffer.div_(dist.get_world_size())
    packed = buffer if wire is None else buffer.to(wire)
    work = dist.all_reduce(packed, async_op=True)
    if work is None:
        raise CollectivesError("torch.distributed.all_reduce gave no work to wait on")
    done: TensorFuture = work.get_future().then(lambda _: buffer if wire is None else buffer.copy_(packed))
    return done


def allreduce_hook(state: Comm, bucket: GradBucket) -> TensorFuture:
    """A DDP communication hook that averages gradients with collectives' allreduce.

    ``model.register_comm_hook(comm, allreduce_hook)``; the state ``comm`` is a
    :class:`~collectives.Communicator`, an mpi4py communicator, a
    torch.distributed group of the ``collectives`` backend, or ``None`` for the
    one over ``MPI.COMM_WORLD``.
    """
    return _hook_future(state, bucket, None)


def allreduce_fp16_hook(state: Comm, bucket: GradBucket) -> TensorFuture:
    """:func:`allreduce_hook` with the gradients sent as float16, divided by the world size first."""
    return _hook_future(state, bucket, torch.float16)


def allreduce_bf16_hook(state: Comm, bucket: GradBucket) -> TensorFuture:
    """:func:`allreduce_hook` with the gradients sent as bfloat16, divided by the world size first."""
    return _hook_future(state, bucket, torch.bfloat16)


# --------------------------------------------------------------------------- the torch.distributed backend

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
        communicator = self._communicator
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
    address = _worker(communicator).submit(lambda: _broadcast_bytes(address, 0, communicator)).result()
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


# --------------------------------------------------------------------------- differentiable collectives

# last: functional builds on the functions above
from . import functional  # noqa: E402
