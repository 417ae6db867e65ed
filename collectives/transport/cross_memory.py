"""Reading another process's memory directly (cross-memory attach), where the kernel allows it.

Linux's ``process_vm_readv`` copies from a peer's private memory into this
process's in one kernel copy, the peer doing nothing. The kernel refuses it
between processes that may not trace each other (another user's; a container
without ``CAP_SYS_PTRACE`` under a strict Yama scope), so a caller tries it on
every peer before relying on it. ``python -m collectives info`` reports it, and
``bench floor`` reads the peers' buffers with it.
"""

__all__ = ["available", "read"]

import ctypes
import os
from collections.abc import Callable


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):  # not Linux, or a C library without it
        return None
    pointer = ctypes.POINTER(_Iovec)
    function.argtypes = [ctypes.c_int, pointer, ctypes.c_ulong, pointer, ctypes.c_ulong, ctypes.c_ulong]
    function.restype = ctypes.c_ssize_t
    return function


_READV = _bind()


def available() -> bool:
    """Whether this C library offers ``process_vm_readv`` (the kernel may still refuse it)."""
    return _READV is not None


def read(pid: int, remote: int, local: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to address ``local`` of this one.

    Raises:
        OSError: it is not available, the kernel refused, or the range is not mapped there.
    """
    if _READV is None:
        raise OSError(0, "process_vm_readv is not available here")
    done = 0
    while done < nbytes:  # the kernel may copy less than asked
        here = _Iovec(local + done, nbytes - done)
        there = _Iovec(remote + done, nbytes - done)
        got = _READV(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got <= 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"process_vm_readv from process {pid}: {os.strerror(errno)}")
        done += got
