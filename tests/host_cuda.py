"""The CUDA kernels on the CPU: a stand-in for the part of CuPy the kernel loader and the CuPy backend use.

Its ``RawModule`` compiles the loader's own translation unit (``gpu_kernels.module_source()``)
as C++ with ``host_cuda.hpp`` included first, which supplies what the sources take from CUDA;
the kernels' inline PTX has C++ twins for this build (``#if defined(__CUDA_ARCH__)``). A launch
runs every thread of the grid one after another, and then checks what a GPU would have
punished: 128-bit accesses off a 16-byte boundary, and bytes written outside the arrays.

So the real kernels' numbers, their head/body/tail split and their grid-stride loops are checked
against numpy on any machine with a C++ compiler. What this cannot check: the PTX itself (its
rounding modes are the IEEE defaults the C++ twins use), and anything about speed.

Installed as ``cupy`` (and :data:`cupyx`) it also runs ``collectives.backends.cupy_backend``:
"device" memory is host memory, streams are synchronous, and an IPC handle names an allocation
of this process, which it opens again (CUDA refuses that; here ranks are threads). It follows
CuPy's signatures for what the backend calls, not CuPy's every rule.
"""

import contextlib
import ctypes
import functools
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from collectives.backends import gpu_kernels

HEADER = Path(__file__).with_name("host_cuda.hpp")
ALIGNMENT = 256
"""Where allocations start, as CuPy's memory pool aligns them."""
GUARD_BYTES = 64
GUARD = 0x5A
"""What the bytes around each allocation hold; a kernel that writes there is caught."""
GARBAGE = 0xA5
"""What a new allocation holds, so an element a kernel never wrote shows."""
MULTIPROCESSORS = 1
"""The stand-in device's SMs: few, so the loader's grid (8 blocks an SM) strides over large arrays."""
COMPILE_FLAGS = (
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-fno-strict-aliasing",  # the kernels read any dtype's elements as uint4
    "-ffp-contract=off",  # one rounding per operation, as the PTX's explicit .rn
    "-w",
)
_FORMS = {"combine": 0, "reduce_into": 1, "reduce_many": 2}
_DIVIDE_FORMS = {np.float32: 3, np.float64: 4}


def compiler() -> str | None:
    """The C++ compiler the host build uses, or None where there is none."""
    for name in ("g++", "clang++", "c++"):
        found = shutil.which(name)
        if found:
            return found
    return None


