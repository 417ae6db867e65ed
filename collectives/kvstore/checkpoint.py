"""Checkpoints of the store: a shard file per server, then a manifest, so a partial one is recognised.

A shard ``shard-<i>.state`` is a state file (:mod:`collectives.files`: JSON of
allowed values, the arrays' raw bytes, a checksum; loading runs no code), whose
header names its index: the checkpoint's id and, per partition the server held,
its key, index, shape text, round, value and optimizer state. ``manifest.json``
names the keys (shape, dtype, round, partition bounds), the servers, mode, clock
and optimizer. Before any value is used, the manifest is checked against the
shards: every listed partition found exactly once, of the manifest's dtype and
size, no other; each shape bounded before any arithmetic on it, so a crafted
one is refused at once. Only regular files are read (no link followed, no FIFO
waited on). Shards of format 1 (``shard-<i>.npz``, which ``np.load`` opens
without pickle) still load, checked alike, without a checksum.
"""

__all__ = [
    "FORMAT",
    "read_manifest",
    "restore_shards",
    "write_manifest",
    "write_shard",
]

import json
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, KVStoreError
from ..files import (
    Outline,
    atomic_write,
    check_json,
    count_of,
    dump_json,
    kind_of,
    read_json,
    read_outline,
    read_state,
    state_pieces,
)
from ._wire import parse_key
from .updaters import Optimizer, optimizer_from_spec

FORMAT = "collectives.kvstore/2"
_LEGACY = "collectives.kvstore/1"  # shards as .npz: no code runs to load them, but no checksum either
_MANIFEST = "manifest.json"
_FIELDS = {"id": str, "servers": int, "workers": int, "mode": str, "clock": int, "keys": list}


def _shard_name(index: int, legacy: bool = False) -> str:
    return f"shard-{index}.{'npz' if legacy else 'state'}"


def write_shard(
    held: Mapping[tuple[bytes, int], Any],
    optimizer: Optimizer | None,
    directory: Path,
    index: int,
    checkpoint: str,
) -> None:
    """Write the partitions a server ``held`` (value, shape, round) and optimizer state as shard ``index``."""
    parts = []
    for (raw, part_index), part in sorted(held.items()):
        saved = {} if optimizer is None else optimizer.partition_state(parse_key(raw), part_index)
        parts.append({"key": raw.decode(), "part": part_index, "shape": part.shape, "round": part.round,
                      "value": part.value, "state": dict(saved)})  # fmt: skip
    pieces = state_pieces({"id": checkpoint, "parts": parts}, f"shard {index}", owner={"shard": index})
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / _shard_name(index), lambda file: [file.write(p) for p in pieces])


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last: a checkpoint is whole once it names shards that carry its id."""
    text = dump_json({"format": FORMAT, **manifest})
    atomic_write(directory / _MANIFEST, lambda file: file.write(text))


def _brief(value: Any) -> str:
    """``repr(value)`` cut short: a crafted file's values can be megabytes."""
    text = f"[{len(value)} items]" if isinstance(value, list) and len(value) > 16 else repr(value)
    return text if len(text) <= 60 else f"{text[:55]}...{text[-2:]}"


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _check_manifest(path: Path, manifest: Any) -> dict[str, Any]:
    """``manifest`` if every field is there and of its type, its keys' layouts whole; else KVStoreError."""

    def bad(why: str) -> KVStoreError:
        return KVStoreError(f"{str(path)!r} is not a valid manifest: {why}")

    if not isinstance(manifest, dict):
        raise bad(f"a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") == FORMAT:
        try:
            manifest = check_json(manifest, str(path))
        except CheckpointError as error:
            raise KVStoreError(str(error)) from None
    elif manifest.get("format") != _LEGACY:
        raise KVStoreError(
            f"{str(path)!r} is of format {_brief(manifest.get('format'))}, expected {FORMAT!r}"
        )
    for name, kind in _FIELDS.items():
        if type(manifest.get(name)) is not kind:
            raise bad(f"field {name!r} is {_brief(manifest.get(name))}, not a {kind.__name__}")
    if manifest["servers"] < 1 or manifest["workers"] < 1 or manifest["clock"] < 0:
        raise bad(f"{manifest['servers']} servers, {manifest['workers']} workers, clock {manifest['clock']}")
    if manifest.get("optimizer") is not None:
        try:  # made by Optimizer.spec; checked here, before a server takes it
            optimizer_from_spec(manifest["optimizer"])
        except Exception as error:
            raise bad(
                f"field 'optimizer' is {_brief(manifest['optimizer'])} ({type(error).__name__}: {error})"
            ) from None
    elif "optimizer" not in manifest:
        raise bad("field 'optimizer' is missing")
    seen = set()
    for entry in manifest["keys"]:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("key"), str)
            or entry["key"][:1] not in "is"
        ):
            raise bad(f"a key entry {_brief(entry)}")
        key, shape, bounds = entry["key"], entry.get("shape"), entry.get("bounds")
        if key in seen:
            raise bad(f"key {_brief(key)} is listed twice")
        seen.add(key)
        try:  # bounded before any arithmetic: a crafted shape is refused at once
            count = count_of(shape, f"key {_brief(key)}")
        except CheckpointError as error:
            raise bad(str(error)) from None
        if not _count(entry.get("round")):
            raise bad(f"key {_brief(key)}: round {_brief(entry.get('round'))}")
        try:
            parse_key(key.encode())
            dtype = np.dtype(entry.get("dtype"))
        except (TypeError, ValueError):
            raise bad(f"key {_brief(key)}: key text or dtype {_brief(entry.get('dtype'))}") from None
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or not dtype.itemsize:
            raise bad(f"key {_brief(key)}: dtype {dtype} is not allowed")
        if (
            not isinstance(bounds, list) or not bounds or bounds[0] != 0
            or not all(_count(b) for b in bounds)
            or any(a > b for a, b in zip(bounds, [*bounds[1:], count], strict=True))
        ):  # fmt: skip
            raise bad(
                f"key {_brief(key)}: partition bounds {_brief(bounds)} do not cover its {count} elements "
                "in order"
            )
    checked: dict[str, Any] = manifest
    return checked


