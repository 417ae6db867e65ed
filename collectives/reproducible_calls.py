"""Reproducible allreduce, reduce and reduce-scatter: codes agreed, words summed by collectives, one rounding.

A call with ``reproducible=True`` runs, on every rank alike:

1. an int8 max-allreduce of each element's code (:mod:`collectives.reproducible`)
   and a short trailer (dtype, op and contribution count, as ``v`` and ``-v`` so
   the max shows whether the ranks differ);
2. only where some element holds an infinity or a NaN, a bitwise-or allreduce of
   one byte per element saying which;
3. the sum of the words (float64 values for float16, bfloat16 and float32 sums of
   at most 64 contributions, else int64 whole units, two per float64 element)
   through the collective itself, with the caller's algorithm: exact, so every
   algorithm, rank count and arrival order gives the same sums;
4. one rounding to the dtype.

The collectives are passed in (:class:`Through`): :mod:`collectives.api` hands
its own, so this module stands below it.
"""

__all__ = [
    "ALIASES",
    "Sum",
    "Through",
    "check_call",
    "check_out",
    "deliver",
    "gathers",
    "named_mismatch",
    "pair_op",
    "plain_op",
    "reduced",
    "reproducibly",
    "rows_op",
    "shares_of",
    "went_on",
]

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .communicator import Communicator, communicator_of
from .dispatch import checked
from .errors import (
    CollectivesError,
    InvalidBufferError,
    InvalidRootError,
    MismatchError,
    PeerInputError,
    UnsupportedOpError,
)
from .ops import INTEGER_DTYPES, Op, ReduceOp
from .repeats import allreduce_key, keep_alias
from .reproducible import (
    BITS_OF,
    EXACT_IN_FLOAT64,
    FAMILIES,
    MOST_CONTRIBUTIONS,
    SPECIAL,
    Family,
    codes_of,
    family_of,
    finish,
    gathered_message,
    kernels,
    name_of,
    rows_sum,
    special_bits,
    words_of,
)
from .selector import AUTO

SHARED_MEMORY = "shared_memory"
"""The algorithm a reproducible sum of more than two ranks on one node's shared memory runs."""

if TYPE_CHECKING:
    from mpi4py import MPI

_OPS = {"sum": 1, "avg": 2}

GATHERED_BYTES = 128 << 10
"""The most bytes of every rank's contribution together that an allreduce gathers in one collective."""


@dataclass(frozen=True)
class Through:
    """The collectives a reproducible sum runs its reductions through (``collectives.allreduce`` ...)."""

    allreduce: Callable[..., Any]
    reduce: Callable[..., Any] | None = None
    reduce_scatter: Callable[..., Any] | None = None


@dataclass
class Sum:
    """What a reproducible reduction needs of its contributions, whatever made them.

    Attributes:
        family: how the elements are cut into words.
        dtype: the result's dtype.
        codes: this rank's code per element (int8).
        adds: this rank's contributions (1 for a plain call).
        words: the contributions cut at the agreed codes: ``words(agreed, wire)``.
        specials: this rank's :func:`~collectives.reproducible.special_bits`, when asked.
    """

    family: Family
    dtype: Any
    codes: np.ndarray
    adds: int
    words: Callable[[np.ndarray, Any], np.ndarray]
    specials: Callable[[], np.ndarray]


def _check_op(op: "str | ReduceOp") -> str:
    if op.__class__ is str and op in _OPS:
        return op
    name = op.name if isinstance(op, ReduceOp) and not op.custom else op
    if not isinstance(name, str) or name not in _OPS:
        raise UnsupportedOpError(f"reproducible=True sums: op must be 'sum' or 'avg', not {op!r}")
    return name


