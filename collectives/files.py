"""Files on disk: written whole or not at all, checksummed, in a format that loading cannot turn into code."""

__all__ = [
    "STATE_FORMAT",
    "Codec",
    "Outline",
    "atomic_write",
    "check_json",
    "count_of",
    "decode_state",
    "dump_json",
    "kind_of",
    "read_json",
    "read_outline",
    "read_state",
    "register_codec",
    "state_digest",
    "state_pieces",
    "sync_folder",
]

import io
import json
import os
import stat
import struct
import tempfile
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ml_dtypes  # numpy's bfloat16 and friends: a dependency of the library, and numpy's extension
import numpy as np

from .errors import CheckpointError

# A state file:
#   prefix   magic (8 bytes) | the header's length (u64, little-endian)
#   header   JSON, UTF-8: {"format", "owner", "size": data bytes, "buffers": [[offset, nbytes], ...], "tree"}
#            (owner: what the file belongs to, e.g. {"checkpoint", "rank", "version"}, or null)
#   padding  to a multiple of _ALIGN; the data starts there, and each buffer at a multiple of it
#   data     the arrays' and bytes' raw buffers at their offsets (relative to the data's start)
#   trailer  magic (4 bytes) | CRC-32 (u32) of every byte before the trailer
# The tree is JSON that names only values of an allow-list (see _encode); loading builds those
# values and nothing else: no pickle, no import by name, no call chosen by the file.
STATE_FORMAT = "collectives.state/2"
_MAGIC = b"CLSTATE\x00"
_PREFIX = struct.Struct("<8sQ")
_TAIL_MAGIC = b"CLS\x00"
_TAIL = struct.Struct("<4sI")
_ALIGN = 64  # every buffer starts at a multiple of this in the file, so arrays loaded from it are aligned
_MAX_HEADER = 1 << 30  # bytes of a header or a manifest
_MAX_DIMS = 64  # numpy's own limit: a header's shape is refused past it before any arithmetic on it
_MAX_ELEMENTS = (1 << 63) - 1  # the most an intp counts
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


_KINDS = (
    (stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"),
)  # fmt: skip


def kind_of(path: Path) -> str | None:
    """What ``path`` itself is, a link not followed (``"file"``: a regular one); ``None`` if nothing.

    Raises:
        OSError: ``path`` cannot be looked at (other than missing).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def _open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading if it is a regular file; a link is not followed, a FIFO not waited on.

    Raises:
        CheckpointError: it is missing, unreadable or not a regular file (naming it and what it is).
    """
    try:
        kind = kind_of(path) or "file"
        # no link followed, no wait for a FIFO's writer, should one have been swapped in since the look
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        file = os.fdopen(os.open(path, flags), "rb") if kind == "file" else None
    except OSError as error:
        raise _bad(str(path), f"cannot read it ({error.strerror or error})") from None
    if file is None or not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        if file is not None:
            file.close()
        raise _bad(str(path), f"a {kind}, not a regular file: refused")
    return file


class _Duplicate(ValueError):
    """A key twice in a JSON object: json keeps the last, and so would a checksum of the parsed value."""


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Duplicate(next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1))
    return out


def _parse_json(text: bytes, name: str, what: str) -> Any:
    """``text`` parsed as JSON, an object with a key twice refused (naming ``name`` and the key)."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _Duplicate as duplicate:
        raise _bad(name, f"{what} has key {_short(duplicate.args[0])} twice") from None
    except (ValueError, RecursionError) as error:
        raise _bad(name, f"{what} is not JSON ({_short(str(error))})") from None


def read_json(path: Path) -> Any:
    """The JSON in the regular file ``path`` (a manifest), parsed; ``None`` if there is no file there.

    Raises:
        CheckpointError: ``path`` is not a regular file (a link, a FIFO ...), is larger than
            a manifest can be, is not JSON, or has an object with a key twice (naming it).
    """
    if kind_of(path) is None:
        return None
    with _open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > _MAX_HEADER:
            raise _bad(str(path), f"{size} bytes, more than a manifest's {_MAX_HEADER}")
        text = file.read(_MAX_HEADER + 1)
    return _parse_json(text, str(path), "the file")


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: a header's values can be huge."""
    text = repr(value) if not isinstance(value, list) or len(value) <= 16 else f"[{len(value)} items]"
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


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
    what is wrong; a ``"shape"`` field is bounded first, as an array's). Both
    come from library code: a file only names the codec.
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
    if dtype.itemsize == 0:  # numpy cannot make an array of it from bytes
        return f"dtype {dtype} of no bytes"
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


