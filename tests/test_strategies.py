"""The seeds' aggregation strategies: star and split star verified by the simulator, and placed on devices."""

import pytest

from collectives.chunking import even_split
from collectives.errors import TopologyError
from collectives.simulate import simulate
from collectives.topology import dgx1, pcie_switch
from collectives.topology.strategies import aggregate_on, split_aggregation, split_star, star

from .strategies import WORLD_SIZES, edge_counts


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_star_and_split_star_meet_the_contract_at_their_documented_cost(world_size: int) -> None:
    p = world_size
    steps = 2 if p > 1 else 0
    for count in edge_counts(p):
        for root in {0, p // 2, p - 1}:
            result = simulate(star(p, count, root))
            assert result.steps == steps
            assert result.elements_sent == tuple((p - 1) * count if r == root else count for r in range(p))
        result = simulate(split_star(p, count))
        assert result.steps == steps
        assert result.elements_sent == tuple(count + (p - 2) * share for share in even_split(count, p))


def test_aggregating_on_a_gpu_uses_the_gpus_alone() -> None:
    t = dgx1()
    strategy = aggregate_on(t, "gpu5", 10)
    assert strategy.placement == t.gpus
    assert strategy.schedule.name == "allreduce-star(n=8,root=5)"
    assert strategy.name == "aggregate on gpu5"


def test_aggregating_on_a_device_that_is_no_gpu_adds_it_as_the_last_rank() -> None:
    strategy = aggregate_on(pcie_switch(3), "cpu", 10, gpus=["gpu2", "gpu0"])
    assert strategy.placement == ("gpu2", "gpu0", "cpu")
    assert strategy.schedule.name == "allreduce-star(n=3,root=2)"
    simulate(strategy.schedule)


def test_split_aggregation_places_one_rank_per_gpu() -> None:
    strategy = split_aggregation(pcie_switch(4), 40)
    assert strategy.placement == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert strategy.schedule.chunk_sizes == (10, 10, 10, 10)


def test_bad_roots_and_devices_are_rejected() -> None:
    with pytest.raises(ValueError, match="root 3 is outside world size 3"):
        star(3, 5, 3)
    with pytest.raises(TopologyError, match="no device 'tpu0'"):
        aggregate_on(pcie_switch(2), "tpu0", 5)
    with pytest.raises(TopologyError, match="no GPUs to aggregate from"):
        split_aggregation(pcie_switch(2), 5, gpus=[])
