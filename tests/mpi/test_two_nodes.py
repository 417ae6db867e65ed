"""Ranks on several nodes (emulated by MPICH's launcher): the node split, its hierarchy, its choice.

Runs where ``MPI_Comm_split_type(SHARED)`` splits the job into nodes of two ranks
or more (tests/test_two_nodes_launch.py launches it so, as 2 x 2 and 3 x 2);
elsewhere every test skips.
"""

import os
import re

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi


def _shape(world: MPI.Intracomm) -> tuple[int, int]:
    """``(nodes, ranks per node)`` as MPI finds the nodes."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    per_node = node.Get_size()
    node.Free()
    return world.size // per_node, per_node


@pytest.fixture
def nodes(world: MPI.Intracomm) -> collectives.Communicator:
    count, per_node = _shape(world)
    if count < 2 or per_node < 2:
        pytest.skip(f"{world.size} ranks on {count} node(s): not a job of several nodes of two or more")
    comm = collectives.Communicator(world)
    return comm


def test_the_node_split_is_mpis(world: MPI.Intracomm, nodes: collectives.Communicator) -> None:
    problems = Problems(world)
    count, per_node = _shape(world)
    features = nodes.features
    problems.expect("shared_memory_nodes" in features, f"features {set(features)}")
    problems.expect(f"ranks_per_node={per_node}" in features, f"features {set(features)}")
    split = nodes.nodes
    problems.expect(split is not None, "no node split")
    if split is not None:
        node_ranks = split[0].node_ranks
        problems.expect(len(node_ranks) == per_node and world.rank in node_ranks, f"node {node_ranks}")
        problems.expect(len(split[0].rail_ranks) == count, f"rail {split[0].rail_ranks}")
    explanation = collectives.explain("allreduce", 1 << 16, comm=nodes)
    problems.expect(explanation.nodes == (count, per_node), f"explain's nodes {explanation.nodes}")
    problems.expect("between" in str(explanation), "explain lists no link between nodes")
    nodes.free()
    problems.check()


def test_emulated_nodes_count_their_machines_ranks(
    world: MPI.Intracomm, nodes: collectives.Communicator
) -> None:
    # the emulated nodes share one machine's cores: a barrier there must not spin on a core
    # a descheduled peer needs, and the features say oversubscribed where the ranks outnumber them
    problems = Problems(world)
    names = world.allgather(MPI.Get_processor_name())
    on_this_machine = names.count(names[world.rank])
    host = nodes.transport.host_ranks()
    problems.expect(host == on_this_machine, f"host_ranks {host}, not {on_this_machine}")
    crowded = on_this_machine > (os.cpu_count() or 1)
    problems.expect(("oversubscribed" in nodes.features) == crowded, f"features {set(nodes.features)}")
    split = nodes.nodes
    if split is not None:
        spin = getattr(split[0].shared, "_spin", None)
        problems.expect((spin == 0) == crowded, f"the barrier spins {spin} polls on {on_this_machine} ranks")
    nodes.free()
    problems.check()


@pytest.mark.parametrize("algorithm", ["hierarchical", "hierarchical_shared_memory", "ring", "auto"])
def test_allreduce_across_nodes_matches_mpi(
    world: MPI.Intracomm, nodes: collectives.Communicator, algorithm: str
) -> None:
    problems = Problems(world)
    for count in (0, 1, 5, 4097, 300_007):
        x = exact_input("sum", "float32", count, world.rank, world.size)
        expected = mpi_reference("allreduce", x, "sum", world)
        with problems.guard(f"{algorithm} count={count}"):
            got = collectives.allreduce(x, "sum", algorithm=algorithm, comm=nodes)
            problems.expect_equal(f"{algorithm} {count}", got, expected)
    nodes.free()
    problems.check()


def test_explain_names_what_dispatch_runs(world: MPI.Intracomm, nodes: collectives.Communicator) -> None:
    problems = Problems(world)
    for count in (8, 65_536, 1 << 20):
        x = np.ones(count, np.float32)
        with problems.guard(f"count={count}"):
            collectives.allreduce(x, comm=nodes)
            ran = re.search(r"algorithm=(\S+)", nodes.flight_record()[-1])
            explained = collectives.explain("allreduce", count, comm=nodes).choice
            problems.expect(
                ran is not None and ran.group(1) == explained, f"{count}: ran {ran}, explain {explained}"
            )
    nodes.free()
    problems.check()


def test_the_tuner_agrees_across_nodes(world: MPI.Intracomm) -> None:
    count, per_node = _shape(world)
    if count < 2 or per_node < 2:
        pytest.skip("one node")
    problems = Problems(world)
    comm = collectives.Communicator(world, tune=True)
    x = np.arange(50_000, dtype=np.float32)
    for _ in range(14):
        with problems.guard("tuned allreduce"):
            got = collectives.allreduce(x, comm=comm)
            problems.expect_equal("tuned", got, x * world.size)
    choice = collectives.explain("allreduce", x.size, comm=comm)
    chosen = world.allgather(choice.choice)
    problems.expect(len(set(chosen)) == 1 and bool(choice.measured), f"choices {chosen}, {choice.measured}")
    comm.free()
    problems.check()
