"""How a communicator's device buffers travel: CUDA IPC on one node, CUDA-aware MPI, or host staging."""

__all__ = [
    "CUDA_AWARE_MPI",
    "CUDA_IPC",
    "CUDA_IPC_ENV",
    "HOST_STAGING",
    "DevicePath",
    "SynchronizedTransport",
    "connect",
    "foresee",
]

from dataclasses import dataclass
from typing import Any

from .._env import env_flag
from ..errors import ConfigurationError
from .base import Request, SharedMemory, Transport, WrappedTransport
from .device import GpuDevice

CUDA_IPC = "cuda ipc"
CUDA_AWARE_MPI = "cuda-aware mpi"
HOST_STAGING = "host staging"

CUDA_IPC_ENV = "COLLECTIVES_CUDA_IPC"
"""``0`` never uses CUDA IPC (CUDA-aware MPI or host staging instead); ``1`` insists on it; unset: when
every rank is on one node. Set it alike on every rank."""


class SynchronizedTransport(WrappedTransport):
    """Device buffers handed to a CUDA-aware transport, once the stream's work on them is done.

    MPI reads and writes device memory outside the stream, so before a device
    buffer is posted the stream is synchronised: the send then reads the finished
    result of the last reduction, and a receive cannot land under a reduction still
    reading its landing area.
    """

    def __init__(self, inner: Transport, device: GpuDevice) -> None:
        super().__init__(inner)
        self._device = device

    def shared_memory(self) -> SharedMemory | None:
        return None

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        if self._device.is_device(buffer):
            self._device.synchronize()
        return self._inner.isend(buffer, dst, tag)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        if self._device.is_device(buffer):
            self._device.synchronize()
        return self._inner.irecv(buffer, src, tag)

    def waitall(self, requests: list[Request]) -> None:
        self._inner.waitall(requests)

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        return self._inner.wait_for(requests, timeout)

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        self._inner.abandon(receives, sends)


@dataclass
class DevicePath:
    """The transport a communicator's device buffers go over, and its name.

    Attributes:
        name: ``"cuda ipc"``, ``"cuda-aware mpi"`` or ``"host staging"``.
        transport: the transport, over the communicator's host transport.
        reason: why :func:`connect` chose it, e.g. ``"ranks on several nodes; MPI library not CUDA-aware"``.
    """

    name: str
    transport: Transport
    reason: str = ""

    def describe(self) -> str:
        """The path in one line: how the buffers travel, and why this path (``reason``)."""
        from .cuda_ipc import CudaIpcTransport
        from .staging import StagingTransport

        transport = self.transport
        if isinstance(transport, StagingTransport):
            how = _staging(transport.piece_bytes, transport.pieces_in_flight)
        elif isinstance(transport, CudaIpcTransport):
            slot, slots = _size(transport.slot_bytes), transport.slots
            how = f"cuda ipc: device-to-device copies into each peer's mailbox in {slot} pieces"
            how += f", {slots} slots per sender"
        elif isinstance(transport, SynchronizedTransport):
            how = "cuda-aware mpi: device buffers handed to MPI once the stream is synchronised"
        else:
            how = self.name
        return f"{how} ({self.reason})" if self.reason else how

    def close(self) -> None:
        """Release the path's mailboxes or pinned buffers; collective for CUDA IPC."""
        if self.transport is not None:
            self.transport.close()


def connect(inner: Transport, device: GpuDevice) -> DevicePath:
    """Choose and make the device path of a communicator; collective over its ranks.

    CUDA IPC when every rank is on one node (unless ``$COLLECTIVES_CUDA_IPC=0``),
    else CUDA-aware MPI when the transport takes device buffers (see
    ``$COLLECTIVES_CUDA_AWARE``), else host staging. A world of one rank sends
    nothing, so it stages.

    Raises:
        ConfigurationError: ``$COLLECTIVES_CUDA_IPC=1`` but the ranks are on several nodes.
    """
    from .cuda_ipc import CudaIpcTransport
    from .staging import StagingTransport

    wanted = env_flag(CUDA_IPC_ENV)
    why_not = _NO_IPC_ONE_RANK if inner.size == 1 else _NO_IPC_ENV
    if inner.size > 1 and wanted is not False:
        together = inner.node_local()
        if wanted and not together:
            raise ConfigurationError(f"{CUDA_IPC_ENV}=1, but the ranks are not all on one node")
        why_not = _NO_IPC_NODES
        if together:
            ipc = CudaIpcTransport.connect(inner, device)
            if ipc is not None:
                return DevicePath(CUDA_IPC, ipc, "every rank on one node")
            if wanted:
                raise ConfigurationError(f"{CUDA_IPC_ENV}=1, but a rank could not map its peers' memory")
            why_not = "a rank could not map its peers' memory"
    if inner.cuda_aware():
        return DevicePath(CUDA_AWARE_MPI, SynchronizedTransport(inner, device), f"{why_not}; {_AWARE}")
    return DevicePath(HOST_STAGING, StagingTransport(inner, device), f"{why_not}; {_NOT_AWARE}")


def foresee(inner: Transport | None) -> str:
    """The path device buffers would take over ``inner``, in one line, as far as is known without sending.

    Where CUDA IPC is ruled out (``$COLLECTIVES_CUDA_IPC=0``, or a world of one rank)
    the path is known; else it hangs on whether the ranks share a node, which only
    the first collective on device arrays asks.
    """
    from . import staging

    staged = _staging(staging.PIECE_BYTES, staging.PIECES_IN_FLIGHT)
    wanted = env_flag(CUDA_IPC_ENV)
    if inner is not None and (wanted is False or inner.size == 1):
        why_not = _NO_IPC_ONE_RANK if inner.size == 1 else _NO_IPC_ENV
        if inner.cuda_aware():
            return f"cuda-aware mpi ({why_not}; {_AWARE}; chosen on the first call on device arrays)"
        return f"{staged} ({why_not}; {_NOT_AWARE}; chosen on the first call on device arrays)"
    return (
        "chosen on the first call on device arrays: cuda ipc where every rank is on one node, "
        f"else cuda-aware mpi where the MPI library is, else {staged}"
    )


_NO_IPC_ONE_RANK = "one rank: nothing to send"
_NO_IPC_ENV = f"{CUDA_IPC_ENV}=0"
_NO_IPC_NODES = "ranks on several nodes"
_AWARE = "MPI library CUDA-aware"
_NOT_AWARE = "MPI library not CUDA-aware"


def _staging(piece_bytes: int, in_flight: int) -> str:
    return (
        f"host staging through pinned host buffers in {_size(piece_bytes)} pieces, "
        f"{in_flight} in flight per peer and direction"
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"
