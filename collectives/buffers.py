"""Each collective's checks of its arguments and the buffers it works in: the checked call dispatch runs.

Every builder takes the communicator, the algorithm asked for and the call's
arguments as the user gave them (:class:`~collectives.dispatch.CallArguments`).
"""

__all__ = [
    "allgather_job",
    "allreduce_job",
    "alltoall_job",
    "barrier_job",
    "broadcast_job",
    "deliver",
    "gather_job",
    "narrowed",
    "reduce_job",
    "reduce_scatter_job",
    "scatter_job",
    "widened",
]

import operator
from collections.abc import Sequence
from typing import Any, cast

from .backends import ArrayBackend, adopt, backend_for
from .communicator import Communicator
from .dispatch import CallArguments, CheckedCall
from .errors import CollectivesError, InvalidBufferError, UnsupportedOpError
from .ops import ReduceOp, get_op, itemsize
from .selector import check_algorithm
from .specs import check_root


def _inspect(
    x: Any, op: "str | ReduceOp | None", collective: str, algorithm: str
) -> tuple[ArrayBackend, ReduceOp | None, int]:
    """The backend of ``x``, the checked op, and the bytes per element; raises on a bad algorithm name."""
    backend = backend_for(x)
    dtype = backend.dtype_name(x)
    check_algorithm(collective, algorithm)
    if op is None:
        return backend, None, itemsize(dtype)
    reduce_op = get_op(op)
    reduce_op.check_dtype(dtype)
    if reduce_op.custom and dtype not in reduce_op.checked:  # type: ignore[attr-defined]
        _try_custom(backend, reduce_op, x, dtype)
    return backend, reduce_op, itemsize(dtype)


def _try_custom(backend: ArrayBackend, op: ReduceOp, x: Any, dtype: str) -> None:
    """Raise unless the user's ``op`` runs on numpy arrays of ``dtype``: a trial on two elements, once.

    A function that fails mid-collective would break the communicator; failing
    here, before the ranks agree, tells the others instead.
    """
    if backend.name != "numpy":
        raise UnsupportedOpError(
            f"custom op {op.name!r} runs on numpy arrays only, not on {backend.name} arrays"
        )
    a, b, out = (backend.empty(2, x) for _ in range(3))
    a[:] = 1
    b[:] = 2
    try:
        backend.reduce_into(op, out, a, b)
    except Exception as error:
        raise UnsupportedOpError(
            f"custom op {op.name!r} failed on two {dtype} arrays: {type(error).__name__}: {error}"
        ) from error
    op.checked.add(dtype)  # type: ignore[attr-defined]


def _check_out(backend: ArrayBackend, out: Any, x: Any, shape: tuple[int, ...]) -> None:
    """Raise unless ``out`` is a writable array of ``x``'s kind and dtype, of ``shape``."""
    if not backend.owns(out):
        raise InvalidBufferError(f"out is a {type(out).__name__}, but the input is a {type(x).__name__}")
    if out.dtype != x.dtype:
        raise InvalidBufferError(f"out has dtype {out.dtype}, expected {x.dtype}")
    if tuple(out.shape) != shape:
        raise InvalidBufferError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if not backend.writable(out):
        raise InvalidBufferError("out is read-only")


def _rooted(
    group: Communicator, backend: ArrayBackend, x: Any, root: int, out: Any
) -> tuple[int, tuple[int, ...]]:
    """A broadcast's or reduce's checked root, then its shape, ``x``'s, which ``out`` must have."""
    root = check_root(root, group.size)
    shape = tuple(x.shape)
    if out is not None:
        _check_out(backend, out, x, shape)
    return root, shape


def _workspace(backend: ArrayBackend, out: Any, count: int, like: Any) -> tuple[Any, bool]:
    """A contiguous 1-D buffer for the result: ``out`` itself when it can be, and whether it is."""
    if out is not None:
        view = backend.flat_view(out)
        if view is not None:
            return view, True
    return backend.empty(count, like), False


