"""Sparse rows of 2-D keys, for embedding tables: only the rows pushed or pulled travel."""

__all__ = ["check_rows", "pull_rows", "push_rows", "row_groups"]

from typing import Any

import numpy as np

from ..errors import InvalidRowsError, KeyMismatchError
from ._wire import Kind
from .handles import Handle, KeyInfo, Pulled, row_filler
from .layout import Partition
from .link import WorkerLink


def check_rows(link: WorkerLink, key: Any, meta: KeyInfo, rows: Any) -> np.ndarray:
    """``rows`` as distinct int64 indices of ``key``'s first axis, or an error naming what is wrong."""
    if isinstance(key, list | tuple):
        raise InvalidRowsError("rows= takes one key at a time")
    if len(meta.shape) < 2:
        raise InvalidRowsError(
            f"rows= needs a key of 2 or more dimensions; key {key!r} is {list(meta.shape)}"
        )
    ids = np.asarray(rows)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InvalidRowsError(
            f"rows for key {key!r} must be a 1-D array of integers, got {ids.dtype}{list(ids.shape)}"
        )
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= meta.shape[0])]
    if bad.size:
        raise InvalidRowsError(
            f"rows of key {key!r} on rank {link.rank} must be in 0..{meta.shape[0] - 1}, got {int(bad[0])}"
        )
    if np.unique(ids).size != ids.size:
        raise InvalidRowsError(f"rows of key {key!r} on rank {link.rank} repeat a row")
    return ids


def row_groups(meta: KeyInfo, ids: np.ndarray) -> list[tuple[Partition, np.ndarray, np.ndarray]]:
    """Each partition, the positions in ``ids`` of its rows, and those rows' indices within it."""
    groups = []
    for p in meta.parts:
        first, last = p.lo // max(meta.row, 1), p.hi // max(meta.row, 1)
        where = np.flatnonzero((ids >= first) & (ids < last))
        groups.append((p, where, ids[where] - first))
    return groups


def push_rows(link: WorkerLink, key: Any, value: Any, rows: Any) -> Handle:
    """Push ``value``'s rows to rows ``rows`` of ``key``: to each partition its own rows only."""
    meta = link.meta(key)
    ids = check_rows(link, key, meta, rows)
    array = np.ascontiguousarray(value)
    expected = (ids.size, *meta.shape[1:])
    if array.shape != expected or array.dtype != meta.dtype:
        raise KeyMismatchError(
            f"value for {ids.size} rows of key {key!r} on rank {link.rank} is "
            f"{array.dtype.name}{list(array.shape)}; expected {meta.dtype.name}{list(expected)}"
        )
    stamp = meta.pushes if link.mode == "sync" else link.clock
    meta.pushes += 1
    requests = []
    for p, where, local in row_groups(meta, ids):
        if not where.size and link.mode != "sync":  # a sync round needs every worker's push, even empty
            continue
        payload = np.concatenate([local.view(np.uint8), array[where].reshape(-1).view(np.uint8)])
        requests.append(link.send(Kind.PUSH, key, p, stamp=stamp, aux=where.size + 1, data=payload))
    return Handle(link, requests, lambda: None)


def pull_rows(link: WorkerLink, key: Any, out: Any, rows: Any, report: bool) -> Handle:
    """Pull rows ``rows`` of ``key``, in that order, from the partitions holding them."""
    meta = link.meta(key)
    ids = check_rows(link, key, meta, rows)
    shape = (ids.size, *meta.shape[1:])
    target = np.empty(shape, meta.dtype) if out is None else out
    if not isinstance(target, np.ndarray) or target.shape != shape or target.dtype != meta.dtype:
        raise KeyMismatchError(
            f"out for {ids.size} rows of key {key!r} on rank {link.rank} "
            f"is not {meta.dtype.name}{list(shape)}"
        )
    stamp = meta.pushes if link.mode == "sync" else link.clock
    seen = [-1] * len(meta.parts)
    requests = []
    for p, where, local in row_groups(meta, ids):
        if where.size:
            fill = row_filler(target, where, meta.dtype, seen, p.index)
            requests.append(
                link.send(Kind.PULL, key, p, stamp=stamp, aux=where.size + 1, data=local, on_data=fill)
            )
    return Handle(link, requests, lambda: Pulled(target, tuple(seen)) if report else target)
