"""The one loader of the CUDA reduction kernels in ``kernels/``: sources, names, compilation, launches."""

__all__ = [
    "KINDS",
    "MAX_INPUTS",
    "NVRTC_OPTIONS",
    "combine",
    "divide",
    "kernel_name",
    "kernel_names",
    "kernel_sources",
    "module_source",
    "reduce_into",
    "reduce_many",
]

import functools
import importlib
import operator
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InvalidBufferError, UnsupportedDtypeError
from ..ops import DTYPES, FLOAT_DTYPES, OPS, ReduceOp, check_dtype, get_op

KINDS = ("combine", "reduce_into", "reduce_many", "divide")
"""The kinds of kernel: ``collectives_<kind>_<op>_<dtype>``, and ``collectives_divide_<dtype>``."""

MAX_INPUTS = 8
"""The most inputs one ``reduce_many`` pass reads (``kMaxInputs`` in the kernels); more take several."""

NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)
"""What the kernels are compiled with; CuPy adds the device's architecture (and ``-ftz=true``,
which the kernels' float arithmetic does not depend on: it is written with explicit rounding)."""

_MAIN_SOURCE = "collectives_reduce.cu"
_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+\.cuh)"[ \t]*$', re.MULTILINE)
_BLOCK_SIZE = 256  # kBlockSize in the kernels: their __launch_bounds__
_BLOCKS_PER_SM = 8  # 2048 resident threads per SM on sm_80 and sm_90: the grid fills the device once
_ITEMSIZES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
}  # fmt: skip
# the kernels' divisor parameter: the float dtypes' accumulator type
_DIVISOR_TYPES: dict[str, type[np.floating[Any]]] = {
    "float16": np.float32,
    "bfloat16": np.float32,
    "float32": np.float32,
    "float64": np.float64,
}


# --------------------------------------------------------------------------------------------- sources