@functools.cache
def build(code: str) -> ctypes.CDLL:
    """``code`` (the kernels' translation unit) compiled for the CPU and loaded."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or clang++) to build the kernels for the host")
    with tempfile.TemporaryDirectory(prefix="collectives-host-kernels-") as directory:
        source = Path(directory) / "kernels.cpp"
        library = Path(directory) / "kernels.so"
        source.write_text(code, encoding="utf-8")
        command = [cxx, *COMPILE_FLAGS, "-include", str(HEADER), "-x", "c++", str(source), "-o", str(library)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode:
            raise RuntimeError(f"the host build of the kernels failed:\n{' '.join(command)}\n{result.stderr}")
        loaded = ctypes.CDLL(str(library))  # loaded before the directory goes
    launch = loaded.collectives_host_launch
    launch.restype = ctypes.c_ulonglong
    launch.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_ulonglong,
        ctypes.c_double,
    ]
    return loaded


class Allocation:
    """Bytes of stand-in device memory, ``ALIGNMENT``-aligned, with guard bytes on both sides."""

    def __init__(self, nbytes: int) -> None:
        self.raw = np.full(nbytes + 2 * GUARD_BYTES + ALIGNMENT, GUARD, dtype=np.uint8)
        address = self.raw.ctypes.data + GUARD_BYTES
        self.start = GUARD_BYTES + (-address) % ALIGNMENT
        self.end = self.start + nbytes
        self.raw[self.start : self.end] = GARBAGE

    @property
    def payload(self) -> np.ndarray:
        return self.raw[self.start : self.end]

    def check_guards(self, kernel: str) -> None:
        outside = np.concatenate([self.raw[: self.start], self.raw[self.end :]])
        written = np.flatnonzero(outside != GUARD)
        if written.size:
            raise AssertionError(f"{kernel} wrote {written.size} bytes outside an allocation")


class Memory:
    """``cupy.cuda.Memory``: an allocation of its own, as ``cudaMalloc`` makes."""

    def __init__(self, size: int) -> None:
        self.allocation = Allocation(size)
        self.ptr = self.allocation.payload.ctypes.data
        self.size = size
        _allocations[self.ptr] = self.allocation


class UnownedMemory:
    """``cupy.cuda.UnownedMemory``: memory at ``ptr`` that something else allocated."""

    def __init__(self, ptr: int, size: int, owner: Any, device_id: int | None = None) -> None:
        self.ptr = ptr
        self.size = size
        self.owner = owner
        self.allocation = _allocations.get(ptr)


class MemoryPointer:
    def __init__(self, mem: "Memory | UnownedMemory", offset: int) -> None:
        self.mem = mem
        self.ptr = mem.ptr + offset


_allocations: "weakref.WeakValueDictionary[int, Allocation]" = weakref.WeakValueDictionary()
"""The live allocations by address: an IPC handle names one."""


class _Device:
    """``array.device`` and ``cupy.cuda.Device(0)``: device 0, a context manager."""

    id = 0

    def __enter__(self) -> "_Device":
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def use(self) -> None:
        return None


class ndarray:  # named as CuPy's, which the loader and the backend check for
    """An array in stand-in device memory: what of ``cupy.ndarray`` the loader, backend and tests use.

    ``ndarray(shape, dtype, memptr)`` as CuPy's; ``values`` is the numpy array over its bytes.
    """

    device = _Device()

    def __init__(self, shape: Any, dtype: Any = float, memptr: MemoryPointer | None = None) -> None:
        numpy_dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * numpy_dtype.itemsize
        if memptr is None:
            memptr = MemoryPointer(Memory(nbytes), 0)
        self.allocation = memptr.mem.allocation
        if self.allocation is not None:
            start = memptr.ptr - self.allocation.raw.ctypes.data
            raw = self.allocation.raw[start : start + nbytes]
        else:
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(memptr.ptr))
        self.values = raw.view(numpy_dtype).reshape(shape)
        self.memory = memptr.mem  # kept alive as long as the array

    @classmethod
    def _over(cls, source: "ndarray", values: np.ndarray) -> "ndarray":
        array = cls.__new__(cls)
        array.values, array.allocation, array.memory = values, source.allocation, source.memory
        return array

    def __getattr__(self, name: str) -> Any:
        if name in ("ndim", "flags", "dtype", "size", "shape", "strides", "nbytes", "itemsize"):
            return getattr(self.values, name)
        raise AttributeError(name)

    @property
    def data(self) -> SimpleNamespace:
        return SimpleNamespace(ptr=self.values.ctypes.data)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # what tells collectives.backends a device array from others
        typestr = self.values.dtype.str
        return {"shape": self.shape, "typestr": typestr, "data": (self.data.ptr, False), "version": 3}

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: Any) -> "ndarray":
        return ndarray._over(self, self.values[key])

    def view(self, dtype: Any) -> "ndarray":
        return ndarray._over(self, self.values.view(dtype))

    def reshape(self, *shape: Any) -> "ndarray":
        return ndarray._over(self, self.values.reshape(*shape))

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        if host.dtype != self.dtype or host.shape != self.shape:
            raise ValueError(f"set() takes {self.dtype} {self.shape}, not {host.dtype} {host.shape}")
        self.values[...] = host

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return self.values.copy()
        if out.dtype != self.dtype or out.shape != self.shape:
            raise ValueError(f"get(out=) takes {self.dtype} {self.shape}, not {out.dtype} {out.shape}")
        out[...] = self.values
        return out


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return ndarray(shape, dtype)


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    array = empty(shape, dtype)
    array.values[...] = 0
    return array


def asarray(host: Any) -> ndarray:
    values = np.asarray(host)
    array = empty(values.shape, values.dtype)
    array.set(values)
    return array


def asnumpy(array: ndarray) -> np.ndarray:
    return array.get()


def copyto(dst: ndarray, src: ndarray) -> None:
    np.copyto(dst.values, src.values)


def may_share_memory(a: ndarray, b: ndarray) -> bool:
    return bool(np.may_share_memory(a.values, b.values))


uint8, uint16, float32 = np.uint8, np.uint16, np.float32


class HostKernel:
    """One kernel of the host build; called as CuPy calls a ``RawKernel``: ``(grid, block, args)``."""

    def __init__(self, library: ctypes.CDLL, name: str) -> None:
        self.library = library
        self.name = name
        self.address = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
        self.kind = next(kind for kind in gpu_kernels.KINDS if name.startswith(f"collectives_{kind}_"))

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        (blocks,), (threads,) = grid, block
        *arrays, count = args
        assert isinstance(count, np.uint64), f"{self.name}: n must be a numpy.uint64, not {type(count)}"
        k, divisor = 0, 0.0
        if self.kind == "divide":
            arrays, (value,) = arrays[:1], arrays[1:]
            form = _DIVIDE_FORMS.get(type(value))
            assert form is not None, f"{self.name}: the divisor's type is {type(value)}"
            divisor = float(value)
        elif self.kind == "reduce_many":
            *arrays, inputs = arrays
            assert isinstance(inputs, np.int32), f"{self.name}: k must be a numpy.int32, not {type(inputs)}"
            assert len(arrays) == 1 + gpu_kernels.MAX_INPUTS, f"{self.name}: {len(arrays)} pointers"
            form, k = _FORMS["reduce_many"], int(inputs)
        else:
            form = _FORMS[self.kind]
        assert all(isinstance(array, ndarray) for array in arrays), f"{self.name}: pointers must be arrays"
        pointers = (ctypes.c_void_p * 9)(*[array.data.ptr for array in arrays])
        misaligned = self.library.collectives_host_launch(
            self.address, form, blocks, threads, pointers, k, int(count), divisor
        )
        if misaligned:
            raise AssertionError(f"{self.name} made {misaligned} 128-bit accesses off a 16-byte boundary")
        for array in arrays:
            array.allocation.check_guards(self.name)


class RawModule:
    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        self.library = build(code)
        self.options = options

    def get_function(self, name: str) -> HostKernel:
        return HostKernel(self.library, name)


@contextlib.contextmanager
def installed() -> Iterator[ModuleType]:
    """This module as ``cupy`` (and ``cupyx``) for the loader and the backend, within the block.

    The backend's module is imported afresh against it, and forgotten after.
    """
    from collectives import backends
    from collectives.backends import choice

    module = sys.modules[__name__]
    backend_module = "collectives.backends.cupy_backend"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "cupy", module)
        patch.setitem(sys.modules, "cupyx", cupyx)
        patch.delitem(sys.modules, backend_module, raising=False)
        patch.delattr(backends, "cupy_backend", raising=False)
        patch.setattr(choice, "_CUPY", [])
        patch.setattr(gpu_kernels, "_cupy", lambda: module)
        for cache in ("_modules", "_functions", "_max_blocks"):
            patch.setattr(gpu_kernels, cache, {})
        try:
            yield module
        finally:
            sys.modules.pop(backend_module, None)
            if hasattr(backends, "cupy_backend"):
                delattr(backends, "cupy_backend")


KINDS = [pytest.param("cuda", marks=pytest.mark.gpu), "host"]
"""The parameters of a fixture that gives :func:`cupy_for` each kind: the GPU's marked ``gpu``."""


