"""Array backends, chosen by the type of the user's array."""

__all__ = ["ArrayBackend", "backend_for"]

from typing import Any

from ..errors import UnsupportedDtypeError
from .base import ArrayBackend

_BACKENDS: list[ArrayBackend] = []


def backend_for(array: Any) -> ArrayBackend:
    """The backend that handles ``array``'s type; raises if none does."""
    if not _BACKENDS:
        from .numpy_backend import NumpyBackend

        _BACKENDS.append(NumpyBackend())
    for backend in _BACKENDS:
        if backend.owns(array):
            return backend
    raise UnsupportedDtypeError(
        f"cannot communicate a {type(array).__module__}.{type(array).__qualname__}; pass a numpy array"
    )
