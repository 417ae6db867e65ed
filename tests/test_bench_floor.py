"""bench floor: the single-copy floor sums like MPI at any rank count, and the table runs end to end."""

import pytest

from tests.mpirun import BENCH, mpiexec, run_mpi

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")

# both methods, odd and uneven sizes, float32 and int64, repeated calls on changed data
_CHECK = """
import numpy as np
from mpi4py import MPI
from collectives.bench.floor import CROSS_MEMORY, SHARED_WINDOW, Floor, cross_memory_error

world = MPI.COMM_WORLD
methods = [SHARED_WINDOW] + ([CROSS_MEMORY] if cross_memory_error(world) is None else [])
bad = []
for method in methods:
    for dtype in ("float32", "int64"):
        for count in (0, 1, world.size - 1, 7, 300_001):
            x = np.empty(count, dtype)
            floor = Floor(x, world, method)
            for round_ in range(3):
                x[:] = (np.arange(count) * (world.rank + 1) + round_) % 1000
                expected = np.empty_like(x)
                world.Allreduce(x.copy(), expected)
                floor()
                if not np.array_equal(x, expected):
                    bad.append((method, dtype, count, round_))
            floor.free()
every = world.allgather(bad)
if world.rank == 0:
    print("methods:", methods)
    print("bad:", every)
assert not any(every), every
"""


@needs_mpiexec
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_the_floor_sums_as_mpi_does(ranks: int) -> None:
    result = run_mpi(ranks, ["-c", _CHECK], timeout=120)
    assert result.returncode == 0, result.stdout
    assert "bad: [" in result.stdout


@needs_mpiexec
def test_bench_floor_prints_ours_against_the_floor_and_mpi() -> None:
    result = run_mpi(2, [*BENCH, "floor", "-b", "64K", "-e", "256K", "-n", "3", "-w", "1"], timeout=90)
    assert result.returncode == 0, result.stdout
    assert "# floor       : " in result.stdout
    assert (
        "ours/floor" in result.stdout
        and "ours/mpi" in result.stdout
        and "# floor at 65536 B: " in result.stdout
    )
    assert "# wrong elements: 0 OK" in result.stdout
