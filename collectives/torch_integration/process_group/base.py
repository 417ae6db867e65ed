"""What every call of the ``collectives`` c10d backend shares: its Work, checks and staged tensors."""

__all__: list[str] = []

import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, TypeVar, cast

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceCoalescedOptions, AllreduceOptions, ReduceScatterOptions

from ... import api
from ...dispatch import checked
from ...errors import InvalidBufferError, InvalidRootError, UnsupportedOpError
from ...ops import get_op
from ...tracing.torch_ranges import ranged, tensors_text
from ..tensors import TORCH_OPS, dense_tensor, host_view, torch_dtype_name
from ..worker import background_worker, before_waiting, wait_for

T = TypeVar("T")

# a bool travels as its byte; gloo reduces bools as logic (a sum is an or, a product an and)
_BOOL_OPS = {
    "sum": "max",
    "prod": "min",
    "min": "min",
    "max": "max",
    "band": "band",
    "bor": "bor",
    "bxor": "bxor",
}


PREMUL_SUM = "premul_sum"
"""c10d's ``PREMUL_SUM``: each rank's tensor times a factor, then summed (as NCCL's)."""


def c10d_op(opts: AllreduceOptions | AllreduceCoalescedOptions | ReduceScatterOptions | Any | None) -> str:
    """Our name of the c10d op in ``opts`` (a sum without them); :data:`PREMUL_SUM` for that op."""
    if opts is None:
        return "sum"
    reduce_op = cast(object, opts.reduceOp)  # a ReduceOp equals its RedOpType
    for name, torch_op in TORCH_OPS.items():
        if reduce_op == torch_op:
            return name
    if reduce_op == dist.ReduceOp.PREMUL_SUM:
        return PREMUL_SUM
    # a ReduceOp prints as its address; its type has the name
    kind = getattr(reduce_op, "op", reduce_op)
    raise UnsupportedOpError(
        f"the collectives backend cannot reduce with ReduceOp.{getattr(kind, 'name', None) or kind}"
    )


def premul_factor(
    opts: AllreduceOptions | AllreduceCoalescedOptions | ReduceScatterOptions | Any | None,
) -> float | None:
    """The factor of a :data:`PREMUL_SUM` in ``opts``, as it is now; ``None`` for every other op.

    torch gives it as a number or a one-element tensor (``_make_nccl_premul_sum``).
    """
    if opts is None or c10d_op(opts) != PREMUL_SUM:
        return None
    factor = getattr(opts.reduceOp, "factor", None)
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise InvalidBufferError(
                "premul_sum's factor is a number or a one-element tensor, "
                f"not a tensor of shape {tuple(factor.shape)}"
            )
        return float(factor.item())
    if not isinstance(factor, int | float):
        raise UnsupportedOpError(f"premul_sum needs a factor (torch gives {type(factor).__name__})")
    return float(factor)


def premultiplied(tensor: torch.Tensor, factor: float | None, in_place: bool) -> torch.Tensor:
    """``tensor`` times a premul_sum's ``factor`` (``tensor`` itself without one), in place or new.

    Each rank scales its own tensor once, before the sum, as NCCL's premul_sum
    does, so the sum is of the scaled values and nothing is scaled after it.
    """
    if factor is None:
        return tensor
    return tensor.mul_(factor) if in_place else torch.mul(tensor, factor)


def _flat(tensor: torch.Tensor) -> np.ndarray:
    return host_view(tensor).reshape(-1)