def _flat(x: Any) -> np.ndarray:
    """``x`` as a flat contiguous array of its family's working dtype; raises unless a float numpy array."""
    if not isinstance(x, np.ndarray):
        raise InvalidBufferError(f"reproducible=True takes numpy arrays, not {type(x).__name__}")
    family = family_of(name_of(x.dtype))
    if x.dtype is family.work and x.flags.c_contiguous:
        return x.reshape(-1)
    return np.ascontiguousarray(x, dtype=family.work).reshape(-1)


def check_out(out: Any, dtype: Any, shape: tuple[int, ...]) -> None:
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise InvalidBufferError(f"out is a {type(out).__name__}, but the input is a numpy array")
    if out.dtype != dtype:
        raise InvalidBufferError(f"out has dtype {out.dtype}, expected {dtype}")
    if tuple(out.shape) != shape:
        raise InvalidBufferError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if not out.flags.writeable:
        raise InvalidBufferError("out is read-only")


def deliver(result: np.ndarray, out: Any, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return result.reshape(shape)
    np.copyto(out, result.reshape(shape))
    given: np.ndarray = out
    return given


def _integer(x: Any) -> bool:
    return isinstance(x, np.ndarray) and name_of(x.dtype) in INTEGER_DTYPES


def _plain(x: np.ndarray, flat: np.ndarray) -> Sum:
    """A plain call's one contribution per rank."""
    family = family_of(name_of(x.dtype))
    codes = codes_of(flat, family)

    def words(agreed: np.ndarray, wire: Any) -> np.ndarray:
        return words_of(flat, agreed, family, wire)

    return Sum(family, x.dtype, codes, 1, words, lambda: special_bits(flat))


def _checked(group: Communicator, check: bool | None) -> bool:
    return bool(group.watchdog.check if check is None else check)


def gathers(size: int, count: int, itemsize: int, checked: bool) -> bool:
    """Whether a reproducible allreduce of ``count`` elements of ``itemsize`` bytes (its family's) on
    ``size`` ranks gathers every rank's contribution in one collective and sums them on each rank.

    Where the rows of all the ranks are few bytes, one collective costs less than the two of the
    distributed sum (codes, then words), and the sum of a few rows is quick. Only where calls are
    checked: ranks whose dtypes' families differ then raise, as their messages differ.
    """
    return checked and 1 < size <= EXACT_IN_FLOAT64 and size * count * itemsize <= GATHERED_BYTES


class _RowsSum(Op):
    """The reproducible sum of every rank's raw contribution (float32 or float64), divided by
    ``divide_by``, as an op.

    At two ranks every algorithm combines each element's two contributions once
    (``a op b``, or ``b op a``: the sum is the same), so this op is the whole
    reproducible sum and the reduction runs as the plain call's, bytes and all:
    the shared-memory owner of each share sums it from the two ranks' raw inputs.
    At more ranks the op is :attr:`whole`: the shared-memory executor's owners sum
    every rank's raw contribution to their share at once (:meth:`apply_all`); no
    other path runs it. The engine's op of the same arithmetic
    (:attr:`compiled_combine`) lets its repeated small and segmented calls apply it,
    as they do a plain sum. Its bits are the distributed sum's (codes agreed, words
    summed, one rounding).
    """

    whole = True
    divide_by: int
    size: int
    engine_op: str

    def __init__(self, dtype: str, op: str, size: int) -> None:
        label = f"reproducible_{op}_{dtype}" + ("" if size == 2 else f"_of_{size}")
        super().__init__(_pair_sum, name=label, dtypes=(dtype,))
        object.__setattr__(self, "divide_by", size if op == "avg" else 1)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "engine_op", f"repro_{op}")
        self.checked.add(dtype)  # the library's own: no trial of two elements (at three ranks, a refusal)

    @property
    def compiled_combine(self) -> str:
        """The engine's op of the same arithmetic (``repro_sum_rows``'s), which its repeated small and
        segmented calls apply to every rank's contribution at once."""
        return self.engine_op

    def apply(self, dst: Any, a: Any, b: Any) -> None:
        if self.size != 2:
            raise CollectivesError(
                f"the reproducible sum of {self.size} ranks combines them all at once, on shared memory only"
            )
        _compiled().repro_pair(dst, a, b, self.divide_by)

    def apply_all(self, dst: Any, parts: Any) -> None:
        _compiled().repro_sum_rows(dst, parts, self.divide_by)


