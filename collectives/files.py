"""Files on disk: written whole or not at all, checksummed, in a format that loading cannot turn into code."""

__all__ = [
    "STATE_FORMAT",
    "Codec",
    "Outline",
    "atomic_write",
    "check_json",
    "decode_state",
    "dump_json",
    "read_outline",
    "read_state",
    "register_codec",
    "state_pieces",
    "sync_folder",
]

import json
import math
import os
import struct
import tempfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ml_dtypes  # numpy's bfloat16 and friends: a dependency of the library, and numpy's extension
import numpy as np

from .errors import CheckpointError

# A state file:
#   prefix   magic (8 bytes) | the header's length (u64, little-endian)
#   header   JSON, UTF-8: {"format", "size": data bytes, "buffers": [[offset, nbytes], ...], "tree"}
#   padding  to a multiple of _ALIGN; the data starts there, and each buffer at a multiple of it
#   data     the arrays' and bytes' raw buffers at their offsets (relative to the data's start)
#   trailer  magic (4 bytes) | CRC-32 (u32) of every byte before the trailer
# The tree is JSON that names only values of an allow-list (see _encode); loading builds those
# values and nothing else: no pickle, no import by name, no call chosen by the file.
STATE_FORMAT = "collectives.state/1"
_MAGIC = b"CLSTATE\x00"
_PREFIX = struct.Struct("<8sQ")
_TAIL_MAGIC = b"CLS\x00"
_TAIL = struct.Struct("<4sI")
_ALIGN = 64  # every buffer starts at a multiple of this in the file, so arrays loaded from it are aligned
_MAX_HEADER = 1 << 30
_ALLOWED = (
    "None, bool, int, float, str, bytes, list, tuple, dict, OrderedDict, numpy arrays and scalars "
    "(not of object dtype) and the types of registered codecs (torch tensors, once "
    "collectives.torch_integration is imported)"
)
_ML_DTYPES = {
    name: np.dtype(getattr(ml_dtypes, name))
    for name in ("bfloat16", "float8_e4m3fn", "float8_e4m3b11fnuz", "float8_e4m3fnuz", "float8_e5m2",
                 "float8_e5m2fnuz", "int4", "uint4")
    if hasattr(ml_dtypes, name)
}  # fmt: skip


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """``write(file)`` into a temporary file beside ``path``, made durable, then renamed over ``path``."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform can open a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _json_crc(value: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


def dump_json(value: dict[str, Any]) -> bytes:
    """``value`` as JSON text with a ``"crc32"`` of the rest (canonical JSON), for :func:`check_json`."""
    return json.dumps({**value, "crc32": _json_crc(value)}, indent=1, sort_keys=True).encode()


def check_json(value: Any, name: str) -> dict[str, Any]:
    """``value`` (a JSON object :func:`dump_json` wrote, parsed) without its ``"crc32"``, checked.

    Raises:
        CheckpointError: not an object, no checksum, or one that does not match (naming ``name``).
    """
    if not isinstance(value, dict) or type(value.get("crc32")) is not int:
        raise _bad(name, "not a JSON object with its crc32")
    rest = {k: v for k, v in value.items() if k != "crc32"}
    if _json_crc(rest) != value["crc32"]:
        raise _bad(name, f"checksum mismatch (stored {value['crc32']:08x}): the file is damaged")
    return rest


@dataclass(frozen=True)
class Codec:
    """How values of ``kind`` become raw bytes and JSON fields, and back (torch tensors, say).

    ``encode(value)`` gives the value's bytes (a C-contiguous uint8 array) and a
    dict of JSON fields; ``decode(buffer, fields)`` makes the value again from a
    view of those bytes, checking the fields (a ValueError or TypeError names
    what is wrong). Both come from library code: a file only names the codec.
    """

    name: str
    kind: type
    encode: Callable[[Any], tuple[np.ndarray, dict[str, Any]]]
    decode: Callable[[memoryview, dict[str, Any]], Any]


_CODECS: dict[str, Codec] = {}


def register_codec(codec: Codec) -> None:
    """Allow ``codec.kind`` in state files (values of exactly that type), coded by ``codec``.

    A registry rather than an import here: this module stays below torch, and
    torch_integration, which knows tensors, registers them when imported.
    """
    _CODECS[codec.name] = codec


@dataclass(frozen=True)
class Outline:
    """An array of a state file as its header describes it, its bytes unread."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]