def _shard(directory: Path, index: int, manifest: dict[str, Any], outline: bool) -> dict[str, Any]:
    """Shard ``index``'s tree: ``{"id", "parts"}``, its arrays as :class:`Outline` if ``outline``."""
    legacy = manifest["format"] == _LEGACY
    path = directory / _shard_name(index, legacy)
    try:
        if legacy:
            return _legacy_shard(path)
        owner = {"shard": index}  # a shard renamed or copied over another is refused by name
        tree: Any = read_outline(path, owner=owner) if outline else read_state(path, owner=owner)
    except CheckpointError as error:
        raise KVStoreError(f"checkpoint {str(directory)!r} is partial or damaged: {error}") from None
    if (
        not isinstance(tree, dict)
        or not isinstance(tree.get("id"), str)
        or not isinstance(tree.get("parts"), list)
    ):
        raise KVStoreError(f"{str(path)!r} is not a shard (no id and parts)")
    return tree


def _legacy_shard(path: Path) -> dict[str, Any]:
    """A format-1 shard (``np.load`` without pickle) as the tree of a state file's."""
    kind = kind_of(path)
    if kind not in (None, "file"):  # np.load would follow a link, or wait on a FIFO
        raise KVStoreError(f"{str(path)!r} is a {kind}, not a regular file: refused")
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            for part in meta["parts"]:
                part["value"] = data[part["value"]]
                part["state"] = {
                    field: data[saved["array"]] if "array" in saved else saved["scalar"]
                    for field, saved in part["state"].items()
                }
    except (OSError, EOFError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as error:
        raise KVStoreError(
            f"{str(path)!r} is missing or not a shard ({type(error).__name__}: {error})"
        ) from None
    return meta  # type: ignore[no-any-return]


def _check_shards(directory: Path, manifest: dict[str, Any], outline: bool) -> list[dict[str, Any]]:
    """Every shard, checked against ``manifest``: each listed partition found once, as listed; no other."""
    keys = {entry["key"]: entry for entry in manifest["keys"]}
    found: dict[tuple[str, int], int] = {}
    shards = []
    for index in range(manifest["servers"]):
        shard = _shard(directory, index, manifest, outline)
        name = str(directory / _shard_name(index, manifest["format"] == _LEGACY))
        if shard["id"] != manifest["id"]:
            raise KVStoreError(
                f"checkpoint {str(directory)!r} is partial: {Path(name).name} belongs to checkpoint "
                f"{shard['id']}, the manifest to {manifest['id']}"
            )
        for part in shard["parts"]:
            where = _check_part(name, part, keys)
            if where in found:
                raise KVStoreError(
                    f"{name!r}: partition {where[1]} of key {_brief(where[0])} is also in shard "
                    f"{found[where]}"
                )
            found[where] = index
        shards.append(shard)
    for key, entry in keys.items():
        for p in range(len(entry["bounds"])):
            if (key, p) not in found:
                raise KVStoreError(
                    f"{str(directory / _MANIFEST)!r} lists partition {p} of key {_brief(key)}, "
                    f"which none of its {manifest['servers']} shards holds"
                )
    return shards


def _check_part(name: str, part: Any, keys: dict[str, dict[str, Any]]) -> tuple[str, int]:
    """Where ``part`` (of shard file ``name``) goes, once it matches its key's entry in the manifest."""
    if not isinstance(part, dict) or not isinstance(part.get("key"), str) or not _count(part.get("part")):
        raise KVStoreError(f"{name!r}: a partition without its key and index")
    key, index = part["key"], part["part"]
    entry = keys.get(key)
    if entry is None:
        raise KVStoreError(f"{name!r} holds key {_brief(key)}, which its manifest does not list")
    bounds, count = entry["bounds"], math.prod(entry["shape"])
    if index >= len(bounds):
        raise KVStoreError(
            f"{name!r}: partition {index} of key {_brief(key)}, the manifest lists {len(bounds)}"
        )
    size = [*bounds[1:], count][index] - bounds[index]
    dtype = np.dtype(entry["dtype"])
    shape_text = f"{dtype.name}|{','.join(map(str, entry['shape']))}"
    if (
        part.get("shape") != shape_text
        or not _count(part.get("round"))
        or not isinstance(part.get("state"), dict)
    ):
        raise KVStoreError(
            f"{name!r}: partition {index} of key {_brief(key)}: shape {_brief(part.get('shape'))} "
            f"(the manifest's {shape_text!r}), round {_brief(part.get('round'))}, "
            f"state of type {type(part.get('state')).__name__}"
        )
    for what, value in [("value", part.get("value")), *part["state"].items()]:
        if isinstance(value, np.ndarray | Outline):
            if (what == "value" and value.dtype != dtype) or math.prod(value.shape) != size:
                raise KVStoreError(
                    f"{name!r}: partition {index} of key {_brief(key)}: {what} is {value.dtype} "
                    f"{tuple(value.shape)}, the manifest says {dtype} of {size} elements"
                )
        elif what == "value" or not (value is None or type(value) in (bool, int, float)):
            raise KVStoreError(
                f"{name!r}: partition {index} of key {_brief(key)}: {what} is {type(value).__name__}"
            )
    return key, index


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a whole checkpoint in ``directory``, checked against its shards' headers.

    Raises:
        KVStoreError: the directory or its manifest is missing, the manifest is of
            another format or malformed, a shard is missing, damaged, belongs to
            another checkpoint or does not hold what the manifest lists (naming the file).
    """
    path = directory / _MANIFEST
    if not directory.is_dir():
        raise KVStoreError(f"no checkpoint directory {str(directory)!r}")
    try:
        manifest = read_json(path)
    except CheckpointError as error:
        raise KVStoreError(f"not a manifest: {error}") from None
    except OSError as error:
        raise KVStoreError(f"{str(path)!r} is not a manifest: {error}") from None
    if manifest is None:
        raise KVStoreError(f"{str(directory)!r} holds no {_MANIFEST}: not a checkpoint, or a partial one")
    manifest = _check_manifest(path, manifest)
    _check_shards(directory, manifest, outline=True)
    return manifest


def restore_shards(directory: Path, manifest: dict[str, Any]) -> dict[bytes, dict[str, Any]]:
    """Every key's whole value, round, shape text and optimizer state, assembled from all shards.

    Every shard is read whole (its checksum checked) and checked against
    ``manifest`` before any value is assembled.

    Raises:
        KVStoreError: a shard is damaged or does not hold what the manifest lists (naming the file).
    """
    shards = _check_shards(directory, manifest, outline=False)
    keys: dict[bytes, dict[str, Any]] = {}
    for entry in manifest["keys"]:
        count = math.prod(entry["shape"])
        keys[entry["key"].encode()] = {
            "value": np.empty(count, entry["dtype"]), "round": 0, "shape": None, "state": {}, "scalars": {},
            "bounds": entry["bounds"],
        }  # fmt: skip
    for shard in shards:
        for part in shard["parts"]:
            whole = keys[part["key"].encode()]
            value = part["value"].reshape(-1)
            lo = int(whole["bounds"][part["part"]])
            whole["value"][lo : lo + value.size] = value
            whole["round"] = max(whole["round"], part["round"])
            whole["shape"] = part["shape"]
            for field, saved in part["state"].items():
                if isinstance(saved, np.ndarray):
                    array = whole["state"].setdefault(field, np.zeros_like(whole["value"], saved.dtype))
                    array[lo : lo + value.size] = saved.reshape(-1)
                else:
                    whole["scalars"][field] = saved
    return keys
