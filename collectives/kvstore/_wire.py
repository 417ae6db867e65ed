"""The store's messages: a fixed header, the key, a short text and the data, in one buffer."""

__all__ = [
    "REPLY_TAG",
    "REQUEST_TAG",
    "Fault",
    "Kind",
    "Message",
    "check_key",
    "decode",
    "encode",
    "key_bytes",
    "parse_key",
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

_HEADER = struct.Struct("<iiiiqqqii")
_DATA_ALIGN = 16  # the data starts on this boundary, so its views are aligned


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
    OK = 16
    DATA = 17
    ERROR = 18


class Fault(IntEnum):
    """Why a server refused a request (an ``ERROR`` reply's ``aux``); the reply's data lists the workers."""

    OTHER = 0
    LATE = 1  # waited in vain for the workers listed
    MISMATCH = 2  # a worker described a key differently from worker 0


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


def encode(
    kind: Kind,
    origin: int,
    *,
    part: int = 0,
    req: int = 0,
    stamp: int = 0,
    aux: int = 0,
    key: bytes = b"",
    text: str = "",
    data: Any = None,
) -> np.ndarray:
    """One message as a byte array, ``data`` (an array, or ``None``) copied in at the end."""
    raw_text = text.encode()
    head = _HEADER.size + len(key) + len(raw_text)
    start = -(-head // _DATA_ALIGN) * _DATA_ALIGN
    payload = None if data is None else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    buffer = np.empty(start + (0 if payload is None else payload.size), np.uint8)
    _HEADER.pack_into(buffer.data, 0, kind, origin, part, 0, req, stamp, aux, len(key), len(raw_text))
    buffer[_HEADER.size : _HEADER.size + len(key)] = np.frombuffer(key, np.uint8)
    buffer[_HEADER.size + len(key) : head] = np.frombuffer(raw_text, np.uint8)
    if payload is not None:
        buffer[start:] = payload
    return buffer


def decode(buffer: Any) -> Message:
    view = memoryview(buffer).cast("B")
    kind, origin, part, _, req, stamp, aux, key_len, text_len = _HEADER.unpack_from(view, 0)
    at = _HEADER.size
    key = bytes(view[at : at + key_len])
    text = bytes(view[at + key_len : at + key_len + text_len]).decode()
    start = -(-(at + key_len + text_len) // _DATA_ALIGN) * _DATA_ALIGN
    return Message(Kind(kind), origin, part, req, stamp, aux, key, text, view[start:])