def _dtype_text(dtype: np.dtype[Any]) -> str:
    return dtype.name if dtype.name in _ML_DTYPES and dtype == _ML_DTYPES[dtype.name] else dtype.str


def _check_dtype(dtype: np.dtype[Any]) -> str | None:
    """Why ``dtype`` cannot be in a state file; ``None`` if it can."""
    if dtype.hasobject:
        return f"dtype {dtype} holds Python objects"
    if dtype.fields is not None or dtype.subdtype is not None:
        return f"structured dtype {dtype}"
    return None


def _padding(offset: int) -> int:
    return -offset % _ALIGN


class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.active: set[int] = set()  # containers being encoded: a cycle would never end

    def buffer(self, raw: memoryview) -> int:
        self.buffers.append(raw)
        return len(self.buffers) - 1

    def refuse(self, where: str, why: str) -> CheckpointError:
        return CheckpointError(f"cannot save {where}: {why}; a state holds only {_ALLOWED}")

    def node(self, value: Any, where: str) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return {"t": "f", "v": value.hex()}
        if kind is bytes:
            return {"t": "b", "b": self.buffer(memoryview(value))}
        if isinstance(value, np.generic) and kind is not np.object_:
            why = _check_dtype(value.dtype)
            if why is not None:
                raise self.refuse(where, why)
            return {"t": "g", "dtype": _dtype_text(value.dtype), "hex": value.tobytes().hex()}
        if kind is np.ndarray:
            why = _check_dtype(value.dtype)
            if why is not None:
                raise self.refuse(where, why)
            array = value if value.flags.c_contiguous else value.copy(order="C")  # 0-d stays 0-d
            raw = array.reshape(-1).view(np.uint8).data if array.size else memoryview(b"")
            return {"t": "a", "dtype": _dtype_text(array.dtype), "shape": list(array.shape),
                    "b": self.buffer(raw)}  # fmt: skip
        if kind in (list, tuple, dict, OrderedDict):
            if id(value) in self.active:
                raise self.refuse(where, "it contains itself")
            self.active.add(id(value))
            try:
                return self.container(value, where)
            finally:
                self.active.discard(id(value))
        for codec in _CODECS.values():
            if kind is codec.kind:
                try:
                    raw, fields = codec.encode(value)
                except (TypeError, ValueError, RuntimeError) as error:
                    raise self.refuse(where, f"a {codec.name} value that cannot be saved ({error})") from None
                return {"t": "x", "codec": codec.name, "fields": fields, "b": self.buffer(raw.data)}
        raise self.refuse(where, f"type {kind.__module__}.{kind.__qualname__}")

    def container(self, value: Any, where: str) -> Any:
        if isinstance(value, list | tuple):
            items = [self.node(item, f"{where}[{i}]") for i, item in enumerate(value)]
            return {"t": "l" if type(value) is list else "u", "v": items}
        keys, values = [], []
        for key, item in value.items():
            inner = f"{where}[{key!r}]"
            if isinstance(key, list | dict | np.ndarray):
                raise self.refuse(inner, f"a key of type {type(key).__name__}")
            keys.append(self.node(key, f"{where}: key {key!r}"))
            values.append(self.node(item, inner))
        out = {"t": "d" if type(value) is dict else "o", "k": keys, "v": values}
        metadata = getattr(value, "_metadata", None)  # torch's state_dict: load_state_dict reads it
        if type(value) is OrderedDict and metadata is not None:
            out["m"] = self.node(metadata, f"{where}._metadata")
        return out


def state_pieces(state: Any, where: str = "state") -> list[memoryview]:
    """A state file's bytes in order (padding and checksum included): views of the arrays, not copies.

    Raises:
        CheckpointError: ``state`` holds a value outside the allow-list (naming where, as ``where[...]``).
    """
    encoder = _Encoder()
    tree = encoder.node(state, where)
    offsets, size = [], 0
    for raw in encoder.buffers:
        size += _padding(size)
        offsets.append([size, raw.nbytes])
        size += raw.nbytes
    header = json.dumps(
        {"format": STATE_FORMAT, "size": size, "buffers": offsets, "tree": tree}, separators=(",", ":")
    ).encode()
    start = _PREFIX.size + len(header)
    parts = [memoryview(_PREFIX.pack(_MAGIC, len(header)) + header + bytes(_padding(start)))]
    written = 0
    for (offset, _), raw in zip(offsets, encoder.buffers, strict=True):
        if offset > written:
            parts.append(memoryview(bytes(offset - written)))
        parts.append(raw.cast("B") if raw.nbytes else raw)
        written = offset + raw.nbytes
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    parts.append(memoryview(_TAIL.pack(_TAIL_MAGIC, crc)))
    return parts