def deliver(backend: ArrayBackend, work: Any, in_out: bool, out: Any, shape: tuple[int, ...]) -> Any:
    """The result in ``work``, as ``out`` when given (``work`` may be it already), else of ``shape``."""
    if in_out:
        return out
    if out is None:
        return work.reshape(shape)
    backend.copy(out, work)
    return out


def allreduce_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """An allreduce's checked arguments and its workspace."""
    op = given.op
    x, out = adopt(given.x), adopt(given.out)  # other CUDA arrays as CuPy views, no copy
    backend, checked_op, item_bytes = _inspect(x, op, "allreduce", algorithm)
    reduce_op = get_op(cast(str, op)) if checked_op is None else checked_op  # get_op names a missing op
    shape = tuple(x.shape)
    if out is not None:
        _check_out(backend, out, x, shape)
    work, in_out = _workspace(backend, out, x.size, x)
    source = None
    if not (in_out and out is x):
        # the schedule reads x where it first needs each chunk, sparing a copy into work
        source = backend.flat_view(x)
        if source is None or backend.shares_memory(source, work):
            backend.copy(work, x)
            source = None
    return CheckedCall(
        "allreduce", algorithm, backend, reduce_op, item_bytes, x.size, backend.dtype_name(x), work,
        source=source, shape=shape, on_shared=True, out=out, in_out=in_out,
        copied=source is None and not (in_out and out is x),
    )  # fmt: skip


def reduce_scatter_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A reduce-scatter's checked arguments and the array its share goes to."""
    op, counts = given.op, given.counts
    x, out = adopt(given.x), adopt(given.out)  # other CUDA arrays as CuPy views, no copy
    backend, reduce_op, item_bytes = _inspect(x, op, "reduce_scatter", algorithm)
    size, rank = group.size, group.rank
    shares, share_shape, _ = _shares_of("reduce_scatter", x, counts, size, rank, x.size)
    if out is None:
        out = backend.empty(shares[rank], x).reshape(share_shape)
    else:
        _check_out(backend, out, x, share_shape)
    flat = backend.flat_view(x)
    on_shared = reduce_op is not None and flat is not None
    # the shared-memory executor writes the share straight into out, unless out overlaps x
    mine = backend.flat_view(out) if on_shared else None
    if mine is not None and backend.shares_memory(mine, flat):
        mine = None
    return CheckedCall(
        "reduce_scatter", algorithm, backend, reduce_op, item_bytes, x.size, backend.dtype_name(x), None,
        source=x if flat is None else flat, counts=counts, shares=shares, shape=share_shape,
        on_shared=on_shared, result=mine, out=out,
    )  # fmt: skip


def allgather_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """An allgather's checked arguments, with this rank's part in the workspace."""
    return _gathered(group, algorithm, "allgather", given.x, -1, given.counts, given.out)


def gather_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A gather's checked arguments, with this rank's part in the workspace."""
    return _gathered(group, algorithm, "gather", given.x, given.root, given.counts, given.out)


def _gathered(
    group: Communicator,
    algorithm: str,
    collective: str,
    x: Any,
    root: int,
    counts: Sequence[int] | None,
    out: Any,
) -> CheckedCall:
    """An allgather's or a gather's checked arguments, with this rank's part in the workspace."""
    x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
    backend, _, item_bytes = _inspect(x, None, collective, algorithm)
    size, rank = group.size, group.rank
    if collective == "gather":
        root = check_root(root, size)
    total = x.size * size if counts is None else sum(_counts(counts))
    shares, _, whole_shape = _shares_of(collective, x, counts, size, rank, total)
    if counts is not None and x.size != shares[rank]:
        raise InvalidBufferError(f"x has {x.size} elements but counts[{rank}] is {shares[rank]}")
    if out is not None:
        _check_out(backend, out, x, whole_shape)
    gets = collective == "allgather" or rank == root  # where the result goes
    work, in_out = _workspace(backend, out if gets else None, total, x)
    lo = sum(shares[:rank])
    backend.copy(work[lo : lo + shares[rank]], x)
    return CheckedCall(
        collective, algorithm, backend, None, item_bytes, total, backend.dtype_name(x), work, root=root,
        counts=counts, shares=shares, shape=whole_shape, on_shared=collective == "allgather", out=out,
        in_out=in_out,
    )  # fmt: skip


