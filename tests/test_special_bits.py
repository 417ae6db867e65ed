"""Signed zeros and NaN payloads: every rank and, at two ranks, every algorithm gives the same bits."""

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives as C
from collectives.algorithms import ALGORITHMS
from collectives.selector import rejection_reasons
from tests.conftest import run_ranks

_UINT = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}
_QUIET = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}


def _dtype(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def special_inputs(dtype: str, world_size: int, count: int, nan_ranks: int = 99) -> list[np.ndarray]:
    """Per rank: +0, -0, 1 and (below ``nan_ranks``) NaNs whose payload and sign name the rank."""
    uint = _UINT[dtype]
    width = np.dtype(uint).itemsize * 8
    sign = 1 << (width - 1)
    xs = []
    for rank in range(world_size):
        nan = _QUIET[dtype] | (rank + 1) | (sign if rank % 2 else 0)
        one = np.array([1.0], dtype=_dtype(dtype)).view(uint)[0]
        choices = np.array([0, sign, int(one), nan if rank < nan_ranks else 0], dtype=uint)
        picks = np.random.default_rng(100 + rank).integers(0, len(choices), size=count)
        xs.append(choices[picks].view(_dtype(dtype)))
    return xs


def _results(algorithm: str, op: str, xs: list[np.ndarray]) -> list[bytes]:
    def call(comm: C.Communicator) -> bytes:
        return bytes(C.allreduce(xs[comm.rank], op, algorithm=algorithm, comm=comm).tobytes())

    return run_ranks(len(xs), call)


def _algorithms(world_size: int, count: int) -> list[str]:
    return [
        name
        for name, module in ALGORITHMS.items()
        if hasattr(module, "allreduce") and not rejection_reasons("allreduce", name, world_size, count)
    ]


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_every_rank_gets_the_same_bits_for_signed_zeros_and_nan_payloads(
    dtype: str, op: str, world_size: int
) -> None:
    for count in (1, 7, 301):
        xs = special_inputs(dtype, world_size, count)
        for algorithm in _algorithms(world_size, count):
            results = _results(algorithm, op, xs)
            assert len(set(results)) == 1, f"{algorithm} at {world_size} ranks, count {count}: ranks differ"


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_on_two_ranks_every_algorithm_gives_numpys_bits_of_rank_0_op_rank_1(dtype: str, op: str) -> None:
    # which of two NaNs survives is numpy's choice by position in its vector loop, so only one rank has NaNs
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    for count in (1, 7, 301):
        xs = special_inputs(dtype, 2, count, nan_ranks=1)
        with np.errstate(all="ignore"):
            expected = ufunc(xs[0], xs[1]).tobytes()
        for algorithm in _algorithms(2, count):
            results = _results(algorithm, op, xs)
            assert results == [expected, expected], f"{algorithm}, count {count}"


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_the_small_windows_reduction_gives_the_bits_of_reduce_into(dtype: str, op: str) -> None:
    from collectives.backends.numpy_backend import NumpyBackend
    from collectives.ops import get_op

    backend, reduce_op = NumpyBackend(), get_op(op)
    for count in (1, 2, 7, 301):
        for nan_ranks in (1, 2):  # one NaN operand, then two with different payloads and signs
            a, b = special_inputs(dtype, 2, count, nan_ranks=nan_ranks)
            apart, into = np.empty_like(a), np.empty_like(a)
            backend.reduce_apart(reduce_op, apart, a, b)
            backend.reduce_into(reduce_op, into, a, b)
            assert apart.tobytes() == into.tobytes(), f"count {count}, NaNs on {nan_ranks} rank(s)"
            # the lean path's reducer, made once for calls in a row: the same bits, and no warning
            # for the overflow or NaN it makes (those are results here)
            reduced = np.empty_like(a)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                backend.reducer(reduce_op)(reduced, a, b)
            assert reduced.tobytes() == into.tobytes(), f"reducer: count {count}, NaNs on {nan_ranks} rank(s)"


def test_the_reducer_overflows_to_inf_without_a_warning() -> None:
    from collectives.backends.numpy_backend import NumpyBackend
    from collectives.ops import get_op

    big = np.full(3, np.finfo(np.float32).max, np.float32)
    out = np.empty_like(big)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NumpyBackend().reducer(get_op("sum"))(out, big, big)
    assert np.isinf(out).all()
