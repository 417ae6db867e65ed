"""Ranks split into pretend nodes of two: the allreduce through nodes' shared memory and rails."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.selector import Selector
from collectives.topology.cost_model import DEFAULT_MODEL
from collectives.transport.mpi import RANKS_PER_NODE_ENV
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

PER_NODE = 2
COUNTS = [0, 1, 2, 3, 7, 4097, 300_007, 2_100_001]  # 0, 1, odd, past one segment of the window
DTYPE_OPS = [("float32", "sum"), ("float64", "avg"), ("int32", "max"), ("int64", "prod"), ("uint8", "bor")]


@pytest.fixture
def nodes(world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch) -> collectives.Communicator:
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(PER_NODE))
    comm = collectives.Communicator(world)
    features = comm.features  # collective: every rank finds its node here
    p = world.size
    whole = p <= PER_NODE
    split = p % PER_NODE == 0 and p > PER_NODE
    problems = Problems(world)
    problems.expect(("shared_memory" in features) == whole, f"{p} ranks: features {set(features)}")
    problems.expect(("shared_memory_nodes" in features) == split, f"{p} ranks: features {set(features)}")
    if split:
        problems.expect(f"ranks_per_node={PER_NODE}" in features, f"features {set(features)}")
    problems.check()
    if not split:
        comm.free()
        pytest.skip(f"{p} ranks make no even split into nodes of {PER_NODE}")
    return comm


@pytest.mark.parametrize(("dtype", "op"), DTYPE_OPS)
def test_allreduce_across_pretend_nodes_matches_mpi(
    world: MPI.Intracomm, nodes: collectives.Communicator, dtype: str, op: str
) -> None:
    problems = Problems(world)
    r, p = world.rank, world.size
    for count in COUNTS:
        if count > 4097 and dtype != "float32":
            continue  # the large counts once, for time
        x = exact_input(op, dtype, count, r, p)
        expected = mpi_reference("allreduce", x, op, world)
        with problems.guard(f"{dtype} {op} count={count}"):
            got = collectives.allreduce(x, op, algorithm="hierarchical_shared_memory", comm=nodes)
            problems.expect_equal(f"{dtype} {op} {count}", got, expected)
            y = x.copy()
            collectives.allreduce(y, op, out=y, algorithm="hierarchical_shared_memory", comm=nodes)
            problems.expect_equal(f"{dtype} {op} {count} in place", y, expected)
            z = nodes.alloc(count, dtype)
            z[:] = x
            collectives.allreduce(z, op, out=z, algorithm="hierarchical_shared_memory", comm=nodes)
            problems.expect_equal(f"{dtype} {op} {count} alloc in place", z, expected)
    nodes.free()
    problems.check()


def test_auto_chooses_the_nodes_for_large_messages(
    world: MPI.Intracomm, nodes: collectives.Communicator
) -> None:
    problems = Problems(world)
    count = 4 * 1024**2
    explained = Selector(DEFAULT_MODEL).explain(
        "allreduce", count, world_size=world.size, features=nodes.features
    )
    problems.expect(explained.choice == "hierarchical_shared_memory", str(explained))
    rejected = {r.algorithm: r.reasons for r in explained.rejected}
    problems.expect("shared_memory" in rejected, "shared_memory not rejected across nodes")
    x = np.ones(count, np.float32)
    got = collectives.allreduce(x, comm=nodes)
    problems.expect(bool((got == world.size).all()), "auto across nodes gave a wrong sum")
    problems.expect(nodes.flight_record()[-1].split("algorithm=")[1].startswith("hierarchical_shared_memory"),
                    nodes.flight_record()[-1])  # fmt: skip
    nodes.free()
    problems.check()


def test_the_node_path_builds_no_global_schedule(
    world: MPI.Intracomm, nodes: collectives.Communicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collectives.algorithms import registry
    from collectives.schedule import Schedule

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the node path built a global schedule")

    registry._programs.cache_clear()  # the rails' programs built afresh, from the rank number
    monkeypatch.setattr(registry, "_cached", refuse)
    monkeypatch.setattr(Schedule, "__post_init__", refuse)
    problems = Problems(world)
    r, p = world.rank, world.size
    for count in (7, 4097, 300_007):
        x = exact_input("sum", "float32", count, r, p)
        expected = mpi_reference("allreduce", x, "sum", world)
        with problems.guard(f"count={count}"):
            got = collectives.allreduce(x, algorithm="hierarchical_shared_memory", comm=nodes)
            problems.expect_equal(f"{count}", got, expected)
    problems.check()
