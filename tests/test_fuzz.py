"""Random calls of the public API over loopback ranks, checked against numpy."""

from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectives as C
from collectives.algorithms import ALGORITHMS
from collectives.ops import DTYPES, OPS
from collectives.selector import rejection_reasons
from tests.conftest import run_ranks

_REDUCING = ("allreduce", "reduce_scatter", "reduce")
_COLLECTIVES = (*_REDUCING, "allgather", "broadcast", "gather", "scatter", "alltoall")
_UFUNCS = {
    "sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}  # fmt: skip


@st.composite
def _calls(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.integers(1, 5))
    collective = draw(st.sampled_from(_COLLECTIVES))
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from([o.name for o in OPS.values() if dtype in o.dtypes]))
    per_rank = collective in ("reduce_scatter", "scatter", "alltoall")
    count = draw(st.integers(0, 6)) * size if per_rank else draw(st.integers(0, 20))
    valid = [n for n, m in ALGORITHMS.items() if hasattr(m, collective)]
    valid = [n for n in valid if not rejection_reasons(collective, n, size, count)]
    algorithm = draw(st.sampled_from(["auto", *valid]))
    root = draw(st.integers(0, size - 1))
    # small integers: every sum and product is exact in any order, and integers wrap alike
    low = 0 if dtype.startswith("u") else -3
    inputs = [
        np.array(draw(st.lists(st.integers(low, 3), min_size=count, max_size=count)), np.int64).astype(dtype)
        for _ in range(size)
    ]
    return {"size": size, "collective": collective, "dtype": dtype, "op": op, "count": count,
            "algorithm": algorithm, "root": root, "inputs": inputs}  # fmt: skip


def _reference(call: dict[str, Any]) -> list[Any]:
    size, collective, inputs, root = call["size"], call["collective"], call["inputs"], call["root"]
    k = call["count"] // size
    if collective in _REDUCING:
        with np.errstate(all="ignore"):
            total = inputs[0].copy()
            for x in inputs[1:]:
                _UFUNCS[call["op"]](total, x, out=total)
            if call["op"] == "avg":
                np.true_divide(total, size, out=total)
        if collective == "allreduce":
            return [total] * size
        if collective == "reduce":
            return [total if r == root else None for r in range(size)]
        return [total[r * k : (r + 1) * k] for r in range(size)]
    if collective == "allgather":
        return [np.concatenate(inputs)] * size
    if collective == "gather":
        return [np.concatenate(inputs) if r == root else None for r in range(size)]
    if collective == "broadcast":
        return [inputs[root]] * size
    if collective == "scatter":
        return [inputs[root][r * k : (r + 1) * k] for r in range(size)]
    return [np.concatenate([x[r * k : (r + 1) * k] for x in inputs]) for r in range(size)]  # alltoall


def _run(call: dict[str, Any], comm: C.Communicator) -> Any:
    x = call["inputs"][comm.rank].copy()
    collective, algorithm, root = call["collective"], call["algorithm"], call["root"]
    if collective in _REDUCING:
        extra = {"root": root} if collective == "reduce" else {}
        return getattr(C, collective)(x, call["op"], algorithm=algorithm, comm=comm, **extra)
    extra = {"root": root} if collective in ("broadcast", "gather", "scatter") else {}
    return getattr(C, collective)(x, algorithm=algorithm, comm=comm, **extra)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_calls())
def test_random_calls_match_numpy(call: dict[str, Any]) -> None:
    results = run_ranks(call["size"], lambda comm: _run(call, comm))
    for rank, (result, expected) in enumerate(zip(results, _reference(call), strict=True)):
        if expected is None:
            assert result is None, (rank, result)
            continue
        assert result.dtype == expected.dtype, (rank, result.dtype)
        assert result.tobytes() == expected.tobytes(), (rank, result, expected)
