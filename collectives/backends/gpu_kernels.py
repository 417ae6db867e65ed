"""Reduction kernels on CuPy arrays (placeholder: the kernels land with the gpu-kernels branch)."""

__all__ = ["combine", "divide", "reduce_into", "reduce_many"]

from collections.abc import Sequence
from typing import Any


def combine(op: str, dst: Any, src: Any, *, dtype: str | None = None) -> None:
    """``dst = op(dst, src)`` element-wise, in place, on 1-D contiguous CuPy arrays.

    Args:
        op: the binary op's name (``sum``, ``prod``, ``min``, ``max``, ``band``, ``bor``, ``bxor``).
        dst: the accumulator, written in place.
        src: the other operand, of ``dst``'s size and dtype.
        dtype: the element type's name when it is not the arrays' own, e.g. ``"bfloat16"``
            for arrays carried as ``uint16``.
    """
    raise NotImplementedError("kernels land with the gpu-kernels branch")


def reduce_into(op: str, dst: Any, a: Any, b: Any, *, dtype: str | None = None) -> None:
    """``dst = op(a, b)`` element-wise in one pass, ``a`` and ``b`` left unchanged.

    Args:
        op: the binary op's name.
        dst: the result.
        a: the first operand.
        b: the second operand.
        dtype: the element type's name when it is not the arrays' own.
    """
    raise NotImplementedError("kernels land with the gpu-kernels branch")


def reduce_many(op: str, dst: Any, srcs: Sequence[Any], *, dtype: str | None = None) -> None:
    """``dst = op(srcs[0], srcs[1], ...)`` element-wise in one pass, in the order given.

    Args:
        op: the binary op's name.
        dst: the result.
        srcs: the operands, each of ``dst``'s size and dtype.
        dtype: the element type's name when it is not the arrays' own.
    """
    raise NotImplementedError("kernels land with the gpu-kernels branch")


def divide(buffer: Any, divisor: int, *, dtype: str | None = None) -> None:
    """``buffer /= divisor`` in place, in the buffer's floating type (the last step of ``avg``).

    Args:
        buffer: the array, written in place.
        divisor: the world size.
        dtype: the element type's name when it is not the array's own.
    """
    raise NotImplementedError("kernels land with the gpu-kernels branch")
