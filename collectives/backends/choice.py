"""Choosing the array backend by the type of the user's array."""

__all__ = ["adopt", "backend_for", "looks_like_device_array", "trying_first"]

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ..errors import UnsupportedDtypeError
from .base import ArrayBackend

_BACKENDS: list[ArrayBackend] = []
_CUPY: list[ArrayBackend] = []

_DLPACK_CUDA = (2, 3, 13)
"""DLPack device types of memory CUDA kernels can read: kDLCUDA, kDLCUDAHost, kDLCUDAManaged."""


def looks_like_device_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array or exposes CUDA memory; imports no GPU library."""
    if type(array).__module__.startswith("cupy"):
        return True
    # a foreign object's protocol may raise anything (torch's CUDA array interface, for bfloat16)
    with suppress(Exception):
        device = getattr(array, "__dlpack_device__", None)
        if device is not None and int(device()[0]) in _DLPACK_CUDA:
            return True
    with suppress(Exception):
        return hasattr(array, "__cuda_array_interface__")
    return False


def _cupy_backend() -> ArrayBackend:
    if not _CUPY:
        try:
            from .cupy_backend import CupyBackend
        except ImportError as error:
            raise UnsupportedDtypeError(
                f"device arrays need CuPy (pip install cupy-cuda12x or cupy-cuda13x): {error}"
            ) from None
        _CUPY.append(CupyBackend())
    return _CUPY[0]


def _host_backends() -> list[ArrayBackend]:
    from .numpy_backend import NumpyBackend

    _BACKENDS.append(NumpyBackend())
    return _BACKENDS


@contextmanager
def trying_first(backend: ArrayBackend) -> Iterator[ArrayBackend]:
    """Offer ``backend`` arrays before the others while the block runs (a stand-in device in tests)."""
    saved = list(_BACKENDS or _host_backends())
    _BACKENDS[:] = [backend, *saved]
    try:
        yield backend
    finally:
        _BACKENDS[:] = saved


def backend_for(array: Any) -> ArrayBackend:
    """The backend that handles ``array``'s type; raises if none does.

    CuPy is imported only for an array that is not numpy's and looks like a device array.
    """
    for backend in _BACKENDS or _host_backends():
        if backend.owns(array):
            return backend
    if looks_like_device_array(array):
        backend = _cupy_backend()
        if backend.owns(array):
            return backend
    raise UnsupportedDtypeError(
        f"cannot communicate a {type(array).__module__}.{type(array).__qualname__}; "
        "pass a numpy or CuPy array"
    )


def adopt(array: Any) -> Any:
    """``array`` itself if a backend owns it, else a CuPy view of a foreign CUDA array (no copy).

    Anything else is returned unchanged, for :func:`backend_for` to reject.
    """
    module = type(array).__module__
    if module == "numpy" or module.startswith("cupy") or not looks_like_device_array(array):
        return array
    from .cupy_backend import adopt as cupy_adopt

    _cupy_backend()  # the same error as backend_for's when CuPy is missing
    return cupy_adopt(array)
