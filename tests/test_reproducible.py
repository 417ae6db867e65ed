"""Reproducible sums: the same bits with every algorithm, world size, deal and order, as the model says."""

from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives as C
from collectives.algorithms import ALGORITHMS
from collectives.reproducible import FAMILIES, MOST_CONTRIBUTIONS, WORD, Levels, finish
from collectives.reproducible_calls import Sum, Through, reduced
from collectives.selector import rejection_reasons
from tests.conftest import run_ranks
from tests.reproducible_cases import DTYPES, contributions, model, rounded, spread

COUNT = 1000  # elements: each one an independent sum, so 1,000 inputs per dtype a call


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _algorithms(collective: str, size: int, count: int) -> list[str]:
    return [
        name
        for name, module in ALGORITHMS.items()
        if hasattr(module, collective) and not rejection_reasons(collective, name, size, count)
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_model_agrees_with_itself_on_easy_sums(dtype: str) -> None:
    # integers small enough that every order sums them exactly: the model must give them back
    parts = [np.arange(10).astype(C.ReproducibleSum(shape=(1,), dtype=dtype).dtype)] * 3
    assert model(parts, dtype).astype(np.float64).tolist() == [3.0 * i for i in range(10)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", range(1, 9))
def test_every_algorithm_at_every_world_size_gives_the_models_bits(dtype: str, size: int) -> None:
    parts = contributions(dtype, size, COUNT, seed=size)
    expected = model(parts, dtype)
    names = _algorithms("allreduce", size, COUNT)
    assert len(names) >= (1 if size == 1 else 5)

    def call(comm: C.Communicator) -> list[np.ndarray]:
        return [C.allreduce(parts[comm.rank], reproducible=True, algorithm=n, comm=comm) for n in names]

    for rank_results in run_ranks(size, call):
        for name, result in zip(names, rank_results, strict=True):
            assert _same(result, expected), (dtype, size, name, np.flatnonzero(result != expected)[:5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_ranks_order_does_not_matter(dtype: str) -> None:
    parts = contributions(dtype, 5, COUNT, seed=11)
    first = run_ranks(5, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))[0]
    turned = parts[2:] + parts[:2]
    second = run_ranks(5, lambda comm: C.allreduce(turned[comm.rank], reproducible=True, comm=comm))[0]
    assert _same(first, second)
    assert _same(first, model(parts[::-1], dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_it_the_sums_differ(dtype: str) -> None:
    # the inputs are hard enough that two algorithms' plain sums differ somewhere, so the tests above can fail
    parts = contributions(dtype, 5, COUNT, seed=3, specials=False)
    ring = run_ranks(5, lambda comm: C.allreduce(parts[comm.rank], algorithm="ring", comm=comm))[0]
    direct = run_ranks(5, lambda comm: C.allreduce(parts[comm.rank], algorithm="direct", comm=comm))[0]
    assert not _same(ring, direct)


def _accumulated(parts: list[np.ndarray], deal: list[list[int]], **options: Any) -> list[Any]:
    def call(comm: C.Communicator) -> Any:
        total = C.ReproducibleSum(like=parts[0])
        for index in deal[comm.rank]:
            total.add(parts[index])
        return total.allreduce(comm=comm, **options)

    return run_ranks(len(deal), call)


@pytest.mark.parametrize("dtype", DTYPES)
def test_twelve_contributions_on_1_2_3_4_and_6_ranks_give_the_same_bits(dtype: str) -> None:
    parts = contributions(dtype, 12, COUNT, seed=12)
    expected = model(parts, dtype)
    for size in (1, 2, 3, 4, 6):
        even = [list(range(rank, 12, size)) for rank in range(size)]
        for deal in (even, spread(12, size, seed=size)):
            for result in _accumulated(parts, deal):
                assert _same(result, expected), (size, deal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_the_accumulator_with_every_algorithm(dtype: str, size: int) -> None:
    parts = contributions(dtype, 8, 257, seed=size)
    expected = model(parts, dtype)
    deal = spread(8, size, seed=size + 1)
    for name in _algorithms("allreduce", size, 257):
        for result in _accumulated(parts, deal, algorithm=name):
            assert _same(result, expected), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_accumulators_value_and_a_plain_allreduce_agree(dtype: str) -> None:
    parts = contributions(dtype, 4, COUNT, seed=4)
    total = C.ReproducibleSum(like=parts[0])
    for part in reversed(parts):
        total.add(part)
    assert total.count == 4
    plain = run_ranks(4, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))[0]
    assert _same(total.value(), plain)
    total.reset()
    assert total.count == 0 and not total.value().any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_and_reduce_scatter_give_the_allreduces_bits(dtype: str) -> None:
    size = 3
    parts = [np.tile(p, 3) for p in contributions(dtype, size, 300, seed=5)]
    whole = model(parts, dtype)
    counts = [500, 0, 400]

    def call(comm: C.Communicator) -> tuple[Any, ...]:
        x = parts[comm.rank]
        rooted = C.reduce(x, root=1, reproducible=True, algorithm="direct", comm=comm)
        share = C.reduce_scatter(x, reproducible=True, comm=comm)
        uneven = C.reduce_scatter(x, counts=counts, reproducible=True, algorithm="ring", comm=comm)
        total = C.ReproducibleSum(like=x)
        total.add(x)
        shares = total.reduce_scatter(counts=counts, comm=comm)
        return rooted, share, uneven, shares, total.reduce(2, comm=comm)

    results = run_ranks(size, call)
    assert results[0][0] is None and _same(results[1][0], whole) and results[2][4] is not None
    assert _same(np.concatenate([r[1] for r in results]), whole)
    assert _same(np.concatenate([r[2] for r in results]), whole)
    assert _same(np.concatenate([r[3] for r in results]), whole)
    assert _same(results[2][4], whole)


@pytest.mark.parametrize("dtype", DTYPES)
def test_avg_divides_the_sum_rounded_to_float64(dtype: str) -> None:
    parts = contributions(dtype, 3, COUNT, seed=6)
    results = run_ranks(3, lambda comm: C.allreduce(parts[comm.rank], "avg", reproducible=True, comm=comm))
    assert _same(results[2], model(parts, dtype, divide_by=3))


def test_signed_zeros_infinities_and_nan_as_stated() -> None:
    columns = [  # each rank's value of one element, and the result
        ((-0.0, -0.0, -0.0), -0.0),
        ((-0.0, 0.0, -0.0), 0.0),
        ((1.5, -1.5, -0.0), 0.0),
        ((np.inf, 1.0, 2.0), np.inf),
        ((-np.inf, -np.inf, 1e30), -np.inf),
        ((np.inf, -np.inf, 0.0), np.nan),
        ((np.nan, 1.0, np.inf), np.nan),
        ((np.float32(3e38), np.float32(3e38), 0.0), np.inf),  # past float32's largest: rounds to inf
    ]
    parts = [np.array([c[0][r] for c in columns], np.float32) for r in range(3)]
    result = run_ranks(3, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))[0]
    expected = np.array([c[1] for c in columns], np.float32)
    assert result.tobytes() == expected.tobytes()  # NaN is numpy's: 0x7fc00000, whatever the payloads


def test_the_error_is_within_the_stated_bound() -> None:
    # |result - exact| < n * 2**-31 * (the element's largest |contribution|) + half an ulp of the result
    parts = contributions("float32", 8, COUNT, seed=9, specials=False)
    result = run_ranks(8, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))[0]
    wide = np.array(parts, np.float64)
    exact = np.array([float(sum(map(_fraction, column))) for column in wide.T])
    largest = np.abs(wide).max(axis=0)
    finite = np.isfinite(result)
    error = np.abs(result[finite].astype(np.float64) - exact[finite])
    bound = 8 * largest[finite] * 2.0**-31 + np.spacing(np.abs(result[finite])).astype(np.float64) / 2
    assert (error <= bound).all()


def _fraction(value: float) -> Any:
    from fractions import Fraction

    return Fraction(float(value))


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_summed_words_are_rounded_once_to_nearest_even(dtype: str) -> None:
    # words as large as MOST_CONTRIBUTIONS sums of them get, at every code: against exact fractions
    family = FAMILIES["float64" if dtype == "float64" else "float32"]
    rng = np.random.default_rng(7)
    count = 3000
    codes = rng.integers(family.lowest, 9 if family.words == 1 else 65, size=count).astype(np.int8)
    codes[:50] = family.lowest  # the smallest units: subnormal results
    size = rng.integers(0, 62, size=(count, family.words))
    words = (rng.integers(-(2**62), 2**62, size=(count, family.words)) >> (62 - size)).reshape(-1)
    for divide_by in (1, 3):
        result = finish(words, codes, family, np.dtype(_numpy_dtype(dtype)), divide_by=divide_by)
        pairs = words.reshape(count, family.words).tolist()
        for got, code, pair in zip(result, codes.tolist(), pairs, strict=True):
            whole = pair[0] if family.words == 1 else pair[0] * 2**WORD + pair[1]
            exact = Fraction(whole) * Fraction(2) ** (16 * code - family.bits)
            wide = rounded(exact, "float64") / divide_by
            if divide_by > 1 and not np.isfinite(wide):
                expected = np.array(wide).astype(_numpy_dtype(dtype))
            else:
                exact = Fraction(wide) if divide_by > 1 else exact
                expected = np.array(rounded(exact, dtype)).astype(_numpy_dtype(dtype))
            assert np.array(got).tobytes() == expected.tobytes(), (pair, code, got, expected)


def _numpy_dtype(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.floats(width=32, allow_subnormal=True), min_size=4, max_size=4 * 6),
)
def test_any_floats_give_the_models_bits(size: int, values: list[float]) -> None:
    count = len(values) // size
    if count == 0:
        return
    parts = [np.array(values[r * count : (r + 1) * count], np.float32) for r in range(size)]
    result = run_ranks(size, lambda comm: C.allreduce(parts[comm.rank], reproducible=True, comm=comm))[0]
    assert _same(result, model(parts, "float32"))


def test_in_place_out_nonblocking_and_persistent_give_the_same_bits() -> None:
    parts = contributions("float32", 2, COUNT, seed=8)
    expected = model(parts, "float32")

    def call(comm: C.Communicator) -> list[np.ndarray]:
        x = parts[comm.rank].copy()
        out = np.empty_like(x)
        C.allreduce(x, reproducible=True, out=out, comm=comm)
        started = C.iallreduce(x, reproducible=True, comm=comm).wait()
        persistent = C.allreduce_init(x, reproducible=True, comm=comm)
        first, second = persistent().copy(), persistent()
        C.allreduce(x, reproducible=True, out=x, comm=comm)
        return [out, started, first, second, x]

    for results in run_ranks(2, call):
        assert all(_same(r, expected) for r in results)


def test_integers_pass_through_and_other_ops_are_refused() -> None:
    def call(comm: C.Communicator) -> Any:
        summed = C.allreduce(np.arange(5) + comm.rank, reproducible=True, comm=comm)
        with pytest.raises(C.UnsupportedOpError, match="reproducible"):
            C.allreduce(np.ones(3, np.float32), "max", reproducible=True, comm=comm)
        return summed

    assert run_ranks(2, call)[0].tolist() == [1, 3, 5, 7, 9]


def test_bad_input_on_one_rank_is_told_to_the_others() -> None:
    def call(comm: C.Communicator) -> str:
        x = np.ones(4, np.float32) if comm.rank else [1.0, 2.0]
        try:
            C.allreduce(x, reproducible=True, comm=comm)
        except C.CollectivesError as error:
            return type(error).__name__
        return "none"

    assert run_ranks(2, call) == ["InvalidBufferError", "PeerInputError"]


def test_ranks_with_different_dtypes_raise_on_every_rank() -> None:
    def call(comm: C.Communicator) -> str:
        x = np.ones(4, np.float16 if comm.rank else np.float32)
        with pytest.raises(C.MismatchError):
            C.allreduce(x, reproducible=True, comm=comm, check=False)
        return "raised"

    assert run_ranks(2, call) == ["raised", "raised"]


def test_too_many_contributions_are_refused() -> None:
    levels = Levels(3, FAMILIES["float32"])
    levels.add(np.ones(3, np.float32))
    levels.adds = MOST_CONTRIBUTIONS + 1  # as if added that often
    contributions_ = Sum(FAMILIES["float32"], np.dtype(np.float32), levels.codes, levels.adds, None, None)  # type: ignore[arg-type]
    with pytest.raises(C.CollectivesError, match="32768"):
        reduced(None, Through(C.allreduce), "allreduce", contributions_)


def test_the_accumulator_checks_what_it_is_given() -> None:
    total = C.ReproducibleSum(like=np.zeros((2, 3), ml_dtypes.bfloat16))
    with pytest.raises(C.InvalidBufferError, match="bfloat16"):
        total.add(np.zeros((2, 3), np.float32))
    with pytest.raises(C.InvalidBufferError, match=r"\(3, 2\)"):
        total.add(np.zeros((3, 2), ml_dtypes.bfloat16))
    with pytest.raises(C.UnsupportedDtypeError):
        C.ReproducibleSum(like=np.zeros(3, np.int32))
    assert "0 added" in repr(total)
