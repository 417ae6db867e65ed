"""Ring search and packing: the seeds' two DGX-1 rings found by search, and the packing's limits."""

from itertools import pairwise, permutations

import pytest

from collectives.errors import TopologyError
from collectives.topology import (
    Topology,
    dgx1,
    find_rings,
    fully_connected,
    multi_node,
    pack_rings,
    pcie_switch,
    ring,
)

# The seeds' figure numbers the GPUs 1-8 so that the double ring is 1-2-...-8; nvidia-smi's
# numbering (dgx1()'s) is that relabelled: seeds' GPU k is our GPU SEEDS_GPU[k].
SEEDS_GPU = {1: 7, 2: 4, 3: 0, 4: 3, 5: 2, 6: 1, 7: 5, 8: 6}
SEEDS_DOUBLE_RING = (1, 2, 3, 4, 5, 6, 7, 8)
SEEDS_SINGLE_RING = (1, 4, 6, 3, 5, 8, 2, 7)


def _canonical(ring: tuple[int, ...]) -> tuple[int, ...]:
    """The ring from its smallest member, in the direction whose second member is smaller."""
    start = ring.index(min(ring))
    forward = ring[start:] + ring[:start]
    backward = (forward[0], *reversed(forward[1:]))
    return min(forward, backward)


def _numbers(ring: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(int(name.removeprefix("gpu")) for name in ring)


def _is_ring_over_links(topology: Topology, ring: tuple[str, ...]) -> bool:
    return all(topology.link(a, b) is not None for a, b in pairwise((*ring, ring[0])))


def test_dgx1_packs_the_seeds_double_and_single_nvlink_rings_at_2_to_1() -> None:
    packing = pack_rings(dgx1())
    assert [_numbers(r) for r in packing.rings] == [(0, 3, 2, 1, 5, 6, 7, 4), (0, 1, 3, 7, 5, 4, 6, 2)]
    assert packing.bandwidths == (36e9, 18e9)
    assert packing.total == packing.bound == 54e9  # 3 x 18 GB/s: optimal
    seeds = [_canonical(tuple(SEEDS_GPU[g] for g in r)) for r in (SEEDS_DOUBLE_RING, SEEDS_SINGLE_RING)]
    assert [_canonical(_numbers(r)) for r in packing.rings] == seeds


def test_the_seeds_relabelling_maps_their_rings_onto_dgx1_links() -> None:
    t = dgx1()
    for seeds_ring, lanes in ((SEEDS_DOUBLE_RING, 2), (SEEDS_SINGLE_RING, 1)):
        for a, b in pairwise((*seeds_ring, seeds_ring[0])):
            link = t.link(f"gpu{SEEDS_GPU[a]}", f"gpu{SEEDS_GPU[b]}")
            assert link is not None and link.lanes == lanes


def test_find_rings_finds_every_hamiltonian_cycle_of_the_dgx1_once() -> None:
    t = dgx1()
    found = [_numbers(r) for r in find_rings(t)]
    assert len(found) == len(set(found))
    assert all(r[0] == 0 and r[1] < r[-1] for r in found)
    # brute force over every order of GPUs 1..7 after GPU 0
    expected = {
        (0, *rest)
        for rest in permutations(range(1, 8))
        if rest[0] < rest[-1] and _is_ring_over_links(t, tuple(f"gpu{g}" for g in (0, *rest)))
    }
    assert set(found) == expected
    assert len(found) == 30


def test_packing_a_single_ring() -> None:
    packing = pack_rings(ring(5))
    assert [_numbers(r) for r in packing.rings] == [(0, 1, 2, 3, 4)]
    assert packing.total == packing.bound == 18e9


def test_greedy_packing_can_fall_short_of_the_bound() -> None:
    packing = pack_rings(fully_connected(4))  # three rings at 9 GB/s would give 27
    assert len(packing.rings) == 1
    assert (packing.total, packing.bound) == (18e9, 27e9)
    odd = pack_rings(fully_connected(5))  # K5 splits into two rings
    assert odd.total == odd.bound == 36e9
    assert len(pack_rings(fully_connected(8), max_rings=2).rings) == 2


@pytest.mark.parametrize("topology", [pcie_switch(4), multi_node(2, 4, 100)], ids=lambda t: t.name)
def test_gpus_joined_only_through_switches_have_no_rings(topology: Topology) -> None:
    packing = pack_rings(topology)
    assert packing.rings == ()
    assert packing.total == 0
    assert "no ring" in packing.describe()


def test_two_and_one_gpus() -> None:
    two = pack_rings(ring(2))
    assert [_numbers(r) for r in two.rings] == [(0, 1)]
    assert two.total == two.bound == 18e9
    assert pack_rings(ring(1)).rings == ()


def test_rings_over_chosen_devices_become_rank_orders() -> None:
    t = dgx1()
    packing = pack_rings(t, ["gpu4", "gpu5", "gpu6", "gpu7"])  # one quad: 4-7, 5-6, 6-7 doubled
    assert packing.rank_rings() == ((0, 1, 2, 3), (0, 2, 1, 3))
    assert packing.total == packing.bound == 36e9
    assert packing.rank_rings(["gpu7", "gpu6", "gpu5", "gpu4"]) == ((3, 2, 1, 0), (3, 1, 2, 0))
    with pytest.raises(TopologyError, match="no rank is placed on gpu7"):
        packing.rank_rings(["gpu4", "gpu5", "gpu6"])
    with pytest.raises(TopologyError, match="name a device twice"):
        pack_rings(t, ["gpu0", "gpu0"])