@contextlib.contextmanager
def cupy_for(kind: str) -> Iterator[ModuleType]:
    """CuPy on a GPU (``"cuda"``), or this stand-in installed (``"host"``); skips where it cannot be had."""
    if kind == "host":
        if compiler() is None:
            pytest.skip("the host build of the kernels needs a C++ compiler (g++ or clang++)")
        with installed() as module:
            yield module
        return
    try:
        import cupy
    except ImportError:
        pytest.skip("needs CuPy (pip install cupy-cuda13x) and a CUDA device")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        pytest.skip(f"needs a CUDA device: {error}")
    if count < 1:
        pytest.skip("needs a CUDA device; CuPy sees none")
    yield cupy


def _device_properties(device: int) -> dict[str, int]:
    assert device == 0
    return {"multiProcessorCount": MULTIPROCESSORS}


def _memcpy(dst: int, src: int, size: int, kind: int, stream: int = 0) -> None:
    ctypes.memmove(dst, src, size)


IPC_HANDLE_BYTES = 64


def _ipc_handle(pointer: int) -> bytes:
    if pointer not in _allocations:
        raise ValueError(f"no allocation starts at {pointer:#x}")
    return pointer.to_bytes(8, "little") + bytes(IPC_HANDLE_BYTES - 8)


def _open_ipc(handle: bytes, flags: int = 1) -> int:
    pointer = int.from_bytes(bytes(handle)[:8], "little")
    if pointer not in _allocations:
        raise ValueError(f"the IPC handle names no live allocation ({pointer:#x})")
    return pointer


class Stream:
    """Every stream is the null stream: work is done when it is queued."""

    ptr = 0

    def synchronize(self) -> None:
        return None


runtime = SimpleNamespace(
    getDevice=lambda: 0,
    getDeviceCount=lambda: 1,
    getDeviceProperties=_device_properties,
    memcpyAsync=_memcpy,
    ipcGetMemHandle=_ipc_handle,
    ipcOpenMemHandle=_open_ipc,
    ipcCloseMemHandle=lambda pointer: None,
)
cuda = SimpleNamespace(
    runtime=runtime,
    Device=lambda device=0: _Device(),
    Memory=Memory,
    UnownedMemory=UnownedMemory,
    MemoryPointer=MemoryPointer,
    get_current_stream=Stream,
)
cupyx = SimpleNamespace(empty_pinned=lambda shape, dtype=float: np.empty(shape, dtype=dtype))
"""The stand-in for the ``cupyx`` module: pinned memory is any host memory."""
host_emulation = True
"""Tells the tests this is not CuPy."""
