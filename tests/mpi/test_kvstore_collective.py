"""Under mpiexec: ``sync`` push and pull as collectives give the message path's bits; a misorder is named."""

import numpy as np
import pytest
from mpi4py import MPI

from collectives.errors import KeyMismatchError
from collectives.kvstore import SGD, create
from collectives.ops import DTYPES
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi


def _known(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:  # bfloat16 without ml_dtypes installed
        return False
    return True


def _value(rank: int, t: int, n: int, dtype: str) -> np.ndarray:
    """Small integers: every sum is exact in any order and fits every dtype."""
    return ((np.arange(n) * (rank + 1) + 3 * t + rank) % 5).astype(dtype)


def _rounds(world: MPI.Intracomm, collective: bool, optimizer: bool) -> list[bytes]:
    """Every dtype's key (float ones only under an optimizer) pulled before and after 2 rounds."""
    names = [d for d in DTYPES if _known(d) and (not optimizer or d in ("float32", "float64"))]
    kv = create("sync", comm=world, partition_bytes=64, collective=collective)
    seen = []
    try:
        kv.init(names, [np.ones(37, d) for d in names])
        if optimizer:
            kv.set_optimizer(SGD(lr=0.5, momentum=0.5))
        seen += [a.tobytes() for a in kv.pull(names)]
        for t in range(2):
            kv.push(names, [_value(world.rank, t, 37, d) for d in names])
            seen += [a.tobytes() for a in kv.pull(names)]
            seen.append(kv.pushpull(names[0], _value(world.rank, t + 3, 37, names[0])).tobytes())
    finally:
        kv.close()
    return seen


@pytest.mark.parametrize("optimizer", [False, True])
def test_collective_push_and_pull_equal_the_message_path_bitwise(
    world: MPI.Intracomm, optimizer: bool
) -> None:
    problems = Problems(world)
    with problems.guard(f"optimizer={optimizer}"):
        fast = _rounds(world, True, optimizer)
        slow = _rounds(world, False, optimizer)
        problems.expect(fast == slow, f"optimizer={optimizer}: collectives and messages differ")
        every = world.allgather(fast)
        problems.expect(all(e == every[0] for e in every), "the ranks' bits differ")
    problems.check()


def test_a_worker_pushing_another_key_is_named_on_every_worker(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs a second worker to differ")
    problems = Problems(world)
    kv = create("sync", comm=world, timeout=30.0)
    try:
        kv.init(["a", "b"], [np.zeros(8), np.zeros(8)])
        try:
            kv.push("a" if world.rank == 0 else "b", np.ones(8))
            problems.expect(False, "no error")
        except KeyMismatchError as error:
            others = list(range(1, world.size)) if world.rank == 0 else [0]
            problems.expect(f"on rank {world.rank}: workers {others}" in str(error), str(error))
        # the store goes on: the next round in order runs
        kv.push("a", np.ones(8))
        problems.expect_equal("after", kv.pull("a"), np.full(8, float(world.size)))
    finally:
        kv.close()
    problems.check()


def test_a_worker_out_of_order_in_repeated_pushpulls_is_named_on_every_worker(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs a second worker to differ")
    problems = Problems(world)
    kv = create("sync", comm=world, timeout=30.0)
    try:
        kv.init(["a", "b"], [np.zeros(8), np.zeros(8)])
        for key in ("a", "b") * 3:  # both kept as plans, the allreduce's repeated path warm
            kv.pushpull(key, np.ones(8))
        try:
            kv.pushpull("a" if world.rank == 0 else "b", np.ones(8))
            problems.expect(False, "no error")
        except KeyMismatchError as error:
            others = list(range(1, world.size)) if world.rank == 0 else [0]
            problems.expect(
                f"on rank {world.rank}: workers {others} pushpulled another" in str(error), str(error)
            )
        problems.expect_equal("after", kv.pushpull("a", np.ones(8)), np.full(8, float(world.size)))
    finally:
        kv.close()
    problems.check()
