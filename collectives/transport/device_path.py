"""How a communicator's device buffers travel: CUDA IPC on one node, CUDA-aware MPI, or host staging."""

__all__ = [
    "CUDA_AWARE_MPI",
    "CUDA_IPC",
    "CUDA_IPC_ENV",
    "HOST_STAGING",
    "DevicePath",
    "SynchronizedTransport",
    "connect",
]

from dataclasses import dataclass
from typing import Any

from .._env import env_flag
from ..errors import ConfigurationError
from .base import Request, SharedMemory, Transport, WrappedTransport
from .device import Device

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

    def __init__(self, inner: Transport, device: Device) -> None:
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
    """

    name: str
    transport: Transport

    def close(self) -> None:
        """Release the path's mailboxes or pinned buffers; collective for CUDA IPC."""
        if self.transport is not None:
            self.transport.close()


def connect(inner: Transport, device: Device) -> DevicePath:
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
    if inner.size > 1 and wanted is not False:
        together = inner.node_local()
        if wanted and not together:
            raise ConfigurationError(f"{CUDA_IPC_ENV}=1, but the ranks are not all on one node")
        if together:
            ipc = CudaIpcTransport.connect(inner, device)
            if ipc is not None:
                return DevicePath(CUDA_IPC, ipc)
            if wanted:
                raise ConfigurationError(f"{CUDA_IPC_ENV}=1, but a rank could not map its peers' memory")
    if inner.cuda_aware():
        return DevicePath(CUDA_AWARE_MPI, SynchronizedTransport(inner, device))
    return DevicePath(HOST_STAGING, StagingTransport(inner, device))
