"""A state as one run of bytes: pickled, with its arrays' memory out of band, so it is copied once.

For the in-memory checkpoints, whose bytes only this job's ranks make and read.
:func:`loads` unpickles, which runs code the bytes choose: never give it bytes
from a file or from outside the job (directory checkpoints read old-format files
with it only when the caller passes ``trusted=True``).
"""

__all__ = ["dumps", "loads", "pieces", "write_pieces"]

import pickle
import struct
from collections.abc import Callable
from typing import IO, Any

import numpy as np

_MAGIC = b"collect1"
_HEAD = struct.Struct("<8sq")  # the magic, the number of out-of-band buffers
_ALIGN = 64  # every buffer starts at a multiple of this in the run, so arrays loaded from it are aligned


def _padding(offset: int) -> int:
    return -offset % _ALIGN


def pieces(state: Any) -> list[memoryview]:
    """The pieces of ``state``'s bytes, in order (padding included): views of its arrays, not copies.

    Pickled with protocol 5: numpy arrays (and other objects that offer it) give
    their memory as out-of-band buffers, so they are copied once, where the pieces
    are joined or written, rather than into the pickle and again out of it.
    """
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    lengths = struct.pack(f"<{len(raws) + 1}q", len(head), *(raw.nbytes for raw in raws))
    parts = [memoryview(_HEAD.pack(_MAGIC, len(raws)) + lengths), memoryview(head)]
    offset = sum(p.nbytes for p in parts)
    for raw in raws:
        gap = _padding(offset)
        if gap:
            parts.append(memoryview(bytes(gap)))
        parts.append(raw)
        offset += gap + raw.nbytes
    return parts


def dumps(state: Any, into: "np.ndarray | None" = None) -> "np.ndarray":
    """``state`` as one run of bytes (one copy of its arrays): uint8, the start of ``into`` if it fits.

    Reusing ``into`` (say, the buffer of the checkpoint before last) spares the
    new memory's page faults, which cost more than the copy for a large state.
    """
    parts = pieces(state)
    total = sum(p.nbytes for p in parts)
    out = into[:total] if into is not None and into.nbytes >= total else np.empty(total, np.uint8)
    view, offset = out.data, 0
    for part in parts:
        view[offset : offset + part.nbytes] = part
        offset += part.nbytes
    return out


def write_pieces(file: IO[bytes], parts: list[memoryview], halfway: Callable[[], None] | None = None) -> None:
    """Write ``parts`` to ``file``; call ``halfway`` once half the bytes are written and flushed."""
    half = sum(p.nbytes for p in parts) // 2
    written = 0
    for part in parts:
        if halfway is not None and written + part.nbytes > half:
            file.write(part[: half - written])
            file.flush()
            halfway()
            halfway = None
            part = part[half - written :]
        file.write(part)
        written += part.nbytes


def loads(data: "bytes | bytearray | memoryview | np.ndarray", *, copy: bool = True) -> Any:
    """The state :func:`dumps` made ``data`` of; its arrays are new memory unless ``copy`` is off.

    Unpickles: runs code of ``data``'s choosing; only for bytes this job made.
    With ``copy`` off the arrays are views of ``data`` (writable where ``data`` is).

    Raises:
        ValueError: ``data`` is not of :func:`dumps`.
    """
    view = (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
    if view.nbytes < _HEAD.size or bytes(view[:8]) != _MAGIC:
        raise ValueError("not a checkpoint's bytes (no header)")
    _, count = _HEAD.unpack_from(view, 0)
    lengths = struct.unpack_from(f"<{count + 1}q", view, _HEAD.size)
    offset = _HEAD.size + 8 * (count + 1)
    head = view[offset : offset + lengths[0]]
    offset += lengths[0]
    buffers: list[Any] = []
    for length in lengths[1:]:
        offset += _padding(offset)
        if offset + length > view.nbytes:
            raise ValueError("a checkpoint's bytes cut short")
        buffer = view[offset : offset + length]
        buffers.append(bytearray(buffer) if copy else buffer)
        offset += length
    return pickle.loads(head, buffers=buffers)
