"""Checkpoints of the store: a shard file per server, then a manifest, so a partial one is recognised."""

__all__ = [
    "FORMAT",
    "load_store",
    "read_manifest",
    "restore_shards",
    "save_store",
    "write_manifest",
    "write_shard",
]

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KVStoreError
from ..files import atomic_write
from ._wire import Kind, key_bytes, parse_key
from .handles import Handle, KeyInfo
from .updaters import optimizer_from_spec

if TYPE_CHECKING:
    from .server import Server
    from .store import KVStore

FORMAT = "collectives.kvstore/1"
_MANIFEST = "manifest.json"


def _shard_name(index: int) -> str:
    return f"shard-{index}.npz"


def write_shard(server: "Server", directory: Path, index: int, checkpoint: str) -> None:
    """Write every partition ``server`` holds, with its round and optimizer state, as shard ``index``."""
    arrays: dict[str, np.ndarray] = {}
    parts = []
    optimizer = server.optimizer
    for (raw, part_index), part in sorted(server.parts.items()):
        name = f"a{len(arrays)}"
        arrays[name] = part.value
        state: dict[str, Any] = {}
        saved = {} if optimizer is None else optimizer._state.get((parse_key(raw), part_index), {})
        for field, value in saved.items():
            if isinstance(value, np.ndarray):
                state[field] = {"array": f"a{len(arrays)}"}
                arrays[state[field]["array"]] = value
            else:
                state[field] = {"scalar": value}
        parts.append({"key": raw.decode(), "part": part_index, "shape": part.shape, "round": part.round,
                      "value": name, "state": state})  # fmt: skip
    meta = {"id": checkpoint, "parts": parts}
    arrays["meta"] = np.array(json.dumps(meta))
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / _shard_name(index), lambda file: np.savez(file, allow_pickle=False, **arrays))


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last: a checkpoint is whole once it names shards that carry its id."""
    text = json.dumps({"format": FORMAT, **manifest}, indent=1, sort_keys=True).encode()
    atomic_write(directory / _MANIFEST, lambda file: file.write(text))


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a whole checkpoint in ``directory``.

    Raises:
        KVStoreError: the directory or its manifest is missing, the manifest is of
            another format, or a shard is missing or belongs to another checkpoint.
    """
    path = directory / _MANIFEST
    if not directory.is_dir():
        raise KVStoreError(f"no checkpoint directory {str(directory)!r}")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise KVStoreError(
            f"{str(directory)!r} holds no {_MANIFEST}: not a checkpoint, or a partial one"
        ) from None
    except ValueError as error:
        raise KVStoreError(f"{str(path)!r} is not a manifest: {error}") from None
    if manifest.get("format") != FORMAT:
        raise KVStoreError(f"{str(path)!r} is of format {manifest.get('format')!r}, expected {FORMAT!r}")
    for index in range(manifest["servers"]):
        shard = directory / _shard_name(index)
        try:
            with np.load(shard) as data:
                found = json.loads(str(data["meta"]))["id"]
        except (OSError, KeyError, ValueError):
            raise KVStoreError(
                f"checkpoint {str(directory)!r} is partial: {shard.name} is missing or unreadable"
            ) from None
        if found != manifest["id"]:
            raise KVStoreError(
                f"checkpoint {str(directory)!r} is partial: {shard.name} belongs to checkpoint {found}, "
                f"the manifest to {manifest['id']}"
            )
    return manifest


def restore_shards(directory: Path, manifest: dict[str, Any]) -> dict[bytes, dict[str, Any]]:
    """Every key's whole value, round, shape text and optimizer state, assembled from all shards."""
    keys: dict[bytes, dict[str, Any]] = {}
    for entry in manifest["keys"]:
        count = int(np.prod(entry["shape"], dtype=np.int64))
        keys[entry["key"].encode()] = {
            "value": np.empty(count, entry["dtype"]), "round": 0, "shape": None, "state": {}, "scalars": {},
        }  # fmt: skip
    for index in range(manifest["servers"]):
        with np.load(directory / _shard_name(index)) as data:
            meta = json.loads(str(data["meta"]))
            for part in meta["parts"]:
                whole = keys[part["key"].encode()]
                value = data[part["value"]]
                lo = _offset(manifest, part["key"], part["part"])
                whole["value"][lo : lo + value.size] = value
                whole["round"] = max(whole["round"], part["round"])
                whole["shape"] = part["shape"]
                for field, saved in part["state"].items():
                    if "array" in saved:
                        array = whole["state"].setdefault(
                            field, np.zeros_like(whole["value"], data[saved["array"]].dtype)
                        )
                        array[lo : lo + value.size] = data[saved["array"]]
                    else:
                        whole["scalars"][field] = saved["scalar"]
    return keys