def checked_args(tensor: object, op: str | None = None) -> torch.Tensor:
    """``tensor``; raises unless it is a dense cpu tensor of a dtype the backend moves (and ``op`` takes)."""
    tensor = dense_tensor(tensor)
    if tensor.device.type != "cpu":
        raise InvalidBufferError(f"the collectives backend takes cpu tensors, not {tensor.device} ones")
    if op == PREMUL_SUM and not tensor.dtype.is_floating_point:
        # as NCCL's, whose factor multiplies floating types only
        raise UnsupportedOpError(f"op {op!r} scales floating tensors, not {tensor.dtype} ones")
    if tensor.dtype == torch.bool:
        if op is not None and op not in _BOOL_OPS:
            raise UnsupportedOpError(f"op {op!r} does not reduce bool tensors")
        return tensor
    name = torch_dtype_name(tensor.dtype)
    if op is not None:
        get_op(op_for(op, tensor)).check_dtype(name)
    return tensor


def host_tensors(tensors: Iterable[torch.Tensor], op: str | None = None) -> list[torch.Tensor]:
    """``tensors``, each checked (see :func:`checked_args`) before any rank communicates."""
    return [checked_args(tensor, op) for tensor in tensors]


def op_for(op: str, tensor: torch.Tensor) -> str:
    """The op that reduces ``tensor`` as c10d's ``op`` would: a bool's as logic on its byte.

    A premul_sum is a sum of the tensors once each is scaled (see :func:`premultiplied`).
    """
    if op == PREMUL_SUM:
        return "sum"
    return _BOOL_OPS[op] if tensor.dtype == torch.bool else op


class Staged:
    """A tensor as the library moves it: contiguous, a bool as its byte; written back by :meth:`finish`.

    A contiguous tensor is its own stage (a bool's byte view shares its memory),
    so only a strided one costs a copy in and, for an output, a copy back.
    """

    def __init__(self, tensor: torch.Tensor, read: bool = True) -> None:
        self.tensor = tensor
        self._copies = not tensor.is_contiguous()
        stage = (
            tensor.contiguous()
            if read or not self._copies
            else torch.empty_like(tensor, memory_format=torch.contiguous_format)
        )
        self.stage = stage.view(torch.uint8) if stage.dtype == torch.bool else stage

    @property
    def view(self) -> np.ndarray:
        """The stage as a flat numpy array."""
        return _flat(self.stage)

    def finish(self) -> None:
        """Write the stage back into the tensor, where they differ."""
        if self._copies:
            self.tensor.copy_(
                self.stage.view(self.tensor.dtype) if self.tensor.dtype == torch.bool else self.stage
            )


def staged_tensors(tensors: Iterable[torch.Tensor], read: bool = True) -> list[Staged]:
    return [Staged(tensor, read) for tensor in tensors]


def write_back(output: torch.Tensor, piece: np.ndarray) -> None:
    """Write ``piece`` (a flat array of ``output``'s kind) into ``output``, whatever its strides."""
    sized(output, piece.size, output.dtype, "output")
    stage = Staged(output, read=False)
    stage.view[...] = piece
    stage.finish()


def tensor_pairs(first: Sequence[object], second: Sequence[object], names: str, others: str) -> None:
    """Raise unless c10d's per-tensor lists ``first`` and ``second`` (``names``, ``others``) pair up."""
    if len(first) != len(second):
        raise InvalidBufferError(f"{len(first)} {names} for {len(second)} {others}; c10d pairs them up")


def tensor_like(tensors: Sequence[torch.Tensor], size: int, like: torch.Tensor, message: str) -> None:
    """Raise ``message`` (formatted with size, shape, dtype) unless ``tensors`` are ``size`` like ``like``."""
    if len(tensors) != size or any((t.shape, t.dtype) != (like.shape, like.dtype) for t in tensors):
        raise InvalidBufferError(message.format(size, tuple(like.shape), like.dtype))


def sized(tensor: torch.Tensor, count: int, dtype: torch.dtype, name: str) -> None:
    """Raise unless ``tensor`` (the call's ``name``) holds ``count`` elements of ``dtype``."""
    if (tensor.numel(), tensor.dtype) != (count, dtype):
        raise InvalidBufferError(
            f"the {name} has {tensor.numel()} elements of {tensor.dtype}, expected {count} of {dtype}"
        )


