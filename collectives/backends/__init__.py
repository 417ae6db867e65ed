"""Array backends, chosen by the type of the user's array (in :mod:`.choice`)."""

__all__ = ["ArrayBackend", "adopt", "backend_for", "looks_like_device_array", "trying_first"]

from .base import ArrayBackend
from .choice import adopt, backend_for, looks_like_device_array, trying_first
