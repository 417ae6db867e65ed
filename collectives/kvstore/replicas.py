"""A store's shards as in-memory state, for replicas: taken on each server, restored onto the survivors.

:meth:`KVStore.state` gives what a colocated server holds (its partitions,
their rounds and optimizer state, and the keys' layout) as a picklable dict,
to be kept with :class:`~collectives.resilience.Checkpointer`, whose ring
replicas put a copy on a neighbour. After a death, the survivors make a new
store over their communicator and :meth:`KVStore.restore` it from their own
states and those they adopted (:attr:`~collectives.resilience.Recovery.adopted`):
the lost server's partitions come from its replica, and every key is cut anew
over the servers that remain.
"""

__all__ = ["restore_states", "state_of"]

import json
from typing import Any

import numpy as np

from ..errors import ConfigurationError, KVStoreError
from ._wire import key_bytes, parse_key
from .checkpoint import FORMAT
from .link import WorkerLink
from .server import Server, take_parts
from .updaters import optimizer_from_spec


def _server_of(link: WorkerLink, what: str) -> Server:
    if link.roles.dedicated or link.server is None:
        raise ConfigurationError(f"{what} needs colocated servers (every rank a worker and a server)")
    return link.server


def state_of(link: WorkerLink) -> dict[str, Any]:
    """The body of :meth:`KVStore.state`."""
    server = _server_of(link, "state()")
    link.settle()
    keys = [
        {"key": key_bytes(k).decode(), "shape": list(m.shape), "dtype": m.dtype.name, "round": m.pushes,
         "bounds": [p.lo for p in m.parts]}
        for k, m in link.keys.items()
    ]  # fmt: skip
    parts = []
    with server.lock:
        optimizer = server.optimizer
        for (raw, index), part in sorted(server.parts.items()):
            saved = {} if optimizer is None else optimizer.partition_state(parse_key(raw), index)
            parts.append({
                "key": raw.decode(), "part": index, "shape": part.shape, "round": part.round,
                "value": part.value.copy(),
                "state": {name: v.copy() if isinstance(v, np.ndarray) else v for name, v in saved.items()},
            })  # fmt: skip
    spec = None if link.optimizer is None else link.optimizer.spec()
    return {"format": FORMAT, "mode": link.mode, "clock": link.clock, "optimizer": spec,
            "keys": keys, "parts": parts}  # fmt: skip


def restore_states(link: WorkerLink, states: list[dict[str, Any]]) -> None:
    """The body of :meth:`KVStore.restore`: collective over the new store's ranks."""
    server = _server_of(link, "restore()")
    if not states:
        raise KVStoreError(f"restore on rank {link.rank}: pass at least this rank's own state")
    if link.keys:
        raise KVStoreError(f"restore into a store with keys already ({', '.join(map(repr, link.keys))})")
    for state in states:
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise KVStoreError(f"restore takes the dicts KVStore.state() gave; got {type(state).__name__}")
        if state["mode"] != link.mode:
            raise KVStoreError(f"a state of a {state['mode']!r} store cannot restore a {link.mode!r} one")
    # every rank sends the pieces it holds: a table (json) and their bytes, gathered by all
    table, chunks = [], []
    for state in states:
        bounds = {entry["key"]: entry["bounds"] for entry in state["keys"]}
        for part in state["parts"]:
            arrays = {"": part["value"]} | {
                n: v for n, v in part["state"].items() if isinstance(v, np.ndarray)
            }
            scalars = {n: v for n, v in part["state"].items() if not isinstance(v, np.ndarray)}
            lo = int(bounds[part["key"]][part["part"]])
            for name, array in arrays.items():
                table.append([part["key"], name, array.dtype.name, lo, int(array.size), part["round"],
                              part["shape"], scalars])  # fmt: skip
                chunks.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    everyone_table = _gather_bytes(link, json.dumps(table).encode())
    everyone_data = _gather_bytes(link, np.concatenate(chunks) if chunks else np.zeros(0, np.uint8))
    keys_meta, clock, spec = states[0]["keys"], states[0]["clock"], states[0]["optimizer"]
    saved: dict[bytes, dict[str, Any]] = {}
    covered: dict[bytes, np.ndarray] = {}
    for entry in keys_meta:
        count = int(np.prod(entry["shape"], dtype=np.int64))
        raw = entry["key"].encode()
        saved[raw] = {"value": np.empty(count, entry["dtype"]), "round": 0, "shape": None, "state": {},
                      "scalars": {}}  # fmt: skip
        covered[raw] = np.zeros(count, bool)
    for rows, data in zip(everyone_table, everyone_data, strict=True):
        at = 0
        for key, name, dtype, lo, size, round_, shape, scalars in json.loads(bytes(rows)):
            raw = key.encode()
            whole = saved[raw]
            piece = data[at : at + size * np.dtype(dtype).itemsize].view(dtype)
            at += piece.nbytes
            if name:
                whole["state"].setdefault(name, np.zeros(whole["value"].size, dtype))[lo : lo + size] = piece
            else:
                whole["value"][lo : lo + size] = piece
                covered[raw][lo : lo + size] = True
                whole["round"], whole["shape"] = max(whole["round"], round_), shape
                whole["scalars"].update(scalars)
    missing = [parse_key(raw) for raw, seen in covered.items() if not seen.all()]
    if missing:
        raise KVStoreError(
            f"restore: no state passed holds all of key(s) {', '.join(map(repr, missing))}; "
            "pass each lost server's state from its replica (Recovery.adopted)"
        )
    metas = {}
    for entry in keys_meta:
        key = parse_key(entry["key"].encode())
        metas[key] = link.layout(key, tuple(entry["shape"]), np.dtype(entry["dtype"]), entry["round"])
    optimizer = None if spec is None else optimizer_from_spec(spec)
    held = [(key_bytes(k).decode(), p.index, p.lo, p.hi) for k, m in metas.items() for p in m.parts
            if p.server == link.rank]  # fmt: skip
    with server.lock:
        take_parts(server, saved, optimizer, clock, held)
    link.keys.update(metas)
    link.clock = int(clock)
    link.optimizer = optimizer
    link.barrier()


def _gather_bytes(link: WorkerLink, mine: Any) -> list[np.ndarray]:
    """Every rank's bytes, by rank."""
    from .. import api

    buffer = np.frombuffer(mine, np.uint8) if isinstance(mine, bytes) else mine
    comm = link.channel.comm
    counts = [int(c) for c in api.allgather(np.array([buffer.size], np.int64), comm=comm).reshape(-1)]
    whole = api.allgather(buffer, counts=counts, comm=comm)
    edges = np.cumsum([0, *counts])
    return [whole[edges[r] : edges[r + 1]] for r in range(len(counts))]