def state_pieces(
    state: Any, where: str = "state", *, owner: dict[str, Any] | None = None
) -> list[memoryview]:
    """A state file's bytes in order (padding and checksum included): views of the arrays, not copies.

    ``owner`` (JSON values: a rank, a version, a checkpoint's id) goes in the
    header, for :func:`read_state` to compare with the file it expects.

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
        {"format": STATE_FORMAT, "owner": owner, "size": size, "buffers": offsets, "tree": tree},
        separators=(",", ":"),
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


def state_digest(parts: list[memoryview]) -> tuple[int, int]:
    """The length and CRC-32 of the file :func:`state_pieces` gave ``parts`` of, for a manifest to list."""
    return sum(part.nbytes for part in parts), _TAIL.unpack(parts[-1])[1]


def _bad(name: str, why: str) -> CheckpointError:
    return CheckpointError(f"{name}: {why}")


def _header(view: memoryview, total: int, name: str) -> tuple[dict[str, Any], int]:
    """The header of a state file of ``total`` bytes whose first bytes are ``view``; where the data starts.

    Every number is bounded by the file's length here, before any arithmetic on it.
    """
    if total < _PREFIX.size + _TAIL.size or view.nbytes < _PREFIX.size:
        raise _bad(name, f"not a state file ({total} bytes, too short for one)")
    magic, length = _PREFIX.unpack_from(view, 0)
    if magic != _MAGIC:
        raise _bad(name, f"not a state file (it starts {bytes(view[:8])!r})")
    if length > min(total, _MAX_HEADER) or view.nbytes < _PREFIX.size + length:
        raise _bad(name, f"a header of {length} bytes does not fit in the file's {total}")
    header = _parse_json(bytes(view[_PREFIX.size : _PREFIX.size + length]), name, "the header")
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise _bad(name, f"a header of format {_short(found)}, expected {STATE_FORMAT!r}")
    size, buffers = header.get("size"), header.get("buffers")
    if not _is_count(size) or not isinstance(buffers, list) or "tree" not in header or "owner" not in header:
        raise _bad(name, "the header lacks its owner, size, buffers or tree")
    start = _PREFIX.size + length
    start += _padding(start)
    if start + size + _TAIL.size != total:
        raise _bad(name, f"{total} bytes, the header describes {start + size + _TAIL.size} (cut short?)")
    end = 0
    for i, entry in enumerate(buffers):
        if not (isinstance(entry, list) and len(entry) == 2 and all(_is_count(n) for n in entry)):
            raise _bad(name, f"buffer {i} is {_short(entry)}, not [offset, length]")
        if entry[0] + entry[1] > size:
            raise _bad(name, f"buffer {i} ({entry[0]} + {entry[1]} bytes) runs past the data's {size}")
        if entry[0] < end:  # written in order, apart: an overlap is crafted
            raise _bad(name, f"buffer {i} at {entry[0]} overlaps buffer {i - 1}, which ends at {end}")
        end = entry[0] + entry[1]
    return header, start


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _check_owner(header: dict[str, Any], owner: dict[str, Any] | None, name: str) -> None:
    """Raise unless the header names ``owner`` (each field compared): a file misplaced is refused."""
    if owner is None:
        return
    found = header["owner"] if isinstance(header["owner"], dict) else {}
    for field, expected in owner.items():
        value = found.get(field)
        if type(value) is not type(expected) or value != expected:
            mine = ", ".join(f"{field} {value}" for field, value in owner.items())
            why = f"its header says {field} {_short(value)}, this file is of {mine}"
            raise _bad(name, f"a misplaced file: {why}")


def decode_state(
    data: "bytearray | memoryview",
    name: str,
    *,
    copy: bool = False,
    owner: dict[str, Any] | None = None,
    digest: tuple[int, int] | None = None,
) -> Any:
    """The state of a state file's bytes ``data`` (named ``name`` in errors); arrays view ``data``.

    With ``copy`` the arrays are new memory instead. The header must name
    ``owner`` (:func:`state_pieces`'), the file be of ``digest`` (:func:`state_digest`'s), if given.

    Raises:
        CheckpointError: ``data`` is not a whole, undamaged state file, or not of
            ``owner`` or ``digest``, naming ``name`` and what is wrong.
    """
    view = memoryview(data).cast("B")
    total = view.nbytes
    header, start = _header(view, total, name)
    _check_owner(header, owner, name)
    magic, crc = _TAIL.unpack_from(view, total - _TAIL.size)
    if magic != _TAIL_MAGIC:
        raise _bad(name, f"the trailer starts {magic!r}, not {_TAIL_MAGIC!r}: the file is damaged")
    actual = zlib.crc32(view[: total - _TAIL.size])
    if crc != actual:
        raise _bad(name, f"checksum mismatch (stored {crc:08x}, computed {actual:08x}): the file is damaged")
    if digest is not None and digest != (total, crc):
        listed = f"the manifest lists {digest[0]} bytes of {digest[1]:08x}: a file of another save"
        raise _bad(name, f"{total} bytes of CRC-32 {crc:08x}, {listed}")
    buffers = [view[start + offset : start + offset + n] for offset, n in header["buffers"]]
    return _Decoder(name, [n for _, n in header["buffers"]], buffers, copy).decode(header["tree"])


def read_state(
    path: Path,
    *,
    copy: bool = False,
    owner: dict[str, Any] | None = None,
    digest: tuple[int, int] | None = None,
) -> Any:
    """The state in the state file ``path``, checksum checked; its arrays view the bytes read.

    ``owner`` and ``digest`` as :func:`decode_state`'s. Only a regular file is read (no link followed).

    Raises:
        CheckpointError: the file is missing, unreadable, not a regular file, damaged,
            not a state file, or not of ``owner`` or ``digest`` (naming it).
    """
    with _open_regular(path) as file:
        try:
            data = bytearray(os.fstat(file.fileno()).st_size)
            read = file.readinto(data)
        except OSError as error:
            raise _bad(str(path), f"cannot read it ({error.strerror or error})") from None
    return decode_state(memoryview(data)[:read], str(path), copy=copy, owner=owner, digest=digest)


def read_outline(path: Path, *, owner: dict[str, Any] | None = None) -> Any:
    """The state in ``path`` with :class:`Outline`\\ s for its arrays: the header alone, no data read.

    The checksum is not checked (the data is not read): :func:`read_state` does.
    Every array's shape is checked against its buffer's length, as when read.

    Raises:
        CheckpointError: the file is missing, unreadable, not a regular file, its
            header is not a state file's, or not of ``owner``.
    """
    with _open_regular(path) as file:
        try:
            total = os.fstat(file.fileno()).st_size
            head = file.read(_PREFIX.size)
            length = _PREFIX.unpack(head)[1] if len(head) == _PREFIX.size else 0
            head += file.read(min(length, _MAX_HEADER))
        except OSError as error:
            raise _bad(str(path), f"cannot read it ({error.strerror or error})") from None
    header, _ = _header(memoryview(head), total, str(path))
    _check_owner(header, owner, str(path))
    return _Decoder(str(path), [n for _, n in header["buffers"]], None, False).decode(header["tree"])


class _Decoder:
    """The values of a header's tree; each buffer taken by one value at most, each shape bounded by it."""

    def __init__(
        self, name: str, lengths: Sequence[int], buffers: Sequence[memoryview] | None, copy: bool
    ) -> None:
        self.name, self.lengths, self.buffers, self.copy = name, lengths, buffers, copy
        self.taken: set[int] = set()

    def decode(self, tree: Any) -> Any:
        try:
            return self.node(tree)
        except CheckpointError:
            raise
        except RecursionError:
            raise _bad(self.name, "the header's tree is nested too deep") from None
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as error:
            # a field missing or of the wrong type where the checks below did not look
            why = _short(f"{type(error).__name__}: {error}", 200)
            raise _bad(self.name, f"a malformed value in the header ({why})") from None

    def take(self, node: dict[str, Any]) -> int:
        """The index of the buffer ``node`` names, which no other value may name."""
        index = node["b"]
        if not _is_count(index) or index >= len(self.lengths):
            raise _bad(self.name, f"a value names buffer {_short(index)}, the file has {len(self.lengths)}")
        if index in self.taken:
            raise _bad(self.name, f"two values name buffer {index}")
        self.taken.add(index)
        return int(index)

    def dtype(self, text: Any) -> np.dtype[Any]:
        if not isinstance(text, str):
            raise _bad(self.name, f"a dtype of {_short(text)}, not a string")
        if text in _ML_DTYPES:
            known: np.dtype[Any] = _ML_DTYPES[text]
            return known
        try:
            dtype = np.dtype(text)
        except TypeError:
            raise _bad(self.name, f"dtype {_short(text)} is not a numpy dtype") from None
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
            text = node["hex"]
            if not isinstance(text, str) or len(text) != 2 * dtype.itemsize:
                raise _bad(
                    self.name, f"a {dtype} scalar of {_short(text)}, not {dtype.itemsize} bytes in hex"
                )
            return np.frombuffer(bytes.fromhex(text), dtype)[0]
        if tag not in ("a", "b", "x"):
            raise _bad(self.name, f"a value of unknown tag {_short(tag)}")
        if tag == "a":
            return self.array(node)
        index = self.take(node)
        if self.buffers is None:  # an outline: the data is not read
            return None
        buffer = self.buffers[index]
        if tag == "x":
            codec = _CODECS.get(node["codec"])
            if codec is None:
                raise _bad(self.name, f"holds values of codec {_short(node['codec'])}, not registered here "
                                      "(torch tensors: import collectives.torch_integration)")  # fmt: skip
            if not isinstance(node["fields"], dict):
                raise _bad(self.name, f"codec {codec.name!r}'s fields are not an object")
            if "shape" in node["fields"]:  # bounded here, before the codec's arithmetic on it
                count_of(node["fields"]["shape"], self.name)
            try:
                return codec.decode(memoryview(bytearray(buffer)) if self.copy else buffer, node["fields"])
            except (TypeError, ValueError, RuntimeError) as error:
                raise _bad(self.name, f"a {codec.name} value: {_short(str(error), 200)}") from None
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
            if decoded in out:  # a saved mapping has each key once: a second would overwrite the first
                raise _bad(self.name, f"a mapping has key {_short(decoded)} twice")
            out[decoded] = self.node(value)
        if "m" in node and node["t"] == "o":
            out._metadata = self.node(node["m"])  # type: ignore[attr-defined]
        return out

    def array(self, node: dict[str, Any]) -> Any:
        dtype, shape = self.dtype(node["dtype"]), node["shape"]
        index = self.take(node)
        count = count_of(shape, self.name)
        nbytes = self.lengths[index]
        if count * dtype.itemsize != nbytes:
            raise _bad(self.name, f"an array of {dtype} {_short(tuple(shape))} in a buffer of {nbytes} bytes")
        if self.buffers is None:
            return Outline(dtype, tuple(shape))
        buffer = self.buffers[index]
        data = bytearray(buffer) if self.copy else buffer
        return np.frombuffer(data, dtype, count).reshape(shape)


def count_of(shape: Any, name: str) -> int:
    """The number of elements of an array of ``shape`` (a field of the file ``name``), bounded first.

    At most 64 dimensions are looked at, and the product stops once past what
    an intp counts: a crafted shape costs no time.

    Raises:
        CheckpointError: ``shape`` is not a list of at most 64 counts, or counts more than an intp can.
    """
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS:
        dims = f"{len(shape)} dimensions" if isinstance(shape, list) else type(shape).__name__
        raise _bad(name, f"an array's shape of {dims}, at most {_MAX_DIMS} allowed")
    count = 1
    for n in shape:
        if not _is_count(n):
            raise _bad(name, f"an array's shape {_short(shape)}: {_short(n)} is not a count")
        if n:  # a dimension of 0 makes the array empty, yet numpy bounds the others' product too
            count *= n
        if count > _MAX_ELEMENTS:
            raise _bad(name, f"an array's shape {_short(shape)} counts more than {_MAX_ELEMENTS} elements")
    return 0 if 0 in shape else count