def _compiled() -> Any:
    """The compiled engine's conversion loops; raises where the engine was switched off after the choice
    (the call's other ranks ran it)."""
    compiled = kernels()
    if compiled is None:
        raise CollectivesError("reproducible sum on shared memory: the compiled engine no longer runs")
    return compiled


def _pair_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``_RowsSum``'s function, for a caller that calls it (the ops' trial): a new array."""
    made = np.empty_like(a)
    _compiled().repro_pair(made, a, b, 1)
    return made


_PAIRS = {(dtype, op): _RowsSum(dtype, op, 2) for dtype in ("float32", "float64") for op in _OPS}
_ROWS: dict[tuple[str, str, int], _RowsSum] = {}


def pair_op(size: int, dtype: str, op: str, checked: bool) -> Op | None:
    """The op whose plain reduction is the reproducible sum of ``dtype`` (a name), where one applies: two
    ranks, float32 or float64, the compiled engine running, and calls checked (ranks of other dtypes or
    ops then raise, as their ops' names differ); else ``None``."""
    if size != 2 or not checked or kernels() is None:
        return None
    return _PAIRS.get((dtype, op))


def rows_op(group: Communicator, dtype: str, op: str, algorithm: str, checked: bool) -> Op | None:
    """The op whose shared-memory reduction is the reproducible sum of ``dtype`` (a name) on ``group``, where
    one applies: 3 to 64 ranks that share one node's memory (as an earlier call found, so every rank
    knows it alike), float32 or float64, the compiled engine running, calls checked, and ``algorithm``
    ``"auto"`` or ``"shared_memory"``; else ``None``. The call runs with ``algorithm="shared_memory"``."""
    if not 2 < group.size <= EXACT_IN_FLOAT64 or algorithm not in (AUTO, SHARED_MEMORY) or not checked:
        return None
    if dtype not in ("float32", "float64") or kernels() is None or group.shared is None:
        return None
    key = (dtype, op, group.size)
    made = _ROWS.get(key)
    if made is None:
        made = _ROWS[key] = _RowsSum(dtype, op, group.size)
    return made


def plain_op(
    x: Any, op: Any, out: Any, group: Communicator, check: bool | None, algorithm: str
) -> tuple[Op, str] | None:
    """The reproducible op and the algorithm of an allreduce that needs no more checks than the plain
    call's: a C-contiguous float32 or float64 numpy ``x``, ``op`` ``"sum"`` or ``"avg"``, ``out`` none,
    ``x`` or a C-contiguous writable array of its dtype and shape, and the op of two ranks
    (:func:`pair_op`, with ``algorithm``) or of the ranks of one node (:func:`rows_op`, with the
    shared-memory algorithm); ``None`` for any other call."""
    if x.__class__ is not np.ndarray or op.__class__ is not str:
        return None
    dtype = name_of(x.dtype)
    if (dtype, op) not in _PAIRS or not x.flags.c_contiguous:
        return None
    checking = bool(group.watchdog.check if check is None else check)
    if group.size == 2:
        summing = pair_op(2, dtype, op, checking)
    else:
        summing, algorithm = rows_op(group, dtype, op, algorithm, checking), SHARED_MEMORY
    if summing is None:
        return None
    if out is None or out is x:
        return summing, algorithm
    if out.__class__ is not np.ndarray or out.dtype is not x.dtype or out.shape != x.shape:
        return None
    return (summing, algorithm) if out.flags.c_contiguous and out.flags.writeable else None


def _paired(
    group: Communicator,
    through: Through,
    collective: str,
    x: np.ndarray,
    flat: np.ndarray,
    pair: Op,
    out: Any,
    shape: tuple[int, ...],
    algorithm: str,
    check: bool | None,
    root: int,
    counts: Sequence[int] | None,
) -> Any:
    """``collective`` of ``flat`` by the op ``pair``: the plain call's path, into ``out`` where it is
    C-contiguous; what the collective returns, shaped as the result."""
    into = out.reshape(-1) if out is not None and out.flags.c_contiguous else None
    if flat.dtype != x.dtype:  # not a view of x: the family's copy of it
        flat = flat.astype(x.dtype)
    elif out is x and into is not None:
        into = flat  # in place, as the call's repeats can run it (a view of x apart from flat would not)
    if collective == "allreduce":
        result = through.allreduce(flat, pair, out=into, algorithm=algorithm, comm=group, check=check)
    elif collective == "reduce":
        assert through.reduce is not None
        result = through.reduce(flat, pair, root, out=into, algorithm=algorithm, comm=group, check=check)
        if result is None:
            return None
    else:
        assert through.reduce_scatter is not None
        result = through.reduce_scatter(
            flat, pair, counts=counts, out=into, algorithm=algorithm, comm=group, check=check
        )
    return out if result is into and into is not None else deliver(result, out, shape)


ALIASES = {"sum": "reproducible sum", "avg": "reproducible avg"}
"""The op under which an in-place reproducible allreduce's repeat is kept too (``repeats.keep_alias``), for
the API to find it as a plain call's (the engine's ``repeat_in_place``)."""


def went_on(lean: Any, status: int, flat: Any) -> None:
    """The rest of an in-place reproducible repeat that the API started in the engine (``lean.went_on``
    on ``flat``, the input's flat view), a mismatch raised as the reproducible call's."""
    try:
        lean.went_on(status, flat, flat)
    except PeerInputError:
        raise
    except MismatchError as error:
        raise named_mismatch("allreduce", error) from error


def named_mismatch(collective: str, error: MismatchError) -> MismatchError:
    """A mismatch of the reduction's call as the reproducible call's: dtypes, ops or counts differ."""
    return MismatchError(
        f"reproducible {collective}: the ranks' dtypes, ops or counts differ ({error})", error.fields
    )


@contextmanager
def _mismatch_named(collective: str) -> Iterator[None]:
    """A mismatch of the reduction's call raised as the reproducible call's (:func:`named_mismatch`; a
    peer's bad input stays what it is)."""
    try:
        yield
    except PeerInputError:
        raise
    except MismatchError as error:
        raise named_mismatch(collective, error) from error


def _gathered(
    group: Communicator,
    through: Through,
    flat: np.ndarray,
    dtype: Any,
    op: str,
    algorithm: str,
    check: bool | None,
    out: Any,
) -> np.ndarray:
    """The reproducible allreduce of ``flat`` by one allreduce: each rank's row of a message, the
    others' zero, or-reduced, so that every rank has every contribution; then summed here (into
    ``out`` where it can be: C-contiguous)."""
    size, name = group.size, name_of(dtype)
    family = FAMILIES["float64" if name == "float64" else "float32"]
    message = gathered_message(flat, family, size, group.rank, (BITS_OF[name], _OPS[op]))
    with _mismatch_named("allreduce"):
        through.allreduce(message, "bor", out=message, algorithm=algorithm, comm=group, check=check)
    into = out if out is not None and out.flags.c_contiguous else None
    result = rows_sum(message, flat.size, family, dtype, divide_by=size if op == "avg" else 1, into=into)
    if result is None:
        raise MismatchError("reproducible allreduce: the ranks' dtypes or ops differ", {"dtype or op": {}})
    return result


def reduced(
    group: Communicator | None,
    through: Through,
    collective: str,
    contributions: Sum,
    *,
    op: str = "sum",
    root: int = 0,
    counts: Sequence[int] | None = None,
    algorithm: str = AUTO,
    check: bool | None = None,
    divide_by: int | None = None,
) -> np.ndarray | None:
    """The reproducible sum of every rank's ``contributions``, flat: all, the root's, or this rank's share.

    ``group`` ``None``: this rank's contributions alone, without communication. ``divide_by``:
    the sum's divisor, by default the world size for ``avg``.

    Raises:
        MismatchError: on every rank, where the ranks' dtypes or ops differ.
        CollectivesError: on every rank, past ``MOST_CONTRIBUTIONS`` contributions.
    """
    size, rank = (1, 0) if group is None else (group.size, group.rank)
    family = contributions.family
    count = contributions.codes.size
    busiest = max(contributions.adds - 1, 0).bit_length()  # adds rounded up to a power of two, as its log
    kind, how = BITS_OF[name_of(contributions.dtype)], _OPS[op]
    trailer = np.array([kind, -kind, how, -how, busiest], np.int8)
    message = np.concatenate([contributions.codes, trailer])
    if size > 1:
        message = through.allreduce(message, "max", algorithm=AUTO, comm=group, check=check)
    agreed, trailer = message[:count], message[count:].astype(np.int64)
    if trailer[0] != -trailer[1] or trailer[2] != -trailer[3]:
        raise MismatchError(
            f"reproducible {collective}: the ranks' dtypes or ops differ", {"dtype or op": {}}
        )
    most = size << int(trailer[4])
    if most > MOST_CONTRIBUTIONS:
        raise CollectivesError(
            f"reproducible {collective}: {size} ranks of up to {1 << int(trailer[4])} contributions each "
            f"exceed the {MOST_CONTRIBUTIONS} a sum takes"
        )
    specials = None
    if (agreed == SPECIAL).any():
        specials = contributions.specials()
        if size > 1:
            specials = through.allreduce(specials, "bor", algorithm=AUTO, comm=group, check=check)
    exact = family.words == 1 and most <= EXACT_IN_FLOAT64
    wire = np.float64 if exact else np.int64
    words = contributions.words(agreed, wire)
    per = words.size // max(count, 1)
    if divide_by is None:
        divide_by = size if op == "avg" else 1
    if size > 1 and collective == "allreduce":
        words = through.allreduce(words, "sum", out=words, algorithm=algorithm, comm=group, check=check)
    elif size > 1 and collective == "reduce":
        assert through.reduce is not None  # passed by reduce's callers
        words = through.reduce(words, "sum", root, algorithm=algorithm, comm=group, check=check)
        if words is None:
            return None
    elif collective == "reduce_scatter":
        assert counts is not None  # reduce-scatter's callers give each rank's count
        lo = sum(counts[:rank])
        agreed = agreed[lo : lo + counts[rank]]
        specials = None if specials is None else specials[lo : lo + counts[rank]]
        if size > 1:
            assert through.reduce_scatter is not None
            shares = [c * per for c in counts]
            words = through.reduce_scatter(
                words, "sum", counts=shares, algorithm=algorithm, comm=group, check=check
            )
    return finish(words, agreed, family, contributions.dtype, divide_by=divide_by, specials=specials)


def shares_of(
    shape: tuple[int, ...], counts: Sequence[int] | None, size: int, rank: int
) -> tuple[list[int], tuple[int, ...]]:
    """Each rank's elements of a reduce-scatter of ``shape``, and the shape of this rank's share."""
    count = int(np.prod(shape))
    if counts is None:
        rows = shape[0] if shape else 1
        if not shape or rows % size:
            raise InvalidBufferError(f"reduce_scatter: x has {rows} rows, not a multiple of the {size} ranks")
        return [count // size] * size, (rows // size, *shape[1:])
    given = [int(c) for c in counts]
    if len(given) != size or any(c < 0 for c in given) or sum(given) != count:
        raise InvalidBufferError(
            f"reduce_scatter: counts {list(counts)} must be {size} non-negative counts summing to {count}"
        )
    return given, (given[rank],)


def check_call(
    collective: str,
    x: Any,
    op: "str | ReduceOp",
    out: Any,
    group: Communicator,
    root: int = 0,
    counts: Sequence[int] | None = None,
) -> tuple[np.ndarray, str, list[int] | None, tuple[int, ...]] | None:
    """A reproducible call's checks: ``None`` for integers (their own call sums them), else the input
    flat in its family's dtype, the op's name, each rank's share (a reduce-scatter's) and the result's shape.
    """
    name = _check_op(op)
    if _integer(x):
        return None
    flat = _flat(x)
    shape, shares = x.shape, None
    if collective == "reduce" and not (isinstance(root, int) and 0 <= root < group.size):
        raise InvalidRootError(f"root {root!r} is not a rank of this communicator of {group.size}")
    if collective == "reduce_scatter":
        shares, shape = shares_of(x.shape, counts, group.size, group.rank)
    check_out(out, x.dtype, shape)
    return flat, name, shares, shape


def reproducibly(
    collective: str,
    x: Any,
    op: "str | ReduceOp",
    out: Any,
    algorithm: str,
    comm: "Communicator | MPI.Comm | None",
    check: bool | None,
    through: Through,
    *,
    root: int = 0,
    counts: Sequence[int] | None = None,
) -> Any:
    """``collective`` (``allreduce``, ``reduce`` or ``reduce_scatter``) with ``reproducible=True``.

    Integer arrays pass through to the collective itself (their sums are exact).
    Returns what the collective returns: the result, the root's (``None``
    elsewhere), or this rank's share.
    """
    group = communicator_of(comm)
    if collective == "allreduce" and group.size > 1:
        plain = plain_op(x, op, out, group, check, algorithm)
        if plain is not None:  # the common call, its checks the plain call's (no context manager: 0.7 us)
            try:
                result = through.allreduce(x, plain[0], out=out, algorithm=plain[1], comm=group, check=check)
            except PeerInputError:
                raise
            except MismatchError as error:
                raise named_mismatch(collective, error) from error
            if out is x and isinstance(op, str) and kernels() is not None:  # repeats: one engine call
                made = allreduce_key(x, x, plain[0], plain[1], check)
                keep_alias(group, made, allreduce_key(x, x, ALIASES[op], algorithm, check))
            return result
    checks = checked(
        group, collective, lambda: check_call(collective, x, op, out, group, root, counts),
        algorithm=algorithm, check=check,
    )  # fmt: skip
    if checks is None:
        run = getattr(through, collective)
        if collective == "reduce":
            return run(x, op, root, out=out, algorithm=algorithm, comm=group, check=check)
        extra = {"counts": counts} if collective == "reduce_scatter" else {}
        return run(x, op, out=out, algorithm=algorithm, comm=group, check=check, **extra)
    flat, name, shares, shape = checks
    dtype, checking = name_of(x.dtype), _checked(group, check)
    pair = pair_op(group.size, dtype, name, checking)
    if pair is None and collective != "reduce":  # no rooted reduce runs on shared memory
        pair = rows_op(group, dtype, name, algorithm, checking)
        algorithm = algorithm if pair is None else SHARED_MEMORY
    if pair is not None:
        with _mismatch_named(collective):
            return _paired(
                group, through, collective, x, flat, pair, out, shape, algorithm, check, root, shares
            )  # fmt: skip
    if collective == "allreduce" and gathers(group.size, flat.size, flat.itemsize, _checked(group, check)):
        summed = _gathered(group, through, flat, x.dtype, name, algorithm, check, out)
        return out if summed is out else deliver(summed, out, shape)
    result = reduced(
        group, through, collective, _plain(x, flat), op=name, root=root, counts=shares, algorithm=algorithm,
        check=check,
    )  # fmt: skip
    return None if result is None else deliver(result, out, shape)