def _bad(name: str, why: str) -> CheckpointError:
    return CheckpointError(f"{name}: {why}")


def _header(view: memoryview, total: int, name: str) -> tuple[dict[str, Any], int]:
    """The header of a state file of ``total`` bytes whose first bytes are ``view``; where the data starts."""
    if total < _PREFIX.size + _TAIL.size or view.nbytes < _PREFIX.size:
        raise _bad(name, f"not a state file ({total} bytes, too short for one)")
    magic, length = _PREFIX.unpack_from(view, 0)
    if magic != _MAGIC:
        raise _bad(name, f"not a state file (it starts {bytes(view[:8])!r})")
    if length > min(total, _MAX_HEADER) or view.nbytes < _PREFIX.size + length:
        raise _bad(name, f"a header of {length} bytes does not fit in the file's {total}")
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + length]))
    except (ValueError, RecursionError) as error:
        raise _bad(name, f"the header is not JSON ({error})") from None
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise _bad(name, f"a header of format {found!r}, expected {STATE_FORMAT!r}")
    size, buffers = header.get("size"), header.get("buffers")
    if not _is_count(size) or not isinstance(buffers, list) or "tree" not in header:
        raise _bad(name, "the header lacks its size, buffers or tree")
    start = _PREFIX.size + length
    start += _padding(start)
    if start + size + _TAIL.size != total:
        raise _bad(name, f"{total} bytes, the header describes {start + size + _TAIL.size} (cut short?)")
    for i, entry in enumerate(buffers):
        if not (isinstance(entry, list) and len(entry) == 2 and all(_is_count(n) for n in entry)):
            raise _bad(name, f"buffer {i} is {entry!r}, not [offset, length]")
        if entry[0] + entry[1] > size:
            raise _bad(name, f"buffer {i} ({entry[0]} + {entry[1]} bytes) runs past the data's {size}")
    return header, start


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def decode_state(data: "bytearray | memoryview", name: str, *, copy: bool = False) -> Any:
    """The state of a state file's bytes ``data`` (named ``name`` in errors); arrays view ``data``.

    With ``copy`` the arrays are new memory instead.

    Raises:
        CheckpointError: ``data`` is not a whole, undamaged state file, naming ``name`` and what is wrong.
    """
    view = memoryview(data).cast("B")
    total = view.nbytes
    header, start = _header(view, total, name)
    magic, crc = _TAIL.unpack_from(view, total - _TAIL.size)
    actual = zlib.crc32(view[: total - _TAIL.size])
    if magic != _TAIL_MAGIC or crc != actual:
        raise _bad(name, f"checksum mismatch (stored {crc:08x}, computed {actual:08x}): the file is damaged")
    buffers = [view[start + offset : start + offset + n] for offset, n in header["buffers"]]
    return _Decoder(name, buffers, copy).decode(header["tree"])


def read_state(path: Path, *, copy: bool = False) -> Any:
    """The state in the state file ``path``, checksum checked; its arrays view the bytes read.

    Raises:
        CheckpointError: the file is missing, unreadable, damaged or not a state file (naming it).
    """
    try:
        with open(path, "rb") as file:
            data = bytearray(os.fstat(file.fileno()).st_size)
            read = file.readinto(data)
    except OSError as error:
        raise _bad(str(path), f"cannot read it ({error.strerror or error})") from None
    return decode_state(memoryview(data)[:read], str(path), copy=copy)


def read_outline(path: Path) -> Any:
    """The state in ``path`` with :class:`Outline`\\ s for its arrays: the header alone, no data read.

    The checksum is not checked (the data is not read): :func:`read_state` does.

    Raises:
        CheckpointError: the file is missing, unreadable or its header is not a state file's.
    """
    try:
        with open(path, "rb") as file:
            total = os.fstat(file.fileno()).st_size
            head = file.read(_PREFIX.size)
            length = _PREFIX.unpack(head)[1] if len(head) == _PREFIX.size else 0
            head += file.read(min(length, _MAX_HEADER))
    except OSError as error:
        raise _bad(str(path), f"cannot read it ({error.strerror or error})") from None
    header, _ = _header(memoryview(head), total, str(path))
    return _Decoder(str(path), [None] * len(header["buffers"]), False).decode(header["tree"])