def _kernel_dir() -> Path:
    """Where the sources are: ``collectives/kernels`` in a wheel, ``kernels/`` in the source tree."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "kernels", package.parent / "kernels"):
        if (candidate / _MAIN_SOURCE).is_file():
            return candidate
    raise FileNotFoundError(
        f"the CUDA kernel sources ({_MAIN_SOURCE}) are in neither {package / 'kernels'} (an installed "
        f"package) nor {package.parent / 'kernels'} (the source tree); reinstall collectives"
    )


@functools.cache
def _read_sources() -> tuple[tuple[str, str], ...]:
    directory = _kernel_dir()
    paths = sorted(p for p in directory.iterdir() if p.suffix in (".cu", ".cuh") and p.is_file())
    return tuple((p.name, p.read_text(encoding="utf-8")) for p in paths)


def kernel_sources() -> dict[str, str]:
    """Every kernel source file: its name (``collectives_reduce.cu``, ...) mapped to its text.

    Found in the installed package or the source tree; needs no CuPy.
    """
    return dict(_read_sources())


@functools.cache
def module_source() -> str:
    """The one translation unit the loader compiles: the ``.cu`` file with its ``.cuh`` includes inlined.

    Inlined rather than found through ``-I``, so CuPy's on-disk kernel cache, which is keyed on
    the source text, sees every change to a header.
    """
    sources = kernel_sources()

    def inline(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in sources:
            raise FileNotFoundError(f"{_MAIN_SOURCE} includes {name}, which is not among {sorted(sources)}")
        return f"// ---- {name}\n{sources[name]}\n// ---- end of {name}"

    return _INCLUDE.sub(inline, sources[_MAIN_SOURCE])


def kernel_name(kind: str, op: str | None, dtype: str) -> str:
    """The entry point of ``kind`` for ``op`` on ``dtype``; ``divide`` takes no op.

    >>> kernel_name("combine", "sum", "bfloat16")
    'collectives_combine_sum_bfloat16'
    >>> kernel_name("divide", None, "float32")
    'collectives_divide_float32'
    """
    if kind == "divide":
        return f"collectives_divide_{dtype}"
    return f"collectives_{kind}_{op}_{dtype}"


def kernel_names() -> list[str]:
    """Every kernel entry point: each reducing kind for each (op, dtype) pair of :mod:`collectives.ops`,
    and ``divide`` for each float dtype (``avg`` applies to them only)."""
    names: list[str] = []
    for kind in KINDS[:-1]:
        for name, op in OPS.items():
            if name != op.combine:  # avg reduces with sum
                continue
            names.extend(kernel_name(kind, name, dtype) for dtype in DTYPES if dtype in op.dtypes)
    names.extend(kernel_name("divide", None, dtype) for dtype in FLOAT_DTYPES)
    return names


# --------------------------------------------------------------------------------------------- compiling


def _cupy() -> ModuleType:
    return importlib.import_module("cupy")


_lock = threading.Lock()
_modules: dict[int, Any] = {}
_functions: dict[tuple[int, str], Any] = {}
_max_blocks: dict[int, int] = {}


def _function(name: str) -> tuple[Any, int]:
    """The compiled kernel ``name`` on the current device, and the most blocks worth launching there."""
    cupy = _cupy()
    device = cupy.cuda.runtime.getDevice()
    found = _functions.get((device, name))
    if found is None:
        with _lock:
            module = _modules.get(device)
            if module is None:
                module = cupy.RawModule(code=module_source(), options=NVRTC_OPTIONS)
                _modules[device] = module
                properties = cupy.cuda.runtime.getDeviceProperties(device)
                _max_blocks[device] = int(properties["multiProcessorCount"]) * _BLOCKS_PER_SM
            found = module.get_function(name)
            _functions[(device, name)] = found
    return found, _max_blocks[device]


def _launch(name: str, work: int, args: tuple[Any, ...]) -> None:
    """Run ``name`` on the current stream with enough threads for ``work`` items (grid-stride beyond)."""
    function, max_blocks = _function(name)
    blocks = max(1, min(max_blocks, -(-work // _BLOCK_SIZE)))
    function((blocks,), (_BLOCK_SIZE,), args)


# --------------------------------------------------------------------------------------------- checks


def _describe(array: Any) -> str:
    return f"{type(array).__module__}.{type(array).__qualname__}"


def _check_buffers(dtype: str | None, arrays: Sequence[Any], names: Sequence[str]) -> tuple[str, int]:
    """The dtype name the kernels read ``arrays`` as, and their common size; raises on a bad buffer.

    Arrays must be 1-D, contiguous CuPy arrays of one dtype and size on the current device.
    ``dtype`` overrides the arrays' dtype name, for bfloat16 held in uint16 arrays.
    """
    cupy = _cupy()
    device = cupy.cuda.runtime.getDevice()
    first = arrays[0]
    for array, name in zip(arrays, names, strict=True):
        if not isinstance(array, cupy.ndarray):
            raise InvalidBufferError(f"{name} must be a cupy.ndarray, not a {_describe(array)}")
        if array.ndim != 1 or not array.flags.c_contiguous:
            raise InvalidBufferError(
                f"{name} must be 1-D and contiguous; got shape {array.shape}, strides {array.strides}"
            )
        if array.dtype != first.dtype:
            raise InvalidBufferError(f"{name} has dtype {array.dtype}, {names[0]} has {first.dtype}")
        if array.size != first.size:
            raise InvalidBufferError(f"{name} has {array.size} elements, {names[0]} has {first.size}")
        if array.device.id != device:
            raise InvalidBufferError(f"{name} is on device {array.device.id}, the current device is {device}")
    name = first.dtype.name if dtype is None else dtype
    check_dtype(name)
    if first.dtype.itemsize != _ITEMSIZES[name]:
        raise InvalidBufferError(
            f"cannot read {first.dtype} elements ({first.dtype.itemsize} bytes) as {name} "
            f"({_ITEMSIZES[name]} bytes)"
        )
    return name, int(first.size)


def _check_overlap(dst: Any, sources: Sequence[Any]) -> None:
    """Each source must be ``dst`` itself or apart from it: a partial overlap would race."""
    start = dst.data.ptr
    end = start + dst.nbytes
    for index, source in enumerate(sources):
        other = source.data.ptr
        if other != start and other < end and start < other + source.nbytes:
            raise InvalidBufferError(
                f"source {index} overlaps the output without being it (byte offset {other - start}); "
                "the kernels read and write element-wise"
            )


def _reduce_op(op: "str | ReduceOp", dtype: str) -> str:
    """The binary op the kernels use (``avg`` combines with ``sum``); raises if it cannot reduce ``dtype``."""
    reduce_op = get_op(op)
    reduce_op.check_dtype(dtype)
    return reduce_op.combine


# --------------------------------------------------------------------------------------------- launches


def combine(op: "str | ReduceOp", dst: Any, src: Any, *, dtype: str | None = None) -> None:
    """``dst = op(dst, src)`` element-wise, in place, on the current CuPy stream.

    Args:
        op: the op's name or :class:`~collectives.ops.ReduceOp` (``avg`` combines with ``sum``).
        dst: 1-D contiguous CuPy array, updated in place.
        src: a CuPy array of ``dst``'s dtype and size; it may be ``dst`` itself.
        dtype: the dtype name to read the arrays as, overriding theirs: CuPy has no bfloat16,
            so bfloat16 buffers arrive as uint16 arrays with ``dtype="bfloat16"``.

    Raises:
        UnsupportedDtypeError: the dtype is not one the library reduces.
        UnsupportedOpError: the op is unknown or does not apply to the dtype.
        InvalidBufferError: the arrays are not 1-D contiguous CuPy arrays of one dtype, size and
            device, or ``src`` partly overlaps ``dst``.
    """
    name, count = _check_buffers(dtype, (dst, src), ("dst", "src"))
    combine_op = _reduce_op(op, name)
    _check_overlap(dst, (src,))
    if count:
        _launch(kernel_name("combine", combine_op, name), _packs(count, name), (dst, src, np.uint64(count)))


def reduce_into(op: "str | ReduceOp", dst: Any, a: Any, b: Any, *, dtype: str | None = None) -> None:
    """``dst = op(a, b)`` element-wise in one pass, on the current CuPy stream.

    ``a`` and ``b`` are left unchanged unless one of them is ``dst``. Arguments and errors are
    those of :func:`combine`.
    """
    name, count = _check_buffers(dtype, (dst, a, b), ("dst", "a", "b"))
    combine_op = _reduce_op(op, name)
    _check_overlap(dst, (a, b))
    if count:
        args = (dst, a, b, np.uint64(count))
        _launch(kernel_name("reduce_into", combine_op, name), _packs(count, name), args)


def reduce_many(op: "str | ReduceOp", dst: Any, srcs: Sequence[Any], *, dtype: str | None = None) -> None:
    """``dst = op(srcs[0], ..., srcs[-1])`` element-wise, on the current CuPy stream.

    Up to :data:`MAX_INPUTS` sources are read in one pass, and float16 and bfloat16 are
    accumulated in float32 and rounded once. More sources take several passes, each folding the
    next ``MAX_INPUTS - 1`` into ``dst`` (so 16-bit floats are rounded once a pass). ``dst`` may
    be one of the sources. Arguments and errors are otherwise those of :func:`combine`.

    Raises:
        InvalidBufferError: also when ``srcs`` is empty.
    """
    sources = list(srcs)
    if not sources:
        raise InvalidBufferError("reduce_many needs at least one source")
    names = ["dst", *(f"srcs[{i}]" for i in range(len(sources)))]
    name, count = _check_buffers(dtype, [dst, *sources], names)
    combine_op = _reduce_op(op, name)
    _check_overlap(dst, sources)
    if not count:
        return
    # a source that is dst must be read in the first pass, before dst is written
    sources.sort(key=lambda source: source.data.ptr != dst.data.ptr)
    function = kernel_name("reduce_many", combine_op, name)
    work = _packs(count, name)
    batch, rest = sources[:MAX_INPUTS], sources[MAX_INPUTS:]
    while True:
        padding = [batch[0]] * (MAX_INPUTS - len(batch))  # unread: the kernel reads the first k
        _launch(function, work, (dst, *batch, *padding, np.int32(len(batch)), np.uint64(count)))
        if not rest:
            return
        batch, rest = [dst, *rest[: MAX_INPUTS - 1]], rest[MAX_INPUTS - 1 :]


def divide(buffer: Any, divisor: int, *, dtype: str | None = None) -> None:
    """``buffer /= divisor`` in place in the buffer's dtype, on the current CuPy stream: ``avg``'s last step.

    As ``np.true_divide(buffer, divisor, out=buffer)``: the divisor is first rounded to the
    dtype, and float16 and bfloat16 divide in float32 and round once.

    Raises:
        UnsupportedDtypeError: the dtype is not a float dtype (integers have no ``avg``).
        InvalidBufferError: ``buffer`` is not a 1-D contiguous CuPy array on the current device.
    """
    name, count = _check_buffers(dtype, (buffer,), ("buffer",))
    if name not in FLOAT_DTYPES:
        raise UnsupportedDtypeError(f"divide applies to {', '.join(FLOAT_DTYPES)}, not {name}")
    value = _divisor(operator.index(divisor), name)
    if count:
        _launch(kernel_name("divide", None, name), _packs(count, name), (buffer, value, np.uint64(count)))


def _divisor(divisor: int, dtype: str) -> np.floating[Any]:
    """``divisor`` rounded to ``dtype`` as numpy rounds a Python int it divides by, as the kernel takes it."""
    numpy_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    with np.errstate(over="ignore"):  # beyond float16's range: inf, as in numpy
        rounded = np.asarray(divisor).astype(numpy_dtype)
    return _DIVISOR_TYPES[dtype](rounded.astype(np.float64))


def _packs(count: int, dtype: str) -> int:
    """How many 16-byte packs ``count`` elements fill: the threads worth launching."""
    per_pack = 16 // _ITEMSIZES[dtype]
    return -(-count // per_pack)
