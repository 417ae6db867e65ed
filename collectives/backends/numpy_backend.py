"""numpy arrays, bfloat16 through ml_dtypes."""

__all__ = ["UFUNCS", "NumpyBackend"]

import contextvars
import threading
from collections.abc import Callable
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np

from ..errors import UnsupportedDtypeError
from ..ops import ReduceOp, check_dtype
from .base import ArrayBackend, one_shape

UFUNCS = {
    "sum": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}
"""The numpy ufunc of each binary op (a :class:`~collectives.ops.ReduceOp`'s ``combine``)."""


_QUIET = threading.local()


def _quiet() -> contextvars.Context:
    """This thread's context in which numpy ignores floating-point errors, made once per thread.

    Overflow to Inf and NaN are results here, not errors. ``np.errstate`` says so
    too, but entering it costs about 1 us a call, a fifth of a small allreduce;
    running the ufunc in a context made under it costs 0.04 us.
    """
    context: contextvars.Context | None = getattr(_QUIET, "context", None)
    if context is None:
        with np.errstate(all="ignore"):
            context = _QUIET.context = contextvars.copy_context()
    return context


_CHECKED_NAMES: dict[np.dtype[Any], str] = {}
"""The names of the supported dtypes seen so far (a handful at most)."""


class NumpyBackend(ArrayBackend):
    """Host arrays. Reductions follow numpy: integers wrap, NaN and Inf propagate."""

    name = "numpy"

    def owns(self, array: Any) -> bool:
        return isinstance(array, np.ndarray)

    def dtype_name(self, array: np.ndarray) -> str:
        dtype = array.dtype
        # numpy builds dtype.name anew on every access: microseconds on the small-message path
        name = _CHECKED_NAMES.get(dtype)
        if name is None:
            if not dtype.isnative:
                raise UnsupportedDtypeError(
                    f"dtype {dtype.str} is not in native byte order; convert with astype('={dtype.char}')"
                )
            name = dtype.name
            check_dtype(name)
            _CHECKED_NAMES[dtype] = name
        return name

    def empty(self, count: int, like: np.ndarray) -> np.ndarray:
        return np.empty(count, dtype=like.dtype)

    def flat_view(self, array: np.ndarray) -> np.ndarray | None:
        if not array.flags.c_contiguous:
            return None
        return array.reshape(-1)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        if dst.shape == src.shape:
            np.copyto(dst, src)
        else:
            np.copyto(*one_shape(dst, src))

    def combine(self, op: ReduceOp, dst: np.ndarray, src: np.ndarray) -> None:
        if op.custom:  # the user's function (collectives.Op)
            _quiet().run(op.apply, dst, dst, src)
        elif dst.shape[0] == 1:
            # numpy runs a one-element ``add(a, b, out=a)`` as ``b + a``: another NaN's payload
            dst[0] = _quiet().run(UFUNCS[op.combine], dst[0], src[0])
        else:
            _quiet().run(UFUNCS[op.combine], dst, src, out=dst)

    def combine_after(self, op: ReduceOp, dst: np.ndarray, src: np.ndarray) -> None:
        if op.custom:
            _quiet().run(op.apply, dst, src, dst)
        else:
            _quiet().run(UFUNCS[op.combine], src, dst, out=dst)

    def reduce_into(self, op: ReduceOp, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        if op.custom:
            _quiet().run(op.apply, dst, a, b)
        elif dst.shape[0] == 1:
            dst[0] = _quiet().run(UFUNCS[op.combine], a[0], b[0])  # see combine
        else:
            _quiet().run(UFUNCS[op.combine], a, b, out=dst)

    def reduce_apart(self, op: ReduceOp, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        # one ufunc into a separate ``dst`` keeps a one-element NaN's payload as a scalar ``a op b``
        # does (the swap ``combine`` avoids is only numpy's when ``out`` is ``a``): 0.2 against 0.8 us
        if op.custom:
            _quiet().run(op.apply, dst, a, b)
        else:
            _quiet().run(UFUNCS[op.combine], a, b, out=dst)

    def reducer(self, op: ReduceOp) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
        if op.custom:
            return super().reducer(op)
        # a context of its own, entered by one thread at a time: _quiet()'s lookup is a third of the call
        with np.errstate(all="ignore"):
            run = contextvars.copy_context().run
        ufunc = UFUNCS[op.combine]

        def reduce_apart(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            run(ufunc, a, b, out=dst)

        return reduce_apart

    def from_bytes(self, memory: memoryview, like: np.ndarray) -> np.ndarray:
        usable = len(memory) // like.dtype.itemsize * like.dtype.itemsize
        return np.frombuffer(memory[:usable], dtype=like.dtype)

    def divide(self, buffer: np.ndarray, divisor: int) -> None:
        _quiet().run(np.true_divide, buffer, divisor, out=buffer)

    def message(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.view(np.uint8)

    def writable(self, array: np.ndarray) -> bool:
        return bool(array.flags.writeable)

    def shares_memory(self, a: np.ndarray, b: np.ndarray) -> bool:
        return bool(np.may_share_memory(a, b))
