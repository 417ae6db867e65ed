"""The CUDA kernels on the CPU: a stand-in for the part of CuPy the kernel loader and its tests use.

Its ``RawModule`` compiles the loader's own translation unit (``gpu_kernels.module_source()``)
as C++ with ``host_cuda.hpp`` included first, which supplies what the sources take from CUDA;
the kernels' inline PTX has C++ twins for this build (``#if defined(__CUDA_ARCH__)``). A launch
runs every thread of the grid one after another, and then checks what a GPU would have
punished: 128-bit accesses off a 16-byte boundary, and bytes written outside the arrays.

So the real kernels' numbers, their head/body/tail split and their grid-stride loops are checked
against numpy on any machine with a C++ compiler. What this cannot check: the PTX itself (its
rounding modes are the IEEE defaults the C++ twins use), and anything about speed.
"""

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

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


class ndarray:  # named as CuPy's, which the loader checks for
    """A 1-D array in stand-in device memory: what of ``cupy.ndarray`` the loader and the tests use."""

    def __init__(self, allocation: Allocation, view: np.ndarray) -> None:
        self.allocation = allocation
        self.view = view
        self.device = SimpleNamespace(id=0)

    def __getattr__(self, name: str) -> Any:
        if name in ("ndim", "flags", "dtype", "size", "shape", "strides", "nbytes"):
            return getattr(self.view, name)
        raise AttributeError(name)

    @property
    def data(self) -> SimpleNamespace:
        return SimpleNamespace(ptr=self.view.ctypes.data)

    def __getitem__(self, key: Any) -> "ndarray":
        return ndarray(self.allocation, self.view[key])

    def set(self, host: np.ndarray) -> None:
        if host.dtype != self.view.dtype or host.shape != self.view.shape:
            expected = f"{self.view.dtype} {self.view.shape}"
            raise ValueError(f"set() takes {expected}, not {host.dtype} {host.shape}")
        self.view[...] = host

    def get(self) -> np.ndarray:
        return self.view.copy()


def empty(size: int, dtype: Any) -> ndarray:
    numpy_dtype = np.dtype(dtype)
    allocation = Allocation(size * numpy_dtype.itemsize)
    return ndarray(allocation, allocation.payload.view(numpy_dtype))


def zeros(size: int, dtype: Any) -> ndarray:
    array = empty(size, dtype)
    array.view[...] = 0
    return array


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


def _device_properties(device: int) -> dict[str, int]:
    assert device == 0
    return {"multiProcessorCount": MULTIPROCESSORS}


runtime = SimpleNamespace(
    getDevice=lambda: 0, getDeviceCount=lambda: 1, getDeviceProperties=_device_properties
)
cuda = SimpleNamespace(runtime=runtime)
host_emulation = True
"""Tells the tests this is not CuPy."""
