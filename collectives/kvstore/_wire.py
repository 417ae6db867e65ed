"""The store's messages: a fixed header, the key, a short text and the data, in one buffer."""

__all__ = [
    "BUNDLE_BYTES",
    "QUIET",
    "REPLY_TAG",
    "REQUEST_TAG",
    "STORE_FIELD",
    "Kind",
    "Message",
    "Refusal",
    "bundle",
    "check_key",
    "compose",
    "decode",
    "key_bytes",
    "parse_key",
    "unbundle",
]

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from ..errors import KVStoreError
from ..transport.tags import Tag

REQUEST_TAG = Tag.KV_REQUEST
REPLY_TAG = Tag.KV_REPLY

_HEADER = struct.Struct("<iiiiqqqiii")
STORE_FIELD = (struct.Struct("<i"), _HEADER.size - 4)
"""Where the store's number is in a message (its header's last field): the channel writes it on sending."""
_LENGTH = struct.Struct("<q8x")  # a bundled message's length, padded to keep the message aligned
_DATA_ALIGN = 16  # the data starts on this boundary, so its views are aligned

QUIET = 1
"""A request's flag: answer it only to refuse it (a push or clock whose OK a later reply implies)."""


class Kind(IntEnum):
    """What a message asks or answers."""

    INIT = 1
    PUSH = 2
    PULL = 3
    CLOCK = 4
    BARRIER = 5
    CLOSE = 6
    OPTIMIZER = 7
    SAVE = 8
    LOAD = 9
    CONFIRM = 10  # answered at once: its OK confirms the quiet requests sent to that server before it
    BATCH = 11  # several messages to one rank as one (see bundle): requests or replies
    BREAK = 12  # a worker's call was interrupted: the server refuses everything but a close from now on
    OK = 16
    DATA = 17
    ERROR = 18


class Refusal(IntEnum):
    """Why a server refused a request (an ``ERROR`` reply's ``aux``); the reply's data lists the workers."""

    OTHER = 0
    LATE = 1  # waited in vain for the workers listed
    MISMATCH = 2  # a worker described a key differently from worker 0
    BROKEN = 3  # the store is broken (a worker's call was interrupted); the text says whose and why


@dataclass
class Message:
    """A decoded message; ``data`` is a view of the buffer it came in."""

    kind: Kind
    origin: int  # the rank that sent it
    part: int  # the partition's index within its key
    req: int  # the worker's request number, echoed in the reply
    stamp: int  # a round or clock, by kind and mode
    aux: int
    key: bytes
    text: str
    data: memoryview
    flags: int = 0  # QUIET or 0
    store: int = 0  # the store's number (see Channel.store): a message of another store is not taken


def check_key(key: object) -> None:
    """Refuse what is not a key: an int (not a bool, which would alias 0 and 1) or a non-empty str.

    Raises:
        KVStoreError: naming the key and its type.
    """
    if isinstance(key, bool) or not isinstance(key, int | str) or key == "":
        raise KVStoreError(f"a key is an int or a non-empty str, got {type(key).__name__} {key!r}")


def key_bytes(key: object) -> bytes:
    """The key as it travels; keys are ints or strs."""
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise TypeError(f"a key is an int or a str, got {type(key).__name__} {key!r}")
    return (f"i{key}" if isinstance(key, int) else f"s{key}").encode()


def parse_key(raw: bytes) -> int | str:
    text = raw.decode()
    return int(text[1:]) if text[0] == "i" else text[1:]


def compose(
    kind: Kind,
    origin: int,
    *,
    in_process: bool = False,
    part: int = 0,
    req: int = 0,
    stamp: int = 0,
    aux: int = 0,
    key: bytes = b"",
    text: str = "",
    data: Any = None,
    flags: int = 0,
) -> bytearray | Message:
    """One message, as bytes: ``data`` (an array, or ``None``) copied in at the end.

    A bytearray and ``struct`` rather than numpy slices: a small message is
    encoded in about a third of the time, and every request and reply is one.

    ``in_process``: a message that stays in this process (a colocated rank's worker
    and server hand each other messages without bytes), as the :class:`Message` its
    bytes would :func:`decode` to: ``data`` is copied (its owner may change it once
    the call returns), nothing else.
    """
    if in_process:
        copied = (
            _NO_DATA
            if data is None
            else memoryview(bytearray(np.ascontiguousarray(data).reshape(-1).view(np.uint8)))
        )
        return Message(kind, origin, part, req, stamp, aux, key, text, copied, flags)
    raw_text = text.encode() if text else b""
    head = _HEADER.size + len(key) + len(raw_text)
    start = -(-head // _DATA_ALIGN) * _DATA_ALIGN
    payload = None if data is None else np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    buffer = bytearray(start + (0 if payload is None else payload.nbytes))
    _HEADER.pack_into(buffer, 0, kind, origin, part, flags, req, stamp, aux, len(key), len(raw_text), 0)
    buffer[_HEADER.size : head] = key + raw_text
    if payload is not None:
        buffer[start:] = payload
    return buffer


_NO_DATA = memoryview(b"")
_KINDS = {kind.value: kind for kind in Kind}  # a dict lookup: Kind(value) costs a microsecond


def decode(buffer: Any) -> Message:
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    kind, origin, part, flags, req, stamp, aux, key_len, text_len, store = _HEADER.unpack_from(view, 0)
    at = _HEADER.size
    key = bytes(view[at : at + key_len])
    text = str(view[at + key_len : at + key_len + text_len], "utf-8") if text_len else ""
    start = -(-(at + key_len + text_len) // _DATA_ALIGN) * _DATA_ALIGN
    return Message(_KINDS[kind], origin, part, req, stamp, aux, key, text, view[start:], flags, store)


BUNDLE_BYTES = 1 << 16
"""Messages up to this size to one rank travel bundled; a larger one goes alone (a copy would cost more)."""


def bundle(origin: int, messages: list[bytearray]) -> bytearray:
    """``messages`` (to one rank, in order) as one ``BATCH`` message; :func:`unbundle` gives them back."""
    head = compose(Kind.BATCH, origin, aux=len(messages))
    assert isinstance(head, bytearray)  # bytes: not in_process
    parts: list[bytes | bytearray] = [head]
    for bundled in messages:
        parts.append(_LENGTH.pack(len(bundled)))
        parts.append(bundled)
        parts.append(bytes(-len(bundled) % _DATA_ALIGN))
    return bytearray(b"".join(parts))


def unbundle(batch: Message) -> list[Message]:
    """The messages a ``BATCH`` message holds, in the order bundled (views of its buffer)."""
    view, at, found = batch.data, 0, []
    for _ in range(batch.aux):
        (length,) = _LENGTH.unpack_from(view, at)
        at += _LENGTH.size
        found.append(decode(view[at : at + length]))
        at += length + (-length % _DATA_ALIGN)
    return found
