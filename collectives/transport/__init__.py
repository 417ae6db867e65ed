"""Point-to-point transports the executor runs schedules over."""

__all__ = ["Transport"]

from .base import Transport
