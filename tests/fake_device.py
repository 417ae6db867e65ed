"""A numpy stand-in for a GPU: device arrays, a device, and a backend, so the device transports run on CPU."""

import itertools
import threading
from typing import Any, ClassVar

import numpy as np

from collectives.backends.numpy_backend import NumpyBackend
from collectives.transport.base import Request, Transport
from collectives.transport.device import IPC_HANDLE_BYTES, GpuDevice

GARBAGE = 0xA5
"""What new fake device memory holds, so a copy that never happened shows."""


class DeviceArray(np.ndarray):
    """A numpy array that stands for device memory: views and slices of it stay device arrays."""


def device_array(values: Any) -> DeviceArray:
    """A fake device array with ``values``."""
    return np.array(values).view(DeviceArray)


class FakeDevice(GpuDevice):
    """Device operations on :class:`DeviceArray`; it logs every copy and synchronisation.

    IPC handles name buffers in a registry shared by the threads of a loopback world.
    """

    _registry: ClassVar[dict[int, Any]] = {}
    _ids = itertools.count(1)
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.pinned_allocations = 0
        self.opened: list[Any] = []
        self.closed = 0

    def is_device(self, buffer: Any) -> bool:
        return isinstance(buffer, DeviceArray)

    def pinned(self, nbytes: int) -> Any:
        self.pinned_allocations += 1
        return np.full(nbytes, GARBAGE, dtype=np.uint8)

    def to_host(self, dst: Any, src: Any) -> None:
        assert not isinstance(dst, DeviceArray) and isinstance(src, DeviceArray)
        self.log.append(("to_host", len(src)))
        np.copyto(dst, src.view(np.ndarray))

    def to_device(self, dst: Any, src: Any) -> None:
        assert isinstance(dst, DeviceArray) and not isinstance(src, DeviceArray)
        self.log.append(("to_device", len(dst)))
        np.copyto(dst.view(np.ndarray), src)

    def copy(self, dst: Any, src: Any) -> None:
        assert isinstance(dst, DeviceArray) and isinstance(src, DeviceArray)
        self.log.append(("copy", len(src)))
        np.copyto(dst.view(np.ndarray), src.view(np.ndarray))

    def synchronize(self) -> None:
        self.log.append(("synchronize", 0))

    def allocate(self, nbytes: int) -> Any:
        return np.full(nbytes, GARBAGE, dtype=np.uint8).view(DeviceArray)

    def ipc_handle(self, buffer: Any) -> bytes:
        with self._lock:
            key = next(self._ids)
            self._registry[key] = buffer
        return key.to_bytes(8, "little").ljust(IPC_HANDLE_BYTES, b"\0")

    def open_ipc(self, handle: bytes, nbytes: int) -> Any:
        buffer = self._registry[int.from_bytes(handle[:8], "little")]
        assert len(buffer) == nbytes
        self.opened.append(buffer)
        return buffer

    def close_ipc(self, buffer: Any) -> None:
        self.closed += 1


class FakeDeviceBackend(NumpyBackend):
    """The numpy backend on :class:`DeviceArray`: new buffers are device arrays full of garbage.

    It keeps each reduction's received operand, and logs the reduction in the
    device's log, so a test can tell that a received segment was copied to the
    device before it was reduced.
    """

    name = "fake-device"

    def __init__(self, device: FakeDevice | None = None) -> None:
        self.fake = FakeDevice() if device is None else device
        self.reduced: list[bytes] = []

    def owns(self, array: Any) -> bool:
        return isinstance(array, DeviceArray)

    def empty(self, count: int, like: Any) -> Any:
        buffer = np.empty(count, dtype=like.dtype).view(DeviceArray)
        buffer.view(np.uint8)[:] = GARBAGE
        return buffer

    def combine(self, op: Any, dst: Any, src: Any) -> None:
        self.reduced.append(src.tobytes())
        self.fake.log.append(("reduce", src.nbytes))
        super().combine(op, dst, src)

    def combine_after(self, op: Any, dst: Any, src: Any) -> None:
        self.reduced.append(src.tobytes())
        self.fake.log.append(("reduce", src.nbytes))
        super().combine_after(op, dst, src)

    def reduce_into(self, op: Any, dst: Any, a: Any, b: Any) -> None:
        self.reduced.append(b.tobytes())
        self.fake.log.append(("reduce", b.nbytes))
        super().reduce_into(op, dst, a, b)

    def device(self) -> FakeDevice:
        return self.fake


class HostOnly(Transport):
    """A transport that refuses device memory: what a host-only MPI is to a real GPU."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent_bytes: list[int] = []

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    def _check(self, buffer: Any) -> None:
        if isinstance(buffer, DeviceArray):
            raise AssertionError("device memory reached a host-only transport")

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        self._check(buffer)
        self.sent_bytes.append(len(memoryview(buffer).cast("B")))
        return self.inner.isend(buffer, dst, tag)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        self._check(buffer)
        return self.inner.irecv(buffer, src, tag)

    def waitall(self, requests: list[Request]) -> None:
        self.inner.waitall(requests)

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        return self.inner.wait_for(requests, timeout)

    def node_local(self) -> bool:
        return True
