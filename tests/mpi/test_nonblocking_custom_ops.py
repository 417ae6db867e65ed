"""Non-blocking collectives and custom ops under mpiexec, against mpi4py."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.algorithms import ALGORITHMS
from collectives.algorithms.base import implements
from tests.mpi.helpers import Problems
from tests.test_custom_ops import matmul2

pytestmark = pytest.mark.mpi

LOGSUMEXP = collectives.Op(np.logaddexp, identity=-np.inf)
MATMUL = collectives.Op(matmul2, commutative=False)
COUNTS = [5, 70_001]  # the shared-memory executor's one-barrier path, and its segmented one


def _in_order(parts: list[np.ndarray]) -> np.ndarray:
    result = parts[0]
    for part in parts[1:]:
        result = matmul2(result, part)
    return result


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter"])
def test_custom_ops_on_every_algorithm(world: MPI.Intracomm, collective: str) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    run = collectives.allreduce if collective == "allreduce" else collectives.reduce_scatter
    names = [n for n, m in ALGORITHMS.items() if implements(m, collective)]
    for count in COUNTS:
        count = count // p * p if collective == "reduce_scatter" else count
        share = (
            slice(r * (count // p), (r + 1) * (count // p)) if collective == "reduce_scatter" else slice(None)
        )
        floats = np.random.default_rng(r).normal(size=count)
        whole = np.logaddexp.reduce(np.stack(world.allgather(floats)), axis=0)[share]
        matrices = np.random.default_rng(100 + r).integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
        product = _in_order(world.allgather(matrices))[share]
        for algorithm in ["auto", *names]:
            label = f"{collective} {algorithm} count={count}"
            with problems.guard(f"{label} logaddexp"):
                got = run(floats, LOGSUMEXP, algorithm=algorithm, comm=comm)
                problems.expect(bool(np.allclose(got, whole, rtol=1e-12)), f"{label}: logaddexp differs")
            try:
                got = run(matrices, MATMUL, algorithm=algorithm, comm=comm)
                problems.expect(bool(np.array_equal(got, product)), f"{label}: the product is out of order")
                refused = False
            except collectives.UnsupportedOpError as error:
                problems.expect(algorithm != "auto" and "not commutative" in str(error), f"{label}: {error}")
                refused = True
            # every rank decides alike
            problems.expect(len(set(world.allgather(refused))) == 1, f"{label}: ranks decided differently")
    comm.free()
    problems.check()


def test_non_blocking_calls_overlap_and_keep_their_order(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    with problems.guard("non-blocking"):
        x = np.arange(10_000, dtype=np.float64) * (r + 1)
        started = collectives.iallreduce(x, out=x, comm=comm)
        small = [collectives.iallreduce(np.full(8, float(r + i)), comm=comm) for i in range(5)]
        overlapped = float(np.sum(np.sqrt(np.arange(100_000.0))))  # computed while the calls run
        blocking = collectives.allreduce(np.full(3, 1.0), comm=comm)  # after the started ones
        barrier = collectives.ibarrier(comm)
        results = collectives.wait_all([started, *small, barrier])
        problems.expect(overlapped > 0, "no computation")
        problems.expect(results[0] is x, "wait() did not return the buffer passed as out")
        problems.expect(bool(np.array_equal(x, np.arange(10_000.0) * p * (p + 1) / 2)), "iallreduce wrong")
        for i, got in enumerate(results[1:6]):
            want = np.full(8, float(sum(k + i for k in range(p))))
            problems.expect(bool(np.array_equal(got, want)), f"small iallreduce {i} wrong")
        problems.expect(blocking.tolist() == [float(p)] * 3, "blocking allreduce wrong")
        problems.expect(collectives.test_all([started, barrier]), "test_all says not done")
        reference = np.empty(4)
        world.Allreduce(np.full(4, float(r)), reference)
        got = collectives.iallreduce(np.full(4, float(r)), comm=comm).wait()
        problems.expect(bool(np.array_equal(got, reference)), "iallreduce differs from MPI's")
    comm.free()
    problems.check()


def test_a_non_commutative_reduce_at_every_root(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    matrices = np.random.default_rng(7 + world.rank).integers(0, 2**32, 33, dtype=np.uint64).astype(np.uint32)
    product = _in_order(world.allgather(matrices))
    for root in range(world.size):
        with problems.guard(f"reduce root={root}"):
            got = collectives.reduce(matrices, MATMUL, root=root, comm=comm)
            if world.rank == root:
                problems.expect(bool(np.array_equal(got, product)), f"root {root}: out of order")
            else:
                problems.expect(got is None, f"root {root}: a result off the root")
    comm.free()
    problems.check()
