"""A store's save and load by the workers: each server writes or takes its shard, worker 0 the manifest."""

__all__ = ["load_store", "save_store"]

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import KVStoreError
from ._wire import Kind, key_bytes, parse_key
from .checkpoint import read_manifest, write_manifest
from .handles import Handle, KeyInfo
from .link import WorkerLink
from .updaters import optimizer_from_spec


def save_store(link: WorkerLink, directory: "str | os.PathLike[str]") -> None:
    """The body of :meth:`KVStore.save`."""
    _check_open(link, "save")
    link.settle()
    _on_worker_zero(link, lambda: _save(link, Path(directory).resolve()), f"save to {str(directory)!r}")


def _save(link: WorkerLink, path: Path) -> None:
    checkpoint = uuid.uuid4().hex
    path.mkdir(parents=True, exist_ok=True)
    requests = []
    for index, server in enumerate(link.roles.server_ranks):
        text = json.dumps({"dir": str(path), "id": checkpoint, "index": index})
        requests.append(link.send(Kind.SAVE, None, server=server, text=text))
    Handle(link, requests, lambda: None).wait()
    keys = [
        {"key": key_bytes(k).decode(), "shape": list(m.shape), "dtype": m.dtype.name, "round": m.pushes,
         "bounds": [p.lo for p in m.parts]}
        for k, m in link.keys.items()
    ]  # fmt: skip
    optimizer = None if link.optimizer is None else link.optimizer.spec()
    manifest = {"id": checkpoint, "servers": link.roles.num_servers, "workers": link.roles.num_workers}
    manifest.update(mode=link.mode, clock=link.clock, keys=keys, optimizer=optimizer)
    write_manifest(path, manifest)


def load_store(link: WorkerLink, directory: "str | os.PathLike[str]") -> None:
    """The body of :meth:`KVStore.load`."""
    _check_open(link, "load")
    path = Path(directory).resolve()
    manifest = read_manifest(path)
    if manifest["mode"] != link.mode:
        raise KVStoreError(
            f"checkpoint {str(path)!r} is of a {manifest['mode']!r} store, this one is {link.mode!r}"
        )
    if link.keys:
        raise KVStoreError(f"load into a store with keys already ({', '.join(map(repr, link.keys))})")
    metas = {}
    for entry in manifest["keys"]:
        key = parse_key(entry["key"].encode())
        dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
        metas[key] = link.layout(key, shape, dtype, entry["round"])
    _on_worker_zero(link, lambda: _load(link, path, metas), f"load of {str(directory)!r}")
    link.keys.update(metas)
    link.clock = int(manifest["clock"])
    if manifest["optimizer"] is not None:
        link.optimizer = optimizer_from_spec(manifest["optimizer"])


def _load(link: WorkerLink, path: Path, metas: dict[Any, KeyInfo]) -> None:
    """Tell each server which partitions of the checkpoint to take."""
    by_server: dict[int, list[tuple[str, int, int, int]]] = {s: [] for s in link.roles.server_ranks}
    for key, meta in metas.items():
        for p in meta.parts:
            by_server[p.server].append((key_bytes(key).decode(), p.index, p.lo, p.hi))
    requests = []
    for server, parts in by_server.items():
        text = json.dumps({"dir": str(path), "parts": parts})
        requests.append(link.send(Kind.LOAD, None, server=server, text=text))
    Handle(link, requests, lambda: None).wait()


def _check_open(link: WorkerLink, what: str) -> None:
    """Raise before any message: a closed store's channel is gone, and MPI would say only that."""
    if link.closed:
        raise KVStoreError(f"{what}: the store is closed on rank {link.rank}")


def _on_worker_zero(link: WorkerLink, action: Callable[[], None], what: str) -> None:
    """Run ``action`` on worker 0 between two barriers; every worker raises if it failed there."""
    link.barrier()
    error: Exception | None = None
    if link.rank == 0:
        try:
            action()
        except Exception as caught:
            error = caught
    failed = link.barrier(error is not None)
    if error is not None:
        raise error
    if failed:
        raise KVStoreError(f"{what} failed on worker 0 (its error says why)")
