"""User-defined reduction ops (collectives.Op) on every algorithm over loopback ranks."""

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives as C
from collectives import MismatchError, Op, PeerInputError, UnsupportedOpError
from collectives.algorithms import ALGORITHMS, rank_program
from collectives.algorithms.base import implements
from collectives.execute import execute
from collectives.ops import DTYPES, FLOAT_DTYPES
from collectives.ordering import keeps_rank_order
from collectives.transport.loopback import LoopbackWorld

from .conftest import run_ranks

_REDUCING = ("allreduce", "reduce_scatter", "reduce")
_SIZES = (1, 2, 3, 4, 5, 8, 13)


def _algorithms(collective: str) -> list[str]:
    return [name for name, module in ALGORITHMS.items() if implements(module, collective)]


def _unpack(x: np.ndarray) -> list[np.ndarray]:
    return [(x >> shift) & 0xFF for shift in (0, 8, 16, 24)]


def matmul2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The product of 2x2 matrices over the integers mod 256, each packed into one uint32: not commutative."""
    a0, a1, a2, a3 = _unpack(a)
    b0, b1, b2, b3 = _unpack(b)
    c = [(a0 * b0 + a1 * b2), (a0 * b1 + a1 * b3), (a2 * b0 + a3 * b2), (a2 * b1 + a3 * b3)]
    return ((c[0] & 0xFF) | ((c[1] & 0xFF) << 8) | ((c[2] & 0xFF) << 16) | ((c[3] & 0xFF) << 24)).astype(
        a.dtype
    )


MATMUL = Op(matmul2, commutative=False)
LOGSUMEXP = Op(np.logaddexp, identity=-np.inf)
MAX_PLUS = Op(np.maximum, identity=-np.inf, name="max_plus")  # the (max, +) semiring's addition
# the (min, +) semiring's addition, as a function of two arrays
MIN_PLUS = Op(lambda a, b: np.minimum(a, b), identity=np.inf, name="min_plus")


def _matrices(size: int, count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32) for _ in range(size)]


def _in_order(xs: list[np.ndarray]) -> np.ndarray:
    result = xs[0]
    for x in xs[1:]:
        result = matmul2(result, x)
    return result


def _call(collective: str, x: np.ndarray, op: Any, algorithm: str, comm: C.Communicator) -> Any:
    if collective == "allreduce":
        return C.allreduce(x, op, algorithm=algorithm, comm=comm)
    if collective == "reduce_scatter":
        return C.reduce_scatter(x, op, algorithm=algorithm, comm=comm)
    return C.reduce(x, op, root=0, algorithm=algorithm, comm=comm)


def _expected_share(collective: str, whole: np.ndarray, rank: int, size: int) -> np.ndarray | None:
    if collective == "allreduce":
        return whole
    if collective == "reduce_scatter":
        share = whole.size // size
        return whole[rank * share : (rank + 1) * share]
    return whole if rank == 0 else None


def test_an_op_is_named_alike_on_every_rank_and_fits_the_signature() -> None:
    assert LOGSUMEXP.name == "logaddexp" and LOGSUMEXP.commutative and not MATMUL.commutative
    assert MATMUL.name == f"{__name__}.matmul2"
    assert MIN_PLUS.name == "min_plus"
    for op in (LOGSUMEXP, MATMUL, MAX_PLUS, MIN_PLUS, Op(lambda a, b: a + b)):
        assert len(op.agreed_name.encode()) <= 8
    # two lambdas on different lines have different names
    first, second = Op(lambda a, b: a), Op(lambda a, b: b)
    assert first.agreed_name != second.agreed_name
    assert Op(np.add, commutative=False).agreed_name != Op(np.add).agreed_name
    assert "non-commutative" in repr(MATMUL)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((3,), {}, "needs a function"),
        ((np.add,), {"name": "sum"}, "built-in"),
        ((np.negative,), {}, "takes 1 inputs"),
        ((np.add,), {"dtypes": ["complex64"]}, "unsupported dtype"),
        ((np.add,), {"name": ""}, "non-empty"),
    ],
)
def test_bad_ops_are_refused_when_made(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(C.CollectivesError, match=message):
        Op(*args, **kwargs)


@pytest.mark.parametrize("collective", _REDUCING)
@pytest.mark.parametrize("size", _SIZES)
def test_semirings_and_logsumexp_on_every_algorithm(collective: str, size: int) -> None:
    count = 3 * size
    rng = np.random.default_rng(size)
    floats = [rng.normal(size=count).astype(np.float64) for _ in range(size)]
    whole = {
        LOGSUMEXP: np.logaddexp.reduce(np.stack(floats), axis=0),
        MAX_PLUS: np.max(np.stack(floats), axis=0),
        MIN_PLUS: np.min(np.stack(floats), axis=0),
    }
    for algorithm in ["auto", *_algorithms(collective)]:
        for op, expected in whole.items():

            def body(comm: C.Communicator, op: Op = op, algorithm: str = algorithm) -> Any:
                return _call(collective, floats[comm.rank], op, algorithm, comm)

            results = run_ranks(size, body)
            for rank, result in enumerate(results):
                want = _expected_share(collective, expected, rank, size)
                if want is None:
                    assert result is None
                else:
                    assert np.allclose(result, want, rtol=1e-12), (collective, algorithm, op, rank)


@pytest.mark.parametrize("collective", _REDUCING)
@pytest.mark.parametrize("size", _SIZES)
def test_a_non_commutative_op_runs_in_rank_order_or_names_the_algorithm(collective: str, size: int) -> None:
    count = 2 * size
    xs = _matrices(size, count, size)
    whole = _in_order(xs)
    for algorithm in ["auto", *_algorithms(collective)]:

        def body(comm: C.Communicator, algorithm: str = algorithm) -> Any:
            try:
                return _call(collective, xs[comm.rank], MATMUL, algorithm, comm)
            except UnsupportedOpError as error:
                return error

        results = run_ranks(size, body)
        refused = [r for r in results if isinstance(r, UnsupportedOpError)]
        if refused:
            assert algorithm != "auto", (collective, size)
            assert len(refused) == size, results  # every rank alike
            assert f"algorithm {algorithm!r}" in str(refused[0]) and "not commutative" in str(refused[0])
            continue
        for rank, result in enumerate(results):
            want = _expected_share(collective, whole, rank, size)
            assert (result is None) if want is None else np.array_equal(result, want), (algorithm, rank)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 8])
def test_the_order_check_agrees_with_the_executor(size: int) -> None:
    """Run each schedule with no check at all: keeps_rank_order is right exactly where the result is."""
    count = 2 * size + 1
    xs = _matrices(size, count, 7)
    whole = _in_order(xs)
    for algorithm in _algorithms("allreduce"):

        def body(transport: Any, algorithm: str = algorithm) -> np.ndarray:
            program = rank_program("allreduce", algorithm, size, count, rank=transport.rank)
            buffer = xs[transport.rank].copy()
            execute(program, transport, C.backends.backend_for(buffer), buffer, MATMUL)
            return buffer

        results = LoopbackWorld(size, timeout=30).run(body)
        exact = all(np.array_equal(r, whole) for r in results)
        assert exact == keeps_rank_order("allreduce", algorithm, size, count), algorithm


def test_the_order_check_scales_to_many_ranks() -> None:
    """From the ranks' programs, stopping at the first reduction out of order: cheap at hundreds of ranks."""
    assert keeps_rank_order("allreduce", "tree", 256, 1 << 20)
    assert keeps_rank_order("reduce", "direct", 256, 1000, root=0)
    assert not keeps_rank_order("reduce", "direct", 256, 1000, root=255)  # the root's own comes first
    assert not keeps_rank_order("allreduce", "ring", 256, 1 << 20)
    assert not keeps_rank_order("reduce_scatter", "ring", 256, 256 * 4)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_a_non_commutative_reduce_reaches_every_root_in_order(size: int) -> None:
    """Where no reduce algorithm keeps the order at a root, auto runs an allreduce that does."""
    xs = _matrices(size, 7, 3)
    whole = _in_order(xs)
    for root in range(size):

        def body(comm: C.Communicator, root: int = root) -> Any:
            return C.reduce(xs[comm.rank], MATMUL, root=root, comm=comm)

        results = run_ranks(size, body)
        assert np.array_equal(results[root], whole), root
        assert all(r is None for k, r in enumerate(results) if k != root)


