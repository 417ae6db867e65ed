"""DDP communication hooks that average gradient buckets with the library's allreduce."""

__all__ = ["allreduce_bf16_hook", "allreduce_fp16_hook", "allreduce_hook"]

from collections.abc import Callable
from concurrent.futures import Future

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # at run time: DDP checks hook annotations against it

from .. import api
from ..errors import CollectivesError
from .mpi_ops import checked_call, submit_job
from .tensors import FALLBACK, Comm, reduce_in_place

TensorFuture = torch.futures.Future[torch.Tensor]


def _hook_future(state: Comm, bucket: GradBucket, wire: torch.dtype | None) -> "TensorFuture":
    buffer = bucket.buffer()
    if checked_call(buffer, "avg", state, "allreduce") == FALLBACK:
        return _fallback_hook_future(buffer, wire)

    # a bucket's shape and dtype are the same on every rank: its later steps repeat its allreduce
    # (collectives.repeats), on the lean path on one node's shared memory

    def job(communicator: api.Communicator) -> torch.Tensor:
        if wire is None:
            return reduce_in_place(buffer, "avg", communicator)
        buffer.div_(communicator.size)  # before the cast, so float16 cannot overflow in the sum
        packed = buffer.to(wire)
        reduce_in_place(packed, "sum", communicator)
        return buffer.copy_(packed)

    return hook_future(state, job)


def hook_future(state: Comm, job: Callable[[api.Communicator], torch.Tensor]) -> "TensorFuture":
    """``job(communicator)`` started on the communicator's thread; the torch future a DDP hook returns."""
    result: TensorFuture = torch.futures.Future()

    def finish(done: "Future[torch.Tensor]") -> None:
        error = done.exception()
        if error is None:
            result.set_result(done.result())
        else:
            result.set_exception(error)  # type: ignore[arg-type]  # torch annotates it as the result type

    submit_job(state, job).add_done_callback(finish)
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
