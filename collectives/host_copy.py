"""A small allreduce of device arrays run on a pinned host copy: two copies around the host's allreduce.

The device paths pay a stream synchronisation and a host message per step, which
outweigh two copies and the host's allreduce (its repeats on the lean path) while
the array is small: 2 ranks sharing an H100, 4 KiB took 281-295 us over the device
paths, 48 us as two copies around MPI's host allreduce (``bench.device_allreduce``).
"""

__all__ = ["DEVICE_THROUGH_HOST_BYTES", "on_host_copy", "through_host"]

from collections.abc import Callable
from typing import Any

from .backends import adopt, backend_for
from .communicator import communicator_of
from .errors import CollectivesError
from .selector import AUTO

DEVICE_THROUGH_HOST_BYTES = 256 << 10
"""An ``"auto"`` allreduce of device arrays up to this many bytes a rank runs on a pinned host copy."""


def through_host(collective: str, algorithm: str, nbytes: int) -> bool:
    """Whether a call on device arrays runs on a host copy: an ``"auto"`` allreduce this small."""
    return collective == "allreduce" and algorithm == AUTO and nbytes <= DEVICE_THROUGH_HOST_BYTES


def on_host_copy(
    x: Any, op: Any, out: Any, comm: Any, check: bool | None, allreduce: Callable[..., Any]
) -> Any:
    """``allreduce`` of a pinned host copy of device array ``x``, copied back; ``None`` for any other call.

    It pairs with a host allreduce of the same shape on another rank. Calls it
    cannot take (host arrays, an ``out`` unlike ``x``, a non-contiguous array) go
    the device path, which names their problems.
    """
    x = adopt(x)
    try:
        backend = backend_for(x)
    except CollectivesError:
        return None
    device = backend.device()
    if device is None or not through_host("allreduce", AUTO, x.nbytes):
        return None
    flat = backend.flat_view(x)
    if out is not None and out is not x:
        out = adopt(out)
        if not backend.owns(out) or out.shape != x.shape or out.dtype != x.dtype:
            return None
    result = backend.empty(x.size, x) if out is None else out
    target = backend.flat_view(result)
    if flat is None or target is None:
        return None
    group = communicator_of(comm)
    staged = group.staging_buffer(device, x.nbytes)
    host = staged.view(x.dtype)
    if x.size:
        device.to_host(staged, backend.message(flat))
    allreduce(host, op, out=host, comm=group, check=check)
    if x.size:
        device.to_device(backend.message(target), staged)
    return result.reshape(x.shape) if out is None else out
