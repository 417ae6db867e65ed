"""What the executor needs from an array library."""

__all__ = ["ArrayBackend", "one_shape"]

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..ops import ReduceOp

if TYPE_CHECKING:
    from ..transport.device import GpuDevice


class ArrayBackend(ABC):
    """Element-wise work on one-dimensional, contiguous buffers of one array library.

    Buffers are the library's own arrays; the executor only slices them.
    """

    name: str

    @abstractmethod
    def owns(self, array: Any) -> bool:
        """Whether ``array`` belongs to this backend's library."""

    @abstractmethod
    def dtype_name(self, array: Any) -> str:
        """The dtype's name (``float32``, ``bfloat16``, ...); raises if it is not supported."""

    @abstractmethod
    def empty(self, count: int, like: Any) -> Any:
        """A new 1-D buffer of ``count`` elements of ``like``'s dtype and device."""

    @abstractmethod
    def flat_view(self, array: Any) -> Any | None:
        """A 1-D view of a C-contiguous ``array``; ``None`` if it is not contiguous."""

    @abstractmethod
    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src``, for arrays of equal size whatever their shapes and strides."""

    @abstractmethod
    def combine(self, op: ReduceOp, dst: Any, src: Any) -> None:
        """``dst = op(dst, src)`` element-wise, in place."""

    def combine_after(self, op: ReduceOp, dst: Any, src: Any) -> None:
        """``dst = op(src, dst)`` element-wise, in place: ``src`` is the first operand.

        The operands' order decides the bits where IEEE leaves them open (which NaN's
        payload survives; ``max(+0, -0)``), so the executor fixes it (lower rank first).
        """
        first = self.empty(src.shape[0], src)
        self.copy(first, src)
        self.combine(op, first, dst)
        self.copy(dst, first)

    def reduce_into(self, op: ReduceOp, dst: Any, a: Any, b: Any) -> None:
        """``dst = op(a, b)`` element-wise (``dst`` may be ``a`` or ``b``); one pass where possible."""
        if self.shares_memory(dst, b):
            self.combine_after(op, dst, a)
            return
        self.copy(dst, a)
        self.combine(op, dst, b)

    def reduce_apart(self, op: ReduceOp, dst: Any, a: Any, b: Any) -> None:
        """``dst = op(a, b)`` element-wise where ``dst`` shares no memory with ``a`` or ``b``.

        The small shared-memory allreduce's reduction (its inputs lie in the window, its
        output is the caller's): what :meth:`reduce_into` does, without its checks for aliasing.
        """
        self.reduce_into(op, dst, a, b)

    def reducer(self, op: ReduceOp) -> "Callable[[Any, Any, Any], None]":
        """:meth:`reduce_apart` for ``op`` as one function ``f(dst, a, b)``, made once for calls in a row.

        For one thread at a time (a caller that holds its communicator's claim):
        what it prepares may not be shared by two threads at once.
        """
        return functools.partial(self.reduce_apart, op)

    def from_bytes(self, memory: memoryview, like: Any) -> Any:
        """A 1-D array of ``like``'s dtype over host ``memory`` (no copy), for shared memory.

        Raises:
            NotImplementedError: the library's arrays cannot live in host memory it did not allocate.
        """
        raise NotImplementedError(f"{self.name} arrays cannot use shared host memory")

    def device(self) -> "GpuDevice | None":
        """The device operations for this library's arrays, ``None`` for host arrays (the default).

        A backend with a device has its messages sent over the communicator's device
        path (see :mod:`collectives.transport.device_path`).
        """
        return None

    @abstractmethod
    def divide(self, buffer: Any, divisor: int) -> None:
        """``buffer /= divisor`` in place, in the buffer's dtype (the last step of ``avg``)."""

    @abstractmethod
    def message(self, buffer: Any) -> Any:
        """The bytes of a 1-D buffer, as a transport sends and receives them."""

    @abstractmethod
    def writable(self, array: Any) -> bool:
        """Whether ``array`` may be written."""

    @abstractmethod
    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether two arrays may overlap in memory."""


def one_shape(dst: Any, src: Any) -> tuple[Any, Any]:
    """``dst`` and ``src`` (of one size, other shapes) in one shape, for a copy from ``src`` into ``dst``.

    ``dst`` is reshaped only where it is C-contiguous, so that the reshape is a view
    the copy writes through; otherwise ``src`` takes ``dst``'s shape.
    """
    if dst.flags.c_contiguous:
        return dst.reshape(src.shape), src
    return dst, src.reshape(dst.shape)
