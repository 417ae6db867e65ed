"""What the ranks agree on before a collective runs, and the error that names where they differ."""

__all__ = ["SIGNATURE_BYTES", "Signature", "disagreement"]

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import MismatchError

_FORMAT = struct.Struct("<q24s24s12s8sqq8s")
SIGNATURE_BYTES = _FORMAT.size
"""Bytes of a packed signature: every collective exchanges this, whatever its size."""

_FIELDS = ("collective", "count", "dtype", "op", "root", "algorithm", "counts", "sequence")
"""The order a mismatch names its fields in: what the user most likely got wrong first."""

_NO_COUNTS = bytes(8)


@dataclass(frozen=True)
class Signature:
    """One rank's view of a collective call; every rank's must be equal for it to run.

    Attributes:
        sequence: the call's number on its communicator, from 0.
        collective: the collective's name.
        algorithm: the algorithm asked for (``"auto"`` before the selector chooses).
        dtype: the element type's name (empty for the barrier).
        op: the reduction's name (empty for the collectives that do not reduce).
        root: the root of a rooted collective, else -1.
        count: elements in the schedule's buffer, which every rank must agree on.
        counts: each rank's share, when the call passed ``counts=``.
    """

    sequence: int
    collective: str
    algorithm: str
    dtype: str = ""
    op: str = ""
    root: int = -1
    count: int = 0
    counts: tuple[int, ...] | None = None

    def pack(self) -> bytes:
        """The fixed-size bytes the ranks exchange."""
        return _FORMAT.pack(
            self.sequence,
            self.collective.encode(),
            self.algorithm.encode(),
            self.dtype.encode(),
            self.op.encode(),
            self.root,
            self.count,
            _digest(self.counts),
        )


def _digest(counts: Sequence[int] | None) -> bytes:
    if counts is None:
        return _NO_COUNTS
    return hashlib.blake2b(repr(tuple(counts)).encode(), digest_size=8).digest()


def _fields(packed: bytes) -> dict[str, str]:
    """A packed signature's fields, as a mismatch shows them."""
    sequence, collective, algorithm, dtype, op, root, count, counts = _FORMAT.unpack(packed)
    return {
        "collective": collective.rstrip(b"\0").decode(errors="replace"),
        "count": str(count),
        "dtype": dtype.rstrip(b"\0").decode(errors="replace") or "none",
        "op": op.rstrip(b"\0").decode(errors="replace") or "none",
        "root": "none" if root < 0 else str(root),
        "algorithm": algorithm.rstrip(b"\0").decode(errors="replace"),
        "counts": "none" if counts == _NO_COUNTS else f"digest {counts.hex()}",
        "sequence": str(sequence),
    }


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def disagreement(mine: Signature, packed: Sequence[bytes], rank: int) -> MismatchError | None:
    """The error every rank raises when the signatures in ``packed`` (one per rank) differ; else ``None``.

    Every rank names the same fields, values and ranks, so the ranks' logs can be compared.
    """
    first = packed[0]
    if all(p == first for p in packed):
        return None
    seen = [_fields(p) for p in packed]
    fields: dict[str, dict[str, tuple[int, ...]]] = {}
    for name in _FIELDS:
        values: dict[str, list[int]] = {}
        for r, signature in enumerate(seen):
            values.setdefault(signature[name], []).append(r)
        if len(values) > 1:
            fields[name] = {value: tuple(ranks) for value, ranks in values.items()}
    clauses = [
        f"{name}: " + "; ".join(f"{value} on {_ranks(ranks)}" for value, ranks in values.items())
        for name, values in fields.items()
    ]
    if "counts" in fields and mine.counts is not None:
        clauses.append(f"rank {rank} passed counts={mine.counts}")
    return MismatchError(
        f"{mine.collective} #{mine.sequence}: the ranks called different collectives or passed "
        f"different arguments; {' | '.join(clauses)}",
        fields,
    )
