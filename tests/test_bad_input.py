"""Inputs the API refuses clearly or handles as numpy does, beyond test_api.py and test_api_rooted.py."""

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import Communicator, InvalidBufferError, UnknownAlgorithmError, UnsupportedDtypeError
from collectives.specs import COLLECTIVES

Ranks = Callable[..., list[Any]]


@pytest.mark.parametrize("dtype", ["<U3", "S3", "complex128", "datetime64[s]", "V4"])
def test_strings_complex_and_other_dtypes_are_refused_by_name(ranks: Ranks, dtype: str) -> None:
    x = np.zeros(3, dtype)
    for call in (C.allreduce, C.broadcast, C.allgather):
        with pytest.raises(
            UnsupportedDtypeError, match=re.escape(f"unsupported dtype {x.dtype.name}; supported dtypes are")
        ):
            ranks(1, lambda comm, call=call: call(x, comm=comm))


def test_a_read_only_input_is_fine_out_of_place_but_not_in_place(ranks: Ranks) -> None:
    def run(comm: Communicator) -> np.ndarray:
        x = np.arange(6, dtype=np.int32)
        x.flags.writeable = False
        with pytest.raises(InvalidBufferError, match="out is read-only"):
            C.allreduce(x, out=x, comm=comm)
        return C.allreduce(x, comm=comm)

    for result in ranks(2, run):
        assert np.array_equal(result, 2 * np.arange(6))


@pytest.mark.parametrize(
    ("op", "ufunc"), [("sum", np.add), ("prod", np.multiply), ("max", np.maximum), ("min", np.minimum)]
)
def test_nan_and_inf_propagate_as_ieee_says(ranks: Ranks, op: str, ufunc: Any) -> None:
    # NaN stays NaN (max and min too, as numpy's maximum), inf - inf is NaN, 3e38 + 3e38 overflows to inf
    inputs = [
        np.array([np.nan, np.inf, np.inf, 1.0, 3e38], np.float32),
        np.array([1.0, -np.inf, 1.0, np.inf, 3e38], np.float32),
    ]
    with np.errstate(all="ignore"):
        expected = ufunc(*inputs)
    results = ranks(2, lambda comm: C.allreduce(inputs[comm.rank], op, comm=comm))
    assert np.array_equal(results[0], expected, equal_nan=True), results[0]
    assert np.isnan(results[0][0])
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint64"])
def test_integer_overflow_wraps_as_numpy_does(ranks: Ranks, dtype: str) -> None:
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, info.max // 2 + 1], dtype)
    expected = x + x + x  # numpy wraps modulo 2**bits
    for result in ranks(3, lambda comm: C.allreduce(x, comm=comm)):
        assert result.dtype == x.dtype and np.array_equal(result, expected), result


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if c not in ("alltoall",)])
def test_an_unknown_algorithm_lists_the_valid_ones_for_every_collective(
    ranks: Ranks, collective: str
) -> None:
    x = np.ones(2, np.float32)
    calls: dict[str, Callable[[Communicator], Any]] = {
        "allreduce": lambda c: C.allreduce(x, algorithm="nope", comm=c),
        "reduce_scatter": lambda c: C.reduce_scatter(x, algorithm="nope", comm=c),
        "allgather": lambda c: C.allgather(x, algorithm="nope", comm=c),
        "broadcast": lambda c: C.broadcast(x, algorithm="nope", comm=c),
        "reduce": lambda c: C.reduce(x, algorithm="nope", comm=c),
        "gather": lambda c: C.gather(x, algorithm="nope", comm=c),
        "scatter": lambda c: C.scatter(x, algorithm="nope", comm=c),
        "barrier": lambda c: C.barrier(c, algorithm="nope"),
    }
    with pytest.raises(
        UnknownAlgorithmError, match=f"unknown algorithm 'nope' for {collective}; valid algorithms are auto, "
    ):
        ranks(1, calls[collective])


def test_count_zero_runs_every_collective(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[Any]:
        x = np.ones(0, np.float64)
        return [
            C.allreduce(x, comm=comm), C.reduce_scatter(x, comm=comm), C.allgather(x, comm=comm),
            C.broadcast(x, comm=comm), C.alltoall(x, comm=comm), C.scatter(x, comm=comm),
        ]  # fmt: skip

    for results in ranks(3, run):
        assert all(r.size == 0 and r.dtype == np.float64 for r in results)


def test_the_callers_floating_point_error_mode_does_not_reach_the_reductions(ranks: Ranks) -> None:
    # overflow is a result of the collective, not the caller's error, even where the caller raises on it
    def run(comm: C.Communicator) -> np.ndarray:
        with np.errstate(all="raise"):
            return C.allreduce(np.full(5, 3e38, np.float32), comm=comm)

    for result in ranks(2, run):
        assert np.isinf(result).all()
