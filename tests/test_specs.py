"""The collectives' contracts and their exact test patterns."""

import numpy as np
import pytest

from collectives import COLLECTIVES, OPS
from collectives.specs import exact_pattern, get_spec

_NUMPY_REDUCE = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}  # fmt: skip


def test_collectives_are_named_alike_everywhere() -> None:
    assert COLLECTIVES == ("allreduce", "reduce_scatter", "allgather")
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        get_spec("alltoall")


@pytest.mark.parametrize(
    ("collective", "world_size", "factor"),
    [
        ("allreduce", 4, 1.5),
        ("allreduce", 1, 0.0),
        ("reduce_scatter", 8, 0.875),
        ("allgather", 2, 0.5),
    ],
)
def test_bus_bandwidth_factor_is_the_nccl_tests_one(collective: str, world_size: int, factor: float) -> None:
    assert get_spec(collective).busbw_factor(world_size) == pytest.approx(factor)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8, 17, 42])
@pytest.mark.parametrize("op", [name for name in OPS if name != "avg"])
def test_exact_pattern_reduces_to_its_combined_values(op: str, world_size: int) -> None:
    pattern = exact_pattern(op, world_size)
    period = len(pattern.values)
    index = np.arange(3 * period + 1)
    inputs = [np.take(pattern.values, (index + r) % period) for r in range(world_size)]
    combined = _NUMPY_REDUCE[OPS[op].combine].reduce(np.stack(inputs), axis=0)
    assert np.array_equal(combined, np.take(pattern.combined, index % period))
    # every partial result fits int8 and is an exact bfloat16 integer
    assert min(pattern.values) >= 0 and max(pattern.combined) <= np.iinfo(np.int8).max
