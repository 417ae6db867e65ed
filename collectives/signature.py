"""What the ranks agree on before a collective runs, and the error that names where they differ."""

__all__ = [
    "PROBLEM_BYTES",
    "SIGNATURE_BYTES",
    "TAG_BYTES",
    "Signature",
    "disagreement",
    "problem_of",
    "stamp_tag",
]

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import MismatchError, PeerInputError

PROBLEM_BYTES = 64
"""The most bytes of a poisoned signature's problem (its error's type and message) that travel."""

TAG_BYTES = 8
"""The bytes of a signature's tag: what a library layer above the collectives says a call is of."""

_FORMAT = struct.Struct(f"<q{TAG_BYTES}s24s24s12s12s8sqq8s{PROBLEM_BYTES}s")
_TAG = struct.Struct(f"<{TAG_BYTES}s")
_TAG_OFFSET = 8  # after the sequence number
SIGNATURE_BYTES = _FORMAT.size
"""Bytes of a packed signature: every collective exchanges this, whatever its size."""

_FIELDS = ("tag", "collective", "count", "dtype", "backend", "op", "root", "algorithm", "counts", "sequence")
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
        backend: the array backend's name (``numpy``, ``cupy``), so host and
            device arrays do not meet in one call; empty for the barrier.
        tag: empty for a user's call; a layer built on the collectives (the
            key-value store) fills it with what the call is of (a key's digest),
            so calls of different things disagree here, at no extra message;
            at most :data:`TAG_BYTES`, and stamped per call (see :func:`stamp_tag`).
        problem: empty, unless this rank's own checks of the call failed: then
            the error's type and message (see :func:`problem_of`), and the
            signature is *poisoned*: the other ranks raise
            :class:`~collectives.errors.PeerInputError` instead of running the call.
    """

    sequence: int
    collective: str
    algorithm: str
    dtype: str = ""
    op: str = ""
    root: int = -1
    count: int = 0
    counts: tuple[int, ...] | None = None
    backend: str = ""
    problem: str = ""
    tag: bytes = b""

    def pack(self) -> bytes:
        """The fixed-size bytes the ranks exchange; longer text is cut to its field."""
        return _FORMAT.pack(
            self.sequence,
            self.tag,
            self.collective.encode(),
            self.algorithm.encode(),
            self.dtype.encode(),
            self.backend.encode(),
            self.op.encode(),
            self.root,
            self.count,
            _digest(self.counts),
            self.problem.encode(),
        )


def stamp_tag(packed: bytearray, tag: bytes) -> None:
    """Write ``tag`` (at most :data:`TAG_BYTES`, zero-padded) into a packed signature."""
    _TAG.pack_into(packed, _TAG_OFFSET, tag)


def problem_of(error: BaseException) -> str:
    """What a poisoned signature tells the other ranks of ``error``: its type and message, cut to fit."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ").encode()
    if len(text) > PROBLEM_BYTES:
        # cut on a character, not inside one, so every rank decodes it whole
        text = text[: PROBLEM_BYTES - 3] + b"..."
    return text.decode(errors="ignore")


def _digest(counts: Sequence[int] | None) -> bytes:
    if counts is None:
        return _NO_COUNTS
    return hashlib.blake2b(repr(tuple(counts)).encode(), digest_size=8).digest()


def _text(field: bytes) -> str:
    return field.rstrip(b"\0").decode(errors="replace")


def _fields(packed: bytes) -> dict[str, str]:
    """A packed signature's fields, as a mismatch shows them; a poisoned one's only those it fills."""
    sequence, tag, collective, algorithm, dtype, backend, op, root, count, counts, problem = _FORMAT.unpack(
        packed
    )
    if problem[0]:
        return {"collective": _text(collective), "sequence": str(sequence), "problem": _text(problem)}
    return {
        "tag": tag.hex() if tag.strip(b"\0") else "none",
        "collective": _text(collective),
        "count": str(count),
        "dtype": _text(dtype) or "none",
        "backend": _text(backend) or "none",
        "op": _text(op) or "none",
        "root": "none" if root < 0 else str(root),
        "algorithm": _text(algorithm),
        "counts": "none" if counts == _NO_COUNTS else f"digest {counts.hex()}",
        "sequence": str(sequence),
    }


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def disagreement(mine: Signature, packed: Sequence[bytes], rank: int) -> MismatchError | None:
    """The error every rank raises when the signatures in ``packed`` (one per rank) differ; else ``None``.

    Every rank names the same fields, values and ranks, so the ranks' logs can be
    compared. Where some signatures are poisoned it is a
    :class:`~collectives.errors.PeerInputError` naming those ranks and their
    problems; the other fields are compared where the signatures have them.
    """
    first = packed[0]
    if all(p == first for p in packed):
        return None
    seen = [_fields(p) for p in packed]
    problems = {r: signature["problem"] for r, signature in enumerate(seen) if "problem" in signature}
    fields: dict[str, dict[str, tuple[int, ...]]] = {}
    for name in (*_FIELDS, "problem") if problems else _FIELDS:
        values: dict[str, list[int]] = {}
        for r, signature in enumerate(seen):
            if name in signature or name == "problem":
                values.setdefault(signature.get(name, "none"), []).append(r)
        if len(values) > 1:
            fields[name] = {value: tuple(ranks) for value, ranks in values.items()}
    clauses = [
        f"{name}: " + "; ".join(f"{value} on {_ranks(ranks)}" for value, ranks in values.items())
        for name, values in fields.items()
        if name != "problem"
    ]
    if "counts" in fields and mine.counts is not None:
        clauses.append(f"rank {rank} passed counts={mine.counts}")
    if problems:
        failed = "; ".join(f"on rank {r} ({problem})" for r, problem in problems.items())
        whose = "that rank's error" if len(problems) == 1 else "those ranks' errors"
        return PeerInputError(
            f"{mine.collective} #{mine.sequence}: the call failed its checks {failed}, so it runs on "
            f"no rank; see {whose}" + "".join(f" | {clause}" for clause in clauses),
            fields,
            problems,
        )
    return MismatchError(
        f"{mine.collective} #{mine.sequence}: the ranks called different collectives or passed "
        f"different arguments; {' | '.join(clauses)}",
        fields,
    )
