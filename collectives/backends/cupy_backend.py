"""CuPy arrays, reduced by gpu_kernels; other CUDA arrays taken zero-copy; the CuPy device."""

__all__ = ["CupyBackend", "CupyDevice", "adopt"]

from typing import Any

import cupy
import numpy as np

from ..errors import UnsupportedDtypeError
from ..ops import ReduceOp, check_dtype
from ..transport.device import IPC_HANDLE_BYTES, GpuDevice
from . import gpu_kernels
from .base import ArrayBackend, one_shape

_CHECKED_NAMES: dict[Any, str] = {}
_DEVICE: list["CupyDevice"] = []
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the pointers (unified addressing)


def adopt(array: Any) -> Any:
    """``array`` as a CuPy array over the same memory (no copy).

    CuPy arrays are returned as they are; objects with a CUDA ``__dlpack__``
    (torch, JAX) go through ``cupy.from_dlpack``, others with
    ``__cuda_array_interface__`` (Numba) through ``cupy.asarray``. Either way CuPy
    orders the producer's stream before its own current one where the object says
    which it is.

    Raises:
        UnsupportedDtypeError: CuPy cannot view the object (e.g. bfloat16 before CuPy 14).
    """
    if isinstance(array, cupy.ndarray):
        return array
    try:
        # DLPack first: it orders the producer's stream before CuPy's, and carries bfloat16
        if hasattr(array, "__dlpack__"):
            return cupy.from_dlpack(array)
        return cupy.asarray(array)
    except (TypeError, ValueError, NotImplementedError, BufferError) as error:
        raise UnsupportedDtypeError(
            f"cannot view a {type(array).__module__}.{type(array).__qualname__} as a CuPy array: {error} "
            "(bfloat16 needs CuPy 14 or later with ml_dtypes)"
        ) from None


def _bits(array: Any, name: str) -> tuple[Any, str | None]:
    """The array as the kernels take it: bfloat16 carried as uint16 with its name, others as they are."""
    if name == "bfloat16":
        return array.view(cupy.uint16), name
    return array, None


class CupyBackend(ArrayBackend):
    """CuPy arrays, on the device each lives on; work runs on CuPy's current stream.

    bfloat16 is a CuPy array of ``ml_dtypes.bfloat16`` (CuPy 14 or later), as
    ``cupy.from_dlpack`` makes of a torch bfloat16 tensor. A ``uint16`` array is
    always uint16: nothing tells its bits apart from a bfloat16's, so none is guessed.
    """

    name = "cupy"

    def owns(self, array: Any) -> bool:
        return isinstance(array, cupy.ndarray)

    def dtype_name(self, array: Any) -> str:
        dtype = array.dtype
        name = _CHECKED_NAMES.get(dtype)
        if name is None:
            if not dtype.isnative:
                raise UnsupportedDtypeError(f"dtype {dtype.str} is not in native byte order")
            name = dtype.name
            check_dtype(name)
            _CHECKED_NAMES[dtype] = name
        return name

    def empty(self, count: int, like: Any) -> Any:
        with like.device:
            return cupy.empty(count, dtype=like.dtype)

    def flat_view(self, array: Any) -> Any | None:
        if not array.flags.c_contiguous:
            return None
        return array.reshape(-1)

    def copy(self, dst: Any, src: Any) -> None:
        with dst.device:
            if dst.shape == src.shape:
                cupy.copyto(dst, src)
            else:
                cupy.copyto(*one_shape(dst, src))

    def combine(self, op: ReduceOp, dst: Any, src: Any) -> None:
        name = self.dtype_name(dst)
        (d, dtype), (s, _) = _bits(dst, name), _bits(src, name)
        with dst.device:
            gpu_kernels.combine(op.combine, d, s, dtype=dtype)

    def combine_after(self, op: ReduceOp, dst: Any, src: Any) -> None:
        self.reduce_into(op, dst, src, dst)  # each element is read before it is written

    def reduce_into(self, op: ReduceOp, dst: Any, a: Any, b: Any) -> None:
        name = self.dtype_name(dst)
        (d, dtype), (x, _), (y, _) = _bits(dst, name), _bits(a, name), _bits(b, name)
        with dst.device:
            gpu_kernels.reduce_into(op.combine, d, x, y, dtype=dtype)

    def divide(self, buffer: Any, divisor: int) -> None:
        b, dtype = _bits(buffer, self.dtype_name(buffer))
        with buffer.device:
            gpu_kernels.divide(b, divisor, dtype=dtype)

    def message(self, buffer: Any) -> Any:
        return buffer.view(cupy.uint8)

    def writable(self, array: Any) -> bool:
        return True  # CuPy has no read-only arrays

    def device(self) -> "CupyDevice":
        if not _DEVICE:
            _DEVICE.append(CupyDevice())
        return _DEVICE[0]

    def shares_memory(self, a: Any, b: Any) -> bool:
        return bool(cupy.may_share_memory(a, b))


class CupyDevice(GpuDevice):
    """The device operations of the device transports, with CuPy, on its current device and stream."""

    def __init__(self) -> None:
        self._opened: dict[int, int] = {}  # id of a mapped peer buffer -> the pointer to unmap

    def is_device(self, buffer: Any) -> bool:
        return isinstance(buffer, cupy.ndarray)

    def pinned(self, nbytes: int) -> Any:
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)

    def to_host(self, dst: Any, src: Any) -> None:
        stream = cupy.cuda.get_current_stream()
        with src.device:
            src.get(out=dst, stream=stream)
        stream.synchronize()

    def to_device(self, dst: Any, src: Any) -> None:
        stream = cupy.cuda.get_current_stream()
        with dst.device:
            dst.set(src, stream=stream)
        # the pinned buffer goes back to the pool and may be written by the next receive
        stream.synchronize()

    def copy(self, dst: Any, src: Any) -> None:
        if len(src):
            cupy.cuda.runtime.memcpyAsync(
                dst.data.ptr,
                src.data.ptr,
                len(src),
                _MEMCPY_DEFAULT,
                cupy.cuda.get_current_stream().ptr,
            )

    def synchronize(self) -> None:
        cupy.cuda.get_current_stream().synchronize()

    def allocate(self, nbytes: int) -> Any:
        # cudaMalloc of its own: a pointer inside a pool's block would map the block's start
        memory = cupy.cuda.Memory(nbytes)
        return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))

    def ipc_handle(self, buffer: Any) -> bytes:
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(buffer.data.ptr))
        if len(handle) != IPC_HANDLE_BYTES:
            raise RuntimeError(f"a CUDA IPC handle has {len(handle)} bytes, not {IPC_HANDLE_BYTES}")
        return handle

    def open_ipc(self, handle: bytes, nbytes: int) -> Any:
        pointer = cupy.cuda.runtime.ipcOpenMemHandle(handle)  # lazily enabling peer access
        memory = cupy.cuda.UnownedMemory(pointer, nbytes, None)
        buffer = cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
        self._opened[id(buffer)] = pointer
        return buffer

    def close_ipc(self, buffer: Any) -> None:
        pointer = self._opened.pop(id(buffer), None)
        if pointer is not None:
            cupy.cuda.runtime.ipcCloseMemHandle(pointer)