def broadcast_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A broadcast's checked arguments, with the root's data in the workspace."""
    return _rooted_job(group, algorithm, given, "broadcast")


def reduce_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A reduce's checked arguments, with this rank's data in the workspace."""
    return _rooted_job(group, algorithm, given, "reduce")


def _rooted_job(group: Communicator, algorithm: str, given: CallArguments, collective: str) -> CheckedCall:
    """A broadcast's or a reduce's checked arguments and workspace (``out`` itself where it can be).

    A reduce's workspace is a copy of ``x`` on every rank (an algorithm may
    combine partial results in it off the root too), a broadcast's only at the root.
    """
    reduces = collective == "reduce"
    x, out = adopt(given.x), adopt(given.out)  # other CUDA arrays as CuPy views, no copy
    backend, reduce_op, item_bytes = _inspect(x, given.op if reduces else None, collective, algorithm)
    root, shape = _rooted(group, backend, x, given.root, out)
    at_root = group.rank == root
    work, in_out = _workspace(backend, out if at_root or not reduces else None, x.size, x)
    if (at_root or reduces) and not (in_out and out is x):
        backend.copy(work, x)
    return CheckedCall(
        collective, algorithm, backend, reduce_op, item_bytes, x.size, backend.dtype_name(x), work, root=root,
        shape=shape, out=out, in_out=in_out, on_shared=True,
    )  # fmt: skip