@pytest.mark.parametrize(("op", "pick"), [(MIN_PLUS, np.min), (MAX_PLUS, np.max)])
def test_a_tropical_matrix_vector_product_across_ranks(op: Op, pick: Any) -> None:
    """One Bellman-Ford step in the (min, +) semiring (and its (max, +) twin), rows spread over ranks.

    Rank r holds rows ``r::P`` of the weights and their distances; its partial
    product is reduced by the semiring's addition, which must give the whole one.
    """
    size, n = 4, 9
    rng = np.random.default_rng(5)
    weights = rng.integers(1, 20, (n, n)).astype(np.float64)
    distances = rng.integers(0, 50, n).astype(np.float64)
    whole = pick(distances[:, None] + weights, axis=0)

    def body(comm: C.Communicator) -> np.ndarray:
        mine = slice(comm.rank, n, size)
        partial = pick(distances[mine, None] + weights[mine], axis=0)
        return C.allreduce(partial, op, comm=comm)

    for result in run_ranks(size, body):
        assert np.array_equal(result, whole)


def test_a_non_commutative_reduce_scatter_with_uneven_counts() -> None:
    size = 4
    counts = [3, 0, 5, 1]
    xs = _matrices(size, sum(counts), 11)
    whole = _in_order(xs)

    def body(comm: C.Communicator) -> np.ndarray:
        return C.reduce_scatter(xs[comm.rank], MATMUL, counts=counts, comm=comm)

    starts = np.cumsum([0, *counts])
    for rank, result in enumerate(run_ranks(size, body)):
        assert np.array_equal(result, whole[starts[rank] : starts[rank + 1]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_reduces_as_the_built_in_op_or_is_refused_by_name(dtype: str) -> None:
    kind = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def body(comm: C.Communicator) -> Any:
        x = (np.arange(6) * (comm.rank + 1) % 7).astype(kind)
        mine = C.allreduce(x, MAX_PLUS, comm=comm)
        try:
            smooth = C.allreduce(x, LOGSUMEXP, comm=comm)
        except UnsupportedOpError as error:
            smooth = error
        return mine, C.allreduce(x, "max", comm=comm), smooth

    for mine, builtin, smooth in run_ranks(3, body):
        assert mine.dtype == kind and mine.tobytes() == builtin.tobytes()
        if dtype in FLOAT_DTYPES:
            assert smooth.dtype == kind
        else:
            assert isinstance(smooth, UnsupportedOpError) and f"failed on two {dtype} arrays" in str(smooth)


def test_ranks_passing_different_ops_raise_a_mismatch() -> None:
    def body(comm: C.Communicator) -> Any:
        x = np.arange(4.0)
        try:
            return C.allreduce(x, LOGSUMEXP if comm.rank == 0 else MAX_PLUS, comm=comm)
        except MismatchError as error:
            return error

    results = run_ranks(3, body)
    assert all(isinstance(r, MismatchError) for r in results)
    assert "op" in str(results[0])
    # each rank's note says which op its signature's short name stands for
    assert "'logaddexp' is" in results[0].__notes__[-1] and "'max_plus' is" in results[1].__notes__[-1]


def test_an_op_that_fails_on_the_dtype_is_refused_before_the_call() -> None:
    bitwise = Op(np.bitwise_xor, name="xor_again")

    def body(comm: C.Communicator) -> Any:
        x = np.arange(4.0) if comm.rank == 0 else np.arange(4).astype(np.float64)
        try:
            return C.allreduce(x, bitwise, comm=comm)
        except (UnsupportedOpError, PeerInputError) as error:
            return error

    results = run_ranks(2, body)
    assert all(isinstance(r, UnsupportedOpError) for r in results)
    assert "failed on two float64 arrays" in str(results[0])


def test_repeated_calls_and_in_place_take_the_custom_op() -> None:
    def body(comm: C.Communicator) -> list[np.ndarray]:
        out = []
        for i in range(3):
            x = np.full(5, float(comm.rank + i))
            C.allreduce(x, MAX_PLUS, out=x, comm=comm)
            out.append(x)
        return out

    for results in run_ranks(3, body):
        assert [r.tolist() for r in results] == [[2.0] * 5, [3.0] * 5, [4.0] * 5]


def test_device_backends_refuse_custom_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives import buffers
    from collectives.backends.numpy_backend import NumpyBackend

    class Elsewhere(NumpyBackend):
        name = "cupy"  # a stand-in: the device backends reduce with their own kernels

    monkeypatch.setattr(buffers, "backend_for", lambda array: Elsewhere())
    op = Op(np.logaddexp, name="logaddexp_device")

    def body(comm: C.Communicator) -> Any:
        try:
            return C.allreduce(np.ones(3), op, comm=comm)
        except UnsupportedOpError as error:
            return error

    (result,) = run_ranks(1, body)
    assert isinstance(result, UnsupportedOpError)
    assert "numpy arrays only, not on cupy arrays" in str(result)


def test_explain_rejects_the_algorithms_out_of_rank_order_for_a_non_commutative_op() -> None:
    explanation = C.explain("allreduce", 1 << 20, "uint32", world_size=5, op=MATMUL)
    reasons = {r.algorithm: r.reasons for r in explanation.rejected}
    assert "out of rank order" in reasons["ring"][0]
    assert explanation.choice is not None and keeps_rank_order("allreduce", explanation.choice, 5, 1 << 20)
    commutative = C.explain("allreduce", 1 << 20, world_size=5, op=LOGSUMEXP)
    assert "ring" not in {r.algorithm for r in commutative.rejected}