def root_of(root: int, size: int) -> int:
    if not 0 <= root < size:
        raise InvalidRootError(f"root {root} is not a rank of a group of {size}")
    return root


class GroupWork(dist.Work):
    """A c10d call in flight on the communicator's thread; :meth:`wait` raises its error.

    c10d's own work made from a future (``_create_work_from_future``) cannot
    carry an error: its ``wait()`` returns ``True`` and its future's value is
    the exception, so a collective that failed (another rank's bad input, a
    mismatch, a timeout) looked like one that ran. This one raises the
    collective's own error from :meth:`wait`, in Python as from C++ (DDP).
    """

    def __init__(self, future: "Future[Any]", result: Any) -> None:
        super().__init__()
        self._future = future
        self._result = result
        self._torch_future: torch.futures.Future[Any] | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the call finishes; raise its error if it failed.

        Args:
            timeout: the most time to wait (then ``TimeoutError``); zero, c10d's
                default, waits while the group's thread runs its jobs, and raises
                :class:`~collectives.CollectiveTimeout` if it runs none for the
                group's timeout.
        """
        wait_for(self._future, "wait()", timeout.total_seconds() or None)
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished, successfully or not."""
        return self._future.done()

    def is_success(self) -> bool:
        """Whether the call has finished without an error."""
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        """The call's error, once it has finished; ``None`` if it succeeded."""
        return self._future.exception() if self._future.done() else None

    def result(self) -> Any:
        """The call's outputs, once it has finished; its error if it failed."""
        self.wait()
        return self._result

    def _source_rank(self) -> int:
        """A receive from any rank: the rank it came from (c10d's ``recv`` asks)."""
        return int(self._future.result())

    def get_future(self) -> "torch.futures.Future[Any]":
        """A torch future of the call's outputs, failed (a ``RuntimeError`` naming the error) if it did.

        Made on first ask, as only DDP and users of ``get_future`` want one.
        The error goes through a ``then`` so that c10d's C++ side sees the
        future fail, rather than succeed with the exception as its value, as
        ``Future.set_exception`` alone would make it.
        """
        if self._torch_future is None:
            if not self._future.done():
                before_waiting()  # asked for in a callback on the thread that must run the call
            outcome: torch.futures.Future[Any] = torch.futures.Future()
            result = self._result

            def finish(done: "Future[Any]") -> None:
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


class GroupBase(dist.ProcessGroup):
    """The process group's communicator, its thread, and how a call is checked and submitted."""

    def __init__(self, communicator: api.Communicator) -> None:
        # a Python subclass must take (rank, size), the constructor torch's stubs leave out
        super().__init__(communicator.rank, communicator.size)  # type: ignore[call-arg]
        self._communicator = communicator
        self._worker = background_worker(communicator)

    @property
    def communicator(self) -> api.Communicator:
        """The library's communicator the group runs on."""
        return self._communicator

    def _run(self, job: Callable[[api.Communicator], Any], result: Any) -> dist.Work:
        """Submit ``job``; the work completes with ``result`` (what c10d expects of the call)."""
        communicator = self._worker.communicator
        # a torch.profiler range of the call (named after the method calling), where recorded
        call = ranged(
            f"collectives.{sys._getframe(1).f_code.co_name.lstrip('_')}",
            lambda: tensors_text(result),
            lambda: job(communicator),
        )
        return GroupWork(self._worker.submit(call), result)

    def _together(self, works: list[dist.Work], result: Any) -> dist.Work:
        """One work for ``works`` (already submitted): it ends after them, raising the first one's error."""
        return self._run(lambda communicator: [work.wait() for work in works], result)

    def _checks(self, collective: str, check: Callable[[], T]) -> T:
        """``check()``'s answer; if it raises, the other ranks are told, on the group's thread after the
        jobs before (see :func:`collectives.dispatch.checked`)."""
        worker = self._worker
        return checked(None, collective, check, place=lambda news: worker.run_in_order(news, collective))