def scatter_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A scatter's checked arguments, with the root's data in the workspace."""
    root, counts = given.root, given.counts
    x, out = adopt(given.x), adopt(given.out)
    size, rank = group.size, group.rank
    root = check_root(root, size)
    if x is None:
        if rank == root:
            raise InvalidBufferError(f"scatter needs x at the root, rank {root}")
        if out is None:
            raise InvalidBufferError(
                f"scatter needs out= (or x) on rank {rank}, which is not the root {root}, "
                "to know the shape and dtype of its share"
            )
        like = out
        shares, share_shape = _scatter_shares(out, counts, size, rank)
    else:
        like = x
        shares, share_shape, _ = _shares_of("scatter", x, counts, size, rank, x.size)
    backend, _, item_bytes = _inspect(like, None, "scatter", algorithm)
    if out is not None:
        _check_out(backend, out, like, share_shape)
    total = sum(shares)
    work = backend.empty(total, like)
    if rank == root:
        backend.copy(work, x)
    return CheckedCall(
        "scatter", algorithm, backend, None, item_bytes, total, backend.dtype_name(like), work, root=root,
        counts=counts, shares=shares, shape=share_shape, out=out,
    )  # fmt: skip


def alltoall_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """An alltoall's checked arguments, with the input and this rank's own share in the workspace."""
    x, out = adopt(given.x), adopt(given.out)  # other CUDA arrays as CuPy views, no copy
    backend, _, item_bytes = _inspect(x, None, "alltoall", algorithm)
    size, rank = group.size, group.rank
    shape = tuple(x.shape)
    _check_rows("alltoall", x, size)
    if out is not None:
        _check_out(backend, out, x, shape)
    count = x.size
    share = count // size
    # the schedule's buffer: the input, then the output (see collectives.specs)
    work = backend.empty(2 * count, x)
    backend.copy(work[:count], x)
    # no rank sends to itself, so its share for itself starts in its slot of the output
    mine = rank * share
    backend.copy(work[count + mine : count + mine + share], work[mine : mine + share])
    return CheckedCall(
        "alltoall", algorithm, backend, None, item_bytes, count, backend.dtype_name(x), work, shape=shape,
        out=out,
    )  # fmt: skip


def barrier_job(group: Communicator, algorithm: str, given: CallArguments) -> CheckedCall:
    """A barrier's checked algorithm: no data of the caller's, so no dtype in its signature."""
    import numpy as np  # the schedule's tokens are host bytes, whatever library the user's arrays are from

    check_algorithm("barrier", algorithm)
    tokens = backend_for(np.empty(0, np.uint8))
    return CheckedCall("barrier", algorithm, tokens, None, 1, 0, "", None, on_shared=True)


def _shares_of(
    collective: str, x: Any, counts: Sequence[int] | None, size: int, rank: int, total: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Each rank's share of the buffer, the shape of this rank's share, and the shape of the whole."""
    if counts is not None:
        shares = _counts(counts)
        if len(shares) != size or any(c < 0 for c in shares):
            raise InvalidBufferError(
                f"counts must give {size} non-negative element counts, one per rank; got {tuple(counts)}"
            )
        if sum(shares) != total:
            raise InvalidBufferError(f"counts {shares} add up to {sum(shares)}, not {total}")
        return shares, (shares[rank],), (total,)
    rows = x.shape[0] if x.ndim else 1
    rest = tuple(x.shape[1:])
    if collective in ("allgather", "gather"):
        return (x.size,) * size, tuple(x.shape), (rows * size, *rest)
    _check_rows(collective, x, size, "; pass counts= for unequal shares")
    return (x.size // size,) * size, (rows // size, *rest), tuple(x.shape)


def _scatter_shares(
    out: Any, counts: Sequence[int] | None, size: int, rank: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each rank's share and this rank's share's shape, told by ``out`` alone."""
    if counts is None:
        return (out.size,) * size, tuple(out.shape)
    shares, share_shape, _ = _shares_of("scatter", out, counts, size, rank, sum(_counts(counts)))
    return shares, share_shape


def _counts(counts: Sequence[int]) -> tuple[int, ...]:
    """``counts`` as ints; a bool, float or string among them is an error, not a count."""
    try:
        if any(isinstance(c, bool) for c in counts):
            raise TypeError
        return tuple(operator.index(c) for c in counts)
    except TypeError:
        raise InvalidBufferError(f"counts must be integers, got {tuple(counts)!r}") from None


def _check_rows(collective: str, x: Any, size: int, hint: str = "") -> None:
    """Raise unless ``x`` has a first dimension divisible by the world size."""
    if x.ndim == 0 or x.shape[0] % size:
        raise InvalidBufferError(
            f"{collective} needs the first dimension of x (shape {tuple(x.shape)}) to be "
            f"divisible by the world size {size}{hint}"
        )


def widened(x: Any, op: "str | ReduceOp", out: Any) -> Any | None:
    """For ``avg`` of float16: ``x`` in float32, to reduce in that; ``None`` for anything else.

    float16's largest value is 65504, so the sum of a few large values would
    overflow to Inf before the division at the end. Summing and dividing in float32,
    then rounding once to float16, keeps such averages finite and as exact as
    before (twice the bytes on the wire, for float16 averages only). Anything not
    a float16 array, or an ``out`` not float16, is left to the ordinary checks.
    """
    if not (op == "avg" or (isinstance(op, ReduceOp) and op.averages)):
        return None
    try:
        backend = backend_for(x)
        if backend.dtype_name(x) != "float16" or (out is not None and backend.dtype_name(out) != "float16"):
            return None
        return x.astype("float32")
    except (CollectivesError, AttributeError, TypeError):
        return None


def narrowed(result: Any, out: Any) -> Any:
    """A float32 ``result`` of :func:`widened`'s input back in float16: in ``out``, or a new array."""
    if result is None:  # not the root of a reduce
        return None
    if out is None:
        return result.astype("float16")
    if out.size != result.size:
        raise InvalidBufferError(f"out has {out.size} elements; the result has {result.size}")
    backend_for(out).copy(out, result)
    return out
