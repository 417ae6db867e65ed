"""``explain(..., reproducible=True)``: the route, steps and predicted cost of a reproducible call."""

import pytest

import collectives as C
from collectives import reproducible
from collectives.explanation import Explanation


def _explained(
    collective: str, count: int, dtype: str, size: int, op: str = "sum", per_node: int | None = None
) -> Explanation:
    """``per_node``: ranks to a node (by default all on one, sharing its memory; 1: none share memory)."""
    return C.explain(
        collective, count, dtype, world_size=size, ranks_per_node=per_node or size, op=op, reproducible=True
    )


@pytest.mark.skipif(reproducible.kernels() is None, reason="the two ranks' op needs the compiled engine")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_ranks_cost_the_plain_call_with_a_heavier_reduction(dtype: str) -> None:
    explained = _explained("allreduce", 1 << 18, dtype, 2)
    cost = explained.reproducible
    assert cost is not None and "two contributions" in cost.route
    (step,) = cost.steps
    chosen = next(c for c in explained.candidates if c.algorithm == explained.choice)
    assert step.algorithm == explained.choice and step.nbytes == (1 << 18) * (4 if dtype == "float32" else 8)
    assert cost.plain == chosen.time < step.seconds == cost.time
    assert cost.ratio == pytest.approx(cost.time / chosen.time)
    text = str(explained)
    assert "reproducible=True: the plain call" in text and f"({cost.ratio:.2f}x)" in text
    assert f"reproducible {cost.time * 1e6:.2f} us" in repr(explained)


@pytest.mark.skipif(reproducible.kernels() is None, reason="the op of every rank needs the compiled engine")
@pytest.mark.parametrize(
    ("collective", "dtype", "size"), [("allreduce", "float32", 4), ("reduce_scatter", "float64", 3)]
)
def test_ranks_of_one_node_cost_the_plain_call_on_shared_memory_with_a_heavier_reduction(
    collective: str, dtype: str, size: int
) -> None:
    explained = _explained(collective, 1 << 18, dtype, size)
    cost = explained.reproducible
    assert cost is not None and cost.route.startswith("on shared memory")
    (step,) = cost.steps
    shared = next(c for c in explained.candidates if c.algorithm == "shared_memory")
    assert step.algorithm == "shared_memory" and step.nbytes == (1 << 18) * (4 if dtype == "float32" else 8)
    assert shared.time < step.seconds == cost.time
    assert _explained(collective, 1 << 18, "float16", size).reproducible.route.startswith("two collectives")
    assert _explained(collective, 1 << 18, dtype, size, per_node=1).reproducible.route.startswith("two")


def test_a_small_allreduce_of_a_few_ranks_is_gathered() -> None:
    cost = _explained("allreduce", 1000, "float32", 4, per_node=1).reproducible
    assert cost is not None and cost.route.startswith("gathered")
    gathered, summed = cost.steps
    assert gathered.work == "allreduce of 4008 int32, op bor" and gathered.nbytes == 4 * 1002 * 4
    assert gathered.algorithm is not None and summed.algorithm is None and summed.nbytes == 4 * 4000
    assert cost.time == pytest.approx(gathered.seconds + summed.seconds)


