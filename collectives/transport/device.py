"""What the device transports need from a GPU: copies, pinned host memory, a stream to wait on, IPC."""

__all__ = ["IPC_HANDLE_BYTES", "GpuDevice"]

from abc import ABC, abstractmethod
from typing import Any

IPC_HANDLE_BYTES = 64
"""Bytes of a CUDA IPC memory handle (``cudaIpcMemHandle_t``)."""


class GpuDevice(ABC):
    """The device operations under the staging and CUDA IPC transports.

    Device buffers are 1-D ``uint8`` arrays of the device's library (the messages an
    :class:`~collectives.backends.ArrayBackend` gives); host buffers are 1-D ``uint8``
    numpy arrays. Work is ordered on the device's current stream, the one the
    backend's reductions run on, so a copy that follows a reduction sees its result.
    CuPy's is :class:`collectives.backends.cupy_backend.CupyDevice`; tests use a numpy fake.
    """

    @abstractmethod
    def is_device(self, buffer: Any) -> bool:
        """Whether ``buffer`` is in device memory (else it is host memory a transport sends as it is)."""

    @abstractmethod
    def pinned(self, nbytes: int) -> Any:
        """A new page-locked host buffer of ``nbytes`` bytes."""

    @abstractmethod
    def to_host(self, dst: Any, src: Any) -> None:
        """Copy device ``src`` into host ``dst``, after the stream's earlier work; complete on return."""

    @abstractmethod
    def to_device(self, dst: Any, src: Any) -> None:
        """Copy host ``src`` into device ``dst`` on the stream; ``src`` may be reused on return."""

    @abstractmethod
    def copy(self, dst: Any, src: Any) -> None:
        """Copy device ``src`` into device ``dst`` (either may be a peer's mapped memory) on the stream."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for the work queued on the stream."""

    @abstractmethod
    def allocate(self, nbytes: int) -> Any:
        """Device memory of its own allocation (not carved from a pool), so that IPC can share it."""

    @abstractmethod
    def ipc_handle(self, buffer: Any) -> bytes:
        """The IPC handle (:data:`IPC_HANDLE_BYTES` bytes) of memory from :meth:`allocate`."""

    @abstractmethod
    def open_ipc(self, handle: bytes, nbytes: int) -> Any:
        """Another process's memory, from its IPC handle, as a device buffer of ``nbytes`` bytes."""

    @abstractmethod
    def close_ipc(self, buffer: Any) -> None:
        """Unmap memory :meth:`open_ipc` mapped."""