def _offset(manifest: dict[str, Any], key: str, part: int) -> int:
    """Where partition ``part`` of ``key`` started in the saved layout."""
    for entry in manifest["keys"]:
        if entry["key"] == key:
            return int(entry["bounds"][part])
    raise KVStoreError(f"the checkpoint's shards hold key {key!r}, which its manifest does not list")


def save_store(store: "KVStore", directory: "str | os.PathLike[str]") -> None:
    """The body of :meth:`KVStore.save`."""
    store._wait_for(list(store._requests.values()))
    _on_worker_zero(store, lambda: _save(store, Path(directory).resolve()), f"save to {str(directory)!r}")


def _save(store: "KVStore", path: Path) -> None:
    checkpoint = uuid.uuid4().hex
    path.mkdir(parents=True, exist_ok=True)
    requests = []
    for index, server in enumerate(store._roles.server_ranks):
        text = json.dumps({"dir": str(path), "id": checkpoint, "index": index})
        requests.append(store._send(Kind.SAVE, None, server=server, text=text))
    Handle(store, requests, lambda: None).wait()
    keys = [
        {"key": key_bytes(k).decode(), "shape": list(m.shape), "dtype": m.dtype.name, "round": m.pushes,
         "bounds": [p.lo for p in m.parts]}
        for k, m in store._keys.items()
    ]  # fmt: skip
    optimizer = None if store._optimizer is None else store._optimizer.spec()
    manifest = {"id": checkpoint, "servers": store.num_servers, "workers": store.num_workers}
    manifest.update(mode=store.mode, clock=store._clock, keys=keys, optimizer=optimizer)
    write_manifest(path, manifest)


def load_store(store: "KVStore", directory: "str | os.PathLike[str]") -> None:
    """The body of :meth:`KVStore.load`."""
    path = Path(directory).resolve()
    manifest = read_manifest(path)
    if manifest["mode"] != store.mode:
        raise KVStoreError(
            f"checkpoint {str(path)!r} is of a {manifest['mode']!r} store, this one is {store.mode!r}"
        )
    if store._keys:
        raise KVStoreError(f"load into a store with keys already ({', '.join(map(repr, store._keys))})")
    metas = {}
    for entry in manifest["keys"]:
        key = parse_key(entry["key"].encode())
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        metas[key] = store._layout(key, shape, dtype, entry["round"])
    _on_worker_zero(store, lambda: _load(store, path, metas), f"load of {str(directory)!r}")
    store._keys.update(metas)
    store._clock = int(manifest["clock"])
    if manifest["optimizer"] is not None:
        store._optimizer = optimizer_from_spec(manifest["optimizer"])


def _load(store: "KVStore", path: Path, metas: dict[Any, KeyInfo]) -> None:
    """Tell each server which partitions of the checkpoint to take."""
    by_server: dict[int, list[tuple[str, int, int, int]]] = {s: [] for s in store._roles.server_ranks}
    for key, meta in metas.items():
        for p in meta.parts:
            by_server[p.server].append((key_bytes(key).decode(), p.index, p.lo, p.hi))
    requests = []
    for server, parts in by_server.items():
        text = json.dumps({"dir": str(path), "parts": parts})
        requests.append(store._send(Kind.LOAD, None, server=server, text=text))
    Handle(store, requests, lambda: None).wait()


def _on_worker_zero(store: "KVStore", action: Callable[[], None], what: str) -> None:
    """Run ``action`` on worker 0 between two barriers; every worker raises if it failed there."""
    store.barrier()
    error: Exception | None = None
    if store.rank == 0:
        try:
            action()
        except Exception as caught:
            error = caught
    failed = store._barrier(error is not None)
    if error is not None:
        raise error
    if failed:
        raise KVStoreError(f"{what} failed on worker 0 (its error says why)")