@pytest.mark.parametrize(
    ("collective", "dtype", "size", "wire", "per"),
    [("allreduce", "float32", 4, "float64", 1), ("allreduce", "float16", 3, "float64", 1),
     ("reduce_scatter", "float64", 8, "int64", 2), ("allreduce", "bfloat16", 65, "int64", 1)],
)  # fmt: skip
def test_a_large_call_costs_two_collectives_and_the_conversion(
    collective: str, dtype: str, size: int, wire: str, per: int
) -> None:
    count = 1 << 18
    explained = _explained(collective, count, dtype, size, per_node=1)
    cost = explained.reproducible
    assert cost is not None and cost.route.startswith("two collectives") and cost.note is not None
    names = [s.name for s in cost.steps]
    assert names == ["codes", "codes agreed", "cut into words", "words summed", "rounded back"]
    steps = dict(zip(names, cost.steps, strict=True))
    assert steps["codes agreed"].work == f"allreduce of {count + 5} int8, op max"
    assert steps["words summed"].work == f"{collective} of {count * per} {wire}, op sum"
    assert steps["words summed"].nbytes == count * per * 8
    local = ("codes", "cut into words", "rounded back")
    assert all((s.algorithm is None) == (s.name in local) for s in cost.steps)
    assert cost.time == pytest.approx(sum(s.seconds for s in cost.steps))
    assert cost.time > cost.plain > 0
    # the words' collective is predicted as explain predicts that plain call
    alone = C.explain(collective, count * per, wire, world_size=size, ranks_per_node=1)
    assert steps["words summed"].algorithm == alone.choice
    predicted = next(c.time for c in alone.candidates if c.algorithm == alone.choice)
    assert steps["words summed"].seconds == pytest.approx(predicted)


def test_unchecked_calls_are_not_gathered_and_integers_cost_nothing_more() -> None:
    checked = _explained("allreduce", 100, "float32", 4, per_node=1).reproducible
    assert checked is not None and checked.route.startswith("gathered")
    comm = C.Communicator(check=False)
    try:
        cost = C.explain("allreduce", 100, "float32", world_size=4, comm=comm, reproducible=True).reproducible
    finally:
        comm.free()
    assert cost is not None and cost.route.startswith("two collectives")  # mismatched ranks would not raise
    integers = _explained("allreduce", 100, "int32", 8).reproducible
    assert integers is not None and integers.steps == () and integers.ratio == 1.0
    assert "exact" in integers.route
    alone = _explained("allreduce", 100, "float32", 1).reproducible
    assert alone is not None and [s.algorithm for s in alone.steps] == [None, None, None]


def test_what_reproducible_cannot_explain_raises() -> None:
    with pytest.raises(C.UnsupportedOpError, match="'sum' or 'avg'"):
        _explained("allreduce", 100, "float32", 4, op="max")
    with pytest.raises(ValueError, match="allreduce and reduce_scatter"):
        _explained("allgather", 100, "float32", 4)
    with pytest.raises(ValueError, match="numpy arrays"):
        C.explain("allreduce", 100, "float32", world_size=2, device=True, reproducible=True)
    assert C.explain("allreduce", 100, "float32", world_size=2).reproducible is None


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("count", [100, 40000])
def test_persistent_inits_name_the_algorithms_their_starts_run(size: int, count: int) -> None:
    from collectives.algorithms import ALGORITHMS
    from tests.conftest import run_ranks
    from tests.reproducible_cases import contributions, model

    parts = contributions("float32", size, count, seed=90, specials=False)

    def call(comm: C.Communicator) -> tuple[str, str, str, bytes, bytes]:
        x = parts[comm.rank]
        started = C.allreduce_init(x, comm=comm, reproducible=True)
        ring = C.allreduce_init(x, algorithm="ring", comm=comm, reproducible=True)
        plain = C.allreduce_init(x.copy(), comm=comm)
        first, second = started(), ring()
        return started.algorithm, ring.algorithm, plain.algorithm, first.tobytes(), second.tobytes()

    expected = model(parts, "float32").tobytes()
    for auto, ring, plain, first, second in run_ranks(size, call):
        assert first == second == expected
        assert "auto" not in auto and "auto" not in ring
        if size == 2 and reproducible.kernels() is not None:  # the plain call with the pair op
            assert auto == plain and ring == "ring"
        else:
            steps = dict(part.split(": ") for part in auto.split(", "))
            assert all(name in ALGORITHMS for name in steps.values()), auto
            summing = "contributions gathered" if count == 100 else "words summed"
            assert set(steps) == ({summing} if count == 100 else {"codes agreed", summing}), auto
            assert dict(part.split(": ") for part in ring.split(", "))[summing] == "ring"