class _Decoder:
    def __init__(self, name: str, buffers: Sequence[memoryview | None], copy: bool) -> None:
        self.name, self.buffers, self.copy = name, buffers, copy

    def decode(self, tree: Any) -> Any:
        try:
            return self.node(tree)
        except CheckpointError:
            raise
        except RecursionError:
            raise _bad(self.name, "the header's tree is nested too deep") from None
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as error:
            # a field missing or of the wrong type where the checks below did not look
            why = f"{type(error).__name__}: {error}"
            raise _bad(self.name, f"a malformed value in the header ({why})") from None

    def buffer(self, node: dict[str, Any]) -> memoryview | None:
        index = node["b"]
        if not _is_count(index) or index >= len(self.buffers):
            raise _bad(self.name, f"a value names buffer {index!r}, the file has {len(self.buffers)}")
        buffer: memoryview | None = self.buffers[index]
        return buffer

    def dtype(self, text: Any) -> np.dtype[Any]:
        if not isinstance(text, str):
            raise _bad(self.name, f"a dtype of {text!r}, not a string")
        if text in _ML_DTYPES:
            known: np.dtype[Any] = _ML_DTYPES[text]
            return known
        try:
            dtype = np.dtype(text)
        except TypeError:
            raise _bad(self.name, f"dtype {text!r} is not a numpy dtype") from None
        why = _check_dtype(dtype)
        if why is not None:
            raise _bad(self.name, f"{why}: not allowed")
        return dtype

    def node(self, node: Any) -> Any:
        if node is None or type(node) in (bool, int, str):
            return node
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise _bad(self.name, f"a value of the header is {type(node).__name__}, not a tagged value")
        tag = node["t"]
        if tag == "f":
            return float.fromhex(node["v"])
        if tag in ("l", "u"):
            items = [self.node(item) for item in node["v"]]
            return items if tag == "l" else tuple(items)
        if tag in ("d", "o"):
            return self.mapping(node)
        if tag == "g":
            dtype = self.dtype(node["dtype"])
            raw = bytes.fromhex(node["hex"])
            if len(raw) != dtype.itemsize:
                raise _bad(self.name, f"a {dtype} scalar of {len(raw)} bytes")
            return np.frombuffer(raw, dtype)[0]
        if tag not in ("a", "b", "x"):
            raise _bad(self.name, f"a value of unknown tag {tag!r}")
        buffer = self.buffer(node)
        if tag == "a":
            return self.array(node, buffer)
        if buffer is None:  # an outline: the data is not read
            return None
        if tag == "x":
            codec = _CODECS.get(node["codec"])
            if codec is None:
                raise _bad(self.name, f"holds values of codec {node['codec']!r}, not registered here "
                                      "(torch tensors: import collectives.torch_integration)")  # fmt: skip
            if not isinstance(node["fields"], dict):
                raise _bad(self.name, f"codec {codec.name!r}'s fields are not an object")
            try:
                return codec.decode(memoryview(bytearray(buffer)) if self.copy else buffer, node["fields"])
            except (TypeError, ValueError, RuntimeError) as error:
                raise _bad(self.name, f"a {codec.name} value: {error}") from None
        return bytes(buffer)

    def mapping(self, node: dict[str, Any]) -> Any:
        keys, values = node["k"], node["v"]
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise _bad(self.name, "a mapping whose keys and values do not pair up")
        out: dict[Any, Any] = {} if node["t"] == "d" else OrderedDict()
        for key, value in zip(keys, values, strict=True):
            decoded = self.node(key)
            try:
                hash(decoded)
            except TypeError:
                raise _bad(self.name, f"a mapping key of type {type(decoded).__name__}") from None
            out[decoded] = self.node(value)
        if "m" in node and node["t"] == "o":
            out._metadata = self.node(node["m"])  # type: ignore[attr-defined]
        return out

    def array(self, node: dict[str, Any], buffer: memoryview | None) -> Any:
        dtype, shape = self.dtype(node["dtype"]), node["shape"]
        if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
            raise _bad(self.name, f"an array of shape {shape!r}")
        count = math.prod(shape)
        if buffer is None:
            return Outline(dtype, tuple(shape))
        if count * dtype.itemsize != buffer.nbytes:
            raise _bad(self.name, f"an array of {dtype} {tuple(shape)} in a buffer of {buffer.nbytes} bytes")
        data = bytearray(buffer) if self.copy else buffer
        return np.frombuffer(data, dtype, count).reshape(shape)
